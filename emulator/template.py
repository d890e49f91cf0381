"""The synthesized template, once for the whole repository: what `python app.py` makes of the CDK app.

Every harness that needs the stack as deployed reads it from here: the local stack (emulator/stack.py)
takes its functions, their environment and roles and its state machines from it, and the IAM check
(emulator/iam_stack.py) its policies. It is synthesised once per content of its inputs (app.py,
cdk.json, infra/, the Lambdas' and the agent's code) and cached on disk, so parallel test workers and
later runs share one synthesis (a cache miss costs the seconds jsii takes to start CDK).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_TEMPLATE_INPUTS = ("app.py", "cdk.json", "infra", "lambdas/runner_pool", "agent")


def template_key() -> str:
    """A digest of everything the synthesized template is made from."""
    digest = hashlib.sha256()
    for name in _TEMPLATE_INPUTS:
        root = PROJECT_ROOT / name
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(PROJECT_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


@functools.cache
def synthesized_template() -> dict[str, Any]:
    """The stack's template as `python app.py` synthesises it from cdk.json (with a stand-in layer: the
    layer's content changes no resource of the template but the layer's own asset), cached on disk by
    `template_key()`."""
    cache = Path(tempfile.gettempdir()) / "runner-pool-templates" / f"{template_key()}.json"
    if cache.exists():
        loaded: dict[str, Any] = json.loads(cache.read_text())
        return loaded
    template = _synthesize()
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(template))
    partial.replace(cache)
    return template


def _synthesize() -> dict[str, Any]:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    # CDK only on a cache miss: its jsii runtime takes seconds to start.
    from aws_cdk.assertions import Template  # noqa: PLC0415

    from infra.app import STACK_ID, build_app, project_context  # noqa: PLC0415
    from infra.dependency_layer import DependencyLayer  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="runner-pool-synth-") as scratch:
        layer = Path(scratch) / "layer"
        (layer / "python").mkdir(parents=True)
        context = {**project_context(), "aws:cdk:disable-asset-staging": True}
        app = build_app(context, outdir=str(Path(scratch) / "out"), layer=DependencyLayer(layer, "stand-in"))
        app.synth()
        template: dict[str, Any] = Template.from_stack(app.node.find_child(STACK_ID)).to_json()  # type: ignore[arg-type]
        return template
