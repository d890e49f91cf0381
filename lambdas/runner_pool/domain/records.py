"""The records of DESIGN.md section 3: what the state table and the pool queues hold, as typed models."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runner_pool.domain.clock import Epoch
from runner_pool.domain.lifecycle import HELD_STATES, UNHELD_STATES, InstanceState, Outcome
from runner_pool.domain.trust import TrustLevel


class UsageClass(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Arch(StrEnum):
    X64 = "x64"
    ARM64 = "arm64"


class HandOverTier(StrEnum):
    """Where the instance of a hand-over came from: the hot pool, the stopped tier, or a launch for it."""

    HOT = "hot"
    STOPPED = "stopped"
    COLD = "cold"


class Signal(StrEnum):
    """What the agent tells the control plane, through its signal item."""

    UD_OK = "UD_OK"
    UD_FAILED = "UD_FAILED"
    UD_REG_OK = "UD_REG_OK"
    UD_REG_FAILED = "UD_REG_FAILED"
    UD_REMOVE_REG_OK = "UD_REMOVE_REG_OK"
    UD_REMOVE_REG_FAILED = "UD_REMOVE_REG_FAILED"


REGISTERED_SIGNALS = frozenset({Signal.UD_REG_OK, Signal.UD_REMOVE_REG_OK, Signal.UD_REMOVE_REG_FAILED})
"""An agent's signals for a run key that say its runner registered for it: listening, or cleaned up after."""
RUN_SIGNALS = REGISTERED_SIGNALS | {Signal.UD_REG_FAILED}
"""Signals the agent writes about one run key: registering its runner, and cleaning up after it."""


INSTANCE_ID_PATTERN = r"^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$"
"""An EC2 instance id: `i-` and 8 (older) or 17 hexadecimal characters
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html). Anything else read from a
queue or a request is not one of our instances: a forged over-long id would otherwise reach DynamoDB's
key-size limit and fail every provision that reads it."""


MAX_REASON_CHARS = 500
"""The longest failure reason a signal carries (bounded, whatever the agent wrote)."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InstanceFacts(_Record):
    """What is known of an instance from the moment EC2 launched it; never changes afterwards."""

    instance_id: str = Field(min_length=1)
    resource_class: str
    instance_type: str
    usage_class: UsageClass
    arch: Arch
    cpu: int = Field(gt=0)
    memory_mib: int = Field(gt=0)


class InstanceRecord(InstanceFacts):
    """The control plane's item for one instance: where it is in the lifecycle and who holds it."""

    state: InstanceState
    run_key: str | None = None
    threshold: Epoch | None = None
    """When this state stops being valid; None only once terminated."""
    claim_token: str | None = None
    """Which claim worker holds a claimed instance, so a retried claim is recognised as its own."""
    runner_id: int | None = None
    runner_run_key: str | None = None
    """The run key `runner_id` was registered for. Kept with it once the record is idle, as `run_key` is
    not: a job that runner ran is judged against the hand-off it was made for (run id and attempt)."""
    quarantined_at: Epoch | None = None
    """When GitHub was seen giving this instance's runner a foreign job. Final: the record is expired in
    the same write, no transition but expiry and termination applies to it again, and its agent stops
    the runner as soon as it reads it."""
    interrupted_at: Epoch | None = None
    """When EC2 warned that it interrupts this spot instance while it ran a run's job
    (domain/interruptions.py). Kept once set, through termination: the completion of the job it ran is
    judged by it, and a release retires the instance rather than pooling it."""
    repository: str | None = None
    """The repository (`owner/repo`) of the run that holds it or last held it; None until it serves one.
    Pickup offers an idle instance only to jobs within `reuse.scope` of it."""
    repository_id: int | None = Field(None, gt=0)
    """That repository's id, when its demand carried one: the claim compares it, not the name, and the
    hand-over registers in its runner group."""
    jobs_served: int = Field(0, ge=0)
    """Hand-offs to a run so far (created for one, or claimed); `reuse.max_jobs` caps it. Never counted
    back down, not even when a claim is given back: a runner handed its config may have run a job, so
    only an instance no run was ever handed is pristine (`pristine`)."""
    trust: TrustLevel | None = None
    """The level of trust of the jobs it was last handed to (domain/trust.py); None while pristine, and for
    a hand-off whose level was not known (served single use). Only a job of the same level that reuses
    may follow it (`trust.may_follow`): pickup, the claim's condition and the stopped tier all check."""
    single_use: bool = False
    """Held for a job that must not share its instance with later ones (a public repository's, unless
    `reuse.public_repositories`): released, it is expired and terminated, never pooled."""
    for_stopped_tier: bool = False
    """Launched by refresh for a class's stopped minimum (set at launch, never changed): once admitted it
    is stopped at once rather than offered hot (domain/stopped_tier.py, `launched_for_tier`)."""
    handed_over_at: Epoch | None = None
    """When its latest hand-off to a run began (its claim, or its launch for the run); kept until the next,
    so the release that ends it can record the instance-seconds it used (domain/cost.py)."""
    handed_over_from: HandOverTier | None = None
    """Where that hand-off took it from: the hot pool, the stopped tier, or a launch."""
    stopped_at: Epoch | None = None
    """When it last entered the stopped tier: its time stopped is priced at its volume alone."""
    created_at: Epoch
    updated_at: Epoch
    expires_at: int | None = None
    """DynamoDB TTL (whole epoch seconds), set only on terminated records."""

    def threshold_passed(self, now: Epoch) -> bool:
        return self.threshold is None or self.threshold <= now

    @property
    def pristine(self) -> bool:
        """Booted and never handed to a run: a clean slate any job may take, single-use ones included."""
        return self.jobs_served == 0

    @property
    def facts(self) -> InstanceFacts:
        return InstanceFacts.model_validate(self.model_dump(include=set(InstanceFacts.model_fields)))

    def invariant_violations(self) -> list[str]:
        """What, if anything, makes this record one that DESIGN.md section 4 does not allow."""
        problems: list[str] = []
        if self.state in HELD_STATES and not self.run_key:
            problems.append(f"{self.state} without a run key")
        if (self.state in UNHELD_STATES or self.state is InstanceState.TERMINATED) and self.run_key:
            problems.append(f"{self.state} still holding run key {self.run_key!r}")
        if self.state is InstanceState.CLAIMED and not self.claim_token:
            problems.append("claimed without a claim token")
        if self.state is not InstanceState.CLAIMED and self.claim_token:
            problems.append(f"{self.state} still carrying claim token {self.claim_token!r}")
        if self.state is InstanceState.TERMINATED and self.expires_at is None:
            problems.append("terminated without a TTL")
        if self.state is not InstanceState.TERMINATED and self.threshold is None:
            problems.append(f"{self.state} without a threshold")
        return problems


class UnreadableRecord(_Record):
    """A `state` item that is not an InstanceRecord (a field missing, a value out of range, a field no
    version of the record has). Nothing trusts what it says: it is treated as no record (untracked),
    and refresh terminates its instance and sets the item aside."""

    instance_id: str | None
    """The instance its key names; None when the key names none."""
    reason: str


class Heartbeat(_Record):
    instance_id: str
    beat_at: Epoch

    def is_fresh(self, now: Epoch, healthy_window_seconds: float) -> bool:
        return now - self.beat_at <= healthy_window_seconds


class WorkerSignal(_Record):
    """The latest signal an agent wrote; `run_key` names the run it refers to, if any."""

    instance_id: str
    signal: Signal
    run_key: str | None = None
    at: Epoch
    reason: str | None = None

    @field_validator("reason")
    @classmethod
    def _bounded(cls, reason: str | None) -> str | None:
        """An agent's reason is its own text (a runner's last lines, a script's error): it travels into
        Step Functions states whose payload quota is 256 KiB, so only its first MAX_REASON_CHARS do."""
        if reason is None or len(reason) <= MAX_REASON_CHARS:
            return reason
        return reason[: MAX_REASON_CHARS - 1] + "…"

    def confirms(self, signal: Signal, run_key: str | None) -> bool:
        return self.signal is signal and self.run_key == run_key


@dataclass(frozen=True)
class InstanceView:
    """An instance's record and its agent's latest heartbeat and signal, as one read saw them."""

    record: InstanceRecord | None
    heartbeat: Heartbeat | None
    signal: WorkerSignal | None


@dataclass(frozen=True)
class TransitionResult:
    """The outcome of one transition and the record as it stands afterwards (None if there is none)."""

    outcome: Outcome
    record: InstanceRecord | None

    @property
    def succeeded(self) -> bool:
        return self.outcome.succeeded


class PoolMessage(_Record):
    """One idle, vetted instance offered in its class's pool queue.

    `threshold` is the idle threshold of the record at the time the message was sent: a message
    whose threshold differs from the record's is from an earlier idle period and is stale.
    """

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    resource_class: str
    instance_type: str
    usage_class: UsageClass
    arch: Arch
    cpu: int
    memory_mib: int
    threshold: Epoch
    repository: str | None = None
    """The repository the instance last served (None: none yet); pickup keeps it within `reuse.scope`."""
    created_at: Epoch | None = None
    """When the instance was launched; pickup drops an offer past `reuse.max_age_minutes`."""
    repository_id: int | None = None
    """The id of the repository it last served, when known: pickup compares it, not the name, when the
    jobs' repository has one too (as the claim does)."""
    trust: TrustLevel | None = None
    """The level of the jobs it last served (None: none, or not known)."""
    pristine: bool = False
    """Never handed to a run (`InstanceRecord.pristine`). False in a message from a release before
    pristine instances were told apart: such an offer is taken for a used one, the side that never
    crosses a level; the claim's condition reads the record, which decides."""

    @classmethod
    def for_idle(cls, record: InstanceRecord) -> PoolMessage:
        if record.state is not InstanceState.IDLE or record.threshold is None:
            raise ValueError(f"only an idle instance is pooled; {record.instance_id} is {record.state}")
        return cls._of(record)

    @classmethod
    def for_stopped(cls, record: InstanceRecord) -> PoolMessage:
        """A stopped instance as pickup judges an offer (never sent: the stopped tier is read from the
        state table, domain/stopped_tier.py), so hot and stopped candidates are fitted by one rule."""
        if record.state is not InstanceState.STOPPED or record.threshold is None:
            raise ValueError(f"{record.instance_id} is {record.state}, not stopped")
        return cls._of(record)

    @classmethod
    def _of(cls, record: InstanceRecord) -> PoolMessage:
        shared = record.model_dump(include=set(cls.model_fields) & set(InstanceRecord.model_fields))
        return cls.model_validate(shared | {"pristine": record.pristine})

    def to_body(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_body(cls, body: str) -> PoolMessage:
        return cls.model_validate_json(body)
