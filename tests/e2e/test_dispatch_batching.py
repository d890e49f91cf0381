"""A matrix through the real stack with Lambda's real event-source concurrency: its first job is
dispatched at once, the rest in follow-up batches, however the five pollers split the deliveries.

Lambda reads a standard queue with five concurrent batches ("Configuring scaling behavior for SQS
event source mappings", services-sqs-scaling.html); the emulator's event source does the same.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from demo.burst import queued_spans
from emulator.event_sources import STANDARD_QUEUE_POLLERS
from emulator.fake_github import Conclusion, JobSpec
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from infra.constructs.ingress import DEMAND_BATCHING_WINDOW_SECONDS
from tests.e2e.conftest import (
    FAST_INSTANCES,
    LABEL,
    LAMBDA_POLLER_TIMERS,
    SWEEP_LOOK_SECONDS,
    completed,
    eventually,
    provisions_bound,
)

pytestmark = pytest.mark.slow


AGENTS_IN_PROCESS = dataclasses.replace(FAST_INSTANCES, in_process=True)
"""The subject is the dispatcher: the matrix's twenty agents run in this process (the same agent, without
twenty Python start-ups and their teardown, about 20 s of make test's CPU); the agent as a process of its
own is the other scenarios' subject."""


@pytest.fixture
def system(tmp_path: Path) -> Iterator[World]:
    """The whole system with the dispatcher read by Lambda's five pollers."""
    config = compressed_config(timeouts={**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8})
    with world(
        tmp_path, config=config, instance_settings=AGENTS_IN_PROCESS, timers=LAMBDA_POLLER_TIMERS
    ) as running:
        yield running


def redrives(system: World, execution: dict[str, object]) -> int:
    described = system.stack.stepfunctions.describe_execution(executionArn=execution["executionArn"])
    return int(json.loads(described["input"])["redrives"])


def requested(system: World) -> int:
    """Runners asked for by every provision started so far."""
    return sum(
        json.loads(system.stack.stepfunctions.describe_execution(executionArn=e["executionArn"])["input"])[
            "count"
        ]
        for e in system.stack.executions()
        if e["machine"] == "provision"
    )


def test_a_matrix_of_20_costs_at_most_two_provisions_and_two_create_fleets_with_five_pollers(
    system: World,
) -> None:
    # Given the stack with no runner in the pool, its dispatcher fed by Lambda's five pollers and no window
    assert system.stack.dispatcher.concurrency == STANDARD_QUEUE_POLLERS == 5
    assert DEMAND_BATCHING_WINDOW_SECONDS == 0

    # When a run queues a matrix of 20 jobs (the fake GitHub sends their deliveries side by side, as GitHub
    # promises no order between them)
    run = system.start_run("matrix", JobSpec("build", LABEL, matrix=20, seconds=0.3))

    # Then the matrix cost at most two provisions: its first job's at once, the rest in one follow-up
    eventually(
        lambda: requested(system) >= 20, "20 runners to be asked for", timeout=60, every=SWEEP_LOOK_SECONDS
    )
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
    # (how soon the first starts is a figure, not a check here: on two busy cores the webhook's cold
    # starts dominate it; the dispatch itself waits for no window: tests/integration/test_follow_up_batches.py)
    print(f"first delivery -> first provision started: {waited:.3f} s")
    # And every job ran on our runners, each provision launching its shortfall with one CreateFleet (a
    # provision that ends short asks again: a redrive, not a dispatch, counted apart)
    completed(system, run, timeout=180)
    jobs = [system.github.state.jobs[job_id] for job_id in run.job_ids]
    assert [job.conclusion for job in jobs] == [Conclusion.SUCCESS] * 20
    every = [e for e in system.stack.executions() if e["machine"] == "provision"]
    dispatched = [e for e in every if redrives(system, e) == 0]
    (span,) = queued_spans(system).values()
    bound = provisions_bound(span)
    print(
        f"dispatched {len(dispatched)} (bound {bound}, deliveries over {span:.2f} s), redriven "
        f"{len(every) - len(dispatched)}"
    )
    assert len(dispatched) <= bound
    assert 1 <= system.stack.ec2.calls["CreateFleet"] <= len(every)
    # And the follow-up was gathered by the follow-up state machine, each execution through to its end
    # (its leader handed it over rather than wait for the window in the dispatcher)
    follow_ups = [e for e in system.stack.executions() if e["machine"] == "follow_up"]
    assert follow_ups
    assert {e["status"] for e in follow_ups} == {"SUCCEEDED"}


def test_a_matrix_whose_later_deliveries_fail_is_served_by_its_follow_up_from_githubs_list(
    system: World,
) -> None:
    # Given GitHub failing to deliver every `queued` event of a 12-job matrix but its first two (they
    # are listed as failed deliveries, for refresh to ask again, seconds later)
    passed: list[int] = []

    def after_the_first_two(payload: dict[str, object]) -> bool:
        if len(passed) < 2:
            passed.append(1)
            return False
        return True

    system.github.webhooks.drop_next("workflow_job", "queued", count=10, where=after_the_first_two)
    # When the run queues it
    run = system.start_run("matrix", JobSpec("build", LABEL, matrix=12, seconds=0.3))
    # Then the run cost two provisions with all 12 runners, its first dispatch's and one follow-up's: the
    # follow-up took from GitHub's list of the run's queued jobs those whose deliveries had not come
    # (GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt}/jobs), and the redelivered
    # events found their jobs counted. (Without the list the follow-up opened by the second delivery
    # seals with it alone, and the redeliveries make a third provision: [1, 1, 10]. On a loaded machine
    # the first two deliveries may reach one dispatch, [2, 10]; the redeliveries then lead the follow-up.)
    completed(system, run, timeout=180)
    jobs = [system.github.state.jobs[job_id] for job_id in run.job_ids]
    assert [job.conclusion for job in jobs] == [Conclusion.SUCCESS] * 12
    counts = [
        json.loads(system.stack.stepfunctions.describe_execution(executionArn=e["executionArn"])["input"])
        for e in system.stack.executions()
        if e["machine"] == "provision" and redrives(system, e) == 0
    ]
    print(f"provisions dispatched: {sorted(request['count'] for request in counts)}")
    assert len(counts) == 2
    assert sum(request["count"] for request in counts) == 12
