"""EC2's notices about instances, heard by the interruptions function on moto (its calls checked against the
synthesized role), and what refresh and release then make of the records.

After every test the accounting holds: every EC2 instance with the stack's tag has a live record, and every
live record an instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from emulator.ec2_events import interruption_warning, rebalance_recommendation, state_change
from emulator.harness.control_plane import LocalControlPlane, stack_config
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import Readiness, readiness
from runner_pool.domain.release import ReleaseItem, ReleaseStatus
from tests.integration.conftest import accounted_plane

RUN = "pool=101"


@pytest.fixture
def local() -> Iterator[LocalControlPlane]:
    """A stack that keeps one idle `large` instance."""
    with accounted_plane(stack_config(warm_pool_minimum={"large": 1})) as plane:
        yield plane


@pytest.mark.parametrize("warn", [interruption_warning, rebalance_recommendation])
def test_an_idle_instance_warned_leaves_the_pool_and_refresh_replaces_it(
    local: LocalControlPlane, warn: Callable[[str, float], dict[str, Any]]
) -> None:
    # Given an idle instance in the pool
    (idle,) = local.pooled()
    # When EC2 warns of it
    heard = local.hear(warn(idle.instance_id, local.clock.now()))
    # Then its record is expired at once, state kept
    assert heard["written"]
    assert heard["response"] == "expire"
    record = local.record(idle.instance_id)
    assert record.state is InstanceState.IDLE
    assert record.threshold_passed(local.clock.now())
    # ... and the next refresh terminates it and launches a replacement for the warm minimum
    local.clock.advance(1)
    local.refresh()
    assert local.record(idle.instance_id).state is InstanceState.TERMINATED
    assert local.ec2_state(idle.instance_id) in ("shutting-down", "terminated")
    booting = [r for r in local.table.live() if r.state is InstanceState.CREATED and r.run_key is None]
    assert len(booting) == 1


def test_a_held_instance_warned_is_expired_while_its_provision_holds_it(local: LocalControlPlane) -> None:
    # Given an instance created for a run, its provision still waiting for it
    (created,) = local.launch(1, RUN)
    # When EC2 warns that it interrupts it
    local.hear(interruption_warning(created.instance_id, local.clock.now()))
    # Then it is expired with the run's key still on it: the provision's next check finds it failed
    record = local.record(created.instance_id)
    assert record.state is InstanceState.CREATED
    assert record.run_key == RUN
    assert record.threshold_passed(local.clock.now())
    # ... marked interrupted first: its runner may have been given a job already
    assert record.interrupted_at is not None


def test_a_claimed_instance_warned_fails_its_claim_workers_next_check(local: LocalControlPlane) -> None:
    # Given an idle instance a claim worker has just claimed and handed its runner
    (idle,) = local.pooled()
    assert local.table.claim(idle.instance_id, RUN, "worker-1").succeeded
    local.table.write_heartbeat(idle.instance_id)
    handed_over_at = local.clock.now()
    # When EC2 warns that it interrupts it
    local.hear(interruption_warning(idle.instance_id, local.clock.now()))
    # Then the worker's next check finds it failed, so it discards it and tries the next candidate
    now = local.clock.now()
    verdict, reason = readiness(
        local.record(idle.instance_id),
        local.table.read_heartbeat(idle.instance_id),
        local.table.read_signal(idle.instance_id),
        run_key=RUN,
        claim_token="worker-1",
        handed_over_at=handed_over_at,
        deadline=now + 20,
        now=now,
        timeouts=local.config.timeouts,
    )
    assert verdict is Readiness.FAILED, reason


def test_a_running_instance_warned_is_marked_interrupted_and_keeps_its_job(local: LocalControlPlane) -> None:
    # Given an instance running a job of the run
    (running,) = local.running(RUN)
    # When EC2 warns twice that it interrupts it
    now = local.clock.now()
    first = local.hear(interruption_warning(running.instance_id, now))
    local.clock.advance(5)
    again = local.hear(interruption_warning(running.instance_id, local.clock.now()))
    # Then the record is marked once, at the first warning, and its job goes on: state, run key and
    # threshold as they were
    assert first["response"] == again["response"] == "mark-interrupted"
    record = local.record(running.instance_id)
    assert record.interrupted_at == now
    assert (record.state, record.run_key, record.threshold) == (InstanceState.RUNNING, RUN, running.threshold)


def test_a_rebalance_recommendation_leaves_a_running_job_alone(local: LocalControlPlane) -> None:
    # Given an instance running a job
    (running,) = local.running(RUN)
    # When EC2 recommends rebalancing it
    heard = local.hear(rebalance_recommendation(running.instance_id, local.clock.now()))
    # Then nothing is written
    assert not heard["written"]
    assert local.record(running.instance_id) == running


def test_an_interrupted_instance_released_is_retired_not_pooled(local: LocalControlPlane) -> None:
    # Given a running instance EC2 warned of, whose job completes within the notice
    (running,) = local.running(RUN)
    local.hear(interruption_warning(running.instance_id, local.clock.now()))
    # When its job's release gives it back
    progress = local.release().give_back(
        ReleaseItem(instance_id=running.instance_id, run_key=RUN, poll_seconds=5, runner_id=running.runner_id)
    )
    # Then it is expired, not awaiting its agent's receipt for the pool
    assert progress.status is ReleaseStatus.RETIRED, progress
    assert local.record(running.instance_id).threshold_passed(local.clock.now())


def test_spot_reclaim_ends_a_running_instance_and_refresh_marks_it_terminated(
    local: LocalControlPlane,
) -> None:
    # Given a running instance
    (running,) = local.running(RUN)
    reclaim = local.spot_reclaim()
    # When EC2 warns, and two minutes later terminates it
    reclaim.warn(running.instance_id, local.clock.now(), rebalance_first=True)
    local.clock.advance(120)
    reclaim.end(running.instance_id, local.clock.now())
    # Then its record was expired by the state change, and refresh marks it terminated, keeping the mark
    local.clock.advance(1)
    local.refresh()
    record = local.record(running.instance_id)
    assert record.state is InstanceState.TERMINATED
    assert record.interrupted_at is not None
    assert record.runner_id == running.runner_id


def test_a_stop_no_step_asked_for_expires_the_record(local: LocalControlPlane) -> None:
    # Given an idle instance
    (idle,) = local.pooled()
    # When EC2 says it stopped, though its record never asked for the stopped tier
    heard = local.hear(state_change(idle.instance_id, local.clock.now(), "stopped"))
    # Then it is expired
    assert heard["response"] == "expire"
    assert heard["written"]
    assert local.record(idle.instance_id).threshold_passed(local.clock.now())


def test_an_instance_of_no_record_is_left_alone(local: LocalControlPlane) -> None:
    # Given an instance id with no record of ours
    # When EC2 warns of it
    heard = local.hear(interruption_warning("i-0123456789abcdef0", local.clock.now()))
    # Then nothing is written
    assert heard == {
        "instance_id": "i-0123456789abcdef0",
        "response": "nothing",
        "why": "no record: not an instance of this stack",
        "written": False,
        "breaker": None,
    }
