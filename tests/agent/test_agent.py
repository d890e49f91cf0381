"""The real agent, in a thread, against moto and a fake runner: every step of its side of the protocol."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner_pool.domain.clock import ManualClock
from runner_pool.domain.records import Signal
from tests.agent.conftest import (
    AgentFactory,
    ControlPlane,
    config_id,
    eventually,
    idle_agent,
    jit_config,
    pooled_agent,
    process_alive,
    throttling_response,
)
from tests.conftest import TABLE_NAME
from tests.support import builders

RUN = builders.run_key(7, "/class=large")
NEXT_RUN = builders.run_key(8, "/class=large")


def test_boot_signals_ud_ok_and_beats_steadily(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given a freshly launched instance whose pre-runner script succeeds
    script = agents.tmp_path / "pre-runner.sh"
    script.write_text(f"#!/bin/sh\necho preparing\ntouch {agents.tmp_path / 'prepared'}\n")
    script.chmod(0o755)

    # When the agent starts
    agents.start(pre_runner_script=script)

    # Then the script ran once and the agent signals UD_OK
    control_plane.await_signal(Signal.UD_OK, None)
    assert (agents.tmp_path / "prepared").exists()

    # And each time the clock moves on, a fresh heartbeat follows within a few periods
    def beats_at(moment: float) -> Callable[[], bool]:
        def check() -> bool:
            beat = control_plane.records.read_heartbeat(control_plane.instance_id)
            return beat is not None and beat.beat_at == moment

        return check

    for _ in range(3):
        eventually(beats_at(clock.advance(5)), timeout=2, what="a heartbeat at the new time")


def test_every_item_the_agent_reads_and_writes_is_keyed_by_its_own_instance_arn(
    control_plane: ControlPlane, agents: AgentFactory, dynamodb: Any
) -> None:
    # Given an instance in the pool, its agent running, claimed with its config handed over
    pooled_agent(control_plane, agents)
    control_plane.claim(RUN, jit_config(idle_seconds=5))

    # When it has registered (it read its record and its config, and wrote heartbeat and signals)
    control_plane.await_signal(Signal.UD_REG_OK, RUN)

    # Then every item of the instance is keyed by the ARN the metadata service gave the agent, which is
    # what `${ec2:SourceInstanceARN}` resolves to for its requests: what it reads under the ARN, what it
    # writes under `agent#` and the ARN (issue 36: never beside the record)
    items = dynamodb.scan(TableName=TABLE_NAME, ConsistentRead=True)["Items"]
    arn = control_plane.identity.arn
    assert {(item["pk"]["S"], item["sk"]["S"]) for item in items} == {
        (arn, "state"),
        (arn, "runner-config"),
        (f"agent#{arn}", "heartbeat"),
        (f"agent#{arn}", "signal"),
    }
    assert (
        control_plane.identity.arn
        == f"arn:aws:ec2:us-east-1:123456789012:instance/{control_plane.instance_id}"
    )


def test_a_failing_pre_runner_script_signals_ud_failed_and_refuses_to_register(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance whose pre-runner script fails
    script = agents.tmp_path / "pre-runner.sh"
    script.write_text("#!/bin/sh\necho 'disk not mounted' >&2\nexit 3\n")
    script.chmod(0o755)
    control_plane.launch_for_pool()

    # When the agent boots
    running = agents.start(pre_runner_script=script)

    # Then it signals UD_FAILED with the script's own words
    failed = control_plane.await_reason(Signal.UD_FAILED, None)
    assert "exited with code 3" in failed
    assert "disk not mounted" in failed

    # And a claim gets UD_REG_FAILED instead of a runner
    control_plane.claim(RUN, jit_config())
    refused = control_plane.await_reason(Signal.UD_REG_FAILED, RUN)
    assert "pre-runner script" in refused
    assert running.runner_starts == []


def test_a_claim_registers_a_runner_for_exactly_that_run_key(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an idle instance in the pool, its agent running
    running = idle_agent(control_plane, agents)

    # When a run claims it and hands it its runner config
    config = jit_config(idle_seconds=5)
    control_plane.claim(RUN, config)

    # Then the agent signals UD_REG_OK for that run key, once the runner listens
    # And the runner was started once, with exactly the config the control plane stored
    control_plane.await_runner(running, RUN, config)


def test_the_agent_waits_for_a_config_handed_over_after_the_claim(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance claimed for a run whose config has not been stored yet
    running = pooled_agent(control_plane, agents)
    control_plane.claim(RUN, config=None)
    running.looked_again()
    assert running.runner_starts == []

    # When the config arrives
    config = jit_config(idle_seconds=5)
    control_plane.hand_over(RUN, config)

    # Then the runner starts with it and the agent signals UD_REG_OK
    control_plane.await_runner(running, RUN, config)


def test_a_config_stored_for_an_earlier_run_is_never_used(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance claimed for RUN while the stored config is still the one of an earlier run
    control_plane.launch_for_pool()
    control_plane.hand_over(NEXT_RUN, jit_config())
    running = agents.start()
    control_plane.claim(RUN, config=None)

    # When the agent has looked at its record many times / Then no runner started
    running.looked_again(times=5)
    assert running.runner_starts == []
    assert control_plane.latest_signal() is Signal.UD_OK


def test_release_stops_what_is_left_cleans_the_work_directory_and_gives_the_receipt(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance that ran a job for RUN (the fake job leaves files and a process behind)
    running = pooled_agent(control_plane, agents)
    control_plane.claim(RUN, jit_config(job_seconds=0.05))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.activate(RUN)
    work_dir = running.settings.runner_work_dir
    leftover_file = running.settings.runner_dir / "leftover.pid"
    job_file = work_dir / "repository" / "build.log"
    eventually(job_file.exists, what="the job's files")
    eventually(leftover_file.exists, what="the job's leftover process")
    leftover = int(leftover_file.read_text())
    assert process_alive(leftover)

    # When the job is over and the control plane releases the instance
    control_plane.release(RUN)

    # Then the agent gives its receipt for that run key
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)

    # And the work directory is empty and the job's leftover process is gone
    assert work_dir.is_dir()
    assert list(work_dir.iterdir()) == []
    eventually(lambda: not process_alive(leftover), timeout=2, what="the leftover process to end")


def test_a_release_while_the_job_still_runs_stops_the_runner(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given a runner busy with a long job (a cancelled workflow run, say)
    pooled_agent(control_plane, agents)
    control_plane.claim(RUN, jit_config(job_seconds=30))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.activate(RUN)

    # When the control plane releases the instance
    started = time.monotonic()
    control_plane.release(RUN)

    # Then the agent stops the runner and gives its receipt without waiting for the job
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)
    assert time.monotonic() - started < 5


def test_a_quarantine_stops_the_runner_and_its_job_at_once_and_nothing_more(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given a runner (42) busy with a long job, one GitHub reports is not of its run
    running = pooled_agent(control_plane, agents)
    control_plane.claim(RUN, None)
    assert control_plane.records.record_runner(control_plane.instance_id, RUN, 42).succeeded
    control_plane.hand_over(RUN, jit_config(job_seconds=30))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.activate(RUN)
    leftover_file = running.settings.runner_dir / "leftover.pid"
    eventually(leftover_file.exists, what="the job to start")
    job_process = int(leftover_file.read_text())

    # When the control plane quarantines the instance (its threshold passed, the agent's grace not)
    assert control_plane.records.quarantine(control_plane.instance_id, 42).succeeded

    # Then the agent stops the runner and the job's processes with it, well within the job's time
    eventually(lambda: not process_alive(job_process), timeout=5, what="the job to be stopped")
    # And it neither scrubs nor gives a receipt (the instance is never used again), nor ends itself
    # before its grace: refresh terminates it
    assert control_plane.signal() is not None
    assert control_plane.signal().confirms(Signal.UD_REG_OK, RUN)  # type: ignore[union-attr]
    assert (running.settings.runner_work_dir / "repository" / "build.log").exists()
    assert running.powered_off == []
    assert not running.agent.terminated


def test_an_instance_back_in_the_pool_registers_again_for_the_same_run(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance that served RUN and was released back to the pool
    running = pooled_agent(control_plane, agents)
    first = jit_config()
    control_plane.claim(RUN, first)
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.released_after_its_job(RUN)

    # When another job of the same run (same label, same run key) claims it; for a moment, until
    # the new config is stored, the one already used is all there is for that run key
    control_plane.claim(RUN, config=None)
    running.looked_again()
    assert len(running.runner_starts) == 1
    second = jit_config()
    control_plane.hand_over(RUN, second)

    # Then it registers a new runner with the new config, never the used one again
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    assert running.runner_starts == [config_id(first), config_id(second)]


def test_the_heartbeat_goes_on_while_a_slow_runner_starts(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given a claimed instance whose runner is slow to start listening
    running = pooled_agent(control_plane, agents, listening_timeout_seconds=5)
    control_plane.claim(RUN, jit_config(mode="hang"))
    eventually(lambda: running.runner_starts, what="the runner to start")

    # When time passes while the agent waits for the runner
    moved_on = clock.advance(10)

    # Then heartbeats still arrive, so the claim worker does not take the instance for dead
    eventually(
        lambda: (
            (beat := control_plane.records.read_heartbeat(control_plane.instance_id)) is not None
            and beat.beat_at == moved_on
        ),
        timeout=2,
        what="a heartbeat during the runner's start",
    )
    assert control_plane.signal() is not None
    assert not control_plane.signal().confirms(Signal.UD_REG_OK, RUN)  # type: ignore[union-attr]


def test_a_runner_that_fails_to_start_signals_ud_reg_failed_with_its_reason(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given a claimed instance whose runner will refuse its config
    running = pooled_agent(control_plane, agents)

    # When the agent starts the runner
    control_plane.claim(RUN, jit_config(mode="refuse"))

    # Then it signals UD_REG_FAILED for the run, saying why
    failed = control_plane.await_reason(Signal.UD_REG_FAILED, RUN)
    assert "exited with code 1 before listening" in failed
    assert "Runner registration has been deleted" in failed

    # And it does not try again for the same run key, however often it looks
    running.looked_again(times=5)
    assert len(running.runner_starts) == 1


def test_a_runner_that_never_listens_is_stopped_and_reported(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given a runner that hangs before listening
    pooled_agent(control_plane, agents, listening_timeout_seconds=0.3)

    # When the listening timeout passes
    control_plane.claim(RUN, jit_config(mode="hang"))

    # Then the agent signals UD_REG_FAILED with the timeout as the reason
    failed = control_plane.await_reason(Signal.UD_REG_FAILED, RUN)
    assert "not listening after 0.3 s" in failed


class ThrottleAfterRegistration:
    """A before-call hook: from the agent's first UD_REG_OK write on, DynamoDB throttles it for `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.until: float | None = None
        self.throttled = 0
        self.lock = threading.Lock()

    def __call__(self, model: Any, params: dict[str, Any], **_: Any) -> Any:
        with self.lock:
            now = time.monotonic()
            if self.until is None and model.name == "PutItem":
                item = json.loads(params["body"])["Item"]
                if item.get("signal", {}).get("S") == Signal.UD_REG_OK.value:
                    self.until = now + self.seconds
            if self.until is not None and now < self.until:
                self.throttled += 1
                return throttling_response()
            return None


def test_throttled_dynamodb_for_seconds_recovers_without_a_second_registration(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an agent whose DynamoDB calls are throttled for 3 s from the moment it first writes UD_REG_OK
    control_plane.launch_for_pool()
    running = agents.build()
    throttle = ThrottleAfterRegistration(seconds=3.0)
    running.dynamodb.meta.events.register("before-call.dynamodb.*", throttle)
    agents.started.append(running.start())

    # When a run claims the instance
    config = jit_config(idle_seconds=10)
    control_plane.claim(RUN, config)

    # Then, once the throttling is over, UD_REG_OK for the run arrives
    control_plane.await_signal(Signal.UD_REG_OK, RUN, timeout=10)
    assert throttle.until is not None
    assert time.monotonic() >= throttle.until
    assert throttle.throttled > 10

    # And the runner was started exactly once, though the agent read its record all along
    assert running.runner_starts == [config_id(config)]

    # And the agent still follows its record: a release gets its receipt
    control_plane.released_after_its_job(RUN)


def test_a_restarted_agent_neither_reboots_nor_registers_again(
    control_plane: ControlPlane, agents: AgentFactory, tmp_path: Path
) -> None:
    # Given an agent that booted and registered a runner for RUN, then died
    marker = tmp_path / "boots"
    script = tmp_path / "pre-runner.sh"
    script.write_text(f"#!/bin/sh\necho booted >> {marker}\n")
    script.chmod(0o755)
    first = pooled_agent(control_plane, agents, pre_runner_script=script)
    control_plane.claim(RUN, jit_config(idle_seconds=10))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    first.halt()

    # When systemd starts the agent again, with the same memory file
    second = agents.start(pre_runner_script=script)
    second.looked_again()

    # Then the pre-runner script did not run again and no second runner started
    assert marker.read_text().splitlines() == ["booted"]
    assert len(second.runner_starts) == 1

    # And the restarted agent still cleans up and answers the release
    control_plane.released_after_its_job(RUN)
