"""The GitHub runner process: started with a JIT config, watched until it listens for jobs, and stopped.

On an instance the runner is a transient systemd service, sandboxed (agent/sandbox.py): the agent's
child is systemd-run, which passes the runner's output through and ends with it, and the job's
processes are the service's cgroup. Without systemd (the emulator, the tests) the runner is the agent's
own child, in a session of its own, so it and every process its job starts (unless one sets up a
session of its own) can be found again by session id and stopped together.

The runner is `run.sh` with no argument, which runs `Runner.Listener run` on the settings files the agent
wrote from the JIT config: what the runner reads, and why that is what `--jitconfig` would give it, is in
agent/jit_config.py. Nor does the runner get any `ACTIONS_RUNNER_INPUT_*` variable, each of which the
listener takes as one of its command-line arguments (actions/runner 258d6c857db3,
src/Runner.Listener/CommandSettings.cs:110-140): a stray `ACTIONS_RUNNER_INPUT_JITCONFIG` would have it
overwrite the agent's files before loading them (src/Runner.Listener/Runner.cs:234-270).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.log import EventLog
from agent.processes import JobCgroup
from agent.sandbox import JobUnit

LISTENING_MARK = "Listening for Jobs"
"""What the runner prints once it holds a session with GitHub and waits for its job."""
JOB_MARK = "Running job: "
"""What the runner prints when GitHub hands it its job (actions/runner: Runner.Listener's JobDispatcher)."""
_TAIL_LINES = 5
_POLL_SECONDS = 0.02
_SECRET_PREFIXES = ("RUNNER_POOL_", "AWS_")
RUNNER_ARGUMENT_PREFIX = "ACTIONS_RUNNER_INPUT_"
"""The listener takes a variable so named as a command-line argument (see above): the runner gets none."""


class RunnerStartError(RuntimeError):
    """The runner did not get to listening; the message is the reason given in UD_REG_FAILED."""


class RunnerProcess:
    """One runner process; its output goes to the agent's log line by line."""

    def __init__(self, process: subprocess.Popen[str], log: EventLog, unit: JobUnit | None = None) -> None:
        self._process = process
        self._log = log
        self._unit = unit
        self._listening = threading.Event()
        self._took_job = threading.Event()
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._reader = threading.Thread(target=self._read_output, name="runner-output", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        program: Path,
        *,
        cwd: Path,
        user: str | None,
        log: EventLog,
        cgroup: JobCgroup | None = None,
        unit: JobUnit | None = None,
    ) -> RunnerProcess:
        """`program` (run.sh, which finds its config files in the runner directory) in `cwd`, as `user`
        if given: as the service `unit` if given (the sandbox), else in `cgroup` if given;
        RunnerStartError if it won't start. No argument and no variable of its environment carries the
        runner's credentials: every process can read a process's arguments, and the job's processes
        (same account) its environment."""
        account = pwd.getpwnam(user) if user else None
        if unit is not None:
            if account is None:
                raise RunnerStartError("the runner's sandbox needs a runner account of its own")
            return cls._start_unit(unit, program, cwd=cwd, account=account, log=log)
        if cgroup is not None:
            try:
                cgroup.prepare()
            except OSError as exc:
                raise RunnerStartError(f"the job's cgroup {cgroup.path} could not be made: {exc}") from exc
        try:
            process = _start(
                [str(program)],
                env=_runner_environment(os.environ, account),
                cwd=cwd,
                # Between fork and exec: into the job's cgroup while still root, then the account.
                # Popen's own user= would drop root before preexec_fn runs, so the switch is done here.
                preexec_fn=_enter(cgroup, account) if cgroup is not None else None,
                user=account.pw_uid if account and cgroup is None else None,
                group=account.pw_gid if account and cgroup is None else None,
                extra_groups=os.getgrouplist(account.pw_name, account.pw_gid)
                if account and cgroup is None
                else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RunnerStartError(f"the runner could not be started: {exc}") from exc
        log.info("runner started", pid=process.pid)
        return cls(process, log)

    @classmethod
    def _start_unit(
        cls, unit: JobUnit, program: Path, *, cwd: Path, account: pwd.struct_passwd, log: EventLog
    ) -> RunnerProcess:
        """systemd-run, which starts the service and lives as long as it does. The service's environment
        is systemd's own, with the account's HOME, USER, LOGNAME and SHELL (systemd.exec(5) User=): none
        of the agent's."""
        job = uuid.uuid4().hex[:12]
        name = unit.name(job)
        try:
            process = _start(
                unit.command(program, job=job, cwd=cwd, account=account),
                env={k: v for k, v in os.environ.items() if not k.startswith(_SECRET_PREFIXES)},
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RunnerStartError(f"the runner's service {name} could not be started: {exc}") from exc
        log.info("runner started", pid=process.pid, unit=name)
        return cls(process, log, unit)

    @property
    def session_id(self) -> int:
        """The runner's session (and process group): it leads both, so they share its pid."""
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def exited_without_job(self) -> bool:
        """Whether the runner has exited before GitHub gave it a job (which then stays queued); its
        output is read to the end first, so a job taken just before the exit is never missed."""
        if self.running:
            return False
        self._reader.join(1.0)
        return not self._took_job.is_set()

    def wait_until_listening(self, timeout_seconds: float, cancel: threading.Event | None = None) -> None:
        """Returns once the runner listens for jobs; RunnerStartError if it exits, times out or
        `cancel` is set first."""
        deadline = time.monotonic() + timeout_seconds
        while not self._listening.wait(_POLL_SECONDS):
            if cancel is not None and cancel.is_set():
                raise RunnerStartError("the agent stopped while the runner was starting")
            if not self.running:
                self._reader.join(1.0)  # let the last lines in, for the reason
                if self._listening.is_set():
                    return
                raise RunnerStartError(
                    f"the runner exited with code {self._process.returncode} before listening"
                    + self._last_words()
                )
            if time.monotonic() >= deadline:
                raise RunnerStartError(
                    f"the runner was not listening after {timeout_seconds:g} s" + self._last_words()
                )

    def stop(self, timeout_seconds: float) -> None:
        """Ask the runner to stop (SIGINT, as Ctrl-C would), then kill its process group (and its
        service's cgroup) if it lingers."""
        if self.running:
            self._signal_group(signal.SIGINT)
            try:
                self._process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self._log.warning("runner did not stop in time; killing it", pid=self._process.pid)
                self._signal_group(signal.SIGKILL)
                self._process.wait()
            self._log.info("runner stopped", exit_code=self._process.returncode)
        self._reader.join(1.0)

    def _signal_group(self, signum: signal.Signals) -> None:
        if self._unit is not None:
            # The runner and its job are the service's; systemd-run, which waits for them, ends with them.
            if signum != signal.SIGKILL:
                self._unit.cgroup.send_signal(signum)
                return
            self._unit.cgroup.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)

    def _read_output(self) -> None:
        if self._process.stdout is None:
            return
        for raw in self._process.stdout:
            line = raw.rstrip()
            if not line:
                continue
            self._tail.append(line)
            self._log.info("runner output", line=line)
            if LISTENING_MARK in line:
                self._listening.set()
            if JOB_MARK in line:
                self._took_job.set()

    def _last_words(self) -> str:
        return f"; last output: {' | '.join(self._tail)}" if self._tail else ""


def _start(command: list[str], *, env: dict[str, str], **how: Any) -> subprocess.Popen[str]:
    """The runner's process (systemd-run's, in a unit), in a session of its own so that it can be signalled
    as a whole; its output read line by line, stderr with stdout. `how`: Popen's other arguments."""
    return subprocess.Popen(  # noqa: S603 - the runner's start script (or systemd-run's), no shell
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
        **how,
    )


def _enter(cgroup: JobCgroup, account: pwd.struct_passwd | None) -> Callable[[], None]:
    groups = os.getgrouplist(account.pw_name, account.pw_gid) if account else None

    def enter() -> None:
        cgroup.enter()
        if account is not None and groups is not None:
            os.setgroups(groups)
            os.setresgid(account.pw_gid, account.pw_gid, account.pw_gid)
            os.setresuid(account.pw_uid, account.pw_uid, account.pw_uid)

    return enter


def _runner_environment(environment: Mapping[str, str], account: pwd.struct_passwd | None) -> dict[str, str]:
    """The agent's environment without its own settings, its AWS configuration or anything the runner would
    take as an argument, and with the runner's home."""
    runner_env = {
        # The listener matches the prefix in any case (CommandSettings.cs:117).
        k: v
        for k, v in environment.items()
        if not k.startswith(_SECRET_PREFIXES) and not k.upper().startswith(RUNNER_ARGUMENT_PREFIX)
    }
    if account is not None:
        runner_env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    return runner_env
