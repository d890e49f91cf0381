"""Simulated EC2 instances: each instance the stack launches in local EC2 boots our real agent.

A watcher looks at local EC2 (DescribeInstances, by the stack's tag) a few times a second. An
instance it has not seen is booted after a boot delay: our agent starts (`python -m agent`, exactly
as systemd starts it) in a process of its own, with the settings the user data would write, the
instance's metadata answered by a local IMDSv2 (emulator/imds.py), and a runner directory whose
`run.sh` starts the emulator's runner program (emulator/runner_program.py). When EC2 says the
instance is shutting down or terminated, its agent is stopped as an OS shutdown stops it (SIGTERM,
then SIGKILL). When EC2 says the instance is stopping or stopped (the stopped tier), its OS shuts down
the same way but the instance stays, its directory (the memory file on its volume) kept; when EC2
starts it again, its agent boots again after the boot delay, as systemd starts it at boot (EC2 User
Guide, "Stop and start Amazon EC2 instances": the root volume persists, RAM does not). `crash` kills an
instance's agent and runner at once, as a hung or dead machine would leave them, while EC2 still has
the instance running.

`systemctl` on the instance's PATH is the simulation's: `systemctl poweroff` (the agent's last
resort when it cannot terminate itself) marks the instance powered off, and the watcher terminates
it in EC2, as the launch template's shutdown behaviour (terminate) makes EC2 do. So is `chronyc`, which
the agent asks at boot how far its clock is from Amazon Time Sync (agent/clock_check.py): a simulated
instance's clock is this machine's, the one the local control plane reads, so it answers synchronised
to the link-local endpoint and no offset.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from agent.imds import InstanceIdentity
from agent.log import EventLog
from agent.settings import ENV_PREFIX, AgentSettings
from agent.wiring import build_agent
from emulator import iam_check, runner_program
from emulator.aws import ACCOUNT, REGION, LocalAws
from emulator.iam_agent import AgentCheckSpec, collect_denials
from emulator.imds import InstanceMetadata
from emulator.moto_internals import resolve
from emulator.timeline import Happening, Timeline
from runner_pool.domain.clock import Epoch

ENDED_EC2_STATES = ("shutting-down", "terminated")
HALTED_EC2_STATES = ("stopping", "stopped")
RUNNING_EC2_STATES = ("pending", "running")
_EC2_BACKENDS = "moto.ec2.models:ec2_backends"
LAUNCH_TEMPLATE_TAG = "aws:ec2launchtemplate:id"
"""The tag EC2 puts on an instance launched from a launch template, naming it (EC2 User Guide, "Launch an
instance from a launch template": "aws:ec2launchtemplate:id")."""
POWERED_OFF = "powered-off"
"""The file the simulated `systemctl poweroff` leaves in the instance's directory."""
_SYSTEMCTL = """#!/bin/sh
# systemctl on a simulated instance: poweroff marks the instance powered off, for the emulator to end.
if [ "$1" = poweroff ]; then touch "{marker}"; fi
exit 0
"""


def chronyc_script(offset_seconds: float = 0.0, leap: str = "Normal", asked: Path | None = None) -> str:
    """A `chronyc` whose `-c tracking` reports the system clock `offset_seconds` slow of Amazon Time Sync
    (fast when negative), with chrony's leap status `leap` ("Not synchronised" before its first update);
    each time it is asked it adds a line to `asked`, when given."""
    fields = ["A9FEA97B", "169.254.169.123", "3", "1767225600.000000000", f"{offset_seconds:.9f}"]
    fields += ["0.000000000", "0.000000000", "0.000", "0.000", "0.000", "0.000100000", "0.000100000"]
    fields += ["16.0", leap]
    note = f'echo "$*" >> "{asked}"\n' if asked is not None else ""
    return f"#!/bin/sh\n# chronyc on a simulated instance\n{note}echo '{','.join(fields)}'\n"


CHRONYC_ASKED = "chronyc-asked"
"""The file the simulated `chronyc` adds a line to, its arguments, each time the agent asks it."""
IN_PROCESS_LOGGER = "runner_pool.agent.in_process"
_RUN_SH = '#!/bin/sh\nexec "{python}" "{program}" "$@"\n'
_AGENT_MESSAGES = {
    "agent started": Happening.BOOTED,
    "starting the runner": Happening.HEARD,
    "runner listening for jobs": Happening.REGISTERED,
    "workspace clean": Happening.CLEANED,
}
"""Lines of the agent's journal that the timeline notes (the rest stays in the instance's agent.log)."""


IN_PROCESS_CONNECTIONS = 2000
"""Connections of the in-process agents' shared SQS client: one per agent's open long poll."""


@dataclass(frozen=True)
class InstanceSettings:
    """How simulated instances behave: their boot time and their agents' (compressed) periods."""

    boot_delay_seconds: float = 2.0
    boot_delays: Callable[[], float] | None = None
    """Draws each instance's boot delay instead of `boot_delay_seconds` (e.g. emulator/boot_model.py's
    `compressed_boot_delays`: published boot segments, time-compressed)."""
    heartbeat_period_seconds: float = 1.0
    watch_period_seconds: float = 5.0
    """Slow, as in production (15 s): claims and releases reach an agent by its notice queue; the
    period only bounds what a lost notice costs."""
    listening_timeout_seconds: float = 20.0
    stop_timeout_seconds: float = 5.0
    termination_grace_seconds: float = 30.0
    orphan_grace_seconds: float = 60.0
    shutdown_seconds: float = 5.0
    """How long an OS shutdown lets the agent stop before it is killed."""
    log_ship_period_seconds: float = 1.0
    """How often the agents send their lines to the job logs' group (5 s in production)."""
    in_process: bool = False
    """Run each agent in a thread of this process instead of a process of its own: the same agent
    (`agent.wiring.build_agent`), without a Python start-up per instance, for scenarios with many
    instances. A crash then kills the runner and stops the agent where it stands."""

    def boot_delay(self) -> float:
        return self.boot_delay_seconds if self.boot_delays is None else self.boot_delays()

    def agent_environment(self) -> dict[str, str]:
        return {
            "HEARTBEAT_PERIOD_SECONDS": str(self.heartbeat_period_seconds),
            "WATCH_PERIOD_SECONDS": str(self.watch_period_seconds),
            "WATCH_BACKOFF_CAP_SECONDS": str(max(self.watch_period_seconds * 8, 1.0)),
            "LISTENING_TIMEOUT_SECONDS": str(self.listening_timeout_seconds),
            "STOP_TIMEOUT_SECONDS": str(self.stop_timeout_seconds),
            "TERMINATION_GRACE_SECONDS": str(self.termination_grace_seconds),
            "ORPHAN_GRACE_SECONDS": str(self.orphan_grace_seconds),
            "LOG_SHIP_PERIOD_SECONDS": str(self.log_ship_period_seconds),
        }


class Phase(StrEnum):
    LAUNCHED = "launched"
    BOOTED = "booted"
    STOPPED = "stopped"
    CRASHED = "crashed"
    ENDED = "ended"


@dataclass
class SimulatedInstance:
    instance_id: str
    directory: Path
    launched_at: Epoch
    boot_at: Epoch
    launch_template: str | None = None
    """The local launch template EC2 launched it from (the `aws:ec2launchtemplate:id` tag EC2 adds): its
    instance profile's role is what the agent's calls are checked against."""
    phase: Phase = Phase.LAUNCHED
    agent: subprocess.Popen[str] | None = field(default=None, repr=False)
    agent_thread: _AgentThread | None = field(default=None, repr=False)

    @property
    def runner_dir(self) -> Path:
        return self.directory / "actions-runner"

    def runner_pid(self) -> int | None:
        pid_file = self.runner_dir / runner_program.PID_FILE
        with contextlib.suppress(OSError, ValueError):
            return int(pid_file.read_text())
        return None


class SimulatedInstances:
    """`with SimulatedInstances(...) as instances:` boots an agent for every instance the stack launches."""

    def __init__(
        self,
        aws: LocalAws,
        *,
        table_name: str,
        credentials_key_id: str,
        stack_tag: tuple[str, str],
        notice_queue_url_prefix: str | None = None,
        log_group_name: str | None = None,
        scratch: Path,
        timeline: Timeline,
        settings: InstanceSettings | None = None,
        poll_seconds: float = 0.2,
    ) -> None:
        self._aws = aws
        self._ec2 = aws.client("ec2")
        self._tag = stack_tag
        self._scratch = scratch
        self._timeline = timeline
        self.settings = settings or InstanceSettings()
        self._agent_settings = {
            "TABLE_NAME": table_name,
            "CREDENTIALS_KEY_ID": credentials_key_id,
            "REGION": REGION,
            **({"NOTICE_QUEUE_URL_PREFIX": notice_queue_url_prefix} if notice_queue_url_prefix else {}),
            **({"LOG_GROUP_NAME": log_group_name} if log_group_name else {}),
            **self.settings.agent_environment(),
        }
        self._poll = poll_seconds
        self._instances: dict[str, SimulatedInstance] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._metadata = InstanceMetadata()
        self._watcher = threading.Thread(target=self._watch, name="simulated-instances", daemon=True)
        self._readers: list[threading.Thread] = []
        self._clients: dict[str, Any] = {}

    # --- lifecycle

    def __enter__(self) -> SimulatedInstances:
        self._metadata.__enter__()
        self._watcher.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._watcher.join()
        with self._lock:
            running = [i for i in self._instances.values() if i.phase is Phase.BOOTED]
        for instance in running:
            self._signal(instance, signal.SIGTERM)
        for instance in running:
            # The emulator stops, not the instance: its lane just ends, it was not terminated.
            self._end(instance, reason=None)
        for reader in self._readers:
            reader.join(1.0)
        collect_agent_denials(self._scratch)
        self._metadata.__exit__(kind, error, trace)

    def _agent_command(self, instance: SimulatedInstance) -> list[str]:
        """`python -m agent`; with the IAM check on, the same agent checked as its instance."""
        check = iam_check.installed_check()
        if check is None:
            return [sys.executable, "-m", "agent"]
        template = self._scratch / IAM_TEMPLATE
        if not template.exists():
            template.write_text(json.dumps(check.iam.template))
        spec = AgentCheckSpec(
            template=str(template),
            environment={
                "RUNNER_POOL_TABLE_NAME": self._agent_settings["TABLE_NAME"],
                "RUNNER_POOL_CREDENTIALS_KEY_ID": self._agent_settings["CREDENTIALS_KEY_ID"],
                **{
                    f"RUNNER_POOL_{name}": self._agent_settings[name]
                    for name in ("NOTICE_QUEUE_URL_PREFIX",)
                    if name in self._agent_settings
                },
            },
            region=REGION,
            account=ACCOUNT,
            instance_id=instance.instance_id,
            role=check.iam.instance_role(instance.launch_template),
            denials=str(instance.directory / IAM_DENIALS),
            usage_directory=os.environ.get(iam_check.USAGE_DIRECTORY_VARIABLE),
        )
        return [
            sys.executable,
            "-m",
            "emulator.iam_agent",
            str(spec.write(instance.directory / "iam-check.json")),
        ]

    # --- what a scenario does to instances

    @property
    def metadata(self) -> InstanceMetadata:
        """The instances' metadata service, where EC2's notices to an instance are posted."""
        return self._metadata

    def crash(self, instance_id: str) -> None:
        """The instance dies where it stands: agent and runner killed, no goodbye; EC2 still runs it."""
        with self._lock:
            instance = self._instances[instance_id]
            if instance.phase is not Phase.BOOTED:
                raise ValueError(f"{instance_id} is {instance.phase}; only a booted instance can crash")
            instance.phase = Phase.CRASHED
        self._kill(instance)
        self._timeline.record(Happening.CRASHED, instance_id)

    def instances(self) -> dict[str, SimulatedInstance]:
        with self._lock:
            return dict(self._instances)

    def booted(self) -> list[str]:
        with self._lock:
            return [i.instance_id for i in self._instances.values() if i.phase is Phase.BOOTED]

    # --- the watcher

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.look()
            except Exception:  # noqa: S112 - local EC2 unreachable for a moment: look again next time
                continue

    def look(self) -> None:
        """One look at EC2 and at the instances' processes, acting on what changed."""
        now = time.time()
        for instance_id, state in self._ec2_states().items():
            with self._lock:
                instance = self._instances.get(instance_id)
                if instance is None and state not in ENDED_EC2_STATES:
                    self._instances[instance_id] = instance = SimulatedInstance(
                        instance_id,
                        self._scratch / instance_id,
                        launched_at=now,
                        boot_at=now + self.settings.boot_delay(),
                        launch_template=self._launch_template_of(instance_id),
                    )
                    self._timeline.record(Happening.LAUNCHED, instance_id, at=now)
            if instance is not None and state in ENDED_EC2_STATES and instance.phase is not Phase.ENDED:
                self._signal(instance, signal.SIGTERM)
                self._end(instance, reason=f"EC2 says {state}")
            elif instance is not None and state in HALTED_EC2_STATES and instance.phase is Phase.BOOTED:
                self._halt(instance)
            elif instance is not None and state in RUNNING_EC2_STATES and instance.phase is Phase.STOPPED:
                with self._lock:
                    instance.phase, instance.boot_at = Phase.LAUNCHED, now + self.settings.boot_delay()
                self._timeline.record(Happening.STARTED, instance_id, at=now)
        for instance in self.instances().values():
            if instance.phase is Phase.LAUNCHED and instance.boot_at <= now:
                self._boot(instance)
            elif instance.phase is Phase.BOOTED and (instance.directory / POWERED_OFF).exists():
                # The instance powered itself off; its shutdown behaviour is terminate.
                self._ec2.terminate_instances(InstanceIds=[instance.instance_id])

    @staticmethod
    def _launch_template_of(instance_id: str) -> str | None:
        tags = resolve(_EC2_BACKENDS)[ACCOUNT][REGION].tags.get(instance_id, {})
        template = tags.get(LAUNCH_TEMPLATE_TAG)
        return None if template is None else str(template)

    def _ec2_states(self) -> dict[str, str]:
        """The state of every instance with the stack's tag, read from the EC2 backend local AWS answers
        from. DescribeInstances said the same at a cost that grew with the square of the instances
        (moto matches a tag filter by listing every tag of the region, for each instance) and serialised
        all of them to XML a few times a second: with 300 instances, a seventh of local AWS's time."""
        key, value = self._tag
        backend = resolve(_EC2_BACKENDS)[ACCOUNT][REGION]
        # Copies first: moto's request threads add instances and tags meanwhile.
        tagged = {resource for resource, tags in list(backend.tags.items()) if tags.get(key) == value}
        return {
            instance.id: instance.state
            for reservation in list(backend.reservations.values())
            for instance in list(reservation.instances)
            if instance.id in tagged
        }

    # --- one instance

    def _boot(self, instance: SimulatedInstance) -> None:
        instance.runner_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.in_process:
            thread = _AgentThread(instance, self._in_process_settings(instance), self._shared_clients())
            with self._lock:
                instance.agent_thread, instance.phase = thread, Phase.BOOTED
            thread.start()
            return
        run_sh = instance.runner_dir / "run.sh"
        run_sh.write_text(_RUN_SH.format(python=sys.executable, program=runner_program.__file__))
        run_sh.chmod(0o755)
        tools = _instance_tools(instance)
        settings = {
            **self._agent_settings,
            "CHRONYC": str(tools / "chronyc"),
            "IMDS_ENDPOINT": self._metadata.endpoint(instance.instance_id),
            "RUNNER_DIR": str(instance.runner_dir),
            "STATE_FILE": str(instance.directory / "agent-state.json"),
        }
        environment = self._aws.child_environment(settings, ENV_PREFIX)
        environment["PATH"] = f"{tools}{os.pathsep}{environment.get('PATH', '')}"
        process = subprocess.Popen(  # noqa: S603 - this interpreter, running our agent
            self._agent_command(instance),
            cwd=instance.directory,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        with self._lock:
            instance.agent, instance.phase = process, Phase.BOOTED
        reader = threading.Thread(
            target=self._read_journal, args=(instance, process.stdout), name=f"journal-{instance.instance_id}"
        )
        reader.daemon = True
        reader.start()
        self._readers.append(reader)

    def _in_process_settings(self, instance: SimulatedInstance) -> AgentSettings:
        run_sh = instance.runner_dir / "run.sh"
        run_sh.write_text(_RUN_SH.format(python=sys.executable, program=runner_program.__file__))
        run_sh.chmod(0o755)
        values: dict[str, Any] = {name.lower(): value for name, value in self._agent_settings.items()}
        values |= {
            "runner_dir": instance.runner_dir,
            "state_file": instance.directory / "agent-state.json",
            "chronyc": _instance_tools(instance) / "chronyc",
        }
        return AgentSettings.model_validate(values)

    def _shared_clients(self) -> dict[str, Any]:
        with self._lock:
            if not self._clients:
                self._clients = {
                    service: self._aws.client(service) for service in ("dynamodb", "kms", "ec2", "logs")
                }
                # Every in-process agent holds one long poll open: a connection each, not botocore's 10.
                self._clients["sqs"] = self._aws.long_poll_client(
                    "sqs", AgentSettings.model_fields["notice_wait_seconds"].default, IN_PROCESS_CONNECTIONS
                )
                check_agent_calls(self._clients.values())
                _route_agent_log(self._timeline)
            return self._clients

    def _read_journal(self, instance: SimulatedInstance, stream: IO[str] | None) -> None:
        if stream is None:
            return
        with (instance.directory / "agent.log").open("a") as journal:
            for line in stream:
                journal.write(line)
                happening, fields = _noted(line)
                if happening is not None:
                    detail = str(fields.get("run_key", ""))
                    self._timeline.record(
                        happening, instance.instance_id, detail=detail, seconds=_waited(fields)
                    )

    def _end(self, instance: SimulatedInstance, reason: str | None) -> None:
        """The instance is gone (`reason`, for the timeline): give its agent the shutdown's grace, then
        kill what is left."""
        with self._lock:
            if instance.phase is Phase.ENDED:
                return
            was_running = instance.phase is Phase.BOOTED
            instance.phase = Phase.ENDED
        if was_running and instance.agent is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                instance.agent.wait(self.settings.shutdown_seconds)
        if was_running and instance.agent_thread is not None:
            instance.agent_thread.stop(self.settings.shutdown_seconds)
        self._kill(instance)
        if reason is not None:
            self._timeline.record(Happening.TERMINATED, instance.instance_id, detail=reason)

    def _halt(self, instance: SimulatedInstance) -> None:
        """EC2 stops the instance: an OS shutdown (SIGTERM, the shutdown's grace, then SIGKILL) that keeps
        the instance's directory for its next boot."""
        with self._lock:
            if instance.phase is not Phase.BOOTED:
                return
            instance.phase = Phase.STOPPED
        self._signal(instance, signal.SIGTERM)
        if instance.agent is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                instance.agent.wait(self.settings.shutdown_seconds)
        self._kill(instance)
        with self._lock:
            instance.agent, instance.agent_thread = None, None
        self._timeline.record(Happening.STOPPED, instance.instance_id)

    def _signal(self, instance: SimulatedInstance, signum: signal.Signals) -> None:
        if instance.agent_thread is not None and signum is signal.SIGTERM:
            instance.agent_thread.stopping.set()
        if instance.agent is not None and instance.agent.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(instance.agent.pid, signum)

    def _kill(self, instance: SimulatedInstance) -> None:
        """Kill the agent's process group and the runner's (the runner leads a session of its own)."""
        self._signal(instance, signal.SIGKILL)
        runner = instance.runner_pid()
        if runner is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(runner, signal.SIGKILL)
        if instance.agent is not None:
            instance.agent.wait()
        if instance.agent_thread is not None:
            instance.agent_thread.stop(self.settings.shutdown_seconds)


def _instance_tools(instance: SimulatedInstance) -> Path:
    """The instance's own programs, first on its PATH: the simulation's systemctl and chronyc."""
    tools = instance.directory / "bin"
    tools.mkdir(exist_ok=True)
    for name, script in (
        ("systemctl", _SYSTEMCTL.format(marker=instance.directory / POWERED_OFF)),
        ("chronyc", chronyc_script(asked=instance.directory / CHRONYC_ASKED)),
    ):
        (tools / name).write_text(script)
        (tools / name).chmod(0o755)
    return tools


def _noted(line: str) -> tuple[Happening | None, Mapping[str, Any]]:
    """The timeline's happening for one journal line, if it notes one, and the line's fields."""
    if not line.startswith("{"):
        return None, {}
    try:
        fields = json.loads(line)
    except ValueError:
        return None, {}
    return _AGENT_MESSAGES.get(str(fields.get("message"))), fields


class _AgentThread(threading.Thread):
    """Our agent in a thread of this process, as `python -m agent` would run it on the instance."""

    def __init__(
        self, instance: SimulatedInstance, settings: AgentSettings, clients: Mapping[str, Any]
    ) -> None:
        super().__init__(name=f"agent-{instance.instance_id}", daemon=True)
        self.stopping = threading.Event()
        identity = InstanceIdentity(instance.instance_id, REGION, ACCOUNT)
        self._instance_id = instance.instance_id
        self._launch_template = instance.launch_template
        self._agent = build_agent(
            settings,
            identity,
            dynamodb=clients["dynamodb"],
            kms=clients["kms"],
            ec2=clients["ec2"],
            sqs=clients.get("sqs"),
            logs=clients.get("logs"),
            log=EventLog(logging.getLogger(IN_PROCESS_LOGGER), {"instance_id": instance.instance_id}),
            poweroff=(instance.directory / POWERED_OFF).touch,
        )

    def run(self) -> None:
        with acting_as_instance(self._instance_id, self._launch_template):
            self._agent.run(self.stopping)

    def stop(self, timeout_seconds: float) -> None:
        self.stopping.set()
        self.join(timeout_seconds)


# --- the IAM check (emulator/iam_check.py): in-process agents' calls against the instance role ---------


def check_agent_calls(clients: Iterable[Any]) -> None:
    """The in-process agents' shared clients checked, each call as the instance whose agent makes it."""
    check = iam_check.installed_check()
    if check is not None:
        for client in clients:
            check.on_client(client)


IAM_TEMPLATE = "iam-template.json"
IAM_DENIALS = "iam-denials.jsonl"


def collect_agent_denials(scratch: Path) -> None:
    """What the agents' processes found denied, into the installed check."""
    check = iam_check.installed_check()
    if check is not None:
        check.remote_denials += collect_denials(sorted(scratch.glob(f"*/{IAM_DENIALS}")))


@contextlib.contextmanager
def acting_as_instance(instance_id: str, launch_template: str | None) -> Iterator[None]:
    check = iam_check.installed_check()
    if check is None:
        yield
        return
    with check.acting_as(check.iam.instance(instance_id, launch_template)):
        yield


class _TimelineHandler(logging.Handler):
    """Notes the in-process agents' lines the timeline cares about, as `_read_journal` does for processes."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self._timeline = timeline

    def emit(self, record: logging.LogRecord) -> None:
        happening = _AGENT_MESSAGES.get(record.getMessage())
        fields: Mapping[str, Any] = getattr(record, "fields", {})
        if happening is not None and "instance_id" in fields:
            self._timeline.record(
                happening,
                str(fields["instance_id"]),
                detail=str(fields.get("run_key", "")),
                seconds=_waited(fields),
            )


def _waited(fields: Mapping[str, Any]) -> float | None:
    waited = fields.get("config_waited_seconds")
    return None if waited is None else float(waited)


def _route_agent_log(timeline: Timeline) -> None:
    logger = logging.getLogger(IN_PROCESS_LOGGER)
    logger.handlers[:] = [_TimelineHandler(timeline)]
    logger.setLevel(logging.INFO)
    logger.propagate = False
