"""The emulator's parts on local AWS (moto's server): a fake GitHub, simulated instances running our agent.

The control plane's side is played here through the adapters the Lambdas use (state table, runner
credentials, the GitHub App client), so the instance side can be tested before and apart from the
state machines.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulator.aws import INSTANCE_ARNS, LocalAws, local_aws
from emulator.deployment import Timers
from emulator.fake_github import FakeGitHub, FakeJob, FakeWorkflowRun, JobSpec, JobStatus
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey, generate_app_key
from emulator.instances import instance_facts
from emulator.resources import create_state_table
from emulator.simulated_instances import InstanceSettings, SimulatedInstances
from emulator.timeline import Happening, Timeline
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.config import DEFAULT_RESOURCE_CLASSES, StackConfig
from runner_pool.domain.executions import runner_name
from runner_pool.domain.follow_up import FOLLOW_UP_WINDOW_SECONDS
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import Signal, WorkerSignal
from runner_pool.domain.runner_scope import RepositoryScope
from tests.support import waiting

TABLE = "runner-pool-e2e"
STACK_TAG = ("runner-pool:stack", "e2e")
MOTO_IMAGE_ID = "ami-12c6146b"
WAIT_SECONDS = 20.0
LABEL = "pool=${{ github.run_id }}/class=large"
REPOSITORY = f"{OWNER}/{REPO}"
LOST_RUNNER_SECONDS = 3.0
QUICK = InstanceSettings(boot_delay_seconds=0.1, heartbeat_period_seconds=0.5, watch_period_seconds=0.1)


LOOK_SECONDS = 0.05
"""How often `eventually` looks: a check of this process's own state costs nothing."""
SWEEP_LOOK_SECONDS = 0.25
"""How often a check that sweeps local AWS looks (every live record, every execution: several requests,
each served by local AWS in this same process, on the same cores as the system under test)."""


def eventually(
    check: Callable[[], Any],
    what: str,
    timeout: float = WAIT_SECONDS,
    every: float = LOOK_SECONDS,
    explain: Callable[[], str] | None = None,
) -> Any:
    """tests/support/waiting.py's, with an end-to-end test's time to wait and pace of looking."""
    return waiting.eventually(check, what, timeout, every, explain)


@pytest.fixture(scope="session")
def app_key() -> AppKey:
    return generate_app_key()


@dataclass
class Stage:
    """Local AWS, the fake GitHub and simulated instances, and the control plane's adapters over them."""

    aws: LocalAws
    github: FakeGitHub
    instances: SimulatedInstances
    timeline: Timeline
    table: StateTable
    credentials: RunnerCredentials
    app: GitHubApp

    def launch(self) -> str:
        """An instance launched with the stack's tag, recorded and admitted to the pool."""
        ec2 = self.aws.client("ec2")
        instance_id: str = ec2.run_instances(
            ImageId=MOTO_IMAGE_ID,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": STACK_TAG[0], "Value": STACK_TAG[1]}]}
            ],
        )["Instances"][0]["InstanceId"]
        assert self.table.create(instance_facts(instance_id=instance_id), run_key=None).succeeded
        assert self.table.admit(instance_id).succeeded
        return instance_id

    def start_run(self, *jobs: JobSpec) -> FakeWorkflowRun:
        return self.github.actions.start_run(REPOSITORY, "ci", jobs or [JobSpec("build", LABEL, seconds=0.3)])

    def hand_over(self, instance_id: str, run_key: str) -> str:
        """Claim the instance for `run_key` and hand it a JIT runner config, as a claim worker does."""
        token = uuid.uuid4().hex
        assert self.table.claim(instance_id, run_key, token).succeeded
        jit = self.app.jit_config(runner_name(instance_id, token), [run_key])
        self.credentials.store(instance_id, INSTANCE_ARNS.arn(instance_id), run_key, jit.encoded_jit_config)
        return token

    def await_signal(self, instance_id: str, signal: Signal, run_key: str | None) -> WorkerSignal:
        def confirmed() -> WorkerSignal | None:
            current = self.table.read_signal(instance_id)
            return current if current is not None and current.confirms(signal, run_key) else None

        found: WorkerSignal = eventually(confirmed, f"{signal.value} from {instance_id}")
        return found


@pytest.fixture
def stage(app_key: AppKey, tmp_path: Path) -> Iterator[Stage]:
    timeouts = StackConfig().timeouts
    with (
        local_aws() as aws,
        FakeGitHub(APP_ID, app_key.public_pem, lost_runner_seconds=LOST_RUNNER_SECONDS) as github,
    ):
        github.state.add_installation(INSTALLATION_ID, OWNER)
        dynamodb = aws.client("dynamodb")
        create_state_table(dynamodb, TABLE)
        key_id = aws.client("kms").create_key()["KeyMetadata"]["KeyId"]
        table = StateTable(TABLE, timeouts, SystemClock(), dynamodb, arns=INSTANCE_ARNS)
        credentials = RunnerCredentials(
            TABLE, timeouts, SystemClock(), key_id=key_id, dynamodb=dynamodb, kms=aws.client("kms")
        )
        app = GitHubApp(
            GitHubAppKey(APP_ID, app_key.private_pem, INSTALLATION_ID, base_url=github.url),
            RepositoryScope(owner=OWNER, repo=REPO),
            base_url=github.url,
        )
        timeline = Timeline()
        instances = SimulatedInstances(
            aws,
            table_name=TABLE,
            credentials_key_id=key_id,
            stack_tag=STACK_TAG,
            scratch=tmp_path,
            timeline=timeline,
            settings=QUICK,
            poll_seconds=0.05,
        )
        with instances:
            yield Stage(aws, github, instances, timeline, table, credentials, app)
        app.close()


# --- the whole system -------------------------------------------------------------------------------

FAST_INSTANCES = InstanceSettings(
    boot_delay_seconds=0.5, heartbeat_period_seconds=1.0, watch_period_seconds=5.0
)
"""The agents hear their claims and releases by notice (runner_pool.domain.notices); a 5 s watch makes a
hand-over whose notice went missing show as a slow scenario."""
LAMBDA_POLLER_TIMERS = Timers(refresh_every_seconds=2.0)
"""The dispatcher's event source as the template maps it (no batching window, Lambda's five pollers)."""
FAST_TIMERS = LAMBDA_POLLER_TIMERS
"""The e2e scenarios' timers: the dispatcher read by Lambda's five pollers, as deployed."""


@contextmanager
def e2e_world(tmp_path: Path, **settings: Any) -> Iterator[World]:
    """The whole system on local AWS as the scenarios run it, its waits compressed further than the demo's:
    the compressed config with `settings` over it (their `timeouts` over the scenarios' own), fast
    instances, the dispatcher read by Lambda's pollers."""
    timeouts = {**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8, **settings.pop("timeouts", {})}
    config = compressed_config(timeouts=timeouts, **settings)
    with world(
        tmp_path, config=config, instance_settings=FAST_INSTANCES, timers=FAST_TIMERS, lost_runner_seconds=4.0
    ) as running:
        yield running


SESSION_CLASSES = {
    name: {**resource_class.model_dump(), "ssm": name == "xlarge"}
    for name, resource_class in DEFAULT_RESOURCE_CLASSES.items()
}
"""The default classes, xlarge with Session Manager (`runner-pool connect`)."""


@pytest.fixture
def system(tmp_path: Path) -> Iterator[World]:
    """The whole system on local AWS, with its waits compressed further than the demo's; class xlarge lets
    Session Manager in (its instances run as the session role, their agents checked against it)."""
    with e2e_world(tmp_path, resource_classes=SESSION_CLASSES) as running:
        yield running


SYSTEM_WAIT_SECONDS = 60.0
"""How long a wait on the whole system's progress may take (a run's completion, a cold launch's job
starting, refresh ending an instance, the system settling): under make test's three workers on two
cores such a chain of executions, Lambdas, boots and timers takes several times what it takes alone.
The wait ends when its condition holds; it lasts this long only when the test fails anyway."""


def awaited(
    system: World,
    check: Callable[[], Any],
    what: str,
    timeout: float = SYSTEM_WAIT_SECONDS,
    every: float = LOOK_SECONDS,
) -> Any:
    """`eventually`, for the whole system's progress: a timeout says what the system was doing
    (`diagnosis`)."""
    return eventually(check, what, timeout, every, explain=lambda: diagnosis(system))


def completed(system: World, run: FakeWorkflowRun, timeout: float = SYSTEM_WAIT_SECONDS) -> FakeWorkflowRun:
    awaited(system, lambda: run.status is JobStatus.COMPLETED, f"run {run.run_id} to complete", timeout)
    return run


def settled(system: World, timeout: float = SYSTEM_WAIT_SECONDS) -> None:
    """Every live instance idle and in date, and no execution running."""

    def quiet() -> bool:
        records = system.records.live()
        now = time.time()
        return all(
            r.state is InstanceState.IDLE and not r.threshold_passed(now) for r in records
        ) and not any(e["status"] == "RUNNING" for e in system.stack.executions())

    awaited(system, quiet, "the system to settle", timeout, every=SWEEP_LOOK_SECONDS)


def one_pooled(system: World) -> str:
    """A first run served and its instance back in the pool, idle and in date: that instance's id."""
    completed(system, system.start_run("build", JobSpec("build", LABEL, seconds=0.5)))
    settled(system)
    (pooled,) = system.instances.booted()
    return pooled


def retired(system: World, instance_id: str, what: str) -> None:
    """`instance_id` terminated, the system settled after it, and every instance accounted for."""
    awaited(system, lambda: system.timeline.first(Happening.TERMINATED, instance_id=instance_id), what)
    settled(system)
    accounted(system)


def demand_handled(system: World) -> None:
    """Wait until the demand queue holds no message, visible or in flight: whatever was queued has been
    dispatched, and any execution it started has started (the dispatcher deletes a message after it)."""
    sqs = system.aws.client("sqs")
    queue = system.stack.plane.settings.require("demand_queue_url", "the demand queue")

    def handled() -> bool:
        counts = sqs.get_queue_attributes(
            QueueUrl=queue,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return all(value == "0" for value in counts.values())

    awaited(system, handled, "the demand queue to be handled")


def accounted(system: World) -> None:
    """The accounting check holds; if not, the failure shows each instance's timeline, so that a rare
    failure under load says what happened to the instance (a record left idle on a terminated one was
    seen once, 2026-11-26, and not reproduced)."""
    accounting = system.accounting()
    if accounting.holds:
        notices_accounted(system)
        return
    stories = []
    for instance_id in sorted({i for p in accounting.problems for i in re.findall(r"i-[0-9a-f]+", p)}):
        events = "\n".join(
            f"  {e.at:.3f} {e.happening.value} {e.detail}".rstrip() for e in system.timeline.of(instance_id)
        )
        stories.append(f"{instance_id}:\n{events}")
    pytest.fail("\n".join([*accounting.problems, *stories]))


def notices_accounted(system: World) -> None:
    """Every live instance has its notice queue and no other instance has one left, once refresh has run
    (it deletes ended instances' queues and opens missing ones: runner_pool.domain.notices)."""
    queues = system.stack.plane.notices
    assert queues is not None, "the local stack gives the notice queue prefix"

    def in_step() -> bool:
        live = {record.instance_id for record in system.records.live()}
        return set(queues.instance_ids()) == live

    awaited(system, in_step, "the notice queues to match the live instances", every=SWEEP_LOOK_SECONDS)


def job_of(system: World, run: FakeWorkflowRun, index: int = 0) -> FakeJob:
    return system.github.state.jobs[run.job_ids[index]]


def provisions_bound(span: float) -> int:
    """The most provisions the dispatcher may start for one run (of at most PROVISION_LIMIT jobs) whose
    `queued` deliveries came over `span` seconds: two (its first job's, one follow-up) when they came
    within one follow-up window of each other, as a matrix's do on GitHub; on two cores busy with the rest
    of make test the webhook may answer them seconds apart, and each quiet window then closes a follow-up
    (domain/follow_up.py): never one provision a job."""
    return 2 if span <= FOLLOW_UP_WINDOW_SECONDS else 2 + math.ceil(span / FOLLOW_UP_WINDOW_SECONDS)


DIAGNOSIS_EVENTS = 30
"""How many of the timeline's last events a diagnosis shows."""
DIAGNOSIS_EXECUTIONS = 20
"""How many executions a diagnosis details (the newest of those that did not succeed or met a failure)."""
DIAGNOSIS_CAUSE_CHARS = 400
"""How much of a failure's cause a diagnosis shows (a Lambda's cause carries its stack trace)."""
DIAGNOSIS_STUCK_SECONDS = 20.0
"""An invocation running longer than this has its environment's stacks shown (a step's work takes seconds)."""
_ENDED_BADLY = ("Failed", "TimedOut", "Aborted")


def diagnosis(system: World) -> str:
    """What a person needs when a whole-system wait times out: the executions (counted by machine and
    status; each one that did not succeed or met a failure, with the state it is in and each failure's
    error and cause), the GitHub jobs' statuses, the live records' states, the busiest AWS operations and
    Lambda functions, and the timeline's last events. Computed only when a wait fails (a request to local
    AWS for each execution)."""
    now = time.time()
    executions = sorted(system.stack.executions(), key=lambda e: e["startDate"])
    statuses = Counter(f"{e['machine']} {e['status']}" for e in executions)
    lines = [f"executions: {', '.join(f'{n} {name}' for name, n in sorted(statuses.items())) or 'none'}"]
    stories = [story for e in executions if (story := _execution_story(system, e, now))]
    lines += [f"  {line}" for story in stories[-DIAGNOSIS_EXECUTIONS:] for line in story]
    with system.github.state.lock:
        jobs = list(system.github.state.jobs.values())
    lines.append("github jobs:")
    lines += [
        f"  {j.job_id} {j.run_id}/{j.name} attempt {j.run_attempt}: {j.status.value}"
        f" {j.conclusion.value if j.conclusion else ''} runner={j.runner_name}"
        + (f" failed because {j.failed_because}" if j.failed_because else "")
        for j in jobs
    ]
    lines.append("live records:")
    lines += [
        f"  {r.instance_id} {r.state.value} run_key={r.run_key}"
        f" threshold={'none' if r.threshold is None else f'{r.threshold - now:+.1f} s'}"
        for r in system.records.live()
    ]
    calls = system.stack.calls
    busiest = ", ".join(f"{name} {n}" for name, n in calls.calls.most_common(8))
    lines.append(f"aws calls: {calls.total()} ({busiest})")
    lines.append(f"lambda invocations: {system.stack.invocations()}")
    if (runtime := system.stack.lambda_runtime) is not None:
        lines.append("lambda invocations running:")
        lines += [f"  {running}" for running in runtime.in_flight()]
        for name, dump in runtime.stacks(older_than=DIAGNOSIS_STUCK_SECONDS).items():
            lines.append(f"  {name}, stuck; its log's tail with every thread's stack:")
            lines += [f"    {line}" for line in dump]
    lines.append(f"last {DIAGNOSIS_EVENTS} timeline events:")
    lines += [
        f"  {e.at - now:+.2f} s {e.happening.value} {e.instance_id or ''} {e.job or ''} {e.detail}".rstrip()
        for e in system.events()[-DIAGNOSIS_EVENTS:]
    ]
    return "\n".join(lines)


def _execution_story(system: World, execution: dict[str, Any], now: float) -> list[str]:
    """One execution, when it did not succeed or met a failure on its way (a task retried, an error caught):
    its machine, name, status and age, the state it is in while it runs, and each distinct failure its
    history records, the first (the cause) before those it led to. Nothing for a clean success."""
    history = system.stack.history(execution["executionArn"])
    failures: dict[tuple[str, str, str], None] = {}
    for event in history:
        if event["type"].endswith(_ENDED_BADLY):
            details: dict[str, Any] = next((v for k, v in event.items() if k.endswith("EventDetails")), {})
            cause = str(details.get("cause", ""))[:DIAGNOSIS_CAUSE_CHARS]
            failures[(event["type"], str(details.get("error", "")), cause)] = None
    if execution["status"] == "SUCCEEDED" and not failures:
        return []
    started = execution["startDate"].timestamp()
    head = (
        f"{execution['machine']} {execution['name']} {execution['status']} (started {started - now:+.1f} s)"
    )
    entered = [e for e in history if e["type"].endswith("StateEntered")]
    if execution["status"] == "RUNNING" and entered:
        head += f", in {entered[-1]['stateEnteredEventDetails']['name']}"
    return [head, *(f"    {kind} {error} {cause}".rstrip() for kind, error, cause in failures)]
