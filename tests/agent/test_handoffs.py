"""Issue 13, fixes 5 and 8 on the agent's side: a new runner for the run key it serves is a new hand-off,
and a runner that exits before it took a job is reported (UD_REG_FAILED), once."""

from __future__ import annotations

from runner_pool.domain.clock import ManualClock
from runner_pool.domain.records import Signal
from tests.agent.conftest import (
    AgentFactory,
    ControlPlane,
    RunningAgent,
    config_id,
    eventually,
    idle_agent,
    jit_config,
    pooled_agent,
)

RUN = "pool=777/class=large"


def claimed_agent(control_plane: ControlPlane, agents: AgentFactory) -> RunningAgent:
    """An agent started on an instance claimed for RUN, no runner handed over to it yet."""
    running = pooled_agent(control_plane, agents)
    control_plane.claim(RUN, config=None)
    return running


def hand_over(control_plane: ControlPlane, runner_id: int, config: str) -> None:
    """As the provision step does it: the runner noted on the record first, then its config stored."""
    assert control_plane.records.record_runner(control_plane.instance_id, RUN, runner_id).succeeded
    control_plane.credentials.store(
        control_plane.instance_id, control_plane.identity.arn, RUN, config, runner_id=runner_id
    )


def test_a_runner_that_exits_before_taking_a_job_is_reported_once(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given a claimed instance whose runner starts listening, then dies before GitHub gives it a job
    running = idle_agent(control_plane, agents)
    control_plane.claim(RUN, config=None)
    hand_over(control_plane, 11, jit_config("vanish", idle_seconds=0.3))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    # When the runner has exited: Then the agent says so for the run key, with the reason
    failed = control_plane.await_signal(Signal.UD_REG_FAILED, RUN)
    assert failed.reason == "the runner exited before it took a job"
    # And it neither starts that config again nor repeats itself, however often it looks (the clock moved,
    # so a repeat would bear another time)
    clock.advance(1)
    running.looked_again(times=5)
    assert len(running.runner_starts) == 1
    again = control_plane.signal()
    assert again is not None
    assert again.at == failed.at


def test_a_runner_that_took_its_job_and_exited_is_not_reported(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given a runner that takes its job and exits, as every JIT runner does after its one job
    running = claimed_agent(control_plane, agents)
    hand_over(control_plane, 12, jit_config(idle_seconds=0.05, job_seconds=0.05))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    eventually(lambda: running.agent._runner is not None and not running.agent._runner.running)
    assert running.agent._runner is not None
    assert not running.agent._runner.exited_without_job()
    # Then nothing is reported, however often it looks: the job's completion releases the instance
    running.looked_again(times=5)
    assert control_plane.latest_signal() is Signal.UD_REG_OK


def test_a_new_runner_for_the_run_key_it_serves_is_a_new_hand_off(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an agent serving RUN with runner 21
    running = claimed_agent(control_plane, agents)
    first = jit_config("hang")
    hand_over(control_plane, 21, first)
    eventually(lambda: running.runner_starts == [config_id(first)])
    # When the control plane hands the instance another runner for the same run key (a retried step
    # registered anew, or a dead runner's replacement)
    second = jit_config(idle_seconds=5)
    hand_over(control_plane, 22, second)
    # Then the agent stops the first, cleans up, and starts the second from its own config
    eventually(lambda: running.runner_starts == [config_id(first), config_id(second)])
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
