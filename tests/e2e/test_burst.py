"""A burst of demand: many queued jobs across 10 runs, on a pool that has some warm instances.

Agents run in this process (`InstanceSettings.in_process`) with slower periods: a hundred agent
processes would cost more start-up than the test has time for, and the subject here is the
control plane's batching, claiming and launching, not the agent. The issue's full burst (100 jobs)
takes minutes on a 2-core machine, so `make test` runs 30 and RUNNER_POOL_E2E_FULL_BURST=1 runs 100.
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from pathlib import Path

import pytest

from emulator.deployment import Timers
from emulator.fake_github import Conclusion, JobSpec
from emulator.simulated_instances import InstanceSettings
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from tests.e2e.conftest import LABEL, completed, eventually

pytestmark = pytest.mark.slow

RUNS = 10
WARM = 10
FULL_BURST = os.environ.get("RUNNER_POOL_E2E_FULL_BURST") == "1"


@pytest.fixture
def busy_system(tmp_path: Path) -> World:  # type: ignore[misc]
    config = compressed_config(
        timeouts={**COMPRESSED_TIMEOUTS, "healthy_window_seconds": 10},
        warm_pool_minimum={"large": WARM},
    )
    instances = InstanceSettings(
        boot_delay_seconds=0.5, heartbeat_period_seconds=3.0, watch_period_seconds=5.0, in_process=True
    )
    timers = Timers(refresh_every_seconds=2.0)
    with world(tmp_path, config=config, instance_settings=instances, timers=timers) as running:
        yield running


@pytest.mark.parametrize(
    "matrix",
    [
        3,
        pytest.param(
            10, marks=pytest.mark.skipif(not FULL_BURST, reason="RUNNER_POOL_E2E_FULL_BURST=1 runs it")
        ),
    ],
)
def test_a_burst_gets_one_fleet_per_provision_and_never_shares_an_instance(
    busy_system: World, matrix: int
) -> None:
    # Given a warm pool of 10 idle instances
    def pooled() -> bool:
        idle = [r for r in busy_system.records.live() if r.state is InstanceState.IDLE]
        return len(idle) >= WARM

    eventually(pooled, "the warm pool to fill", 60)

    # When 10 runs of a matrix are queued at once
    runs = [
        busy_system.start_run(f"burst-{n}", JobSpec("shard", LABEL, matrix=matrix, seconds=0.5))
        for n in range(RUNS)
    ]
    for run in runs:
        completed(busy_system, run, timeout=150)

    # Then every job ran, and no provision made more than one CreateFleet
    jobs = [busy_system.github.state.jobs[j] for run in runs for j in run.job_ids]
    assert all(job.conclusion is Conclusion.SUCCESS for job in jobs)
    provisions = [e for e in busy_system.stack.executions() if e["machine"] == "provision"]
    launches = busy_system.stack.ec2.launches
    assert all(launches[execution["name"]] <= 1 for execution in provisions), launches
    assert sum(launches[execution["name"]] for execution in provisions) > 0  # the cold ones were launched
    # ... and no instance ever ran two jobs at once
    by_instance: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job in jobs:
        assert job.started_at is not None
        assert job.completed_at is not None
        by_instance[instance_of_runner(job.runner_name) or "?"].append((job.started_at, job.completed_at))
    for spans in by_instance.values():
        for (_, first_end), (second_start, _) in itertools.pairwise(sorted(spans)):
            assert first_end <= second_start
