"""Issue 13, fix 6: a job that ends before its provision's Finish finds its instance still claimed or
created; the job's release pools that instance (it served), and Finish then lets go of it. The run's
release ends such a hand-off the same way, whichever of the two completions is handled first."""

from __future__ import annotations

from emulator.harness.control_plane import LocalControlPlane
from runner_pool.domain.executions import runner_name
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord, PoolMessage, Signal
from runner_pool.domain.release import ReleaseItem, ReleaseProgress, ReleaseStatus
from runner_pool.domain.runners import RunnerRemoval

RUN = "pool=101"


def claimed_and_registered(local: LocalControlPlane, claim: str) -> tuple[InstanceRecord, int]:
    """A warm instance claimed for the run, its runner registered and noted, its agent listening."""
    (idle,) = local.pooled()
    local.drain_pool()
    assert local.table.claim(idle.instance_id, RUN, claim).succeeded
    runner = local.plane.github.jit_config(runner_name(idle.instance_id, claim), [RUN])
    assert local.table.record_runner(idle.instance_id, RUN, runner.runner_id).succeeded
    local.table.write_signal(idle.instance_id, Signal.UD_REG_OK, RUN)
    return local.record(idle.instance_id), runner.runner_id


def give_back(local: LocalControlPlane, record: InstanceRecord, runner: int | None) -> ReleaseProgress:
    item = ReleaseItem(instance_id=record.instance_id, run_key=RUN, poll_seconds=1, runner_id=runner)
    return local.release().give_back(item)


def test_a_job_done_before_finish_pools_its_still_claimed_instance(local: LocalControlPlane) -> None:
    # Given a warm instance claimed by a provision whose Finish has not run yet, its runner listening
    record, runner = claimed_and_registered(local, "provision-1#0#0")
    # When the job that runner took completes and its release names the runner
    progress = give_back(local, record, runner)
    # Then the instance is idle, awaiting the agent's receipt, not expired
    assert progress.status is ReleaseStatus.AWAITING_RECEIPT
    assert local.record(record.instance_id).state is InstanceState.IDLE
    # And on the agent's receipt it goes back to the pool
    local.table.write_signal(record.instance_id, Signal.UD_REMOVE_REG_OK, RUN)
    pooled = local.release().check_receipt(progress)
    assert pooled.status is ReleaseStatus.POOLED
    assert [m.instance_id for m in local.drain_pool()] == [record.instance_id]
    # And the provision's late activate loses: the instance is not set running under nobody's job
    late = local.table.activate(record.instance_id, RUN, 60, claim_token="provision-1#0#0")
    assert not late.succeeded


def test_a_release_naming_another_hand_off_leaves_a_claimed_instance_alone(local: LocalControlPlane) -> None:
    # Given a claimed instance whose current runner is not the one a late completion names
    record, runner = claimed_and_registered(local, "provision-2#0#1")
    # When that stale completion's release arrives
    progress = give_back(local, record, runner + 1000)
    # Then it is not this hand-off's: the instance stays claimed for its provision
    assert progress.status is ReleaseStatus.MOVED_ON
    assert local.record(record.instance_id).state is InstanceState.CLAIMED
    assert not any(isinstance(m, PoolMessage) for m in local.drain_pool())


def test_a_run_release_ends_a_claimed_hand_off_whose_runner_took_no_job_and_pools_it(
    local: LocalControlPlane,
) -> None:
    # Given a claimed instance with its runner listening, and the run's release (no runner named)
    record, runner = claimed_and_registered(local, "provision-3#0#0")
    # When it gives the instance back
    progress = give_back(local, record, None)
    # Then the hand-off ends like any other: the runner is deleted from GitHub, the instance awaits its
    # agent's cleanup, and on the receipt it is pooled, not thrown away
    assert progress.status is ReleaseStatus.AWAITING_RECEIPT
    assert progress.runner is RunnerRemoval.DELETED
    assert runner not in local.github.state.runners
    local.table.write_signal(record.instance_id, Signal.UD_REMOVE_REG_OK, RUN)
    assert local.release().check_receipt(progress).status is ReleaseStatus.POOLED


def test_a_run_release_delivered_before_its_short_jobs_release_pools_the_instance_that_served_it(
    local: LocalControlPlane,
) -> None:
    # Given a claimed instance whose runner already ran its job (GitHub removed the JIT runner), and
    # the run's completion handled before the job's (GitHub promises no order between deliveries:
    # https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks)
    record, runner = claimed_and_registered(local, "provision-4#0#0")
    local.github.state.runners.pop(runner)
    # When the run's release gives it back, then the job's
    by_run = give_back(local, record, None)
    by_job = give_back(local, record, runner)
    # Then the first ends the hand-off, the second finds it ended: the instance is cleaned and pooled
    assert by_run.status is ReleaseStatus.AWAITING_RECEIPT
    assert by_run.runner is RunnerRemoval.ALREADY_GONE
    assert by_job.status is ReleaseStatus.AWAITING_RECEIPT
    local.table.write_signal(record.instance_id, Signal.UD_REMOVE_REG_OK, RUN)
    assert local.release().check_receipt(by_run).status is ReleaseStatus.POOLED


def test_a_run_release_expires_a_claimed_instance_never_handed_a_runner(local: LocalControlPlane) -> None:
    # Given a warm instance claimed for the run, its runner not registered yet (no config stored)
    (idle,) = local.pooled()
    local.drain_pool()
    assert local.table.claim(idle.instance_id, RUN, "provision-5#0#0").succeeded
    # When the run's release gives it back: Then it is expired, and the claim worker's hand-over loses
    assert give_back(local, local.record(idle.instance_id), None).status is ReleaseStatus.EXPIRED
    assert not local.table.record_runner(idle.instance_id, RUN, 77).succeeded
