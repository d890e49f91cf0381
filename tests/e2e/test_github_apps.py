"""End to end: a burst registered through two GitHub Apps, each with its own limit on the fake GitHub, and
an App whose key is wrong skipped without failing a batch. The whole stack on local AWS, our agents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import burst_1000 as bench_burst_1000
from demo.burst import JIT_ROUTE, rate_limited_world, serve_burst
from emulator.harness.github_app import generate_app_key
from emulator.world import APP_ID, World
from tests.e2e.conftest import accounted, settled

pytestmark = pytest.mark.slow

JOBS = 60
"""Two runs of a 30-job matrix: past the compressed limit of one App's window (another client keeps
each App's window spent until the burst is first refused), small enough for make test."""


@pytest.fixture
def two_apps(tmp_path: Path) -> Iterator[World]:
    with rate_limited_world(tmp_path, apps=2) as running:
        yield running


def registrations_by_app(system: World) -> dict[int, int]:
    admitted = system.github.limits.admitted
    return {app_id: admitted[(app_id, JIT_ROUTE)] for app_id in system.github.state.app_ids}


def test_a_burst_through_two_apps_registers_through_both_and_serves_every_job(two_apps: World) -> None:
    # Given a stack of two Apps, each installed on the owner, each limited by the fake GitHub apart
    assert len(two_apps.stack.plane.config.github.every_app) == 2
    # When JOBS jobs are queued at once (bench/burst_1000.py's two-App burst, small)
    table = bench_burst_1000.run(jobs=JOBS, runs=2, system=two_apps, apps=2)
    print("\n" + table.render())
    figures = table.figures
    key = f"burst_{JOBS}_two_apps"
    # Then every job ran on a runner of ours, no execution failed, and both Apps registered runners
    assert figures[f"{key}_jobs_served_ratio"] == 1.0
    assert figures[f"{key}_jobs_failed_executions_count"] == 0
    assert all(count > 0 for count in registrations_by_app(two_apps).values()), registrations_by_app(two_apps)
    settled(two_apps, timeout=300)
    accounted(two_apps)


def test_an_app_whose_key_is_wrong_is_skipped_and_every_job_is_served_through_the_other(
    tmp_path: Path,
) -> None:
    with rate_limited_world(tmp_path, apps=2) as system:
        # Given the first App's key in Secrets Manager replaced by one GitHub does not know
        first = system.stack.plane.config.github.every_app[0]
        system.aws.client("secretsmanager").put_secret_value(
            SecretId=first.private_key_secret_name, SecretString=generate_app_key().private_pem
        )
        system.github.limits.enabled = False  # the subject is the fault, not the limit
        # When a run of 6 jobs is queued
        burst = serve_burst(system, 6, runs=1, timeout=300)
        # Then every job was served through the second App, none through the first, and no execution failed
        assert burst.served == 6
        assert burst.failed_executions == 0
        by_app = registrations_by_app(system)
        assert by_app[APP_ID] == 0
        assert by_app[APP_ID + 1] >= 6
        settled(system, timeout=120)
        accounted(system)
