"""Between two jobs: the runner account back to its first boot, and proof that nothing of the job is left.

The scrub kills first (so nothing of the job can write while its files go), then removes, then looks
again, from scratch, for anything the account still has:

- processes: of the runner's session, of the account (any uid of theirs), of the job's cgroup;
- docker: every container (with its anonymous volumes), volume and user-defined network, every image
  but the operator's base set, BuildKit's build cache (buildx builders are the account's: its home);
- kernel objects (agent/kernel_objects.py): the account's keys (user, user session and persistent
  keyrings emptied), its System V shared memory, message queues and semaphore sets, its POSIX message
  queues;
- files: the home reset from the skeleton useradd copied, the account's entries in the shared
  temporary directories and on every memory file system (tmpfs: /dev/shm, /run/lock, /run/user/<uid>
  and the like, found in the mount table), entries there of uids no account has (a user namespace's
  subordinate uids), its crontab, its lingering marker (systemd-logind starts a lingering user's
  manager, and so its user units, at boot), its mail spool emptied; the runner directory back to its
  manifest, its work and log directories emptied;
- then the check: no trace of an operator's Session Manager session (agent/operator_sessions.py), no
  process, no container, volume, network, foreign image or build cache, no key,
  IPC object or message queue of the account, no subordinate uid or gid range for it, no access for it
  to the docker daemon's socket (with it, a job is root), a home equal to the skeleton, no crontab or
  linger marker, the runner program as installed (hashed), nothing the account owns anywhere on the
  searched file systems and the memory file systems but its home, its empty work and log directories
  and its empty mail spool, and no file of a uid no account has where the account can write.

Whatever is left is the reason in UD_REMOVE_REG_FAILED, and the instance is not pooled. The scrub
cannot undo what a job did as root (a job that can sudo can change anything); README "Security model".

When the runner shares the agent's account (the emulator), there is no account to restore: the scrub
kills the runner's session and resets the runner directory only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from agent import kernel_objects
from agent.docker import Docker, DockerCli, DockerError
from agent.operator_sessions import session_trace
from agent.processes import JobCgroup, JobProcesses
from agent.runner_install import RunnerInstall, remove_path
from agent.sandbox import JobUnit
from agent.settings import AgentSettings

MAX_LISTED = 8
"""How many leftovers of one kind the reason names; the count says how many more."""
MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})


class CleanupError(RuntimeError):
    """Something of the last job could not be removed; the message is the reason in UD_REMOVE_REG_FAILED."""


@dataclass(frozen=True)
class AccountPlaces:
    """Where a job running as the runner account can leave something behind, besides its home."""

    home_skeleton: Path
    temp_dirs: tuple[Path, ...]
    crontab_dirs: tuple[Path, ...]
    linger_dir: Path
    mail_dirs: tuple[Path, ...]
    scan_roots: tuple[Path, ...]
    scan_exclude: tuple[Path, ...]
    mqueue_dir: Path = Path("/dev/mqueue")
    mountinfo: Path = Path("/proc/self/mountinfo")
    subordinate_id_files: tuple[Path, ...] = ()
    first_user_uid: int = 1000
    docker_socket: Path | None = None

    @classmethod
    def of(cls, settings: AgentSettings) -> AccountPlaces:
        """The places the settings name, each the setting of the same name."""
        return cls(**{place.name: getattr(settings, place.name) for place in fields(cls)})

    def memory_file_systems(self) -> tuple[Path, ...]:
        """Every tmpfs (or ramfs) mounted under a scan root and not under an excluded path, nor one of
        the temporary directories: each is a file system of its own, which a scan of its parent's
        never enters, and any that others may write (/run/lock, /dev/shm) is a place to leave things."""
        found = []
        for mount in _mounts(self.mountinfo, MEMORY_FILE_SYSTEMS):
            if mount in self.temp_dirs or not any(mount.is_relative_to(root) for root in self.scan_roots):
                continue
            if any(mount.is_relative_to(excluded) for excluded in self.scan_exclude):
                continue
            found.append(mount)
        return tuple(found)

    def scratch_dirs(self) -> tuple[Path, ...]:
        """Where the scrub removes the account's entries, and those of uids no account has."""
        return (*self.temp_dirs, *self.memory_file_systems())


@dataclass
class ScrubReport:
    killed: int = 0
    left: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.left

    def reason(self) -> str:
        return "the scrub left: " + "; ".join(self.left)


class Scrub:
    def __init__(
        self,
        *,
        work_dir: Path,
        runner: RunnerInstall,
        processes: JobProcesses,
        unit: JobUnit | None = None,
        account: pwd.struct_passwd | None = None,
        places: AccountPlaces | None = None,
        docker: Callable[[], Docker | None] = lambda: None,
        base_images: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
        passwd_file: Path = Path("/etc/passwd"),
    ) -> None:
        if account is not None and places is None:
            raise ValueError("a runner account of its own needs the places to scrub")
        self._work_dir = work_dir
        self._runner = runner
        self._processes = processes
        self._unit = unit
        self._account = account
        self._places = places
        self._docker = docker
        self._base_images = base_images
        self._clock = clock
        self._passwd_file = passwd_file

    @property
    def work_dir(self) -> Path:
        return self._work_dir

    @property
    def runner(self) -> RunnerInstall:
        return self._runner

    @property
    def cgroup(self) -> JobCgroup | None:
        """Where the runner starts, so that the job's processes can all be found again."""
        return self._processes.cgroup

    @property
    def unit(self) -> JobUnit | None:
        """The sandboxed service the runner starts as, whose cgroup is `cgroup`; None without systemd."""
        return self._unit

    def keep_images(self, ids: Iterable[str]) -> None:
        """Images the instance had at first boot (the pre-runner script's): the scrub keeps them."""
        self._base_images = self._base_images | frozenset(ids)

    def images_now(self) -> list[str]:
        """The ids of the images docker holds now; none without a runner account or a daemon."""
        docker = self._docker() if self._account is not None else None
        return [image.id for image in docker.images()] if docker is not None else []

    def prepare(self) -> None:
        """An empty work directory the runner's account owns, as the runner expects to find it."""
        self._work_dir.mkdir(parents=True, exist_ok=True)
        if self._account is not None:
            os.chown(self._work_dir, self._account.pw_uid, self._account.pw_gid)

    def run(self, session_id: int | None) -> ScrubReport:
        """Kill, remove, then check; the report lists what is left (nothing, when clean)."""
        started = self._clock()
        report = ScrubReport()
        killed, survivors = self._processes.kill(session_id)
        report.killed = len(killed)
        if survivors:
            report.left.append(_listed("processes survived being killed", [str(pid) for pid in survivors]))
        account = self._account
        docker = self._docker() if account is not None else None
        steps: list[tuple[str, Callable[[], None]]] = [("runner directory", self._runner.reset)]
        if account is not None:
            places = self._places or _never("a runner account of its own without places")
            unknown = _unknown_uids(places.first_user_uid)
            steps += [
                ("kernel keys", lambda: kernel_objects.clear_keyrings(account)),
                (
                    "System V IPC",
                    lambda: kernel_objects.remove_sysv_ipc(kernel_objects.sysv_ipc_of(account.pw_uid)),
                ),
                (
                    "POSIX message queues",
                    lambda: kernel_objects.remove_message_queues(account.pw_uid, places.mqueue_dir),
                ),
                ("home", lambda: _reset_home(account, places.home_skeleton)),
                (
                    "temporary files",
                    lambda: _remove_owned(
                        places.scratch_dirs(), lambda uid: uid == account.pw_uid or unknown(uid)
                    ),
                ),
                ("crontab and lingering", lambda: _remove_named(account.pw_name, places)),
                ("mail spool", lambda: _empty_mail(account.pw_name, places)),
            ]
            if docker is not None:
                steps.insert(0, ("docker", lambda: _remove_docker(docker, self._base_images)))
        steps.append(("work directory", self._reset_work_dir))
        for what, step in steps:
            try:
                step()
            except (OSError, DockerError) as exc:
                report.left.append(f"{what} could not be reset: {exc}")
        report.left += self._check(session_id, docker)
        report.seconds = self._clock() - started
        return report

    def _reset_work_dir(self) -> None:
        remove_path(self._work_dir)
        self.prepare()

    def operator_session(self) -> str | None:
        """Why an operator's Session Manager session bars the instance from another job; None if none ran."""
        return session_trace(self._passwd_file)

    def _check(self, session_id: int | None, docker: Docker | None) -> list[str]:
        left: list[str] = []
        session = self.operator_session()
        if session is not None:
            left.append(session)
        processes = self._processes.find(session_id)
        if processes:
            left.append(_listed("processes", [str(p.pid) for p in processes]))
        if any(self._work_dir.iterdir()):
            left.append(_listed("work directory not empty", sorted(p.name for p in self._work_dir.iterdir())))
        left += self._runner.verify(full=True)
        account, places = self._account, self._places
        if account is None or places is None:
            return left
        if docker is not None:
            left += _docker_left(docker, self._base_images)
        left += _kernel_objects_left(account, places)
        left += _subordinate_ranges(account, places.subordinate_id_files)
        left += _docker_reachable(account, places.docker_socket)
        left += _home_differences(account, places.home_skeleton)
        for marker in _named_files(account.pw_name, places):
            if os.path.lexists(marker):
                left.append(f"{marker} exists")
        owned, unknown = self._files_left(account, places)
        if owned:
            left.append(_listed("files of the runner account", sorted(owned)))
        if unknown:
            left.append(
                _listed("files of uids no account has, where the runner account can write", sorted(unknown))
            )
        return left

    def _files_left(self, account: pwd.struct_passwd, places: AccountPlaces) -> tuple[list[str], list[str]]:
        """What the account owns outside its home and its empty places, and what a uid no account has
        owns in a directory the account can write (only a job can have put it there: through a user
        namespace's subordinate uids, say); one walk of the scan roots and the memory file systems."""
        home = Path(account.pw_dir)
        allowed_trees = {home}
        allowed_empty = {self._work_dir, self._runner.directory / "_diag"}
        allowed_empty |= {directory / account.pw_name for directory in places.mail_dirs}
        excluded = set(places.scan_exclude)
        unknown_uid = _unknown_uids(places.first_user_uid)
        seen: set[Path] = set()
        owned: list[str] = []
        unknown: list[str] = []
        for root in (*places.scan_roots, *places.scratch_dirs()):
            if not root.exists():
                continue
            device = root.lstat().st_dev
            for path, info in _walk(root, device, excluded | allowed_trees):
                if path in seen:
                    continue
                seen.add(path)
                if info.st_uid == account.pw_uid:
                    if path in allowed_empty and (stat.S_ISDIR(info.st_mode) or info.st_size == 0):
                        continue
                    owned.append(str(path))
                elif unknown_uid(info.st_uid) and _writable_by(path.parent, account):
                    unknown.append(f"{path} (uid {info.st_uid})")
        return owned, unknown


def _mounts(mountinfo: Path, types: frozenset[str]) -> list[Path]:
    """The mount points of the file systems of `types` in a mountinfo table (proc(5): the mount point
    is field 5, octal-escaped; the type is the first field after the ' - ' separator)."""
    found = []
    for line in mountinfo.read_text().splitlines():
        fields, _, after = line.partition(" - ")
        if after.split()[0] in types:
            point = fields.split()[4]
            found.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)))
    return found


def _unknown_uids(first_user_uid: int) -> Callable[[int], bool]:
    """Whether a uid is one no account has, from `first_user_uid` (login.defs UID_MIN) up: below it are
    the system's own, which the distribution and its packages give out without a passwd line too."""
    known = {entry.pw_uid for entry in pwd.getpwall()}
    return lambda uid: uid >= first_user_uid and uid not in known


def _writable_by(directory: Path, account: pwd.struct_passwd) -> bool:
    """Whether the account may create entries in `directory`: its own, or writable by everyone."""
    try:
        info = directory.lstat()
    except OSError:
        return False
    return info.st_uid == account.pw_uid or bool(info.st_mode & stat.S_IWOTH)


def _kernel_objects_left(account: pwd.struct_passwd, places: AccountPlaces) -> list[str]:
    left = []
    try:
        keys = kernel_objects.keys_of(account)
    except OSError as exc:
        left.append(f"kernel keys could not be checked: {exc}")
    else:
        if keys:
            left.append(_listed("kernel keys of the runner account", keys))
    ipc = kernel_objects.sysv_ipc_of(account.pw_uid)
    if ipc:
        left.append(_listed("System V IPC objects of the runner account", ipc))
    queues = [str(queue) for queue in kernel_objects.message_queues_of(account.pw_uid, places.mqueue_dir)]
    if queues:
        left.append(_listed("POSIX message queues of the runner account", queues))
    return left


def _subordinate_ranges(account: pwd.struct_passwd, files: tuple[Path, ...]) -> list[str]:
    """A subordinate uid or gid range lets the account's user namespaces act as uids the scrub does not
    track (subuid(5)); the boot gives it none (useradd -K SUB_UID_COUNT=0), and none may appear."""
    left = []
    for file in files:
        with contextlib.suppress(FileNotFoundError):
            for line in file.read_text().splitlines():
                if line.split(":", 1)[0] in (account.pw_name, str(account.pw_uid)):
                    left.append(f"{file} gives the runner account a range: {line.strip()}")
    return left


def _docker_reachable(account: pwd.struct_passwd, socket: Path | None) -> list[str]:
    """An account that may use the docker daemon's socket (its own, its group's with group write, or
    anyone's) is root to anything on the instance (docs.docker.com/engine/security/: "only trusted users
    should be allowed to control your Docker daemon"), so no scrub can vouch for what its job left: the
    instance is never pooled. Jobs that need docker get single-use instances (README, Security model)."""
    if socket is None:
        return []
    try:
        info = socket.stat()
    except OSError:
        return []
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    mode = info.st_mode
    if (
        info.st_uid == account.pw_uid
        or (info.st_gid in groups and mode & stat.S_IWGRP)
        or mode & stat.S_IWOTH
    ):
        return [f"the runner account may use the docker daemon ({socket}), so a job could act as root"]
    return []


def _listed(what: str, items: list[str]) -> str:
    more = f" (+{len(items) - MAX_LISTED} more)" if len(items) > MAX_LISTED else ""
    return f"{what}: {', '.join(items[:MAX_LISTED])}{more}"


def _walk(root: Path, device: int, skipped: set[Path]) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `root` on its file system, `skipped` subtrees left out; never follows links."""
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if path in skipped:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield path, info
            if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                pending.append(path)


def _reset_home(account: pwd.struct_passwd, skeleton: Path) -> None:
    """The home as useradd made it: emptied, the skeleton copied in, all of it the account's."""
    home = Path(account.pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    for entry in list(home.iterdir()):
        remove_path(entry)
    if skeleton.is_dir():
        shutil.copytree(skeleton, home, symlinks=True, dirs_exist_ok=True)
    for path in (home, *_tree(home)):
        os.lchown(path, account.pw_uid, account.pw_gid)


def _tree(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            yield Path(root) / name


def _fingerprint(directory: Path) -> dict[str, tuple[str, int, str]]:
    """Each entry below `directory`: its kind, permission bits and content (digest or link target)."""
    found: dict[str, tuple[str, int, str]] = {}
    if not directory.is_dir():
        return found
    for path in _tree(directory):
        info = path.lstat()
        relative = str(path.relative_to(directory))
        if stat.S_ISLNK(info.st_mode):
            found[relative] = ("link", 0, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            found[relative] = ("dir", stat.S_IMODE(info.st_mode), "")
        else:
            found[relative] = (
                "file",
                stat.S_IMODE(info.st_mode),
                hashlib.sha256(path.read_bytes()).hexdigest(),
            )
    return found


def _home_differences(account: pwd.struct_passwd, skeleton: Path) -> list[str]:
    home = Path(account.pw_dir)
    expected, found = _fingerprint(skeleton), _fingerprint(home)
    differing = sorted(
        name for name in expected.keys() | found.keys() if expected.get(name) != found.get(name)
    )
    foreign = sorted(
        str(path.relative_to(home)) for path in _tree(home) if path.lstat().st_uid != account.pw_uid
    )
    left = []
    if differing:
        left.append(_listed(f"home {home} differs from {skeleton}", differing))
    if foreign:
        left.append(_listed(f"home {home} holds files of another account", foreign))
    return left


def _remove_owned(directories: tuple[Path, ...], owned: Callable[[int], bool]) -> None:
    """Every entry of a uid `owned` accepts in `directories` (at any depth, on their file systems), with
    what it holds."""
    for directory in directories:
        if not directory.is_dir():
            continue
        device = directory.lstat().st_dev
        pending = [directory]
        while pending:
            current = pending.pop()
            for entry in list(os.scandir(current)):
                info = entry.stat(follow_symlinks=False)
                path = Path(entry.path)
                if owned(info.st_uid):
                    remove_path(path)
                elif stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                    pending.append(path)


def _named_files(user: str, places: AccountPlaces) -> list[Path]:
    return [*(directory / user for directory in places.crontab_dirs), places.linger_dir / user]


def _remove_named(user: str, places: AccountPlaces) -> None:
    for path in _named_files(user, places):
        if not path.is_dir() or path.is_symlink():
            path.unlink(missing_ok=True)


def _empty_mail(user: str, places: AccountPlaces) -> None:
    for directory in places.mail_dirs:
        spool = directory / user
        with contextlib.suppress(FileNotFoundError):
            if spool.is_symlink() or not spool.is_file():
                remove_path(spool)
                continue
            descriptor = os.open(spool, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
            os.close(descriptor)


def _remove_docker(docker: Docker, base_images: frozenset[str]) -> None:
    # The order docker requires: containers hold volumes, networks and images.
    docker.remove_containers(docker.containers())
    docker.remove_volumes(docker.volumes())
    docker.remove_networks(docker.networks())
    docker.remove_images([image.id for image in docker.images() if not image.kept_by(base_images)])
    docker.prune_build_cache()


def _docker_left(docker: Docker, base_images: frozenset[str]) -> list[str]:
    try:
        found = {
            "containers": docker.containers(),
            "volumes": docker.volumes(),
            "networks": docker.networks(),
            "images": [image.id for image in docker.images() if not image.kept_by(base_images)],
        }
        cache = docker.build_cache_records()
    except DockerError as exc:
        return [f"docker could not be checked: {exc}"]
    left = [_listed(f"docker {kind}", items) for kind, items in found.items() if items]
    return left + ([f"docker build cache: {cache} records"] if cache else [])


def build_scrub(settings: AgentSettings, docker: Callable[[], Docker | None] | None = None) -> Scrub:
    """The scrub for the runner account the settings name (none: the agent's own, scrubbed least);
    docker through its CLI whenever its socket is there, unless `docker` is given."""
    account = pwd.getpwnam(settings.runner_user) if settings.runner_user else None
    own = account is not None and account.pw_uid != os.getuid()
    unit = (
        JobUnit(settings.job_unit, settings.cgroup_root, settings.stop_timeout_seconds, settings.systemd_run)
        if settings.job_unit is not None
        else None
    )
    cgroup = (
        unit.cgroup
        if unit is not None
        else JobCgroup.below_own(settings.job_cgroup, settings.cgroup_root)
        if settings.job_cgroup is not None
        else None
    )
    places = AccountPlaces.of(settings)

    def docker_cli() -> Docker | None:
        return DockerCli(settings.docker_timeout_seconds) if settings.docker_socket.exists() else None

    return Scrub(
        work_dir=settings.runner_work_dir,
        runner=RunnerInstall(
            settings.runner_dir,
            settings.runner_manifest,
            account.pw_uid if account else None,
            account.pw_gid if account else None,
        ),
        processes=JobProcesses(account.pw_uid if account else None, cgroup),
        unit=unit,
        account=account if own else None,
        places=places if own else None,
        docker=docker or docker_cli,
        passwd_file=settings.passwd_file,
    )


def _never(what: str) -> AccountPlaces:
    raise ValueError(what)
