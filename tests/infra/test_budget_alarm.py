"""The daily budget's alarm as synthesised, evaluated as CloudWatch would over the spend refresh emits."""

from __future__ import annotations

import pytest

from emulator.cloudwatch_alarms import ALARM, OK, evaluate, metric_data
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.cost import HandOverCost, InstanceLife
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.prices import ec2_hourly
from runner_pool.steps.spend import Spend
from tests.infra.synthesis import Synthesis
from tests.infra.test_observability import alarms
from tests.support import builders

MIDNIGHT = 1_800_057_600.0
"""2027-01-16 00:00 UTC."""
NOW = MIDNIGHT + 10 * 3600


class EmptyDay:
    """A cost ledger with nothing ended today: today's spend is the live instances' alone."""

    def hand_over_ended(self, cost: HandOverCost) -> bool:
        raise AssertionError("the budget writes nothing")

    def instance_ended(self, life: InstanceLife) -> bool:
        raise AssertionError("the budget writes nothing")

    def day(self, day: str) -> tuple[list[HandOverCost], list[InstanceLife]]:
        return [], []


def running_since_midnight(count: int) -> list[InstanceRecord]:
    return [
        InstanceRecord.model_validate(
            {
                **builders.facts(number).model_dump(),
                "state": InstanceState.RUNNING,
                "run_key": f"pool={number}",
                "threshold": NOW + 3600,
                "created_at": MIDNIGHT,
                "updated_at": MIDNIGHT,
            }
        )
        for number in range(1, count + 1)
    ]


def spend_emitted(
    synthesis: Synthesis, live: list[InstanceRecord], capsys: pytest.CaptureFixture[str]
) -> Spend:
    spend = Spend(EmptyDay, ManualClock(NOW), synthesis.config)
    capsys.readouterr()
    spend.keep_budget(live)
    return spend


def test_the_budget_alarm_fires_once_todays_spend_passes_the_budget(
    custom_synthesis: Synthesis, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the stack with a $5 daily budget that drops warm minimums, and its synthesised alarm
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    budget = custom_synthesis.config.budget.daily_usd
    assert budget == 5
    (alarm,) = [a for name, a in alarms(custom_synthesis).items() if name.startswith("DailyBudgetExceeded")]
    facts = builders.facts(1)
    hourly = ec2_hourly(facts.instance_type, facts.usage_class.value) or 0.0
    enough = int(budget / (hourly * 10)) + 1
    # When refresh keeps the budget at 10:00 UTC with enough instances running since midnight to pass it
    spend = spend_emitted(custom_synthesis, running_since_midnight(enough), capsys)
    data = metric_data(capsys.readouterr().out.splitlines())
    # Then the spend it emitted puts the alarm in ALARM, and the warm minimums are dropped
    assert [datum.name for datum in data] == ["DailySpendUsd", "WarmMinimumsDropped"]
    assert data[0].value > budget
    # (the alarm looks when the reading was emitted: Powertools stamps it with the wall clock, not refresh's)
    assert evaluate(alarm, data, data[0].at) == ALARM
    assert spend.dropped
    # And with half as many, the spend stays under it: OK, and the minimums stand
    spend = spend_emitted(custom_synthesis, running_since_midnight(enough // 2), capsys)
    data = metric_data(capsys.readouterr().out.splitlines())
    assert evaluate(alarm, data, data[0].at) == OK
    assert not spend.dropped
    # And an hour without a reading is within the threshold (missing data: not breaching)
    assert evaluate(alarm, [], NOW) == OK
