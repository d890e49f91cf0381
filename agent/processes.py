"""The last job's processes: found by the runner's session, account and cgroup, and killed.

A job's process may leave the runner's session (setsid) or change its uid (sudo, a setuid program):
each way of finding it catches what the others miss. The session catches what the job started while
the runner shares the agent's account (the emulator); the account's uid (real, effective, saved or
file system) catches anything of the account however detached; the job's cgroup (cgroup v2: the
transient service the runner runs in, agent/sandbox.py, or one below the agent's own where its unit
delegates one) catches what the job started under another uid, through sudo too, since a process
cannot leave its cgroup without root. Containers live in the docker daemon's cgroups: the
scrub removes them through docker (agent/docker.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_SWEEPS = 5
"""Rounds of killing: a process may fork between our reading /proc and our signal reaching it."""
DEATH_WAIT_SECONDS = 5.0
"""How long killed processes may take to be gone before the scrub reports them as survivors."""
_DEATH_LOOK_SECONDS = 0.05


@dataclass(frozen=True)
class JobProcess:
    pid: int
    uids: frozenset[int]
    session_id: int


class JobCgroup:
    """A cgroup v2 directory the runner starts in (`enter` runs in the runner's process before exec)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    @classmethod
    def below_own(
        cls, name: str, cgroup_root: Path, proc_self: Path = Path("/proc/self/cgroup")
    ) -> JobCgroup:
        """`name` inside the cgroup this process runs in (the agent unit's, under systemd)."""
        own = next(line for line in proc_self.read_text().splitlines() if line.startswith("0::"))
        return cls(cgroup_root / own[3:].lstrip("/") / name)

    @property
    def path(self) -> Path:
        return self._path

    def prepare(self) -> None:
        self._path.mkdir(parents=True, exist_ok=True)

    def enter(self) -> None:
        """Moves the calling process into the cgroup; for a child between fork and exec."""
        descriptor = os.open(self._path / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(descriptor, b"0")
        finally:
            os.close(descriptor)

    def pids(self) -> set[int]:
        found: set[int] = set()
        if not self._path.exists():
            return found
        for directory, _dirs, _files in os.walk(self._path):
            with contextlib.suppress(OSError):
                found |= {int(pid) for pid in (Path(directory) / "cgroup.procs").read_text().split()}
        return found

    def send_signal(self, signum: signal.Signals) -> None:
        """`signum` to every process in the cgroup."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill(self) -> None:
        """Every process in the cgroup, at once where the kernel offers it (cgroup.kill, Linux 5.14)."""
        kill_file = self._path / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        self.send_signal(signal.SIGKILL)


class JobProcesses:
    def __init__(
        self, account_uid: int | None, cgroup: JobCgroup | None = None, proc_root: Path = Path("/proc")
    ) -> None:
        # Only a runner account of its own marks a process as the job's: sharing ours, it would be us.
        self._uid = account_uid if account_uid is not None and account_uid != os.getuid() else None
        self._cgroup = cgroup
        self._proc = proc_root

    @property
    def cgroup(self) -> JobCgroup | None:
        return self._cgroup

    def find(self, session_id: int | None) -> list[JobProcess]:
        in_cgroup = self._cgroup.pids() if self._cgroup is not None else set()
        return [p for p in self._processes() if self._belongs_to_job(p, session_id, in_cgroup)]

    def kill(self, session_id: int | None) -> tuple[list[int], list[int]]:
        """Kill every process of the last job; returns the pids killed and those that survived.

        SIGKILL cannot be caught, but a process dies only once the kernel has it run its exit, which on
        a loaded machine (or from an uninterruptible wait) takes a moment: one still listed is signalled
        again and waited for, until it is gone or DEATH_WAIT_SECONDS have passed."""
        killed: list[int] = []
        deadline = time.monotonic() + DEATH_WAIT_SECONDS
        sweeps = 0
        while True:
            if self._cgroup is not None:
                self._cgroup.kill()
            leftovers = self.find(session_id)
            if not leftovers:
                return killed, []
            if sweeps >= _SWEEPS and time.monotonic() >= deadline:
                return killed, [p.pid for p in leftovers]
            for process in leftovers:
                try:
                    os.kill(process.pid, signal.SIGKILL)
                    killed.append(process.pid)
                except ProcessLookupError:
                    pass
            sweeps += 1
            if sweeps >= _SWEEPS:
                time.sleep(_DEATH_LOOK_SECONDS)

    def _belongs_to_job(self, process: JobProcess, session_id: int | None, in_cgroup: set[int]) -> bool:
        if process.pid == os.getpid():
            return False
        if process.pid in in_cgroup:
            return True
        if session_id is not None and process.session_id == session_id:
            return True
        return self._uid is not None and self._uid in process.uids

    def _processes(self) -> list[JobProcess]:
        found = []
        for entry in self._proc.iterdir():
            if not entry.name.isdigit():
                continue
            process = _read_process(entry)
            if process is not None:
                found.append(process)
        return found


def _read_process(entry: Path) -> JobProcess | None:
    """A live process's uids and session from /proc; None if it is gone or already a zombie."""
    try:
        stat = (entry / "stat").read_text()
        status = (entry / "status").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'.
    state, _ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
    if state in ("Z", "X"):
        return None
    # Uid: real, effective, saved set, file system (proc(5)).
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    return JobProcess(pid=int(entry.name), uids=frozenset(int(uid) for uid in uids), session_id=int(session))
