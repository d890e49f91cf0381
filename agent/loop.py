"""The agent's main loop: watch this instance's own record and do what it asks (DESIGN.md sections 4, 5, 7).

The record says everything the agent needs: a run key appearing means "register a runner for it",
the run key clearing means "clean up and give the receipt", a threshold long passed means "nobody
will use this instance again", and a quarantine means "GitHub gave your runner a foreign job: stop it
now" (the instance is never used again; refresh terminates it, or the agent once its threshold and
grace have passed). The agent reads it with a consistent read the moment a notice arrives
(agent/notices.py), and every watch period without one; a
read that fails (throttling, a network blip) is retried with growing pauses and never ends the
loop, and nothing the loop does is repeated for the same hand-off.

A notice is most often a hand-over (the control plane sends it once the config is stored), so the
look it wakes reads the record and the runner config in one consistent BatchGetItem: a round trip
fewer between the config stored and the runner started. The look of a watch period reads the record
alone, and the config only when the record asks for a runner: an idle agent never reads its config.
Either way the agent acts on what the record says, never on the notice, and a config that is not the
one the record names (another run, another runner, one already used) is not started.

A hand-off is a run key and the runner the control plane registered for it (the record notes the
runner before the config is stored): the record naming another runner for the same run key is a
new hand-off, served like one. A runner that exits before GitHub gave it a job
left that job queued: the agent says so (UD_REG_FAILED for the run key), once, and the control
plane replaces it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

from agent.aws_errors import fault_of
from agent.boot import run_pre_runner_script
from agent.clock_check import clock_failure
from agent.docker import DockerError
from agent.heartbeat import Heartbeat
from agent.imds import InstanceIdentity
from agent.jit_config import runner_files
from agent.log import EventLog
from agent.log_shipping import LogShipper, diag_events
from agent.memory import MemoryFile
from agent.notices import NoticeListener, Wakeup
from agent.outbox import Outbox
from agent.ports import OwnRecord, OwnRunnerConfig
from agent.runner import RunnerProcess, RunnerStartError
from agent.runner_install import RunnerInstallError
from agent.scrub import Scrub
from agent.settings import AgentSettings
from agent.termination import SelfTermination
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import Signal
from runner_pool.domain.runner_configs import CredentialsUnreadableError, StoredConfig

_HEARTBEAT_JOIN_SECONDS = 5.0


class Agent:
    def __init__(
        self,
        *,
        identity: InstanceIdentity,
        settings: AgentSettings,
        records: OwnRecord,
        credentials: OwnRunnerConfig,
        termination: SelfTermination,
        scrub: Scrub,
        memory: MemoryFile,
        clock: Clock,
        log: EventLog,
        notices: NoticeListener | None = None,
        shipper: LogShipper | None = None,
    ) -> None:
        self._identity = identity
        self._settings = settings
        self._records = records
        self._credentials = credentials
        self._termination = termination
        self._scrub = scrub
        self._memory = memory
        self._clock = clock
        self._log = log
        self._notices = notices
        self._shipper = shipper
        self._wakeup = Wakeup()
        self._outbox = Outbox(records, identity.instance_id, memory, log)
        self._runner: RunnerProcess | None = None
        self._started_at = clock.now()
        self._failures = 0
        self._last_threshold: Epoch | None = None
        self._awaiting_config_for: str | None = None
        self._exit_reported = False
        self._quarantined = False
        self._terminated = False
        self._stopping = threading.Event()

    @property
    def terminated(self) -> bool:
        """The agent has asked for its instance to end; it does nothing more."""
        return self._terminated

    def run(self, stop: threading.Event) -> None:
        """Beat, boot, then watch the record until `stop` is set or the instance is being terminated."""
        self._stopping = stop
        beat_stop = threading.Event()
        heartbeat = Heartbeat(
            self._records,
            self._identity.instance_id,
            self._settings.heartbeat_period_seconds,
            beat_stop,
            self._log,
        )
        heartbeat.start()
        if self._shipper is not None:
            self._shipper.start()
        self._wakeup.wake_on(stop)
        if self._notices is not None:
            self._notices.start(stop, self._wakeup)
        self._log.info("agent started", instance_arn=self._identity.arn, notices=self._notices is not None)
        try:
            self.boot()
            noticed = False
            while not stop.is_set() and not self._terminated:
                # A notice ends the wait at once: the record changed in a way this agent must act on.
                noticed = self._wakeup.wait(self.step(noticed=noticed))
        finally:
            beat_stop.set()
            heartbeat.join(_HEARTBEAT_JOIN_SECONDS)
            if self._runner is not None and self._runner.running:
                self._runner.stop(self._settings.stop_timeout_seconds)
            self._log.info("agent stopped")
            if self._shipper is not None:
                self._shipper.close(self._settings.log_flush_seconds)

    def boot(self) -> None:
        """Check the clock and run the pre-runner script once per instance; signal UD_OK or UD_FAILED."""
        memory = self._memory.current
        if memory.booted:
            self._log.info(
                "agent restarted; the pre-runner script has already run", boot_failure=memory.boot_failure
            )
            self._scrub.keep_images(memory.first_boot_images)
            return
        failure = self._clock_failure()
        if failure is None:
            try:
                self._scrub.prepare()
            except OSError as exc:
                failure = f"the runner's work directory could not be prepared: {exc}"
            else:
                failure = run_pre_runner_script(
                    self._settings.pre_runner_script, self._settings.pre_runner_timeout_seconds, self._log
                )
        if failure is None:
            # Hashed now, while the instance boots, so that the first claim's start only checks stats.
            problems = self._scrub.runner.verify(full=True)
            if problems:
                failure = "the runner program is not as installed: " + "; ".join(problems[:5])
        images = self._first_boot_images() if failure is None else ()
        self._scrub.keep_images(images)
        self._memory.update(booted=True, boot_failure=failure, first_boot_images=images)
        if failure is None:
            self._outbox.send(Signal.UD_OK)
        else:
            self._log.error("boot failed", reason=failure)
            self._outbox.send(Signal.UD_FAILED, reason=failure)

    def _clock_failure(self) -> str | None:
        chronyc = self._settings.chronyc
        if chronyc is None:
            return None
        return clock_failure(
            chronyc,
            self._settings.clock_error_bound_seconds,
            self._settings.clock_sync_wait_seconds,
            self._log,
            pause=self._stopping.wait,
        )

    def _first_boot_images(self) -> tuple[str, ...]:
        try:
            return tuple(self._scrub.images_now())
        except DockerError as exc:
            # Not a reason to refuse the instance: the scrub then removes every image, the pre-runner
            # script's too, which costs pulls, not safety.
            self._log.warning("could not list docker's images at first boot", error=str(exc))
            return ()

    def step(self, *, noticed: bool = False) -> float:
        """One look at the record and what follows from it; returns the seconds until the next look.
        `noticed`: woken by a notice, so the record and the runner config are read together."""
        try:
            delay = self._watch(noticed)
        except Exception as exc:
            self._failures += 1
            delay = min(
                self._settings.watch_period_seconds * 2.0**self._failures,
                self._settings.watch_backoff_cap_seconds,
            )
            fault = fault_of(exc)
            if fault is not None:
                self._log.warning(
                    "could not read or act on the record; retrying",
                    fault=fault,
                    error=str(exc),
                    retry_in=delay,
                )
            else:
                self._log.exception("unexpected failure; retrying", retry_in=delay)
            # The record cannot be read, but the last threshold seen still holds: an outage of the
            # state table never keeps an expired instance alive.
            try:
                self._terminate_if_due(self._clock.now(), self._last_threshold)
            except Exception:
                self._log.exception("could not terminate this instance; will try again")
            return delay
        self._failures = 0
        return delay

    def _watch(self, noticed: bool) -> float:
        period = self._settings.watch_period_seconds
        self._outbox.flush()
        now = self._clock.now()
        stored_config: Callable[[], StoredConfig | None]
        if noticed:
            record, config = self._credentials.read_with_record(
                self._identity.instance_id, self._identity.arn
            )
            stored_config = _read_already(config)
        else:
            record = self._records.get(self._identity.instance_id)
            # Read only if the record asks for a runner: an idle look costs one GetItem.
            stored_config = partial(self._credentials.stored, self._identity.instance_id, self._identity.arn)
        if record is None:
            if now - self._started_at >= self._settings.orphan_grace_seconds:
                self._terminate("no record of this instance exists: nobody owns it")
            return period
        self._last_threshold = record.threshold
        if record.state is InstanceState.TERMINATED:
            self._terminate("the control plane has marked this instance terminated")
            return period
        if record.quarantined_at is not None:
            self._stop_quarantined()
            self._terminate_if_due(now, record.threshold)
            return period
        if self._terminate_if_due(now, record.threshold):
            return period
        self._follow(record.run_key, record.runner_id, stored_config)
        self._watch_runner()
        return period

    def _follow(
        self, wanted: str | None, runner_id: int | None, stored_config: Callable[[], StoredConfig | None]
    ) -> None:
        memory = self._memory.current
        serving = memory.serving_run_key
        handed_over_again = (
            serving is not None
            and serving == wanted
            and runner_id is not None
            and memory.serving_runner_id is not None
            and runner_id != memory.serving_runner_id
        )
        if serving is not None and (serving != wanted or handed_over_again):
            self._release(serving)
        if wanted is not None and self._memory.current.serving_run_key is None:
            self._register(wanted, runner_id, stored_config)

    def _watch_runner(self) -> None:
        """A runner that exited before it took a job: say so once, for the control plane to replace it."""
        runner = self._runner
        serving = self._memory.current.serving_run_key
        if runner is None or serving is None or self._exit_reported or not runner.exited_without_job():
            return
        self._exit_reported = True
        reason = "the runner exited before it took a job"
        self._hand_over_log(serving).warning(reason)
        self._outbox.send(Signal.UD_REG_FAILED, serving, reason)

    def _hand_over_log(self, run_key: str, runner_id: int | None = None) -> EventLog:
        """The log of one hand-over: every line carries its run key and its runner's id, which tell one
        job's lines from the next one's on this instance (domain/job_logs.py)."""
        return self._log.bind(run_key=run_key, runner_id=runner_id or self._memory.current.serving_runner_id)

    def _register(
        self, run_key: str, runner_id: int | None, stored_config: Callable[[], StoredConfig | None]
    ) -> None:
        log = self._hand_over_log(run_key, runner_id)
        memory = self._memory.current
        refusal = memory.boot_failure or memory.scrub_failure or self._scrub.operator_session()
        if refusal is not None:
            # A failed boot, a scrub that left something of an earlier job, or an operator's session since
            # (a root shell no scrub can undo): no job runs here again.
            self._memory.update(serving_run_key=run_key)
            self._outbox.send(Signal.UD_REG_FAILED, run_key, f"not registering: {refusal}")
            return
        stored = stored_config()
        if (
            stored is None
            or stored.run_key != run_key
            or (runner_id is not None and stored.runner_id not in (None, runner_id))
            or stored.config_id == memory.used_config_id
        ):
            # None yet, or the config of an earlier hand-off: the one the record names is on its way.
            if self._awaiting_config_for != run_key:
                log.info("claimed; waiting for the runner config")
                self._awaiting_config_for = run_key
            return
        try:
            config = self._credentials.decrypt(stored, self._identity.arn)
        except CredentialsUnreadableError as exc:
            self._memory.update(serving_run_key=run_key)
            log.error("runner config unreadable", reason=str(exc))
            self._outbox.send(Signal.UD_REG_FAILED, run_key, str(exc))
            return
        # Remembered before the runner starts: whatever happens next, no second runner for this hand-off.
        self._memory.update(
            serving_run_key=run_key, used_config_id=config.config_id, serving_runner_id=config.runner_id
        )
        log = self._hand_over_log(run_key, config.runner_id)
        self._exit_reported = False
        waited = None if config.stored_at is None else round(self._clock.now() - config.stored_at, 3)
        # How long the config waited for this agent: the notice's worth, readable in every instance's log.
        log.info("starting the runner", config_waited_seconds=waited)
        try:
            files = runner_files(config.jit_config)
            self._scrub.runner.check_before_start()
            self._scrub.runner.install_config(files)
            self._runner = RunnerProcess.start(
                self._settings.runner_start_script,
                cwd=self._settings.runner_dir,
                user=self._settings.runner_user,
                log=log,
                cgroup=self._scrub.cgroup,
                unit=self._scrub.unit,
            )
            self._runner.wait_until_listening(self._settings.listening_timeout_seconds, self._stopping)
        except Exception as exc:
            reason = (
                str(exc)
                if isinstance(exc, (RunnerStartError, RunnerInstallError))
                else f"the runner could not be started: {exc!r}"
            )
            log.error("runner registration failed", reason=reason)
            if self._runner is not None:
                self._runner.stop(self._settings.stop_timeout_seconds)
            self._exit_reported = True  # the failure is the report: never a second, vaguer one
            self._outbox.send(Signal.UD_REG_FAILED, run_key, reason)
            return
        log.info("runner listening for jobs")
        self._outbox.send(Signal.UD_REG_OK, run_key)

    def _release(self, run_key: str) -> None:
        log = self._hand_over_log(run_key)
        log.info("run key released; cleaning up")
        session = None
        if self._runner is not None:
            self._runner.stop(self._settings.stop_timeout_seconds)
            session = self._runner.session_id
            self._runner = None
        self._ship_runner_logs(run_key, log)
        report = self._scrub.run(session)
        if not report.clean:
            reason = report.reason()
            log.error("cleanup failed", reason=reason, scrub_seconds=round(report.seconds, 3))
            # Remembered: should the instance come back to the pool anyway (a provision giving it back
            # before the receipt), it refuses every later run key.
            self._memory.update(serving_run_key=None, serving_runner_id=None, scrub_failure=reason)
            self._outbox.send(Signal.UD_REMOVE_REG_FAILED, run_key, reason)
            return
        log.info(
            "workspace clean", leftover_processes_killed=report.killed, scrub_seconds=round(report.seconds, 3)
        )
        self._memory.update(serving_run_key=None, serving_runner_id=None)
        self._outbox.send(Signal.UD_REMOVE_REG_OK, run_key)

    def _ship_runner_logs(self, run_key: str, log: EventLog) -> None:
        """The runner's diagnostic lines of this hand-over, sent before the scrub empties `_diag`: waited
        for at most `log_flush_seconds`, so an unreachable CloudWatch Logs never holds the scrub up."""
        if self._shipper is None:
            return
        identity = {"run_key": run_key, "runner_id": self._memory.current.serving_runner_id}
        diag = self._scrub.runner.directory / "_diag"
        events, unread = diag_events(diag, identity, self._clock.now())
        self._shipper.runner_lines(events)
        sent = self._shipper.flush(self._settings.log_flush_seconds)
        log.info(
            "runner's diagnostic logs shipped"
            if sent
            else "runner's diagnostic logs not all shipped in time",
            diag_lines=len(events),
            diag_bytes_unread=unread,
            log_lines_dropped=self._shipper.dropped,
        )

    def _stop_quarantined(self) -> None:
        """Stop the runner, and with it the foreign job, at once; no scrub, no receipt, no runner again:
        whatever the job left stays for the instance's end."""
        runner = self._runner
        if runner is not None and runner.running:
            self._log.error("this instance is quarantined; stopping its runner")
            runner.stop(self._settings.stop_timeout_seconds)
        elif not self._quarantined:
            self._log.error("this instance is quarantined; it serves no run again")
        self._quarantined = True

    def _terminate_if_due(self, now: Epoch, threshold: Epoch | None) -> bool:
        if threshold is None or now < threshold + self._settings.termination_grace_seconds:
            return False
        self._terminate(
            f"the threshold passed {now - threshold:.0f} s ago and nobody terminated this instance"
        )
        return True

    def _terminate(self, reason: str) -> None:
        self._termination.terminate(reason)
        self._terminated = True


def _read_already(config: StoredConfig | None) -> Callable[[], StoredConfig | None]:
    return lambda: config
