"""Creation (DESIGN.md 6.3) and the EC2 facts refresh needs: what a launch asks for and what came of it.

A launch asks for `count` instances of one resource class. EC2 picks the instance types itself
(attribute-based selection) inside a fence drawn here: exactly the class's vCPUs, at least its
memory, and, unless the job named instance types, at most twice its memory and no accelerators.
The fence keeps EC2's free choice at the class's price: without it a 2 vCPU class could land on
any larger type whose spot price happens to be low, and the pool would hold instances of another
size under this class's name.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.domain.config import FleetSettings, StackConfig
from runner_pool.domain.labels import LABEL_KEYS, NotUsed, RunnerLabel, RunnerSpec
from runner_pool.domain.records import Arch, InstanceFacts, UsageClass

LAUNCH_TAG = "runner-pool:launch"
"""The launch's idempotency key (for provision, the execution's name): dump finds what it launched by it."""

MEMORY_HEADROOM = 2
"""Without named types an instance may have up to this many times its class's memory: the compute
and general-purpose families of the class's size, not the memory-optimised ones."""


class LaunchAttempt(StrEnum):
    """Which of a creation's (at most two) CreateFleet calls a request is; each has its own token."""

    FIRST = "first"
    ON_DEMAND_FALLBACK = "on-demand-fallback"


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LaunchRequest(_Value):
    """`count` new instances of one resource class, for a run (`run_key`) or for the pool (None).

    `idempotency_key` names one creation: a retried Lambda or step passes the same key, and EC2,
    given the same client token, answers with the first call's result instead of launching again.
    """

    idempotency_key: str = Field(min_length=1)
    count: int = Field(gt=0)
    resource_class: str
    cpu: int = Field(gt=0)
    memory_mib: int = Field(gt=0)
    usage: UsageClass
    arch: Arch
    types: tuple[str, ...] = ()
    """Allowed instance-type globs; empty lets EC2 choose any type inside the class's fence."""
    run_key: str | None = None
    attempt: LaunchAttempt = LaunchAttempt.FIRST

    @classmethod
    def for_run(cls, spec: RunnerSpec, count: int, idempotency_key: str) -> LaunchRequest:
        return cls(idempotency_key=idempotency_key, count=count, run_key=spec.run_key, **launched_as(spec))

    @classmethod
    def for_pool(
        cls,
        config: StackConfig,
        resource_class: str,
        count: int,
        idempotency_key: str,
        *,
        usage: UsageClass | None = None,
    ) -> LaunchRequest:
        """Warm-pool instances: the class's size with the stack's label defaults, held by no run; `usage`
        overrides the default (the stopped tier's are on-demand whatever it is)."""
        if resource_class not in config.resource_classes:
            raise KeyError(resource_class)
        # What a label naming only the class resolves to; the run id is never used, only the keys.
        spec = config.resolve(RunnerLabel(run_id="0", resource_class=resource_class, usage=usage))
        return cls(idempotency_key=idempotency_key, count=count, **launched_as(spec))

    @property
    def client_token(self) -> str:
        """EC2's idempotency token: equal for a retried call, different for every other launch.

        A SHA-256 in hex is exactly 64 characters, the most EC2 accepts, whatever the key's length.
        """
        return hashlib.sha256(f"{self.idempotency_key}\n{self.attempt.value}".encode()).hexdigest()

    @property
    def memory_max_mib(self) -> int | None:
        """The memory fence; None once the job has named its types (types=r7i* asks for more)."""
        return None if self.types else self.memory_mib * MEMORY_HEADROOM

    @property
    def excludes_accelerators(self) -> bool:
        """GPU types at a class's size cost several times as much; only a job naming types gets one."""
        return not self.types


def launched_as(spec: RunnerSpec) -> dict[str, object]:
    """The spec's fields a launch carries: those each label key names in its `fleet` column."""
    return {
        name: getattr(spec, name)
        for key in LABEL_KEYS
        if not isinstance(key.fleet, NotUsed)
        for name in key.fleet
    }


class LaunchFailure(_Value):
    """One entry of CreateFleet's `Errors`: a pool that launched nothing, and why (EC2's error code)."""

    code: str
    message: str = ""
    usage: UsageClass | None = None
    subnet_id: str | None = None
    instance_type: str | None = None


class LaunchOutcome(_Value):
    """What one creation launched (every instance, with its facts) and what EC2 refused."""

    requested: int
    launched: tuple[InstanceFacts, ...] = ()
    failures: tuple[LaunchFailure, ...] = ()

    @property
    def shortfall(self) -> int:
        return max(0, self.requested - len(self.launched))

    def failures_by_code(self) -> dict[str, tuple[LaunchFailure, ...]]:
        grouped: dict[str, list[LaunchFailure]] = {}
        for failure in self.failures:
            grouped.setdefault(failure.code, []).append(failure)
        return {code: tuple(failures) for code, failures in grouped.items()}

    def then(self, retry: LaunchOutcome) -> LaunchOutcome:
        """This outcome followed by a retry for its remainder: still the first request's count."""
        return LaunchOutcome(
            requested=self.requested,
            launched=self.launched + retry.launched,
            failures=self.failures + retry.failures,
        )


def fallback_for(
    request: LaunchRequest, outcome: LaunchOutcome, settings: FleetSettings
) -> LaunchRequest | None:
    """DESIGN.md 6.3: the remainder of a spot launch is retried once, on-demand, if the config allows.

    Nothing else is retried here: every configured subnet is already an override of each call, so
    EC2 has tried the other availability zones within the first call; what a retry can change is
    the usage class. An on-demand shortfall, or a spot one with the fallback off, stays short.
    """
    if (
        outcome.shortfall == 0
        or request.attempt is not LaunchAttempt.FIRST
        or request.usage is not UsageClass.SPOT
        or not settings.spot_fallback_to_on_demand
    ):
        return None
    return request.model_copy(
        update={
            "count": outcome.shortfall,
            "usage": UsageClass.ON_DEMAND,
            "attempt": LaunchAttempt.ON_DEMAND_FALLBACK,
        }
    )


class FleetRequestError(RuntimeError):
    """EC2 refused a whole CreateFleet call, as opposed to launching fewer: nothing was launched.

    `code` is EC2's, e.g. `IdempotentParameterMismatch` (the key was reused for a different launch),
    `InvalidLaunchTemplateId.NotFound`, `UnauthorizedOperation`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"CreateFleet refused ({code}): {message}")
        self.code = code


class Termination(StrEnum):
    """What TerminateInstances made of one instance id."""

    TERMINATING = "terminating"
    TERMINATED = "terminated"
    UNKNOWN = "unknown"
    """EC2 has no such instance (never launched, malformed, or terminated long ago): it is gone.

    Right after a launch EC2 may not know an instance yet (eventual consistency); such an instance
    still carries the stack tag, so refresh's orphan sweep terminates it later."""


class Start(StrEnum):
    """What StartInstances made of a stopped instance."""

    STARTING = "starting"
    """EC2 took the start: the instance is pending, then running (EC2 API Reference, StartInstances)."""
    NO_CAPACITY = "no-capacity"
    """InsufficientInstanceCapacity: EC2 has no capacity of the instance's type in its Availability Zone
    now (EC2 User Guide, "Troubleshoot instance launch issues": it applies to a start as to a launch).
    The instance stays stopped; the request launches elsewhere instead."""
    REFUSED = "refused"
    """EC2 would not start it: gone, or not in a state a start applies to (IncorrectInstanceState)."""


class Ec2State(StrEnum):
    """An instance's state as EC2 reports it, or UNKNOWN when EC2 does not know the id."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SHUTTING_DOWN = "shutting-down"
    TERMINATED = "terminated"
    UNKNOWN = "unknown"

    @property
    def is_gone(self) -> bool:
        """Terminated, on its way there, or unknown: nothing is left to terminate."""
        return self in (Ec2State.SHUTTING_DOWN, Ec2State.TERMINATED, Ec2State.UNKNOWN)
