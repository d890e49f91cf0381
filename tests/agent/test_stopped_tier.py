"""The real agent across a stop and a start of its instance (issue 16, item 2): halted with the instance, it
comes back as systemd starts it at boot, with its memory file on the instance's volume."""

from __future__ import annotations

import uuid
from pathlib import Path

from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import ClaimTerms
from runner_pool.domain.records import Signal, UsageClass
from tests.agent.conftest import AgentFactory, ControlPlane, config_id, eventually, jit_config
from tests.support import builders

RUN = builders.run_key(7, "/class=large/usage=on-demand")
NEXT_RUN = builders.run_key(8, "/class=large/usage=on-demand")
STOPPED_SECONDS = 600.0
"""Longer than the healthy window: the heartbeat written before the stop is stale by the start."""


def pooled_on_demand(control_plane: ControlPlane) -> None:
    facts = builders.facts(instance_id=control_plane.instance_id, usage_class=UsageClass.ON_DEMAND)
    assert control_plane.records.create(facts, run_key=None).succeeded
    assert control_plane.records.admit(control_plane.instance_id).succeeded


def boot_counter(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "boots"
    script = tmp_path / "pre-runner.sh"
    script.write_text(f"#!/bin/sh\necho booted >> {marker}\n")
    script.chmod(0o755)
    return marker, script


def test_an_agent_started_from_the_stopped_tier_beats_afresh_and_serves_only_its_new_claim(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock, tmp_path: Path
) -> None:
    # Given an on-demand instance that served RUN, was released and scrubbed (UD_REMOVE_REG_OK)
    marker, script = boot_counter(tmp_path)
    pooled_on_demand(control_plane)
    first = agents.start(pre_runner_script=script)
    first_config = jit_config()
    control_plane.claim(RUN, first_config)
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.released_after_its_job(RUN)

    # And refresh stopped it: its record stopping, the agent halted with the OS, the record stopped
    records = control_plane.records
    assert records.stop(control_plane.instance_id).succeeded
    first.halt()
    record = records.get(control_plane.instance_id)
    assert record is not None
    assert records.mark_stopped(record, clock.now() + 3600).succeeded
    clock.advance(STOPPED_SECONDS)
    started_at = clock.now()

    # When a provision claims it from the stopped tier for NEXT_RUN, hands it a config, and EC2 starts
    # it: systemd starts the agent again, with the same memory file
    token = uuid.uuid4().hex
    assert records.claim(control_plane.instance_id, NEXT_RUN, token, ClaimTerms(stopped=True)).succeeded
    second_config = jit_config()
    control_plane.hand_over(NEXT_RUN, second_config)
    second = agents.start(pre_runner_script=script)

    # Then it beats afresh (a heartbeat written after the start, not the one from before the stop)
    def fresh_beat() -> bool:
        beat = records.read_heartbeat(control_plane.instance_id)
        return beat is not None and beat.beat_at >= started_at

    eventually(fresh_beat, what="a heartbeat written after the start")

    # And registers a runner for NEXT_RUN with its new config, never again with the one used before
    control_plane.await_signal(Signal.UD_REG_OK, NEXT_RUN)
    assert second.runner_starts == [config_id(first_config), config_id(second_config)]

    # And the pre-runner script did not run again, and the agent did not end its instance
    assert marker.read_text().splitlines() == ["booted"]
    assert not second.agent.terminated
    assert second.powered_off == []


def test_an_agent_whose_record_is_stopping_does_not_end_its_instance(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock, config: StackConfig
) -> None:
    # Given an idle instance refresh has chosen for the stopped tier, its idle time nearly over
    pooled_on_demand(control_plane)
    running = agents.start()
    control_plane.await_signal(Signal.UD_OK, None)
    clock.advance(config.timeouts.idle_seconds - 30)
    assert control_plane.records.stop(control_plane.instance_id).succeeded

    # When the time its idle threshold would have ended, and its grace, have passed while EC2 stops it
    clock.advance(30 + running.settings.termination_grace_seconds)
    moved_at = clock.now()

    def beat_since() -> bool:
        beat = control_plane.records.read_heartbeat(control_plane.instance_id)
        return beat is not None and beat.beat_at >= moved_at

    eventually(beat_since, what="the agent at work after the clock moved")

    # Then the agent has not terminated it: it watches the stopping record's threshold, not the idle one
    record = control_plane.records.get(control_plane.instance_id)
    assert record is not None
    assert record.state is InstanceState.STOPPING
    assert not running.agent.terminated

    # And once a stop that never finished has outlived timeouts.stopping_seconds and the grace, it does
    clock.advance(config.timeouts.stopping_seconds)
    eventually(
        lambda: running.agent.terminated, what="the agent ending an instance whose stop never finished"
    )
