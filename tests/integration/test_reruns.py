"""Re-running a run whose job an interruption failed (steps/reruns.py): the demand ledger on moto, the GitHub
App client against the fake GitHub; whichever of the job's failure and the run's completion comes second
asks, once per attempt, and the attempt it makes is served on-demand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from emulator.fake_github import FakeGitHub, FakeWorkflowRun, JobSpec
from emulator.fake_github.actions import QUEUE_EXPIRY_SECONDS
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from emulator.resources import create_idempotency_table
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.reruns import RERUN_LEASE_SECONDS, Claim, Verdict, label_set, served_on_demand
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runner_scope import RepositoryScope
from runner_pool.steps.reruns import Reruns

LEDGER = "runner-pool-ledger"
REPOSITORY = f"{OWNER}/{REPO}"
RERUN_ROUTE = "POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs"


@pytest.fixture
def github(fake: FakeGitHub, app_key: AppKey, clock: ManualClock) -> Iterator[GitHubApp]:
    identity = GitHubAppKey(APP_ID, app_key.private_pem, INSTALLATION_ID, base_url=fake.url, clock=clock)
    app = GitHubApp(identity, RepositoryScope(owner=OWNER, repo=REPO), base_url=fake.url, clock=clock)
    yield app
    app.close()


@pytest.fixture
def ledger(dynamodb: Any, clock: ManualClock) -> DynamoDbLedger:
    create_idempotency_table(dynamodb, LEDGER)
    return DynamoDbLedger(LEDGER, clock, dynamodb)


@pytest.fixture
def reruns(ledger: DynamoDbLedger, github: GitHubApp, clock: ManualClock) -> Reruns:
    return Reruns(ledger, lambda: github, clock, enabled=True)


def failed_run(fake: FakeGitHub, clock: ManualClock) -> FakeWorkflowRun:
    """A run whose one job failed (it waited in the queue until GitHub failed it): completed, failed."""
    run = fake.actions.start_run(
        REPOSITORY, "ci", [JobSpec("build", "pool=${{ github.run_id }}/class=large")]
    )
    fail_queued(fake, clock)
    return run


def fail_queued(fake: FakeGitHub, clock: ManualClock) -> None:
    clock.advance(QUEUE_EXPIRY_SECONDS + 1)
    fake.actions.expire_queued()


def run_key(run: FakeWorkflowRun, attempt: int) -> str:
    return str(RunKey(f"pool={run.run_id}/class=large", attempt))


def reruns_asked(fake: FakeGitHub) -> int:
    return fake.state.calls[RERUN_ROUTE]


def test_an_interruption_noted_before_the_run_completed_is_re_run_at_its_completion(
    fake: FakeGitHub, clock: ManualClock, ledger: DynamoDbLedger, reruns: Reruns
) -> None:
    # Given a job of attempt 1 that failed on an interrupted instance, noted before the run completed
    run = fake.actions.start_run(
        REPOSITORY, "ci", [JobSpec("build", "pool=${{ github.run_id }}/class=large")]
    )
    assert reruns.interrupted(REPOSITORY, run_key(run, 1)) is None
    fail_queued(fake, clock)

    # When the run's completion comes
    ledger.complete_run(run.run_id, 1)
    verdict = reruns.completed(REPOSITORY, run.run_id, 1)

    # Then its failed jobs are re-run once, as attempt 2
    assert verdict is Verdict.RERUN
    assert run.run_attempt == 2
    assert reruns_asked(fake) == 1


def test_an_interruption_noted_after_the_run_completed_is_re_run_at_once(
    fake: FakeGitHub, clock: ManualClock, ledger: DynamoDbLedger, reruns: Reruns
) -> None:
    # Given a failed run whose completion came first: nothing interrupted then
    run = failed_run(fake, clock)
    ledger.complete_run(run.run_id, 1)
    assert reruns.completed(REPOSITORY, run.run_id, 1) is None

    # When the release of its interrupted job notes it
    verdict = reruns.interrupted(REPOSITORY, run_key(run, 1))

    # Then the run is re-run there and then
    assert verdict is Verdict.RERUN
    assert run.run_attempt == 2


@pytest.fixture
def re_run(fake: FakeGitHub, clock: ManualClock, ledger: DynamoDbLedger, reruns: Reruns) -> FakeWorkflowRun:
    """A failed run, re-run once for its interrupted job (its completion came first)."""
    run = failed_run(fake, clock)
    ledger.complete_run(run.run_id, 1)
    assert reruns.interrupted(REPOSITORY, run_key(run, 1)) is Verdict.RERUN
    return run


def test_every_repeat_of_either_fact_re_runs_nothing_more(
    fake: FakeGitHub, re_run: FakeWorkflowRun, reruns: Reruns
) -> None:
    # Given a run re-run once for its interrupted job
    run = re_run

    # When the job's release is retried and the run's completion is delivered again
    again = [reruns.interrupted(REPOSITORY, run_key(run, 1)), reruns.completed(REPOSITORY, run.run_id, 1)]

    # Then nothing more is asked of GitHub: the run is under way again, as its attempt 2
    assert again == [Verdict.NOT_FAILED, Verdict.NOT_FAILED]
    assert reruns_asked(fake) == 1


def test_the_re_run_attempt_serves_the_interrupted_label_set_on_demand(
    re_run: FakeWorkflowRun, ledger: DynamoDbLedger
) -> None:
    # Given a run re-run for its interrupted job
    run = re_run

    # When attempt 2's demand is remembered, as the dispatcher does before it provisions
    attempt = ledger.remember_run_key(run.run_id, run_key(run, 2), 2)

    # Then its label set is served on-demand, and attempt 1's was not
    assert served_on_demand(run_key(run, 2), attempt.on_demand)
    assert attempt.on_demand == {label_set(run_key(run, 1))}
    assert not ledger.remember_run_key(run.run_id, run_key(run, 1), 1).on_demand


def test_the_re_runs_own_interruption_is_not_re_run_again(
    fake: FakeGitHub, clock: ManualClock, ledger: DynamoDbLedger, reruns: Reruns, re_run: FakeWorkflowRun
) -> None:
    # Given attempt 2, this stack's re-run of attempt 1's interrupted job
    run = re_run

    # When its job fails on an interrupted instance too, and attempt 2 completes failed
    reruns.interrupted(REPOSITORY, run_key(run, 2))
    fail_queued(fake, clock)
    ledger.complete_run(run.run_id, 2)

    # Then it is not re-run again
    assert reruns.completed(REPOSITORY, run.run_id, 2) is Verdict.OUR_RERUN
    assert run.run_attempt == 2
    assert reruns_asked(fake) == 1


def test_the_marker_is_held_by_one_caller_until_asked_or_lapsed(
    ledger: DynamoDbLedger, clock: ManualClock
) -> None:
    # Given one caller's claim of attempt 1's re-run
    until = clock.now() + RERUN_LEASE_SECONDS
    assert ledger.claim_rerun(7, 1, {"pool=7"}, "a", until) is Claim.CLAIMED

    # Then another caller finds it held, and its own retry finds it its own
    assert ledger.claim_rerun(7, 1, {"pool=7"}, "b", until) is Claim.HELD
    assert ledger.claim_rerun(7, 1, {"pool=7"}, "a", until) is Claim.CLAIMED

    # And once its lease passed without an answer, another caller takes it
    clock.advance(RERUN_LEASE_SECONDS + 1)
    assert ledger.claim_rerun(7, 1, {"pool=7"}, "b", clock.now() + RERUN_LEASE_SECONDS) is Claim.CLAIMED

    # And once asked, nobody claims it again, however long after
    ledger.rerun_asked(7, 1, "b")
    clock.advance(10 * RERUN_LEASE_SECONDS)
    assert ledger.claim_rerun(7, 1, {"pool=7"}, "c", clock.now() + RERUN_LEASE_SECONDS) is Claim.ASKED


def test_an_installation_that_may_not_re_run_leaves_the_run_failed(
    fake: FakeGitHub, clock: ManualClock, ledger: DynamoDbLedger, reruns: Reruns
) -> None:
    # Given an installation that accepted reading runs only (before the App asked to re-run them)
    fake.state.installations[INSTALLATION_ID].permissions["actions"] = "read"
    run = failed_run(fake, clock)
    ledger.complete_run(run.run_id, 1)

    # When its interrupted job's failure is noted
    verdict = reruns.interrupted(REPOSITORY, run_key(run, 1))

    # Then nothing is re-run, and nothing is marked asked: accepted later, a redelivery may ask
    assert verdict is None
    assert run.run_attempt == 1
    assert not ledger.rerun_record(run.run_id, 1).asked


def test_with_the_setting_off_nothing_is_noted_nor_asked(
    fake: FakeGitHub, clock: ManualClock, ledger: DynamoDbLedger, github: GitHubApp
) -> None:
    # Given re-runs turned off, and a failed run
    reruns = Reruns(ledger, lambda: github, clock, enabled=False)
    run = failed_run(fake, clock)
    ledger.complete_run(run.run_id, 1)

    # When its interrupted job's failure and its completion come / Then nothing is noted or re-run
    assert reruns.interrupted(REPOSITORY, run_key(run, 1)) is None
    assert reruns.completed(REPOSITORY, run.run_id, 1) is None
    assert not ledger.rerun_record(run.run_id, 1).interrupted
    assert reruns_asked(fake) == 0
