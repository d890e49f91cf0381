"""A 300-job burst against GitHub's secondary rate limit: how long until every job is served, and how
many JIT registrations each job cost (refused ones included). The world is demo/burst.py's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench.results import BenchTable
from demo.burst import GITHUB_WINDOW_SECONDS as WINDOW
from demo.burst import REGISTRATIONS_PER_MINUTE, Burst, rate_limited_world, serve_burst
from emulator.world import World

JOBS = int(os.environ.get("RUNNER_POOL_BENCH_BURST_JOBS", "300"))


SMALL = {"jobs": 20}
"""`python -m bench --small`'s size; make test runs it at 40 on the world of its own e2e test
(tests/e2e/test_github_resilience.py), which then checks that world settles and accounts."""


def run(jobs: int = JOBS, system: World | None = None) -> BenchTable:
    """The burst on a fresh rate-limited world, or on `system` (one built by rate_limited_world)."""
    if system is not None:
        return _table(serve_burst(system, jobs, timeout=900), jobs)
    with (
        tempfile.TemporaryDirectory(prefix="bench-burst-") as scratch,
        rate_limited_world(Path(scratch)) as fresh,
    ):
        return _table(serve_burst(fresh, jobs), jobs)


def _table(burst: Burst, jobs: int) -> BenchTable:
    table = BenchTable(
        f"A burst of {burst.jobs} jobs against GitHub's rate limit (its minute compressed to {WINDOW:g} s)",
        ("figure", "value"),
    )
    table.row("jobs served", f"{burst.served} of {burst.jobs}")
    table.row("time to serve every job", f"{burst.seconds:.0f} s")
    table.row("JIT calls per job", f"{burst.jit_calls_per_job:.2f}")
    table.row("  refused by GitHub (retry-after)", burst.refused)
    table.row("executions failed", burst.failed_executions)
    table.figure(f"burst_{jobs}_jobs_served_seconds", round(burst.seconds, 1))
    table.figure(f"burst_{jobs}_jobs_served_count", burst.served)
    table.figure(f"burst_{jobs}_jit_calls_per_job_ratio", round(burst.jit_calls_per_job, 3))
    table.figure(f"burst_{jobs}_jit_refused_count", burst.refused)
    table.figure(f"burst_{jobs}_executions_failed_count", burst.failed_executions)
    table.note(
        f"GitHub's limit (180 registrations a minute) in its minute compressed to {WINDOW:g} s, "
        f"{180 * 60 / WINDOW:g} a minute; the registration budget at {REGISTRATIONS_PER_MINUTE} a minute, "
        f"above it on purpose. The limit bounds a burst of N jobs from below: N/{180 / WINDOW:g} s here "
        "(plus the window already spent when it arrives), N/3 s on GitHub."
    )
    return table
