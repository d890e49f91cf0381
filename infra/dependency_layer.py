"""Builds the Lambdas' dependency layer without Docker, once per set of locked runtime dependencies.

The layer holds exactly the versions uv.lock pins for the project's runtime dependencies (what the
tests ran against), installed by uv's pip interface for the Lambda platform (`--python-platform`,
`--only-binary :all:`: prebuilt manylinux wheels only, so nothing is compiled for the build machine).
Each build lands in `layers/build/<key>/`, where the key is a digest of the pinned requirements,
the Python version and the platform: a synth whose dependencies did not change reuses the directory
and touches neither uv nor the network.

Tests build the same locked requirements for the machine they run on (`host_target()`), to import
every deployed handler with that layer alone on its path (tests/infra/test_deployed_functions.py): a
runtime dependency the layer lacks fails there as it would on Lambda.
"""

from __future__ import annotations

import fcntl
import hashlib
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.uv import UvMissingError, run_uv

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAYER_CACHE = PROJECT_ROOT / "layers" / "build"
LAMBDA_PYTHON_VERSION = "3.12"
LAMBDA_PLATFORM = "aarch64-manylinux2014"
"""Graviton: every runtime dependency ships an aarch64 manylinux2014 wheel, and arm64 Lambdas cost less."""


@dataclass(frozen=True)
class LayerTarget:
    """The Python and the platform a layer's wheels are chosen for."""

    python_version: str
    platform: str

    @property
    def compiled(self) -> bool:
        """Whether the layer ships bytecode: only for this machine's own Python, which compiles it.

        Where PYTHONDONTWRITEBYTECODE is set (as on CI here) every interpreter that imports the layer
        (each Lambda environment of the emulator) would compile each module anew. The Lambda target's
        bytecode would have to come from a Python 3.12 this machine may lack, so that layer has none.
        """
        return self == host_target()


LAMBDA_TARGET = LayerTarget(LAMBDA_PYTHON_VERSION, LAMBDA_PLATFORM)


def host_target() -> LayerTarget:
    """This machine's Python and platform: the layer a test can import from here."""
    return LayerTarget(
        f"{sys.version_info.major}.{sys.version_info.minor}", f"{platform.machine()}-manylinux2014"
    )


Run = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]
"""Runs uv with these arguments in the project root and returns what it printed; tests pass their own."""


class LayerBuildError(RuntimeError):
    """The layer could not be built; the message says what failed and what it needs."""


@dataclass(frozen=True)
class DependencyLayer:
    """A built layer: `path` is the directory to zip (it holds `python/`), `key` its content's identity."""

    path: Path
    key: str


def dependency_layer(
    cache: Path = LAYER_CACHE, run: Run | None = None, target: LayerTarget = LAMBDA_TARGET
) -> DependencyLayer:
    """The layer for the locked runtime dependencies: from the cache, or built into it now.

    Builds are serialised by a lock file in the cache, so parallel synths (test workers) build once."""
    run = run or _run
    requirements = _locked_requirements(run)
    key = layer_key(requirements, target)
    built = cache / key
    if (built / "python").is_dir():
        return DependencyLayer(built, key)
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (built / "python").is_dir():  # built by whoever held the lock before us
            return DependencyLayer(built, key)
        return _build(cache, key, requirements, target, run)


def _build(cache: Path, key: str, requirements: str, target: LayerTarget, run: Run) -> DependencyLayer:
    built = cache / key
    staging = cache / f".{key}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "requirements.txt").write_text(requirements)
    _uv_or_fail(
        run,
        [
            "pip",
            "install",
            "--quiet",
            "--target",
            str(staging / "python"),
            "--python-platform",
            target.platform,
            "--python-version",
            target.python_version,
            "--only-binary",
            ":all:",
            "--no-deps",
            "--require-hashes",
            "--requirement",
            str(staging / "requirements.txt"),
            *(["--compile-bytecode"] if target.compiled else []),
        ],
        "install the runtime dependencies for the Lambda platform",
    )
    # Renamed only once complete, so an interrupted build is never mistaken for a cached one.
    shutil.rmtree(built, ignore_errors=True)
    staging.rename(built)
    return DependencyLayer(built, key)


def layer_key(requirements: str, target: LayerTarget = LAMBDA_TARGET) -> str:
    """What the layer's content depends on: the pinned requirements, the Python version, the platform."""
    compiled = "compiled\n" if target.compiled else ""
    digest = hashlib.sha256(f"{target.python_version}\n{target.platform}\n{compiled}{requirements}".encode())
    # No dot in it: CDK would take what follows a dot in the asset's path for a file extension.
    version = target.python_version.replace(".", "")
    return f"py{version}-{target.platform}-{digest.hexdigest()[:16]}"


def _locked_requirements(run: Run) -> str:
    """The runtime dependencies with uv.lock's versions and hashes (no dev or infra group, no project)."""
    return _uv_or_fail(
        run,
        ["export", "--frozen", "--no-default-groups", "--no-emit-project", "--no-header", "--quiet"],
        "read the runtime dependencies from uv.lock",
    )


def _uv_or_fail(run: Run, arguments: list[str], purpose: str) -> str:
    try:
        result = run(arguments)
    except UvMissingError as missing:
        raise LayerBuildError(f"cannot {purpose}: {missing}") from None
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise LayerBuildError(
            f"cannot {purpose} (uv {arguments[0]} exited {result.returncode}); the first build of "
            "the Lambdas' dependency layer needs PyPI, later synths reuse "
            f"{LAYER_CACHE.relative_to(PROJECT_ROOT)}/.\n{tail}"
        )
    return result.stdout


def _run(arguments: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return run_uv(arguments, PROJECT_ROOT)
