"""The 1,000-job burst: 1,000 jobs queued at once, behind the stack's own webhook throttle and Lambda's five
pollers on the demand queue, against GitHub's rate limit (bench/burst.py's world and figures).

Its shape is 20 runs of a 50-job matrix. GitHub allows 256 jobs in one run ("A matrix will generate a
maximum of 256 jobs per workflow run", docs.github.com, "Running variations of jobs in a workflow"), so
four 250-job runs would fit too, but a provision execution takes at most PROVISION_LIMIT (50) runners,
sized to Step Functions' quotas (domain/executions.py): a run of N jobs then costs at least
1 + ceil((N - 1) / 50) provisions whatever the batching does (6 for 250), and the target of "at most 2
provisions per run" can only be met, or missed by the batching, with runs of at most 51 jobs. The
webhook and the dispatcher meet the same 1,000 deliveries either way.
"""

from __future__ import annotations

from bench import burst
from bench.results import BenchTable
from emulator.world import World

JOBS = 1000
RUNS = 20
TIMEOUT_SECONDS = 3300.0
"""On a quiet 2-core machine the emulator serves about 65 jobs a minute at this size, 45 with the rest
of the machine busy (15 on a slower machine, before local AWS read EC2 tags by id)."""

SMALL = {"jobs": 90, "runs": 3}
"""make test runs it at this size on the world of its own e2e test (tests/e2e/test_github_resilience.py),
which checks the figures on it: every job served, no failed execution, provisions per run, GitHub's
refusals met. Three runs of a 30-job matrix still meet the compressed limit (a window of 180
registrations, kept spent by another client until the burst is first refused), and pass the budget's
burst of 20; later runs reuse what the first gave back. The test was make test's longest at five runs.
`make bench` measures 300 and 1,000."""


TWO_APPS_BOUND = 0.6
"""The most a burst through two Apps may take of the one-App burst's time in the same run: each App has
its own limit (emulator/fake_github/rate_limits.py), so two halve the registrations' floor."""
APP_POINTS_PER_WINDOW = 100
"""Each App's limit in both of make bench's bursts: 20 registrations in the fake's 20 s minute, one a
second. At GitHub's own (180, 9 a second compressed) the emulator, which serves about 2 jobs a second on
this machine, never reaches one App's ceiling, so a second App would measure nothing; on AWS the control
plane serves faster than GitHub's 3 a second, and one App's ceiling is what binds, as it does here."""


def run(jobs: int = JOBS, runs: int = RUNS, system: World | None = None, apps: int = 1) -> BenchTable:
    """On `system`, the burst as it is; else the burst through one App, then through two on a world of
    their own, in one table: the two-App figures beside the one-App ones of the same run."""
    if system is not None:
        return burst.run(jobs=jobs, runs=runs, system=system, timeout=TIMEOUT_SECONDS, apps=apps)
    one = burst.run(jobs=jobs, runs=runs, timeout=TIMEOUT_SECONDS, points_per_window=APP_POINTS_PER_WINDOW)
    two = burst.run(
        jobs=jobs, runs=runs, timeout=TIMEOUT_SECONDS, apps=2, points_per_window=APP_POINTS_PER_WINDOW
    )
    return compared(one, two, jobs)


def compared(one: BenchTable, two: BenchTable, jobs: int) -> BenchTable:
    """The one-App burst's table with the two-App burst's rows and figures after it, and the ratio of
    their times to serve every job (`burst_<jobs>_two_apps_to_one_app_ratio`)."""
    one.rows += [("", ""), (two.title, ""), *two.rows]
    one.notes += two.notes
    for key, value in two.figures.items():
        one.figure(key, value)
    ratio = (
        two.figures[f"burst_{jobs}_two_apps_served_seconds"]
        / one.figures[f"burst_{jobs}_jobs_served_seconds"]
    )
    one.row("two Apps' time to serve every job, of one App's", f"{ratio:.2f} (at most {TWO_APPS_BOUND})")
    one.figure(f"burst_{jobs}_two_apps_to_one_app_ratio", round(ratio, 3))
    return one
