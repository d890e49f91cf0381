"""The pickup manager against moto's SQS and the state table: batches, filters, staleness, exhaustion."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from runner_pool.adapters.pool_queues import PoolQueues
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import PickupSettings, StackConfig
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.pickup import (
    HOLD_SECONDS,
    PickupManager,
    PickupResult,
    ReceivedMessage,
    RecordReader,
    StopReason,
    Taker,
)
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Arch, InstanceRecord, PoolMessage, UsageClass
from runner_pool.domain.trust import TrustLevel
from tests.support.builders import facts

SPOT = {"usage_class": UsageClass.SPOT}
OTHER_TYPE = {"instance_type": "m7i.large"}
"""A misfit for the spec below that shares its partition: only an instance's type can be, since the
partition's queue holds nothing of another class, usage or architecture."""
LARGE = PoolPartition("large", UsageClass.SPOT, Arch.X64)
LARGE_ON_DEMAND = PoolPartition("large", UsageClass.ON_DEMAND, Arch.X64)


@dataclass
class Pool:
    """The large spot x64 partition's pool queue and the state table behind it, as a test sets them up."""

    sqs: Any
    url: str
    queues: PoolQueues
    records: StateTable
    clock: ManualClock

    def add_idle(self, number: int, **overrides: Any) -> PoolMessage:
        """An instance launched for the warm pool, admitted idle, and offered in its class's queue."""
        launched = facts(number, **overrides)
        self.records.create(launched, run_key=None)
        admitted = self.records.admit(launched.instance_id).record
        assert admitted is not None
        message = PoolMessage.for_idle(admitted)
        self.queues.offer(message)
        return message

    def add_used(self, number: int, trust: TrustLevel, repository: str = "octo/app") -> PoolMessage:
        """An instance that served one job of `repository` at `trust`, released idle and offered."""
        run_key = f"pool={number}"
        self.records.create(facts(number), run_key, repository=repository, trust=trust)
        self.records.activate(facts(number).instance_id, run_key, 60)
        released = self.records.release(facts(number).instance_id, run_key).record
        assert released is not None
        message = PoolMessage.for_idle(released)
        self.queues.offer(message)
        return message

    def picker(
        self,
        records: RecordReader | None = None,
        partitions: Sequence[PoolPartition] | None = None,
        **settings: int,
    ) -> PickupManager:
        return PickupManager(
            self.queues,
            records or self.records,
            self.clock,
            PickupSettings(**settings),
            partitions=partitions,
        )

    def depth(self) -> dict[str, int]:
        attributes = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["All"])["Attributes"]
        return {
            "visible": int(attributes["ApproximateNumberOfMessages"]),
            "delayed": int(attributes["ApproximateNumberOfMessagesDelayed"]),
            "in_flight": int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        }

    def visible(self, partition: PoolPartition = LARGE) -> list[PoolMessage | None]:
        """What a receive gets right now (at most ten), made visible again at once."""
        return [received.message for received in self.queues.receive(partition, 0)]


@pytest.fixture
def pool(
    sqs: Any, pool_queue_url_prefix: str, state_table: StateTable, clock: ManualClock, config: StackConfig
) -> Pool:
    # No long poll: moto holds every message in one place, and an empty moto queue really waits.
    queues = PoolQueues(pool_queue_url_prefix, config.resource_classes, sqs, wait_seconds=0)
    return Pool(sqs, LARGE.queue_name(pool_queue_url_prefix), queues, state_table, clock)


@pytest.fixture
def spec(config: StackConfig) -> RunnerSpec:
    return config.spec_for("pool=7/usage=spot/types=c7*")


def instance_ids(messages: Sequence[PoolMessage | None]) -> list[str]:
    return sorted(message.instance_id for message in messages if message is not None)


def test_the_matching_instance_is_found_among_non_matches(pool: Pool, spec: RunnerSpec) -> None:
    # Given five m7i instances and one c7i instance in the pool, the spot one offered last
    for number in range(1, 6):
        pool.add_idle(number, **OTHER_TYPE)
    wanted = pool.add_idle(6, **SPOT)
    # When a c7i runner is picked up
    result = pool.picker().pickup(spec)
    # Then the c7i instance is the candidate, and the five others went back
    assert result.stopped is StopReason.FOUND
    assert result.candidate == wanted
    assert (result.counts.examined, result.counts.requeued) == (6, 5)


def test_non_matches_go_back_with_the_delay_and_stay_in_the_queue(pool: Pool, spec: RunnerSpec) -> None:
    # Given five m7i instances in the pool, and a requeue delay long enough to observe
    for number in range(1, 6):
        pool.add_idle(number, **OTHER_TYPE)
    # When a c7i runner is picked up
    result = pool.picker(requeue_delay_seconds=60).pickup(spec)
    # Then none was taken, and all five are still in the queue (never deleted), hidden for the delay
    assert result.candidate is None
    assert result.stopped is StopReason.EMPTY
    assert result.counts.requeued == 5
    assert pool.depth() == {"visible": 0, "delayed": 0, "in_flight": 5}


def test_a_message_whose_threshold_passed_is_dropped_and_counted(
    pool: Pool, spec: RunnerSpec, config: StackConfig
) -> None:
    # Given a pooled instance whose idle time has run out
    pool.add_idle(1, **SPOT)
    pool.clock.advance(config.timeouts.idle_seconds + 1)
    # When a runner is picked up (its record still idle, though its time ran out)
    result = pool.picker().pickup(spec)
    # Then the stale message is dropped, counted, and gone from the queue
    assert result.candidate is None
    assert result.counts.dropped_stale == 1
    assert pool.depth() == {"visible": 0, "delayed": 0, "in_flight": 0}


def test_a_message_for_an_instance_claimed_meanwhile_is_dropped(pool: Pool, spec: RunnerSpec) -> None:
    # Given a pooled instance that another run has claimed while its message sat in the queue
    offered = pool.add_idle(1, **SPOT)
    assert pool.records.claim(offered.instance_id, "pool=99", "claim-99").succeeded
    # When a runner is picked up while another instance of the partition is idle (else the queue is
    # not read at all: test_a_partition_with_no_idle_record_is_known_empty_without_a_receive)
    result = pool.picker(_SomeIdle(pool.records)).pickup(spec)
    # Then the message is stale: dropped and counted, not handed out
    assert result.candidate is None
    assert result.counts.dropped_stale == 1


def test_a_message_from_an_earlier_idle_period_is_dropped_for_the_current_one(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given an instance offered, claimed, and given back idle later with a new threshold and message,
    # while its first message was still in the queue
    earlier = pool.add_idle(1, **SPOT)
    assert pool.records.claim(earlier.instance_id, "pool=99", "claim-99").succeeded
    pool.clock.advance(30)
    given_back = pool.records.unclaim(earlier.instance_id, "pool=99", "claim-99").record
    assert given_back is not None
    current = PoolMessage.for_idle(given_back)
    pool.queues.offer(current)
    # When a runner is picked up
    result = pool.picker().pickup(spec)
    # Then the earlier message is dropped as stale and the current one is the candidate
    assert current.threshold != earlier.threshold
    assert result.candidate == current
    assert result.counts.dropped_stale == 1


def test_a_message_for_an_instance_without_a_record_is_dropped(pool: Pool, spec: RunnerSpec) -> None:
    # Given a message whose instance has no record at all (its record expired by TTL, say)
    pool.queues.offer(PoolMessage(**facts(1).model_dump(), threshold=pool.clock.now() + 300, pristine=True))
    # When a runner is picked up while another instance of the partition is idle
    result = pool.picker(_SomeIdle(pool.records)).pickup(spec)
    # Then it is dropped as stale
    assert result.candidate is None
    assert result.counts.dropped_stale == 1


def test_an_unparseable_message_is_dropped_and_counted(pool: Pool, spec: RunnerSpec) -> None:
    # Given a body that is no pool message, ahead of a good one
    pool.sqs.send_message(QueueUrl=pool.url, MessageBody='{"instance_id": "i-1"}')
    wanted = pool.add_idle(1, **SPOT)
    # When a runner is picked up
    result = pool.picker().pickup(spec)
    # Then the good one is found and the bad one is dropped and counted, not sent round again
    assert result.candidate == wanted
    assert result.counts.dropped_unparseable == 1
    assert result.counts.requeued == 0


def test_an_empty_queue_exhausts_the_request_at_once(pool: Pool, spec: RunnerSpec) -> None:
    # Given an empty queue, though the records say an instance of its partition is idle (its offer
    # in another pickup's hands, say)
    # When a runner is picked up
    result = pool.picker(_SomeIdle(pool.records)).pickup(spec)
    # Then pickup stops after one receive, with nothing examined
    assert result.candidate is None
    assert result.stopped is StopReason.EMPTY
    assert (result.counts.receive_calls, result.counts.examined) == (1, 0)


def test_a_pickup_never_reads_its_own_misfits_twice(pool: Pool, spec: RunnerSpec) -> None:
    # Given one m7i instance, released without delay when pickup stops
    pool.add_idle(1, **OTHER_TYPE)
    # When a c7i runner is picked up
    result = pool.picker(requeue_delay_seconds=0).pickup(spec)
    # Then pickup held it while it read on, found the queue empty at the next receive, and left it
    # visible in the queue for others
    assert result.stopped is StopReason.EMPTY
    assert (result.counts.receive_calls, result.counts.examined, result.counts.requeued) == (2, 1, 1)
    assert pool.depth()["visible"] == 1


def test_the_request_is_exhausted_once_the_same_instance_came_round_five_times(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given one m7i instance offered five times over (duplicates, as a retried release may leave)
    offered = pool.add_idle(1, **OTHER_TYPE)
    for _ in range(4):
        pool.queues.offer(offered)
    # When a c7i runner is picked up
    result = pool.picker().pickup(spec)
    # Then pickup gives up once it has seen the instance the fifth time, and leaves every copy
    assert result.stopped is StopReason.CYCLED
    assert (result.counts.examined, result.counts.requeued) == (5, 5)
    assert pool.depth()["visible"] == 5


def test_the_tolerance_comes_from_the_settings(pool: Pool, spec: RunnerSpec) -> None:
    # Given one non-matching instance offered twice, and a tolerance of 2
    offered = pool.add_idle(1, **OTHER_TYPE)
    pool.queues.offer(offered)
    # When a runner is picked up
    result = pool.picker(same_instance_tolerance=2).pickup(spec)
    # Then pickup gives up at the second sighting
    assert result.stopped is StopReason.CYCLED


def test_matches_beyond_the_candidate_go_back_without_delay(pool: Pool, spec: RunnerSpec) -> None:
    # Given three matching instances in the pool
    offered = [pool.add_idle(number, **SPOT) for number in (1, 2, 3)]
    # When a runner is picked up, with the non-match delay set long
    result = pool.picker(requeue_delay_seconds=60).pickup(spec)
    # Then one is the candidate, and the other two can be received again at once
    assert result.candidate is not None
    assert instance_ids([*pool.visible(), result.candidate]) == instance_ids(offered)


class _CountingRecords:
    def __init__(self, records: StateTable) -> None:
        self._records = records
        self.reads: list[str] = []

    def get(self, instance_id: str) -> InstanceRecord | None:
        self.reads.append(instance_id)
        return self._records.get(instance_id)

    def holds_idle(self, partition: PoolPartition) -> bool:
        return self._records.holds_idle(partition)


class _SomeIdle(_CountingRecords):
    """The records, but for by-idle, which says some instance of every partition is idle."""

    def holds_idle(self, partition: PoolPartition) -> bool:
        return True


def test_only_the_candidates_record_is_read(pool: Pool, spec: RunnerSpec) -> None:
    # Given three matching instances in the pool
    for number in (1, 2, 3):
        pool.add_idle(number, **SPOT)
    records = _CountingRecords(pool.records)
    # When a runner is picked up
    result = pool.picker(records).pickup(spec)
    # Then one record was read, the candidate's: the caller waits for nothing else, and the
    # matches sent back get their record checked by whoever picks them next
    assert result.candidate is not None
    assert records.reads == [result.candidate.instance_id]


def test_a_misfit_costs_a_tenth_of_a_receive_and_a_tenth_of_a_release(
    pool: Pool, spec: RunnerSpec, sqs_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    # Given fifteen m7i instances and one c7i instance in the pool, offered in that order
    for number in range(1, 16):
        pool.add_idle(number, **OTHER_TYPE)
    pool.add_idle(16, **SPOT)
    sqs_calls.clear()
    # When a c7i runner is picked up, with a requeue delay of 1 s
    result = pool.picker(requeue_delay_seconds=1).pickup(spec)
    # Then two receives of ten, each holding what it got for the pickup's Lambda's lifetime, one delete
    # (the candidate) and two releases of the fifteen misfits with the delay were all it took: no
    # misfit was deleted or sent
    assert result.counts.examined == 16
    assert Counter(name for name, _ in sqs_calls) == {
        "ReceiveMessage": 2,
        "DeleteMessageBatch": 1,
        "ChangeMessageVisibilityBatch": 2,
    }
    received = [p for name, p in sqs_calls if name == "ReceiveMessage"]
    assert {(p["MaxNumberOfMessages"], p["VisibilityTimeout"]) for p in received} == {(10, HOLD_SECONDS)}
    released = [e for name, p in sqs_calls if name == "ChangeMessageVisibilityBatch" for e in p["Entries"]]
    assert len(released) == 15
    assert {entry["VisibilityTimeout"] for entry in released} == {1}


def assert_every_message_accounted_for(result: PickupResult) -> None:
    counts = result.counts
    handed_out = 1 if result.candidate is not None else 0
    assert counts.examined == (
        handed_out + counts.requeued + counts.dropped_stale + counts.dropped_unparseable + counts.held
    )


def test_every_message_received_is_handed_out_sent_back_or_dropped_on_purpose(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given a mixed pool: a claimed instance, two matches, two misfits, a stale one and a bad body
    claimed = pool.add_idle(5, **SPOT)
    assert pool.records.claim(claimed.instance_id, "pool=99", "claim-99").succeeded
    matches = [pool.add_idle(number, **SPOT) for number in (1, 2)]
    misfits = [pool.add_idle(number, **OTHER_TYPE) for number in (3, 4)]
    pool.queues.offer(PoolMessage(**facts(6).model_dump(), threshold=pool.clock.now() - 1))
    pool.sqs.send_message(QueueUrl=pool.url, MessageBody="not json")
    # When a runner is picked up
    result = pool.picker(requeue_delay_seconds=0).pickup(spec)
    # Then each of the seven is accounted for, and the queue holds exactly what was sent back
    assert_every_message_accounted_for(result)
    assert result.counts.examined == 7
    assert instance_ids([*pool.visible(), result.candidate]) == instance_ids([*matches, *misfits])


class _FailingRecords:
    def get(self, instance_id: str) -> InstanceRecord | None:
        raise RuntimeError("DynamoDB is unavailable")

    def holds_idle(self, partition: PoolPartition) -> bool:
        raise RuntimeError("DynamoDB is unavailable")


def test_a_failed_record_lookup_sends_back_what_was_in_hand_before_raising(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given a matching and a non-matching instance in the pool, and a state table that fails reads
    offered = [pool.add_idle(1, **SPOT), pool.add_idle(2, **OTHER_TYPE)]
    # When a runner is picked up
    with pytest.raises(RuntimeError, match="unavailable"):
        pool.picker(_FailingRecords()).pickup(spec)
    # Then the error reaches the caller, but both messages went back to the queue first
    assert instance_ids(pool.visible()) == instance_ids(offered)


class _RefusingReleases(PoolQueues):
    """The pool queues, except that the queue refuses to release any message."""

    def release(self, partition: PoolPartition, receipts: Sequence[str], delay_seconds: int) -> list[str]:
        return list(receipts)


def test_a_misfit_the_queue_refuses_to_release_stays_in_it_hidden_until_its_hold_ends(
    pool: Pool, spec: RunnerSpec, pool_queue_url_prefix: str, config: StackConfig
) -> None:
    # Given a non-matching and a matching instance, and a queue that refuses every release
    pool.add_idle(1, **OTHER_TYPE)
    wanted = pool.add_idle(2, **SPOT)
    refusing = _RefusingReleases(pool_queue_url_prefix, config.resource_classes, pool.sqs, wait_seconds=0)
    # When a runner is picked up
    result = PickupManager(refusing, pool.records, pool.clock, PickupSettings()).pickup(spec)
    # Then the candidate is still handed out, and the misfit is counted held: still in the queue, in
    # flight until its hold ends, not lost
    assert result.candidate == wanted
    assert (result.counts.held, result.counts.requeued) == (1, 0)
    assert pool.depth() == {"visible": 0, "delayed": 0, "in_flight": 1}


class _SlowQueues(PoolQueues):
    """The pool queues, except that every receive takes a second of the test's clock."""

    def __init__(self, queues: PoolQueues, clock: ManualClock) -> None:
        self.__dict__.update(queues.__dict__)
        self._clock = clock

    def receive(self, partition: PoolPartition, hold_seconds: int) -> list[ReceivedMessage]:
        self._clock.advance(1)
        return super().receive(partition, hold_seconds)


def test_a_long_queue_of_misfits_ends_the_pickup_at_its_budget(pool: Pool, spec: RunnerSpec) -> None:
    # Given 40 non-matching instances, more than three batches' worth, and receives of a second each
    for number in range(1, 41):
        pool.add_idle(number, **OTHER_TYPE)
    slow = _SlowQueues(pool.queues, pool.clock)
    picker = PickupManager(slow, pool.records, pool.clock, PickupSettings(), budget_seconds=3)
    # When a c7i runner is picked up with a budget of three seconds
    result = picker.pickup(spec)
    # Then it stops after three receives, with every misfit released to others and none gone
    assert result.stopped is StopReason.BUDGET
    assert result.counts.receive_calls == 3
    assert result.counts.requeued == result.counts.examined == 30
    assert pool.depth()["visible"] == 40


def test_an_offer_of_another_partition_found_in_the_queue_goes_to_its_own_and_is_never_lost(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given an idle on-demand instance whose message reached the spot queue (an older release, say)
    launched = facts(1, usage_class=UsageClass.ON_DEMAND)
    pool.records.create(launched, run_key=None)
    admitted = pool.records.admit(launched.instance_id).record
    assert admitted is not None
    stray = PoolMessage.for_idle(admitted)
    pool.sqs.send_message(QueueUrl=pool.url, MessageBody=stray.to_body())
    # When a spot runner is picked up from the spot queue, which holds nothing else (read because some
    # spot instance is idle: a stray is moved when its queue is next read)
    result = pool.picker(_SomeIdle(pool.records), partitions=pool.queues.partitions).pickup(spec)
    # Then the stray is no candidate, and it was sent to the on-demand queue, not back or away
    assert result.candidate is None
    assert_every_message_accounted_for(result)
    assert (result.counts.requeued, result.counts.held) == (1, 0)
    assert pool.depth()["visible"] == 0
    assert pool.visible(LARGE_ON_DEMAND) == [stray]


def test_an_offer_of_a_partition_without_a_queue_stays_where_it_was_read(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given a misfit of a class the stack no longer has, in the spot queue
    stray = PoolMessage(
        **facts(1, resource_class="retired", instance_type="m7i.large").model_dump(),
        threshold=pool.clock.now() + 300,
        pristine=True,
    )
    pool.sqs.send_message(QueueUrl=pool.url, MessageBody=stray.to_body())
    # When a runner is picked up while some instance of the spot partition is idle
    result = pool.picker(_SomeIdle(pool.records), partitions=pool.queues.partitions).pickup(spec)
    # Then it stayed in the queue it came from, where a queue exists, and was released there
    assert result.stopped is StopReason.EMPTY
    assert (result.counts.requeued, result.counts.held) == (1, 0)
    assert pool.visible() == [stray]


def test_a_partition_with_no_idle_record_is_known_empty_without_a_receive(
    pool: Pool, spec: RunnerSpec, sqs_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    # Given a pool whose only instance was claimed (its offer still in the queue)
    claimed = pool.add_idle(1, **SPOT)
    assert pool.records.claim(claimed.instance_id, "pool=99", "claim-99").succeeded
    sqs_calls.clear()
    # When a runner is picked up
    result = pool.picker().pickup(spec)
    # Then the records said no instance of the partition is idle, so its queue was not read: an empty
    # queue's receive waits out its whole long poll (issue 15, the cold path)
    assert result.candidate is None
    assert result.stopped is StopReason.EMPTY
    assert sqs_calls == []
    assert result.counts.skipped_partitions == 1
    assert result.counts.receive_calls == 0


def test_an_idle_look_that_fails_reads_the_queue_as_before(pool: Pool, spec: RunnerSpec) -> None:
    # Given an idle instance, and a by-idle index that cannot be read
    offered = pool.add_idle(1, **SPOT)

    class _IndexDown(_CountingRecords):
        def holds_idle(self, partition: PoolPartition) -> bool:
            raise RuntimeError("ThrottlingException")

    # When a runner is picked up / Then the queue was read and the instance found: a fault of the
    # index costs at most a long poll, never a warm instance
    result = pool.picker(_IndexDown(pool.records)).pickup(spec)
    assert result.candidate == offered
    assert result.counts.unlooked_partitions == 1


# --- the sweep of a queue pickup skips (refresh's pool sweep) ---------------------------------------


def test_a_queue_pickup_skips_is_rid_of_unparseable_and_stale_messages(pool: Pool, spec: RunnerSpec) -> None:
    # Given a partition with no idle record, whose queue holds a body that is no pool message and the
    # offer of an instance claimed since
    pool.sqs.send_message(QueueUrl=pool.url, MessageBody='{"instance_id": "i-1"}')
    claimed = pool.add_idle(1, **SPOT)
    assert pool.records.claim(claimed.instance_id, "pool=9", "token").succeeded
    # When a pickup looks, it skips the queue; the sweep does not
    assert pool.picker().pickup(spec).counts.skipped_partitions >= 1
    assert pool.depth()["visible"] == 2
    counts = pool.picker().sweep(LARGE)
    # Then both are dropped, and the queue is empty
    assert (counts.dropped_unparseable, counts.dropped_stale) == (1, 1)
    assert pool.depth() == {"visible": 0, "delayed": 0, "in_flight": 0}


def test_the_sweep_leaves_a_queue_pickup_reads_and_keeps_an_idle_offer(pool: Pool, spec: RunnerSpec) -> None:
    # Given an idle instance offered, beside a body that is no pool message
    pool.sqs.send_message(QueueUrl=pool.url, MessageBody="not json")
    pool.add_idle(1, **SPOT)
    # When the sweep runs, the partition holds an idle record: pickup reads its queue, the sweep does not
    counts = pool.picker().sweep(LARGE)
    assert counts.receive_calls == 0
    assert pool.depth()["visible"] == 2


def test_an_idle_offer_the_index_has_not_caught_up_with_is_released_at_once(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given an idle instance's offer, and a records reader whose index says the partition holds none
    wanted = pool.add_idle(1, **SPOT)

    class LaggingIndex:
        def get(self, instance_id: str) -> InstanceRecord | None:
            return pool.records.get(instance_id)

        def holds_idle(self, partition: PoolPartition) -> bool:
            return False

    # When the sweep runs
    counts = pool.picker(records=LaggingIndex()).sweep(LARGE)
    # Then the offer, idle by its record, is back in the queue at once
    assert counts.dropped_stale == 0
    assert pool.visible() == [wanted]


# --- who an instance served: levels, and pristine instances ------------------------------------------

TRUSTED_APP = Taker("octo/app", trust=TrustLevel.TRUSTED)


def test_a_job_that_reuses_takes_a_used_instance_of_its_own_before_a_pristine_one(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given two pristine instances offered first, then one that served a trusted job of octo/app
    pristine = [pool.add_idle(number) for number in (1, 2)]
    used = pool.add_used(3, TrustLevel.TRUSTED)
    # When a trusted job of octo/app picks up one
    result = pool.picker().pickup(spec, TRUSTED_APP)
    # Then it takes the used one, and the pristine ones stay offered for single-use jobs
    assert result.candidate == used
    assert_every_message_accounted_for(result)
    assert instance_ids(pool.visible()) == instance_ids(pristine)


def test_a_job_that_reuses_takes_a_pristine_instance_rather_than_none(pool: Pool, spec: RunnerSpec) -> None:
    # Given one pristine instance and one that served an untrusted job of octo/app
    pristine = pool.add_idle(1)
    untrusted = pool.add_used(2, TrustLevel.UNTRUSTED)
    # When a trusted job of octo/app picks up two
    result = pool.picker().pickup(spec, TRUSTED_APP, wanted=2)
    # Then it gets the pristine one only: the untrusted one's leftovers are not its to meet
    assert result.candidates == (pristine,)
    assert_every_message_accounted_for(result)
    assert pool.visible() == [untrusted]


def test_a_single_use_job_takes_only_a_pristine_instance(pool: Pool, spec: RunnerSpec) -> None:
    # Given an instance that served a trusted job of octo/app, then a pristine one
    used = pool.add_used(1, TrustLevel.TRUSTED)
    pristine = pool.add_idle(2)
    # When a single-use job of octo/app (a fresh one, say: trusted, but single use) picks up two
    taker = Taker("octo/app", trust=TrustLevel.TRUSTED, single_use=True)
    result = pool.picker().pickup(spec, taker, wanted=2)
    # Then it gets the pristine one only, and the used one stays for a job that may take it
    assert result.candidates == (pristine,)
    assert pool.visible() == [used]


def test_a_privileged_jobs_instance_is_offered_to_no_one_and_dropped(pool: Pool, spec: RunnerSpec) -> None:
    # Given an instance given back idle after a privileged job's claim (it served nothing, yet it is used)
    offer = pool.add_used(1, TrustLevel.PRIVILEGED)
    # When any job picks up / Then nobody gets it, and its offer leaves the queue (its record ends as due)
    result = pool.picker().pickup(spec, Taker("octo/app", trust=TrustLevel.PRIVILEGED))
    assert result.candidate is None
    assert result.counts.dropped_stale == 1
    assert pool.visible() == []
    assert pool.records.get(offer.instance_id) is not None


def test_a_job_that_reuses_reads_no_batch_further_only_to_find_a_used_instance(
    pool: Pool, spec: RunnerSpec
) -> None:
    # Given thirty pristine instances offered before one of the job's own used ones
    for number in range(1, 31):
        pool.add_idle(number)
    pool.add_used(31, TrustLevel.TRUSTED)
    # When a trusted job of octo/app picks up one
    result = pool.picker().pickup(spec, TRUSTED_APP)
    # Then it takes a pristine one from the first batch: reading on would hold the pristine offers in
    # hand out of concurrent requests' sight
    assert result.candidate is not None
    assert result.candidate.pristine
    assert result.counts.receive_calls == 1
    assert_every_message_accounted_for(result)
