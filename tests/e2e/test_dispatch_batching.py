"""A matrix through the real stack with Lambda's real event-source concurrency: its first job is
dispatched at once, the rest in one follow-up batch, however the five pollers split the deliveries.

Lambda reads a standard queue with five concurrent batches ("Configuring scaling behavior for SQS
event source mappings", services-sqs-scaling.html); the emulator's event source does the same.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from emulator.event_sources import STANDARD_QUEUE_POLLERS
from emulator.fake_github import Conclusion, JobSpec
from emulator.world import World
from infra.constructs.ingress import DEMAND_BATCHING_WINDOW_SECONDS
from runner_pool.domain.demand import FOLLOW_UP_WINDOW_SECONDS
from tests.e2e.conftest import LABEL, completed, eventually

pytestmark = pytest.mark.slow

OLD_BATCHING_WINDOW_SECONDS = 1.0
"""The event source's batching window before issue 15, in front of every run's first job."""


def requested(system: World) -> int:
    """Runners asked for by every provision started so far."""
    return sum(
        json.loads(system.stack.stepfunctions.describe_execution(executionArn=e["executionArn"])["input"])[
            "count"
        ]
        for e in system.stack.executions()
        if e["machine"] == "provision"
    )


def test_a_matrix_of_twenty_costs_two_executions_and_its_first_job_waits_for_no_window(system: World) -> None:
    # Given the stack with no runner in the pool, its dispatcher fed by Lambda's five pollers and no window
    assert system.stack.dispatcher.concurrency == STANDARD_QUEUE_POLLERS == 5
    assert DEMAND_BATCHING_WINDOW_SECONDS == 0

    # When a run queues a matrix of 20 jobs (20 `queued` deliveries, sent at once by the fake GitHub)
    run = system.start_run("matrix", JobSpec("build", LABEL, matrix=20, seconds=0.3))

    # Then the matrix was asked for in at most two provision executions
    eventually(lambda: requested(system) >= 20, "20 runners to be asked for", timeout=60)
    provisions = sorted(
        (e for e in system.stack.executions() if e["machine"] == "provision"), key=lambda e: e["startDate"]
    )
    assert 1 <= len(provisions) <= 2, [(e["name"], e["startDate"]) for e in provisions]
    # And every job ran on our runners, launched with at most two CreateFleet calls
    completed(system, run, timeout=180)
    jobs = [system.github.state.jobs[job_id] for job_id in run.job_ids]
    assert [job.conclusion for job in jobs] == [Conclusion.SUCCESS] * 20
    assert 1 <= system.stack.ec2.calls["CreateFleet"] <= 2
    # And the first provision started sooner after the first delivery than the old window alone took
    first_delivery = min(
        d.delivered_at
        for d in system.github.state.deliveries.values()
        if d.action == "queued" and d.event == "workflow_job"
    )
    started: datetime = provisions[0]["startDate"]
    waited = started.timestamp() - first_delivery
    print(f"first delivery -> first provision started: {waited:.3f} s; provisions: {len(provisions)}")
    assert waited < OLD_BATCHING_WINDOW_SECONDS
    # And a second one, if any, started once the follow-up window had closed, not a window per batch
    if len(provisions) == 2:
        gap = provisions[1]["startDate"].timestamp() - started.timestamp()
        assert gap >= FOLLOW_UP_WINDOW_SECONDS * 0.9
