"""A job's story, from the stack's own records: what happened to it, in order, with the wait each step added,
or why it still waits. `runner-pool job <URL>` prints it (runner_pool/job_command.py).

The facts are what a deployment records, read by adapters/job_records.py: the demand ledger's item of the
job (counted, and the provision that counted it), the provision and release executions' inputs and the
outputs of their states (Step Functions' execution history), the instance's record, the registration
budget's hold-off, and GitHub's view of the job when the App can be asked. A fact no record holds is told
as not recorded, never guessed: each step says which record it comes from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.instant import instant_job
from runner_pool.domain.labels import LabelError, instant_label, is_pool_label
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.run_keys import RunKey

_JOB_URL = re.compile(
    r"^https?://[^/]+/(?P<repository>[^/\s]+/[^/\s]+)/actions/runs/(?P<run_id>\d+)"
    r"(?:/attempts/\d+)?(?:/job/(?P<job_id>\d+))?/?(?:[?#].*)?$"
)
NOT_RECORDED = "not recorded"
_FOLLOWS: Mapping[str, tuple[str, ...]] = {"started": ("hand-over",), "ended": ("started",)}
"""GitHub's steps, and the steps each one follows whatever their times say (see `_timed`)."""
SEEN_READY = "the provision saw its runner registered (UD_REG_OK) and its agent beating"
"""When the runner registered is not kept (the agent's signal item holds its latest signal only): `ready` is
when a check of the provision saw it, which may come after GitHub started the job on it."""


class Tier(StrEnum):
    """Where the instance that ran the job came from."""

    WARM = "warm"
    """Claimed idle from its class's pool (hot)."""
    STOPPED = "stopped"
    """Claimed from the stopped tier and started for the job."""
    COLD = "cold"
    """Launched by the provision for the job's batch."""


@dataclass(frozen=True)
class JobRef:
    """What a job or run URL names; `job_id` None for a run's URL."""

    repository: str
    run_id: int
    job_id: int | None = None


def parse_job_url(url: str) -> JobRef:
    """`https://github.com/{owner}/{repo}/actions/runs/{run_id}[/job/{job_id}]`; ValueError for any other."""
    found = _JOB_URL.match(url.strip())
    if found is None:
        raise ValueError(
            f"{url!r} is not a job or run URL (https://github.com/OWNER/REPO/actions/runs/RUN[/job/JOB])"
        )
    job = found["job_id"]
    return JobRef(found["repository"], int(found["run_id"]), None if job is None else int(job))


@dataclass(frozen=True)
class GitHubJob:
    """The job as GitHub lists it ("List jobs for a workflow run attempt")."""

    job_id: int
    run_attempt: int
    name: str
    status: str
    labels: tuple[str, ...]
    created_at: Epoch
    started_at: Epoch | None = None
    completed_at: Epoch | None = None
    conclusion: str | None = None
    runner_id: int | None = None
    runner_name: str | None = None


@dataclass(frozen=True)
class LedgerJob:
    """The demand ledger's item of the job (adapters/demand_ledger.py)."""

    state: str
    """`reserved`, `started` (counted by a provision) or `cancelled` (completed before it had a runner)."""
    execution_name: str | None = None
    counted_at: Epoch | None = None
    """When the job was reserved, to the second: read back from the item's expiry, which is set then."""


@dataclass(frozen=True)
class StateExit:
    """One state of an execution ending, with what it passed on (its output, as JSON)."""

    at: Epoch
    name: str
    output: Mapping[str, Any]


@dataclass(frozen=True)
class ExecutionFacts:
    """One provision or release execution: its input, its end, and its states' outputs in order."""

    name: str
    status: str
    started_at: Epoch
    input: Mapping[str, Any]
    stopped_at: Epoch | None = None
    exits: tuple[StateExit, ...] = ()

    def outputs(self, name: str) -> list[StateExit]:
        return [e for e in self.exits if e.name == name]


@dataclass(frozen=True)
class JobFacts:
    ref: JobRef
    now: Epoch
    github: GitHubJob | None = None
    github_unread: str | None = None
    """Why GitHub's view is missing (no App key readable, the job not listed, an error)."""
    ledger: LedgerJob | None = None
    provisions: tuple[ExecutionFacts, ...] = ()
    """Every provision whose input names the job, oldest first: the one that counted it, its redrives,
    refresh's reconciliations."""
    releases: tuple[ExecutionFacts, ...] = ()
    """The release executions caused by the job's completion (`job-<id>`)."""
    record: InstanceRecord | None = None
    """The state table's record of the instance the job ran on (or was handed), as it stands now."""
    held_until: Epoch | None = None
    """The registration budget's hold-off after a GitHub rate limit (adapters/registration_budget.py)."""
    unserved: str | None = None
    """Why the job's labels are not served, judged by the webhook's own rule from GitHub's labels."""
    executions_unread: str | None = None
    """Why the provisions and releases were not read (an EXPRESS workflow's executions keep no history)."""
    instant_tier: str | None = None
    """The class whose instant tier the job asked for: such a job is no run's demand, so the ledger holds
    no item of it (steps/dispatcher.py), and its story is GitHub's view and its runner's release only."""


@dataclass(frozen=True)
class Step:
    what: str
    at: Epoch | None
    detail: str
    wait_seconds: float | None = None
    """Time from the step before that has a time; None when either has none."""


@dataclass(frozen=True)
class Story:
    ref: JobRef
    steps: tuple[Step, ...]
    instance_id: str | None = None
    tier: Tier | None = None
    runner_id: int | None = None
    """GitHub's id of the runner the job ran on: its hand-over's, which every line the instance ships of
    that hand-over carries (domain/job_logs.py)."""
    waiting: str | None = None
    """Why a job that has not started waits; None once it started or ended."""
    gaps: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kinds(self) -> list[str]:
        return [step.what for step in self.steps]


def tell(facts: JobFacts) -> Story:
    """The job's story from its facts: each step in the order it happened, with the wait it added."""
    github = facts.github
    gaps: list[str] = []
    raw: list[Step] = []
    if github is not None:
        raw.append(Step("queued", github.created_at, f"{github.name!r}, labels {' '.join(github.labels)}"))
    else:
        gaps.append(f"queued time: {facts.github_unread or 'GitHub not asked'}")
    if facts.unserved:
        raw.append(Step("unserved", None, facts.unserved))
    raw += _demand(facts.ledger, facts.instant_tier)
    instance_id = ran_on(facts.github, facts.releases)
    tier: Tier | None = None
    for provision in facts.provisions:
        steps, found = _provision(provision, instance_id)
        raw += steps
        tier = tier or found
    if instance_id is not None and tier is None and facts.provisions:
        raw.append(
            Step(
                "runner",
                None,
                f"{instance_id} was handed over by another provision of the same labels "
                "(GitHub gives a job any runner with all its labels)",
            )
        )
    raw += _instance_step(facts.record, instance_id)
    if github is not None and github.started_at is not None:
        raw.append(Step("started", github.started_at, f"on runner {github.runner_name}"))
    if github is not None and github.completed_at is not None:
        raw.append(Step("ended", github.completed_at, github.conclusion or "completed"))
    for release in facts.releases:
        raw += _release(release)
    if facts.record is not None and facts.record.quarantined_at is not None:
        raw.append(Step("quarantined", facts.record.quarantined_at, "GitHub gave its runner a foreign job"))
    if facts.executions_unread:
        gaps.append(f"provisions and releases: {facts.executions_unread}")
    return Story(
        ref=facts.ref,
        steps=_timed(raw),
        instance_id=instance_id,
        tier=tier,
        runner_id=github.runner_id if github is not None else None,
        waiting=_waiting(facts, instance_id),
        gaps=tuple(gaps),
    )


def _timed(steps: Sequence[Step]) -> tuple[Step, ...]:
    """The timed steps in the order they happened, each with its wait since the one before; the untimed
    ones after. GitHub gives a job's times in whole seconds (ISO 8601 without fractions), so a GitHub step
    whose second holds the step it must follow (the hand-over before the start, the start before the
    end) is placed after that step, its wait 0."""
    timed = [s for s in steps if s.at is not None]
    placed: dict[int, tuple[float, int]] = {}
    """Each step's place: its time, or that of the step it follows (then 1, to come after that step)."""
    for index, step in sorted(enumerate(timed), key=lambda pair: pair[1].at or 0.0):
        at = step.at or 0.0
        before = [
            placed.get(i, (s.at or 0.0, 0))[0]
            for i, s in enumerate(timed)
            if s.what in _FOLLOWS.get(step.what, ())
        ]
        latest = max(before, default=None)
        placed[index] = (latest, 1) if latest is not None and at <= latest < at + 1 else (at, 0)
    told: list[Step] = []
    previous: Epoch | None = None
    for index in sorted(placed, key=lambda i: (*placed[i], i)):
        step = timed[index]
        wait = None if previous is None or step.at is None else max(0.0, step.at - previous)
        told.append(Step(step.what, step.at, step.detail, wait))
        previous = max(previous or 0.0, step.at or 0.0)
    return (*told, *(s for s in steps if s.at is None))


def _demand(ledger: LedgerJob | None, tier: str | None) -> list[Step]:
    if tier is not None:
        return [Step("demand", None, f"a job of the {tier} instant tier: no run's demand, no ledger item")]
    if ledger is None:
        return [Step("demand", None, "no ledger item: the webhook never counted the job")]
    if ledger.state == "cancelled":
        return [Step("demand", ledger.counted_at, "cancelled: the job completed before it had a runner")]
    if ledger.state == "reserved":
        return [Step("demand", ledger.counted_at, "reserved by a dispatcher, no provision started yet")]
    return [Step("demand", ledger.counted_at, f"counted by {ledger.execution_name or NOT_RECORDED}")]


def ran_on(github: GitHubJob | None, releases: Sequence[ExecutionFacts]) -> str | None:
    """The instance the job ran on: the one GitHub's runner name names, else the one its release names."""
    named = instance_of_runner(github.runner_name) if github is not None else None
    if named is not None:
        return named
    return next((str(r.input["instance_id"]) for r in releases if r.input.get("instance_id")), None)


def _provision(provision: ExecutionFacts, instance_id: str | None) -> tuple[list[Step], Tier | None]:
    request = provision.input
    again = ""
    if request.get("redrives"):
        again = f", redrive {request['redrives']} (an earlier provision ended short)"
    elif request.get("origin"):
        again = f", asked again by refresh ({request['origin']})"
    jobs = len(request.get("job_ids") or ())
    runners = request.get("count")
    batch = f"{provision.name}: {runners} runner(s) for {jobs} job(s) of {request.get('run_key')}"
    steps = [Step("batch", provision.started_at, batch + again)]
    tier = None
    for worker in provision.outputs("Selected"):
        if worker.output.get("instance_id") == instance_id and instance_id is not None:
            starting = any(
                e.output.get("instance_id") == instance_id and e.output.get("starting")
                for e in provision.outputs("Claim")
            )
            tier = Tier.STOPPED if starting else Tier.WARM
            slot = worker.output.get("slot")
            handed = worker.output.get("handed_over_at")
            where = "the stopped tier (started for it)" if starting else "the pool"
            steps.append(Step("hand-over", handed, f"slot {slot}: {instance_id} claimed from {where}"))
            steps += _claim_ready(provision, instance_id)
    for exit_ in provision.outputs("Create") + provision.outputs("CheckFleet"):
        created = _created(exit_)
        errors = created.get("launch_errors") or {}
        if exit_.name == "Create" and created.get("requested"):
            launched = created.get("launched") or []
            detail = f"CreateFleet for {created['requested']}: launched {len(launched)}"
            if errors:
                detail += ", EC2 refused " + ", ".join(f"{n} ({code})" for code, n in sorted(errors.items()))
            steps.append(Step("creation", exit_.at, detail))
            if instance_id in launched:
                tier = Tier.COLD
                steps.append(Step("hand-over", exit_.at, f"{instance_id} launched cold for the batch"))
        if instance_id is not None and instance_id in (created.get("ready") or []):
            steps.append(Step("ready", exit_.at, f"{instance_id}: {SEEN_READY}"))
            break
    for finish in provision.outputs("Finish"):
        steps.append(Step("provision end", finish.at, _finish(finish.output)))
    if not provision.outputs("Finish") and provision.stopped_at is not None:
        steps.append(Step("provision end", provision.stopped_at, provision.status.lower()))
    return steps, tier


def _claim_ready(provision: ExecutionFacts, instance_id: str) -> list[Step]:
    for exit_ in provision.outputs("Claim") + provision.outputs("CheckClaim"):
        if exit_.output.get("instance_id") == instance_id and exit_.output.get("readiness") == "ready":
            reason = exit_.output.get("reason")
            told = f"; {reason}" if reason and reason != "registered" else ""
            return [Step("ready", exit_.at, f"{instance_id}: {SEEN_READY}{told}")]
    return []


def _finish(result: Mapping[str, Any]) -> str:
    parts = [f"{len(result.get(k) or ())} {k}" for k in ("warm", "cold", "expired", "lost", "moved_on")]
    refused = result.get("refused")
    return ", ".join(parts) + (f"; GitHub refused: {refused}" if refused else "")


def _instance_step(record: InstanceRecord | None, instance_id: str | None) -> list[Step]:
    if instance_id is None:
        return []
    if record is None:
        return [Step("instance", None, f"{instance_id}: no record left (terminated, expired by its TTL)")]
    detail = (
        f"{record.instance_id}: {record.resource_class} {record.instance_type} {record.usage_class.value}, "
        f"launched {_clock(record.created_at)}, {record.jobs_served} hand-over(s), now {record.state.value}"
    )
    return [Step("instance", None, detail)]


def _release(release: ExecutionFacts) -> list[Step]:
    steps = [Step("release", release.started_at, f"{release.name} ({release.input.get('cause')})")]
    verdicts = release.outputs("CheckReceipt") + release.outputs("GiveBack") + release.outputs("Salvage")
    final = [e for e in verdicts if e.output.get("status") not in (None, "awaiting-receipt")]
    if final:
        last = max(final, key=lambda e: e.at)
        status = str(last.output.get("status"))
        reason = last.output.get("reason")
        steps.append(Step("scrub", last.at, _verdict(status) + (f": {reason}" if reason else "")))
    elif release.stopped_at is None:
        steps.append(Step("scrub", None, "awaiting the agent's receipt (UD_REMOVE_REG_OK)"))
    return steps


def _verdict(status: str) -> str:
    return {
        "pooled": "verified clean (UD_REMOVE_REG_OK), back in the pool",
        "expired": "not pooled, expired",
        "retired": "retired after its last job (single use or reuse limits)",
        "quarantined": "quarantined, never pooled",
        "moved-on": "moved on by someone else first",
        "salvaged": "a release step failed; the instance was expired",
    }.get(status, status)


def _waiting(facts: JobFacts, instance_id: str | None) -> str | None:
    """Why a job that neither started nor was cancelled still waits, most telling reason first."""
    github = facts.github
    ended = github is not None and (github.started_at is not None or github.completed_at is not None)
    if ended or (facts.ledger is not None and facts.ledger.state == "cancelled"):
        return None
    if facts.instant_tier is not None:
        return f"for a runner of the {facts.instant_tier} instant tier (its provisions are not told yet)"
    quarantined = facts.record is not None and facts.record.quarantined_at is not None
    held = facts.held_until if facts.held_until is not None and facts.held_until > facts.now else None
    reasons = [
        (bool(facts.unserved), f"unserved label: {facts.unserved}"),
        (quarantined, f"its instance {instance_id} is quarantined"),
        (
            facts.ledger is None,
            "no demand recorded: the queued webhook was not counted (refresh asks GitHub to redeliver)",
        ),
        (
            held is not None,
            f"registrations held off for {(held or 0) - facts.now:.0f} s more (GitHub rate limit)",
        ),
        (not facts.provisions, facts.executions_unread or "no provision found for the job yet"),
    ]
    told = next((reason for applies, reason in reasons if applies), None)
    return told or _provision_wait(facts.provisions[-1], instance_id)


def _provision_wait(latest: ExecutionFacts, instance_id: str | None) -> str:
    """Why a job counted by `latest` (its newest provision) has not started."""
    errors = _launch_errors(latest)
    if errors:
        return f"no capacity: EC2 refused {errors} ({latest.name})"
    if latest.stopped_at is None:
        deferred = [
            e
            for e in latest.outputs("Claim") + latest.outputs("CheckClaim")
            if e.output.get("readiness") == "deferred"
        ]
        if deferred:
            return f"registration deferred: {deferred[-1].output.get('reason') or 'no reason given'}"
        return f"provision {latest.name} at work since {_clock(latest.started_at)}"
    if instance_id is not None:
        return f"runner on {instance_id} ready; waiting for GitHub to start the job"
    return f"provision {latest.name} ended ({latest.status.lower()}) without a runner for it"


def _launch_errors(provision: ExecutionFacts) -> str:
    errors: dict[str, int] = {}
    for exit_ in provision.outputs("Create") + provision.outputs("CheckFleet"):
        errors.update(_created(exit_).get("launch_errors") or {})
    return ", ".join(f"{n} ({code})" for code, n in sorted(errors.items()))


def _created(exit_: StateExit) -> Mapping[str, Any]:
    """Creation's record of what it launched (domain.provision.Creation), as Create and CheckFleet pass it."""
    created: Mapping[str, Any] = (exit_.output.get("creation") or {}).get("created") or {}
    return created


def _clock(at: Epoch) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")


def instant_tier(job: GitHubJob, config: StackConfig) -> str | None:
    """The class whose instant tier the job asks for, if it asks for one it can have (domain/instant.py)."""
    try:
        resource_class = instant_job(job.labels, config.defaults.arch)
    except LabelError:
        return None
    return resource_class if resource_class in config.resource_classes else None


def unserved_reason(job: GitHubJob, run_id: int, config: StackConfig) -> str | None:
    """Why the webhook leaves a job with these labels unserved (domain/webhooks.py's rule for a queued
    job, as far as the labels and the stack config decide it); None for a job it serves or does not own."""
    try:
        resource_class = instant_job(job.labels, config.defaults.arch)
    except LabelError as exc:
        return f"{exc.label}: {exc.reason}"
    if resource_class is not None:
        defined = resource_class in config.resource_classes
        return (
            None if defined else f"{instant_label(resource_class)}: class={resource_class!r} is not defined"
        )
    if not any(map(is_pool_label, job.labels)):
        return "no pool= label: not a runner-pool job"
    try:
        spec = RunKey.of_job(job.labels, job.run_attempt).resolve(config)
    except LabelError as exc:
        return f"{exc.label}: {exc.reason}"
    if spec.run_id != str(run_id):
        return f"pool={spec.run_id} is not this job's run {run_id}; use pool=${{{{ github.run_id }}}}"
    return None
