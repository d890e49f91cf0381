"""Release (DESIGN.md section 7): what a finished job or run gives back, and the wait for the agent's receipt.

One instance goes through three steps of the release state machine:

1. give back: running → idle with the run key cleared (a claimed or created instance the run still
   holds is expired instead: it never served, and a provision still in flight then loses its
   activate and cleans up), and the run's runner is deleted from GitHub if it never took a job;
2. check receipt, every poll until the deadline: once the agent has written `UD_REMOVE_REG_OK`
   for the run key, the instance's pool message (with the idle threshold) goes to its class queue;
   `UD_REMOVE_REG_FAILED`, or no receipt in time, expires it instead;
3. salvage, only when a step failed unexpectedly: expire what the execution took into its hands.

Each step is a conditional transition that recognises its own replay, so a retried step never
acts twice; a transition lost to someone else (who moved the instance) ends the instance's
release without error. The one effect that can happen twice is a pool message sent again by a
retried check: pickup drops the copy whose record has moved on (see domain.pickup).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.adapters.github_app import GitHubError, RunnerRemoval
from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import ReuseSettings, Timeouts
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import PoolQueue
from runner_pool.domain.records import InstanceRecord, PoolMessage, Signal
from runner_pool.observability import logger

if TYPE_CHECKING:
    from runner_pool.adapters.github_app import GitHubApp
    from runner_pool.adapters.state_table import StateTable

RUN_SIGNALS = frozenset(
    {Signal.UD_REG_OK, Signal.UD_REG_FAILED, Signal.UD_REMOVE_REG_OK, Signal.UD_REMOVE_REG_FAILED}
)
"""Signals the agent writes about one run key: registering its runner, and cleaning up after it."""


class ReleaseStatus(StrEnum):
    AWAITING_RECEIPT = "awaiting-receipt"
    """Idle, not yet pooled: the agent is cleaning up after the run."""
    POOLED = "pooled"
    EXPIRED = "expired"
    """Not pooled: expired for refresh to terminate (it never served, or the agent did not confirm)."""
    MOVED_ON = "moved-on"
    """Someone else moved the instance first (another release, an expiry, another run); nothing to do."""
    SALVAGED = "salvaged"
    """A step failed unexpectedly; what the release held is expired."""
    RETIRED = "retired"
    """Served its last job: expired, not pooled (single use, `reuse.max_jobs`, `reuse.max_age_minutes`)."""
    QUARANTINED = "quarantined"
    """GitHub gave its runner a job of another run or repository: expired, never pooled (issue 14)."""


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReleasePlan(_Step):
    """What one release execution gives back: one instance, or every instance the run still holds."""

    run_key: str
    cause: str
    instance_ids: tuple[str, ...]
    runner_id: int | None = None
    """For one instance: the hand-off (GitHub runner) whose job completed; nothing else is released."""
    poll_seconds: int = Field(gt=0, description="the Wait between two looks for the agent's receipt")
    repository: str | None = None
    """The repository of the job that completed (or, quarantining, of the foreign job)."""
    quarantine: bool = False


class ReleaseItem(_Step):
    """One instance of a release, as the state machine's Map hands it to the give-back step."""

    instance_id: str
    run_key: str
    poll_seconds: int = Field(gt=0)
    runner_id: int | None = None
    repository: str | None = None
    quarantine: bool = False


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
    """The agent reports at its heartbeat's pace, so looking more often than that finds nothing new."""
    return max(1, math.ceil(timeouts.heartbeat_period_seconds))


def plan(request: ReleaseRequest, table: StateTable, timeouts: Timeouts) -> ReleasePlan:
    """The instances to give back: the one named, or every record still holding the run key."""
    if request.instance_id is not None:
        instance_ids: tuple[str, ...] = (request.instance_id,)
    else:
        # Marked before the index is read: a provision for the run that activates after this sees the
        # mark and gives back; one that activated before is found running by the read below.
        table.mark_run_finished(request.run_key)
        instance_ids = tuple(sorted(record.instance_id for record in table.held_by(request.run_key)))
    return ReleasePlan(
        run_key=request.run_key,
        cause=request.cause,
        instance_ids=instance_ids,
        runner_id=request.runner_id if request.instance_id is not None else None,
        poll_seconds=receipt_poll_seconds(timeouts),
        repository=request.repository,
        quarantine=request.quarantine,
    )


def give_back(
    item: ReleaseItem,
    table: StateTable,
    github: Callable[[], GitHubApp],
    timeouts: Timeouts,
    now: Epoch,
    *,
    reuse: ReuseSettings | None = None,
) -> ReleaseProgress:
    """Running → idle (or, never having served, expired), and the run's runner deleted from GitHub.

    An instance that must not serve again (`reuse`: single use, or at its limits) is expired once
    idle instead of awaiting its receipt; one whose runner ran a foreign job is quarantined.
    """
    progress = ReleaseProgress(
        instance_id=item.instance_id,
        run_key=item.run_key,
        poll_seconds=item.poll_seconds,
        status=ReleaseStatus.MOVED_ON,
    )
    record = table.get(item.instance_id)
    if item.quarantine or _of_another_repository(record, item):
        return _quarantine(item, record, table, progress)
    released = _give_back(item, record, table, github, timeouts, now=now, progress=progress)
    # What decides (single use, jobs served, launch time) is as the record read above had it: a
    # release changes none of it.
    reason = (
        reuse.retire_reason(record, now)
        if reuse is not None and record is not None and released.status is ReleaseStatus.AWAITING_RECEIPT
        else None
    )
    if reason is None:
        return released
    retired = _expire_idle(released, table, reason)
    if retired.status is ReleaseStatus.EXPIRED:
        return retired.model_copy(update={"status": ReleaseStatus.RETIRED})
    return retired


def _of_another_repository(record: InstanceRecord | None, item: ReleaseItem) -> bool:
    """A completed job of a repository other than the one its instance was handed to (a runner that
    only that repository's jobs can take: defence in depth, never expected)."""
    return (
        item.runner_id is not None
        and item.repository is not None
        and record is not None
        and record.runner_id == item.runner_id
        and record.repository is not None
        and record.repository.lower() != item.repository.lower()
    )


def _quarantine(
    item: ReleaseItem, record: InstanceRecord | None, table: StateTable, progress: ReleaseProgress
) -> ReleaseProgress:
    """Expire the instance whose hand-off to `item.runner_id` GitHub gave a foreign job; log both runs."""
    if item.runner_id is None or record is None:
        return progress.model_copy(update={"reason": _moved(record)})
    quarantined = table.quarantine(item.instance_id, item.runner_id)
    if not quarantined.succeeded:
        return progress.model_copy(update={"reason": _moved(quarantined.record)})
    logger.error(
        "runner quarantined: GitHub gave it a job of another run or repository",
        instance_id=item.instance_id,
        runner_id=item.runner_id,
        instance_run_key=record.run_key,
        instance_repository=record.repository,
        job_run_key=item.run_key,
        job_repository=item.repository,
    )
    reason = (
        f"runner {item.runner_id} of {record.repository or 'no repository'} "
        f"({record.run_key or 'idle'}) ran a job of {item.repository} ({item.run_key})"
    )
    return progress.model_copy(update={"status": ReleaseStatus.QUARANTINED, "reason": reason})


def _give_back(
    item: ReleaseItem,
    record: InstanceRecord | None,
    table: StateTable,
    github: Callable[[], GitHubApp],
    timeouts: Timeouts,
    *,
    now: Epoch,
    progress: ReleaseProgress,
) -> ReleaseProgress:
    if item.runner_id is not None and (record is None or record.runner_id != item.runner_id):
        # A job's completion releases the hand-off it ran on, and no other: a late or repeated one
        # finds the instance taken again (by the same run, for its next job) under another runner.
        held = "no runner" if record is None or record.runner_id is None else f"runner {record.runner_id}"
        reason = f"{_moved(record)}, with {held}, not runner {item.runner_id}"
        return progress.model_copy(update={"reason": reason})
    if _served_before_running(record, item):
        # A short job ended before its provision set the instance running (issue 13, fix 6): the
        # instance served, so it is cleaned and pooled like any other; Finish then loses its activate.
        served = table.release_served(item.instance_id, item.run_key, item.runner_id or 0)
        if served.succeeded and served.record is not None:
            return progress.model_copy(
                update={
                    "status": ReleaseStatus.AWAITING_RECEIPT,
                    "idle_threshold": served.record.threshold,
                    "deadline": served.record.updated_at + timeouts.release_receipt_seconds,
                    "runner": _delete_runner(github, served.record),
                }
            )
        record = served.record
    if record is not None and record.state in (InstanceState.CLAIMED, InstanceState.CREATED):
        expired = table.expire(item.instance_id, run_key=item.run_key)
        if not expired.succeeded:
            return progress.model_copy(update={"reason": _moved(expired.record)})
        return progress.model_copy(
            update={
                "status": ReleaseStatus.EXPIRED,
                "runner": _delete_runner(github, record),
                "reason": f"{record.state} for the run, never served",
            }
        )
    released, found = _released(item, record, table, now)
    if released is None:
        return progress.model_copy(update={"reason": _moved(found)})
    return progress.model_copy(
        update={
            "status": ReleaseStatus.AWAITING_RECEIPT,
            "idle_threshold": released.threshold,
            "deadline": released.updated_at + timeouts.release_receipt_seconds,
            "runner": _delete_runner(github, released),
        }
    )


def check_receipt(
    progress: ReleaseProgress, table: StateTable, queues: PoolQueue, now: Epoch
) -> ReleaseProgress:
    """Pool the instance once the agent confirms it is clean; expire it on failure or when overdue."""
    if progress.status is not ReleaseStatus.AWAITING_RECEIPT or progress.deadline is None:
        raise ValueError(f"{progress.instance_id} is not awaiting a receipt: {progress.status}")
    view = table.observe(progress.instance_id)
    record = view.record
    if (
        record is None
        or record.state is not InstanceState.IDLE
        or record.run_key is not None
        or record.threshold != progress.idle_threshold
    ):
        return progress.model_copy(update={"status": ReleaseStatus.MOVED_ON, "reason": _moved(record)})
    if record.threshold_passed(now):
        return progress.model_copy(
            update={"status": ReleaseStatus.EXPIRED, "reason": "its idle time ran out before the receipt"}
        )
    signal = view.signal
    if signal is not None and signal.confirms(Signal.UD_REMOVE_REG_OK, progress.run_key):
        queues.offer(PoolMessage.for_idle(record))
        return progress.model_copy(update={"status": ReleaseStatus.POOLED, "reason": None})
    if signal is not None and signal.confirms(Signal.UD_REMOVE_REG_FAILED, progress.run_key):
        return _expire_idle(progress, table, f"the agent could not clean up: {signal.reason or 'no reason'}")
    if now >= progress.deadline:
        return _expire_idle(progress, table, "no receipt from the agent in time")
    return progress


def salvage(request: SalvageRequest, table: StateTable) -> ReleaseProgress:
    """Expire what the release held when a step failed: still running for the run, or released by it."""
    expired = table.expire(request.instance_id, run_key=request.run_key)
    current = expired.record
    if (
        not expired.succeeded
        and current is not None
        and current.state is InstanceState.IDLE
        and current.run_key is None
        and (request.idle_threshold is None or current.threshold == request.idle_threshold)
    ):
        expired = table.expire(request.instance_id, run_key=None)
    error = request.error or {}
    return ReleaseProgress(
        instance_id=request.instance_id,
        run_key=request.run_key,
        poll_seconds=request.poll_seconds,
        status=ReleaseStatus.SALVAGED if expired.succeeded else ReleaseStatus.MOVED_ON,
        reason=f"{error.get('Error', 'a step failed')}: {error.get('Cause', '')}".strip(": "),
    )


def _expire_idle(progress: ReleaseProgress, table: StateTable, reason: str) -> ReleaseProgress:
    expired = table.expire(progress.instance_id, run_key=None)
    if not expired.succeeded:
        return progress.model_copy(
            update={"status": ReleaseStatus.MOVED_ON, "reason": _moved(expired.record)}
        )
    return progress.model_copy(update={"status": ReleaseStatus.EXPIRED, "reason": reason})


def _released(
    item: ReleaseItem, record: InstanceRecord | None, table: StateTable, now: Epoch
) -> tuple[InstanceRecord | None, InstanceRecord | None]:
    """The idle record this release made (now, or in an earlier attempt), or None; and the record as found."""
    if record is None:
        return None, None
    if record.state is InstanceState.RUNNING:
        result = table.release(item.instance_id, item.run_key, runner_id=item.runner_id)
        return (result.record if result.succeeded else None), result.record
    if record.state is InstanceState.IDLE and _last_served(table, record, item.run_key, now):
        # This step's own earlier attempt (a retry), or a twin release of the same run: the agent's
        # latest word is about this run. An idle record with any other story is another idle period.
        return record, record
    return None, record


def _served_before_running(record: InstanceRecord | None, item: ReleaseItem) -> bool:
    """A claimed or created instance whose current hand-off's runner is the one the completed job names."""
    return (
        record is not None
        and record.state in (InstanceState.CLAIMED, InstanceState.CREATED)
        and item.runner_id is not None
        and record.runner_id == item.runner_id
    )


def _last_served(table: StateTable, record: InstanceRecord, run_key: str, now: Epoch) -> bool:
    if record.run_key is not None or record.threshold_passed(now):
        return False
    signal = table.read_signal(record.instance_id)
    return signal is not None and signal.signal in RUN_SIGNALS and signal.run_key == run_key


def _delete_runner(github: Callable[[], GitHubApp], record: InstanceRecord) -> RunnerRemoval | None:
    """Best effort: a runner left behind while GitHub is unavailable is deleted by refresh later.

    A runner that took its job is already gone (GitHub removes a JIT runner after its one job); one
    still busy is left for GitHub to remove when its job ends.
    """
    if record.runner_id is None:
        return None
    try:
        return github().delete_runner(record.runner_id, record.repository)
    except GitHubError as exc:
        logger.warning(
            "runner not deleted; refresh deletes it later", runner_id=record.runner_id, error=str(exc)
        )
        return None


def _moved(record: InstanceRecord | None) -> str:
    if record is None:
        return "no record"
    held = f" for {record.run_key!r}" if record.run_key else ""
    return f"{record.state}{held}, threshold {record.threshold}"
