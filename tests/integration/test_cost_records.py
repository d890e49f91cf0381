"""The cost items on moto, through the release state machine and refresh as deployed (their IAM checked):
a hand-over recorded once however often its step runs, an instance's life when refresh ends it."""

from __future__ import annotations

import pytest

from emulator.harness.control_plane import LocalControlPlane, LocalStateMachine, client, stack_config
from emulator.harness.release_world import ReleaseAgents as Agents
from runner_pool.adapters.cost_ledger import DynamoDbCostLedger
from runner_pool.cost_command import read_report
from runner_pool.domain.cost import Grouping, utc_day
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import HandOverTier
from runner_pool.domain.release import ReleaseItem, ReleaseStatus
from runner_pool.handlers.release import release_of
from tests.integration.conftest import accounted_plane

RUN = "pool=101"


@pytest.fixture
def release(local: LocalControlPlane) -> LocalStateMachine:
    return local.deploy("release")


def test_a_retried_release_records_its_hand_over_once_and_refresh_the_instances_life(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given an instance launched cold for a run's job five minutes ago, running it, whose agent answers
    (running,) = local.running(RUN)
    local.clock.advance(300)
    agents = Agents(local)
    agents.serve(running.instance_id, RUN)
    # When its job's release gives it back, and the give-back step runs again (a retry after its effect)
    request = ReleaseRequest(run_key=RUN, instance_id=running.instance_id, cause="job-1")
    execution = release.run(request.model_dump(mode="json"), on_wait=agents.on_wait)
    assert execution.status == "SUCCEEDED", execution.output
    item = ReleaseItem(instance_id=running.instance_id, run_key=RUN, poll_seconds=5)
    local.clock.advance(1)
    assert release_of(local.plane).give_back(item).status is ReleaseStatus.AWAITING_RECEIPT
    # Then one hand-over is recorded: cold, five minutes, at the price in force
    ledger = DynamoDbCostLedger(local.plane.settings.table_name, client("dynamodb"))
    (hand_over,), lives = ledger.day(utc_day(local.clock.now()))
    assert (hand_over.instance_id, hand_over.tier, hand_over.seconds) == (
        running.instance_id,
        HandOverTier.COLD,
        300,
    )
    assert hand_over.volume_gib == local.config.instances.root_volume_gib
    assert lives == []

    # When it is expired an hour later and refresh terminates it
    local.clock.advance(3600)
    local.table.expire(running.instance_id)
    local.refresh()
    assert local.record(running.instance_id).state is InstanceState.TERMINATED
    # Then its life is recorded, and the report keeps its idle share apart from the job's
    _, (life,) = ledger.day(utc_day(local.clock.now()))
    assert life.seconds == local.clock.now() - running.created_at
    found = read_report(ledger, local.clock.now(), 86_400, Grouping.CLASS)
    assert found.jobs.jobs == 1
    assert found.idle.jobs == 0
    assert found.idle.ebs_usd > 0
    assert found.total.total_usd == pytest.approx(found.jobs.total_usd + found.idle.total_usd)


@pytest.mark.parametrize("drop", [True, False], ids=["drops", "alarms-only"])
def test_past_the_daily_budget_refresh_holds_the_warm_minimum_at_zero_when_asked(drop: bool) -> None:
    # Given a stack keeping two idle `large` instances, with a daily budget a running instance passes
    config = stack_config(
        warm_pool_minimum={"large": 2}, budget={"daily_usd": 0.0001, "drop_warm_minimums": drop}
    )
    with accounted_plane(config, pause=lambda _seconds: None) as local:
        local.running(RUN)
        local.clock.advance(3600)
        # When refresh runs
        report = local.refresh()
        # Then, asked to, it holds the warm minimum at 0 and launches nothing for the pool; else it keeps 2
        assert report["minimum"]["large"] == (0 if drop else 2)
        assert report["launched"].get("large", 0) == (0 if drop else 2)
