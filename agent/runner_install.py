"""The GitHub runner's directory: its program as installed (a manifest), its per-job files, and checks.

The boot installs the runner root-owned and read-only to the runner account, then records a manifest
of every entry (`python -m agent.runner_install <runner dir> <manifest>`). The runner still writes a
few files of its own at the top of its directory (actions/runner at 258d6c857db3, runner 2.336.0, under
src/): `run.sh` copies `run-helper.sh.template` to `run-helper.sh` before each start
(Misc/layoutroot/run.sh:17); the listener writes its settings files there from a JIT config
(Runner.Listener/Runner.cs:241-256) and an ephemeral runner deletes them after its job (Runner.cs:877-880);
it logs to `_diag` and works in `_work`. So the top directory is root:runner with the sticky bit (like
/tmp): the account can add and remove its own entries and cannot touch root's. What it adds is not in
the manifest: the scrub removes it, and a check refuses any entry the manifest does not name, so a `.env`
(which the listener loads into its environment: Runner.Listener/Program.cs:19) or any other planted file
never reaches the next job.

The agent writes the JIT config's files itself, before the runner starts, so the config never appears
in a process's arguments or environment: `run.sh` without `--jitconfig` finds the runner configured
and loads the same files, as the listener does after writing them (Runner.cs:234-270; the whole
account, with the settings the runner reads, is in agent/jit_config.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

RUNTIME_ENTRIES = frozenset(
    {
        ".runner",
        ".credentials",
        ".credentials_rsaparams",
        ".credentials_migrated",
        ".runner_migrated",
        "run-helper.sh",
        "update.finished",
    }
)
"""Files the runner itself writes at the top of its directory, never part of the installed program."""
ACCOUNT_DIRS = ("_work", "_diag")
"""The runner's working and log directories: the account's own, emptied after each job."""
_CHUNK = 1 << 20


class RunnerInstallError(RuntimeError):
    """The runner's directory is not as installed; the message says what differs."""


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    sha256: str | None = None
    target: str | None = None

    @classmethod
    def of(cls, path: Path, *, hashed: bool) -> Entry:
        info = path.lstat()
        kind = "link" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "file"
        return cls(
            kind=kind,
            mode=info.st_mode,
            uid=info.st_uid,
            gid=info.st_gid,
            size=info.st_size if kind == "file" else 0,
            mtime_ns=info.st_mtime_ns,
            ctime_ns=info.st_ctime_ns,
            inode=info.st_ino,
            sha256=_sha256(path) if hashed and kind == "file" else None,
            target=os.readlink(path) if kind == "link" else None,
        )

    def differences(self, found: Entry, *, contents_change: bool = False) -> list[str]:
        """What differs; a change of content or metadata changes the ctime, which only root can forge.
        A directory whose contents change by design (the top one) is held to its kind and ownership."""
        fields = ["kind", "mode", "uid", "gid"]
        if not contents_change:
            fields += ["size", "mtime_ns", "ctime_ns", "inode", "target"]
        if self.sha256 is not None and found.sha256 is not None:
            fields.append("sha256")
        return [name for name in fields if getattr(self, name) != getattr(found, name)]


def take_manifest(directory: Path) -> dict[str, Entry]:
    """Every entry of the installed runner, hashed; the runner's own files and directories left out."""
    return {name: Entry.of(directory / name, hashed=True) for name in _program_entries(directory)}


def write_manifest(directory: Path, manifest: Path) -> int:
    entries = take_manifest(directory)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    temporary = manifest.with_suffix(".tmp")
    temporary.write_text(json.dumps({name: asdict(entry) for name, entry in sorted(entries.items())}))
    temporary.chmod(0o644)
    os.replace(temporary, manifest)
    return len(entries)


class RunnerInstall:
    def __init__(self, directory: Path, manifest: Path | None, uid: int | None, gid: int | None) -> None:
        self._directory = directory
        self._manifest_path = manifest
        self._uid = uid
        self._gid = gid
        self._manifest: dict[str, Entry] | None = None
        self._hashed_since_last_job = False

    @property
    def directory(self) -> Path:
        return self._directory

    def verify(self, *, full: bool) -> list[str]:
        """What differs from the manifest, [] when the program is as installed (or none is kept)."""
        if self._manifest_path is None:
            return []
        try:
            manifest = self._load_manifest()
        except (OSError, ValueError) as exc:
            return [f"the runner's manifest {self._manifest_path} is unreadable: {exc}"]
        problems: list[str] = []
        found = set(_program_entries(self._directory))
        for name in sorted(found - manifest.keys()):
            problems.append(f"runner file added: {name}")
        for name, expected in sorted(manifest.items()):
            if name not in found:
                problems.append(f"runner file missing: {name}")
                continue
            differences = expected.differences(
                Entry.of(self._directory / name, hashed=full), contents_change=name == "."
            )
            if differences:
                problems.append(f"runner file changed: {name} ({', '.join(differences)})")
        if full and not problems:
            self._hashed_since_last_job = True
        return problems

    def check_before_start(self) -> None:
        """The program as installed, or RunnerInstallError. Hashed unless it was hashed since the last job
        ended (the scrub hashes it): between the scrub and this start no process of the account ran,
        and a stat check (ctime, inode, size) catches any change but root's."""
        problems = self.verify(full=not self._hashed_since_last_job)
        self._hashed_since_last_job = False
        if problems:
            raise RunnerInstallError("the runner program is not as installed: " + "; ".join(problems[:5]))

    def install_config(self, files: Mapping[str, bytes]) -> None:
        """The JIT config's files written into the runner directory for the runner account alone."""
        for name, content in files.items():
            if name not in RUNTIME_ENTRIES:
                raise RunnerInstallError(f"the JIT config holds a file the runner never writes: {name!r}")
            path = self._directory / name
            remove_path(path)
            # Never through a link the account may have planted: O_EXCL|O_NOFOLLOW on a fresh name.
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(descriptor, content)
                if self._uid is not None and self._gid is not None:
                    os.fchown(descriptor, self._uid, self._gid)
            finally:
                os.close(descriptor)

    def reset(self) -> None:
        """The runner directory as installed: the runner's own files removed, its directories emptied.
        Without a manifest only the runner's own files are known, so only they go."""
        manifest = self._load_manifest() if self._manifest_path is not None else None
        for entry in self._directory.iterdir():
            name = entry.name
            if name in ACCOUNT_DIRS:
                continue
            if name in RUNTIME_ENTRIES or (manifest is not None and name not in manifest):
                remove_path(entry)
        for name in ACCOUNT_DIRS:
            directory = self._directory / name
            if name == "_diag" and manifest is None and not directory.exists():
                continue
            remove_path(directory)
            directory.mkdir(mode=0o755)
            if self._uid is not None and self._gid is not None:
                os.chown(directory, self._uid, self._gid)

    def _load_manifest(self) -> dict[str, Entry]:
        if self._manifest is None:
            if self._manifest_path is None:
                raise RunnerInstallError("no manifest of the runner is kept")
            raw = json.loads(self._manifest_path.read_text())
            self._manifest = {name: Entry(**entry) for name, entry in raw.items()}
        return self._manifest


def _program_entries(directory: Path) -> list[str]:
    """Relative names of the runner's program: everything but what the runner writes itself."""
    names = ["."]
    for top in sorted(os.listdir(directory)):
        if top in RUNTIME_ENTRIES or top in ACCOUNT_DIRS:
            continue
        names.append(top)
        path = directory / top
        if path.is_dir() and not path.is_symlink():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(dirs + files):
                    names.append(str((Path(root) / name).relative_to(directory)))
    return names


def remove_path(path: Path) -> None:
    """`path`, whatever it is, never following a link (shutil.rmtree does not, on Linux)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m agent.runner_install <runner directory> <manifest>", file=sys.stderr)
        return 2
    count = write_manifest(Path(argv[0]), Path(argv[1]))
    print(f"runner manifest: {count} entries of {argv[0]} in {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
