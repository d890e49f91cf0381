"""Who may follow whom on an instance, end to end on an organisation installation: runners registered so
that only their job's repository can take them (in a runner group of that repository alone, the
organisation's default, or at the repository), reuse within the job's repository only, public
repositories never reusing, and a foreign job on one of our runners quarantining its instance.

Each scenario ends with the accounting check: every instance of the stack has a live record, and
every live record an instance.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from emulator.fake_github import Conclusion, FakeWorkflowRun, JobSpec
from emulator.timeline import Happening, TimelineEvent
from emulator.world import (
    APP_ID,
    COMPRESSED_TIMEOUTS,
    INSTALLATION_ID,
    OWNER,
    World,
    compressed_config,
    world,
)
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.runner_scope import Registration
from tests.e2e.conftest import (
    FAST_INSTANCES,
    FAST_TIMERS,
    LABEL,
    accounted,
    awaited,
    completed,
    job_of,
    settled,
)

pytestmark = pytest.mark.slow

APP = f"{OWNER}/app"
LIB = f"{OWNER}/lib"
SITE = f"{OWNER}/site"
REPOSITORY_JIT = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"
ORGANISATION_JIT = "POST /orgs/{org}/actions/runners/generate-jitconfig"


def organisation_world(tmp_path: Path, registration: str | None = None, **reuse: object) -> Iterator[World]:
    """An organisation installation's stack, on its default registration (runner groups) unless
    `registration` is set. Registering in runner groups, the installation has no repository
    administration at all (emulator/world.py accepted_permissions), and public repositories' groups are
    allowed."""
    github: dict[str, object] = {"app_id": str(APP_ID), "installation_id": INSTALLATION_ID, "scope": OWNER}
    if registration is not None:
        github["registration"] = registration
    config = compressed_config(
        timeouts={**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8}, github=github, reuse=reuse
    )
    by_group = config.github.effective_registration is Registration.RUNNER_GROUP
    allowing = config.github.model_copy(update={"runner_groups_allow_public_repositories": by_group})
    config = config.model_copy(update={"github": allowing})
    with world(
        tmp_path, config=config, instance_settings=FAST_INSTANCES, timers=FAST_TIMERS, lost_runner_seconds=4.0
    ) as running:
        accepted = running.github.state.installations[INSTALLATION_ID].permissions
        assert ("administration" in accepted) is not by_group
        yield running


REGISTRATIONS = [pytest.param(None, id="default"), pytest.param("repository", id="repository")]
"""The organisation's default (runner groups), and registration at the repository it may choose."""


@pytest.fixture(params=REGISTRATIONS)
def org(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    """The whole system with the App installed on the organisation, reuse at its defaults."""
    yield from organisation_world(tmp_path, request.param)


@pytest.fixture(params=REGISTRATIONS)
def org_any_scope(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    """As `org`, with reuse.scope `any`: only the public-repository rule keeps instances apart."""
    yield from organisation_world(tmp_path, request.param, scope="any")


def run_in(system: World, repository: str, workflow: str, seconds: float = 0.5) -> FakeWorkflowRun:
    jobs = [JobSpec(workflow, LABEL, seconds=seconds)]
    return completed(system, system.github.actions.start_run(repository, workflow, jobs))


def instance_of(system: World, run: FakeWorkflowRun) -> str:
    instance_id = instance_of_runner(job_of(system, run).runner_name)
    assert instance_id is not None
    return instance_id


def launched(system: World) -> list[str]:
    return [e.instance_id or "" for e in system.timeline.events() if e.happening is Happening.LAUNCHED]


def told(events: Sequence[TimelineEvent], start: float) -> str:
    """Timeline events one a line, seconds from `start`: which instance did what, when."""
    return "\n".join(
        f"{e.at - start:7.2f} {e.happening:<12} {e.instance_id or '':<20} {e.job or ''} {e.detail}".rstrip()
        for e in events
    )


def whole_story(system: World) -> str:
    """The whole timeline, for a failed assertion."""
    events = system.events()
    return told(events, events[0].at if events else 0.0)


def test_two_repositories_jobs_never_share_an_instance_under_the_default_scope(org: World) -> None:
    # Given a job of repository app that ran, its instance back in the pool
    first = run_in(org, APP, "build")
    settled(org)

    # When a job of repository lib of the same organisation comes, then another of app
    other = run_in(org, LIB, "build")
    again = run_in(org, APP, "test")

    # Then lib's job ran on an instance of its own, and app's second job reused app's instance
    assert instance_of(org, other) != instance_of(org, first), whole_story(org)
    assert instance_of(org, again) == instance_of(org, first), whole_story(org)
    assert len(launched(org)) == 2, whole_story(org)
    # And every runner was registered at its job's repository, or in a runner group of that repository
    # alone, and GitHub gave each to its repository's job only
    calls, state = org.github.state.calls, org.github.state
    if state.groups_of(OWNER):
        assert (calls[REPOSITORY_JIT], calls[ORGANISATION_JIT]) == (0, 3), whole_story(org)
        selects = {g.name: g.selected_repository_ids for g in state.groups_of(OWNER)}
        assert sorted(selects.values(), key=sorted) == sorted(
            [{state.repository_id(APP)}, {state.repository_id(LIB)}], key=sorted
        )
    else:
        assert (calls[REPOSITORY_JIT], calls[ORGANISATION_JIT]) == (3, 0), whole_story(org)
    settled(org)
    assert {r.repository for r in org.records.live()} == {APP, LIB}
    accounted(org)


def test_a_public_repositorys_job_never_gets_a_reused_instance_and_its_own_is_not_pooled(
    org_any_scope: World,
) -> None:
    system = org_any_scope
    # Given a private repository's instance in the pool, which reuse.scope `any` would offer anyone
    system.github.state.public_repositories.add(SITE)
    private = instance_of(system, run_in(system, APP, "build"))
    settled(system)

    # When a public repository's job comes
    public_run = run_in(system, SITE, "docs")

    # Then it ran on a newly launched instance, not the pooled one
    public = instance_of(system, public_run)
    assert public != private
    assert job_of(system, public_run).conclusion is Conclusion.SUCCESS
    # And its instance was terminated after the job, never pooled, while the private one waits in the pool
    awaited(
        system,
        lambda: system.timeline.first(Happening.TERMINATED, instance_id=public),
        "the public instance's end",
    )
    settled(system)
    accounted(system)
    live = system.records.live()
    # (a record of the public instance still live here was seen once in about ten runs, 2026-11-27, and
    # not reproduced in eight more: the message carries what the next one needs)
    assert [r.instance_id for r in live] == [private], story(system, live, public)


def story(system: World, live: list[InstanceRecord], instance_id: str) -> str:
    """The live records and one instance's timeline, for a failure to say what happened."""
    events = system.events()
    mine = [e for e in events if e.instance_id == instance_id]
    return f"live: {live!r}\n{instance_id}:\n{told(mine, events[0].at if events else 0.0)}"


def test_a_foreign_job_on_our_runner_gets_the_instance_quarantined(org: World) -> None:
    # Given run 1's job ran, its instance pooled; and a job of run 2 (same repository) that copied run 1's
    # label (run ids are not secret), refused by our webhook and left queued on GitHub
    run = run_in(org, APP, "build")
    ours = instance_of(org, run)
    settled(org)
    copied = f"pool={run.run_id}/class=large"
    foreign_run = org.github.actions.start_run(APP, "sneaky", [JobSpec("sneaky", copied, seconds=30)])

    # When run 1 is re-run, its runner registered on the pooled instance, and GitHub hands that runner
    # the older queued job: the foreign one
    org.github.actions.rerun_all_jobs(run.run_id)
    foreign_job = job_of(org, foreign_run)
    awaited(org, lambda: foreign_job.runner_name is not None, "GitHub to hand the foreign job a runner")
    assert instance_of_runner(foreign_job.runner_name) == ours

    # Then the instance is quarantined: terminated, never pooled again
    awaited(
        org,
        lambda: org.timeline.first(Happening.TERMINATED, instance_id=ours),
        "the quarantined instance's end",
    )

    # (EC2 says terminated a moment before refresh marks the record: wait for the record too)
    def marked_terminated() -> bool:
        record = org.records.get(ours)
        return record is not None and record.state is InstanceState.TERMINATED

    awaited(org, marked_terminated, "the quarantined instance's record to be marked terminated")
    # And once both runs are over (the robbed re-run cancelled), nothing is left but what is pooled
    for over in (run, foreign_run):
        org.github.actions.cancel_run(over.run_id)
    settled(org)
    assert ours not in {r.instance_id for r in org.records.live()}
    accounted(org)
