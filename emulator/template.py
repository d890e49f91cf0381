"""The synthesized template, once for the whole repository: what `python app.py` makes of the CDK app.

Every harness that needs the stack as deployed reads it from here: the local stack (emulator/stack.py)
takes its functions, their environment and roles and its state machines from it, and the IAM check
(emulator/iam_stack.py) its policies, and the Lambda runtime (emulator/lambda_runtime.py) each
function's code asset and layer. It is synthesised once per content of its inputs (app.py, cdk.json,
infra/, the Lambdas' and the agent's code) and of the layer, and cached on disk, so parallel test
workers and later runs share one synthesis.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.dependency_layer import DependencyLayer

STACK_ID = "RunnerPool"
"""infra.app's stack id, which names the template in the assembly (not imported: CDK only on a miss)."""

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_TEMPLATE_INPUTS = ("app.py", "cdk.json", "infra", "lambdas/runner_pool", "agent")
BUILD_OUTPUTS = ("infra/instances/build",)
"""Under the inputs but made by synthesis (the agent's wheelhouse, infra/agent_wheelhouse.py), so not
inputs: another test worker's synthesis writes and renames files there while this one hashes (a fresh
clone's make test failed reading a `.partial` wheel that had just been renamed), and a key taken after
a synthesis must equal the one taken before it."""


def template_key() -> str:
    """A digest of everything the synthesized template is made from, and of where it is: the assembly's
    assets are this checkout's directories (`lambdas/`, the layer's build), by absolute path, so another
    checkout with the same content must not be handed this one's assembly (nor this one another's, which
    breaks once that checkout is deleted)."""
    digest = hashlib.sha256(str(PROJECT_ROOT).encode())
    for name in _TEMPLATE_INPUTS:
        for path in _input_files(PROJECT_ROOT / name):
            digest.update(str(path.relative_to(PROJECT_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _input_files(root: Path) -> list[Path]:
    """The files under `root`, without bytecode caches and without BUILD_OUTPUTS (never entered)."""
    if root.is_file():
        return [root]
    outputs = {PROJECT_ROOT / output for output in BUILD_OUTPUTS}
    found: list[Path] = []
    for directory, subdirectories, files in os.walk(root):
        here = Path(directory)
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__" and here / d not in outputs]
        found.extend(here / name for name in files)
    return sorted(found)


ASSEMBLIES = Path(tempfile.gettempdir()) / "runner-pool-assemblies"


@functools.cache
def host_assembly(cache: Path = ASSEMBLIES, overrides: str = "") -> Path:
    """The cloud assembly `python app.py` makes, but with the dependency layer built for this interpreter
    and platform (infra/dependency_layer.py `host_target()`: uv.lock's runtime pins, wheels this Python
    can load) and assets unstaged, so each asset is its source directory (for the code, `lambdas/`).
    Cached on disk per `template_key()` and per layer; synthesised under a lock, so parallel test workers
    synthesise once (a miss costs the seconds jsii takes to start CDK); once per process. `overrides`:
    sections of the config in place of cdk.json's (a JSON object), for a world whose stack has other
    resources: other Apps (`github`), classes with Session Manager (`resource_classes`)."""
    from infra.dependency_layer import dependency_layer, host_target  # noqa: PLC0415

    layer = dependency_layer(target=host_target())
    changed = f"-{hashlib.sha256(overrides.encode()).hexdigest()[:12]}" if overrides else ""
    assembly = cache / f"{template_key()}-{layer.key}{changed}"
    if not (assembly / "done").exists():
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (assembly / "done").exists():
                _synthesize(assembly, layer, overrides)
    return assembly


@functools.cache
def synthesized_template(overrides: str = "") -> dict[str, Any]:
    """The stack's template, from `host_assembly()`: the layer it was built with changes no resource of
    the template but the layer's own asset. `overrides` as host_assembly's: a stack of several Apps grants
    each App's secrets, one with a Session Manager class has that class's templates and role, so such a
    world is checked against the template that deploys it."""
    assembly = host_assembly(overrides=overrides)
    loaded: dict[str, Any] = json.loads((assembly / f"{STACK_ID}.template.json").read_text())
    return loaded


def _synthesize(assembly: Path, layer: DependencyLayer, overrides: str = "") -> None:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    # CDK only on a cache miss: its jsii runtime takes seconds to start.
    from infra.app import CONFIG_CONTEXT_KEY, build_app, project_context  # noqa: PLC0415

    shutil.rmtree(assembly, ignore_errors=True)
    context = {**project_context(), "aws:cdk:disable-asset-staging": True}
    if overrides:
        context[CONFIG_CONTEXT_KEY] = {**context[CONFIG_CONTEXT_KEY], **json.loads(overrides)}
    build_app(context, outdir=str(assembly), layer=layer).synth()
    (assembly / "done").write_text("")
