"""GitHub webhook deliveries as the control plane reads them: the checks a request passes, the events we
use, and the demand message (if any) each delivery asks for.

A request is checked in this order, and the first check that fails answers it:

    413  the body is longer than MAX_BODY_BYTES (its length only: nothing of it is read)
    401  X-Hub-Signature-256 is missing or is not the HMAC-SHA256 of the body with the webhook secret
    400  the Content-Type is not application/json, a GitHub header is missing, the body is not a JSON
         object, or a `workflow_job` / `workflow_run` payload lacks a field we read

Nothing of the body is parsed before its signature has been checked. Events other than `ping`,
`workflow_job`, `workflow_run` and `installation_repositories` are acknowledged and ignored, as are the
actions of those that ask nothing of us.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import (
    DemandMessage,
    InstanceRelease,
    InstantQueued,
    JobCancelled,
    JobQueued,
    RunCompleted,
    RunRequested,
    TierGroupChanged,
)
from runner_pool.domain.executions import ReleaseRequest, instance_of_runner
from runner_pool.domain.instant import instant_job, keeps_tier_group
from runner_pool.domain.labels import LabelError, RunnerLabel, instant_label, is_pool_label
from runner_pool.domain.reruns import job_failed
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runner_scope import OrganizationScope, Registration

MAX_BODY_BYTES = 1024 * 1024
"""A `workflow_run` payload is about 25 KB; a megabyte leaves room for long commit messages."""
SIGNATURE_HEADER = "X-Hub-Signature-256"
EVENT_HEADER = "X-GitHub-Event"
DELIVERY_HEADER = "X-GitHub-Delivery"
CONTENT_TYPE = "application/json"
REASON_LIMIT = 120
"""Answers carry a short reason: enough for the delivery log, never an echo of a whole payload."""

_SIGNATURE = re.compile(r"sha256=([0-9a-fA-F]{64})")
_DELIVERY = re.compile(r"[A-Za-z0-9-]{1,64}")
_EVENT = re.compile(r"[a-z_]{1,64}")

SecretCheck = Callable[[bytes, str], bool]
"""(body, X-Hub-Signature-256 value) → whether the webhook secret signed it."""


def signature_matches(body: bytes, signature: str, secrets: Iterable[bytes]) -> bool:
    """Whether `signature` (`sha256=<hex>`) is the HMAC-SHA256 of `body` under any of `secrets`.

    Each secret is compared in constant time, and all of them are, so the time taken tells a forger
    nothing about which secret came close.
    """
    well_formed = _SIGNATURE.fullmatch(signature)
    if well_formed is None:
        return False
    given = well_formed.group(1).lower().encode()
    matched = False
    for secret in secrets:
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
        matched |= hmac.compare_digest(expected, given)
    return matched


# --- the payloads we read ---------------------------------------------------------------------------


class _Payload(BaseModel):
    # Strict: GitHub sends numbers as numbers; a string where an id belongs is not GitHub.
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


class Repository(_Payload):
    full_name: str = Field(pattern=r"^[^/\s]+/[^/\s]+$", max_length=200)
    id: int | None = Field(None, gt=0)
    """The repository's id, which a rename does not change and a new repository of an old name does not
    take: what reuse and runner groups are decided by."""
    private: bool | None = None
    visibility: str | None = None
    """`public`, `private` or `internal`; GitHub's webhook examples carry it beside `private`."""

    @property
    def public(self) -> bool:
        """Public unless GitHub says otherwise: a payload without either field is treated as public, the
        side that never shares an instance."""
        if self.visibility is not None:
            return self.visibility == "public"
        return self.private is not True


class WorkflowJob(_Payload):
    id: int = Field(gt=0)
    run_id: int = Field(gt=0)
    run_attempt: int = Field(1, gt=0)
    labels: list[str]
    runner_id: int | None = None
    runner_name: str | None = None
    conclusion: str | None = None
    """Once completed: `success`, `failure`, `cancelled`, ... (a runner lost mid-job fails its job)."""


class Deployment(_Payload):
    """The deployment a job's delivery names: present "when a job refers to an environment key in its
    YAML definition" (GitHub changelog, "GitHub Actions: workflow_job webhook payload includes
    deployment"); the job holds that environment's secrets."""

    environment: str | None = None


class WorkflowJobEvent(_Payload):
    action: str
    workflow_job: WorkflowJob
    repository: Repository
    deployment: Deployment | None = None

    @property
    def privileged(self) -> bool:
        """The job targets an environment (domain.trust: privileged)."""
        return self.deployment is not None


class Actor(_Payload):
    login: str = Field(min_length=1, max_length=100)


class WorkflowRun(_Payload):
    id: int = Field(gt=0)
    run_attempt: int = Field(1, gt=0)
    event: str = Field("", max_length=100)
    """What triggered the run (`push`, `pull_request`, ...: "Events that trigger workflows"); empty when
    the delivery says nothing, which no table names, so its jobs are untrusted."""
    actor: Actor | None = None
    """Who caused the run's first attempt (`github.actor`)."""
    triggering_actor: Actor | None = None
    """Who caused this attempt (`github.triggering_actor`: a re-run's may differ from `actor`)."""
    head_repository: Repository | None = None
    """Where the run's commit comes from: another repository than the run's for a fork's pull request."""


class WorkflowRunEvent(_Payload):
    action: str
    workflow_run: WorkflowRun
    repository: Repository


# --- the request ---------------------------------------------------------------------------------------


class InstallationRef(_Payload):
    id: int = Field(gt=0)


class InstallationRepositoriesEvent(_Payload):
    """Which repositories the App's installation covers changed ("Webhook events and payloads",
    installation_repositories: `added` or `removed`, with `repository_selection`); every App receives it
    without subscribing ("You cannot manually subscribe to this event")."""

    action: str
    installation: InstallationRef
    repository_selection: str


@dataclass(frozen=True)
class Refusal:
    """A request that is not a delivery we can use: a 4xx with a short reason; nothing else happens."""

    status: Literal[400, 401, 413]
    reason: str


@dataclass(frozen=True)
class Delivery:
    """A signed, well-formed delivery."""

    delivery_id: str
    event: str
    payload: WorkflowJobEvent | WorkflowRunEvent | InstallationRepositoriesEvent | None
    """None for events we do not read (ping among them)."""


def read_delivery(headers: Mapping[str, str], body: bytes, signed: SecretCheck) -> Delivery | Refusal:
    """Check one request, in the order of the module doc. `headers` must look names up case-insensitively."""
    try:
        if len(body) > MAX_BODY_BYTES:
            raise _Refused(413, f"body of {len(body)} bytes is over the limit of {MAX_BODY_BYTES}")
        signature = _header(
            headers, SIGNATURE_HEADER, _SIGNATURE, 401, "is missing or does not match the body"
        )
        if not signed(body, signature):
            raise _Refused(401, f"{SIGNATURE_HEADER} is missing or does not match the body")
        content_type = headers.get("Content-Type")
        if not isinstance(content_type, str) or content_type.split(";")[0].strip().lower() != CONTENT_TYPE:
            raise _Refused(
                400, f"Content-Type must be {CONTENT_TYPE}; set the webhook's content type to JSON"
            )
        event = _header(headers, EVENT_HEADER, _EVENT, 400, "is missing or is not an event name")
        delivery_id = _header(headers, DELIVERY_HEADER, _DELIVERY, 400, "is missing or is not a delivery id")
        return Delivery(delivery_id, event, _payload(event, body))
    except _Refused as refused:
        return refused.refusal


class _Refused(Exception):  # noqa: N818 - an answer, not an error
    def __init__(self, status: Literal[400, 401, 413], reason: str) -> None:
        super().__init__(reason)
        self.refusal = Refusal(status, _short(reason))


def _header(
    headers: Mapping[str, str], name: str, form: re.Pattern[str], status: Literal[400, 401], problem: str
) -> str:
    value = headers.get(name)
    if not isinstance(value, str) or not form.fullmatch(value):
        raise _Refused(status, f"{name} {problem}")
    return value


def _payload(
    event: str, body: bytes
) -> WorkflowJobEvent | WorkflowRunEvent | InstallationRepositoriesEvent | None:
    try:
        document = pydantic_core.from_json(body)
    except ValueError:
        raise _Refused(400, "body is not valid JSON") from None
    if not isinstance(document, dict):
        raise _Refused(400, "body is not a JSON object")
    model = _MODELS.get(event)
    if model is None:
        return None
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise _Refused(400, f"not a {event} payload: {_first_error(exc)}") from None


_MODELS: dict[str, type[WorkflowJobEvent] | type[WorkflowRunEvent] | type[InstallationRepositoriesEvent]] = {
    "workflow_job": WorkflowJobEvent,
    "workflow_run": WorkflowRunEvent,
    "installation_repositories": InstallationRepositoriesEvent,
}


def _first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "the payload"
    return f"{where}: {error['msg']}"


def _short(reason: str) -> str:
    return reason if len(reason) <= REASON_LIMIT else reason[: REASON_LIMIT - 3] + "..."


# --- what a delivery asks for ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ignored:
    """Nothing for us to do; answered 200 with the reason."""

    reason: str


@dataclass(frozen=True)
class Unserved:
    """A job that asked for a runner with a `pool=` label we cannot serve: logged, counted, answered 200."""

    label: str
    reason: str


@dataclass(frozen=True)
class Accepted:
    """One message for the demand queue; answered 202."""

    message: DemandMessage
    summary: str


Verdict = Ignored | Unserved | Accepted


def verdict(delivery: Delivery, config: StackConfig) -> Verdict:
    if delivery.event == "ping":
        return Ignored("pong")
    match delivery.payload:
        case WorkflowJobEvent() as job_event:
            return _job_verdict(job_event, config)
        case WorkflowRunEvent() as run_event:
            return _run_verdict(run_event)
        case InstallationRepositoriesEvent() as installation_event:
            return _installation_verdict(installation_event, config)
        case _:
            return Ignored(_short(f"event {delivery.event} is not used"))


def _job_verdict(event: WorkflowJobEvent, config: StackConfig) -> Verdict:
    job = event.workflow_job
    instant = _instant_verdict(event, config)
    if instant is not None:
        return instant
    if not any(is_pool_label(label) for label in job.labels):
        return Ignored(f"job {job.id} has no pool= label")
    if event.action == "queued":
        return _queued(event, config)
    foreign = _foreign(event)
    if foreign is not None:
        return foreign
    if event.action == "completed":
        return _completed(event)
    return Ignored(_short(f"workflow_job {event.action} needs nothing"))


def _foreign(event: WorkflowJobEvent) -> Verdict | None:
    """A job running on one of our runners that is not of the run its `pool=` label names: another
    repository's job that copied our label (run ids are not secret), which GitHub could hand an
    organisation-scoped runner. Its runner's instance is quarantined.

    A job of the same run's later attempt (a re-run) carries the same label, and GitHub can give it a
    runner of an earlier attempt still registered; only the record knows which attempt the runner is
    for, so such a job that starts on our runner is sent to the release to be judged there.
    A job of attempt 1 has no earlier attempt to be mistaken for."""
    job = event.workflow_job
    if event.action not in ("in_progress", "completed") or job.runner_id is None:
        return None
    instance_id = instance_of_runner(job.runner_name)
    if instance_id is None:
        return None
    try:
        run_key = RunKey.of_job(job.labels, job.run_attempt)
        run_id = RunnerLabel.parse(run_key.label).run_id
    except LabelError:
        return None
    if run_id == str(job.run_id):
        return _suspect(event, run_key, instance_id, job.runner_id)
    request = ReleaseRequest(
        run_key=str(run_key),
        instance_id=instance_id,
        runner_id=job.runner_id,
        cause=f"foreign-job-{job.id}",
        repository=event.repository.full_name,
        quarantine=True,
    )
    summary = f"job {job.id} of run {job.run_id} ran on {instance_id}, a runner for run {run_id}: quarantined"
    return Accepted(InstanceRelease(request=request), _short(summary))


def _suspect(event: WorkflowJobEvent, run_key: RunKey, instance_id: str, runner_id: int) -> Verdict | None:
    """A job of the runner's own run that started on it, sent to the release to be judged when the record
    must be asked: a re-run's job (which attempt the runner is for), or a job with an environment (was
    the instance handed over single use?). Demand makes a pool label's provisions single use from its
    first job with an environment on, but GitHub may give that job a runner of the same pool label that
    an earlier batch provisioned; this is where that race is caught."""
    job = event.workflow_job
    if event.action != "in_progress" or (job.run_attempt <= 1 and not event.privileged):
        return None
    request = ReleaseRequest(
        run_key=str(run_key),
        instance_id=instance_id,
        runner_id=runner_id,
        cause=f"started-job-{job.id}",
        repository=event.repository.full_name,
        suspect=True,
        privileged=event.privileged,
    )
    checked = "its instance's hand-over" if event.privileged else "its runner's attempt"
    summary = f"job {job.id} of attempt {job.run_attempt} started on {instance_id}: {checked} checked"
    return Accepted(InstanceRelease(request=request), _short(summary))


def _completed(event: WorkflowJobEvent) -> Verdict:
    job = event.workflow_job
    try:
        run_key = RunKey.of_job(job.labels, job.run_attempt)
    except LabelError as exc:
        return Ignored(_short(f"job {job.id} was never served: {exc.reason}"))
    instance_id = instance_of_runner(job.runner_name)
    if instance_id is not None:
        if job.runner_id is None:
            return Ignored(_short(f"job {job.id} names runner {job.runner_name!r} but no runner id"))
        # The runner's id names the hand-off: a late or repeated completion never releases a later one.
        request = ReleaseRequest(
            run_key=str(run_key),
            instance_id=instance_id,
            runner_id=job.runner_id,
            cause=f"job-{job.id}",
            repository=event.repository.full_name,
            privileged=event.privileged,
            failed=job_failed(job.conclusion),
        )
        return Accepted(InstanceRelease(request=request), f"release of {instance_id} queued")
    if not job.runner_name:
        cancel = JobCancelled(repository=event.repository.full_name, run_key=str(run_key), job_id=job.id)
        return Accepted(cancel, f"job {job.id} completed before it got a runner: its demand is cancelled")
    return Ignored(_short(f"runner {job.runner_name!r} is not one of ours"))


def _queued(event: WorkflowJobEvent, config: StackConfig) -> Verdict:
    job = event.workflow_job
    try:
        run_key = RunKey.of_job(job.labels, job.run_attempt)
        spec = run_key.resolve(config)
    except LabelError as exc:
        return Unserved(exc.label, exc.reason)
    if spec.run_id != str(job.run_id):
        reason = f"pool={spec.run_id} is not this job's run {job.run_id}; use pool=${{{{ github.run_id }}}}"
        return Unserved(run_key.label, reason)
    refused = _refused_by_runner_groups(event, config)
    if refused is not None:
        return Unserved(run_key.label, refused)
    demand = JobQueued(
        repository=event.repository.full_name,
        run_key=str(run_key),
        run_id=job.run_id,
        run_attempt=job.run_attempt,
        job_id=job.id,
        public=event.repository.public,
        repository_id=event.repository.id,
        privileged=event.privileged,
    )
    return Accepted(demand, f"1 runner asked for job {job.id}")


def _instant_verdict(event: WorkflowJobEvent, config: StackConfig) -> Verdict | None:
    """What a job of a class's instant tier asks (domain/instant.py); None for a job of no tier."""
    job = event.workflow_job
    try:
        resource_class = instant_job(job.labels, config.defaults.arch)
    except LabelError as exc:
        if event.action == "queued":
            return Unserved(exc.label, exc.reason)
        return Ignored(_short(f"job {job.id} is no instant tier's: {exc.reason}"))
    if resource_class is None:
        return None
    if event.action == "queued":
        return _instant_queued(event, config, resource_class)
    return _instant_on_runner(event, resource_class)


def _instant_queued(event: WorkflowJobEvent, config: StackConfig, resource_class: str) -> Verdict:
    """One more runner for the tier, whichever of its jobs GitHub gives that runner."""
    label = instant_label(resource_class)
    if resource_class not in config.resource_classes:
        return Unserved(label, f"class={resource_class!r} is not defined")
    refused = _refused_by_runner_groups(event, config)
    if refused is not None:
        return Unserved(label, refused)
    job_id = event.workflow_job.id
    repository = event.repository.full_name
    queued = InstantQueued(repository=repository, resource_class=resource_class, job_id=job_id)
    return Accepted(queued, f"1 instant runner asked for job {job_id}")


def _instant_on_runner(event: WorkflowJobEvent, resource_class: str) -> Verdict:
    """Started on a runner of ours: judged by the release against the hand-over its runner was registered
    for, as a run's started job is; a runner registered for a run carries no tier label, so such a runner
    given this job is quarantined (domain/release.py `ran_a_foreign_job`). Completed: its instance is
    released, and as single use, terminated."""
    job = event.workflow_job
    instance_id = instance_of_runner(job.runner_name)
    if event.action not in ("in_progress", "completed") or instance_id is None or job.runner_id is None:
        return Ignored(_short(f"workflow_job {event.action} of the instant tier needs nothing"))
    started = event.action == "in_progress"
    request = ReleaseRequest(
        run_key=instant_label(resource_class),
        instance_id=instance_id,
        runner_id=job.runner_id,
        cause=f"{'started-' if started else ''}job-{job.id}",
        repository=event.repository.full_name,
        suspect=started,
        privileged=event.privileged,
    )
    what = "checked" if started else "released"
    return Accepted(InstanceRelease(request=request), f"instant runner of {instance_id} {what}")


def _refused_by_runner_groups(event: WorkflowJobEvent, config: StackConfig) -> str | None:
    """Why a public repository's job cannot be served when every runner is registered in a runner group
    that does not take public repositories: GitHub would never give it the runner ("By default, runner
    groups ... can't be used by public repositories", docs.github.com, "Managing access to self-hosted
    runners using groups"), so it would wait in the queue with an instance held for it."""
    github = config.github
    if (
        not isinstance(github.scope, OrganizationScope)
        or github.effective_registration is not Registration.RUNNER_GROUP
        or github.runner_groups_allow_public_repositories
        or not event.repository.public
    ):
        return None
    return (
        f"{event.repository.full_name} is public and its runners are registered in runner groups "
        "(github.registration: runner-group), which take no public repository; set "
        "github.runner_groups_allow_public_repositories: true to serve it"
    )


def _installation_verdict(event: InstallationRepositoriesEvent, config: StackConfig) -> Verdict:
    """The instant tier's runner group is set again to the installation's repositories (refresh does the
    same every run, should this delivery be lost); nothing for another installation, or a stack that keeps
    no such group."""
    installation_id = event.installation.id
    if installation_id != config.github.installation_id:
        return Ignored(_short(f"installation {installation_id} is not this stack's"))
    if not keeps_tier_group(config):
        return Ignored("no instant tier runner group to keep in step")
    summary = f"installation's repositories {event.action} ({event.repository_selection}): tier group queued"
    return Accepted(TierGroupChanged(installation_id=installation_id), _short(summary))


def _run_verdict(event: WorkflowRunEvent) -> Verdict:
    run = event.workflow_run
    if event.action == "requested":
        # Queued for every run, ours or not: only the ledger knows which runs are ours, and the level
        # must be there before the run's demand, which comes moments after.
        requested = RunRequested(
            repository=event.repository.full_name,
            run_id=run.id,
            run_attempt=run.run_attempt,
            event=run.event or "unknown",
            actor=None if run.actor is None else run.actor.login,
            triggering_actor=None if run.triggering_actor is None else run.triggering_actor.login,
            head_repository=None if run.head_repository is None else run.head_repository.full_name,
        )
        summary = f"run {run.id} attempt {run.run_attempt} requested by {run.event or 'an unnamed event'}"
        return Accepted(requested, _short(summary))
    if event.action != "completed":
        return Ignored(_short(f"workflow_run {event.action} needs nothing"))
    completed = RunCompleted(
        repository=event.repository.full_name, run_id=run.id, run_attempt=run.run_attempt
    )
    return Accepted(completed, f"release of run {run.id} attempt {run.run_attempt} queued")
