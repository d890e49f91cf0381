"""The stopped tier on the whole system (issue 16, item 2): a job served from a stopped instance.

The real stack on local AWS, with a stopped tier of one instance per class and on-demand jobs: an
instance that served a job is stopped by refresh once its agent has cleaned up (the simulated instance
shuts its agent down with it), and the next job starts it again instead of launching one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.fake_github import Conclusion, JobSpec
from emulator.timeline import Happening
from emulator.world import World
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from tests.e2e.conftest import SWEEP_LOOK_SECONDS, awaited, completed, e2e_world, job_of

pytestmark = pytest.mark.slow

LABEL = "pool=${{ github.run_id }}/class=large/usage=on-demand"
STOPPED_WAIT_SECONDS = 60.0


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[World]:
    """The e2e system with a stopped tier of one instance per class (its idle time short: refresh stops an
    instance at its first run after the agent's receipt)."""
    with e2e_world(tmp_path, timeouts={"idle_seconds": 20}, pool={"stopped_maximum": 1}) as running:
        yield running


def happenings(system: World, happening: Happening) -> list[str]:
    return [e.instance_id or "" for e in system.timeline.events() if e.happening is happening]


def record_state(system: World, instance_id: str) -> InstanceState | None:
    record = system.records.get(instance_id)
    return None if record is None else record.state


def test_a_job_is_served_from_a_stopped_instance_started_once_and_nothing_leaks(tiered: World) -> None:
    # Given a first job that cold-started an on-demand instance, which refresh then stopped
    first = completed(tiered, tiered.start_run("build", JobSpec("build", LABEL, seconds=0.5)))
    instance_id = instance_of_runner(job_of(tiered, first).runner_name)
    assert instance_id is not None
    awaited(
        tiered,
        lambda: record_state(tiered, instance_id) is InstanceState.STOPPED,
        "the instance to be stopped",
        STOPPED_WAIT_SECONDS,
    )
    assert happenings(tiered, Happening.STOPPED) == [instance_id]

    # When a second workflow's job is queued
    second = completed(tiered, tiered.start_run("test", JobSpec("test", LABEL, seconds=0.5)))

    # Then it ran on that instance, started once, and no other instance was launched
    job = job_of(tiered, second)
    assert job.conclusion is Conclusion.SUCCESS
    assert instance_of_runner(job.runner_name) == instance_id
    assert happenings(tiered, Happening.STARTED) == [instance_id]
    assert happenings(tiered, Happening.LAUNCHED) == [instance_id]

    # And once things settle, every instance is accounted for: none leaked, none lost
    awaited(
        tiered,
        lambda: not any(e["status"] == "RUNNING" for e in tiered.stack.executions()),
        "executions to end",
        every=SWEEP_LOOK_SECONDS,
    )
    awaited(
        tiered,
        lambda: tiered.accounting().holds,
        f"the accounting to hold: {tiered.accounting().problems}",
        every=SWEEP_LOOK_SECONDS,
    )
