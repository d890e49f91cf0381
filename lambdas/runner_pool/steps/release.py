"""The release state machine's steps (infra/statemachines/release.asl.json), over explicit collaborators.

One instance goes through give back (running, or claimed/created with its runner noted → idle; expired
if it was never handed a runner; or quarantined), then check receipt every poll until the agent confirms
its cleanup or the deadline passes; salvage runs only when a step failed unexpectedly. Each step is a
conditional transition that recognises its own replay, so a retried step never acts twice; a transition
lost to someone else (who moved the instance) ends the instance's release without error. The one effect
that can happen twice is a pool message sent again by a retried check: pickup drops the copy whose
record has moved on (see domain.pickup).
"""

from __future__ import annotations

from collections.abc import Callable

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import ReuseSettings
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.labels import instant_class
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import PoolQueue
from runner_pool.domain.ports import ReleaseRecords
from runner_pool.domain.records import RUN_SIGNALS, InstanceRecord, PoolMessage, Signal
from runner_pool.domain.release import (
    ReleaseItem,
    ReleasePlan,
    ReleaseProgress,
    ReleaseStatus,
    SalvageRequest,
    hand_off_to_end,
    moved,
    privileged_on_shared,
    ran_a_foreign_job,
    receipt_poll_seconds,
    release_part_size,
    release_parts,
)
from runner_pool.domain.runners import GitHubError, RunnerRegistry, RunnerRemoval
from runner_pool.domain.timeouts import Timeouts
from runner_pool.observability import count, logger
from runner_pool.steps.notices import NoticeSource, no_notices, notify
from runner_pool.steps.reruns import Reruns
from runner_pool.steps.spend import Spend


class Release:
    """The pool queues and the runner registry are built on first use: only check receipt offers to a
    queue, and only give back reaches GitHub."""

    def __init__(
        self,
        table: ReleaseRecords,
        queues: Callable[[], PoolQueue],
        registry: Callable[[], RunnerRegistry],
        *,
        clock: Clock,
        timeouts: Timeouts,
        reuse: ReuseSettings | None = None,
        notices: NoticeSource = no_notices,
        instant_runtime_minutes: int = 360,
        reruns: Callable[[], Reruns] | None = None,
        spend: Spend | None = None,
    ) -> None:
        """Without `reuse`, no instance is retired: every one that served is cleaned for the pool.
        `reruns` (built on first use) hears of a job that failed on an instance EC2 was interrupting;
        without it, no such job is re-run. `spend` records each hand-over's cost as it ends.
        `instant_runtime_minutes`: how long an instant tier's job may run from its start (a tier label
        sets no `max-runtime`, so the stack's default)."""
        self._table = table
        self._queues = queues
        self._registry = registry
        self._clock = clock
        self._timeouts = timeouts
        self._reuse = reuse
        self._notices = notices
        self._instant_runtime = instant_runtime_minutes
        self._reruns = reruns
        self._spend = spend

    def plan(self, request: ReleaseRequest) -> ReleasePlan:
        """The instances to give back: the one named, the part named, or every record still holding the run
        key; those split into parts (release_parts) when more than one execution may give back."""
        if request.instance_id is not None:
            instance_ids: tuple[str, ...] = (request.instance_id,)
        elif request.part is not None:
            # The run's release marked the run finished and read what it held: this part gives back its share.
            instance_ids = request.part
        else:
            # Marked before the index is read: a provision for the run that activates after this sees the
            # mark and gives back; one that activated before is found running by the read below.
            self._table.mark_run_finished(request.run_key)
            held = self._table.held_by(request.run_key)
            instance_ids = tuple(sorted(record.instance_id for record in held))
        parts = release_parts(request, instance_ids, release_part_size(self._timeouts))
        return ReleasePlan(
            run_key=request.run_key,
            cause=request.cause,
            instance_ids=() if parts else instance_ids,
            parts=parts,
            runner_id=request.runner_id if request.instance_id is not None else None,
            poll_seconds=receipt_poll_seconds(self._timeouts),
            repository=request.repository,
            quarantine=request.quarantine,
            suspect=request.suspect,
            privileged=request.privileged,
            failed=request.failed,
        )

    def give_back(self, item: ReleaseItem) -> ReleaseProgress:
        """Running, claimed or created → idle (or, never handed a runner, expired), and the run's runner
        deleted from GitHub.

        An instance that must not serve again (single use, at its reuse limits, it served a job with an
        environment, or EC2 is interrupting it) is expired once idle instead of awaiting its receipt; one
        whose runner ran a foreign job, or started a job with an environment without being handed over
        single use, is quarantined.
        """
        now = self._clock.now()
        progress = ReleaseProgress(
            instance_id=item.instance_id,
            run_key=item.run_key,
            poll_seconds=item.poll_seconds,
            status=ReleaseStatus.MOVED_ON,
        )
        record = self._table.get(item.instance_id)
        foreign = item.quarantine or ran_a_foreign_job(record, item)
        if foreign or (item.suspect and privileged_on_shared(record, item)):
            return self._quarantine(item, record, progress, privileged=not foreign)
        if item.suspect:
            # A job that started is judged, never released: its completion releases its hand-off.
            self._instant_job_started(item, record)
            return progress.model_copy(update={"reason": "the job may run on its runner"})
        self._interrupted_failure(item, record)
        released = self._give_back(item, record, now=now, progress=progress)
        if released.status is not ReleaseStatus.AWAITING_RECEIPT or record is None:
            return released
        # What decides (single use, jobs served, launch time) is as the record read above had it: a
        # release changes none of it. A job with an environment leaves nothing to the pool, whatever
        # the record says of the hand-off.
        reason = "it served a job with an environment" if item.privileged else None
        if reason is None and record.interrupted_at is not None:
            reason = "EC2 is interrupting it (domain/interruptions.py)"
        if reason is None and self._reuse is not None:
            reason = self._reuse.retire_reason(record, now)
        if reason is None:
            return released
        retired = self._expire_idle(released, reason)
        if retired.status is ReleaseStatus.EXPIRED:
            return retired.model_copy(update={"status": ReleaseStatus.RETIRED})
        return retired

    def check_receipt(self, progress: ReleaseProgress) -> ReleaseProgress:
        """Pool the instance once the agent confirms it is clean; expire it on failure or when overdue."""
        now = self._clock.now()
        if progress.status is not ReleaseStatus.AWAITING_RECEIPT or progress.deadline is None:
            raise ValueError(f"{progress.instance_id} is not awaiting a receipt: {progress.status}")
        view = self._table.observe(progress.instance_id)
        record = view.record
        if (
            record is None
            or record.state is not InstanceState.IDLE
            or record.run_key is not None
            or record.threshold != progress.idle_threshold
        ):
            return progress.model_copy(update={"status": ReleaseStatus.MOVED_ON, "reason": moved(record)})
        if record.threshold_passed(now):
            return progress.model_copy(
                update={"status": ReleaseStatus.EXPIRED, "reason": "its idle time ran out before the receipt"}
            )
        signal = view.signal
        if signal is not None and signal.confirms(Signal.UD_REMOVE_REG_OK, progress.run_key):
            self._queues().offer(PoolMessage.for_idle(record))
            return progress.model_copy(update={"status": ReleaseStatus.POOLED, "reason": None})
        if signal is not None and signal.confirms(Signal.UD_REMOVE_REG_FAILED, progress.run_key):
            reason = f"the agent could not clean up: {signal.reason or 'no reason'}"
            return self._expire_idle(progress, reason)
        if now >= progress.deadline:
            return self._expire_idle(progress, "no receipt from the agent in time")
        return progress

    def salvage(self, request: SalvageRequest) -> ReleaseProgress:
        """Expire what the release held when a step failed: still running for the run, or released by it."""
        expired = self._table.expire(request.instance_id, run_key=request.run_key)
        current = expired.record
        if (
            not expired.succeeded
            and current is not None
            and current.state is InstanceState.IDLE
            and current.run_key is None
            and (request.idle_threshold is None or current.threshold == request.idle_threshold)
        ):
            expired = self._table.expire(request.instance_id, run_key=None)
        error = request.error or {}
        return ReleaseProgress(
            instance_id=request.instance_id,
            run_key=request.run_key,
            poll_seconds=request.poll_seconds,
            status=ReleaseStatus.SALVAGED if expired.succeeded else ReleaseStatus.MOVED_ON,
            reason=f"{error.get('Error', 'a step failed')}: {error.get('Cause', '')}".strip(": "),
        )

    def _instant_job_started(self, item: ReleaseItem, record: InstanceRecord | None) -> None:
        """An instant tier's runner took its job (domain/instant.py): the job's runtime runs from now, and
        the record names the job's repository. Best effort: the threshold it replaces is the running one,
        set when the runner began to wait (or, when the runner took the job before its provision's Finish,
        the created one, and Finish's activation then restarts the runtime a few seconds later)."""
        if (
            record is None
            or item.runner_id is None
            or item.repository is None
            or record.run_key != item.run_key
            or instant_class(item.run_key) is None
        ):
            return
        started = self._table.job_started(
            item.instance_id, item.run_key, item.runner_id, item.repository, self._instant_runtime
        )
        if not started.succeeded:
            found = moved(started.record)
            logger.info("instant job's start not noted", instance_id=item.instance_id, found=found)

    def _interrupted_failure(self, item: ReleaseItem, record: InstanceRecord | None) -> None:
        """A job that failed on the hand-off of an instance EC2 was interrupting is told to the re-runs
        (steps.reruns), whatever its record's state now (EC2 may have ended it already). Best effort: the
        give back goes on whatever happens; a failure here leaves the job to a person, logged."""
        if (
            self._reruns is None
            or not item.failed
            or item.repository is None
            or record is None
            or record.interrupted_at is None
            or item.runner_id is None
            or record.runner_id != item.runner_id
        ):
            return
        try:
            self._reruns().interrupted(item.repository, item.run_key)
        except Exception:
            logger.exception("interrupted job's failure not taken up for a re-run", run_key=item.run_key)
            count("InterruptedRerunsFailed")

    # --- mechanics -----------------------------------------------------------------------------

    def _quarantine(
        self,
        item: ReleaseItem,
        record: InstanceRecord | None,
        progress: ReleaseProgress,
        *,
        privileged: bool = False,
    ) -> ReleaseProgress:
        """Quarantine the instance whose hand-off to `item.runner_id` GitHub gave a foreign job, or a job
        with an environment while it was not handed over single use (`privileged`); log both. Its agent
        is told at once: it stops the runner (and the job) as soon as it reads its record, and leaves the
        instance for refresh to terminate."""
        if item.runner_id is None or record is None:
            return progress.model_copy(update={"reason": moved(record)})
        quarantined = self._table.quarantine(item.instance_id, item.runner_id)
        if not quarantined.succeeded:
            return progress.model_copy(update={"reason": moved(quarantined.record)})
        notify(self._notices, item.instance_id)
        what = (
            "GitHub gave a job with an environment to a runner not handed over single use"
            if privileged
            else "GitHub gave it a job of another run or repository"
        )
        logger.error(
            f"runner quarantined: {what}",
            instance_id=item.instance_id,
            runner_id=item.runner_id,
            instance_run_key=record.run_key or record.runner_run_key,
            instance_repository=record.repository,
            job_run_key=item.run_key,
            job_repository=item.repository,
        )
        reason = (
            f"runner {item.runner_id} of {record.repository or 'no repository'} "
            f"({record.run_key or record.runner_run_key or 'idle'}) ran a "
            f"{'privileged ' if privileged else ''}job of {item.repository} ({item.run_key})"
        )
        return progress.model_copy(update={"status": ReleaseStatus.QUARANTINED, "reason": reason})

    def _give_back(
        self, item: ReleaseItem, record: InstanceRecord | None, *, now: Epoch, progress: ReleaseProgress
    ) -> ReleaseProgress:
        if item.runner_id is not None and (record is None or record.runner_id != item.runner_id):
            # A job's completion releases the hand-off it ran on, and no other: a late or repeated one
            # finds the instance taken again (by the same run, for its next job) under another runner.
            held = "no runner" if record is None or record.runner_id is None else f"runner {record.runner_id}"
            reason = f"{moved(record)}, with {held}, not runner {item.runner_id}"
            return progress.model_copy(update={"reason": reason})
        runner = hand_off_to_end(record, item)
        if runner is not None:
            ended = self._table.release_served(item.instance_id, item.run_key, runner)
            if ended.succeeded and ended.record is not None:
                return self._awaiting_receipt(progress, ended.record)
            record = ended.record
        if record is not None and record.state in (InstanceState.CLAIMED, InstanceState.CREATED):
            # Never handed a runner config (none is stored before its runner is noted), or its hand-off was
            # ended by someone else meanwhile: nothing of the run's reached it that needs cleaning here.
            expired = self._table.expire(item.instance_id, run_key=item.run_key)
            if not expired.succeeded:
                return progress.model_copy(update={"reason": moved(expired.record)})
            return progress.model_copy(
                update={
                    "status": ReleaseStatus.EXPIRED,
                    "runner": self._delete_runner(record),
                    "reason": f"{record.state} for the run, never handed a runner",
                }
            )
        released, found = self._released(item, record, now)
        if released is None:
            return progress.model_copy(update={"reason": moved(found)})
        return self._awaiting_receipt(progress, released)

    def _awaiting_receipt(self, progress: ReleaseProgress, released: InstanceRecord) -> ReleaseProgress:
        if self._spend is not None:
            self._spend.hand_over_ended(released)
        # The agent stops its runner and cleans up as soon as it reads its record: now, not at its watch.
        notify(self._notices, released.instance_id)
        return progress.model_copy(
            update={
                "status": ReleaseStatus.AWAITING_RECEIPT,
                "idle_threshold": released.threshold,
                "deadline": released.updated_at + self._timeouts.release_receipt_seconds,
                "runner": self._delete_runner(released),
            }
        )

    def _expire_idle(self, progress: ReleaseProgress, reason: str) -> ReleaseProgress:
        expired = self._table.expire(progress.instance_id, run_key=None)
        if not expired.succeeded:
            return progress.model_copy(
                update={"status": ReleaseStatus.MOVED_ON, "reason": moved(expired.record)}
            )
        return progress.model_copy(update={"status": ReleaseStatus.EXPIRED, "reason": reason})

    def _released(
        self, item: ReleaseItem, record: InstanceRecord | None, now: Epoch
    ) -> tuple[InstanceRecord | None, InstanceRecord | None]:
        """The idle record this release made (now, or in an earlier attempt), or None; and the record as
        found."""
        if record is None:
            return None, None
        if record.state is InstanceState.RUNNING:
            result = self._table.release(item.instance_id, item.run_key, runner_id=item.runner_id)
            return (result.record if result.succeeded else None), result.record
        if record.state is InstanceState.IDLE and self._last_served(record, item.run_key, now):
            # This step's own earlier attempt (a retry), or a twin release of the same run: the agent's
            # latest word is about this run. An idle record with any other story is another idle period.
            return record, record
        return None, record

    def _last_served(self, record: InstanceRecord, run_key: str, now: Epoch) -> bool:
        if record.run_key is not None or record.threshold_passed(now):
            return False
        signal = self._table.read_signal(record.instance_id)
        return signal is not None and signal.signal in RUN_SIGNALS and signal.run_key == run_key

    def _delete_runner(self, record: InstanceRecord) -> RunnerRemoval | None:
        """Best effort: a runner left behind while GitHub is unavailable is deleted by refresh later.

        A runner that took its job is already gone (GitHub removes a JIT runner after its one job); one
        still busy is left for GitHub to remove when its job ends.
        """
        if record.runner_id is None:
            return None
        try:
            return self._registry().delete_runner(record.runner_id, record.repository)
        except GitHubError as exc:
            logger.warning(
                "runner not deleted; refresh deletes it later", runner_id=record.runner_id, error=str(exc)
            )
            return None
