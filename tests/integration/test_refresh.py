"""Refresh end to end: its Lambda handler on moto (EC2's CreateFleet simulated), the state table, a fake GitHub.

After every test the accounting holds: every EC2 instance with the stack's tag has a live record,
and every live record an EC2 instance.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from emulator.harness.control_plane import (
    LocalControlPlane,
    client,
    local_control_plane,
    pool_queue_urls,
    stack_config,
)
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import ClaimTerms
from runner_pool.domain.records import InstanceRecord, PoolMessage, Signal
from runner_pool.domain.refresh import ORPHAN_GRACE_SECONDS
from runner_pool.domain.trust import TrustLevel
from runner_pool.handlers.refresh import RefreshIncompleteError
from tests.integration.conftest import accounted_plane
from tests.support import builders

RUN = "pool=101"
ONE_TICK = 60.0


@pytest.fixture
def warm() -> Iterator[LocalControlPlane]:
    """A stack that keeps two idle `large` instances."""
    with accounted_plane(stack_config(warm_pool_minimum={"large": 2})) as plane:
        yield plane


def live_ids(local: LocalControlPlane) -> set[str]:
    return {record.instance_id for record in local.table.live()}


def booting_for_pool(local: LocalControlPlane) -> list[InstanceRecord]:
    return [r for r in local.table.live() if r.state is InstanceState.CREATED and r.run_key is None]


def boot(local: LocalControlPlane, records: list[InstanceRecord], signal: Signal = Signal.UD_OK) -> None:
    """What each instance's agent does at boot: beat, and report its pre-runner script."""
    for record in records:
        local.table.write_heartbeat(record.instance_id)
        local.table.write_signal(record.instance_id, signal)


def in_stopped_tier(local: LocalControlPlane, state: InstanceState) -> InstanceRecord:
    """An on-demand pool instance taken to the stopped tier's `state` (issue 16, item 2), EC2 stopping it."""
    request = LaunchRequest.for_run(local.config.spec_for("pool=1/usage=on-demand"), 1, f"tier-{state}")
    (facts,) = local.plane.fleet.launch(request).launched
    local.table.create(facts, None)
    local.table.admit(facts.instance_id)
    assert local.table.stop(facts.instance_id).succeeded
    local.ec2.stop_instances(InstanceIds=[facts.instance_id])
    if state is InstanceState.STOPPED:
        assert local.table.mark_stopped(facts, local.clock.now() + 3600).succeeded
    return local.record(facts.instance_id)


def expired(local: LocalControlPlane, state: InstanceState) -> InstanceRecord:
    """An instance in `state` whose record some failure path expired."""
    if state is InstanceState.RUNNING:
        (record,) = local.running(RUN)
    elif state is InstanceState.IDLE:
        (record,) = local.pooled()
    elif state is InstanceState.CLAIMED:
        (record,) = local.pooled()
        assert local.table.claim(record.instance_id, RUN, "claim-1").succeeded
    elif state in (InstanceState.STOPPING, InstanceState.STOPPED):
        record = in_stopped_tier(local, state)
    else:
        (facts,) = local.launch(1, RUN)
        record = local.record(facts.instance_id)
    assert local.table.expire(record.instance_id).succeeded
    return local.record(record.instance_id)


# --- what is due ----------------------------------------------------------------------------------


def test_refresh_terminates_expired_instances_of_every_state_and_leaves_live_ones_alone(
    local: LocalControlPlane,
) -> None:
    # Given an expired instance in each live state, and one live instance in each
    due = {state: expired(local, state) for state in InstanceState if state is not InstanceState.TERMINATED}
    live = [*local.running("pool=202"), *local.pooled()]
    (created,) = local.launch(1, "pool=303")
    # When refresh runs
    report = local.refresh()
    # Then every expired one is terminated in EC2 and marked terminated, counted by its state
    for record in due.values():
        assert local.record(record.instance_id).state is InstanceState.TERMINATED
        assert local.ec2_state(record.instance_id) in ("shutting-down", "terminated")
    assert report["terminated"] == {state.value: 1 for state in due}
    # And the live ones are untouched
    assert {r.instance_id for r in live} | {created.instance_id} == live_ids(local)
    assert all(local.ec2_state(r.instance_id) == "running" for r in live)


def test_an_instance_ec2_already_terminated_is_marked_terminated_with_the_rest(
    local: LocalControlPlane,
) -> None:
    # Given an expired instance that EC2 has already terminated
    record = expired(local, InstanceState.IDLE)
    local.ec2.terminate_instances(InstanceIds=[record.instance_id])
    # When refresh runs
    report = local.refresh()
    # Then its record is marked terminated
    assert local.record(record.instance_id).state is InstanceState.TERMINATED
    assert report["terminated"] == {"idle": 1}


def test_a_record_of_an_instance_ec2_does_not_know_is_marked_terminated(local: LocalControlPlane) -> None:
    # Given an expired record whose instance EC2 has no trace of (terminated long ago), beside a real one
    ghost = builders.facts(7)
    local.table.create(ghost, run_key=None)
    local.table.expire(ghost.instance_id)
    real = expired(local, InstanceState.IDLE)
    # And IAM denying the batch, as the deployed tag-scoped grant makes it for an instance without tags
    # (runs-on/terraform-aws-runs-on#60: UnauthorizedOperation, not InvalidInstanceID.NotFound)
    local.policy_check.excuse("ec2:TerminateInstances", "a vanished instance has no stack tag")
    # When refresh runs
    report = local.refresh()
    # Then the batch was denied, and yet both are marked terminated, the ghost counted as gone
    assert [call.operation for call in local.policy_check.denials()] == ["ec2:TerminateInstances"]
    assert local.record(ghost.instance_id).state is InstanceState.TERMINATED
    assert local.record(real.instance_id).state is InstanceState.TERMINATED
    assert (report["terminated"], report["already_gone"]) == ({"created": 1, "idle": 1}, 1)


def test_a_running_instance_ec2_lost_is_expired_and_terminated_without_waiting_for_its_threshold(
    local: LocalControlPlane,
) -> None:
    # Given a running instance whose spot capacity was reclaimed, long before its max runtime
    (record,) = local.running(RUN)
    local.ec2.terminate_instances(InstanceIds=[record.instance_id])
    local.clock.advance(ORPHAN_GRACE_SECONDS)
    # When refresh runs
    report = local.refresh()
    # Then its record is expired and marked terminated in the same run
    assert local.record(record.instance_id).state is InstanceState.TERMINATED
    assert (report["vanished"], report["terminated"]) == (1, {"running": 1})


def test_a_record_younger_than_the_grace_is_not_judged_by_ec2s_view(local: LocalControlPlane) -> None:
    # Given an instance recorded a moment ago that EC2 does not show (yet)
    (record,) = local.running(RUN)
    local.ec2.terminate_instances(InstanceIds=[record.instance_id])
    # When refresh runs within the grace period
    report = local.refresh()
    # Then the record is left as it is
    assert report["vanished"] == 0
    assert local.record(record.instance_id).state is InstanceState.RUNNING
    # (once the grace has passed, it goes; the accounting holds)
    local.clock.advance(ORPHAN_GRACE_SECONDS)
    local.refresh()


# --- orphans --------------------------------------------------------------------------------------


def test_an_instance_with_the_stack_tag_and_no_record_is_terminated(local: LocalControlPlane) -> None:
    # Given an instance launched with the stack's tag that no record knows (its creation died)
    (orphan,) = local.plane.fleet.launch(LaunchRequest.for_pool(local.config, "large", 1, "lost")).launched
    (recorded,) = local.pooled()
    # When refresh runs
    report = local.refresh()
    # Then the orphan is terminated and the recorded instance left alone
    assert local.ec2_state(orphan.instance_id) in ("shutting-down", "terminated")
    assert local.ec2_state(recorded.instance_id) == "running"
    assert report["orphans_terminated"] == 1


def test_an_orphan_younger_than_the_grace_may_be_a_creation_not_recorded_yet() -> None:
    # Given a stack on a clock that keeps real time (EC2 stamps launches with it)
    with local_control_plane(clock=ManualClock(start=time.time())) as local:
        # And an instance launched a moment ago whose record is not written yet
        (young,) = local.plane.fleet.launch(LaunchRequest.for_pool(local.config, "large", 1, "new")).launched
        # When refresh runs / Then it is left alone
        assert local.refresh()["orphans_terminated"] == 0
        assert local.ec2_state(young.instance_id) == "running"
        # And once the grace has passed since its launch without a record, it is terminated
        (reservation,) = local.ec2.describe_instances(InstanceIds=[young.instance_id])["Reservations"]
        launched_at = reservation["Instances"][0]["LaunchTime"].timestamp()
        local.clock.advance(launched_at + ORPHAN_GRACE_SECONDS + 1 - local.clock.now())
        assert local.refresh()["orphans_terminated"] == 1
        assert local.accounting().holds


# --- the warm pool --------------------------------------------------------------------------------


def test_the_warm_minimum_is_restored_after_pooled_instances_expire(warm: LocalControlPlane) -> None:
    # Given the two pooled instances of the warm minimum, whose idle time runs out
    old = warm.pooled(2)
    warm.drain_pool()
    warm.clock.advance(warm.config.timeouts.idle_seconds)
    # When refresh runs
    first = warm.refresh()
    # Then the expired ones are terminated and two new ones launched for the pool
    assert all(warm.record(r.instance_id).state is InstanceState.TERMINATED for r in old)
    booting = booting_for_pool(warm)
    assert (len(booting), first["launched"]) == (2, {"large": 2})
    # When their agents report ready and the next refresh runs
    warm.clock.advance(ONE_TICK)
    boot(warm, booting)
    second = warm.refresh()
    # Then both are idle and offered in the pool, with their idle thresholds, and nothing more launched
    idle = [warm.record(r.instance_id) for r in booting]
    assert all(r.state is InstanceState.IDLE for r in idle)
    assert sorted(warm.drain_pool(), key=lambda m: m.instance_id) == sorted(
        (PoolMessage.for_idle(r) for r in idle), key=lambda m: m.instance_id
    )
    assert (second["admitted"], second["launched"]) == (2, {})


def test_a_schedule_window_tops_the_pool_up_and_its_end_leaves_the_surplus_to_idle_expiry() -> None:
    # Given a stack keeping two `large` instances from 09:30 to 09:35 Berlin time, none otherwise, and a
    # clock at Friday 2027-01-15 09:00 CET (08:00 UTC)
    clock = ManualClock(datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp())
    window = {"start": "09:30", "end": "09:35", "hot": 2}
    schedule = {"large": {"time_zone": "Europe/Berlin", "windows": [window]}}
    with local_control_plane(stack_config(warm_pool_minimum=schedule), clock) as plane:
        # When refresh runs before the window / Then it keeps nothing warm
        before = plane.refresh()
        assert (before["minimum"]["large"], before["launched"]) == (0, {})
        # When the window opens / Then refresh launches the window's minimum for the pool
        clock.advance(30 * 60)
        opened = plane.refresh()
        assert (opened["minimum"]["large"], opened["launched"]) == (2, {"large": 2})
        # And once their agents are ready the next refresh pools them and launches nothing more
        clock.advance(ONE_TICK)
        boot(plane, booting_for_pool(plane))
        pooled = plane.refresh()
        assert (pooled["admitted"], pooled["launched"]) == (2, {})
        # When the window has closed (09:36) / Then nothing is terminated early: they stay idle in the pool
        clock.advance(5 * 60)
        closed = plane.refresh()
        assert (closed["minimum"]["large"], closed["launched"], closed["terminated"]) == (0, {}, {})
        assert closed["idle"]["large"] == 2
        # When their idle time has run out / Then refresh terminates them and launches none in their place
        clock.advance(plane.config.timeouts.idle_seconds)
        shrunk = plane.refresh()
        assert (shrunk["terminated"], shrunk["launched"]) == ({"idle": 2}, {})
        assert plane.table.live() == []
        accounting = plane.accounting()
        assert accounting.holds, accounting.problems


def test_instances_still_booting_count_toward_the_warm_minimum(warm: LocalControlPlane) -> None:
    # Given a refresh that launched the warm minimum, whose instances have not booted yet
    warm.refresh()
    # When the next scheduled refresh runs
    warm.clock.advance(ONE_TICK)
    report = warm.refresh()
    # Then it launches nothing more
    assert report["launched"] == {}
    assert len(booting_for_pool(warm)) == 2


def test_a_schedule_slot_tops_the_pool_up_once_however_often_it_runs(warm: LocalControlPlane) -> None:
    # Given a refresh of this schedule slot whose launches failed to be recorded (it died after CreateFleet)
    at = warm.clock.now()
    warm.refresh(at)
    for record in booting_for_pool(warm):
        warm.table.expire(record.instance_id)
    # When the same slot's event is delivered again
    report = warm.refresh(at)
    # Then the top-up is not repeated (the next slot's run does it)
    assert report["launched"] == {}
    warm.clock.advance(ONE_TICK)
    assert warm.refresh()["launched"] == {"large": 2}


def test_the_pristine_minimum_launches_what_the_idle_pool_lacks_of_never_used_instances() -> None:
    # Given a class that keeps two idle instances, one of them at least pristine, and two idle instances
    # that have both served a trusted job
    config = stack_config(warm_pool_minimum={"large": {"hot": 2, "pristine": 1}})
    with local_control_plane(config) as local:
        for used in local.pooled(2):
            assert local.table.claim(
                used.instance_id,
                RUN,
                f"t-{used.instance_id}",
                ClaimTerms(repository="octo/app", trust=TrustLevel.TRUSTED),
            ).succeeded
            assert local.table.activate(
                used.instance_id, RUN, 60, claim_token=f"t-{used.instance_id}"
            ).succeeded
            assert local.table.release(used.instance_id, RUN).succeeded
        # When refresh runs
        report = local.refresh()
        # Then the warm minimum is met, but not its pristine floor: one pristine instance is launched
        large = (
            report["idle"]["large"],
            report["idle_pristine"]["large"],
            report["pristine_minimum"]["large"],
        )
        assert large == (2, 0, 1)
        assert report["launched"] == {"large": 1}
        # And while it boots, the next slot's refresh counts it toward the floor and launches nothing more
        local.clock.advance(ONE_TICK)
        assert local.refresh()["launched"] == {}
        accounting = local.accounting()
        assert accounting.holds, accounting.problems


def test_an_instance_not_beating_is_not_admitted(warm: LocalControlPlane) -> None:
    # Given launched pool instances whose agents said UD_OK but have not beaten for longer than the window
    warm.refresh()
    booting = booting_for_pool(warm)
    boot(warm, booting)
    warm.clock.advance(warm.config.timeouts.healthy_window_seconds + 1)
    # When refresh runs
    report = warm.refresh()
    # Then none is admitted
    assert report["admitted"] == 0
    assert all(warm.record(r.instance_id).state is InstanceState.CREATED for r in booting)


def test_an_instance_whose_boot_failed_is_expired_and_not_admitted(warm: LocalControlPlane) -> None:
    # Given launched pool instances whose pre-runner script failed
    warm.refresh()
    booting = booting_for_pool(warm)
    boot(warm, booting, Signal.UD_FAILED)
    # When refresh runs
    report = warm.refresh()
    # Then they are expired, not admitted, and terminated by the run after
    assert (report["unready"], report["admitted"]) == (2, 0)
    assert all(warm.record(r.instance_id).threshold_passed(warm.clock.now()) for r in booting)
    warm.refresh()
    assert all(warm.record(r.instance_id).state is InstanceState.TERMINATED for r in booting)


def test_pool_size_and_minimum_per_class_are_published_as_metrics(
    warm: LocalControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given one pooled instance
    warm.pooled(1)
    capsys.readouterr()
    # When refresh runs
    warm.refresh()
    # Then its metrics carry the idle count of each class, and the warm minimum in force for each
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    values = {key: value for blob in blobs for key, value in blob.items() if key.startswith("Pool")}
    assert values["PoolIdle.large"] == [1.0]
    assert values["PoolIdle.xlarge"] == [0.0]
    assert (values["PoolMinimum.large"], values["PoolMinimum.xlarge"]) == ([2.0], [0.0])


# --- GitHub ---------------------------------------------------------------------------------------


def test_our_offline_runners_are_deleted_unless_they_may_still_start(local: LocalControlPlane) -> None:
    # Given offline runners: one left by an earlier run on an idle instance, one of a terminated
    # instance, one registered for a claim whose record does not note it yet, one of a running
    # instance, and one that is not ours
    gone_record = expired(local, InstanceState.IDLE)
    local.refresh()
    gone = local.plane.github.jit_config(f"{gone_record.instance_id}-0000dead", [RUN]).runner_id
    (leftover_on,) = local.pooled()
    leftover = local.plane.github.jit_config(f"{leftover_on.instance_id}-0000beef", [RUN]).runner_id
    (claimed,) = local.pooled()
    assert local.table.claim(claimed.instance_id, RUN, "claim-2").succeeded
    in_flight = local.plane.github.jit_config(f"{claimed.instance_id}-0000cafe", [RUN]).runner_id
    (running,) = local.running(RUN)
    not_ours = local.plane.github.jit_config("build-box-1", [RUN]).runner_id
    # When refresh runs
    report = local.refresh()
    # Then only the leftovers are deleted
    remaining = {runner.runner_id for runner in local.plane.github.runners()}
    assert remaining == {in_flight, running.runner_id, not_ours}
    assert {leftover, gone}.isdisjoint(remaining)
    assert report["runners_deleted"] == 2


def test_busy_and_online_runners_are_never_deleted(local: LocalControlPlane) -> None:
    # Given two runners on an idle instance: one online, one running a job
    (idle,) = local.pooled()
    online = local.plane.github.jit_config(f"{idle.instance_id}-00000001", [RUN]).runner_id
    busy = local.plane.github.jit_config(f"{idle.instance_id}-00000002", [RUN]).runner_id
    local.github.state.set_runner_state(online, online=True)
    local.github.state.set_runner_state(busy, online=True, busy=True)
    # When refresh runs / Then both are left
    assert local.refresh()["runners_deleted"] == 0
    assert {r.runner_id for r in local.plane.github.runners()} == {online, busy}


def test_failed_deliveries_of_the_last_hour_are_redelivered_once(local: LocalControlPlane) -> None:
    # Given a delivery that failed two hours ago, two that failed in the last hour, and one that
    # failed and then succeeded on a retry
    state = local.github.state
    state.add_delivery("workflow_job", "queued", 502)
    local.clock.advance(2 * 3600)
    recent = [
        state.add_delivery("workflow_job", "queued", 502),
        state.add_delivery("workflow_run", "completed", 0),
    ]
    recovered = state.add_delivery("workflow_job", "completed", 500)
    state.add_delivery("workflow_job", "completed", 200, guid=recovered.guid, redelivery=True)
    # When refresh runs twice
    first = local.refresh()
    local.clock.advance(ONE_TICK)
    second = local.refresh()
    # Then GitHub was asked once for each recent failure, and for nothing else
    assert sorted(state.redelivery_requests) == sorted(d.delivery_id for d in recent)
    assert (first["redelivered"], second["redelivered"]) == (2, 0)


def test_a_redelivery_that_fails_again_is_asked_for_again(local: LocalControlPlane) -> None:
    # Given a failed delivery, and our webhook endpoint still down at the first redelivery
    state = local.github.state
    failed = state.add_delivery("workflow_job", "queued", 502)
    state.webhook_receiver = lambda _delivery: 503
    local.refresh()
    # When the endpoint is back and refresh runs again
    state.webhook_receiver = lambda _delivery: 200
    local.clock.advance(ONE_TICK)
    local.refresh()
    # Then the event was asked for a second time (its newest failed attempt)
    assert len(state.redelivery_requests) == 2
    assert state.redelivery_requests[0] == failed.delivery_id
    latest = max(d.delivery_id for d in state.deliveries.values())
    assert state.deliveries[latest].succeeded


def test_github_unavailable_fails_its_jobs_but_not_the_others(local: LocalControlPlane) -> None:
    # Given an expired instance, and GitHub refusing every call for the next hour
    record = expired(local, InstanceState.IDLE)
    local.github.state.exhaust_rate_limit(until=local.clock.now() + 3600)
    # When refresh runs / Then it reports its failed jobs as an error
    with pytest.raises(RefreshIncompleteError, match="runners, redeliveries"):
        local.refresh()
    # And the expired instance was terminated all the same
    assert local.record(record.instance_id).state is InstanceState.TERMINATED


# --- races and crashes ----------------------------------------------------------------------------


def test_two_refreshes_racing_do_everything_once_and_fail_nothing(warm: LocalControlPlane) -> None:
    # Given expired instances, an orphan, a leftover runner, a failed delivery and a warm-pool shortfall
    due = [expired(warm, InstanceState.IDLE) for _ in range(3)]
    (orphan,) = warm.plane.fleet.launch(LaunchRequest.for_pool(warm.config, "large", 1, "lost")).launched
    (leftover_on,) = warm.pooled()
    warm.plane.github.jit_config(f"{leftover_on.instance_id}-0000beef", [RUN])
    failed = warm.github.state.add_delivery("workflow_job", "queued", 502)
    launched_before = warm.ec2.launched
    # When two refreshes of the same schedule slot run at once
    reports = warm.refreshes_at_once()
    # Then neither failed a job, and each action happened once
    assert [r.failed for r in reports] == [[], []]
    assert sum(sum(r.terminated.values()) for r in reports) == len(due)
    assert all(warm.record(r.instance_id).state is InstanceState.TERMINATED for r in due)
    assert warm.ec2_state(orphan.instance_id) in ("shutting-down", "terminated")
    assert warm.github.state.redelivery_requests == [failed.delivery_id]
    assert sum(r.runners_deleted for r in reports) == 1
    # And the warm pool was topped up once: one idle instance plus one launched
    assert warm.ec2.launched - launched_before == 1
    assert len(booting_for_pool(warm)) == 1


def test_a_refresh_killed_after_terminating_converges_on_the_next_run(local: LocalControlPlane) -> None:
    # Given expired instances, and a refresh that dies right after TerminateInstances answers
    due = [
        expired(local, state) for state in (InstanceState.RUNNING, InstanceState.IDLE, InstanceState.CREATED)
    ]

    class Killed(BaseException):
        """The Lambda's process ending (a timeout, an out-of-memory kill): nothing catches it."""

    def kill(**_: Any) -> None:
        raise Killed

    local.ec2.meta.events.register("after-call.ec2.TerminateInstances", kill, unique_id="kill")
    with pytest.raises(Killed):
        local.refresh()
    local.ec2.meta.events.unregister("after-call.ec2.TerminateInstances", unique_id="kill")
    # (the instances are gone while their records still say otherwise)
    assert all(local.ec2_state(r.instance_id) in ("shutting-down", "terminated") for r in due)
    assert all(local.record(r.instance_id).state is not InstanceState.TERMINATED for r in due)
    # When the next refresh runs
    local.clock.advance(ONE_TICK)
    report = local.refresh()
    # Then every record is marked terminated, each counted once, and nothing else was touched
    assert all(local.record(r.instance_id).state is InstanceState.TERMINATED for r in due)
    assert report["terminated"] == {"running": 1, "idle": 1, "created": 1}
    assert report["orphans_terminated"] == 0


# --- records that do not parse (issue 36, item 2) ----------------------------------------------------


def corrupt(local: LocalControlPlane, record: InstanceRecord) -> None:
    """The instance's `state` item made one that does not parse, its index attributes kept: what a bug,
    a hand edit or (before the agent's items had a partition of their own) a root job could leave."""
    client("dynamodb").update_item(
        TableName=local.plane.settings.table_name,
        Key={"pk": {"S": local.plane.instance_arn(record.instance_id)}, "sk": {"S": "state"}},
        UpdateExpression="SET #state = :state REMOVE cpu",
        ExpressionAttributeNames={"#state": "state"},
        ExpressionAttributeValues={":state": {"S": "owned"}},
    )


def test_a_record_that_does_not_parse_gets_its_instance_terminated_and_stops_no_other_job(
    local: LocalControlPlane, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a pooled instance whose record no longer parses, beside a pooled, a running and an expired one
    broken, pooled = local.pooled(2)
    (running,) = local.running(RUN)
    due = expired(local, InstanceState.CREATED)
    corrupt(local, broken)
    local.clock.advance(ORPHAN_GRACE_SECONDS)
    capsys.readouterr()

    # When refresh runs
    report = local.refresh()

    # Then no job failed, and the broken record's instance is terminated as untracked, logged and counted
    assert report["failed"] == []
    assert local.ec2_state(broken.instance_id) in ("shutting-down", "terminated")
    assert report["unreadable"] == 1
    [log] = [r for r in caplog.records if r.getMessage().startswith("instance record does not parse")]
    assert log.__dict__["instance_id"] == broken.instance_id
    assert "state" in log.__dict__["reason"]
    metrics = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert [blob["UnreadableRecords"] for blob in metrics if "UnreadableRecords" in blob] == [[1.0]]
    # And the sweeps did the rest of their work: the due instance ended, the others left running
    assert local.record(due.instance_id).state is InstanceState.TERMINATED
    assert local.ec2_state(pooled.instance_id) == local.ec2_state(running.instance_id) == "running"
    assert live_ids(local) == {pooled.instance_id, running.instance_id}
    # And the item, set aside, is met by no later run
    local.clock.advance(ONE_TICK)
    again = local.refresh()
    assert (again["failed"], again["unreadable"], again["orphans_terminated"]) == ([], 0, 0)


def test_pickup_passes_over_an_instance_whose_record_does_not_parse(local: LocalControlPlane) -> None:
    # Given two pooled instances, the first offered in the queue with a record that no longer parses
    broken, pooled = local.pooled(2)
    corrupt(local, broken)

    # When a run's pickup asks the class's pool for one instance
    found = local.plane.pickup.pickup(local.config.spec_for(RUN))

    # Then it is offered the other one; the broken one's offer is dropped, and a claim of it is lost
    assert found.candidate is not None
    assert found.candidate.instance_id == pooled.instance_id
    assert local.drain_pool() == []
    assert not local.table.claim(broken.instance_id, RUN, "claim-1").succeeded
    assert local.table.get(broken.instance_id) is None
    # And refresh ends it
    assert local.refresh()["unreadable"] == 1
    assert local.ec2_state(broken.instance_id) in ("shutting-down", "terminated")


def test_a_release_of_a_run_passes_over_a_record_that_does_not_parse(local: LocalControlPlane) -> None:
    # Given two instances running for a run, one of whose records no longer parses
    broken, running = local.running(RUN, count=2)
    corrupt(local, broken)

    # When the run's release looks up what the run holds
    plan = local.release().plan(ReleaseRequest(run_key=RUN, cause="run-completed"))

    # Then it finds the readable one alone
    assert plan.instance_ids == (running.instance_id,)
    # And refresh ends the other
    assert local.refresh()["unreadable"] == 1
    assert local.ec2_state(broken.instance_id) in ("shutting-down", "terminated")


def test_a_forged_record_outside_every_index_is_an_orphan(local: LocalControlPlane) -> None:
    # Given a running instance whose `state` item was replaced by one made of the agent's attributes only
    # (what the instance role allowed its own partition before issue 36)
    (forged,) = local.running(RUN)
    key = {"pk": {"S": local.plane.instance_arn(forged.instance_id)}, "sk": {"S": "state"}}
    client("dynamodb").put_item(
        TableName=local.plane.settings.table_name, Item={**key, "beat_at": {"N": "1"}}
    )
    local.clock.advance(ORPHAN_GRACE_SECONDS)

    # When refresh runs
    report = local.refresh()

    # Then no job failed, and the instance, untracked, is terminated as an orphan
    assert report["failed"] == []
    assert report["orphans_terminated"] == 1
    assert local.ec2_state(forged.instance_id) in ("shutting-down", "terminated")


def test_refresh_drops_what_no_request_can_take_from_a_queue_pickup_skips(local: LocalControlPlane) -> None:
    # Given a pool queue whose partition holds no idle instance, holding a body that is no pool message
    (url, *_) = pool_queue_urls(local.plane.settings, "large")
    local.sqs.send_message(QueueUrl=url, MessageBody="not a pool message")
    # When refresh runs (through its Lambda handler, under its own role)
    report = local.refresh()
    # Then the message is dropped and counted, and the queue is empty
    assert report["pool_messages_dropped"] == 1
    assert local.drain_pool() == []
