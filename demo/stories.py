"""The end of the demo's report: `runner-pool job` for its crashed job and its lost-webhook job, told from
the emulator's records as an operator would read them (runner_pool/job_command.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from demo.scenario import Arrive, CrashDuring, Played, Step
from emulator.world import REPOSITORY, World
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.job_story import JobRef
from runner_pool.job_command import render, stories_of

WIDTH = 118
"""Each line cut to a terminal's width, so the story stays readable."""
EXECUTION = re.compile(r"\b((?:provision|release)-[0-9a-f]{8})[0-9a-f]{16,}")
"""An execution's name is its machine and a digest of what it serves (domain/executions.py): shortened, as
the README's example shortens it."""


def print_job_stories(world: World, steps: Sequence[Step], played: Played) -> None:
    """The story of each job the scenario made go wrong: the one whose instance crashed, and the first job
    of each run whose `queued` webhook GitHub never delivered."""
    told = [
        (f"the crashed job ({c.workflow} / {c.job})", _job_id(world, played, c.workflow, c.job))
        for c in steps
        if isinstance(c, CrashDuring)
    ]
    told += [
        (f"the lost-webhook job ({a.workflow} / {a.jobs[0].name})", played.runs[a.workflow].job_ids[0])
        for a in steps
        if isinstance(a, Arrive) and a.drop_first_queued and a.workflow in played.runs
    ]
    target = world.job_target()
    for title, job_id in told:
        if job_id is None:
            continue
        run_id = world.github.state.jobs[job_id].run_id
        stories, unread = stories_of(
            target, JobRef(REPOSITORY, run_id, job_id), world.aws.client, SystemClock()
        )
        print(f"\nrunner-pool job, {title}:")
        for story in stories or ():
            for sentence in render(story):
                line = EXECUTION.sub(r"\1…", sentence)
                print(line if len(line) <= WIDTH else line[: WIDTH - 1] + "…")
        if unread:
            print(f"  (GitHub not read: {unread})")


def _job_id(world: World, played: Played, workflow: str, name: str) -> int | None:
    run = played.runs.get(workflow)
    if run is None:
        return None
    state = world.github.state
    with state.lock:
        return next((j for j in run.job_ids if state.jobs[j].name == name), None)
