"""Release (DESIGN.md section 7): what a finished job or run gives back, as data, and the rules it follows.

The steps that act on these are in steps.release.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.domain.clock import Epoch
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import RunnerRemoval
from runner_pool.domain.timeouts import Timeouts


class ReleaseStatus(StrEnum):
    AWAITING_RECEIPT = "awaiting-receipt"
    """Idle, not yet pooled: the agent is cleaning up after the run."""
    POOLED = "pooled"
    EXPIRED = "expired"
    """Not pooled: expired for refresh to terminate (never handed a runner, or the agent did not confirm)."""
    MOVED_ON = "moved-on"
    """Someone else moved the instance first (another release, an expiry, another run); nothing to do."""
    SALVAGED = "salvaged"
    """A step failed unexpectedly; what the release held is expired."""
    RETIRED = "retired"
    """Served its last job: expired, not pooled (single use, `reuse.max_jobs`, `reuse.max_age_minutes`)."""
    QUARANTINED = "quarantined"
    """GitHub gave its runner a job of another run or repository: expired, never pooled."""


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReleasePlan(_Step):
    """What one release execution gives back: one instance, every instance the run still holds, or one
    part of them; or, for a run holding more than one execution may give back, the parts to start."""

    run_key: str
    cause: str
    instance_ids: tuple[str, ...]
    parts: tuple[ReleaseRequest, ...] = ()
    """A run's release too large for one execution: each part is given back by an execution of its own,
    and this one gives back nothing itself (`instance_ids` is empty)."""
    runner_id: int | None = None
    """For one instance: the hand-off (GitHub runner) whose job completed; nothing else is released."""
    poll_seconds: int = Field(gt=0, description="the Wait between two looks for the agent's receipt")
    repository: str | None = None
    """The repository of the job that completed (or, quarantining, of the foreign job)."""
    quarantine: bool = False
    suspect: bool = False
    """A job that started on the runner is to be judged, not released: quarantined if foreign, or if it
    is privileged on an instance not handed over single use."""
    privileged: bool = False
    """The job targets an environment: its instance is never pooled (see `privileged_on_shared`)."""
    failed: bool = False
    """The completed job failed: on an instance EC2 was interrupting, a re-run may follow
    (domain/reruns.py)."""


class PartsStarted(_Step):
    """The executions a run's release started for its parts, by name (a retry finds the same ones)."""

    names: tuple[str, ...]


class ReleaseStarter(Protocol):
    """Starts a release execution by the request's name; False when that name already existed."""

    def release(self, request: ReleaseRequest) -> bool: ...


class ReleaseItem(_Step):
    """One instance of a release, as the state machine's Map hands it to the give-back step."""

    instance_id: str
    run_key: str
    poll_seconds: int = Field(gt=0)
    runner_id: int | None = None
    repository: str | None = None
    quarantine: bool = False
    suspect: bool = False
    privileged: bool = False
    failed: bool = False


class ReleaseProgress(_Step):
    """Where one instance's release stands; the state machine loops on AWAITING_RECEIPT."""

    instance_id: str
    run_key: str
    poll_seconds: int = Field(gt=0)
    status: ReleaseStatus
    idle_threshold: Epoch | None = None
    """The threshold of the idle period this release began; a record with another has moved on."""
    deadline: Epoch | None = None
    """When the agent's receipt is overdue."""
    runner: RunnerRemoval | None = None
    reason: str | None = None


class SalvageRequest(_Step):
    """A failed step's input, with the error Step Functions caught."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    run_key: str
    poll_seconds: int = Field(1, gt=0)
    idle_threshold: Epoch | None = None
    error: dict[str, Any] | None = None


def receipt_poll_seconds(timeouts: Timeouts) -> int:
    """The release's poll in whole seconds, as a Wait state takes them."""
    return max(1, math.ceil(timeouts.release_receipt_poll_seconds))


HISTORY_BUDGET_EVENTS = 12_500
"""Half of Step Functions Standard's 25,000 events in one execution's history (Step Functions quotas:
https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html), as for provision
(domain.executions.PROVISION_LIMIT): the other half is margin for retries, which add events too."""
RELEASE_EXECUTION_EVENTS = 40
"""A release execution's events besides its instances': its start and end, Plan, the Choice, the Map's."""
RELEASE_INSTANCE_EVENTS = 20
"""One instance's events besides its receipt checks: its Map iteration, GiveBack, the Choice after it,
Settled, and a Salvage if a step fails."""
RECEIPT_CHECK_EVENTS = 9
"""One look for the agent's receipt: the Wait, CheckReceipt and the Choice after it."""
RELEASE_PART_LIMIT = 100
"""The most instances one release execution gives back, however few checks each may take: its Map's
output (about 400 bytes an instance) stays far under Step Functions' 256 KiB a state."""


def receipt_checks(timeouts: Timeouts) -> int:
    """The most looks for one instance's receipt: every poll until the receipt is overdue, and one more."""
    return math.ceil(timeouts.release_receipt_seconds / receipt_poll_seconds(timeouts)) + 1


def release_part_size(timeouts: Timeouts) -> int:
    """The most instances one release execution gives back, each on its worst path (its agent never
    answers, so it is checked until the receipt is overdue), within HISTORY_BUDGET_EVENTS.

    At the defaults (a receipt within 120 s, looked for every 2 s): 61 checks of 9 events and 20 more,
    569 events an instance, so 21 instances, 11,989 events with the execution's own 40.
    tests/integration/test_quota_bench.py checks the event counts this rests on.
    """
    per_instance = RELEASE_INSTANCE_EVENTS + receipt_checks(timeouts) * RECEIPT_CHECK_EVENTS
    fits = (HISTORY_BUDGET_EVENTS - RELEASE_EXECUTION_EVENTS) // per_instance
    return max(1, min(RELEASE_PART_LIMIT, fits))


def release_parts(
    request: ReleaseRequest, instance_ids: tuple[str, ...], size: int
) -> tuple[ReleaseRequest, ...]:
    """A run's release of `instance_ids` as parts of at most `size` instances, each an execution of its own;
    none when one execution gives them all back.

    Every instance is in exactly one part, in the order given (sorted by the plan), so the same instances
    make the same parts, named the same (ReleaseRequest.execution_name): a retried start finds them.
    """
    if request.instance_id is not None or request.part is not None or len(instance_ids) <= size:
        return ()
    return tuple(
        request.model_copy(update={"part": instance_ids[start : start + size]})
        for start in range(0, len(instance_ids), size)
    )


def ran_a_foreign_job(record: InstanceRecord | None, item: ReleaseItem) -> bool:
    """A completed job that is not of the hand-off its runner was registered for: of another repository
    than the one its instance was handed to (a runner that only that repository's jobs can take: defence
    in depth, never expected), or of another run or another attempt of it. Every attempt of a run has
    the same `pool=` label, so GitHub can give a re-run's job to a runner of an earlier attempt still
    registered; the run key the runner was registered for tells them apart."""
    if item.runner_id is None or record is None or record.runner_id != item.runner_id:
        return False
    if (
        item.repository is not None
        and record.repository is not None
        and record.repository.lower() != item.repository.lower()
    ):
        return True
    if record.runner_run_key is None:
        return False
    registered, ran = _run_attempt(record.runner_run_key), _run_attempt(item.run_key)
    return registered is not None and ran is not None and registered != ran


def privileged_on_shared(record: InstanceRecord | None, item: ReleaseItem) -> bool:
    """A job with an environment that started on a runner whose instance was not handed over single use:
    the instance may hold a reused job's leftovers, and its job the environment's secrets.

    Demand marks a run attempt's pool label privileged from its first job with an environment on, so
    every later provision of that pool label is single use; what it cannot prevent is one race: a job
    of the same pool label dispatched earlier, in another batch, got a reused or poolable instance, and
    GitHub gives that runner to the privileged job, which may take any runner carrying all its labels
    ("Using labels with self-hosted runners"). This is the detector for that race: the instance is
    quarantined (expired, never pooled) and the error log names both."""
    if not item.privileged or item.runner_id is None or record is None or record.runner_id != item.runner_id:
        return False
    return not record.single_use


def _run_attempt(run_key: str) -> tuple[str, int] | None:
    try:
        return RunKey.parse(run_key).run_attempt
    except ValueError:
        return None


def hand_off_to_end(record: InstanceRecord | None, item: ReleaseItem) -> int | None:
    """The runner of a claimed or created instance's hand-off that this job or run release ends, if any.

    Its runner may have taken one of the run's jobs already: a short job can end before its provision's
    Finish sets the instance running, and GitHub may deliver the run's completion
    before that job's, or the two releases may run side by side. Served or not, the instance was handed
    nothing but the run's runner config, so it is cleaned by its agent and pooled like any released
    one. A job's release names the runner it ran on; only that hand-off is ended by it.
    """
    if record is None or record.state not in (InstanceState.CLAIMED, InstanceState.CREATED):
        return None
    if item.runner_id is not None and record.runner_id != item.runner_id:
        return None
    return record.runner_id


def moved(record: InstanceRecord | None) -> str:
    """Where an instance someone else moved stands, for the release's reason."""
    if record is None:
        return "no record"
    held = f" for {record.run_key!r}" if record.run_key else ""
    return f"{record.state}{held}, threshold {record.threshold}"
