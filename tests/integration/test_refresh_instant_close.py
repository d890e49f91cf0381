"""Refresh takes an instant tier back when its window closes: its Lambda handler on moto and a fake GitHub.

The clock starts on a Friday at 08:00 UTC (ManualClock's start), inside a window that keeps two instant
runners of `large` until 08:30; outside it the class keeps none.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.harness.control_plane import LocalControlPlane, local_control_plane, stack_config
from runner_pool.domain.labels import instant_label
from runner_pool.domain.lifecycle import InstanceState

LABEL = instant_label("large")


@pytest.fixture
def windowed() -> Iterator[LocalControlPlane]:
    window = {"days": ["fri"], "start": "08:00", "end": "08:30", "hot": 0, "instant": 2}
    with local_control_plane(stack_config(warm_pool_minimum={"large": {"windows": [window]}})) as plane:
        # The tier's job of refresh runs where the stack names the machines it starts provisions on.
        plane.deploy("provision")
        plane.deploy("release")
        yield plane
        accounting = plane.accounting()
        assert accounting.holds, accounting.problems


def test_when_the_window_closes_waiting_runners_are_taken_back_and_one_on_a_job_is_left_to_it(
    windowed: LocalControlPlane,
) -> None:
    # Given the tier's three runners: two waiting for a job, one that took a job
    waiting = windowed.running(LABEL, 2)
    (busy,) = windowed.running(LABEL, 1)
    assert busy.runner_id is not None
    assert windowed.table.job_started(busy.instance_id, LABEL, busy.runner_id, "octo/app", 360).succeeded
    windowed.github.state.set_runner_state(busy.runner_id, online=True, busy=True)
    for record in waiting:  # listening: GitHub shows them online
        assert record.runner_id is not None
        windowed.github.state.set_runner_state(record.runner_id, online=True)

    # When the window closes (the tier's size is 0) and refresh runs
    windowed.clock.advance(1800 + 30)  # well within their max runtime
    windowed.refresh()

    # Then both waiting runners are deleted at GitHub and their instances ended (due, terminated next run)
    for record in waiting:
        assert windowed.record(record.instance_id).threshold_passed(windowed.clock.now())
        assert record.runner_id not in windowed.github.state.runners
    # And the one on a job keeps running it
    kept = windowed.record(busy.instance_id)
    assert kept.state is InstanceState.RUNNING
    assert not kept.threshold_passed(windowed.clock.now())
    windowed.refresh()
    assert all(windowed.record(r.instance_id).state is InstanceState.TERMINATED for r in waiting)
