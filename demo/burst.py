"""A burst of demand against GitHub's secondary rate limit: the world it runs in, and what it measured.

GitHub's limit is 900 points a minute per REST endpoint, 5 a POST: 180 JIT registrations a minute,
3 a second (docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api, "About secondary
rate limits"; emulator/fake_github/rate_limits.py). The emulator compresses time (heartbeats every
second, the refresh's minute in 5 s), and the fake's limit is compressed with it: GitHub's very
limit, 900 points, in a window of 20 s instead of 60, the same shape (points per endpoint in a
sliding window, 5 a POST, 403 with `retry-after`). That bounds 300 jobs below at 33 s. Another client
of the same App keeps its window spent until the burst's first registration is refused, so GitHub's
refusals are met whatever pace this machine reaches (under load it registers below the limit). The
stack's budget is set above the compressed limit (650 a minute against 540, 20 at once), so both the
budget's pacing and GitHub's refusals with `retry-after` are met on the way. Agents run in this
process with slow periods: the subject is the control plane's pacing, not hundreds of agents'
polling. `make bench` and tests/e2e share this.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from emulator.background import in_background
from emulator.deployment import Timers
from emulator.fake_github import Conclusion, FakeJob, FakeWorkflowRun, JobSpec, JobStatus
from emulator.fake_github.rate_limits import POINTS_PER_MINUTE, RateLimits
from emulator.simulated_instances import InstanceSettings
from emulator.stack import RuntimeFactory
from emulator.timeline import Happening, TimelineEvent
from emulator.world import COMPRESSED_TIMEOUTS, REPOSITORY, World, apps_settings, compressed_config, world
from runner_pool.domain.executions import FollowUpRequest, ProvisionRequest, instance_of_runner
from runner_pool.domain.run_keys import RunKey

JIT_ROUTE = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"
LABEL = "pool=${{ github.run_id }}/class=large"
GITHUB_POINTS_PER_WINDOW = POINTS_PER_MINUTE
GITHUB_WINDOW_SECONDS = 20.0
"""The fake's limit: GitHub's 900 points (180 registrations) in GitHub's minute compressed to 20 s."""
REGISTRATIONS_PER_MINUTE = 650
"""The budget, on purpose 20 % above the fake's 540 a minute, so GitHub's own refusals are met as well."""
REGISTRATION_BURST = 20
JOB_SECONDS = 0.5
RECORD_WATCH_SECONDS = 5.0
"""The timeline's look at every live record, slower than a small world's: each look reads hundreds of
records. In the 300-job burst, DynamoDB's Query held the GIL in 17.6 % of the samples (py-spy --gil),
and in a 100-job burst two thirds of local DynamoDB's Query time were these looks, every 2 s
then. Nothing of a burst reads the timeline's record states."""
POLL_SECONDS = 0.5
LOST_RUNNER_SECONDS = 30.0
"""How long the fake waits for a silent runner before it fails its job: GitHub waits minutes ("The
self-hosted runner: ... lost communication with the server", actions/runner#2040), a small world 6 s
(emulator/world.py). At a 1,000-job burst the machine's load reaches 9 on 2 cores and a runner process,
or the fake's answer to it, can stall past 6 s: 3 jobs of 1,000 failed so, each on a runner of ours
whose instance lived on (`failed_because`). The burst's subject is the control plane's
pacing, as with the agents' slow periods above; 30 s is still far below GitHub's minutes."""
FAILED = ("FAILED", "TIMED_OUT", "ABORTED")
"""The statuses of an execution that did not succeed (ListExecutions' `status`), RUNNING aside."""
CAUSE_CHARACTERS = 140
"""A cause's length at most in the table: the error and the first line of its message."""
_ENDINGS = {
    "ExecutionFailed": "executionFailedEventDetails",
    "ExecutionTimedOut": "executionTimedOutEventDetails",
    "ExecutionAborted": "executionAbortedEventDetails",
}
"""An execution's last event when it did not succeed, and the field of its error and cause."""
INSTANCE_END_SECONDS = 15.0
"""How long after a job ended its instance's end still goes with it: a terminated instance's runner
disconnects, which fails its job at once, and the timeline records the termination after the agent's
shutdown grace (5 s, emulator/simulated_instances.py); the rest is margin for a loaded machine."""
_VOLATILE = (
    (re.compile(r"\bi-[0-9a-f]{8,17}\b"), "i-…"),
    (re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b|\b[0-9a-f]{12,}\b"), "…"),
    (re.compile(r"#\d+"), "#…"),
    (re.compile(r"RequestId: \S+"), "RequestId: …"),
)
"""What differs between two failures of one kind (instance ids, request ids, moto's event numbers), masked
so they count together. Lambda's timeout names its request ("RequestId: <id> Error: Task timed out after
30.00 seconds"), a UUID on AWS and `local-<n>` in the emulator (emulator/lambda_runtime.py)."""


@contextmanager
def rate_limited_world(
    scratch: Path,
    runtime: RuntimeFactory | None = None,
    apps: int = 1,
    points_per_window: int = GITHUB_POINTS_PER_WINDOW,
) -> Iterator[World]:
    """`apps`: how many GitHub Apps the stack registers through, each with its own limit on the fake;
    `points_per_window`: that limit, GitHub's 900 points unless a benchmark needs it lower."""
    # At one repository: the burst's figures (bench/results.json) are of registrations at the repository,
    # GitHub's limit counted on that one endpoint (JIT_ROUTE), per App.
    github = (
        apps_settings(apps, REPOSITORY)
        if apps > 1
        else {**compressed_config().github.model_dump(mode="json", exclude_none=True), "scope": REPOSITORY}
    )
    config = compressed_config(
        timeouts={
            **COMPRESSED_TIMEOUTS,
            "healthy_window_seconds": 30,
            "claim_registration_seconds": 20,
            "fleet_validation_seconds": 120,
            "created_threshold_seconds": 300,
            "claimed_threshold_seconds": 170,
        },
        github={
            **github,
            "registrations_per_minute": REGISTRATIONS_PER_MINUTE,
            "registration_burst": REGISTRATION_BURST,
        },
    )
    instances = InstanceSettings(
        boot_delay_seconds=0.5, heartbeat_period_seconds=10.0, watch_period_seconds=10.0, in_process=True
    )
    timers = Timers(refresh_every_seconds=5.0)
    with world(
        scratch,
        config=config,
        instance_settings=instances,
        timers=timers,
        record_watch_seconds=RECORD_WATCH_SECONDS,
        lost_runner_seconds=LOST_RUNNER_SECONDS,
        runtime=runtime,
    ) as running:
        limits = running.github.limits
        limits.enabled = True
        limits.points_per_window = points_per_window
        limits.window_seconds = GITHUB_WINDOW_SECONDS
        yield running


@dataclass(frozen=True)
class Burst:
    jobs: int
    served: int
    """Jobs that ran to success on a runner of ours."""
    seconds: float
    """From queuing the burst to its last job done."""
    jit_calls: int
    """Registrations asked of GitHub, refused ones included."""
    refused: int
    """Of those, refused with a rate limit."""
    failed_executions: int
    runs: int = 0
    still_running: Counter[str] = field(default_factory=Counter)
    """Executions still running when the burst ended, by machine: how they end is not counted (a release
    runs on after its run's last job, so some of the release machine's always are)."""
    dispatched: tuple[int, ...] = ()
    """Provision executions the dispatcher started for each run (its first job's, its follow-ups')."""
    follow_ups: tuple[int, ...] = ()
    """For each run, the follow-ups handed to the follow-up state machine: of its provisions, those the
    machine started; the others the dispatcher started itself (its first job's, demand started apart)."""
    redriven: int = 0
    """Provisions asked for again by one that ended short (a redrive), not by the dispatcher."""
    reconciled: int = 0
    """Provisions refresh started for jobs still queued (its reconciliation), not by the dispatcher."""
    throttled: int = 0
    """Deliveries API Gateway's stage throttle answered 429 (the webhook never ran)."""
    failed_deliveries: tuple[int, ...] = ()
    """The status GitHub recorded for each failed delivery (any answer but 2xx; 0: no answer within
    its 10 s, or no connection), the throttled ones' 429 included."""
    queued_spans: tuple[float, ...] = ()
    """For each run, seconds from its first `workflow_job queued` delivery to its last: a follow-up
    gathers what comes within its window (domain/follow_up.py), so this is what the batching had to span."""
    failure_causes: Counter[str] = field(default_factory=Counter)
    """Why the failed executions failed, by machine, state and error (`failure_cause`)."""
    unserved: Counter[str] = field(default_factory=Counter)
    """The jobs not served, by what became of them (`unserved_outcome`)."""

    @property
    def jit_calls_per_job(self) -> float:
        return self.jit_calls / max(1, self.jobs)

    @property
    def served_ratio(self) -> float:
        return self.served / max(1, self.jobs)

    @property
    def executions_per_run(self) -> int:
        """The most provisions the dispatcher started for one run (the worst run's)."""
        return max(self.dispatched, default=0)


def serve_burst(system: World, jobs: int, runs: int = 10, timeout: float = 1800.0) -> Burst:
    """Queue `jobs` jobs at once in `runs` runs of a matrix; wait until every run has completed."""
    calls_before = system.github.state.calls[JIT_ROUTE]
    refused_before = system.github.limits.refused[JIT_ROUTE]
    throttled_before = system.stack.webhook.throttled
    deliveries_before = set(system.github.state.deliveries)
    began = time.monotonic()
    with _window_spent_until_refused(system.github.limits, refused_before, system.github.state.app_ids):
        started = _serve(system, jobs, runs, began + timeout)
    seconds = time.monotonic() - began

    queued = [system.github.state.jobs[j] for run in started for j in run.job_ids]
    served = sum(1 for j in queued if _served(j))
    executions = system.stack.executions()
    failed = [e for e in executions if e["status"] in FAILED]
    provisions = _provisions(system)
    run_keys = {_run_key_of(run): run for run in started}
    dispatched = Counter(
        p.run_key for p in provisions if p.redrives == 0 and p.origin is None and p.run_key in run_keys
    )
    follow_ups = Counter(request.run_key for request in _follow_ups(system))
    with system.github.state.lock:
        deliveries = [d for n, d in system.github.state.deliveries.items() if n not in deliveries_before]
    spans = queued_spans(system)
    return Burst(
        jobs=len(queued),
        served=served,
        seconds=seconds,
        jit_calls=system.github.state.calls[JIT_ROUTE] - calls_before,
        refused=system.github.limits.refused[JIT_ROUTE] - refused_before,
        failed_executions=len(failed),
        runs=len(started),
        still_running=Counter(e["machine"] for e in executions if e["status"] == "RUNNING"),
        dispatched=tuple(dispatched[key] for key in run_keys),
        follow_ups=tuple(follow_ups[key] for key in run_keys),
        redriven=sum(1 for p in provisions if p.redrives > 0),
        reconciled=sum(1 for p in provisions if p.redrives == 0 and p.origin is not None),
        throttled=system.stack.webhook.throttled - throttled_before,
        failed_deliveries=tuple(d.status_code for d in deliveries if not d.succeeded),
        queued_spans=tuple(spans.get(run.run_id, 0.0) for run in started),
        failure_causes=Counter(
            f"{e['machine']} {failure_cause(system.stack.history(e['executionArn']))}" for e in failed
        ),
        unserved=_unserved(system, queued),
    )


def failure_cause(events: Sequence[Mapping[str, Any]]) -> str:
    """Why an execution did not succeed, from its history: `State: Error: message`.

    The events are GetExecutionHistory's, in order, each a HistoryEvent as the Step Functions API
    reference gives it (docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html):
    `type`, then one details field by type; `stateEnteredEventDetails` and `stateExitedEventDetails`
    (`name`, `input` / `output`, JSON text), `executionFailedEventDetails`,
    `executionTimedOutEventDetails` and `executionAbortedEventDetails` (`error`, `cause`). Our machines
    catch every error with `"ResultPath": "$.error"`, so the state whose error a Catch took exits with
    `{"Error", "Cause"}` at `error` in its output (moto 5.2 records that exit, the Map state's too, and
    gives the Map the error of the iteration that failed). The first such exit is the cause. With none,
    the execution's own ending is: the state it was in and the ending's error (a timeout, a stop, an
    error nothing caught). An error caught and then another one uncaught (Dump itself failing) gives
    both.
    """
    caught: str | None = None
    state, through_fail_state = "?", False
    for event in events:
        if entered := event.get("stateEnteredEventDetails"):
            state, through_fail_state = entered["name"], event["type"] == "FailStateEntered"
        exited = event.get("stateExitedEventDetails")
        if caught is None and exited and (error := _caught_error(exited.get("output"))):
            caught = f"{exited['name']}: {short_error(error.get('Error'), error.get('Cause'))}"
        if event["type"] in _ENDINGS:
            details = event.get(_ENDINGS[event["type"]]) or {}
            error_name = details.get("error") or event["type"].removeprefix("Execution")
            ended = f"{state}: {short_error(error_name, details.get('cause'))}"
            if caught is None:
                return ended
            return caught if through_fail_state else f"{caught}; then {ended}"
    return caught or "no ending in its history"


def short_error(error: str | None, cause: str | None) -> str:
    """`Error: message`, the message being the first line of a Lambda error's `errorMessage` (Lambda's
    Cause is the JSON of errorType and errorMessage) or of the Cause itself; ids masked, so that failures
    of one kind count as one, and cut at CAUSE_CHARACTERS."""
    message = (cause or "").strip()
    try:
        reported = json.loads(message)
    except ValueError:
        reported = None
    if isinstance(reported, dict) and "errorMessage" in reported:
        message = str(reported["errorMessage"]).strip()
        error = error or reported.get("errorType")
    first_line = message.splitlines()[0] if message else ""
    for pattern, mask in _VOLATILE:
        first_line = pattern.sub(mask, first_line)
    text = f"{error or 'an error'}: {first_line}" if first_line else error or "an error without a name"
    return text if len(text) <= CAUSE_CHARACTERS else text[: CAUSE_CHARACTERS - 1] + "…"


def unserved_outcome(job: FakeJob, instance_events: Sequence[TimelineEvent] = ()) -> str:
    """What became of a job not served: its status, its conclusion if it has one (and why it failed, as
    the fake noted it), and whose runner took it (ours, by the name we give runners; another; none, or
    none yet while it is offered to one). For a runner of ours, what the timeline saw of its instance
    (`instance_events`) while the job was on it: the record's last state seen, and whether the instance
    ended with the job."""
    ending = job.status.value if job.conclusion is None else f"{job.status.value}, {job.conclusion.value}"
    if job.failed_because:
        ending += f" ({job.failed_because})"
    if instance_of_runner(job.runner_name):
        runner = f"on a runner of ours{_instance_while_on_it(job, instance_events)}"
    elif job.runner_name:
        runner = "on a runner not ours"
    elif job.assigned_runner_id is not None:
        runner = "offered to a runner, not taken"
    else:
        runner = "no runner"
    return f"{ending}, {runner}"


def _unserved(system: World, queued: list[FakeJob]) -> Counter[str]:
    unserved = [job for job in queued if not _served(job)]
    by_instance: dict[str, list[TimelineEvent]] = {}
    for event in system.timeline.events() if unserved else ():
        if event.instance_id is not None:
            by_instance.setdefault(event.instance_id, []).append(event)
    return Counter(
        unserved_outcome(job, by_instance.get(instance_of_runner(job.runner_name) or "", ()))
        for job in unserved
    )


def _instance_while_on_it(job: FakeJob, events: Sequence[TimelineEvent]) -> str:
    started = job.started_at or 0.0
    until = float("inf") if job.completed_at is None else job.completed_at
    states = [e.detail for e in events if e.happening is Happening.STATE and e.at <= until]
    ended = next(
        (
            e
            for e in events
            if e.happening in (Happening.TERMINATED, Happening.CRASHED)
            and started <= e.at <= until + INSTANCE_END_SECONDS
        ),
        None,
    )
    seen = f"; its record last seen {states[-1]}" if states else "; its record never seen"
    return seen + (f"; its instance {ended.happening.value} with the job" if ended else "")


def _served(job: FakeJob) -> bool:
    return job.conclusion is Conclusion.SUCCESS and instance_of_runner(job.runner_name) is not None


def _caught_error(output: str | None) -> dict[str, Any] | None:
    """The error a Catch put at `$.error` of a state's output, if it did."""
    try:
        document = json.loads(output or "null")
    except ValueError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    return error if isinstance(error, dict) and "Error" in error else None


def queued_spans(system: World) -> dict[int, float]:
    """Per run, seconds from its first `workflow_job queued` delivery to its last, as GitHub recorded them
    (the first attempt of each; a redelivery is not the order GitHub first sent them in)."""
    answered: dict[int, list[float]] = {}
    with system.github.state.lock:
        deliveries = list(system.github.state.deliveries.values())
    for delivery in deliveries:
        if delivery.event == "workflow_job" and delivery.action == "queued" and not delivery.redelivery:
            run_id = json.loads(delivery.payload)["workflow_job"]["run_id"]
            answered.setdefault(run_id, []).append(delivery.delivered_at)
    return {run_id: max(times) - min(times) for run_id, times in answered.items()}


Request = TypeVar("Request", bound=BaseModel)


def _provisions(system: World) -> list[ProvisionRequest]:
    """Every provision execution's request, as the dispatcher, a redrive or refresh started it."""
    return _inputs(system, "provision", ProvisionRequest)


def _follow_ups(system: World) -> list[FollowUpRequest]:
    """Every follow-up the dispatcher handed to the follow-up state machine."""
    return _inputs(system, "follow_up", FollowUpRequest)


def _inputs(system: World, machine: str, model: type[Request]) -> list[Request]:
    """The input of every execution of one of the stack's state machines, read as `model`."""
    return [
        model.model_validate_json(
            system.stack.stepfunctions.describe_execution(executionArn=e["executionArn"])["input"]
        )
        for e in system.stack.executions()
        if e["machine"] == machine
    ]


def _run_key_of(run: FakeWorkflowRun) -> str:
    """The run key of a burst run's jobs, as the webhook reads it from their labels."""
    return str(RunKey.of_job(JobSpec("shard", LABEL).labels(run.run_id), run.run_attempt))


def _serve(system: World, jobs: int, runs: int, deadline: float) -> list[FakeWorkflowRun]:
    started = [
        system.start_run(f"burst-{n}", JobSpec("shard", LABEL, matrix=jobs // runs, seconds=JOB_SECONDS))
        for n in range(runs)
    ]
    while any(run.status is not JobStatus.COMPLETED for run in started) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return started


@contextmanager
def _window_spent_until_refused(
    limits: RateLimits, refused_before: int, app_ids: Sequence[int]
) -> Iterator[None]:
    """Another client of the App keeps its window spent until the burst's first registration is refused
    (GitHub counts an App's requests together): the burst meets GitHub's refusal and its `retry-after`
    whatever pace this machine reaches, and however long its first registration takes to come."""

    def spend(stop: threading.Event) -> None:
        while limits.refused[JIT_ROUTE] == refused_before:
            for app_id in app_ids:  # every App's: each has a window of its own
                limits.spend(JIT_ROUTE, limits.points_per_window, limits.clock.now(), app_id=app_id)
            if stop.wait(limits.window_seconds / 2):
                return

    with in_background(spend, name="another-client-of-the-app"):
        yield
