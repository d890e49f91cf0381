"""A burst of jobs against GitHub's secondary rate limit: how long until every job is served, how many
JIT registrations each job cost (refused ones included), how many provisions the dispatcher started for
each run, and what the webhook's stage throttle refused. The world is demo/burst.py's: the stack's own
throttle (read from the template), Lambda's five pollers on the demand queue. bench/burst_1000.py is
the 1,000-job size of it."""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.results import BenchTable
from demo.burst import (
    GITHUB_POINTS_PER_WINDOW,
    REGISTRATIONS_PER_MINUTE,
    Burst,
    rate_limited_world,
    serve_burst,
)
from demo.burst import GITHUB_WINDOW_SECONDS as WINDOW
from emulator.background import in_background
from emulator.event_sources import STANDARD_QUEUE_POLLERS
from emulator.world import World
from runner_pool.domain.executions import PROVISION_LIMIT

JOBS = int(os.environ.get("RUNNER_POOL_BENCH_BURST_JOBS", "300"))
RUNS = 10
"""300 jobs as 10 runs of a 30-job matrix, the shape every burst_300 figure so far was measured with."""
TIMEOUT_SECONDS = 1800.0

APPS_NAMES = {2: "two", 3: "three"}
"""How a burst through several Apps names its figures (`burst_1000_two_apps_served_seconds`)."""

SMALL = {"jobs": 20}
"""`python -m bench --small`'s size; make test runs it at its full 300 (as burst_1000's small size) on the
world of its own e2e test (tests/e2e/test_github_resilience.py), which then checks that world settles
and accounts."""


def run(
    jobs: int = JOBS,
    runs: int = RUNS,
    system: World | None = None,
    timeout: float = TIMEOUT_SECONDS,
    *,
    apps: int = 1,
    points_per_window: int = GITHUB_POINTS_PER_WINDOW,
) -> BenchTable:
    """The burst on a fresh rate-limited world of `apps` GitHub Apps (each limited to `points_per_window`
    in the fake's minute), or on `system` (one built by rate_limited_world)."""
    if system is not None:
        limit = system.github.limits.points_per_window
        burst = serve_burst(system, jobs, runs=runs, timeout=min(timeout, 900))
        return table_of(burst, jobs, Footprint(), apps, limit)
    with (
        tempfile.TemporaryDirectory(prefix="bench-burst-") as scratch,
        rate_limited_world(Path(scratch), apps=apps, points_per_window=points_per_window) as fresh,
        footprint() as peak,
    ):
        burst = serve_burst(fresh, jobs, runs=runs, timeout=timeout)
        return table_of(burst, jobs, peak, apps, points_per_window)


@dataclass
class Footprint:
    """The most this process and its children (the Lambdas' execution environments) held at once."""

    rss_bytes: int = 0
    threads: int = 0
    processes: int = 0


@contextmanager
def footprint(every_seconds: float = 1.0) -> Iterator[Footprint]:
    """Sample the process tree's resident memory, this process's threads and the tree's processes."""
    peak = Footprint()

    def sample(stop: threading.Event) -> None:
        while True:
            tree = _process_tree(os.getpid())
            peak.rss_bytes = max(peak.rss_bytes, sum(_status(pid, "VmRSS") * 1024 for pid in tree))
            peak.threads = max(peak.threads, _status(os.getpid(), "Threads"))
            peak.processes = max(peak.processes, len(tree))
            if stop.wait(every_seconds):
                return

    with in_background(sample, name="bench-footprint"):
        yield peak


def _process_tree(root: int) -> list[int]:
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:  # the process ended since its parent listed it (an environment shut down)
            continue
        for task in tasks:
            try:
                pending += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def _status(pid: int, field: str) -> int:
    """A number from /proc/<pid>/status (VmRSS in kB, Threads); 0 for a process gone meanwhile."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in lines if line.startswith(f"{field}:")), 0)


def _counted(table: BenchTable, heading: str, prefix: str, counts: Counter[str]) -> None:
    """One row for each kind, the most frequent first; `heading` with "none" when there is no kind."""
    if not counts:
        table.row(heading, "none")
    for kind, count in counts.most_common():
        table.row(f"  {prefix}{kind}", count)


def table_of(
    burst: Burst, jobs: int, peak: Footprint, apps: int = 1, points: int = GITHUB_POINTS_PER_WINDOW
) -> BenchTable:
    """The burst's rows to print and figures to keep; a burst through two Apps keys its figures
    `burst_<jobs>_two_apps_*`."""
    through = "" if apps == 1 else f", through {apps} GitHub Apps"
    table = BenchTable(
        f"A burst of {burst.jobs} jobs ({burst.runs} runs of a {burst.jobs // max(1, burst.runs)}-job "
        f"matrix) against GitHub's rate limit (its minute compressed to {WINDOW:g} s){through}",
        ("figure", "value"),
    )
    key = f"burst_{jobs}" if apps == 1 else f"burst_{jobs}_{APPS_NAMES[apps]}_apps"
    table.row("jobs served", f"{burst.served} of {burst.jobs}")
    _counted(table, "  not served, by what became of them", "not served: ", burst.unserved)
    table.row("time to serve every job", f"{burst.seconds:.0f} s")
    table.row("JIT calls per job", f"{burst.jit_calls_per_job:.2f}")
    table.row("  refused by GitHub (retry-after)", burst.refused)
    table.row("executions failed", burst.failed_executions)
    _counted(table, "  failed, by machine, state and error", "", burst.failure_causes)
    table.row(
        "  executions still running when the burst ended (not counted)",
        ", ".join(f"{machine}: {n}" for machine, n in sorted(burst.still_running.items())) or "none",
    )
    table.row("provisions the dispatcher started per run (each run)", " ".join(map(str, burst.dispatched)))
    if burst.follow_ups:
        table.row(
            "  of which follow-ups, gathered by their state machine", " ".join(map(str, burst.follow_ups))
        )
    if burst.queued_spans:
        spans = sorted(burst.queued_spans)
        table.row(
            "  a run's queued deliveries came over (median, max)",
            f"{spans[len(spans) // 2]:.1f} s, {spans[-1]:.1f} s",
        )
    table.row("  redrives (a provision that ended short asked again)", burst.redriven)
    table.row("  reconciliations (refresh asked for jobs still queued)", burst.reconciled)
    table.row("deliveries throttled by the stage (429)", burst.throttled)
    statuses = Counter(burst.failed_deliveries)
    table.row(
        "deliveries GitHub recorded as failed (by status; 0: no answer)",
        f"{len(burst.failed_deliveries)} ({', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))})",
    )
    if peak.rss_bytes:
        table.row("peak memory, this process and its children", f"{peak.rss_bytes / 2**30:.2f} GiB")
        table.row("peak threads of this process", peak.threads)
        table.row("peak processes (execution environments and this one)", peak.processes)
        table.figure(f"{key}_jobs_peak_memory_bytes", peak.rss_bytes)
        table.figure(f"{key}_jobs_peak_threads_count", peak.threads)
    table.figure(
        f"{key}_jobs_served_seconds" if apps == 1 else f"{key}_served_seconds", round(burst.seconds, 1)
    )
    table.figure(f"{key}_jobs_served_count", burst.served)
    table.figure(f"{key}_jobs_served_ratio", round(burst.served_ratio, 4))
    table.figure(f"{key}_jit_calls_per_job_ratio", round(burst.jit_calls_per_job, 3))
    table.figure(f"{key}_jit_refused_count", burst.refused)
    table.figure(f"{key}_jobs_failed_executions_count", burst.failed_executions)
    table.figure(f"{key}_jobs_executions_per_run", burst.executions_per_run)
    table.figure(f"{key}_jobs_redriven_executions_count", burst.redriven)
    table.figure(f"{key}_jobs_reconciled_executions_count", burst.reconciled)
    table.figure(f"{key}_webhook_throttled_count", burst.throttled)
    table.figure(f"{key}_webhook_failed_deliveries_count", len(burst.failed_deliveries))
    table.note(
        f"GitHub's limit ({points // 5} registrations a minute per App; GitHub's own is 180) in its minute "
        f"compressed to {WINDOW:g} s, {points // 5 * 60 / WINDOW:g} a minute; the registration budget at "
        f"{REGISTRATIONS_PER_MINUTE} a minute, above it on purpose. The limit bounds a burst of N jobs "
        f"through one App from below: N/{points // 5 / WINDOW:g} s here "
        "(plus the window already spent when it arrives), N/3 s on GitHub."
    )
    table.note(
        f"Provisions per run: the most the dispatcher started for one run (its first job's, then its "
        f"follow-ups', each of at most {PROVISION_LIMIT} jobs), with {STANDARD_QUEUE_POLLERS} concurrent "
        "pollers on the demand queue; redrives and refresh's reconciliations are counted apart."
    )
    return table
