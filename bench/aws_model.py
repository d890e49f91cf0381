"""What the control plane's critical path would take on AWS: its measured calls times published latencies.

The emulator's timings are moto's on a loaded shared machine, so they say little about AWS. This module
takes what an emulator run did on each job's critical path (queued webhook -> runner config stored for
the agent, the segment `emulator_*_control_plane_median_seconds` measures) and prices every call, state
transition and configured wait on it at AWS's and GitHub's published latencies (`LATENCIES`, each with
its source). The path is read from the run itself, not from the design:

- every AWS call a function made, with its time and thread, and where each invocation ended
  (`CallLog`: the IAM check sees every call a function makes, and the Lambda meter sees every
  invocation end, both in the thread that invoked the function);
- the provision execution's history, walked back from the task that handed the job's instance its
  runner config: every state entered on that branch, each Lambda task on it, each Wait's seconds.

Calls off the path are left out: a webhook's bookkeeping after its demand message is sent, a claim
step's in-line registration checks after the config is stored, the Map's sibling workers. A long poll
that came back empty waited its WaitTimeSeconds, here as on AWS, so it is priced as that wait.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bench.results import BenchTable
from demo.figures import JobFigures, Kind
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.follow_up import FOLLOW_UP_WINDOW_SECONDS


class Hop(StrEnum):
    """One kind of thing on the path, with one latency."""

    API_GATEWAY = "API Gateway"
    LAMBDA_INVOKE = "Lambda invoke"
    DYNAMODB = "DynamoDB"
    SQS = "SQS"
    KMS = "KMS"
    SECRETS_MANAGER = "Secrets Manager"
    START_EXECUTION = "StartExecution"
    STATE_TRANSITION = "state transition"
    EC2_CREATE_FLEET = "EC2 CreateFleet"
    EC2 = "EC2"
    GITHUB_JIT = "GitHub JIT"
    GITHUB_AUTH = "GitHub installation token"
    GITHUB_READ = "GitHub read"
    GITHUB_ASSIGNMENT = "GitHub assignment"
    """GitHub giving a queued job to a runner listening on its open long poll, server side."""
    GITHUB_RUNNER_CALL = "runner call to GitHub"
    """One of the runner's own round trips to GitHub's broker or run service."""
    WAIT = "configured wait"
    """Counted in seconds: a batching window, a Wait state, an empty long poll."""


LATENCIES: Mapping[Hop, float] = {
    # "API Gateway itself typically adds only 10-30 milliseconds of overhead for REST APIs"
    # (smplogs.com, API Gateway "High API Response Latency" pattern); a user's measurement, each
    # layer (CloudFront, API Gateway) "adds 30ms" (forum.serverless.com/t/lambda-call-latency/3891).
    # The upper end.
    Hop.API_GATEWAY: 0.030,
    # A warm invoke: the same measurement, a direct Lambda call about 30 ms more than the function's
    # own run time (forum.serverless.com/t/lambda-call-latency/3891). The deployment keeps a warm
    # environment per function (as the emulator does, emulator/deployment.py), so no cold start.
    Hop.LAMBDA_INVOKE: 0.030,
    # "For most atomic operations, such as GetItem and PutItem, you can expect an average latency in
    # single-digit milliseconds" (AWS Knowledge Center, "Why is my DynamoDB request latency high?",
    # repost.aws/knowledge-center/dynamodb-high-latency). Our Queries and BatchGets read a handful of
    # items. 10 ms: the top of single digits plus the in-region round trip.
    Hop.DYNAMODB: 0.010,
    # Standard queues: "low latency (< 10 ms on publish and receive)" (AWS certification course
    # notes, massipssa.github.io/Docs, "Simple Queue Service"); no AWS page we found states a figure.
    Hop.SQS: 0.010,
    # KMS Encrypt of a 4 KB config: "generally low, often under 10 milliseconds" (a summary of KMS
    # request quotas and latency, askai.glarity.app). No AWS-published figure found: 15 ms, an assumption
    # above it.
    Hop.KMS: 0.015,
    # Only on a fresh execution environment (the App's private key is read once per environment).
    # No published figure found: priced like KMS, an assumption.
    Hop.SECRETS_MANAGER: 0.015,
    # No AWS-published latency found for StartExecution or for a Standard workflow's transitions
    # (searched the Step Functions guide, the Compute blog, community benchmarks). Issue 15 estimates
    # 150-300 ms on AWS Standard from StartExecution to the claim Lambda running, a stretch of one
    # StartExecution, three transitions and two Lambda invokes: 50 ms + 3 x 30 ms + 2 x 30 ms = 200 ms.
    Hop.START_EXECUTION: 0.050,
    Hop.STATE_TRANSITION: 0.030,
    # "instant - The EC2 Fleet places a synchronous one-time request for your desired capacity"
    # (EC2 API Reference, CreateFleet): it answers once the instances are launched. EC2 publishes no
    # latency; measured, "the RunInstances call 1.5 s" (Colin Percival, "EC2 boot time benchmarking",
    # daemonology.net, 2021-08-12), and about 5 s for the API (github.com/brevdev/ec2-coldboot-research);
    # the same sources as emulator/boot_model.py LAUNCH. The faster one; cold path only.
    Hop.EC2_CREATE_FLEET: 1.5,
    # Other EC2 calls (describe, tag): an assumption, as above.
    Hop.EC2: 0.100,
    # GitHub publishes no API latency. Measured on its REST API: median 206 ms, middle 80 % 114-527 ms
    # over 10,000 requests (Mike Bostock, "Gist API Latency", gist.github.com/mbostock/5503544, reads).
    # A JIT registration creates a runner: 300 ms, "a few hundred ms".
    Hop.GITHUB_JIT: 0.300,
    # An installation token request, once per execution environment and hour: like a read, above.
    Hop.GITHUB_AUTH: 0.200,
    # A read (a follow-up's list of its run's jobs, one page): the same measurement's median.
    Hop.GITHUB_READ: 0.206,
    # GitHub Support's server-side dispatch trace of one check run, assigned three times to a runner
    # scale set: "Server-side assignment | Latency ... 08:57:14Z | ~50ms", each correlating with a
    # message the listener received (actions/actions-runner-controller #4602, the reporter's closing
    # comment of 2026-09-01).
    Hop.GITHUB_ASSIGNMENT: 0.050,
    # The runner's calls once its long poll (BrokerMessageListener.GetNextMessageAsync) answers: the
    # answer itself, POST `acknowledge` to the broker, POST `acquirejob` to the run service, and the
    # first job renewal, which the listener awaits before it starts the worker ("not even start worker
    # if the first renew fail"); actions/runner, src/Runner.Listener/Runner.cs (the broker flow),
    # BrokerHttpClient.cs, RunServiceHttpClient.cs, JobDispatcher.cs. GitHub publishes no latency for
    # those services: each at the REST API's measured median round trip, as a read above.
    Hop.GITHUB_RUNNER_CALL: 0.206,
    Hop.WAIT: 1.0,
}

EMPTY_POLL_SHARE = 0.9
"""A long poll whose next call came this share of its WaitTimeSeconds later or more came back empty."""


@dataclass(frozen=True)
class Step:
    """`count` of `hop` on the path, in `segment` (for WAIT, `count` is seconds)."""

    segment: str
    hop: Hop
    count: float


@dataclass(frozen=True)
class Row:
    segment: str
    hop: Hop
    count: float
    latency: float

    @property
    def seconds(self) -> float:
        return self.count * self.latency

    def describe(self) -> str:
        if self.hop is Hop.WAIT:
            return f"{self.count:g} s waited = {self.seconds:.3f} s"
        return f"{self.count:g} x {self.latency * 1000:g} ms = {self.seconds:.3f} s"


@dataclass(frozen=True)
class Modelled:
    rows: tuple[Row, ...]

    @property
    def seconds(self) -> float:
        return sum(row.seconds for row in self.rows)

    def total(self, *hops: Hop) -> float:
        return sum(row.count for row in self.rows if row.hop in hops)


def model(path: Sequence[Step], latencies: Mapping[Hop, float] = LATENCIES) -> Modelled:
    """The path priced: one row per segment and hop, each segment's rows together, in path order."""
    segments = list(dict.fromkeys(step.segment for step in path))
    counts: dict[tuple[str, Hop], float] = {}
    for step in sorted(path, key=lambda s: segments.index(s.segment)):
        counts[(step.segment, step.hop)] = counts.get((step.segment, step.hop), 0) + step.count
    return Modelled(
        tuple(Row(segment, hop, count, latencies[hop]) for (segment, hop), count in counts.items())
    )


# --- what a run did ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    at: float
    thread: int
    operation: str
    """`service:Operation`."""
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Invocation:
    """One Lambda invocation's AWS calls, in order (an event source's own polls on its thread too)."""

    function: str
    ended: float
    calls: tuple[Call, ...]

    def mentions(self, text: str) -> bool:
        return any(text in str(call.params) for call in self.calls)


@dataclass
class CallLog:
    """Every AWS call the stack's functions make, with time and thread, and where each invocation ends."""

    calls: list[Call] = field(default_factory=list)
    ends: list[tuple[float, int, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def attach(cls, system: Any) -> CallLog:
        """Log `system`'s (an emulator World's) calls from now on: each goes through the IAM check in the
        thread that invoked its function, and the Lambda meter tells each invocation's end there."""
        log = cls()
        system.stack.policy_check.observers.append(
            lambda operation, params: log._add_call(
                Call(time.time(), threading.get_ident(), operation, params)
            )
        )
        system.stack.meter.ended.append(log._add_end)
        return log

    def _add_call(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def _add_end(self, function: str) -> None:
        with self._lock:
            self.ends.append((time.time(), threading.get_ident(), function))

    def invocations(self) -> list[Invocation]:
        """The calls split at each invocation's end, per thread."""
        with self._lock:
            marks = [(c.at, 0, c.thread, c) for c in self.calls] + [(t, 1, th, f) for t, th, f in self.ends]
        pending: dict[int, list[Call]] = {}
        found = []
        for at, _, thread, what in sorted(marks, key=lambda m: (m[0], m[1])):
            if isinstance(what, str):  # an invocation's end, named by its function
                found.append(Invocation(what, at, tuple(pending.pop(thread, []))))
            else:
                pending.setdefault(thread, []).append(what)
        return found


@dataclass(frozen=True)
class JobTrace:
    """A served job, as the critical path needs it."""

    job_id: int
    queued_at: float
    instance_id: str
    """The instance whose runner took the job."""
    kind: Kind


@dataclass(frozen=True)
class Execution:
    name: str
    run_key: str
    job_ids: tuple[int, ...]
    redrives: int
    """How many times its runners were asked for before (0: started by the dispatcher)."""
    started: float
    events: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, name: str, events: Sequence[Mapping[str, Any]]) -> Execution:
        request = json.loads(events[0]["executionStartedEventDetails"]["input"])
        return cls(
            name,
            request["run_key"],
            tuple(request.get("job_ids") or ()),
            int(request.get("redrives") or 0),
            events[0]["timestamp"].timestamp(),
            tuple(events),
        )


def record(system: Any, log: CallLog, figures: Iterable[JobFigures]) -> list[Traced]:
    """The critical path of each warm and cold job an emulator World served, read from `log` and the
    provision executions' histories; a job whose path cannot be read whole is left out."""
    stepfunctions = system.stack.stepfunctions
    executions = []
    for execution in system.stack.executions():
        if execution["machine"] != "provision":
            continue
        executions.append(Execution.of(execution["name"], system.stack.history(execution["executionArn"])))
    settings = system.stack.plane.settings
    definition = json.loads(
        stepfunctions.describe_state_machine(stateMachineArn=settings.provision_state_machine_arn)[
            "definition"
        ]
    )
    with system.github.state.lock:
        queued = {
            f"{system.github.state.runs[job.run_id].workflow} #{job.run_id} / {job.name}": (
                job.job_id,
                job.queued_at,
            )
            for job in system.github.state.jobs.values()
        }
    jobs = [
        JobTrace(*queued[f.job], f.instance_id, f.kind)
        for f in figures
        if f.kind in (Kind.WARM, Kind.COLD) and f.instance_id and f.job in queued
    ]
    return trace(jobs, executions, log.invocations(), definition, settings.demand_queue_url)


@dataclass(frozen=True)
class Traced:
    job: JobTrace
    path: tuple[Step, ...]


INGRESS = "GitHub -> API Gateway -> webhook"
WEBHOOK = "webhook Lambda, to its demand message"
DEMAND = "demand queue -> dispatcher (event source)"
FOLLOW_UP = "follow-up window (a matrix's later jobs)"
DISPATCHER = "dispatcher Lambda, to StartExecution"
GATHER = "follow-up's gather Lambda, from its seal to StartExecution"
LISTING = "GitHub's list of the run's jobs, past the window"
GATHER_FUNCTION = "follow_up"
"""The follow-up state machine's functions (gather, start), as the emulator names them (emulator/stack.py)."""
ORCHESTRATION = "Step Functions, to the hand-over"
SERVICES = {
    "dynamodb": Hop.DYNAMODB,
    "sqs": Hop.SQS,
    "kms": Hop.KMS,
    "secretsmanager": Hop.SECRETS_MANAGER,
    "lambda": Hop.LAMBDA_INVOKE,
    "stepfunctions": Hop.START_EXECUTION,
    "ec2": Hop.EC2,
}

ASKS_FOR_TOKEN = frozenset({"lambda:Invoke", "secretsmanager:GetSecretValue"})
"""A function's call that means an installation token is being asked for: its invoke of the token function
(which holds the App's key), or, where a function holds the key itself, its read of the key."""


def trace(
    jobs: Iterable[JobTrace],
    executions: Sequence[Execution],
    invocations: Sequence[Invocation],
    definition: Mapping[str, Any],
    demand_queue_url: str,
) -> list[Traced]:
    traced = []
    for job in jobs:
        path = _trace(job, executions, invocations, definition, demand_queue_url)
        if path is not None:
            traced.append(Traced(job, tuple(path)))
    return traced


def _trace(
    job: JobTrace,
    executions: Sequence[Execution],
    invocations: Sequence[Invocation],
    definition: Mapping[str, Any],
    demand_queue_url: str,
) -> list[Step] | None:
    # GitHub gives a job to any idle runner carrying its labels, so the runner that took it may have been
    # asked for by another job of the run: the job's path is the one to the first config stored for its
    # instance after it was queued, from the demand of the provision that stored it.
    stored = sorted(
        (
            i
            for i in invocations
            if i.ended >= job.queued_at and _stores_config(i, job.instance_id) is not None
        ),
        key=lambda i: i.ended,
    )
    execution, handing = next(
        # A claim worker's calls name its execution when it claims; one handing over what Begin claimed
        # names only the run key, and the task that ended with it tells the execution.
        ((e, i) for i in stored for e in executions if _names(i, e) and _target(e, i)),
        (None, None),
    )
    if execution is None or not execution.job_ids:
        return None
    asked = job.job_id if job.job_id in execution.job_ids else execution.job_ids[0]
    webhook = next((i for i in invocations if i.function == "webhook" and _sent(i, asked)), None)
    dispatcher = next(
        (i for i in invocations if i.function == "dispatcher" and execution and _started(i, execution.name)),
        None,
    )
    gathering = None
    if dispatcher is None:  # a follow-up's provision: its state machine's gather step started it
        gathering = next(
            (
                i
                for i in invocations
                if i.function.startswith(GATHER_FUNCTION) and _started(i, execution.name)
            ),
            None,
        )
        dispatcher = None if gathering is None else _leader(gathering, invocations)
    if handing is None or execution is None or webhook is None or dispatcher is None:
        return None
    path = [Step(INGRESS, Hop.API_GATEWAY, 1), Step(INGRESS, Hop.LAMBDA_INVOKE, 1)]
    path += steps(WEBHOOK, webhook.calls, until=lambda c: _sends(c, asked))
    path += [Step(DEMAND, Hop.SQS, 1), Step(DEMAND, Hop.LAMBDA_INVOKE, 1)]
    if _follows_up(execution, executions):
        path.append(Step(FOLLOW_UP, Hop.WAIT, FOLLOW_UP_WINDOW_SECONDS))
    # The event source's own polls and deletes on the demand queue run on the dispatcher's thread.
    own = [c for c in dispatcher.calls if c.params.get("QueueUrl") != demand_queue_url]
    if gathering is None:
        path += steps(DISPATCHER, own, until=lambda c: c.params.get("name") == execution.name)
    else:
        # The leader's calls up to handing the follow-up over; that start, the machine's first two states
        # and its gather step's invocation run within the window (tens of milliseconds beside 0.3 s), and
        # the gather step's calls from its seal to the provision's start come after it.
        path += steps(DISPATCHER, own[: _handing_over(own)], until=lambda c: False)
        fresh = any(call.operation in ASKS_FOR_TOKEN for call in gathering.calls)
        path.append(Step(LISTING, Hop.WAIT, listing_past_window(fresh=fresh)))
        path += steps(GATHER, gathering.calls, until=lambda c: c.params.get("name") == execution.name)
    branch = _branch(execution, handing)
    if branch is None:
        return None
    states = definition_states(definition)
    for event in branch:
        details = event.get("stateEnteredEventDetails")
        if details is None:
            continue
        path.append(Step(ORCHESTRATION, Hop.STATE_TRANSITION, 1))
        state = states.get(details["name"], {})
        if state.get("Type") == "Wait":
            path.append(Step(ORCHESTRATION, Hop.WAIT, _wait_seconds(state, json.loads(details["input"]))))
    for function, succeeded in _lambda_tasks(branch):
        path.append(Step(ORCHESTRATION, Hop.LAMBDA_INVOKE, 1))
        invocation = (
            handing if succeeded is None else _nearest(invocations, function, succeeded, execution.name)
        )
        if invocation is None:
            return None
        end = _stores_config(invocation, job.instance_id) if invocation is handing else None
        calls = invocation.calls if end is None else own_hand_over(invocation, job.instance_id, end)
        path += steps(
            f"{function} Lambda", calls, until=lambda c: False, hand_over=True, ended=invocation.ended
        )
    return path


def listing_past_window(*, fresh: bool = False) -> float:
    """How long the gather step's list of the run's jobs (steps.follow_up.FollowUpSteps.gather) outlasts the
    follow-up window: the step asks GitHub before it seals, so the list runs beside the window from the
    machine's start (StartExecution, its first two states, the gather step's invocation) and only what it
    takes beyond the window is on the path. GitHub's calls are not AWS calls the trace could see: one
    read (one page holds a 50-job matrix) at its median, after an installation token in a `fresh`
    environment (one that read the App's key: a call the trace sees, and prices itself)."""
    started = (
        LATENCIES[Hop.START_EXECUTION] + 2 * LATENCIES[Hop.STATE_TRANSITION] + LATENCIES[Hop.LAMBDA_INVOKE]
    )
    token = LATENCIES[Hop.GITHUB_AUTH] if fresh else 0.0
    return max(0.0, started + token + LATENCIES[Hop.GITHUB_READ] - FOLLOW_UP_WINDOW_SECONDS)


def definition_states(definition: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every state of a state machine by name, the Map's iterations' too."""
    found: dict[str, Mapping[str, Any]] = {}
    for name, state in definition.get("States", {}).items():
        found[name] = state
        inner = state.get("ItemProcessor") or state.get("Iterator")
        if inner:
            found |= definition_states(inner)
    return found


def _wait_seconds(state: Mapping[str, Any], state_input: Any) -> float:
    if "Seconds" in state:
        return float(state["Seconds"])
    value = state_input
    for key in state.get("SecondsPath", "$").removeprefix("$").split("."):
        if key:
            value = value[key]
    return float(value)


def steps(
    segment: str,
    calls: Sequence[Call],
    *,
    until: Any,
    hand_over: bool = False,
    ended: float | None = None,
) -> list[Step]:
    """The calls up to and including the first `until` matches, each as its service's hop. An empty long
    poll (the next call, or the invocation's end `ended`, came its WaitTimeSeconds later) is its wait;
    with `hand_over`, each hand-over brings its GitHub calls: a JIT registration before each config
    encrypted for an instance, and the installation token the first one needs. The step asks for that
    token in the background once it has read the App's key (steps/hand_over.py `authenticate_ahead`), so
    the calls it makes meanwhile (the pool's read, CreateFleet) hide it: only what they leave of it is
    on the path, and nothing when no registration follows."""
    found = []
    token_left: float | None = None
    """Seconds of the token request still running beside the step's own calls, once it was asked for."""
    for index, call in enumerate(calls):
        service = call.operation.split(":", 1)[0]
        wait = float(call.params.get("WaitTimeSeconds") or 0)
        later = calls[index + 1].at if index + 1 < len(calls) else ended
        if (
            call.operation == "sqs:ReceiveMessage"
            and wait
            and later is not None
            and later - call.at >= EMPTY_POLL_SHARE * wait
        ):
            step = Step(segment, Hop.WAIT, wait)
        elif call.operation == "ec2:CreateFleet":
            step = Step(segment, Hop.EC2_CREATE_FLEET, 1)
        else:
            step = Step(segment, SERVICES[service], 1)
        if hand_over and call.operation == "kms:Encrypt":
            if token_left:
                found.append(Step(segment, Hop.GITHUB_AUTH, token_left / LATENCIES[Hop.GITHUB_AUTH]))
            token_left = 0.0
            found.append(Step(segment, Hop.GITHUB_JIT, 1))
        elif token_left:
            token_left = max(
                0.0, token_left - step.count * (1.0 if step.hop is Hop.WAIT else LATENCIES[step.hop])
            )
        found.append(step)
        if hand_over and call.operation in ASKS_FOR_TOKEN and token_left is None:
            token_left = LATENCIES[Hop.GITHUB_AUTH]
        if until(call):
            break
    return found


def _names(invocation: Invocation, execution: Execution) -> bool:
    return invocation.mentions(execution.name) or invocation.mentions(execution.run_key)


def _stores_config(invocation: Invocation, instance_id: str) -> int | None:
    """Where in `invocation` the instance's runner config was stored, if it was."""
    for index, call in enumerate(invocation.calls):
        item = call.params.get("Item") or {}
        if (
            call.operation == "dynamodb:PutItem"
            and item.get("sk", {}).get("S") == "runner-config"
            and item.get("pk", {}).get("S", "").endswith(f"/{instance_id}")
        ):
            return index
    return None


def own_hand_over(invocation: Invocation, instance_id: str, end: int) -> list[Call]:
    """The handing invocation's calls up to the store of `instance_id`'s config, less the other
    instances' hand-overs: Begin and Create hand over side by side (steps/hand_over.py,
    HAND_OVERS_AT_ONCE), so those ran beside this one, not before it. A hand-over begins with a read of
    its instance's record (GetItem); what came before the first such read (the claims, the records
    created) ran one after another and stays on the path."""
    owners = {_config_owner(call) for call in invocation.calls}
    others = {owner for owner in owners if owner is not None and owner != instance_id}
    calls = list(invocation.calls[: end + 1])
    first = next(
        (
            index
            for index, call in enumerate(calls)
            if call.operation == "dynamodb:GetItem" and _names_any(call, others | {instance_id})
        ),
        len(calls),
    )
    return calls[:first] + [
        call for call in calls[first:] if not _names_any(call, others) or _names_any(call, {instance_id})
    ]


def _config_owner(call: Call) -> str | None:
    """The instance whose runner config `call` stores, if it stores one."""
    item = call.params.get("Item") or {}
    if call.operation != "dynamodb:PutItem" or item.get("sk", {}).get("S") != "runner-config":
        return None
    return str(item.get("pk", {}).get("S", "")).rsplit("/", 1)[-1] or None


def _names_any(call: Call, instance_ids: set[str]) -> bool:
    text = str(call.params)
    return any(instance_id in text for instance_id in instance_ids if instance_id)


def _sends(call: Call, job_id: int) -> bool:
    if call.operation != "sqs:SendMessage":
        return False
    body = json.loads(call.params.get("MessageBody") or "{}")
    return bool(body.get("kind") == "job-queued" and body.get("job_id") == job_id)


def _sent(invocation: Invocation, job_id: int) -> bool:
    return any(_sends(call, job_id) for call in invocation.calls)


def _started(invocation: Invocation, execution: str) -> bool:
    return any(
        c.operation == "stepfunctions:StartExecution" and c.params.get("name") == execution
        for c in invocation.calls
    )


def _holder(starting: Invocation) -> str | None:
    """The dispatch whose follow-up a gather (or start) invocation started: its reservations' holder."""
    for call in starting.calls:
        holder = call.params.get("Item", {}).get("holder", {}).get("S")
        if call.operation == "dynamodb:PutItem" and holder:
            return str(holder)
    return None


def _hands_over(call: Call, holder: str | None = None) -> bool:
    """A StartExecution of the follow-up state machine (by `holder`'s dispatch, if given)."""
    if call.operation != "stepfunctions:StartExecution" or not str(call.params.get("name")).startswith(
        "follow-up-"
    ):
        return False
    return holder is None or json.loads(call.params.get("input") or "{}").get("holder") == holder


def _leader(starting: Invocation, invocations: Sequence[Invocation]) -> Invocation | None:
    """The dispatcher invocation that handed to the machine the follow-up an invocation of it started."""
    holder = _holder(starting)
    return next(
        (
            i
            for i in invocations
            if i.function == "dispatcher" and any(_hands_over(c, holder) for c in i.calls)
        ),
        None,
    )


def _handing_over(calls: Sequence[Call]) -> int:
    """How many of a leader's calls came before it handed its follow-up over."""
    return next((n for n, call in enumerate(calls) if _hands_over(call)), len(calls))


def _follows_up(execution: Execution, executions: Sequence[Execution]) -> bool:
    """A run key's provision the dispatcher started after its first: its jobs waited for the follow-up
    window (a redrive waited for the provision before it, which is on its own path)."""
    return execution.redrives == 0 and any(
        e.run_key == execution.run_key and e.redrives == 0 and e.started < execution.started
        for e in executions
    )


def _function(event: Mapping[str, Any]) -> str:
    parameters = json.loads(event["taskScheduledEventDetails"]["parameters"])
    return str(parameters["FunctionName"]).rsplit(":", 1)[-1]


def _target(execution: Execution, invocation: Invocation) -> Mapping[str, Any] | None:
    """The execution's task event that ended `invocation`: the same function, done when it ended."""
    best, gap = None, 1.0
    scheduled: dict[int, str] = {}
    for event in execution.events:
        if event["type"] == "TaskScheduled":
            scheduled[event["id"]] = _function(event)
    by_id = {event["id"]: event for event in execution.events}
    for event in execution.events:
        if event["type"] not in ("TaskSucceeded", "TaskFailed"):
            continue
        started = by_id.get(int(event.get("previousEventId", 0)))
        function = scheduled.get(int(started.get("previousEventId", 0))) if started else None
        distance = abs(event["timestamp"].timestamp() - invocation.ended)
        if function == invocation.function and distance < gap:
            best, gap = event, distance
    return best


def _branch(execution: Execution, handing: Invocation) -> list[Mapping[str, Any]] | None:
    """The events from the execution's start to the task that handed the config over, on its branch."""
    target = _target(execution, handing)
    if target is None:
        return None
    by_id = {event["id"]: event for event in execution.events}
    chain = []
    event: Mapping[str, Any] | None = target
    while event is not None:
        chain.append(event)
        event = by_id.get(event.get("previousEventId"))
    return chain[::-1]


def _lambda_tasks(branch: Sequence[Mapping[str, Any]]) -> list[tuple[str, float | None]]:
    """Each Lambda task on the branch: its function and when it ended (None: the branch's last)."""
    tasks: list[tuple[str, float | None]] = []
    for index, event in enumerate(branch):
        if event["type"] != "TaskScheduled":
            continue
        ended = next(
            (
                e["timestamp"].timestamp()
                for e in branch[index + 1 :]
                if e["type"] in ("TaskSucceeded", "TaskFailed")
            ),
            None,
        )
        last = not any(e["type"] == "TaskScheduled" for e in branch[index + 1 :])
        tasks.append((_function(event), None if last else ended))
    return tasks


def _nearest(
    invocations: Sequence[Invocation], function: str, ended: float, execution: str
) -> Invocation | None:
    """The invocation of `function` that ended nearest `ended`; one naming the execution (a claim's token,
    a launch's tag) before one that does not (begin's calls name none)."""
    candidates = [i for i in invocations if i.function == function and abs(i.ended - ended) < 1.0]
    return min(candidates, key=lambda i: (not i.mentions(execution), abs(i.ended - ended)), default=None)


# --- the instant tier's path ------------------------------------------------------------------------


ASSIGNMENT = "GitHub assigns, the runner's long poll answers"
RUNNER_START = "runner: acknowledge, acquirejob, first renewal"
RUNNER_START_CALLS = 3
"""The real runner's calls after its long poll answers, before it starts the job's worker: POST
`acknowledge`, POST `acquirejob`, the first renewal (actions/runner, Runner.cs and JobDispatcher.cs)."""
INSTANT_TARGET_SECONDS = 2.0
"""Issue 42's bound on the modelled queued -> in_progress of a job given to a runner listening ahead."""


@dataclass(frozen=True)
class InstantStart:
    """A job on an instant tier's label as an emulator run served it, as far as its path needs."""

    job_id: int
    queued_at: float
    offered_at: float | None
    """When the fake GitHub offered it to the runner that asked for work (its assignment)."""
    started_at: float | None
    """When that runner picked it up: `in_progress`."""
    listening_ahead: bool
    """Whether the runner that took it was one of ours, connected and idle with the label, before the
    job was queued."""


def listening_runners(system: Any, label: str) -> frozenset[int]:
    """The runners of an emulator World that are connected to the fake GitHub, idle, and carry `label`:
    taken just before a job is queued, those a job could be given with nothing of ours in between."""
    with system.github.state.lock:
        return frozenset(
            runner.runner_id
            for runner in system.github.state.runners.values()
            if runner.online and not runner.busy and label in runner.label_names
        )


def instant_start(system: Any, job_id: int, listening: frozenset[int]) -> InstantStart:
    """The job `job_id` of an emulator World as the fake GitHub saw it, given the runners `listening`
    before it was queued."""
    with system.github.state.lock:
        job = system.github.state.jobs[job_id]
        ours = instance_of_runner(job.runner_name) is not None
        return InstantStart(
            job.job_id,
            job.queued_at,
            job.assigned_at,
            job.started_at,
            ours and job.runner_id in listening,
        )


def instant_path(start: InstantStart) -> tuple[Step, ...] | None:
    """The path from queued to `in_progress` of a job whose runner was listening before it was queued,
    as GitHub and the real runner take it: GitHub's assignment, then the runner's calls (its long poll's
    answer, and those before it starts the job). The emulator's runner asks for work every
    POLL_SECONDS instead of holding a long poll open, so its wait for its next ask is not GitHub's and is
    not priced. None for a job that was not started so: the control plane's chain was on its path."""
    if not start.listening_ahead or start.offered_at is None or start.started_at is None:
        return None
    if not start.queued_at <= start.offered_at <= start.started_at:
        return None
    return INSTANT_PATH


INSTANT_PATH = (
    Step(ASSIGNMENT, Hop.GITHUB_ASSIGNMENT, 1),
    Step(ASSIGNMENT, Hop.GITHUB_RUNNER_CALL, 1),
    Step(RUNNER_START, Hop.GITHUB_RUNNER_CALL, RUNNER_START_CALLS),
)


def instant_seconds() -> float:
    """Queued -> `in_progress` of a job given to a runner listening ahead, at the published figures (the
    day trace's instant tier takes this long to start a job on a waiting runner)."""
    return model(INSTANT_PATH).seconds


def report_instant(table: BenchTable, starts: Sequence[InstantStart]) -> None:
    """Add the instant tier's modelled queued -> in_progress, and its path's rows, to `table` (the
    instant bench's: columns figure, value)."""
    paths = [path for path in map(instant_path, starts) if path is not None]
    if not paths:
        table.note(f"AWS model: none of {len(starts)} instant jobs started on a runner listening ahead")
        return
    modelled = sorted((model(path) for path in paths), key=lambda m: m.seconds)
    median = modelled[(len(modelled) - 1) // 2]
    table.figure("aws_model_instant_queued_to_started_seconds", round(median.seconds, 3))
    table.figure(
        "aws_model_instant_critical_path_aws_calls_count",
        median.total(*(set(SERVICES.values()) | {Hop.EC2_CREATE_FLEET})),
    )
    for row in median.rows:
        table.row(f"AWS model: {row.segment}, {row.hop.value}", row.describe())
    table.row("AWS model: queued -> in_progress", f"{median.seconds:.3f} s")
    met = "met" if median.seconds <= INSTANT_TARGET_SECONDS else "NOT met"
    table.note(
        f"AWS model: {len(paths)} of {len(starts)} instant jobs started on a runner of ours that was "
        "connected and idle with the label before the job was queued, so no call of ours is on their "
        "path; priced at GitHub's "
        f"assignment ({LATENCIES[Hop.GITHUB_ASSIGNMENT] * 1000:g} ms, GitHub Support's trace in "
        "actions/actions-runner-controller #4602) and the runner's calls "
        f"({LATENCIES[Hop.GITHUB_RUNNER_CALL] * 1000:g} ms each, bench/aws_model.py LATENCIES); target <= "
        f"{INSTANT_TARGET_SECONDS:g} s ({met})."
    )


# --- the figures --------------------------------------------------------------------------------------


def report(table: BenchTable, traced: Sequence[Traced]) -> None:
    """Add the modelled figures, and a row per segment and hop of each kind's median job, to `table`
    (the emulator's: columns figure, cold, warm)."""
    medians: dict[Kind, Modelled] = {}
    spreads = []
    for kind in (Kind.COLD, Kind.WARM):
        modelled = sorted((model(t.path) for t in traced if t.job.kind is kind), key=lambda m: m.seconds)
        if not modelled:
            continue
        seconds = statistics.median(m.seconds for m in modelled)
        spreads.append(
            f"{kind.value} {modelled[0].seconds:.2f} / {seconds:.2f} / {modelled[-1].seconds:.2f} s "
            f"(min / median / max of {len(modelled)})"
        )
        table.figure(f"aws_model_{kind.value}_control_plane_seconds", round(seconds, 3))
        median = medians[kind] = modelled[(len(modelled) - 1) // 2]
        table.figure(
            f"aws_model_{kind.value}_critical_path_aws_calls_count",
            median.total(*(set(SERVICES.values()) | {Hop.EC2_CREATE_FLEET})),
        )
        table.figure(
            f"aws_model_{kind.value}_critical_path_transitions_count", median.total(Hop.STATE_TRANSITION)
        )
    keys = _merged(
        [[(r.segment, r.hop) for r in medians[k].rows] for k in (Kind.COLD, Kind.WARM) if k in medians]
    )
    for segment, hop in keys:
        cells = []
        for kind in (Kind.COLD, Kind.WARM):
            row = (
                next((r for r in medians[kind].rows if (r.segment, r.hop) == (segment, hop)), None)
                if kind in medians
                else None
            )
            cells.append(row.describe() if row else "-")
        table.row(f"AWS model: {segment}, {hop.value}", *cells)
    table.row(
        "AWS model: queued -> config stored (median job)",
        *(f"{medians[k].seconds:.3f} s" if k in medians else "-" for k in (Kind.COLD, Kind.WARM)),
    )
    table.note(
        f"AWS model: {len(traced)} jobs' critical paths as measured here, priced at published "
        "latencies (bench/aws_model.py LATENCIES, each with its source): "
        + ", ".join(f"{hop.value} {LATENCIES[hop] * 1000:g} ms" for hop in Hop if hop is not Hop.WAIT)
        + "; windows, Wait states and empty long polls at their configured seconds. Modelled: "
        + ", ".join(spreads)
        + ". A run's first job skips the follow-up window its later jobs wait; Lambda cold starts are not "
        "priced, a fresh environment's first reads (its secrets, the App's installation token) are."
    )


def _merged(orders: Sequence[Sequence[tuple[str, Hop]]]) -> list[tuple[str, Hop]]:
    """The keys of every order, each order's keys kept in sequence (one's extra keys after the key
    they follow in it)."""
    merged: list[tuple[str, Hop]] = []
    for order in orders:
        position = 0
        for key in order:
            if key in merged:
                position = merged.index(key) + 1
            else:
                merged.insert(position, key)
                position += 1
    return merged
