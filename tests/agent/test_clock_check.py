"""The agent's clock check at boot: an instance whose clock chrony cannot vouch for is never used."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator.simulated_instances import chronyc_script
from runner_pool.domain.records import Signal
from tests.agent.conftest import AgentFactory, ControlPlane


def chronyc(tmp_path: Path, script: str, name: str = "chronyc") -> Path:
    program = tmp_path / name
    program.write_text(script)
    program.chmod(0o755)
    return program


def test_a_clock_within_the_bound_of_amazon_time_sync_boots(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance whose chrony is synchronised to Amazon Time Sync, 2 ms slow
    control_plane.launch_for_pool()
    program = chronyc(agents.tmp_path, chronyc_script(offset_seconds=0.002))

    # When its agent boots / Then it signals UD_OK
    agents.start(chronyc=program, clock_sync_wait_seconds=0.5)
    control_plane.await_signal(Signal.UD_OK, None)


@pytest.mark.parametrize("offset", [5.0, -5.0], ids=["slow", "fast"])
def test_a_skewed_clock_fails_the_boot_with_its_figures(
    control_plane: ControlPlane, agents: AgentFactory, offset: float
) -> None:
    # Given an instance whose clock stays 5 s off Amazon Time Sync, and a pre-runner script
    control_plane.launch_for_pool()
    program = chronyc(agents.tmp_path, chronyc_script(offset_seconds=offset))
    script = chronyc(agents.tmp_path, f"#!/bin/sh\ntouch {agents.tmp_path / 'prepared'}\n", "pre-runner.sh")

    # When its agent boots, waiting a little for chrony to correct it
    agents.start(chronyc=program, clock_sync_wait_seconds=0.3, pre_runner_script=script)

    # Then it signals UD_FAILED with how far off and against what, and runs nothing else
    failed = control_plane.await_signal(Signal.UD_FAILED, None)
    assert failed.reason is not None
    direction = "slow" if offset > 0 else "fast"
    assert f"{direction} of 169.254.169.123 by 5.000 s" in failed.reason
    assert "more than the 1 s a heartbeat may be off" in failed.reason
    assert not (agents.tmp_path / "prepared").exists()


def test_a_clock_chrony_never_synchronised_fails_the_boot(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance whose chrony has not synchronised by the end of the wait
    control_plane.launch_for_pool()
    program = chronyc(agents.tmp_path, chronyc_script(leap="Not synchronised"))

    # When its agent boots / Then it signals UD_FAILED saying so
    agents.start(chronyc=program, clock_sync_wait_seconds=0.3)
    failed = control_plane.await_signal(Signal.UD_FAILED, None)
    assert failed.reason is not None
    assert "the clock is not synchronised" in failed.reason


def test_a_clock_stepped_into_sync_during_the_wait_boots(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an instance whose chrony answers 40 s off at first, then stepped (makestep) to 1 ms
    control_plane.launch_for_pool()
    answers = agents.tmp_path / "answers"
    stepped = chronyc(agents.tmp_path, chronyc_script(offset_seconds=0.001), "stepped")
    off = chronyc(agents.tmp_path, chronyc_script(offset_seconds=40.0), "off")
    program = chronyc(
        agents.tmp_path,
        f'#!/bin/sh\necho x >> "{answers}"\n'
        f'if [ "$(wc -l < "{answers}")" -gt 1 ]; then exec "{stepped}"; else exec "{off}"; fi\n',
    )

    # When its agent boots, polling chrony / Then it signals UD_OK once the clock is in bound
    agents.start(chronyc=program, clock_sync_wait_seconds=5)
    control_plane.await_signal(Signal.UD_OK, None)
    assert len(answers.read_text().splitlines()) >= 2


def test_chronyc_that_cannot_run_fails_the_boot(control_plane: ControlPlane, agents: AgentFactory) -> None:
    # Given an instance whose chrony client is missing
    control_plane.launch_for_pool()

    # When its agent boots / Then it signals UD_FAILED naming the program
    agents.start(chronyc=agents.tmp_path / "no-chronyc", clock_sync_wait_seconds=0)
    failed = control_plane.await_signal(Signal.UD_FAILED, None)
    assert failed.reason is not None
    assert "the clock could not be checked" in failed.reason
    assert "no-chronyc" in failed.reason
