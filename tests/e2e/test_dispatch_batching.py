"""A matrix through the real stack with Lambda's real event-source concurrency: its first job is
dispatched at once, the rest in follow-up batches, however the five pollers split the deliveries.

Lambda reads a standard queue with five concurrent batches ("Configuring scaling behavior for SQS
event source mappings", services-sqs-scaling.html); the emulator's event source does the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from emulator.event_sources import STANDARD_QUEUE_POLLERS
from emulator.fake_github import Conclusion, JobSpec
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from infra.constructs.ingress import DEMAND_BATCHING_WINDOW_SECONDS
from tests.e2e.conftest import FAST_INSTANCES, LABEL, LAMBDA_POLLER_TIMERS, completed, eventually

pytestmark = pytest.mark.slow

OLD_BATCHING_WINDOW_SECONDS = 1.0
"""The event source's batching window before issue 15, in front of every run's first job."""


@pytest.fixture
def system(tmp_path: Path) -> Iterator[World]:
    """The whole system with the dispatcher read by Lambda's five pollers."""
    config = compressed_config(timeouts={**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8})
    with world(
        tmp_path, config=config, instance_settings=FAST_INSTANCES, timers=LAMBDA_POLLER_TIMERS
    ) as running:
        yield running


def requested(system: World) -> int:
    """Runners asked for by every provision started so far."""
    return sum(
        json.loads(system.stack.stepfunctions.describe_execution(executionArn=e["executionArn"])["input"])[
            "count"
        ]
        for e in system.stack.executions()
        if e["machine"] == "provision"
    )


def test_a_runs_first_job_waits_for_no_window_and_its_matrix_launches_with_one_create_fleet_per_provision(
    system: World,
) -> None:
    # Given the stack with no runner in the pool, its dispatcher fed by Lambda's five pollers and no window
    assert system.stack.dispatcher.concurrency == STANDARD_QUEUE_POLLERS == 5
    assert DEMAND_BATCHING_WINDOW_SECONDS == 0

    # When a run queues a matrix of 20 jobs (the fake GitHub sends a run's deliveries one by one)
    run = system.start_run("matrix", JobSpec("build", LABEL, matrix=20, seconds=0.3))

    # Then its first provision started sooner after the first delivery than the old window alone took
    eventually(lambda: requested(system) >= 20, "20 runners to be asked for", timeout=60)
    provisions = sorted(
        (e for e in system.stack.executions() if e["machine"] == "provision"), key=lambda e: e["startDate"]
    )
    first_delivery = min(
        d.delivered_at
        for d in system.github.state.deliveries.values()
        if d.action == "queued" and d.event == "workflow_job"
    )
    started: datetime = provisions[0]["startDate"]
    waited = started.timestamp() - first_delivery
    print(f"first delivery -> first provision started: {waited:.3f} s; provisions: {len(provisions)}")
    assert waited < OLD_BATCHING_WINDOW_SECONDS
    # And every job ran on our runners, each provision launching its shortfall with one CreateFleet
    # (how few provisions a matrix costs depends on how fast the deliveries come; with the five pollers
    # and deliveries a window apart at most it is two: tests/integration/test_follow_up_batches.py)
    completed(system, run, timeout=180)
    jobs = [system.github.state.jobs[job_id] for job_id in run.job_ids]
    assert [job.conclusion for job in jobs] == [Conclusion.SUCCESS] * 20
    assert 1 <= system.stack.ec2.calls["CreateFleet"] <= len(provisions)
