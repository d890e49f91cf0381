"""Builds the instance agent's wheelhouse: every wheel it runs, from uv.lock, installed offline at boot.

An instance installs exactly what the tests ran against: the wheels uv.lock pins for the project's
runtime dependencies, chosen for the instance's architecture and for the Python each supported
distribution boots the agent with, plus the project's own wheel built from the agent's source. The
wheelhouse is one zip per architecture holding `wheels/` and a `requirements.txt` that pins each
file by its SHA-256, so the user data installs it with `pip --no-index --require-hashes` and nothing
at boot comes from an index. Each wheel is downloaded from the URL uv.lock records and refused
unless its digest is the one the lock records.

The pip that installs it travels in the same zip, under `installer/`: the wheel uv.lock pins for the
project's `boot` dependency group, chosen and checked like the others but left out of
`requirements.txt`, so it is never installed into the agent's venv. The user data makes the venv
without pip (no ensurepip) and runs pip straight from this wheel with the venv's interpreter.

Builds land in `infra/instances/build/`, keyed by a digest of everything that goes in (the chosen
files' hashes, the agent's source, the Pythons and platforms): a synth whose inputs did not change
reuses the zip and touches neither uv nor the network. Like the Lambdas' layer, no Docker is needed.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
import tomllib
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from infra.uv import UvMissingError, run_uv
from runner_pool.domain.records import Arch

PROJECT_ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE_CACHE = PROJECT_ROOT / "infra" / "instances" / "build"

BOOT_PYTHONS: Mapping[str, str] = MappingProxyType({"al2023": "3.11", "ubuntu-24.04": "3.12"})
"""The Python each supported distribution runs the agent with (the user data installs it by this name).

Amazon Linux 2023 keeps its system python3 at 3.9 for its whole life and ships 3.11, 3.12 and newer
side by side (https://docs.aws.amazon.com/linux/al2023/ug/python.html): 3.11 is the version the test
suite runs the agent on. Ubuntu 24.04's only python3 is 3.12 (noble's python3 package)."""

GLIBC_FLOOR = (2, 34)
"""The oldest glibc among the supported distributions: AL2023's 2.34
(https://docs.aws.amazon.com/linux/al2023/ug/core-glibc.html); Ubuntu 24.04 has 2.39. A manylinux wheel
newer than this would not load on AL2023."""

MACHINES: Mapping[Arch, str] = MappingProxyType({Arch.X64: "x86_64", Arch.ARM64: "aarch64"})
_LEGACY_MANYLINUX: Mapping[str, Sequence[tuple[str, int]]] = MappingProxyType(
    {
        # PEP 600: manylinux2014 is manylinux_2_17, manylinux2010 is _2_12, manylinux1 is _2_5.
        "x86_64": (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)),
        "aarch64": (("manylinux2014", 17),),
    }
)
_OLDEST_GLIBC_MINOR: Mapping[str, int] = MappingProxyType({"x86_64": 5, "aarch64": 17})

Run = Callable[[Sequence[str], Path], subprocess.CompletedProcess[str]]
"""Runs uv with these arguments in a directory and returns what it printed; tests pass their own."""
Fetch = Callable[[str, Path], None]
"""Downloads a URL to a file."""

INSTALLER_GROUP = "boot"
"""The dependency group in pyproject.toml that pins the installer the user data runs: pip alone."""
INSTALLER_DIR = "installer"
"""Where the zip holds the installer's wheel, apart from `wheels/` and from what requirements.txt pins."""

_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
"""Every entry's timestamp: the same inputs give the same zip, so the same CDK asset."""
_AGENT_SOURCES = ("pyproject.toml", "README.md", "agent", "lambdas/runner_pool")
"""What the project's wheel is built from on the instance's behalf: the agent and the shared code it
imports. The project's other packages (infra, emulator, demo) never run on an instance and stay out."""


class WheelhouseBuildError(RuntimeError):
    """The wheelhouse could not be built; the message says what failed and what it needs."""


@dataclass(frozen=True)
class AgentWheelhouse:
    """A built wheelhouse: the zip the instance downloads, and the SHA-256 the user data checks it by."""

    arch: Arch
    path: Path
    sha256: str


@dataclass(frozen=True)
class LockedFile:
    """One wheel uv.lock records: where it comes from and the digest it must have."""

    requirement: str
    """The pinned requirement it satisfies, with its marker: `cffi==2.1.1 ; <marker>`."""
    filename: str
    url: str
    sha256: str


def agent_wheelhouse(
    arch: Arch, cache: Path = WHEELHOUSE_CACHE, run: Run | None = None, fetch: Fetch | None = None
) -> AgentWheelhouse:
    """The wheelhouse for `arch`: from the cache, or built into it now."""
    run, fetch = run or _run, fetch or _fetch
    lock = (PROJECT_ROOT / "uv.lock").read_text()
    files = locked_wheels(arch, _locked_requirements(run), lock)
    installer = installer_wheel(arch, _locked_requirements(run, group=INSTALLER_GROUP), lock)
    source_digest = _source_digest()
    key = wheelhouse_key(arch, [*files, installer], source_digest)
    built = cache / f"agent-wheelhouse-{arch.value}-{key}.zip"
    with _locked(cache):
        if not built.is_file():
            project_wheel = _project_wheel(cache, source_digest, run)
            wheels = [_downloaded(cache, file, fetch) for file in files]
            _write_zip(built, files, wheels, project_wheel, _downloaded(cache, installer, fetch))
            # Each change of the agent's source makes a new zip; the ones before it are of no more use.
            for stale in cache.glob(f"agent-wheelhouse-{arch.value}-*.zip"):
                if stale != built:
                    stale.unlink()
        return AgentWheelhouse(arch=arch, path=built, sha256=_sha256(built))


def locked_wheels(arch: Arch, requirements: str, lock: str) -> list[LockedFile]:
    """The lock's wheel of each pinned requirement for each boot Python on `arch`, best tag first.

    Raises WheelhouseBuildError naming a requirement that has no wheel for one of them: the instance
    must never build from source.
    """
    packages = {
        (canonicalize_name(package["name"]), package["version"]): package
        for package in tomllib.loads(lock)["package"]
    }
    chosen: dict[str, LockedFile] = {}
    for python in sorted(set(BOOT_PYTHONS.values())):
        ranking = {tag: rank for rank, tag in enumerate(supported_tags(arch, python))}
        environment = _marker_environment(arch, python)
        for line in _requirement_lines(requirements):
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            (specifier,) = requirement.specifier
            package = packages[(canonicalize_name(requirement.name), specifier.version)]
            candidates = [
                (min(ranking[tag] for tag in tags if tag in ranking), wheel)
                for wheel in package.get("wheels", [])
                for tags in [parse_wheel_filename(_filename(wheel["url"]))[3]]
                if any(tag in ranking for tag in tags)
            ]
            if not candidates:
                raise WheelhouseBuildError(
                    f"uv.lock has no wheel of {requirement.name} {specifier.version} for Python {python} "
                    f"on {MACHINES[arch]} (glibc {GLIBC_FLOOR[0]}.{GLIBC_FLOOR[1]}); the agent installs "
                    "wheels only: pin a version that ships one"
                )
            _, wheel = min(candidates, key=lambda candidate: candidate[0])
            algorithm, digest = wheel["hash"].split(":", 1)
            if algorithm != "sha256":
                raise WheelhouseBuildError(f"uv.lock records a {algorithm} hash for {wheel['url']}")
            chosen[wheel["url"]] = LockedFile(line, _filename(wheel["url"]), wheel["url"], digest)
    return sorted(chosen.values(), key=lambda file: file.filename)


def installer_wheel(arch: Arch, requirements: str, lock: str) -> LockedFile:
    """The one wheel of the installer group's one pin, for every boot Python on `arch`.

    Raises WheelhouseBuildError unless the group pins exactly one file there: the user data runs
    that file, so it must be a single wheel every boot Python can run (pip's is py3-none-any).
    """
    files = locked_wheels(arch, requirements, lock)
    if len(files) != 1:
        raise WheelhouseBuildError(
            f"the {INSTALLER_GROUP!r} dependency group must pin pip alone, as one wheel for every boot "
            f"Python; uv.lock gives {sorted(file.filename for file in files)}"
        )
    return files[0]


def supported_tags(arch: Arch, python: str) -> list[Tag]:
    """The wheel tags CPython `python` accepts on a supported distribution of `arch`, most specific first."""
    version = tuple(int(part) for part in python.split("."))
    abi = f"cp{version[0]}{version[1]}"
    platforms = manylinux_platforms(MACHINES[arch])
    return [
        *cpython_tags(version, abis=[abi], platforms=platforms),
        *compatible_tags(version, interpreter=abi, platforms=platforms),
    ]


def wheelhouse_key(arch: Arch, files: Sequence[LockedFile], source_digest: str) -> str:
    """What the zip's content depends on: the wheels (by hash), the agent's source, the Pythons."""
    digest = hashlib.sha256()
    for part in (
        arch.value,
        repr(sorted(BOOT_PYTHONS.items())),
        repr(GLIBC_FLOOR),
        source_digest,
        *(f"{file.requirement} {file.sha256}" for file in files),
    ):
        digest.update(part.encode() + b"\n")
    return digest.hexdigest()[:16]


def manylinux_platforms(machine: str) -> list[str]:
    """The manylinux platform tags a supported distribution on `machine` accepts, newest glibc first."""
    legacy = {minor: name for name, minor in _LEGACY_MANYLINUX[machine]}
    platforms = []
    for minor in range(GLIBC_FLOOR[1], _OLDEST_GLIBC_MINOR[machine] - 1, -1):
        platforms.append(f"manylinux_{GLIBC_FLOOR[0]}_{minor}_{machine}")
        if minor in legacy:
            platforms.append(f"{legacy[minor]}_{machine}")
    return platforms


def _marker_environment(arch: Arch, python: str) -> dict[str, str]:
    """PEP 508's marker variables on a supported distribution, not on the machine that builds."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": MACHINES[arch],
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
    }


def _requirement_lines(requirements: str) -> Iterator[str]:
    """`name==version[ ; marker]` of each requirement `uv export --no-hashes` printed."""
    for raw in requirements.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "-")):
            yield line


def _filename(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def _source_digest() -> str:
    digest = hashlib.sha256()
    for path in _agent_source_files(PROJECT_ROOT):
        digest.update(str(path.relative_to(PROJECT_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _agent_source_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for name in _AGENT_SOURCES:
        path = root / name
        found.extend(
            [path]
            if path.is_file()
            else (
                file
                for file in path.rglob("*")
                if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc"
            )
        )
    return sorted(found)


def _project_wheel(cache: Path, source_digest: str, run: Run) -> Path:
    """The project's wheel, built by uv from a copy of the agent's source alone."""
    target = cache / "project" / source_digest[:16]
    wheels = sorted(target.glob("*.whl")) if target.is_dir() else []
    if wheels:
        return wheels[0]
    with tempfile.TemporaryDirectory(prefix="agent-source-") as staging:
        stage = Path(staging)
        for file in _agent_source_files(PROJECT_ROOT):
            copy = stage / file.relative_to(PROJECT_ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, copy)
        out = stage / "dist"
        result = _uv(run, ["build", "--wheel", "--quiet", "--out-dir", str(out)], stage)
        if result.returncode != 0:
            raise WheelhouseBuildError(
                f"cannot build the project's wheel (uv build exited {result.returncode}):\n"
                + "\n".join(result.stderr.strip().splitlines()[-5:])
            )
        (wheel,) = out.glob("*.whl")
        target.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheel, target / wheel.name))


def _downloaded(cache: Path, file: LockedFile, fetch: Fetch) -> Path:
    """The wheel in the download cache, fetched first if need be; refused unless its digest is the lock's."""
    target = cache / "wheels" / file.filename
    if target.is_file() and _sha256(target) == file.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    try:
        fetch(file.url, partial)
    except OSError as error:
        raise WheelhouseBuildError(
            f"cannot download {file.filename} ({error}); the first build of the agent's wheelhouse needs "
            f"PyPI, later synths reuse {WHEELHOUSE_CACHE.relative_to(PROJECT_ROOT)}/"
        ) from None
    actual = _sha256(partial)
    if actual != file.sha256:
        partial.unlink()
        raise WheelhouseBuildError(
            f"{file.filename} has SHA-256 {actual}, but uv.lock records {file.sha256}: refused"
        )
    partial.rename(target)
    return target


def _write_zip(
    target: Path, files: Sequence[LockedFile], wheels: Sequence[Path], project_wheel: Path, installer: Path
) -> None:
    """`requirements.txt` pinning every file by its digest, the files under `wheels/`, and the installer's
    wheel under `installer/`, pinned by nothing in requirements.txt; reproducible."""
    hashes: dict[str, list[str]] = {}
    for file in files:
        hashes.setdefault(file.requirement, []).append(file.sha256)
    project, version, _, _ = parse_wheel_filename(project_wheel.name)
    hashes[f"{project}=={version}"] = [_sha256(project_wheel)]
    requirements = "".join(
        f"{requirement} \\\n"
        + " \\\n".join(f"    --hash=sha256:{digest}" for digest in sorted(digests))
        + "\n"
        for requirement, digests in sorted(hashes.items())
    )
    entries = [("requirements.txt", requirements.encode())]
    entries += sorted((f"wheels/{wheel.name}", wheel.read_bytes()) for wheel in [*wheels, project_wheel])
    entries.append((f"{INSTALLER_DIR}/{installer.name}", installer.read_bytes()))
    partial = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    # Renamed only once complete, so an interrupted build is never mistaken for a cached one.
    partial.rename(target)


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache (parallel test workers synthesise at once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _locked_requirements(run: Run, group: str | None = None) -> str:
    """The runtime dependencies as uv.lock pins them, with markers (no dev or infra group, no project);
    with `group`, that dependency group's pins alone."""
    result = _uv(
        run,
        [
            "export",
            "--frozen",
            *(["--only-group", group] if group else ["--no-default-groups"]),
            "--no-emit-project",
            "--no-header",
            "--no-hashes",
            "--no-annotate",
            "--quiet",
        ],
        PROJECT_ROOT,
    )
    if result.returncode != 0:
        raise WheelhouseBuildError(
            f"cannot read {f'the {group!r} group' if group else 'the runtime dependencies'} from uv.lock "
            f"(uv export exited {result.returncode}):\n" + "\n".join(result.stderr.strip().splitlines()[-5:])
        )
    return result.stdout


def _uv(run: Run, arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return run(arguments, cwd)
    except UvMissingError as missing:
        raise WheelhouseBuildError(str(missing)) from None


def _run(arguments: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_uv(arguments, cwd)


def _fetch(url: str, target: Path) -> None:
    if not url.startswith("https://"):
        raise OSError(f"not an https URL: {url}")
    with urllib.request.urlopen(url, timeout=120) as response, target.open("wb") as out:  # noqa: S310
        shutil.copyfileobj(response, out)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
