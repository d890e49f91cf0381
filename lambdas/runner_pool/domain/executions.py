"""What starts the provision and release state machines: their inputs, and names that make them idempotent.

The webhook path (dispatcher) builds these; the state machines' first states read them. A name is a
pure function of the demand it serves, so a redelivered webhook or a retried dispatcher asks for
the same execution again, which Step Functions Standard refuses to start twice. Express workflows
do not dedupe by name, so the dispatcher also stops duplicate demand before StartExecution.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from runner_pool.domain.labels import instant_class
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.trust import TrustLevel

EXECUTION_NAME_LIMIT = 80
"""Step Functions' limit on an execution name."""
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


def _a_run_key(value: str) -> str:
    RunKey.parse(value)
    return value


RunKeyText = Annotated[str, AfterValidator(_a_run_key)]
"""A run key as text, refused unless it parses (domain.run_keys)."""


class _Input(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MalformedRequestError(ValueError):
    """A request that does not parse (pydantic's ValidationError, by the product's name): a state machine
    refuses it at once, as it does a LabelError, rather than retrying what will never parse."""


PROVISION_LIMIT = 50
"""The most runners one provision execution is asked for; the dispatcher splits a larger group into
several executions, each named after its own jobs.

Sized to stay within half of each Step Functions quota (25,000 history events, 256 KiB a state:
emulator/step_functions_quotas.py), measured by `make bench` (bench/quotas.py): a runner's happy path
costs about 18 history events and 110 bytes of the Map's output; its worst path also loops through the
claim check once a second for the whole claim registration (20 checks of 9 events at the defaults) and
claims once more, about 220 events. 50 x 220 + the fleet-validation loop (36 polls of 9 events) + ~20
= ~11,400 events, under 12,500; 50 x 110 bytes is far under 128 KiB.
tests/integration/test_quota_bench.py checks the figures this rests on."""


class ProvisionRequest(_Input):
    """N runners for N queued jobs of one run attempt that ask for the same labels (`run_key`)."""

    repository: str = Field(min_length=1, description="owner/repo the jobs belong to")
    run_key: RunKeyText = Field(
        min_length=1, description="the jobs' run key (domain.run_keys): label, attempt, labels"
    )
    count: int = Field(gt=0, le=PROVISION_LIMIT)
    job_ids: tuple[int, ...] = ()
    redrives: int = Field(0, ge=0, description="provisions for these jobs that ended short before this one")
    origin: str | None = Field(
        None, max_length=40, description="what asked again for jobs already counted, e.g. `reconcile-<tick>`"
    )
    public: bool = Field(
        False, description="the repository is public (or the run comes from a fork): its jobs never reuse"
    )
    repository_id: int | None = Field(
        None, gt=0, description="the repository's id, by which reuse and runner groups are decided"
    )
    trust: TrustLevel | None = Field(
        None,
        description="the jobs' level of trust (domain/trust.py); None when it could not be decided, and "
        "then the jobs are served single use (fail closed), as is a request from before levels existed",
    )
    on_demand: bool = Field(
        False,
        description="served on-demand whatever the label's `usage=` says: the jobs are this stack's re-run "
        "of jobs of the same labels that an interruption failed (domain/reruns.py)",
    )

    @property
    def key(self) -> RunKey:
        """The run attempt and every label the runners are registered with, read from the run key."""
        return RunKey.parse(self.run_key)

    @property
    def execution_name(self) -> str:
        # A redrive or a reconciliation asks again for jobs whose first provision already has this
        # name: each gets a name of its own, and a retried start of the same one finds it again.
        again = [f"redrive-{self.redrives}"] if self.redrives else []
        again += [self.origin] if self.origin else []
        return execution_name(
            "provision", self.repository, self.run_key, *map(str, sorted(self.job_ids)), *again
        )


class FollowUpRequest(_Input):
    """A follow-up batch to gather (domain.follow_up): the follow-up state machine waits for its window to
    close, seals it as `holder`, its leader in the ledger, and starts its provisions."""

    repository: str = Field(min_length=1)
    run_key: RunKeyText = Field(min_length=1)
    holder: str = Field(min_length=1, description="the dispatch that leads the follow-up in the ledger")
    attempts: tuple[tuple[int, int], ...] = Field(
        description="(run id, attempt) of its jobs; none for an instant tier's (no run's demand)"
    )
    closes_at: float = Field(description="when its window closes, unless more jobs join (epoch seconds)")
    repository_id: int | None = Field(
        None, gt=0, description="the repository's id, as its jobs' webhooks gave it"
    )

    @model_validator(mode="after")
    def _of_runs_unless_a_tiers(self) -> FollowUpRequest:
        if not self.attempts and instant_class(self.run_key) is None:
            raise ValueError(f"a follow-up of {self.run_key!r} names the run attempts of its jobs")
        return self

    @property
    def execution_name(self) -> str:
        # One dispatch leads at most one follow-up of a run key: a retried start finds it again.
        return execution_name("follow-up", self.repository, self.run_key, self.holder)


class ReleaseRequest(_Input):
    """Give back what a run attempt holds: one instance whose job completed, or (instance_id None) all
    of it, or one part of all of it that the run's release planned (`part`)."""

    run_key: str = Field(min_length=1)
    instance_id: str | None = None
    part: tuple[str, ...] | None = Field(
        None,
        min_length=1,
        description="the instances of one bounded part of a run's release (domain.release.release_parts), "
        "given back by an execution of its own; None for a job's release or a whole run's",
    )
    runner_id: int | None = Field(
        None, description="the GitHub runner the completed job ran on: the one hand-off to release"
    )
    cause: str = Field(min_length=1, description="what asked for it, e.g. `job-123` or `run-45-attempt-1`")
    repository: str | None = Field(None, description="owner/repo of the job that completed or started")
    quarantine: bool = Field(
        False,
        description="GitHub gave the runner a job of another run or repository (`run_key` is that job's): "
        "the instance is expired, never pooled",
    )
    suspect: bool = Field(
        False,
        description="GitHub started a job on the runner (`run_key` is that job's): judged, not released; the "
        "instance is quarantined if the runner was registered for another attempt, or if the job is "
        "`privileged` and the instance was not handed over single use; else left as it is",
    )
    privileged: bool = Field(
        False,
        description="the job targets an environment (its delivery carries `deployment`): the instance is "
        "never pooled after it, and one not handed over single use is quarantined when the job starts",
    )
    failed: bool = Field(
        False,
        description="the completed job failed: if its instance was being interrupted, its run attempt is "
        "noted for a re-run of its failed jobs (domain/reruns.py)",
    )

    @model_validator(mode="after")
    def _quarantine_names_a_hand_off(self) -> ReleaseRequest:
        if (self.quarantine or self.suspect) and (self.instance_id is None or self.runner_id is None):
            raise ValueError("a quarantine names the instance and the runner GitHub gave the foreign job")
        return self

    @model_validator(mode="after")
    def _a_part_is_of_a_run(self) -> ReleaseRequest:
        if self.part is not None and (self.instance_id is not None or self.runner_id is not None):
            raise ValueError("a part of a run's release names no single instance or runner")
        return self

    @property
    def execution_name(self) -> str:
        runner = "" if self.runner_id is None else str(self.runner_id)
        # A part is named by the run's release it belongs to (run key, cause) and by its own instances:
        # the run's release starting it again (a retry) finds it; another part never has its name.
        part = ("part", *self.part) if self.part is not None else ()
        return execution_name("release", self.run_key, self.instance_id or "run", runner, self.cause, *part)


def execution_name(kind: str, *parts: str) -> str:
    """`kind-<digest>`: deterministic, within Step Functions' 80 characters and its allowed alphabet."""
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return f"{kind}-{digest}"[:EXECUTION_NAME_LIMIT]


def runner_name(instance_id: str, claim: str) -> str:
    """The GitHub runner name for one hand-off of an instance: `<instance id>-<8 hex of the claim>`.

    Unique per hand-off (GitHub replaces a runner whose name it knows), and it leads with the
    instance id, so a `workflow_job completed` webhook, which names the runner, names the instance.
    """
    return f"{instance_id}-{hashlib.sha256(claim.encode()).hexdigest()[:8]}"


def instance_of_runner(name: str | None) -> str | None:
    """The instance a runner name of ours belongs to; None for a runner that is not ours."""
    if not name:
        return None
    instance_id, dash, suffix = name.rpartition("-")
    if dash and _INSTANCE_ID.fullmatch(instance_id) and re.fullmatch(r"[0-9a-f]{8}", suffix):
        return instance_id
    return None
