"""The pool scenario: a warm pool on local AWS, and several runs' claim workers racing for it.

What it shows, with the real state table and pool queue adapters and the real pickup manager on
moto's server: a pool of mixed instances (spot and on-demand, x64 and arm64, two families), two of
them gone stale while pooled; four runs arriving at once, 20 claim workers in real threads, each
picking up and claiming one instance for its run. Every instance must end claimed by exactly one
worker of a run whose spec it fits, or still idle with its message in the queue, or stale and out
of the queue; a worker that finds nothing is a shortfall that creation would launch cold.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emulator.aws import INSTANCE_ARNS, CallCounter, LocalAws, local_aws
from emulator.instances import instance_facts, put_in_pool
from emulator.resources import create_pool_queues, create_state_table
from runner_pool.adapters.pool_queues import PoolQueues
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import PickupManager, Verdict, judge
from runner_pool.domain.records import Arch, InstanceFacts, PoolMessage, UsageClass

TABLE = "runner-pool-demo"
CANDIDATES_PER_WORKER = 3
"""A worker that loses a claim to a faster one tries the next candidate, a bounded number of times."""

POOL: Sequence[tuple[int, dict[str, Any]]] = (
    (8, {"instance_type": "c7i.large"}),
    (5, {"instance_type": "m7i.large"}),
    (4, {"instance_type": "c7i.large", "usage_class": UsageClass.ON_DEMAND}),
    (3, {"instance_type": "c7g.large", "arch": Arch.ARM64}),
)
GONE_STALE = 2
"""Instances whose record is expired while their pool message still waits in the queue."""

DEMAND: Sequence[tuple[str, int]] = (
    ("pool=101/types=c7*", 8),
    ("pool=102/usage=on-demand", 4),
    ("pool=103/arch=arm64/types=c7g.*", 4),
    ("pool=104/types=r7*", 4),
)


@dataclass(frozen=True)
class Pool:
    """The warm pool as the scenario set it up, and where to look at it afterwards."""

    pooled: list[InstanceFacts]
    stale: list[InstanceFacts]
    table: StateTable
    sqs: Any
    queue_url: str

    def facts(self, instance_id: str) -> InstanceFacts:
        return next(f for f in self.pooled if f.instance_id == instance_id)


@dataclass
class Outcome:
    spec: RunnerSpec
    worker: int
    instance_id: str | None = None
    claims_lost: int = 0
    pickup_counts: Counter[str] = field(default_factory=Counter)


def run() -> bool:
    """Runs the scenario, prints what happened; True when the accounting check holds."""
    with local_aws() as aws:
        return _scenario(aws, StackConfig())


def _scenario(aws: LocalAws, config: StackConfig) -> bool:
    calls = CallCounter()
    clock = SystemClock()
    dynamodb = aws.client("dynamodb", calls)
    create_state_table(dynamodb, TABLE)
    queue_urls = create_pool_queues(aws.client("sqs"), "demo", list(config.resource_classes))
    table = StateTable(TABLE, config.timeouts, clock, dynamodb, arns=INSTANCE_ARNS)
    queues = PoolQueues(queue_urls, aws.client("sqs", calls))

    pooled = _warm_pool(table, queues)
    stale = pooled[:GONE_STALE]
    for facts in stale:
        table.expire(facts.instance_id)
    print(f"warm pool: {len(pooled)} idle instances in class 'large', {len(stale)} of them since expired")
    calls.calls.clear()

    outcomes = _race(aws, config, table, queue_urls, calls)
    pool = Pool(pooled, stale, table, aws.client("sqs"), queue_urls["large"])
    return _report(outcomes, pool, calls)


def _warm_pool(table: StateTable, queues: PoolQueues) -> list[InstanceFacts]:
    pooled: list[InstanceFacts] = []
    for count, shape in POOL:
        for _ in range(count):
            facts = instance_facts(len(pooled) + 1, **shape)
            put_in_pool(table, queues, facts)
            pooled.append(facts)
    return pooled


def _race(
    aws: LocalAws, config: StackConfig, table: StateTable, queue_urls: dict[str, str], calls: CallCounter
) -> list[Outcome]:
    outcomes = [Outcome(config.spec_for(label), worker) for label, count in DEMAND for worker in range(count)]
    start = threading.Barrier(len(outcomes))

    def claim_worker(outcome: Outcome) -> None:
        # Each worker has its own clients, as each Lambda invocation would.
        queues = PoolQueues(queue_urls, aws.client("sqs", calls))
        pickup = PickupManager(queues, table, SystemClock(), config.pickup)
        token = f"{outcome.spec.run_key}#{outcome.worker}"
        start.wait()
        for _candidate in range(CANDIDATES_PER_WORKER):
            result = pickup.pickup(outcome.spec)
            outcome.pickup_counts.update(
                {name: getattr(result.counts, name) for name in ("examined", "requeued", "dropped_stale")}
            )
            if result.candidate is None:
                return  # the pool has nothing for this spec: a shortfall, for creation to launch
            if table.claim(result.candidate.instance_id, outcome.spec.run_key, token).succeeded:
                outcome.instance_id = result.candidate.instance_id
                return
            outcome.claims_lost += 1

    threads = [threading.Thread(target=claim_worker, args=(o,)) for o in outcomes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _report(outcomes: list[Outcome], pool: Pool, calls: CallCounter) -> bool:
    print(f"\n{len(outcomes)} claim workers of {len(DEMAND)} runs raced for the pool:\n")
    print(f"{'run key':36} {'wanted':>6} {'warm':>5} {'cold':>5}  instances")
    for label, wanted in DEMAND:
        got = sorted(o.instance_id for o in outcomes if o.spec.run_key == label and o.instance_id)
        shapes = Counter(f"{pool.facts(i).instance_type} {pool.facts(i).usage_class}" for i in got)
        listed = ", ".join(f"{n} x {shape}" for shape, n in sorted(shapes.items())) or "-"
        print(f"{label:36} {wanted:>6} {len(got):>5} {wanted - len(got):>5}  {listed}")

    totals: Counter[str] = Counter()
    for outcome in outcomes:
        totals.update(outcome.pickup_counts)
    print(
        f"\npickup: {totals['examined']} messages examined, {totals['requeued']} sent back, "
        f"{totals['dropped_stale']} stale dropped; {sum(o.claims_lost for o in outcomes)} claims lost "
        "to a faster worker"
    )
    print(f"AWS calls during the race: SQS {calls.by_operation('sqs')}")
    print(f"                           DynamoDB {calls.by_operation('dynamodb')}")

    left = _drain(pool.sqs, pool.queue_url)
    cold = [o.spec for o in outcomes if o.instance_id is None]
    wasted = [
        m.instance_id for m in left if any(judge(m, spec, time.time()) is Verdict.MATCH for spec in cold)
    ]
    warm = sum(1 for o in outcomes if o.instance_id)
    print(
        f"\n{warm} of {len(outcomes)} jobs got a warm runner; {len(wasted)} fitting instances were left "
        "idle while a job of their spec went cold"
    )
    problems = _accounting(outcomes, pool, Counter(m.instance_id for m in left))
    verdict = "every instance is claimed once, pooled once, or stale" if not problems else "FAILED"
    print(f"accounting check: {verdict}")
    for problem in problems:
        print(f"  - {problem}")
    return not problems


def _accounting(outcomes: list[Outcome], pool: Pool, in_queue: Counter[str]) -> list[str]:
    problems: list[str] = []
    winners = Counter(o.instance_id for o in outcomes if o.instance_id)
    problems += [f"{i} claimed by {n} workers" for i, n in winners.items() if n > 1]
    for outcome in outcomes:
        if outcome.instance_id and not _fits(outcome.spec, pool.facts(outcome.instance_id)):
            problems.append(f"{outcome.instance_id} does not fit {outcome.spec.run_key}")
    stale_ids = {f.instance_id for f in pool.stale}
    for facts in pool.pooled:
        iid = facts.instance_id
        record = pool.table.get(iid)
        if record is None:
            problems.append(f"{iid} has no record")
        elif iid in winners:
            if record.state is not InstanceState.CLAIMED or in_queue[iid]:
                problems.append(f"{iid} was claimed but is {record.state} with {in_queue[iid]} pool messages")
        elif iid in stale_ids:
            if in_queue[iid]:
                problems.append(f"{iid} is stale but still offered in the pool")
        elif record.state is not InstanceState.IDLE or in_queue[iid] != 1:
            problems.append(f"{iid} is {record.state} with {in_queue[iid]} pool messages, not pooled once")
    return problems


def _drain(sqs: Any, queue_url: str) -> list[PoolMessage]:
    """Everything left in the queue."""
    messages: list[PoolMessage] = []
    while batch := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        messages += [PoolMessage.from_body(m["Body"]) for m in batch]
    return messages


def _fits(spec: RunnerSpec, facts: InstanceFacts) -> bool:
    offer = PoolMessage(**facts.model_dump(), threshold=math.inf)
    return judge(offer, spec, time.time()) is Verdict.MATCH
