"""Refresh applying adaptive sizing (`pool.sizing: adaptive`): its Lambda handler on moto, the class history in
the state table, the sizing rule's number against the schedule's.

After every test the accounting holds: every EC2 instance of the stack has a live record, and every live
record an instance.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.harness.control_plane import LocalControlPlane, client, local_control_plane, stack_config
from runner_pool.adapters.class_history import ENTRIES_ATTRIBUTE, HISTORY_PREFIX
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY
from runner_pool.domain.class_history import Entry, Fact, demand_of
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import Signal
from runner_pool.domain.refresh import refresh_tick
from runner_pool.domain.sizing import Holding, pool_size
from runner_pool.handlers.refresh import refresh_of

LAUNCH_SECONDS = 90.0
HORIZON_SECONDS = 300.0
"""`pool.sizing_horizon_minutes` of 5: arrivals leave it well within an idle instance's 10 minutes."""


@pytest.fixture
def adaptive() -> Iterator[LocalControlPlane]:
    """A stack that sizes its pool by the rule over 5 minutes of arrivals, over a schedule of one idle
    `large` instance; watched (its history first read) two horizons ago, its launches measured at 90 s."""
    yield from watched(
        warm_pool_minimum={"large": 1}, pool={"sizing": "adaptive", "sizing_horizon_minutes": 5}
    )


def watched(**config: object) -> Iterator[LocalControlPlane]:
    """A stack of `config` whose class was first read two horizons ago, its launches measured at 90 s;
    its accounting checked once the test is done."""
    with local_control_plane(stack_config(**config)) as plane:
        plane.plane.class_history.read("large", plane.clock.now())
        plane.clock.advance(2 * HORIZON_SECONDS)
        launch = [Entry(f"i-measured-{n}", LAUNCH_SECONDS) for n in range(5)]
        plane.plane.class_history.note(Fact.LAUNCH, "large", launch, plane.clock.now() - 600)
        yield plane
        accounting = plane.accounting()
        assert accounting.holds, accounting.problems


def burst(local: LocalControlPlane, jobs: int, minutes: int) -> None:
    """`jobs` arrivals each of the last `minutes` minutes, noted as the dispatcher notes them."""
    notes = local.plane.class_history
    for minute in range(minutes):
        at = local.clock.now() - (minutes - minute) * 60 + 5
        notes.note(Fact.ARRIVAL, "large", [Entry(f"{minute}-{n}", at + n) for n in range(jobs)], at)


def the_rules_number(local: LocalControlPlane) -> Holding:
    """What the rule says from what the history holds now, the schedule its floor."""
    now = local.clock.now()
    record = local.plane.class_history.read("large", now - 2 * HORIZON_SECONDS)
    config = local.config
    return pool_size(
        demand_of(record, 60.0),
        config.pool.target_wait_seconds,
        now,
        Holding(config.warm_minimum("large", now), config.stopped_minimum("large", now)),
        Holding(config.pool.hot_maximum, config.pool.stopped_maximum),
        horizon_seconds=HORIZON_SECONDS,
    )


def pool_booted(local: LocalControlPlane) -> None:
    for record in local.table.live():
        if record.state is InstanceState.CREATED and record.run_key is None:
            local.table.write_heartbeat(record.instance_id)
            local.table.write_signal(record.instance_id, Signal.UD_OK)


def test_a_burst_of_arrivals_grows_the_hot_pool_to_the_rules_number(adaptive: LocalControlPlane) -> None:
    # Given three jobs a minute for the last ten minutes of a class whose launches take 90 s
    burst(adaptive, 3, 10)
    expected = the_rules_number(adaptive)
    assert expected.hot > 1

    # When refresh runs
    report = adaptive.refresh()

    # Then the class's number is the rule's, above its schedule's, and the shortfall was launched
    assert report["minimum"]["large"] == expected.hot
    assert report["launched"] == {"large": expected.hot}


def test_when_arrivals_stop_the_surplus_is_taken_back_down_to_the_schedule(
    adaptive: LocalControlPlane,
) -> None:
    # Given a pool grown by a burst, booted and admitted
    burst(adaptive, 3, 10)
    grown = adaptive.refresh()["launched"]["large"]
    pool_booted(adaptive)
    adaptive.clock.advance(30)
    assert adaptive.refresh()["admitted"] == grown

    # When no job arrives for more than the horizon and a lead (launch and refresh period), and refresh runs
    adaptive.clock.advance(HORIZON_SECONDS + LAUNCH_SECONDS + 90)
    pool_booted(adaptive)  # their agents beat on
    report = adaptive.refresh()

    # Then the class is back at its schedule: all but one idle instance ended, none launched
    assert report["minimum"]["large"] == 1
    assert report["trimmed"] == {"large": grown - 1}
    assert report["launched"] == {}
    now = adaptive.clock.now()
    idle = [r for r in adaptive.table.live() if r.state is InstanceState.IDLE and not r.threshold_passed(now)]
    assert len(idle) == 1


def test_an_idle_instance_a_claim_takes_while_refresh_runs_is_never_taken_back(
    adaptive: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three idle instances where the schedule holds one, and no arrivals: two are surplus
    pooled = adaptive.pooled(3)
    # And refresh reading them idle, but a job's claim landing on each before refresh acts
    seen = adaptive.table.live()
    for record in pooled:
        assert adaptive.table.claim(record.instance_id, "pool=9", f"claim-{record.instance_id}").succeeded
    monkeypatch.setattr(adaptive.table, "live", lambda: seen)

    # When refresh takes the surplus back (its run over this plane's table, which read them idle)
    report = refresh_of(adaptive.plane).run(refresh_tick(adaptive.clock.now(), adaptive.config))

    # Then it ended none: each claim came first, and its instance is its job's
    assert report.trimmed == {}
    assert all(adaptive.record(r.instance_id).state is InstanceState.CLAIMED for r in pooled)
    monkeypatch.undo()
    for record in pooled:
        adaptive.table.expire(record.instance_id)
    adaptive.refresh()


def test_a_history_that_cannot_be_read_keeps_the_schedule(adaptive: LocalControlPlane) -> None:
    # Given a burst, and an arrival item that does not parse
    burst(adaptive, 3, 10)
    client("dynamodb").put_item(
        TableName=adaptive.plane.settings.table_name,
        Item={
            PARTITION_KEY: {"S": f"{HISTORY_PREFIX}large#{Fact.ARRIVAL.value}"},
            SORT_KEY: {"S": str(int(adaptive.clock.now() // 60 * 60)).zfill(12)},
            ENTRIES_ATTRIBUTE: {"SS": ["job@not-a-time"]},
        },
    )

    # When refresh runs
    report = adaptive.refresh()

    # Then the class keeps its schedule (one idle instance), and refresh itself did not fail
    assert report["minimum"]["large"] == 1
    assert report["launched"] == {"large": 1}
    assert report["failed"] == []


def test_on_the_schedule_the_history_changes_nothing() -> None:
    # Given a stack on the schedule (the default) with a burst in its history
    with local_control_plane(stack_config(warm_pool_minimum={"large": 1})) as local:
        local.plane.class_history.read("large", local.clock.now())
        local.clock.advance(2 * HORIZON_SECONDS)
        local.plane.class_history.note(
            Fact.LAUNCH, "large", [Entry("i-1", LAUNCH_SECONDS)], local.clock.now()
        )
        burst(local, 3, 10)
        # When refresh runs / Then it keeps the schedule's one
        report = local.refresh()
        assert (report["minimum"]["large"], report["launched"]) == (1, {"large": 1})


@pytest.fixture
def tiered() -> Iterator[LocalControlPlane]:
    """An adaptive stack with no schedule (floor 0), on-demand by default, with a stopped tier of up to 3."""
    yield from watched(
        defaults={"usage": "on-demand"},
        pool={"sizing": "adaptive", "sizing_horizon_minutes": 5, "stopped_maximum": 3},
    )


def test_the_stopped_tier_holds_the_rules_number_not_the_maximum(tiered: LocalControlPlane) -> None:
    # Given no arrivals (the rule holds nothing), two stopped instances, and one clean idle instance whose
    # idle time ends before refresh's next run: under the schedule, the maximum of 3 would stop it too
    *stopped, idle = tiered.pooled(3)
    for record in (*stopped, idle):
        tiered.table.write_heartbeat(record.instance_id)
        tiered.table.write_signal(record.instance_id, Signal.UD_OK)
    for record in stopped:
        assert tiered.table.stop(record.instance_id).succeeded
        tiered.ec2.stop_instances(InstanceIds=[record.instance_id])
        until = tiered.clock.now() + tiered.config.pool.stopped_max_age_minutes * 60
        assert tiered.table.mark_stopped(tiered.record(record.instance_id), until).succeeded
    tiered.clock.advance(tiered.config.timeouts.idle_seconds - 30)
    assert the_rules_number(tiered) == Holding()

    # When refresh runs
    report = tiered.refresh()

    # Then the idle one is not stopped (the rule wants none stopped), and it and the stopped ones are taken
    # back (the rule wants none hot either)
    assert report["stopping"] == 0
    assert report["trimmed"] == {"large": 3}
    # And the next run terminates them, stopped or idle, as due
    tiered.clock.advance(60)
    assert tiered.refresh()["terminated"] == {"stopped": 2, "idle": 1}


def test_past_a_budget_that_drops_warm_minimums_the_rule_holds_nothing_hot() -> None:
    # Given an adaptive stack with a daily budget that drops warm minimums, which a running instance passes
    plane = watched(
        warm_pool_minimum={"large": 1},
        pool={"sizing": "adaptive", "sizing_horizon_minutes": 5},
        budget={"daily_usd": 0.0001, "drop_warm_minimums": True},
    )
    adaptive = next(plane)
    adaptive.running("pool=1")
    adaptive.clock.advance(3600)
    # And three jobs a minute for the last ten minutes, for which the rule alone would hold some hot
    burst(adaptive, 3, 10)
    assert the_rules_number(adaptive).hot > 1

    # When refresh runs past the budget
    report = adaptive.refresh()

    # Then the class holds nothing hot and launches nothing for the pool
    assert report["minimum"]["large"] == 0
    assert report["launched"].get("large", 0) == 0
    next(plane, None)  # the accounting check
