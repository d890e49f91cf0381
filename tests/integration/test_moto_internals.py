"""moto's internals we patch or rely on (emulator/moto_internals.py) are still what we read.

moto's public surface is `mock_aws`, its server and its configuration
(https://docs.getmoto.org/en/latest/docs/configuration/index.html); everything else may change in any
release, so moto is pinned to one minor version and each internal is checked here against what was
recorded with it. A failure names the internal and who relies on it.
"""

from __future__ import annotations

import ast
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from emulator.moto_internals import INTERNALS, MOTO_VERSION, Internal, patch_point, resolve

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {("moto", "mock_aws"), ("moto.server", "ThreadedMotoServer")}
"""What moto documents: the mock and the server (docs.getmoto.org, "Non-Python SDK's / Server Mode")."""


def test_moto_is_pinned_to_the_minor_version_the_internals_were_recorded_with() -> None:
    # Given the moto the internals were recorded with, and pyproject's requirement of moto
    recorded = Version(MOTO_VERSION)
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    (moto,) = [Requirement(r) for r in dev if Requirement(r).name == "moto"]
    # Then the requirement admits that version and what follows it within its minor version, no other
    assert {str(bound) for bound in moto.specifier} == {
        f">={recorded}",
        f"<{recorded.major}.{recorded.minor + 1}",
    }
    # And the installed moto is of that minor version
    installed = Version(version("moto"))
    assert (installed.major, installed.minor) == (recorded.major, recorded.minor), installed


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda internal: internal.path)
def test_a_moto_internal_we_rely_on_is_as_recorded(internal: Internal) -> None:
    # Given an internal of moto we patch or rely on, as recorded with MOTO_VERSION
    where = (
        f"moto {version('moto')}: {internal.path}, which {internal.by} relies on ({internal.relied_on}), "
        f"recorded with moto {MOTO_VERSION}"
    )
    # Then it is still there
    try:
        internal.resolve()
    except (ImportError, AttributeError) as gone:
        pytest.fail(f"{where}, is gone ({gone}): re-read moto and rework {internal.by}")
    # And takes the parameters we call it with
    assert internal.current_signature() == internal.signature, (
        f"{where}, now takes {internal.current_signature()} instead of {internal.signature}: "
        f"rework {internal.by}, then record the new figures (python -m emulator.moto_internals)"
    )
    # And the source we rely on is unchanged
    assert internal.current_digest() == internal.digest, (
        f"{where}, changed ({internal.read or internal.path}): re-read it against what {internal.by} "
        "relies on, then record its new digest (python -m emulator.moto_internals)"
    )


def test_every_moto_name_our_code_imports_is_public_or_listed() -> None:
    # Given every `from moto... import name` in the emulator, the demo, the benchmarks and the tests
    imported = {
        (node.module, alias.name, str(path.relative_to(ROOT)))
        for folder in ("emulator", "demo", "bench", "tests")
        for path in (ROOT / folder).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "moto"
        for alias in node.names
    }
    listed = [(internal.path, internal.resolve()) for internal in INTERNALS]
    # Then each is public, or is (or holds) an internal listed, so the test above checks it
    unlisted = [
        f"{module}:{name} ({where})"
        for module, name, where in sorted(imported)
        if (module, name) not in PUBLIC
        and not any(
            path == f"{module}:{name}"
            or path.startswith(f"{module}:{name}.")
            or found is resolve(f"{module}:{name}")
            for path, found in listed
        )
    ]
    assert not unlisted, f"moto internals used but not in emulator/moto_internals.py: {unlisted}"


def test_a_patch_may_reach_only_a_listed_internal() -> None:
    # When a patch asks for an internal that is not listed / Then it is refused, naming the list
    with pytest.raises(KeyError, match=r"moto_internals\.py"):
        patch_point("moto.sqs.models:SQSBackend.purge_queue")
    # And a listed one is found where moto has it
    owner, name = patch_point("moto.stepfunctions.parser.asl.component.common.retry.retrier_decl:time")
    assert (owner.__name__, name) == (
        "moto.stepfunctions.parser.asl.component.common.retry.retrier_decl",
        "time",
    )
