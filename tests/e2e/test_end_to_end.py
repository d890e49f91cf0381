"""The whole system on one machine: GitHub's webhooks in, runners out, and every instance accounted for.

Each test starts workflow runs on the fake GitHub and lets the real stack (webhook, dispatcher,
state machines, refresh) and the real agents on simulated instances do the rest.
"""

from __future__ import annotations

import io
import itertools
import json
import time

import pytest

from bench.day_trace import FALLBACK_CONTROL_PLANE_MICRODOLLARS, Outcome, policies
from emulator.boot_model import Path
from emulator.fake_github import Conclusion, JobSpec, JobStatus
from emulator.timeline import Happening
from emulator.world import World
from runner_pool.adapters.cost_ledger import DynamoDbCostLedger
from runner_pool.cli import Deployment, Operator
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.cost import Charges, Grouping, utc_day
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import HandOverTier
from tests.e2e.conftest import (
    LABEL,
    accounted,
    awaited,
    completed,
    demand_handled,
    job_of,
    one_pooled,
    retired,
    settled,
)

pytestmark = pytest.mark.slow


def launched(system: World) -> list[str]:
    return [e.instance_id or "" for e in system.timeline.events() if e.happening is Happening.LAUNCHED]


def provisions(system: World) -> list[dict[str, object]]:
    return [e for e in system.stack.executions() if e["machine"] == "provision"]


def test_a_later_workflow_reuses_the_instance_an_earlier_one_cold_started(system: World) -> None:
    # Given a first run whose job cold-started an instance, back in the pool once the job was done
    first = completed(system, system.start_run("build", JobSpec("build", LABEL, seconds=0.5)))
    settled(system)

    # When a second workflow's job is queued
    second = completed(system, system.start_run("test", JobSpec("test", LABEL, seconds=0.5)))

    # Then it ran on that same instance, and no other instance was launched
    assert instance_of_runner(job_of(system, second).runner_name) == instance_of_runner(
        job_of(system, first).runner_name
    )
    assert job_of(system, second).conclusion is Conclusion.SUCCESS
    assert len(launched(system)) == 1
    # And `runner-pool cost` prices its two hand-overs (cold, then hot) as the day trace prices them
    settled(system)
    cost_agrees_with_the_day_trace(system, [HandOverTier.COLD, HandOverTier.HOT])


def cost_agrees_with_the_day_trace(system: World, tiers: list[HandOverTier]) -> None:
    """The stack's hand-over items are the jobs' (their tiers, in order), and `runner-pool cost` prices
    them as bench/day_trace.py prices the same hand-over seconds and jobs (its Outcome's `charges`, on
    each instance type as its usage runs it): one function, so they agree within rounding."""
    ledger = DynamoDbCostLedger(system.stack.plane.settings.table_name, system.aws.client("dynamodb"))
    hand_overs = sorted(ledger.day(utc_day(time.time()))[0], key=lambda item: item.started_at)
    assert [item.tier for item in hand_overs] == tiers
    assert all(item.seconds > 0 for item in hand_overs)
    out = io.StringIO()
    deployment = Deployment(system.stack.plane.settings.table_name, "", ())
    operator = Operator(deployment, system.aws.client("dynamodb"), None, SystemClock(), out)
    assert operator.cost("1d", Grouping.REPOSITORY, as_json=True) == 0
    reported = json.loads(out.getvalue())
    hot = {policy.name: policy for policy in policies()}["hot_baked"]
    traced = Charges()
    for (instance_type, usage), items in itertools.groupby(
        sorted(hand_overs, key=lambda item: (item.instance_type, item.usage_class)),
        key=lambda item: (item.instance_type, item.usage_class),
    ):
        group = list(items)
        seconds = sum(item.seconds for item in group)
        outcome = Outcome(hot, paths=[PATHS[item.tier] for item in group], billed_seconds=seconds)
        outcome.volume_seconds = seconds
        traced += outcome.charges(FALLBACK_CONTROL_PLANE_MICRODOLLARS, instance_type, usage)
    jobs = sum(group["jobs"] for group in reported["groups"].values())
    total = sum(group["total_usd"] for group in reported["groups"].values())
    assert jobs == traced.jobs == len(tiers)
    assert total == pytest.approx(traced.total_usd, abs=1e-5)


PATHS = {HandOverTier.COLD: Path.COLD_BAKED, HandOverTier.HOT: Path.HOT, HandOverTier.STOPPED: Path.STOPPED}
"""How the day trace names the tier a job was served from."""


def test_an_instance_dead_when_claimed_is_discarded_and_the_job_still_gets_a_runner(system: World) -> None:
    # Given one instance in the pool whose agent dies just as a job is queued (its last beat still fresh)
    pooled = one_pooled(system)
    run = system.start_run("test", JobSpec("test", LABEL, seconds=0.5))
    system.instances.crash(pooled)

    # When the control plane claims it and the agent never registers
    completed(system, run)

    # Then the job ran on a fresh instance, and the dead one was terminated
    job = job_of(system, run)
    assert job.conclusion is Conclusion.SUCCESS
    assert instance_of_runner(job.runner_name) not in (None, pooled)
    retired(system, pooled, "the dead instance to end")


def test_a_dropped_queued_webhook_is_recovered_by_refreshs_redelivery(system: World) -> None:
    # Given GitHub fails to deliver the queued webhook of a run's only job
    system.github.webhooks.drop_next("workflow_job", "queued")

    # When the run starts
    run = completed(system, system.start_run("build", JobSpec("build", LABEL, seconds=0.5)))

    # Then refresh asked GitHub to deliver it again, and the job got its runner
    queued = [d for d in system.github.state.deliveries.values() if d.action == "queued"]
    assert sorted((d.redelivery, d.succeeded) for d in queued) == [(False, False), (True, True)]
    assert len({d.guid for d in queued}) == 1
    assert job_of(system, run).conclusion is Conclusion.SUCCESS


def test_a_duplicated_delivery_has_no_second_effect(system: World) -> None:
    # Given a run whose job was served
    run = completed(system, system.start_run("build", JobSpec("build", LABEL, seconds=0.5)))
    settled(system)
    queued = next(d for d in system.github.state.deliveries.values() if d.action == "queued")

    # When GitHub delivers its queued webhook once more
    again = system.github.state.redeliver(queued.delivery_id)
    demand_handled(system)  # a provision it caused would have started by then

    # Then it was answered as the first was, and nothing more was provisioned or launched
    assert again.status_code == queued.status_code
    assert len(provisions(system)) == 1
    assert len(launched(system)) == 1
    assert job_of(system, run).conclusion is Conclusion.SUCCESS


def test_cancelling_a_run_releases_its_instance_back_to_the_pool(system: World) -> None:
    # Given a run whose long job is running on an instance
    run = system.start_run("build", JobSpec("build", LABEL, seconds=120))
    job = job_of(system, run)
    awaited(system, lambda: job.status is JobStatus.IN_PROGRESS, "the job to start")
    instance_id = instance_of_runner(job.runner_name)

    # When the run is cancelled
    system.github.actions.cancel_run(run.run_id)

    # Then the instance is released: idle, in date, and offered in the pool again
    completed(system, run)
    settled(system)
    record = system.records.get(instance_id or "")
    assert record is not None
    assert record.state is InstanceState.IDLE
    assert job.conclusion is Conclusion.CANCELLED
    accounted(system)
