"""No silent wait, on the whole system: a job whose class EC2 has no capacity for gets a check run on its
run's commit saying why, waits, and is served when the capacity comes back, its check run concluded; every
instance accounted for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.fake_github import Conclusion, JobSpec
from emulator.fake_github.payloads import HEAD_SHA
from emulator.world import World
from runner_pool.domain.capacity_waits import CHECK_RUN_NAME, LONGEST_BACKOFF
from runner_pool.domain.refresh import RECONCILE_GRACE_SECONDS
from tests.e2e.conftest import LABEL, accounted, awaited, completed, e2e_world, job_of, settled

pytestmark = pytest.mark.slow

LARGE_CPU = 2
RETRY_SECONDS = 4.0
"""fleet.capacity_retry_seconds: refresh runs every 2 s here, so the jobs are tried again within seconds."""


@pytest.fixture
def system(tmp_path: Path) -> Iterator[World]:
    with e2e_world(tmp_path, fleet={"capacity_retry_seconds": RETRY_SECONDS}) as running:
        yield running


def test_a_job_without_capacity_is_told_why_and_served_when_capacity_comes_back(system: World) -> None:
    # Given EC2 has no capacity of the large class's size, spot or on-demand
    system.stack.ec2.exhaust(LARGE_CPU, code="UnfulfillableCapacity")

    # When a job asks for a large runner
    run = system.start_run("build", JobSpec("build", LABEL, seconds=0.5))

    # Then a check run on the run's commit names the job, its class and EC2's error, and stays in progress
    def check_run() -> dict | None:  # type: ignore[type-arg]
        with system.github.state.lock:
            return next(iter(system.github.state.check_runs.values()), None)

    waiting = awaited(system, check_run, "a check run saying why the job waits")
    assert (waiting["name"], waiting["head_sha"], waiting["status"]) == (
        CHECK_RUN_NAME,
        HEAD_SHA,
        "in_progress",
    )
    assert "`build`" in waiting["output"]["title"]
    assert "`large`" in waiting["output"]["summary"]
    assert "UnfulfillableCapacity" in waiting["output"]["summary"]
    assert job_of(system, run).runner_name is None

    # When the capacity comes back
    system.stack.ec2.replenish(LARGE_CPU)

    # Then after the back-off the job is served and succeeds, and its check run is concluded
    completed(system, run, timeout=LONGEST_BACKOFF * RETRY_SECONDS + RECONCILE_GRACE_SECONDS + 60)
    assert job_of(system, run).conclusion is Conclusion.SUCCESS
    awaited(system, lambda: check_run()["status"] == "completed", "the check run to be concluded")  # type: ignore[index]
    assert check_run()["conclusion"] == "success"  # type: ignore[index]
    settled(system)
    accounted(system)
