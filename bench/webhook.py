"""The webhook Lambda's time per request, in-process, and the dispatcher's executions per 100 queued jobs.

Both handlers run in this process, through their Powertools decorators, against moto in-process
(`mock_aws`, emulator/harness/webhooks.py). A request's time includes moto serving the AWS calls it
makes: a delivery that queues demand writes its idempotency record twice (in progress, then done)
and sends one SQS message; an ignored one (a label not ours) and a refused one (a forged
signature) make no AWS call at all, so their time is the handler's own. The body is GitHub's real
`workflow_job queued` example (8 KB). INFO logs are off while measuring (they would print a line
per request here; on Lambda they go to CloudWatch).

The dispatcher part queues 100 jobs through the webhook (5 matrices of 20, in shuffled order) and
hands them to the dispatcher in batches of 10 (the Lambda default without a batching window) and
of 100 (a batching window that collects them all), then the same 100 with every delivery sent
twice under a new delivery id (what the ledger must absorb).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.results import BenchTable
from emulator.harness.webhooks import IngressWorld, delivery, ingress_world, queued_job
from emulator.world import lambdas_quiet

REQUESTS = 400
WARM_UP = 20
MATRICES = 5
MATRIX_JOBS = 20


SMALL = {"requests": 20, "matrix_jobs": 4}
"""`make test`'s size (tests/bench): every measurement, few requests."""


def run(requests: int = REQUESTS, matrix_jobs: int = MATRIX_JOBS) -> BenchTable:
    table = BenchTable(
        "Webhook ingress: the webhook per request (in-process, moto in-process) and the dispatcher",
        ("measure", "median", "p99", "result"),
    )
    with lambdas_quiet(), ingress_world() as world:
        _time_requests(world, table, requests)
    for batch_size, replayed in ((10, False), (100, False), (100, True)):
        with lambdas_quiet(), ingress_world() as world:
            _dispatch_hundred(world, table, batch_size, replayed, matrix_jobs)
    table.note(
        f"{requests} requests of each kind after {WARM_UP} to warm up; GitHub allows 10 s per delivery."
    )
    table.note("The dispatcher's event source needs a batch size of 100 or more and a batching window.")
    return table


def _time_requests(world: IngressWorld, table: BenchTable, requests: int) -> None:
    kinds: dict[str, Callable[[int], dict[str, Any]]] = {
        "demand": lambda n: delivery(queued_job(f"pool={n}/class=large", job_id=n, run_id=n), "workflow_job"),
        "ignored": lambda n: delivery(queued_job("ubuntu-latest", job_id=n, run_id=n), "workflow_job"),
        "refused": lambda n: delivery(queued_job("ubuntu-latest", job_id=n), "workflow_job", secret="forged"),  # noqa: S106
    }
    number = 0
    for kind, request in kinds.items():
        seconds: list[float] = []
        for attempt in range(WARM_UP + requests):
            number += 1
            event = request(number)
            started = time.perf_counter()
            world.deliver(event)
            if attempt >= WARM_UP:
                seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds) * 1000
        p99 = statistics.quantiles(seconds, n=100)[98] * 1000
        table.figure(f"webhook_{kind}_median_milliseconds", round(median, 2))
        table.figure(f"webhook_{kind}_p99_milliseconds", round(p99, 2))
        table.row(f"webhook: {kind}", f"{median:.1f} ms", f"{p99:.1f} ms", "")


def _dispatch_hundred(
    world: IngressWorld, table: BenchTable, batch_size: int, replayed: bool, matrix_jobs: int
) -> None:
    jobs = [(matrix, job) for matrix in range(1, MATRICES + 1) for job in range(matrix_jobs)]
    random.Random(5).shuffle(jobs)
    for matrix, job in jobs * (2 if replayed else 1):
        label = f"pool=7000/class=large/max-runtime={matrix * 10}"
        world.deliver(delivery(queued_job(label, job_id=matrix * 1000 + job, run_id=7000), "workflow_job"))
    records = world.take_queued()
    started = time.perf_counter()
    for start in range(0, len(records), batch_size):
        world.dispatch(records[start : start + batch_size])
    seconds = time.perf_counter() - started
    executions = world.calls.count("stepfunctions:StartExecution")
    case = f"batches of {batch_size}" + (", every delivery twice" if replayed else "")
    key = f"dispatcher_executions_per_100_jobs_batch_{batch_size}{'_replayed' if replayed else ''}_count"
    table.figure(key, executions)
    table.row(
        f"dispatcher: {len(jobs)} jobs of {MATRICES} matrices, {case}", "", "", f"{executions} executions"
    )
    if batch_size == 100 and not replayed:
        table.figure("dispatcher_batch_of_100_jobs_seconds", round(seconds, 3))
        table.row(f"dispatcher: one batch of {len(jobs)} jobs (moto in-process)", "", "", f"{seconds:.2f} s")
