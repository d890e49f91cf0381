"""The Lambdas' dependency layer: built once per locked dependency set, for the Lambda platform, and a
build that cannot happen says why. uv is replaced by a recorder: no test here reaches PyPI."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from infra.dependency_layer import (
    LAMBDA_PLATFORM,
    LAMBDA_PYTHON_VERSION,
    LayerBuildError,
    dependency_layer,
    host_target,
    layer_key,
)
from infra.uv import UvMissingError

REQUIREMENTS = "pydantic==2.12.0 \\\n    --hash=sha256:abc\n"


class FakeUv:
    """Answers `uv export` with `requirements`, and makes `uv pip install` create its --target."""

    def __init__(self, requirements: str = REQUIREMENTS, install_fails: bool = False) -> None:
        self.requirements = requirements
        self.install_fails = install_fails
        self.commands: list[list[str]] = []

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(command))
        if command[0] == "export":
            return subprocess.CompletedProcess(command, 0, self.requirements, "")
        if self.install_fails:
            return subprocess.CompletedProcess(
                command, 2, "", "error: Failed to fetch: `https://pypi.org/simple/`"
            )
        target = Path(command[command.index("--target") + 1])
        (target / "pydantic").mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0, "", "")

    @property
    def installs(self) -> list[list[str]]:
        return [command for command in self.commands if command[0:2] == ["pip", "install"]]


def test_the_layer_installs_the_locked_requirements_for_the_lambda_platform(tmp_path: Path) -> None:
    # Given no cached layer / When the layer is asked for
    uv = FakeUv()
    layer = dependency_layer(cache=tmp_path, run=uv)

    # Then uv installs exactly uv.lock's pins, prebuilt wheels for the Lambda's Python and platform only
    (install,) = uv.installs
    for flag, value in {
        "--python-platform": LAMBDA_PLATFORM,
        "--python-version": LAMBDA_PYTHON_VERSION,
        "--only-binary": ":all:",
    }.items():
        assert install[install.index(flag) + 1] == value
    assert {"--no-deps", "--require-hashes"} <= set(install)
    # And no bytecode: this machine's Python would compile for itself, not for the Lambda's 3.12
    assert "--compile-bytecode" not in install
    assert (layer.path / "requirements.txt").read_text() == REQUIREMENTS
    # And the layer's content is under python/, where Lambda's runtime looks
    assert (layer.path / "python" / "pydantic").is_dir()


def test_a_second_synth_reuses_the_built_layer_without_installing(tmp_path: Path) -> None:
    # Given a layer already built for these requirements
    first = dependency_layer(cache=tmp_path, run=FakeUv())

    # When it is asked for again
    uv = FakeUv()
    second = dependency_layer(cache=tmp_path, run=uv)

    # Then the same directory comes back and nothing is installed
    assert second == first
    assert uv.installs == []


def test_changed_requirements_build_a_new_layer(tmp_path: Path) -> None:
    # Given a layer built for one set of requirements
    first = dependency_layer(cache=tmp_path, run=FakeUv())

    # When a pin changes / Then another layer is built, under another key
    uv = FakeUv(requirements=REQUIREMENTS.replace("2.12.0", "2.12.1"))
    second = dependency_layer(cache=tmp_path, run=uv)
    assert second.key != first.key
    assert len(uv.installs) == 1


def test_the_key_names_python_and_platform_and_has_no_dot() -> None:
    # Given the key of a requirements text / Then it is readable, and CDK cannot mistake a part for a suffix
    key = layer_key(REQUIREMENTS)
    assert key.startswith(f"py{LAMBDA_PYTHON_VERSION.replace('.', '')}-{LAMBDA_PLATFORM}-")
    assert "." not in key


def test_a_failed_install_says_what_it_needs_and_leaves_no_layer_behind(tmp_path: Path) -> None:
    # Given uv that cannot reach the package index
    uv = FakeUv(install_fails=True)

    # When the layer is asked for / Then the error says the first build needs PyPI and shows uv's words
    with pytest.raises(LayerBuildError, match=r"(?s)needs PyPI.*Failed to fetch"):
        dependency_layer(cache=tmp_path, run=uv)

    # And nothing that looks like a built layer is left to be reused
    assert not [path for path in tmp_path.iterdir() if not path.name.startswith(".")]
    assert dependency_layer(cache=tmp_path, run=FakeUv()).path.is_dir()


def test_without_uv_the_error_says_how_to_get_it(tmp_path: Path) -> None:
    def missing(_command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise UvMissingError("uv is not installed; install it")

    with pytest.raises(LayerBuildError, match="uv is not installed"):
        dependency_layer(cache=tmp_path, run=missing)


def test_a_layer_for_the_host_installs_the_same_pins_for_this_machine(tmp_path: Path) -> None:
    # Given the host's target (what test_deployed_functions.py imports from)
    uv = FakeUv()
    target = host_target()

    # When its layer is asked for
    layer = dependency_layer(cache=tmp_path, run=uv, target=target)

    # Then the same requirements are installed for this Python and platform, under a key of their own
    (install,) = uv.installs
    assert install[install.index("--python-platform") + 1] == target.platform
    assert install[install.index("--python-version") + 1] == target.python_version
    assert layer.key == layer_key(REQUIREMENTS, target) != layer_key(REQUIREMENTS)
    # And compiled by this Python, so an environment importing it under PYTHONDONTWRITEBYTECODE (as CI
    # runs) does not compile every module anew
    assert "--compile-bytecode" in install
