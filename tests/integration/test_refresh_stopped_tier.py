"""Refresh keeps the stopped tier (issue 16, item 2): its Lambda handler on moto, the real state table and EC2.

After every test the accounting holds: every EC2 instance of the stack, stopped ones too, has a live
record, and every live record an instance.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.harness.control_plane import LocalControlPlane, local_control_plane, stack_config
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord, Signal
from tests.integration.conftest import accounted_plane

ONE_TICK = 60.0
ENDING_SOON = 30.0
"""Seconds of idle time left: less than one refresh period, so refresh's next run comes too late."""


@pytest.fixture
def tiered() -> Iterator[LocalControlPlane]:
    """A stack whose jobs run on-demand by default, with a stopped tier of one instance per class."""
    config = stack_config(
        defaults={"usage": "on-demand"}, pool={"stopped_maximum": 1, "stopped_max_age_minutes": 120}
    )
    with accounted_plane(config) as plane:
        yield plane


def clean_idle(local: LocalControlPlane, count: int = 1) -> list[InstanceRecord]:
    """Idle pool instances whose agents booted and are clean (UD_OK, a fresh heartbeat)."""
    records = local.pooled(count)
    for record in records:
        local.table.write_heartbeat(record.instance_id)
        local.table.write_signal(record.instance_id, Signal.UD_OK)
    return records


def idle_time_nearly_over(local: LocalControlPlane) -> None:
    local.clock.advance(local.config.timeouts.idle_seconds - ENDING_SOON)


def idle_time_over(local: LocalControlPlane) -> InstanceRecord:
    """A clean idle instance, refresh run as its idle time nearly ends, and the clock one tick on: the
    instance's idle time is over, for the next refresh to act on."""
    (record,) = clean_idle(local)
    idle_time_nearly_over(local)
    local.refresh()
    local.clock.advance(ONE_TICK)
    return record


def test_an_idle_on_demand_instance_whose_idle_time_ends_is_stopped_not_terminated(
    tiered: LocalControlPlane,
) -> None:
    # Given a clean idle on-demand instance whose idle time ends before refresh's next run
    (record,) = clean_idle(tiered)
    idle_time_nearly_over(tiered)

    # When refresh runs
    report = tiered.refresh()

    # Then EC2 stops it, and its record is stopping, out of the hot pool
    assert report["stopping"] == 1
    assert tiered.ec2_state(record.instance_id) == "stopped"
    assert tiered.record(record.instance_id).state is InstanceState.STOPPING

    # When refresh runs again, after its idle time would have ended
    tiered.clock.advance(ONE_TICK)
    report = tiered.refresh()

    # Then it is marked stopped, until pool.stopped_max_age_minutes from then, and nothing was terminated
    stopped = tiered.record(record.instance_id)
    assert report["stopped"] == 1
    assert report["terminated"] == {}
    assert stopped.state is InstanceState.STOPPED
    assert stopped.threshold == tiered.clock.now() + tiered.config.pool.stopped_max_age_minutes * 60


def test_no_more_than_the_stopped_maximum_is_stopped_the_rest_are_terminated_as_due(
    tiered: LocalControlPlane,
) -> None:
    # Given two clean idle instances of one class whose idle time ends now, and a tier of one
    records = clean_idle(tiered, 2)
    idle_time_nearly_over(tiered)

    # When refresh runs, and again once their idle time has passed
    first = tiered.refresh()
    tiered.clock.advance(ONE_TICK)
    second = tiered.refresh()

    # Then one was stopped, the other terminated as due
    states = sorted(tiered.record(r.instance_id).state.value for r in records)
    assert states == ["stopped", "terminated"]
    assert (first["stopping"], second["terminated"]) == (1, {"idle": 1})


def test_a_spot_instance_is_never_stopped() -> None:
    # Given a stack that keeps a stopped tier but launches its pool as spot
    config = stack_config(pool={"stopped_maximum": 3})
    with local_control_plane(config) as local:
        (record,) = clean_idle(local)
        idle_time_nearly_over(local)

        # When refresh runs, and again once its idle time has passed
        report = local.refresh()
        local.clock.advance(ONE_TICK)
        local.refresh()

        # Then it was never stopped: an instant fleet's spot instance is terminated as due
        assert report["stopping"] == 0
        assert local.record(record.instance_id).state is InstanceState.TERMINATED
        assert local.accounting().holds


def test_an_instance_whose_agent_is_not_known_clean_is_not_stopped(tiered: LocalControlPlane) -> None:
    # Given an idle instance whose agent's last word is a failed scrub
    (record,) = clean_idle(tiered)
    tiered.table.write_signal(record.instance_id, Signal.UD_REMOVE_REG_FAILED, "pool=1")
    idle_time_nearly_over(tiered)

    # When refresh runs / Then it is left to end as due
    assert tiered.refresh()["stopping"] == 0
    assert tiered.record(record.instance_id).state is InstanceState.IDLE


def test_an_expired_idle_instance_is_terminated_not_stopped(tiered: LocalControlPlane) -> None:
    # Given an idle instance some failure path expired (a release without its receipt)
    (record,) = clean_idle(tiered)
    tiered.table.expire(record.instance_id)

    # When refresh runs / Then it is terminated: a passed threshold is final
    report = tiered.refresh()
    assert report["stopping"] == 0
    assert tiered.record(record.instance_id).state is InstanceState.TERMINATED


def test_a_stopped_instance_past_its_max_age_is_terminated(tiered: LocalControlPlane) -> None:
    # Given a stopped instance
    record = idle_time_over(tiered)
    tiered.refresh()
    assert tiered.record(record.instance_id).state is InstanceState.STOPPED

    # When its time in the tier has passed and refresh runs
    tiered.clock.advance(tiered.config.pool.stopped_max_age_minutes * 60)
    report = tiered.refresh()

    # Then EC2 terminates it and its record is marked terminated, counted as stopped
    assert report["terminated"] == {"stopped": 1}
    assert tiered.ec2_state(record.instance_id) in ("shutting-down", "terminated")
    assert tiered.record(record.instance_id).state is InstanceState.TERMINATED


def test_a_stopped_tier_of_zero_changes_nothing() -> None:
    # Given the default stack (no stopped tier) and a clean on-demand idle instance ending its idle time
    config = stack_config(defaults={"usage": "on-demand"})
    with local_control_plane(config) as local:
        record = idle_time_over(local)

        # When refresh runs after its idle time / Then it is terminated, as before the tier existed
        local.refresh()
        assert local.record(record.instance_id).state is InstanceState.TERMINATED
        assert local.accounting().holds


def test_two_refreshes_racing_stop_no_more_than_the_maximum(tiered: LocalControlPlane) -> None:
    # Given three clean idle instances of one class whose idle time ends now, and a tier of one
    records = clean_idle(tiered, 3)
    idle_time_nearly_over(tiered)

    # When two refreshes of the same schedule slot run at once
    reports = tiered.refreshes_at_once()

    # Then neither failed, one instance was stopped between them, and the other two stay idle. The one
    # stopped is stopping, or already stopped: the later run, finding EC2 done with the stop the earlier
    # one asked for, marks it (the emulator's EC2 stops at once)
    assert [r.failed for r in reports] == [[], []]
    assert sum(r.stopping for r in reports) == 1
    states = sorted(tiered.record(r.instance_id).state for r in records)
    assert states[:2] == [InstanceState.IDLE, InstanceState.IDLE]
    assert states[2] in (InstanceState.STOPPING, InstanceState.STOPPED)


def test_a_refresh_that_died_after_its_stop_write_asks_ec2_again(tiered: LocalControlPlane) -> None:
    # Given an instance whose record went stopping, but whose refresh died before StopInstances
    (record,) = clean_idle(tiered)
    idle_time_nearly_over(tiered)
    assert tiered.table.stop(record.instance_id).succeeded
    assert tiered.ec2_state(record.instance_id) == "running"

    # When the next refresh runs, and the one after it
    tiered.clock.advance(ONE_TICK)
    tiered.refresh()
    tiered.clock.advance(ONE_TICK)
    report = tiered.refresh()

    # Then the stop was asked again, and the instance is stopped and marked so
    assert tiered.ec2_state(record.instance_id) == "stopped"
    assert report["stopped"] == 1
    assert tiered.record(record.instance_id).state is InstanceState.STOPPED


# --- the stopped minimum (issue 16, item 3) -------------------------------------------------------------


def with_stopped_minimum(stopped: int = 2, hot: int = 0) -> Iterator[LocalControlPlane]:
    config = stack_config(
        defaults={"usage": "on-demand"},
        pool={"stopped_maximum": stopped},
        warm_pool_minimum={"large": {"hot": hot, "stopped": stopped}},
    )
    with accounted_plane(config) as plane:
        yield plane


@pytest.fixture
def kept() -> Iterator[LocalControlPlane]:
    """A stack keeping two stopped `large` instances and no hot ones."""
    yield from with_stopped_minimum()


def launched_for_tier(local: LocalControlPlane) -> list[InstanceRecord]:
    return [r for r in local.table.live() if r.for_stopped_tier]


def test_refresh_launches_the_stopped_minimum_as_on_demand_instances_marked_for_the_tier(
    kept: LocalControlPlane,
) -> None:
    # Given an empty pool and a stopped minimum of two
    # When refresh runs
    report = kept.refresh()

    # Then it launches two on-demand pool instances for the tier, and none hot
    booting = launched_for_tier(kept)
    assert (report["launched_for_stopped"], report["launched"]) == ({"large": 2}, {})
    assert report["stopped_minimum"]["large"] == 2
    assert [(r.state, r.usage_class.value, r.run_key) for r in booting] == [
        (InstanceState.CREATED, "on-demand", None)
    ] * 2

    # And the next run, while they boot, launches nothing more
    kept.clock.advance(ONE_TICK)
    assert kept.refresh()["launched_for_stopped"] == {}


def test_an_instance_launched_for_the_tier_is_stopped_once_admitted_never_offered_hot(
    kept: LocalControlPlane,
) -> None:
    # Given the stopped minimum launched, and its agents booted (UD_OK, a fresh heartbeat)
    kept.refresh()
    kept.clock.advance(ONE_TICK)
    booting = launched_for_tier(kept)
    for record in booting:
        kept.table.write_heartbeat(record.instance_id)
        kept.table.write_signal(record.instance_id, Signal.UD_OK)

    # When refresh runs
    report = kept.refresh()

    # Then both are admitted and stopped at once, with nothing offered in the hot pool
    assert (report["admitted"], report["stopping"], report["launched_for_stopped"]) == (2, 2, {})
    assert all(kept.record(r.instance_id).state is InstanceState.STOPPING for r in booting)
    assert all(kept.ec2_state(r.instance_id) == "stopped" for r in booting)
    assert kept.drain_pool() == []

    # When the next run sees EC2 report them stopped / Then they are the tier, and nothing is launched
    kept.clock.advance(ONE_TICK)
    report = kept.refresh()
    assert (report["stopped"], report["launched_for_stopped"]) == (2, {})
    assert all(kept.record(r.instance_id).state is InstanceState.STOPPED for r in booting)


def test_an_admitted_instance_whose_stop_a_dead_run_left_undone_is_stopped_next_run(
    kept: LocalControlPlane,
) -> None:
    # Given one instance launched for the tier, admitted by a run that died before its stop
    kept.refresh()
    first = launched_for_tier(kept)[0]
    assert kept.table.admit(first.instance_id).succeeded

    # When the next refresh runs
    kept.clock.advance(ONE_TICK)
    report = kept.refresh()

    # Then it is stopped, not offered hot, and it still counts: nothing more is launched for it
    assert kept.record(first.instance_id).state is InstanceState.STOPPING
    assert kept.ec2_state(first.instance_id) == "stopped"
    assert (report["stopping"], report["launched_for_stopped"]) == (1, {})


def test_two_refreshes_racing_launch_the_stopped_minimum_once(kept: LocalControlPlane) -> None:
    # Given an empty pool and a stopped minimum of two
    launched_before = kept.ec2.launched

    # When two refreshes of the same schedule slot run at once
    reports = kept.refreshes_at_once()

    # Then neither failed, and two instances were launched between them, not four
    assert [r.failed for r in reports] == [[], []]
    assert kept.ec2.launched - launched_before == 2
    assert sum(sum(r.launched_for_stopped.values()) for r in reports) == 2
    assert len(launched_for_tier(kept)) == 2


def test_hot_and_stopped_minimums_are_kept_side_by_side() -> None:
    # Given a class keeping one hot and one stopped
    for plane in with_stopped_minimum(stopped=1, hot=1):
        # When refresh runs on an empty pool
        report = plane.refresh()
        # Then it launches one for each, and only the tier's is marked for it
        assert (report["launched"], report["launched_for_stopped"]) == ({"large": 1}, {"large": 1})
        assert len(launched_for_tier(plane)) == 1
        assert len(plane.table.live()) == 2


def test_no_stopped_minimum_launches_nothing_for_the_tier(tiered: LocalControlPlane) -> None:
    # Given a stack with a stopped tier but no stopped minimum (today's configs)
    # When refresh runs on an empty pool
    report = tiered.refresh()
    # Then nothing is launched, as before
    assert (report["launched"], report["launched_for_stopped"]) == ({}, {})
    assert tiered.table.live() == []
