"""Pickup on one moto server in one run: behind 10,000 misfits of its class, and against the reference
design's one-message-at-a-time loop.

Behind 10,000: the pool holds 10,000 idle instances of the request's class that do not fit it, a
quarter each of another usage, another architecture, both, and another type of the request's own
partition, each offered to its own partition's queue, and then the one that fits, sent last. The
partitioning keeps three quarters out of the request's queue; pickup reads through the other quarter
(type misfits share the partition: domain/pool_partitions.py says why) within its budget
(domain/pickup.py PICKUP_BUDGET_SECONDS). The figures say whether it found the match, with how many
SQS calls and how long.

Against the baseline: both pickups face the same queue: 1,000 idle instances of the request's
partition that do not fit the spec (another type family, too small), then the one that does, sent
last. Both judge messages with the
same verdict and check the match's record the same way, so the only difference measured is how
they use SQS: ours receives 10 at a time, deletes each batch with one call and sends misfits back
with one call per batch; the baseline receives one message, deletes it, and sends it back alone.

moto's SQS does per-message work that grows with the queue and that real SQS does not do (its
clock read through datetime arithmetic for every message on each scan, every queue attribute
recomputed for each message handed out). On stock moto it is nearly all of the wall time of each
pickup (about 110 s apiece for this queue) and hides how they use SQS; local AWS does neither
(emulator/moto_speedups.py), with the same answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.results import BenchTable
from emulator.aws import INSTANCE_ARNS, CallCounter, LocalAws, local_aws
from emulator.instances import instance_facts, put_in_pool
from emulator.resources import create_pool_queues, create_state_table
from runner_pool.adapters.pool_queues import PoolQueues
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.pickup import PickupManager, PickupResult, Verdict, judge, still_offered
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Arch, PoolMessage, UsageClass

NON_MATCHING = 1_000
BEHIND = 10_000
"""Misfits of the request's class in front of the match: the bar the pickup must clear."""
LABEL = "pool=1/usage=spot/types=c7*"
PARTITION = PoolPartition("large", UsageClass.SPOT, Arch.X64)
"""The partition LABEL's hard keys choose: class large (the default), spot, x64 (the default)."""
TARGET_CALLS_RATIO = 5.0
TARGET_TIME_RATIO = 3.0

MISFITS: list[dict[str, Any]] = [
    {"instance_type": "m7i.large"},
    {"cpu": 1, "memory_mib": 2048, "instance_type": "c7i.medium"},
]
"""Misfits of LABEL in its own partition: another type family, too small for the class."""
BEHIND_MISFITS: list[dict[str, Any]] = [
    {"usage_class": UsageClass.ON_DEMAND},
    {"arch": Arch.ARM64, "instance_type": "c7g.large"},
    {"usage_class": UsageClass.ON_DEMAND, "arch": Arch.ARM64, "instance_type": "m7g.large"},
    {"instance_type": "m7i.large"},
]
"""Misfits of LABEL of its class: another usage, another architecture, both, another type."""


@dataclass(frozen=True)
class Run:
    """One pickup's figures."""

    calls: int
    examined: int
    seconds: float

    @property
    def calls_per_examined(self) -> float:
        return self.calls / self.examined


SMALL = {"misfits": 40, "behind": 400}
"""`make test`'s size (tests/bench): the same pickups, short queues."""


def run(misfits: int = NON_MATCHING, behind: int = BEHIND) -> BenchTable:
    with local_aws() as aws:
        return _measure(aws, misfits, behind)


def _measure(aws: LocalAws, misfits: int, behind: int) -> BenchTable:
    client = aws.client
    config = StackConfig()
    spec = config.spec_for(LABEL)
    clock = SystemClock()
    dynamodb = client("dynamodb")
    create_state_table(dynamodb, "bench-state")
    records = StateTable("bench-state", config.timeouts, clock, dynamodb, arns=INSTANCE_ARNS)
    delay = config.pickup.requeue_delay_seconds

    behind_prefix = _filled_pool(
        client("sqs"), records, "bench-behind", behind, kinds=BEHIND_MISFITS, instance_base=100_000
    )
    behind_counter = CallCounter()
    behind_queues = PoolQueues(behind_prefix, ["large"], client("sqs", behind_counter))
    manager = PickupManager(behind_queues, records, clock, config.pickup, partitions=behind_queues.partitions)
    started = time.perf_counter()
    behind_result = manager.pickup(spec)
    behind_run = Run(behind_counter.total(), behind_result.counts.examined, time.perf_counter() - started)

    ours_prefix = _filled_pool(client("sqs"), records, "bench-ours", misfits, kinds=MISFITS, instance_base=0)
    ours_counter = CallCounter()
    ours_client = client("sqs", ours_counter)
    manager = PickupManager(PoolQueues(ours_prefix, ["large"], ours_client), records, clock, config.pickup)
    started = time.perf_counter()
    result = manager.pickup(spec)
    ours = Run(ours_counter.total(), result.counts.examined, time.perf_counter() - started)
    _require_match(result.candidate, "PickupManager")

    baseline_prefix = _filled_pool(
        client("sqs"), records, "bench-baseline", misfits, kinds=MISFITS, instance_base=10_000
    )
    baseline_url = PARTITION.queue_name(baseline_prefix)
    baseline_counter = CallCounter()
    baseline_client = client("sqs", baseline_counter)
    started = time.perf_counter()
    candidate, examined = _baseline_pickup(
        baseline_client, baseline_url, get_record=records.get, clock=clock, spec=spec, delay_seconds=delay
    )
    baseline = Run(baseline_counter.total(), examined, time.perf_counter() - started)
    _require_match(candidate, "baseline")

    table = _table(misfits, ours, baseline, ours_counter, baseline_counter)
    _behind_figures(table, behind, behind_result, behind_run, behind_counter)
    return table


def _baseline_pickup(
    sqs: Any,
    url: str,
    *,
    get_record: Callable[[str], Any],
    clock: SystemClock,
    spec: RunnerSpec,
    delay_seconds: int,
) -> tuple[PoolMessage | None, int]:
    """The reference design's loop: one message per ReceiveMessage, one DeleteMessage, one SendMessage."""
    examined = 0
    while True:
        received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1).get("Messages", [])
        if not received:
            return None, examined
        examined += 1
        sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])
        message = PoolMessage.from_body(received[0]["Body"])
        now = clock.now()
        verdict = judge(message, spec, now)
        if verdict is Verdict.MATCH and still_offered(message, get_record(message.instance_id), now):
            return message, examined
        if verdict is Verdict.REQUEUE:
            sqs.send_message(QueueUrl=url, MessageBody=received[0]["Body"], DelaySeconds=delay_seconds)


def _filled_pool(
    sqs: Any,
    records: StateTable,
    name_prefix: str,
    misfits_count: int,
    *,
    kinds: list[dict[str, Any]],
    instance_base: int,
) -> str:
    """Fresh pool queues of class large holding `misfits_count` misfits (of `kinds` in turn), each in its
    own partition's queue, then one idle instance that fits, sent last; returns the queues' URL prefix."""
    prefix = create_pool_queues(sqs, f"{name_prefix}-pool-", ["large"])
    queues = PoolQueues(prefix, ["large"], sqs, wait_seconds=0)
    threshold = time.time() + 600
    by_partition: dict[PoolPartition, list[PoolMessage]] = {}
    for n in range(1, misfits_count + 1):
        facts = instance_facts(instance_base + n, **kinds[n % len(kinds)])
        message = PoolMessage(**facts.model_dump(), threshold=threshold, pristine=True)
        by_partition.setdefault(PoolPartition.of(message), []).append(message)
    for partition, messages in by_partition.items():
        if queues.requeue(partition, messages, delay_seconds=0):
            raise RuntimeError("moto refused to take the bench's messages")
    put_in_pool(records, queues, instance_facts(instance_base + misfits_count + 1))
    return prefix


def _behind_figures(
    table: BenchTable, behind: int, result: PickupResult, run: Run, calls: CallCounter
) -> None:
    found = result.candidate is not None
    in_partition = sum(
        1 for n in range(1, behind + 1) if not {"usage_class", "arch"} & BEHIND_MISFITS[n % 4].keys()
    )
    table.note(
        f"behind {behind:,} misfits of class large ({in_partition:,} of them in the request's partition): "
        f"{'found' if found else 'NOT found'} (pickup stopped: {result.stopped.value}) after examining "
        f"{result.counts.examined:,} messages, {run.calls:,} SQS calls, {run.seconds:.2f} s; "
        f"calls by operation: {calls.by_operation('sqs')}"
    )
    prefix = f"pickup_match_behind_{behind}_misfits"
    table.figure(f"{prefix}_found", 1 if found else 0)
    table.figure(f"{prefix}_sqs_calls_count", run.calls)
    table.figure(f"{prefix}_seconds", round(run.seconds, 3))
    table.figure(f"{prefix}_examined_count", run.examined)


def _require_match(candidate: PoolMessage | None, who: str) -> None:
    if candidate is None or candidate.usage_class is not UsageClass.SPOT:
        raise RuntimeError(f"{who} did not find the matching instance; the figures would mean nothing")


def _table(
    misfits: int, ours: Run, baseline: Run, ours_calls: CallCounter, baseline_calls: CallCounter
) -> BenchTable:
    table = BenchTable(
        title=f"pickup: 1 matching instance among {misfits:,} non-matching messages, one moto server",
        columns=("", "PickupManager", "baseline", "baseline / ours"),
    )
    calls_ratio = baseline.calls_per_examined / ours.calls_per_examined
    time_ratio = baseline.seconds / ours.seconds
    table.row("SQS calls", ours.calls, baseline.calls, "")
    table.row("candidates examined", ours.examined, baseline.examined, "")
    table.row(
        "SQS calls per candidate examined",
        f"{ours.calls_per_examined:.3f}",
        f"{baseline.calls_per_examined:.3f}",
        f"{calls_ratio:.1f}x",
    )
    table.row(
        "wall time to match (s)", f"{ours.seconds:.2f}", f"{baseline.seconds:.2f}", f"{time_ratio:.1f}x"
    )
    table.note(f"calls by operation, ours: {ours_calls.by_operation('sqs')}")
    table.note(f"calls by operation, baseline: {baseline_calls.by_operation('sqs')}")
    table.note(
        f"target: >= {TARGET_CALLS_RATIO:g}x fewer calls per candidate "
        f"({'met' if calls_ratio >= TARGET_CALLS_RATIO else 'NOT met'}), "
        f">= {TARGET_TIME_RATIO:g}x less time ({'met' if time_ratio >= TARGET_TIME_RATIO else 'NOT met'})"
    )
    table.note("moto's SQS clock and retention check made cheap for the run; bench/pickup.py says why")

    table.figure("pickup_sqs_calls_per_candidate_examined_count", round(ours.calls_per_examined, 4))
    table.figure(
        "pickup_baseline_sqs_calls_per_candidate_examined_count", round(baseline.calls_per_examined, 4)
    )
    table.figure("pickup_sqs_calls_reduction_ratio", round(calls_ratio, 2))
    table.figure("pickup_wall_time_to_match_seconds", round(ours.seconds, 3))
    table.figure("pickup_baseline_wall_time_to_match_seconds", round(baseline.seconds, 3))
    table.figure("pickup_wall_time_reduction_ratio", round(time_ratio, 2))
    table.figure("pickup_candidates_examined_count", ours.examined)
    return table
