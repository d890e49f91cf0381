"""Pickup (DESIGN.md section 6.2): finding an idle instance for a runner spec in its partition's pool queue.

A pool queue holds one message per idle, vetted instance of one partition (domain/pool_partitions.py:
resource class, usage, architecture), so the spec's hard keys choose the queue and only its soft ones
(type globs, reuse scope, age) are judged here. Pickup pulls messages in batches, deletes
each batch with one call (what it puts back goes as new messages, and the candidate must not come
round again), judges them in memory, and sends back whatever it does not use. Every message
received ends in exactly one of four places: returned as the candidate, sent back to the queue,
dropped on purpose (stale or unparseable), or, when the queue refuses it even after a retry,
reported in the result as lost. A lost message wastes an instance (it idles out and refresh
terminates it); it never leaks one. The same holds if the process dies between delete and send.
A duplicated message is harmless: the record check below drops the extra copy. So wherever the
choice is between losing a message and duplicating it, pickup duplicates. What it sends back goes to
the partition of the instance it offers, so an offer that reached the wrong queue finds its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import PickupSettings, ReuseSettings
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import InstanceRecord, PoolMessage

RECEIVE_BATCH = 10
"""SQS hands out at most 10 messages per ReceiveMessage, and takes at most 10 entries per batch call."""


@dataclass(frozen=True)
class ReceivedMessage:
    """One message as the queue handed it out: the handle to delete it, and its body if it parsed."""

    receipt: str
    message: PoolMessage | None


class PoolQueue(Protocol):
    """The pool queues, one per partition (adapters.pool_queues implements it over SQS)."""

    def receive(self, partition: PoolPartition) -> list[ReceivedMessage]:
        """Up to 10 messages from the partition's queue; an empty list when the queue has none to give."""
        ...

    def delete(self, partition: PoolPartition, receipts: Sequence[str]) -> list[str]:
        """Delete messages received from the partition's queue; returns the receipts it still refused
        after a retry."""
        ...

    def requeue(
        self, partition: PoolPartition, messages: Sequence[PoolMessage], delay_seconds: int
    ) -> list[PoolMessage]:
        """Send messages to the partition's queue, invisible for `delay_seconds`; returns those the
        queue still refused."""
        ...

    def offer(self, message: PoolMessage) -> None:
        """Put an instance that has just become idle into its own partition's queue."""
        ...


class RecordReader(Protocol):
    def get(self, instance_id: str) -> InstanceRecord | None:
        """The instance's record, read consistently; None if it has none."""
        ...


class Verdict(StrEnum):
    """What one pool message is to one runner spec, judged from the message alone."""

    MATCH = "match"
    """The instance fits the spec; worth a look at its record."""
    REQUEUE = "requeue"
    """A live offer that does not fit this spec; another request may want it."""
    DROP = "drop"
    """Stale: the idle period the message offers has run out, so no request can use it."""


def judge(
    message: PoolMessage,
    spec: RunnerSpec,
    now: Epoch,
    repository: str | None = None,
    reuse: ReuseSettings | None = None,
) -> Verdict:
    """With `repository` and `reuse`: an instance is offered only to jobs within `reuse.scope` of the
    repository it served, and not once it is older than `reuse.max_age_minutes` (issue 14, item 2)."""
    if message.threshold <= now:
        return Verdict.DROP
    if reuse is not None and reuse.too_old(message.created_at, now):
        return Verdict.DROP
    if reuse is not None and repository is not None and not reuse.in_scope(message.repository, repository):
        return Verdict.REQUEUE
    return Verdict.MATCH if spec.fits(message) else Verdict.REQUEUE


def still_offered(message: PoolMessage, record: InstanceRecord | None, now: Epoch) -> bool:
    """Whether the record still stands behind the message: idle, unheld, in the same idle period.

    The message carries the record's threshold from when it was sent; a record idle with another
    threshold has been claimed and given back since, and a newer message speaks for it.
    """
    return (
        record is not None
        and record.state is InstanceState.IDLE
        and record.run_key is None
        and not record.threshold_passed(now)
        and record.threshold == message.threshold
    )


class StopReason(StrEnum):
    FOUND = "found"
    """A candidate was found."""
    EMPTY = "empty"
    """The queues had nothing (left) to give."""
    CYCLED = "cycled"
    """Some instance came round `same_instance_tolerance` times: the queue holds nothing new for us."""
    BUDGET = "budget"
    """`budget_seconds` spent without a match: a long queue of misfits must not hold a claim step
    past its Lambda's timeout; the claim worker counts the pool as exhausted."""


@dataclass(frozen=True)
class PickupCounts:
    receive_calls: int = 0
    examined: int = 0
    """Every message received, parseable or not."""
    requeued: int = 0
    """Sent back to the queue, with the delay (non-matches) or without (matches beyond the candidate)."""
    dropped_stale: int = 0
    dropped_unparseable: int = 0
    lost: int = 0
    """Deleted but refused by the queue when sent back; wasted until refresh terminates them."""
    undeleted: int = 0
    """Still in the queue after a failed delete, so they will come round again (a harmless duplicate)."""


@dataclass(frozen=True)
class PickupResult:
    candidate: PoolMessage | None
    stopped: StopReason
    counts: PickupCounts
    lost: tuple[PoolMessage, ...] = ()
    """The messages counted in `counts.lost`, for the caller to log."""


@dataclass
class _Tally:
    counts: Counter[str] = field(default_factory=Counter)
    lost_messages: list[PoolMessage] = field(default_factory=list)

    def result(self, candidate: PoolMessage | None, stopped: StopReason) -> PickupResult:
        return PickupResult(candidate, stopped, PickupCounts(**self.counts), tuple(self.lost_messages))


PICKUP_BUDGET_SECONDS = 8.0
"""How long one pickup reads misfits before it counts the pool as exhausted. A claim step makes at most
PICKUPS_PER_CLAIM (3) pickups and then hands its candidate over, inside its Lambda's 30 s timeout
(infra/constructs/provision.py; tests/infra check the two agree). Every instance in the partition
admits the spec's hard keys, so only type, scope and age misfits stand in front of a match: 8 s is
about 2,400 batches at SQS's few milliseconds a call, and bench/pickup.py measures it behind 10,000."""


class PickupManager:
    def __init__(
        self,
        queue: PoolQueue,
        records: RecordReader,
        clock: Clock,
        settings: PickupSettings,
        budget_seconds: float = PICKUP_BUDGET_SECONDS,
        *,
        reuse: ReuseSettings | None = None,
        partitions: Collection[PoolPartition] | None = None,
    ) -> None:
        """`partitions`: the stack's (None: any); an offer whose own partition is not among them goes
        back to the queue it was read from rather than to a queue that does not exist."""
        self._queue = queue
        self._records = records
        self._clock = clock
        self._settings = settings
        self._budget_seconds = budget_seconds
        self._reuse = reuse
        self._partitions = None if partitions is None else frozenset(partitions)

    def pickup(self, spec: RunnerSpec, repository: str | None = None) -> PickupResult:
        """Find one idle instance for `spec` (a job of `repository`) in the partitions its hard keys
        admit, in their order, or say why there is none."""
        tally = _Tally()
        deadline = self._clock.now() + self._budget_seconds
        stopped = StopReason.EMPTY
        for partition in PoolPartition.admitting(spec):
            candidate, reason = self._read(partition, spec, repository, tally, deadline)
            if candidate is not None or reason is StopReason.BUDGET:
                return tally.result(candidate, reason)
            if reason is StopReason.CYCLED:
                stopped = reason
        return tally.result(None, stopped)

    def _read(
        self,
        partition: PoolPartition,
        spec: RunnerSpec,
        repository: str | None,
        tally: _Tally,
        deadline: float,
    ) -> tuple[PoolMessage | None, StopReason]:
        """Read one partition's queue until a match, an empty queue, a cycle or the deadline."""
        seen: Counter[str] = Counter()
        while True:
            batch = self._queue.receive(partition)
            tally.counts["receive_calls"] += 1
            if not batch:
                return None, StopReason.EMPTY
            tally.counts["examined"] += len(batch)
            # A message whose delete failed is used all the same: at worst it comes round again as a
            # duplicate, which the record check drops; skipping it could lose it if the delete had in
            # fact gone through.
            tally.counts["undeleted"] += len(self._queue.delete(partition, [r.receipt for r in batch]))
            messages = [r.message for r in batch if r.message is not None]
            tally.counts["dropped_unparseable"] += len(batch) - len(messages)
            seen.update(message.instance_id for message in messages)
            candidate = self._settle(partition, spec, repository, messages, tally)
            if candidate is not None:
                return candidate, StopReason.FOUND
            if seen and max(seen.values()) >= self._settings.same_instance_tolerance:
                return None, StopReason.CYCLED
            if self._clock.now() >= deadline:
                return None, StopReason.BUDGET

    def _settle(
        self,
        partition: PoolPartition,
        spec: RunnerSpec,
        repository: str | None,
        messages: list[PoolMessage],
        tally: _Tally,
    ) -> PoolMessage | None:
        """Judge one deleted batch, send back what others may use, and return the candidate if any."""
        now = self._clock.now()
        candidate: PoolMessage | None = None
        spare: list[PoolMessage] = []
        misfits: list[PoolMessage] = []
        judged = 0
        try:
            for message in messages:
                verdict = judge(message, spec, now, repository, self._reuse)
                if verdict is Verdict.REQUEUE:
                    misfits.append(message)
                elif verdict is Verdict.DROP:
                    tally.counts["dropped_stale"] += 1
                elif candidate is not None:
                    # Not looked up: the caller is waiting, and whoever picks it next checks its record.
                    spare.append(message)
                elif still_offered(message, self._records.get(message.instance_id), now):
                    candidate = message
                else:
                    tally.counts["dropped_stale"] += 1
                judged += 1
        except Exception as exc:
            # The batch is already deleted: what is in hand goes back before the error propagates.
            in_hand = ([candidate] if candidate else []) + spare + misfits + messages[judged:]
            try:
                self._send_back(partition, in_hand, 0, tally)
            except Exception as requeue_error:
                exc.add_note(
                    f"and sending back what was in hand failed too ({requeue_error}): {_ids(in_hand)}"
                )
            raise
        groups = [(spare, 0), (misfits, self._settings.requeue_delay_seconds)]
        for index, (group, delay_seconds) in enumerate(groups):
            try:
                self._send_back(partition, group, delay_seconds, tally)
            except Exception as exc:
                stranded = ([candidate] if candidate else []) + [m for g, _ in groups[index:] for m in g]
                exc.add_note(
                    f"pool messages deleted and not sent back (wasted until refresh): {_ids(stranded)}"
                )
                raise
        return candidate

    def _send_back(
        self, read_from: PoolPartition, messages: list[PoolMessage], delay_seconds: int, tally: _Tally
    ) -> None:
        """Each message to its own partition's queue: one that was offered to the wrong queue goes home."""
        homes: dict[PoolPartition, list[PoolMessage]] = {}
        for message in messages:
            homes.setdefault(self._home(message, read_from), []).append(message)
        for home, group in sorted(homes.items()):
            refused = self._queue.requeue(home, group, delay_seconds)
            tally.counts["requeued"] += len(group) - len(refused)
            tally.counts["lost"] += len(refused)
            tally.lost_messages.extend(refused)

    def _home(self, message: PoolMessage, read_from: PoolPartition) -> PoolPartition:
        own = PoolPartition.of(message)
        return own if self._partitions is None or own in self._partitions else read_from


def _ids(messages: list[PoolMessage]) -> str:
    return ", ".join(message.instance_id for message in messages) or "none"
