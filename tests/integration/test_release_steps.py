"""The release steps (steps.release) one at a time, on moto's table and queues and a fake GitHub."""

from __future__ import annotations

import pytest

from emulator.harness.control_plane import LocalControlPlane
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord, Signal
from runner_pool.domain.release import (
    ReleaseItem,
    ReleaseProgress,
    ReleaseStatus,
    SalvageRequest,
    receipt_poll_seconds,
)
from runner_pool.domain.timeouts import Timeouts

RUN = "pool=101"
OTHER_RUN = "pool=202"


def item(record: InstanceRecord, run_key: str = RUN) -> ReleaseItem:
    return ReleaseItem(instance_id=record.instance_id, run_key=run_key, poll_seconds=5)


def give_back(local: LocalControlPlane, record: InstanceRecord, run_key: str = RUN) -> ReleaseProgress:
    return local.release().give_back(item(record, run_key))


def check(local: LocalControlPlane, progress: ReleaseProgress) -> ReleaseProgress:
    return local.release().check_receipt(progress)


@pytest.mark.parametrize(
    ("setting", "poll"), [(5.0, 5), (2.5, 3), (0.2, 1)], ids=["whole", "fraction", "below-one"]
)
def test_the_receipt_poll_is_its_setting_in_whole_seconds(setting: float, poll: int) -> None:
    # Given a receipt poll setting / When the Wait state's seconds are derived / Then rounded up, at least 1 s
    timeouts = Timeouts(release_receipt_poll_seconds=setting)
    assert receipt_poll_seconds(timeouts) == poll


def test_a_release_by_run_plans_every_instance_the_run_holds(local: LocalControlPlane) -> None:
    # Given a run holding a running and a created instance, and another run's instance
    (running,) = local.running(RUN)
    (created,) = local.launch(1, RUN)
    local.running(OTHER_RUN)
    # When the run's release is planned
    plan = local.release().plan(ReleaseRequest(run_key=RUN, cause="run-1"))
    # Then it names exactly the run's instances
    assert set(plan.instance_ids) == {running.instance_id, created.instance_id}


def test_a_release_by_instance_plans_that_instance_alone(local: LocalControlPlane) -> None:
    # Given a run holding two instances
    first, _second = local.running(RUN, count=2)
    # When the release of one of them is planned
    request = ReleaseRequest(run_key=RUN, instance_id=first.instance_id, cause="job-1")
    plan = local.release().plan(request)
    # Then only that one is named
    assert plan.instance_ids == (first.instance_id,)


def test_a_retried_give_back_recognises_its_own_release(local: LocalControlPlane) -> None:
    # Given a give-back that applied, and whose answer was lost
    (running,) = local.running(RUN)
    first = give_back(local, running)
    # When it is retried
    local.clock.advance(1)
    again = give_back(local, running)
    # Then it reports the same release (same idle period and deadline) instead of "moved on"
    assert first.status is ReleaseStatus.AWAITING_RECEIPT
    assert again.model_dump(exclude={"runner"}) == first.model_dump(exclude={"runner"})


def test_an_idle_instance_of_another_idle_period_is_not_taken_for_a_release(local: LocalControlPlane) -> None:
    # Given a pooled instance whose agent's last word is not about the run (it booted for the pool)
    (pooled,) = local.pooled()
    local.table.write_signal(pooled.instance_id, Signal.UD_OK)
    # When a release for the run names it
    progress = give_back(local, pooled)
    # Then it has moved on, and its record is untouched
    assert progress.status is ReleaseStatus.MOVED_ON
    assert local.record(pooled.instance_id) == pooled


def test_a_release_goes_on_while_github_is_unavailable(local: LocalControlPlane) -> None:
    # Given a running instance, and GitHub refusing calls
    (running,) = local.running(RUN)
    local.github.state.exhaust_rate_limit(until=local.clock.now() + 3600)
    # When it is given back
    progress = give_back(local, running)
    # Then it is released all the same; its runner is left for refresh to delete
    assert (progress.status, progress.runner) == (ReleaseStatus.AWAITING_RECEIPT, None)
    assert running.runner_id in local.github.state.runners


def test_without_a_receipt_before_the_deadline_the_release_keeps_waiting(local: LocalControlPlane) -> None:
    # Given a released instance whose agent has not answered yet
    (running,) = local.running(RUN)
    progress = give_back(local, running)
    # When the receipt is looked for just before the deadline
    assert progress.deadline is not None
    local.clock.advance(progress.deadline - local.clock.now() - 1)
    # Then the release waits on, unchanged
    assert check(local, progress) == progress


def test_a_receipt_check_leaves_alone_an_instance_in_a_later_idle_period(local: LocalControlPlane) -> None:
    # Given a release waiting for its receipt, while the instance was pooled, claimed and given back since
    (running,) = local.running(RUN)
    progress = give_back(local, running)
    local.clock.advance(1)
    assert local.table.claim(running.instance_id, OTHER_RUN, "claim-9").succeeded
    assert local.table.unclaim(running.instance_id, OTHER_RUN, "claim-9").succeeded
    later = local.record(running.instance_id)
    # When the old release's deadline passes and it checks
    assert progress.deadline is not None
    local.clock.advance(progress.deadline - local.clock.now())
    outcome = check(local, progress)
    # Then it has moved on: the later idle period is not expired, nor pooled again
    assert outcome.status is ReleaseStatus.MOVED_ON
    assert local.record(running.instance_id) == later
    assert local.drain_pool() == []


def test_salvage_expires_an_instance_still_running_for_the_run(local: LocalControlPlane) -> None:
    # Given a running instance whose give-back failed before it changed anything
    (running,) = local.running(RUN)
    # When the release salvages it
    progress = local.release().salvage(
        SalvageRequest(instance_id=running.instance_id, run_key=RUN, error={"Error": "Boom"})
    )
    # Then it is expired, still held by the run (refresh terminates it)
    assert progress.status is ReleaseStatus.SALVAGED
    record = local.record(running.instance_id)
    assert (record.state, record.run_key) == (InstanceState.RUNNING, RUN)
    assert record.threshold_passed(local.clock.now())


def test_salvage_leaves_alone_an_instance_another_run_holds(local: LocalControlPlane) -> None:
    # Given an instance running for another run
    (running,) = local.running(OTHER_RUN)
    # When a failed release for this run salvages it
    progress = local.release().salvage(SalvageRequest(instance_id=running.instance_id, run_key=RUN))
    # Then nothing changes
    assert progress.status is ReleaseStatus.MOVED_ON
    assert local.record(running.instance_id) == running


# --- a job's release acts on its own hand-off only (fix 9) ------------------------------------------


def job_item(record: InstanceRecord, runner_id: int | None, run_key: str = RUN) -> ReleaseItem:
    return ReleaseItem(instance_id=record.instance_id, run_key=run_key, poll_seconds=5, runner_id=runner_id)


def give_back_item(local: LocalControlPlane, released: ReleaseItem) -> ReleaseProgress:
    return local.release().give_back(released)


def taken_again(local: LocalControlPlane, record: InstanceRecord, *, activate: bool) -> int:
    """The instance released after its job, then claimed by the same run for its next job: the new runner."""
    assert local.table.release(record.instance_id, RUN).succeeded
    assert local.table.claim(record.instance_id, RUN, "claim-2").succeeded
    runner_id = local.register_runner(record.instance_id, RUN, claim="claim-2")
    if activate:
        assert local.table.activate(record.instance_id, RUN, 60, claim_token="claim-2").succeeded
    return runner_id


@pytest.mark.parametrize("activated", [True, False], ids=["running-again", "claimed-again"])
def test_a_repeated_job_completion_leaves_alone_the_runs_next_hand_off_of_the_instance(
    local: LocalControlPlane, activated: bool
) -> None:
    # Given an instance whose first job (runner 1) completed and was released, and that the same run
    # then took again for its next job (runner 2)
    (running,) = local.running(RUN)
    first_runner = running.runner_id
    second_runner = taken_again(local, running, activate=activated)
    before = local.record(running.instance_id)
    # When the first job's completion is delivered again (Express workflows start it again)
    progress = give_back_item(local, job_item(running, first_runner))
    # Then that release has moved on, and the next job keeps its instance and runner
    assert progress.status is ReleaseStatus.MOVED_ON
    assert local.record(running.instance_id) == before
    assert before.runner_id == second_runner
    assert second_runner in local.github.state.runners


def test_a_job_completion_releases_the_hand_off_it_names(local: LocalControlPlane) -> None:
    # Given an instance running a job under its runner
    (running,) = local.running(RUN)
    # When that job's completion, naming that runner, is given back
    progress = give_back_item(local, job_item(running, running.runner_id))
    # Then the instance is released
    assert progress.status is ReleaseStatus.AWAITING_RECEIPT
    assert local.record(running.instance_id).state is InstanceState.IDLE


def test_a_release_that_lost_the_race_to_a_new_hand_off_changes_nothing(local: LocalControlPlane) -> None:
    # Given an instance that has been taken again by the run, under a second runner
    (running,) = local.running(RUN)
    first_runner = running.runner_id
    assert first_runner is not None
    taken_again(local, running, activate=True)
    before = local.record(running.instance_id)
    # When the first hand-off's running -> idle is written anyway (it read the record before the new claim)
    result = local.table.release(running.instance_id, RUN, runner_id=first_runner)
    # Then the conditional write loses: the record is untouched
    assert not result.succeeded
    assert local.record(running.instance_id) == before
