"""Release end to end: the real release ASL in moto's interpreter, its tasks on our handlers, a fake GitHub.

The agent is simulated at each Wait of the state machine: the clock moves on by the Wait's seconds,
and every agent whose record no longer holds the run key it served writes its receipt, as
agent/loop.py does once it has stopped the runner and cleaned the workspace.
"""

from __future__ import annotations

from typing import Any

import pytest

from emulator.harness.control_plane import LocalControlPlane, LocalStateMachine
from emulator.harness.release_world import ReleaseAgents as Agents
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import PoolMessage, Signal

RUN = "pool=101"
OTHER_RUN = "pool=202"


@pytest.fixture
def release(local: LocalControlPlane) -> LocalStateMachine:
    return local.deploy("release")


def by_instance(instance_id: str, run_key: str = RUN, cause: str = "job-1") -> dict[str, Any]:
    return ReleaseRequest(run_key=run_key, instance_id=instance_id, cause=cause).model_dump(mode="json")


def by_run(run_key: str = RUN) -> dict[str, Any]:
    return ReleaseRequest(run_key=run_key, cause="run-completed").model_dump(mode="json")


def broken(_event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """A step's handler that fails every time, unexpectedly."""
    raise RuntimeError("the table is on fire")


def statuses(execution: Any) -> dict[str, str]:
    return {outcome["instance_id"]: outcome["status"] for outcome in execution.output["released"]}


# --- by instance ----------------------------------------------------------------------------------


def test_a_clean_release_pools_the_instance_with_its_idle_threshold(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given an instance running a job of the run, whose agent answers once the run key is cleared
    (running,) = local.running(RUN)
    agents = Agents(local)
    agents.serve(running.instance_id, RUN)
    # When the job completes and its instance is released
    execution = release.run(by_instance(running.instance_id), on_wait=agents.on_wait)
    # Then the record is idle and unheld, with a fresh idle threshold (not the old running one) ...
    assert execution.status == "SUCCEEDED", execution.output
    record = local.record(running.instance_id)
    assert (record.state, record.run_key) == (InstanceState.IDLE, None)
    assert record.threshold != running.threshold
    released_at = record.updated_at
    assert record.threshold == released_at + local.config.timeouts.idle_seconds
    # ... and its class's queue offers it once, with that same threshold
    assert local.drain_pool("large") == [PoolMessage.for_idle(record)]
    assert statuses(execution) == {running.instance_id: "pooled"}


def test_the_receipt_is_looked_for_at_its_poll_setting(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance whose agent never answers
    (running,) = local.running(RUN)
    agents = Agents(local, answer=None)
    # When it is released
    release.run(by_instance(running.instance_id), on_wait=agents.on_wait)
    # Then every wait lasted one receipt poll, set from the config, until the receipt timeout
    period = int(local.config.timeouts.release_receipt_poll_seconds)
    assert set(agents.waits) == {period}
    assert sum(agents.waits) == local.config.timeouts.release_receipt_seconds


def test_a_release_whose_agent_never_answers_expires_the_instance_and_refresh_terminates_it(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance whose agent never answers
    (running,) = local.running(RUN)
    agents = Agents(local, answer=None)
    agents.serve(running.instance_id, RUN)
    # When it is released and the receipt timeout passes
    execution = release.run(by_instance(running.instance_id), on_wait=agents.on_wait)
    # Then it is expired and not pooled
    assert statuses(execution) == {running.instance_id: "expired"}
    assert local.record(running.instance_id).threshold_passed(local.clock.now())
    assert local.drain_pool("large") == []
    # And the next refresh terminates it
    local.refresh()
    assert local.record(running.instance_id).state is InstanceState.TERMINATED
    assert local.ec2_state(running.instance_id) in ("shutting-down", "terminated")


def test_an_agent_that_cannot_clean_up_gets_its_instance_expired(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance whose agent fails its cleanup
    (running,) = local.running(RUN)
    agents = Agents(local, answer=Signal.UD_REMOVE_REG_FAILED)
    agents.serve(running.instance_id, RUN)
    # When it is released
    execution = release.run(by_instance(running.instance_id), on_wait=agents.on_wait)
    # Then it is expired at once, without waiting out the receipt timeout, and not pooled
    assert statuses(execution) == {running.instance_id: "expired"}
    assert len(agents.waits) == 1
    assert local.record(running.instance_id).threshold_passed(local.clock.now())
    assert local.drain_pool("large") == []


def test_a_runner_that_never_took_a_job_is_deleted_from_github(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance whose registered runner never took a job (GitHub still lists it)
    (running,) = local.running(RUN)
    assert running.runner_id is not None
    agents = Agents(local)
    agents.serve(running.instance_id, RUN)
    # When it is released
    execution = release.run(by_instance(running.instance_id), on_wait=agents.on_wait)
    # Then GitHub no longer lists the runner
    assert running.runner_id not in local.github.state.runners
    assert execution.output["released"][0]["runner"] == "deleted"


def test_a_runner_still_busy_is_left_for_github_to_remove(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance whose runner GitHub still shows busy (its job's end not yet seen)
    (running,) = local.running(RUN)
    assert running.runner_id is not None
    local.github.state.set_runner_state(running.runner_id, online=True, busy=True)
    agents = Agents(local)
    agents.serve(running.instance_id, RUN)
    # When it is released
    execution = release.run(by_instance(running.instance_id), on_wait=agents.on_wait)
    # Then the runner is left alone and the instance still goes back to the pool
    assert running.runner_id in local.github.state.runners
    assert statuses(execution) == {running.instance_id: "pooled"}


def test_a_release_for_another_run_leaves_the_instance_alone(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given an instance running for one run
    (running,) = local.running(RUN)
    # When a release names it for another run (a stale or misdirected webhook)
    execution = release.run(
        by_instance(running.instance_id, run_key=OTHER_RUN), on_wait=Agents(local).on_wait
    )
    # Then nothing changes: the instance moved on, which is no error
    assert execution.status == "SUCCEEDED"
    assert statuses(execution) == {running.instance_id: "moved-on"}
    assert local.record(running.instance_id) == running
    assert running.runner_id in local.github.state.runners


def test_a_step_that_fails_unexpectedly_expires_what_the_release_held(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance, and a receipt check that fails every time
    (running,) = local.running(RUN)

    # When it is released
    execution = release.run(
        by_instance(running.instance_id), on_wait=Agents(local).on_wait, replace={"check_receipt": broken}
    )
    # Then the execution's Catch expired the instance it had released, and did not pool it
    assert statuses(execution) == {running.instance_id: "salvaged"}
    record = local.record(running.instance_id)
    assert (record.state, record.run_key) == (InstanceState.IDLE, None)
    assert record.threshold_passed(local.clock.now())
    assert local.drain_pool("large") == []


def test_a_plan_that_fails_past_its_retries_ends_the_release_in_its_named_failure(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a running instance, and a plan that fails every time
    (running,) = local.running(RUN)

    # When its run is released
    execution = release.run(by_run(RUN), on_wait=Agents(local).on_wait, replace={"plan": broken})
    # Then Plan's Catch ends the execution in the Unplanned state, and the instance is left as it was
    assert execution.status == "FAILED"
    (failed,) = [event for event in execution.events if event["type"] == "ExecutionFailed"]
    assert failed["executionFailedEventDetails"]["error"] == "ReleaseNotPlanned"
    record = local.record(running.instance_id)
    assert (record.state, record.run_key) == (InstanceState.RUNNING, RUN)


# --- by run ---------------------------------------------------------------------------------------


def test_releasing_a_run_pools_its_running_instances_and_expires_what_never_served(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a completed run holding two running instances, one still created for it and one claimed,
    # and another run's running instance
    running = local.running(RUN, count=2)
    (created,) = local.launch(1, RUN)
    (pooled,) = local.pooled()
    local.drain_pool("large")
    assert local.table.claim(pooled.instance_id, RUN, "claim-1").succeeded
    (other,) = local.running(OTHER_RUN)
    agents = Agents(local)
    for record in running:
        agents.serve(record.instance_id, RUN)
    # When the run is released
    execution = release.run(by_run(RUN), on_wait=agents.on_wait)
    # Then its running instances are pooled, the created and claimed ones expired, the other run's untouched
    assert execution.status == "SUCCEEDED", execution.output
    assert statuses(execution) == {
        running[0].instance_id: "pooled",
        running[1].instance_id: "pooled",
        created.instance_id: "expired",
        pooled.instance_id: "expired",
    }
    assert sorted(m.instance_id for m in local.drain_pool("large")) == sorted(r.instance_id for r in running)
    now = local.clock.now()
    assert local.record(created.instance_id).threshold_passed(now)
    assert local.record(pooled.instance_id).threshold_passed(now)
    assert local.record(other.instance_id) == other


def test_a_provision_still_in_flight_loses_its_activate_once_the_run_is_released(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given an instance created for the run whose provision has not activated it yet
    (created,) = local.launch(1, RUN)
    # When the run is released, and then the provision tries to activate it
    release.run(by_run(RUN), on_wait=Agents(local).on_wait)
    activated = local.table.activate(created.instance_id, RUN, 60)
    # Then the activate is lost: the instance stays expired, for refresh to terminate
    assert not activated.succeeded
    assert local.record(created.instance_id).state is InstanceState.CREATED


def test_releasing_a_run_that_holds_nothing_succeeds_with_nothing_done(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a run that holds no instance (every job's release came first)
    # When the run is released
    execution = release.run(by_run(RUN), on_wait=Agents(local).on_wait)
    # Then the execution succeeds and released nothing
    assert execution.status == "SUCCEEDED"
    assert execution.output["released"] == []


# --- a step's answer lost after its effect (issue 12, defect 8) -----------------------------------

LAMBDA_TIMED_OUT = type("Sandbox.Timedout", (Exception,), {})
"""What Lambda answers for a function that ran past its timeout (errorType `Sandbox.Timedout`; Step
Functions' legacy Lambda resource reports it as `Lambda.Unknown`:
https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html)."""


@pytest.mark.parametrize("step", ["plan", "give_back", "check_receipt"])
def test_a_step_that_timed_out_after_its_effect_is_retried_and_the_clean_instance_pooled(
    local: LocalControlPlane, release: LocalStateMachine, step: str
) -> None:
    # Given a running instance whose agent answers, and a release step that does its work but whose
    # Lambda then times out once (its answer lost after the side effect)
    (running,) = local.running(RUN)
    agents = Agents(local)
    agents.serve(running.instance_id, RUN)
    real = release.handlers[step]
    timed_out: list[str] = []

    def times_out_once(event: dict[str, Any], context: Any) -> Any:
        answer = real(event, context)
        if not timed_out:
            timed_out.append(step)
            raise LAMBDA_TIMED_OUT("Task timed out after 30.00 seconds")
        return answer

    # When the instance is released
    execution = release.run(
        by_instance(running.instance_id), on_wait=agents.on_wait, replace={step: times_out_once}
    )
    # Then the idempotent step was retried, and the clean instance went back to the pool, not salvaged
    assert timed_out == [step]
    assert execution.status == "SUCCEEDED", execution.output
    assert statuses(execution) == {running.instance_id: "pooled"}
    record = local.record(running.instance_id)
    assert (record.state, record.run_key) == (InstanceState.IDLE, None)
    assert not record.threshold_passed(local.clock.now())
    # A replayed CheckReceipt may offer it twice: pickup takes pool messages at least once anyway (SQS
    # standard queues may deliver any message twice:
    # https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/standard-queues-at-least-once-delivery.html)
    # and its claim is conditional on the record, so a duplicate offer claims nothing twice.
    offers = local.drain_pool("large")
    assert offers
    assert set(offers) == {PoolMessage.for_idle(record)}
