"""Pickup (DESIGN.md section 6.2): finding an idle instance for a runner spec in its partition's pool queue.

A pool queue holds one message per idle, vetted instance of one partition (domain/pool_partitions.py:
resource class, usage, architecture), so the spec's hard keys choose the queue and only its soft ones
(type globs, reuse scope, age) and who the instance served (`Taker`, domain/trust.py) are judged here.

Who may take what: a pristine instance (never served) any job; a used one only a job that reuses, of
the level the instance last served and within `reuse.scope` of its repository. A single-use job thus
takes pristine instances only. A job that reuses prefers a used instance of its own over a pristine
one, so that pristine ones stay for single-use jobs, but takes a pristine one rather than none: among
the offers it has read, pickup takes used matches first and pristine ones for what is left. It reads no
further only to find a used one: that would hold the pristine offers in hand out of every concurrent
request's sight (with two batches of look-ahead, three requests of eight begun together over a pool of
24 pristine instances launched some cold: tests/integration/test_one_pickup.py). The claim's condition
checks the same rule against the record, so an offer read from a stale or forged message never crosses
a level.

Pickup receives messages in batches of ten and holds each one it received (SQS's visibility timeout)
while it reads on, so that it never reads its own misfits twice and a sibling claim worker reading the
same queue skips them too. What it takes (the candidate) or drops on purpose (stale, unparseable) it
deletes, with any match beyond the candidate, which it sends again at once as a new message; when it
stops, it releases every misfit it holds (visible again after the requeue delay). A misfit thus costs
a tenth of a ReceiveMessage and a tenth of a ChangeMessageVisibilityBatch, where deleting it and
sending it back cost a third call and could lose it: nothing pickup did not mean to remove ever
leaves the queue, so a pickup that dies (or a release the queue refuses) only hides its misfits until
their hold ends. An offer found in another partition's queue is sent to its own and then deleted
here; one whose send is refused stays here. A duplicated message is harmless: the record check below
drops the extra copy.
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
from runner_pool.domain.trust import TrustLevel, may_follow, reuses

RECEIVE_BATCH = 10
"""SQS hands out at most 10 messages per ReceiveMessage, and takes at most 10 entries per batch call."""


@dataclass(frozen=True)
class Taker:
    """The jobs a pickup finds instances for: whose leftovers they may meet (domain/trust.py)."""

    repository: str
    repository_id: int | None = None
    trust: TrustLevel | None = None
    """None: not known, so single use."""
    single_use: bool = False
    """Set by the provision's plan (domain/provision.py `single_use`) for other reasons besides the level."""

    @property
    def reuses(self) -> bool:
        """Whether these jobs may take a used instance (and leave theirs to the pool)."""
        return not self.single_use and reuses(self.trust)

    def may_take(self, message: PoolMessage, reuse: ReuseSettings | None) -> bool:
        """Whether these jobs may take the instance an offer names, by who it served."""
        if message.pristine:
            return True
        if not (self.reuses and may_follow(message.trust, self.trust, used=True)):
            return False
        return reuse is None or reuse.in_scope(
            message.repository,
            self.repository,
            served_id=message.repository_id,
            repository_id=self.repository_id,
        )


@dataclass(frozen=True)
class ClaimTerms:
    """What a claim of an instance asks of its record and writes to it (adapters/state_table.py `claim`):
    the rule pickup applied to an older read (`Taker.may_take`), now as the write's condition."""

    repository: str | None = None
    """The jobs' repository, which the record then names; None (a claim for no repository's jobs, such
    as an instant tier's) checks no reuse and counts no hand-off."""
    repository_id: int | None = None
    reuse: ReuseSettings | None = None
    single_use: bool = False
    trust: TrustLevel | None = None
    stopped: bool = False
    """Claim a stopped instance of the stopped tier (stopped → claimed) rather than an idle one."""


PLAIN_CLAIM = ClaimTerms()
"""A claim of an idle instance for no repository's jobs: no reuse rule checked, no hand-off counted."""


@dataclass(frozen=True)
class ReceivedMessage:
    """One message as the queue handed it out: the handle to delete it, and its body if it parsed."""

    receipt: str
    message: PoolMessage | None


class PoolQueue(Protocol):
    """The pool queues, one per partition (adapters.pool_queues implements it over SQS)."""

    def receive(self, partition: PoolPartition, hold_seconds: int) -> list[ReceivedMessage]:
        """Up to 10 messages from the partition's queue, each invisible to every reader for
        `hold_seconds` unless deleted or released; an empty list when the queue has none to give."""
        ...

    def release(self, partition: PoolPartition, receipts: Sequence[str], delay_seconds: int) -> list[str]:
        """Let held messages be received again after `delay_seconds`; returns the receipts the queue
        still refused after a retry (those come back when their hold ends)."""
        ...

    def delete(self, partition: PoolPartition, receipts: Sequence[str]) -> list[str]:
        """Delete messages received from the partition's queue; returns the receipts it still refused
        after a retry."""
        ...

    def requeue(
        self, partition: PoolPartition, messages: Sequence[PoolMessage], delay_seconds: int
    ) -> list[PoolMessage]:
        """Send messages to the partition's queue, invisible for `delay_seconds`; returns those the
        queue still refused (pickup moves an offer to its own partition's queue with it)."""
        ...

    def offer(self, message: PoolMessage) -> None:
        """Put an instance that has just become idle into its own partition's queue."""
        ...

    def waiting(self, partition: PoolPartition) -> int:
        """About how many messages the partition's queue holds for readers now (SQS's approximate count)."""
        ...


class RecordReader(Protocol):
    def get(self, instance_id: str) -> InstanceRecord | None:
        """The instance's record, read consistently; None if it has none."""
        ...

    def holds_idle(self, partition: PoolPartition) -> bool:
        """Whether any record of the partition is idle (eventually consistent): no means its queue
        offers nothing pickup could take."""
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
    taker: Taker | None = None,
    reuse: ReuseSettings | None = None,
) -> Verdict:
    """With `taker`: an instance is offered only to jobs that may take it (`Taker.may_take`); with
    `reuse`, not once it is older than `reuse.max_age_minutes`. A used instance whose level no job may
    follow (privileged, or not known) is dropped: its record waits out its idle time and ends."""
    if message.threshold <= now:
        return Verdict.DROP
    if reuse is not None and reuse.too_old(message.created_at, now):
        return Verdict.DROP
    if not message.pristine and not reuses(message.trust):
        return Verdict.DROP
    if taker is not None and not taker.may_take(message, reuse):
        return Verdict.REQUEUE
    return Verdict.MATCH if spec.fits(message) else Verdict.REQUEUE


def still_offered(message: PoolMessage, record: InstanceRecord | None, now: Epoch) -> bool:
    """Whether the record still stands behind the message: idle, unheld, in the same idle period.

    The message carries the record's threshold from when it was sent; a record idle with another
    threshold has been claimed and given back since, and a newer message speaks for it. So has one that
    served since the message was sent (the same threshold can come round under a clock that stood
    still): who the record says it served must be who the message says.
    """
    return (
        record is not None
        and record.state is InstanceState.IDLE
        and record.run_key is None
        and not record.threshold_passed(now)
        and record.threshold == message.threshold
        and record.pristine is message.pristine
        and record.trust is message.trust
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
    """Released to be received again (misfits after the delay, matches beyond the candidate at once), or
    moved to their own partition's queue."""
    dropped_stale: int = 0
    dropped_unparseable: int = 0
    held: int = 0
    """Misfits the queue refused to release: hidden from every reader until their hold ends."""
    undeleted: int = 0
    """Still in the queue after a failed delete, so they will come round again (a harmless duplicate)."""
    skipped_partitions: int = 0
    """Partitions whose queue was not read because no record of theirs was idle."""
    unlooked_partitions: int = 0
    """Partitions whose idle records could not be looked up (the Query failed): their queue was read."""


@dataclass(frozen=True)
class PickupResult:
    candidates: tuple[PoolMessage, ...]
    """As many as were wanted, or fewer: `stopped` says why."""
    stopped: StopReason
    counts: PickupCounts

    @property
    def candidate(self) -> PoolMessage | None:
        return self.candidates[0] if self.candidates else None


SWEEP_BATCHES = 10
"""Batches of ten one sweep of a partition reads at most: a hundred messages a minute is far more than a
partition with no idle instance collects between two refresh runs."""
PICKUP_BUDGET_SECONDS = 8.0
"""How long one pickup reads misfits before it counts the pool as exhausted. Begin makes one for the whole
request; a claim step (after a discard) at most PICKUPS_PER_CLAIM (3), then hands its candidate over,
each inside its Lambda's 30 s timeout
(infra/constructs/provision.py; tests/infra check the two agree). Every instance in the partition
admits the spec's hard keys, so only type, scope and age misfits stand in front of a match, and each
costs a tenth of a call while pickup reads: bench/pickup.py measures it behind 10,000 misfits."""
HOLD_SECONDS = 30
"""How long a received message stays hidden unless pickup deletes or releases it first: the claim step's
Lambda timeout, so a pickup that dies with its Lambda hides what it held no longer than it lived, and
longer than any pickup reads (PICKUP_BUDGET_SECONDS), so a pickup never receives its own misfits again.
SQS takes a visibility timeout of 0 to 43,200 s, and holds up to about 120,000 messages of a standard
queue in flight (Amazon SQS API Reference, ChangeMessageVisibility): a pickup holds what it reads in
8 s, a few thousand at most."""


@dataclass
class _Read:
    """One pickup's messages in hand and its counts."""

    partition: PoolPartition
    counts: Counter[str] = field(default_factory=Counter)
    misfits: list[str] = field(default_factory=list)
    """Receipts of held misfits of this partition, released when pickup stops."""
    reserve: list[ReceivedMessage] = field(default_factory=list)
    """Held pristine matches a job that reuses takes only if it finds too few used ones."""


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
        """`partitions`: the stack's (None: any); an offer whose own partition is not among them is
        held and released where it was found rather than sent to a queue that does not exist."""
        self._queue = queue
        self._records = records
        self._clock = clock
        self._settings = settings
        self._budget_seconds = budget_seconds
        self._reuse = reuse
        self._partitions = None if partitions is None else frozenset(partitions)

    def pickup(self, spec: RunnerSpec, taker: Taker | None = None, wanted: int = 1) -> PickupResult:
        """Find `wanted` idle instances for `spec` (jobs `taker` describes) in the partitions its hard keys
        admit, in their order, or as many as there are and why there are no more. One pickup for a
        whole request: its slots never take offers from each other, and an empty pool is known after
        one look."""
        counts: Counter[str] = Counter()
        deadline = self._clock.now() + self._budget_seconds
        found: list[PoolMessage] = []
        stopped = StopReason.EMPTY
        for partition in PoolPartition.admitting(spec):
            if not self._may_hold_offers(partition, counts):
                counts["skipped_partitions"] += 1
                continue
            read = _Read(partition)
            try:
                reason = self._read(read, spec, taker, deadline, found=found, wanted=wanted)
                found += self._take_reserved(read, wanted - len(found))
                if len(found) >= wanted:
                    reason = StopReason.FOUND
                elif reason is StopReason.FOUND:
                    reason = StopReason.EMPTY  # its pristine matches had moved on: the next partition
            finally:
                # Whatever happened, what this pickup holds goes back before it returns or raises.
                self._release(read, read.misfits, self._settings.requeue_delay_seconds)
                self._release(read, [r.receipt for r in read.reserve], 0)
                read.reserve.clear()
                counts.update(read.counts)
            if reason in (StopReason.FOUND, StopReason.BUDGET):
                return PickupResult(tuple(found), reason, PickupCounts(**counts))
            if reason is StopReason.CYCLED:
                stopped = reason
        return PickupResult(tuple(found), stopped, PickupCounts(**counts))

    def sweep(self, partition: PoolPartition, most_batches: int = SWEEP_BATCHES) -> PickupCounts:
        """Drop what no request can take from the queue of a partition whose records hold no idle
        instance: messages that do not parse, and offers of instances no longer idle. Pickup never reads
        such a queue (`_may_hold_offers`), so without this they would stay until SQS's retention ends,
        counted in the pool's depth. An offer whose record is idle after all (the index lags) is
        released at once. Reads only as many batches as the queue says it holds, `most_batches` at
        most, so an empty queue costs one GetQueueAttributes and no long poll."""
        counts: Counter[str] = Counter()
        if self._records.holds_idle(partition):
            return PickupCounts()  # pickup reads this queue, and drops them itself
        batches = min(most_batches, -(-self._queue.waiting(partition) // RECEIVE_BATCH))
        read = _Read(partition, counts)
        try:
            for _ in range(batches):
                batch = self._queue.receive(partition, HOLD_SECONDS)
                read.counts["receive_calls"] += 1
                if not batch:
                    break
                self._drop_untakeable(read, batch)
        finally:
            self._release(read, read.misfits, 0)
        return PickupCounts(**counts)

    def _drop_untakeable(self, read: _Read, batch: list[ReceivedMessage]) -> None:
        now = self._clock.now()
        remove: list[str] = []
        for received in batch:
            message = received.message
            if message is None:
                read.counts["dropped_unparseable"] += 1
                remove.append(received.receipt)
            elif still_offered(message, self._records.get(message.instance_id), now):
                read.misfits.append(received.receipt)
            else:
                read.counts["dropped_stale"] += 1
                remove.append(received.receipt)
        read.counts["undeleted"] += len(self._queue.delete(read.partition, remove)) if remove else 0

    def _may_hold_offers(self, partition: PoolPartition, counts: Counter[str]) -> bool:
        """False only when the records say no instance of the partition is idle: then reading its queue
        could find nothing to take, and on an empty queue a receive waits out its whole long poll, the
        cold path's longest wait. A failed look reads the queue, as before there was one:
        a transient fault may cost a second, never a warm instance."""
        try:
            return self._records.holds_idle(partition)
        except Exception:
            counts["unlooked_partitions"] += 1
            return True

    def _read(
        self,
        read: _Read,
        spec: RunnerSpec,
        taker: Taker | None,
        deadline: float,
        *,
        found: list[PoolMessage],
        wanted: int,
    ) -> StopReason:
        """Read one partition's queue until `found` (what the whole pickup has) holds `wanted`, an empty
        queue, a cycle or the deadline; or until the pristine matches held in reserve would make up the
        rest (FOUND: the caller takes from the reserve)."""
        seen: Counter[str] = Counter()
        while True:
            batch = self._queue.receive(read.partition, HOLD_SECONDS)
            read.counts["receive_calls"] += 1
            if not batch:
                return StopReason.EMPTY
            read.counts["examined"] += len(batch)
            seen.update(r.message.instance_id for r in batch if r.message is not None)
            found += self._settle(read, spec, taker, batch, wanted - len(found))
            if len(found) + len(read.reserve) >= wanted:
                return StopReason.FOUND
            if seen and max(seen.values()) >= self._settings.same_instance_tolerance:
                return StopReason.CYCLED
            if self._clock.now() >= deadline:
                return StopReason.BUDGET

    def _settle(
        self, read: _Read, spec: RunnerSpec, taker: Taker | None, batch: list[ReceivedMessage], room: int
    ) -> list[PoolMessage]:
        """Judge one received batch: delete what is taken or dropped, release spare matches at once, move
        strays to their own partition, keep misfits held; return the candidates, `room` at most."""
        now = self._clock.now()
        candidates: list[PoolMessage] = []
        remove: list[str] = []
        spare: list[ReceivedMessage] = []
        strays: list[ReceivedMessage] = []
        try:
            for received in batch:
                message = received.message
                if message is None:
                    read.counts["dropped_unparseable"] += 1
                    remove.append(received.receipt)
                    continue
                verdict = judge(message, spec, now, taker, self._reuse)
                if verdict is Verdict.DROP:
                    read.counts["dropped_stale"] += 1
                    remove.append(received.receipt)
                elif verdict is Verdict.REQUEUE:
                    if self._home(message) in (read.partition, None):
                        read.misfits.append(received.receipt)
                    else:
                        strays.append(received)
                elif taker is not None and taker.reuses and message.pristine:
                    read.reserve.append(received)  # looked up only if taken (`_take_reserved`)
                elif len(candidates) >= room:
                    # Not looked up: the caller is waiting, and whoever picks it next checks its record.
                    spare.append(received)
                else:
                    self._take_if_offered(
                        read, received.receipt, message, now, candidates=candidates, remove=remove
                    )
        except Exception:
            # What was judged so far is in hand: the whole batch goes back rather than be decided half.
            read.misfits += [r.receipt for r in batch if r not in read.reserve]
            raise
        remove += self._resend(read, spare)
        self._move_home(read, strays)
        # A message whose delete failed stays held and comes back when its hold ends: a duplicate of
        # the candidate, or a stale one dropped again; either is harmless.
        read.counts["undeleted"] += len(self._queue.delete(read.partition, remove)) if remove else 0
        return candidates

    def _take_reserved(self, read: _Read, room: int) -> list[PoolMessage]:
        """Take up to `room` of the pristine matches held in reserve, those whose record still offers them;
        offer the rest again at once (`_resend`)."""
        now = self._clock.now()
        candidates: list[PoolMessage] = []
        remove: list[str] = []
        spare: list[ReceivedMessage] = []
        reserve, read.reserve = read.reserve, []
        try:
            for received in reserve:
                message = received.message
                if message is None or len(candidates) >= room:
                    spare.append(received)
                else:
                    self._take_if_offered(
                        read, received.receipt, message, now, candidates=candidates, remove=remove
                    )
        except Exception:
            read.reserve = reserve  # nothing deleted yet: all of it goes back, as a batch in `_settle` does
            raise
        remove += self._resend(read, spare)
        read.counts["undeleted"] += len(self._queue.delete(read.partition, remove)) if remove else 0
        return candidates

    def _take_if_offered(
        self,
        read: _Read,
        receipt: str,
        message: PoolMessage,
        now: Epoch,
        *,
        candidates: list[PoolMessage],
        remove: list[str],
    ) -> None:
        """A candidate if its record still offers it, else a stale offer dropped: its message leaves the
        queue either way."""
        if still_offered(message, self._records.get(message.instance_id), now):
            candidates.append(message)
        else:
            read.counts["dropped_stale"] += 1
        remove.append(receipt)

    def _resend(self, read: _Read, spare: list[ReceivedMessage]) -> list[str]:
        """Offer matches beyond the candidate again at once, as new messages; returns the receipts of
        those sent, to delete with the candidate's. Sent rather than released: a sibling claim worker
        long-polling the queue is handed a new message the moment it arrives, which moto does not do
        for a released one; on SQS both cost the one call. One the queue refuses is released instead."""
        messages = [r.message for r in spare if r.message is not None]
        refused = self._queue.requeue(read.partition, messages, 0) if messages else []
        sent = [r.receipt for r in spare if r.message not in refused]
        read.counts["requeued"] += len(sent)
        self._release(read, [r.receipt for r in spare if r.message in refused], 0)
        return sent

    def _home(self, message: PoolMessage) -> PoolPartition | None:
        """The partition an offer belongs in, if the stack has it."""
        own = PoolPartition.of(message)
        return own if self._partitions is None or own in self._partitions else None

    def _move_home(self, read: _Read, strays: list[ReceivedMessage]) -> None:
        """Send each stray to its own partition's queue, then delete it here; one the queue refuses stays
        held here with the misfits, so it is never lost."""
        homes: dict[PoolPartition, list[ReceivedMessage]] = {}
        for received in strays:
            if received.message is not None:
                homes.setdefault(PoolPartition.of(received.message), []).append(received)
        for home, group in sorted(homes.items()):
            refused = self._queue.requeue(home, [r.message for r in group if r.message is not None], 0)
            moved = [r for r in group if r.message not in refused]
            read.misfits += [r.receipt for r in group if r.message in refused]
            read.counts["requeued"] += len(moved)
            if moved:
                undeleted = self._queue.delete(read.partition, [r.receipt for r in moved])
                read.counts["undeleted"] += len(undeleted)

    def _release(self, read: _Read, receipts: list[str], delay_seconds: int) -> None:
        if not receipts:
            return
        refused = self._queue.release(read.partition, receipts, delay_seconds)
        read.counts["requeued"] += len(receipts) - len(refused)
        read.counts["held"] += len(refused)
        receipts.clear()
