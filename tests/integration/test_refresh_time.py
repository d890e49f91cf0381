"""Refresh within its time: a job begins only with enough of the Lambda's time left, the rest continue on
the next run, and every job gets its turn within a few runs, however large the organisation. Time is the
fake GitHub's: each request to it takes a quarter of a second.

The organisation registers at each repository: its runners are then listed one repository at a time,
the most requests a refresh run makes (in runner groups they are listed once, at the organisation)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.fake_github import JobSpec
from emulator.harness.control_plane import LocalControlPlane, local_control_plane, stack_config
from emulator.harness.github_app import OWNER
from runner_pool.domain.refresh import RefreshReport
from tests.integration.conftest import app_github
from tests.integration.test_refresh_reconcile import StartedExecutions, recording_refresh

REPOSITORIES = 300
"""Repositories with recent demand: listing each one's runners takes longer than one run has."""
SECONDS_PER_REQUEST = 0.25
LAMBDA_SECONDS = 50.0
"""Refresh's time in one run (its Lambda's timeout, below the one-minute schedule)."""
JOBS = 15
"""Refresh's jobs (steps/refresh.py), the instant tier's and the daily budget's among them."""


@pytest.fixture
def organisation() -> Iterator[LocalControlPlane]:
    github = app_github(scope=OWNER, registration="repository")
    with local_control_plane(stack_config(github=github)) as plane:
        yield plane


def busy_organisation(local: LocalControlPlane) -> None:
    """Hundreds of repositories, each with a run of one job queued for our label, noted as recent demand."""
    for number in range(REPOSITORIES):
        repository = f"{OWNER}/repo-{number:03}"
        run = local.github.actions.start_run(repository, "ci", [JobSpec("test", "pool=${{ github.run_id }}")])
        local.plane.recent_demand.note(repository, run.run_id, 1, f"pool={run.run_id}", busy_for=0)


def github_requests(local: LocalControlPlane) -> int:
    return sum(local.github.state.calls.values())


def refresh(local: LocalControlPlane, started: StartedExecutions, tick: int) -> RefreshReport:
    """One run whose time passes with each request it makes to GitHub."""
    plane = local.plane
    before = github_requests(local)

    def time_left() -> float:
        return LAMBDA_SECONDS - (github_requests(local) - before) * SECONDS_PER_REQUEST

    return recording_refresh(plane, started).run(tick, time_left=time_left)


def test_in_a_large_organisation_every_job_gets_its_turn_within_a_few_runs(
    organisation: LocalControlPlane,
) -> None:
    local = organisation
    # Given an organisation with hundreds of repositories with recent demand
    busy_organisation(local)
    started = StartedExecutions()
    # When refresh runs, a minute apart, until every job has run and every repository's runners are listed
    reports = []
    listed = 0
    for tick in range(1, 6):
        before = local.github.state.calls["GET /repos/{owner}/{repo}/actions/runners"]
        reports.append(refresh(local, started, tick))
        listed += local.github.state.calls["GET /repos/{owner}/{repo}/actions/runners"] - before
        local.clock.advance(60)
        if len({job for report in reports for job in report.ran}) == JOBS and listed >= REPOSITORIES:
            break
    # Then no run finished all its jobs in its time: some were deferred or cut short, none failed
    assert all(report.deferred or report.cut_short for report in reports)
    assert not any(report.failed for report in reports)
    # And within a few runs every job ran and every repository's runners were listed
    assert len({job for report in reports for job in report.ran}) == JOBS
    assert listed >= REPOSITORIES
    assert len(reports) <= 3


def test_a_job_deferred_for_lack_of_time_is_the_first_the_next_run_begins_with(
    organisation: LocalControlPlane,
) -> None:
    local = organisation
    busy_organisation(local)
    # Given a run that ran short of time and deferred some jobs
    first = refresh(local, StartedExecutions(), tick=1)
    assert first.deferred
    # When the next run begins
    second = refresh(local, StartedExecutions(), tick=2)
    # Then its first job is the first the last one deferred
    assert second.ran[0] == first.deferred[0]
