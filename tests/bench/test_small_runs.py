"""Every benchmark runs in `make test` at its small size, so none can rot between `make bench` runs."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import burst_1000 as bench_burst_1000
from bench.__main__ import BENCHMARKS, run_bench
from bench.results import UNITS, BenchTable, repeated

ROOT = Path(__file__).resolve().parents[2]

RUN_SMALL_ELSEWHERE = {
    "burst": "tests/e2e/test_github_resilience.py",
    "burst_1000": "tests/e2e/test_github_resilience.py",
    "burst_at_concurrency_10": "tests/e2e/test_github_resilience.py",
    "quotas": "tests/integration/test_quota_bench.py",
}
"""Benchmarks whose small run is a test with its own assertions on the figures. The burst's is its
1,000-job size made small (burst_1000.run is burst.run in that shape)."""

FIGURES_AT_SMALL_SIZE = {
    "emulator": ("aws_model_warm_control_plane_seconds", "aws_model_cold_control_plane_seconds"),
    "instant": (
        "emulator_instant_queued_to_started_median_seconds",
        "aws_model_instant_queued_to_started_seconds",
    ),
    "emulator_single_use": (
        "emulator_single_use_warm_control_plane_median_seconds",
        "emulator_single_use_warm_hit_ratio",
    ),
}
"""Figures a benchmark must keep even at its small size: the AWS model reads its paths from a run, and a
change to what it reads must fail here, not leave the figures out; a pristine pool must serve a warm
job once refresh has filled it; an instant tier's job must start on a runner listening ahead."""


@pytest.fixture
def environment_kept() -> Iterator[None]:
    """The process's environment as it was before the benchmark: a benchmark may set variables for its own
    table, and the tests this worker runs next must not inherit them (a refresh test reading its metrics
    from stdout found none when bench/webhook.py turned them off at import)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.slow  # a whole world each, most of them: dealt out first (tests/conftest.py)
@pytest.mark.parametrize("name", [name for name in BENCHMARKS if name not in RUN_SMALL_ELSEWHERE])
@pytest.mark.usefixtures("environment_kept")
def test_the_benchmark_runs_at_its_small_size_and_keeps_figures_named_with_their_units(name: str) -> None:
    # Given a benchmark / When it runs at make test's size
    table = run_bench(name, small=True)
    # Then it printed a table and kept figures, each ending with its unit
    assert table.rows
    assert table.render()
    assert table.figures
    assert all(key.endswith(tuple(f"_{unit}" for unit in UNITS)) for key in table.figures)
    assert set(FIGURES_AT_SMALL_SIZE.get(name, ())) <= set(table.figures)


@pytest.mark.parametrize("name", sorted(RUN_SMALL_ELSEWHERE))
def test_a_benchmark_run_small_elsewhere_is_called_there_at_its_small_size(name: str) -> None:
    # Given the test file said to run the benchmark small
    tree = ast.parse((ROOT / RUN_SMALL_ELSEWHERE[name]).read_text())
    # Then it calls that benchmark's run()
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
    ]
    assert calls, f"{RUN_SMALL_ELSEWHERE[name]} never calls {name}.run"
    assert importlib.import_module(f"bench.{name}").SMALL


def test_every_benchmark_declares_its_small_size() -> None:
    for name in BENCHMARKS:
        assert isinstance(importlib.import_module(f"bench.{name}").SMALL, dict), name


def test_repeated_runs_keep_the_median_and_the_min_of_each_figure() -> None:
    # Given three runs of one benchmark, one without a figure the others have
    runs = []
    for seconds, count in ((3.0, 7), (1.0, 9), (2.0, None)):
        table = BenchTable("b", ("x",))
        table.figure("b_seconds", seconds)
        if count is not None:
            table.figure("b_count", count)
        runs.append(table)
    # When they are summarised
    summary, kept = repeated(runs)
    # Then each figure keeps its median under its key and its min with min_ in front, unit last
    assert kept == {"b_seconds": 2.0, "min_b_seconds": 1.0, "b_count": 8.0, "min_b_count": 7}
    assert len(summary.rows) == 2


def test_the_two_app_burst_is_compared_with_the_one_app_burst_of_the_same_run() -> None:
    # Given a one-App and a two-App burst's tables of one run (bench/burst.py's keys)
    one, two = BenchTable("one App", ("figure", "value")), BenchTable("two Apps", ("figure", "value"))
    one.figure("burst_10_jobs_served_seconds", 100.0)
    two.figure("burst_10_two_apps_served_seconds", 55.0)
    two.figure("burst_10_two_apps_jobs_served_count", 10)
    two.row("jobs served", "10 of 10")
    # When they are compared / Then one table holds both Apps' figures and the ratio of their times
    table = bench_burst_1000.compared(one, two, 10)
    assert table.figures["burst_10_two_apps_to_one_app_ratio"] == 0.55
    assert table.figures["burst_10_two_apps_jobs_served_count"] == 10
    assert ("two Apps", "") in table.rows
    assert table.rows[-1] == ("two Apps' time to serve every job, of one App's", "0.55 (at most 0.6)")


def test_importing_the_benchmarks_leaves_the_environment_alone() -> None:
    # Given a fresh interpreter / When it imports every benchmark
    code = (
        "import importlib, json, os; before = dict(os.environ); "
        f"[importlib.import_module('bench.' + name) for name in {list(BENCHMARKS)!r}]; "
        "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))"
    )
    changed = subprocess.run(  # noqa: S603 - this interpreter, our own code
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    # Then no variable changed: a benchmark sets what it needs only while it runs
    assert json.loads(changed) == []
