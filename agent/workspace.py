"""What a job leaves behind on the instance: processes it started and its work directory.

Before an instance goes back to the pool, every process of the last job is killed and the work
directory emptied, so the next run starts on a clean machine. A job's processes are found two
ways: by the runner's session, which the job inherits, and (when the runner has an account of its
own) by that account, which catches processes that left the session.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

_SWEEPS = 5
"""Rounds of killing: a process may fork between our reading /proc and our signal reaching it."""


class CleanupError(RuntimeError):
    """Something of the last job could not be removed; the message is the reason in UD_REMOVE_REG_FAILED."""


@dataclass(frozen=True)
class JobProcess:
    pid: int
    uid: int
    session_id: int


class Workspace:
    def __init__(self, work_dir: Path, runner_user: str | None, proc_root: Path = Path("/proc")) -> None:
        self._work_dir = work_dir
        self._account = pwd.getpwnam(runner_user) if runner_user else None
        self._proc = proc_root

    @property
    def work_dir(self) -> Path:
        return self._work_dir

    def prepare(self) -> None:
        """An empty work directory the runner's account owns, as the runner expects to find it."""
        self._work_dir.mkdir(parents=True, exist_ok=True)
        if self._account is not None:
            os.chown(self._work_dir, self._account.pw_uid, self._account.pw_gid)

    def clean(self, session_id: int | None) -> list[int]:
        """Kill the last job's leftover processes, then empty the work directory; returns the pids killed."""
        killed = self._kill_leftovers(session_id)
        try:
            if self._work_dir.exists():
                shutil.rmtree(self._work_dir)
            self.prepare()
        except OSError as exc:
            raise CleanupError(f"the work directory {self._work_dir} could not be emptied: {exc}") from exc
        return killed

    def _kill_leftovers(self, session_id: int | None) -> list[int]:
        killed: list[int] = []
        for _ in range(_SWEEPS):
            leftovers = [p for p in self._processes() if self._belongs_to_job(p, session_id)]
            if not leftovers:
                return killed
            for process in leftovers:
                try:
                    os.kill(process.pid, signal.SIGKILL)
                    killed.append(process.pid)
                except ProcessLookupError:
                    pass
        survivors = [p.pid for p in self._processes() if self._belongs_to_job(p, session_id)]
        if survivors:
            raise CleanupError(f"processes of the last job survived being killed: {survivors}")
        return killed

    def _belongs_to_job(self, process: JobProcess, session_id: int | None) -> bool:
        if process.pid == os.getpid():
            return False
        if session_id is not None and process.session_id == session_id:
            return True
        # Only a runner account of its own marks a process as the job's: sharing ours, it would be us.
        return (
            self._account is not None
            and self._account.pw_uid != os.getuid()
            and (process.uid == self._account.pw_uid)
        )

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
    """A live process's uid and session from /proc; None if it is gone or already a zombie."""
    try:
        stat = (entry / "stat").read_text()
        status = (entry / "status").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'.
    state, _ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
    if state in ("Z", "X"):
        return None
    uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
    return JobProcess(pid=int(entry.name), uid=uid, session_id=int(session))
