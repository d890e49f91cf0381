"""Issue 38's burst at a new account's Lambda concurrency quota of 10: bench/burst.py's 300 jobs, every
invocation of every function (state machines' tasks, the webhook, the dispatcher, refresh) counted
against one account-wide quota of 10 and throttled past it as Lambda throttles (TooManyRequestsException:
Lambda Developer Guide, lambda-concurrency.html). It must serve every job, slower, with no failed
execution: the state machines retry throttled tasks (infra/constructs/retries.py THROTTLED)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.results import BenchTable
from demo.burst import rate_limited_world, serve_burst
from emulator.stack import within_concurrency
from emulator.step_functions import AccountConcurrency

JOBS = 300
RUNS = 10
CONCURRENCY = 10
"""Lambda's concurrent executions quota of a new account (domain/doctor_judges.py's THROTTLED_QUOTA_FLOOR)."""
TIMEOUT_SECONDS = 2400.0

SMALL = {"jobs": 30, "runs": 1}
"""`make test`'s size: one 30-job run, which alone asks for 30 claims at once, three times the quota."""


def run(jobs: int = JOBS, runs: int = RUNS, concurrency: int = CONCURRENCY) -> BenchTable:
    quota = AccountConcurrency(concurrency)
    with (
        tempfile.TemporaryDirectory(prefix="bench-burst-quota-") as scratch,
        rate_limited_world(Path(scratch), runtime=within_concurrency(quota)) as system,
    ):
        burst = serve_burst(system, jobs, runs=runs, timeout=TIMEOUT_SECONDS)
    table = BenchTable(
        f"A burst of {jobs} jobs ({runs} runs) at a Lambda concurrency quota of {concurrency}",
        ("figure", "value"),
    )
    table.row("jobs served", f"{burst.served} of {burst.jobs}")
    table.row("time to serve every job", f"{burst.seconds:.0f} s")
    table.row("executions failed", burst.failed_executions)
    for cause, count in sorted(burst.failure_causes.items()):
        table.row(f"  {cause}", count)
    table.row("invocations throttled (429 TooManyRequestsException)", quota.throttled)
    key = f"burst_{jobs}_at_concurrency_{concurrency}"
    table.figure(f"{key}_failed_executions_count", burst.failed_executions)
    table.figure(f"{key}_jobs_served_count", burst.served)
    table.figure(f"{key}_jobs_served_seconds", round(burst.seconds, 1))
    table.figure(f"{key}_throttled_invocations_count", quota.throttled)
    return table
