"""The agent's wheelhouse: uv.lock's wheels for each architecture and boot Python, pinned by hash,
installable offline by pip for every pair, reproducible, and refused when a download is not the lock's.

The real wheelhouses are the ones synth uses (built from uv.lock into infra/instances/build/, from PyPI
the first time). pip here is the instance's: the wheel the wheelhouse carries under installer/, run
from that wheel as the user data runs it, with no index and no network, for the Python and platform
of each supported distribution (`--python-version`, `--platform`, `--dry-run`): the host has only one
interpreter and one architecture, but pip's resolution and hash checks are the same ones the
instance's pip makes.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from infra.agent_wheelhouse import (
    BOOT_PYTHONS,
    INSTALLER_DIR,
    MACHINES,
    AgentWheelhouse,
    WheelhouseBuildError,
    agent_wheelhouse,
    installer_wheel,
    locked_wheels,
    manylinux_platforms,
)
from runner_pool.domain.records import Arch

UNSHARE = shutil.which("unshare") or "unshare"


@pytest.fixture(scope="module")
def wheelhouses() -> Mapping[Arch, AgentWheelhouse]:
    built = {arch: agent_wheelhouse(arch) for arch in Arch}
    for arch, wheelhouse in built.items():
        size = wheelhouse.path.stat().st_size / 2**20
        print(f"\nagent wheelhouse {arch.value}: {size:.1f} MiB, {wheelhouse.path.name}")
    return built


@pytest.fixture(scope="module")
def pip(wheelhouses: Mapping[Arch, AgentWheelhouse], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """pip as an instance runs it: the wheelhouse's own pip wheel, run from the wheel by an interpreter."""
    unpacked_wheelhouse = unpacked(wheelhouses[Arch.X64].path, tmp_path_factory.mktemp("installer"))
    (wheel,) = (unpacked_wheelhouse / INSTALLER_DIR).glob("pip-*.whl")
    return [sys.executable, str(wheel / "pip")]


def unpacked(wheelhouse: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheelhouse) as archive:
        archive.extractall(into)
    return into


def resolve_offline(
    pip: Sequence[str], wheelhouse: Path, arch: Arch, python: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """pip's install of the wheelhouse for `python` on `arch`, with no index and no network, stopped
    before it writes (--dry-run): the boot's pip arguments plus the target interpreter and platform."""
    platforms = [option for tag in manylinux_platforms(MACHINES[arch]) for option in ("--platform", tag)]
    return subprocess.run(  # noqa: S603 - pip on a wheelhouse this test unpacked
        [
            UNSHARE,
            "--net",
            "--",
            *pip,
            "install",
            "--isolated",
            "--disable-pip-version-check",
            "--no-input",
            "--no-index",
            "--find-links",
            str(wheelhouse / "wheels"),
            "--only-binary",
            ":all:",
            "--require-hashes",
            "--requirement",
            str(wheelhouse / "requirements.txt"),
            "--dry-run",
            "--target",
            str(tmp_path / "target"),
            "--python-version",
            python,
            *platforms,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("arch", list(Arch))
@pytest.mark.parametrize("python", sorted(set(BOOT_PYTHONS.values())))
def test_pip_installs_the_wheelhouse_offline_for_each_boot_python_and_arch(
    wheelhouses: Mapping[Arch, AgentWheelhouse], pip: list[str], tmp_path: Path, arch: Arch, python: str
) -> None:
    # Given the wheelhouse of an arch, unpacked as the user data unpacks it
    wheelhouse = unpacked(wheelhouses[arch].path, tmp_path / "wheelhouse")

    # When pip installs it for a boot Python on that arch, with no index and no network
    result = resolve_offline(pip, wheelhouse, arch, python, tmp_path)

    # Then every pinned requirement resolves to a wheel there, the project among them
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Would install" in result.stdout
    assert "runner-pool-0.1.0" in result.stdout


def test_pip_refuses_a_wheel_that_is_not_the_one_pinned(
    wheelhouses: Mapping[Arch, AgentWheelhouse], pip: list[str], tmp_path: Path
) -> None:
    # Given the x64 wheelhouse with one wheel altered after the build
    wheelhouse = unpacked(wheelhouses[Arch.X64].path, tmp_path / "wheelhouse")
    (altered,) = wheelhouse.glob("wheels/six-*.whl")
    altered.write_bytes(altered.read_bytes() + b"\0")

    # When pip installs it / Then it refuses, naming the hash it expected
    result = resolve_offline(pip, wheelhouse, Arch.X64, BOOT_PYTHONS["al2023"], tmp_path)
    assert result.returncode != 0
    assert "DO NOT MATCH THE HASHES" in result.stderr


def digests_under(archive: zipfile.ZipFile, directory: str) -> dict[str, str]:
    """The SHA-256 of each file the zip holds under `directory`, by its name there."""
    return {
        name.removeprefix(f"{directory}/"): hashlib.sha256(archive.read(name)).hexdigest()
        for name in archive.namelist()
        if name.startswith(f"{directory}/")
    }


def requirements_and_digests(wheelhouse: AgentWheelhouse, directory: str) -> tuple[str, dict[str, str]]:
    """A wheelhouse's requirements.txt, and the digest of each file it holds under `directory`."""
    with zipfile.ZipFile(wheelhouse.path) as archive:
        return archive.read("requirements.txt").decode(), digests_under(archive, directory)


UV_LOCK = Path(__file__).resolve().parents[2] / "uv.lock"
"""The project's uv.lock, whose digests every wheel of a wheelhouse must carry."""


def test_every_file_is_pinned_by_the_hash_uv_lock_records(
    wheelhouses: Mapping[Arch, AgentWheelhouse],
) -> None:
    lock = UV_LOCK.read_text()
    for arch, wheelhouse in wheelhouses.items():
        # Given a wheelhouse's files and requirements
        requirements, digests = requirements_and_digests(wheelhouse, "wheels")
        # Then each requirement is an exact pin, each file is pinned by its digest, and every
        # dependency's digest is the one uv.lock records for that file
        assert all("==" in line for line in requirements.splitlines() if line and not line.startswith(" ")), (
            arch
        )
        for name, digest in digests.items():
            assert f"--hash=sha256:{digest}" in requirements, (arch, name)
            if not name.startswith("runner_pool-"):
                assert f'/{name}", hash = "sha256:{digest}"' in lock, (arch, name)


def test_the_wheelhouse_carries_the_locked_pip_to_install_with_but_not_to_install(
    wheelhouses: Mapping[Arch, AgentWheelhouse],
) -> None:
    lock = UV_LOCK.read_text()
    for arch, wheelhouse in wheelhouses.items():
        # Given a wheelhouse's installer and requirements
        requirements, installers = requirements_and_digests(wheelhouse, INSTALLER_DIR)
        # Then it holds one pip wheel, the file and digest uv.lock records for the boot group's pin
        ((name, digest),) = installers.items()
        assert re.fullmatch(r"pip-[^-]+-py3-none-any\.whl", name), (arch, name)
        assert f'/{name}", hash = "sha256:{digest}"' in lock, (arch, name)
        # And nothing pins pip to be installed into the agent's venv
        assert not [line for line in requirements.splitlines() if line.startswith("pip==")], arch
        assert digest not in requirements, arch


def test_the_same_inputs_build_the_same_zip(
    wheelhouses: Mapping[Arch, AgentWheelhouse], tmp_path: Path
) -> None:
    # Given an empty cache, whose downloads come from the built cache's copies of the lock's wheels
    built = wheelhouses[Arch.ARM64]
    downloads = built.path.parent / "wheels"

    def fetch(url: str, target: Path) -> None:
        shutil.copyfile(downloads / url.rsplit("/", 1)[-1], target)

    # When the arm64 wheelhouse is built again there
    again = agent_wheelhouse(Arch.ARM64, cache=tmp_path, fetch=fetch)

    # Then it is byte for byte the same zip (so the same CDK asset and the same checksum in user data)
    assert again.path.name == built.path.name
    assert again.sha256 == built.sha256


def test_a_download_that_is_not_the_locks_file_is_refused(tmp_path: Path) -> None:
    # Given downloads that do not hold what uv.lock says they hold
    def fetch(url: str, target: Path) -> None:
        target.write_bytes(b"not the wheel you are looking for")

    # When a wheelhouse is built / Then the build stops, naming the file and both digests
    with pytest.raises(WheelhouseBuildError, match=r"but uv\.lock records [0-9a-f]{64}: refused"):
        agent_wheelhouse(Arch.X64, cache=tmp_path, fetch=fetch)
    # And nothing that was refused is left where a later build would take it
    assert not list((tmp_path / "wheels").glob("*.whl"))
    assert not list(tmp_path.glob("*.zip"))


LOCK = """
[[package]]
name = "purelib"
version = "1.0"
wheels = [{ url = "https://files.example/purelib-1.0-py3-none-any.whl", hash = "sha256:aa" }]

[[package]]
name = "native"
version = "2.0"
wheels = [
    { url = "https://files.example/native-2.0-cp311-cp311-manylinux_2_39_x86_64.whl", hash = "sha256:01" },
    { url = "https://files.example/native-2.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", hash = "sha256:02" },
    { url = "https://files.example/native-2.0-cp311-cp311-musllinux_1_2_x86_64.whl", hash = "sha256:03" },
    { url = "https://files.example/native-2.0-cp312-cp312-manylinux_2_28_x86_64.whl", hash = "sha256:04" },
    { url = "https://files.example/native-2.0-cp312-cp312-manylinux_2_17_aarch64.whl", hash = "sha256:05" },
    { url = "https://files.example/native-2.0-cp311-cp311-win_amd64.whl", hash = "sha256:06" },
]

[[package]]
name = "pypy-only"
version = "3.0"
wheels = [{ url = "https://files.example/pypy_only-3.0-py3-none-any.whl", hash = "sha256:bb" }]
"""


def test_each_boot_python_gets_the_best_wheel_its_distribution_can_load() -> None:
    # Given a lock with a pure wheel, a native package's wheels for many platforms, and a PyPy-only one
    requirements = "purelib==1.0\nnative==2.0\npypy-only==3.0 ; platform_python_implementation == 'PyPy'\n"

    # When the x64 wheels are chosen
    chosen = {file.filename for file in locked_wheels(Arch.X64, requirements, LOCK)}

    # Then the pure wheel once, and per CPython the newest manylinux AL2023's glibc 2.34 loads (not
    # manylinux_2_39, not musl, not Windows); nothing for a requirement whose marker is false
    assert chosen == {
        "purelib-1.0-py3-none-any.whl",
        "native-2.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "native-2.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    }


def test_an_installer_group_that_pins_more_than_one_wheel_stops_the_build() -> None:
    # Given an installer group whose pins give more than one file (a native package's, per Python)
    # When its wheel is chosen / Then the build stops, naming the files: the boot runs exactly one
    with pytest.raises(WheelhouseBuildError, match=r"must pin pip alone.*native-2\.0-cp311"):
        installer_wheel(Arch.X64, "native==2.0\n", LOCK)


def test_a_requirement_without_a_wheel_for_a_boot_python_stops_the_build() -> None:
    # Given a lock whose native package has no arm64 wheel for Python 3.11
    # When the arm64 wheels are chosen / Then the build stops, naming the package, Python and machine
    with pytest.raises(WheelhouseBuildError, match=r"no wheel of native 2.0 for Python 3.11 on aarch64"):
        locked_wheels(Arch.ARM64, "native==2.0\n", LOCK)
