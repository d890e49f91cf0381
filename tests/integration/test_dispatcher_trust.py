"""A job's level of trust as demand decides it, on the real ledger on moto: the first level decided for a
run attempt stands, a pool label with an environment makes its later provisions privileged, and a run
whose level is not known is asked of GitHub once, or served single use (None) when GitHub does not answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from emulator.harness.webhooks import IDEMPOTENCY_TABLE, IngressWorld
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.domain.demand import (
    DemandMessage,
    JobQueued,
    RunCompleted,
    RunFromFork,
    RunMark,
    RunRequested,
    privileged_label,
)
from runner_pool.domain.executions import FollowUpRequest, ProvisionRequest, ReleaseRequest
from runner_pool.domain.follow_up import FollowUp
from runner_pool.domain.registration_budget import HourlyQuota
from runner_pool.domain.runners import GitHubRateLimitedError
from runner_pool.domain.trust import RunFacts, TrustLevel
from runner_pool.observability import logger
from runner_pool.steps.demand_starts import DemandStarts, DispatchReport, Group
from runner_pool.steps.dispatcher import Dispatcher
from runner_pool.steps.run_trust import RunTrust
from tests.support.builders import demand_starts, pause_on

REPOSITORY = "octo-org/octo-repo"
RUN_ID = 4242
LABEL = f"pool={RUN_ID}/class=large"
GPU_KEY = f"{LABEL} gpu"
"""Another run key of the same pool label: a job of LABEL may take its runners, and the other way round
when the job also asks for `gpu`."""


@pytest.fixture
def ledger(ingress: IngressWorld) -> DynamoDbLedger:
    return DynamoDbLedger(IDEMPOTENCY_TABLE, ingress.clock, ingress.dynamodb)


@dataclass
class Starts:
    provisions: list[ProvisionRequest] = field(default_factory=list)

    def provision(self, request: ProvisionRequest) -> bool:
        self.provisions.append(request)
        return True

    def release(self, request: ReleaseRequest) -> bool:
        return True

    def follow_up(self, request: FollowUpRequest) -> bool:
        raise RuntimeError("no follow-up in these tests")


@dataclass
class FakeRunReader:
    """GitHub's answer about a run attempt (GET .../actions/runs/{run_id}/attempts/{attempt_number}), or
    `failure` raised instead."""

    event: str = "push"
    failure: Exception | None = None
    asked: list[tuple[str, int, int]] = field(default_factory=list)

    def run_attempt(self, repository: str, run_id: int, attempt: int) -> RunFacts:
        self.asked.append((repository, run_id, attempt))
        if self.failure is not None:
            raise self.failure
        return RunFacts(repository, self.event, "octocat", "octocat", repository)


def requested(event: str = "push", *, head: str = REPOSITORY, attempt: int = 1) -> RunRequested:
    return RunRequested(
        repository=REPOSITORY,
        run_id=RUN_ID,
        run_attempt=attempt,
        event=event,
        actor="octocat",
        triggering_actor="octocat",
        head_repository=head,
    )


def queued(job_id: int, run_key: str = LABEL, *, privileged: bool = False, attempt: int = 1) -> JobQueued:
    return JobQueued(
        repository=REPOSITORY,
        run_key=run_key,
        run_id=RUN_ID,
        run_attempt=attempt,
        job_id=job_id,
        privileged=privileged,
        repository_id=7,
    )


def dispatcher(
    ingress: IngressWorld,
    ledger: DynamoDbLedger,
    starts: Starts,
    github: FakeRunReader | None = None,
    hourly: HourlyQuota | None = None,
) -> Dispatcher:
    trust = RunTrust(
        ledger,
        ingress.clock,
        reader=None if github is None else (lambda: github),
        hourly=lambda: hourly,
    )
    return Dispatcher(DemandStarts(ledger, starts, ingress.clock, pause_on(ingress.clock), trust))


def dispatch(dispatcher: Dispatcher, *messages: DemandMessage) -> DispatchReport:
    report = dispatcher.dispatch([(f"m-{n}", m) for n, m in enumerate(messages)], "dispatch", 60.0)
    assert report.failures == []
    return report


# --- the ledger: first level wins ---------------------------------------------------------------------


def test_the_first_level_decided_for_a_run_attempt_stands(ledger: DynamoDbLedger) -> None:
    # Given a run attempt decided trusted
    assert ledger.decide_trust(RUN_ID, 1, TrustLevel.TRUSTED, from_fork=False) is TrustLevel.TRUSTED
    # When a later delivery decides it untrusted
    standing = ledger.decide_trust(RUN_ID, 1, TrustLevel.UNTRUSTED, from_fork=True)
    # Then nothing changed: the first level (and its head) stands, and is what its demand finds
    assert standing is TrustLevel.TRUSTED
    run = ledger.remember_run_key(RUN_ID, LABEL, 1)
    assert (run.mark, run.trust, run.from_fork) == (RunMark.OPEN, TrustLevel.TRUSTED, False)


def test_a_level_is_kept_per_run_attempt(ledger: DynamoDbLedger) -> None:
    # Given attempt 1 decided untrusted
    ledger.decide_trust(RUN_ID, 1, TrustLevel.UNTRUSTED, from_fork=False)
    # When attempt 2 (a re-run by someone else) is decided trusted / Then it is, on its own
    assert ledger.decide_trust(RUN_ID, 2, TrustLevel.TRUSTED, from_fork=False) is TrustLevel.TRUSTED
    assert ledger.remember_run_key(RUN_ID, f"{LABEL}@2", 2).trust is TrustLevel.TRUSTED


def test_a_level_decided_after_the_run_completed_is_kept_and_its_demand_still_refused(
    ledger: DynamoDbLedger,
) -> None:
    # Given a run attempt whose completion came first (a redelivery after an outage)
    ledger.complete_run(RUN_ID, 1)
    # When its requested delivery comes / Then the level is written, and its demand is still stale
    assert ledger.decide_trust(RUN_ID, 1, TrustLevel.TRUSTED, from_fork=False) is TrustLevel.TRUSTED
    assert ledger.remember_run_key(RUN_ID, LABEL, 1).mark is RunMark.COMPLETED


def test_a_fork_mark_of_an_earlier_release_reads_as_untrusted_and_is_not_overwritten(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given a run attempt item an earlier release marked from_fork, with no level
    ingress.dynamodb.update_item(
        TableName=IDEMPOTENCY_TABLE,
        Key={"id": {"S": f"run#{RUN_ID}/attempt#1"}},
        UpdateExpression="SET from_fork = :yes",
        ExpressionAttributeValues={":yes": {"BOOL": True}},
    )
    # When a level is decided for it / Then the fork's untrusted stands
    assert ledger.decide_trust(RUN_ID, 1, TrustLevel.TRUSTED, from_fork=False) is TrustLevel.UNTRUSTED
    run = ledger.remember_run_key(RUN_ID, LABEL, 1)
    assert (run.trust, run.from_fork) == (TrustLevel.UNTRUSTED, True)


def test_a_disagreeing_delivery_is_logged_with_both_levels(
    ingress: IngressWorld, ledger: DynamoDbLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run requested by a push (trusted)
    warnings: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(logger, "warning", lambda message, **keys: warnings.append((message, keys)))
    trust = RunTrust(ledger, ingress.clock)
    trust.requested(requested("push"))
    # When a later delivery of the same attempt says pull_request, and another agrees with the first
    standing = trust.requested(requested("pull_request"))
    trust.requested(requested("schedule"))
    # Then the first level stands and one warning names both
    assert standing is TrustLevel.TRUSTED
    assert [keys for _, keys in warnings] == [
        {"run_id": RUN_ID, "attempt": 1, "decided": "trusted", "delivered": "untrusted"}
    ]


def test_privileged_labels_are_remembered_per_pool_label(ledger: DynamoDbLedger) -> None:
    # Given a job with an environment asking for LABEL and the gpu label
    ledger.remember_run_key(RUN_ID, GPU_KEY, 1, privileged=True)
    # When another run key of the same pool label is remembered without an environment
    run = ledger.remember_run_key(RUN_ID, LABEL, 1)
    # Then its pool label is marked privileged in that run attempt
    assert run.privileged_labels == {privileged_label(GPU_KEY)} == {LABEL}


# --- the dispatcher ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "level", "public"),
    [
        (("push", REPOSITORY), TrustLevel.TRUSTED, False),
        (("pull_request", REPOSITORY), TrustLevel.UNTRUSTED, False),
        (("push", "someone/octo-repo"), TrustLevel.UNTRUSTED, True),
    ],
    ids=["push", "pull-request", "fork"],
)
def test_a_requested_runs_jobs_are_provisioned_at_its_level(
    ingress: IngressWorld, ledger: DynamoDbLedger, run: tuple[str, str], level: TrustLevel, public: bool
) -> None:
    event, head = run
    # Given a run requested by `event` from `head`, and GitHub never asked
    starts, github = Starts(), FakeRunReader()
    the_dispatcher = dispatcher(ingress, ledger, starts, github)
    # When its requested delivery and then its jobs are dispatched
    dispatch(the_dispatcher, requested(event, head=head))
    dispatch(the_dispatcher, queued(1), queued(2))
    # Then the provision carries the run's level (a fork's single use, as before, through `public`)
    (provision,) = starts.provisions
    assert (provision.trust, provision.public) == (level, public)
    assert github.asked == []


def test_a_requested_run_in_the_same_batch_as_its_demand_is_decided_first(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given a run's job and its requested delivery in one batch, the demand first
    starts = Starts()
    # When dispatched
    dispatch(dispatcher(ingress, ledger, starts, FakeRunReader()), queued(3), requested("schedule"))
    # Then the level is there before the demand is provisioned
    assert [p.trust for p in starts.provisions] == [TrustLevel.TRUSTED]


def test_a_run_from_fork_message_makes_its_run_untrusted_and_single_use(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given the message an earlier release queued for a fork's run, still in the queue after an upgrade
    starts = Starts()
    fork = RunFromFork(repository=REPOSITORY, head_repository="someone/x", run_id=RUN_ID, run_attempt=1)
    # When it and the run's job are dispatched
    dispatch(dispatcher(ingress, ledger, starts, FakeRunReader()), fork, queued(4))
    # Then the job is untrusted and single use
    assert [(p.trust, p.public) for p in starts.provisions] == [(TrustLevel.UNTRUSTED, True)]


def test_a_run_whose_requested_delivery_never_came_is_asked_of_github_once(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given a run whose requested delivery was lost, and GitHub answering that it was a push
    starts, github = Starts(), FakeRunReader("push")
    the_dispatcher = dispatcher(ingress, ledger, starts, github)
    # When its jobs come in two dispatches, each with two run keys
    dispatch(the_dispatcher, queued(5), queued(6, GPU_KEY))
    dispatch(dispatcher(ingress, ledger, starts, github), queued(7), queued(8, GPU_KEY))
    # Then GitHub was asked once for the run attempt, and every provision is trusted
    assert github.asked == [(REPOSITORY, RUN_ID, 1)]
    assert {p.trust for p in starts.provisions} == {TrustLevel.TRUSTED}
    # And the answer is kept as the level decided: a late requested delivery that disagrees changes nothing
    assert ledger.decide_trust(RUN_ID, 1, TrustLevel.UNTRUSTED, from_fork=False) is TrustLevel.TRUSTED


@pytest.mark.parametrize(
    ("github", "hourly"),
    [
        (FakeRunReader(failure=GitHubRateLimitedError("403 rate limited", 403, 60.0)), None),
        (FakeRunReader(failure=RuntimeError("connection reset")), None),
        (FakeRunReader("push"), HourlyQuota(limit=5000, remaining=400, reset_at=10**10)),
        (None, None),
    ],
    ids=["rate-limited", "error", "hour-spent", "no-github"],
)
def test_a_run_whose_level_github_does_not_give_is_served_single_use(
    ingress: IngressWorld, ledger: DynamoDbLedger, github: FakeRunReader | None, hourly: HourlyQuota | None
) -> None:
    # Given a run whose requested delivery was lost, and GitHub not answering about it (or not asked: the
    # hour's remainder is under the floor kept for registrations)
    starts = Starts()
    # When its job is dispatched
    report = dispatch(dispatcher(ingress, ledger, starts, github, hourly), queued(9))
    # Then its provision starts, undecided: served single use (fail closed), and nothing failed
    assert [p.trust for p in starts.provisions] == [None]
    assert report.failures == []
    if github is not None and hourly is not None:
        assert github.asked == []
    # And nothing was kept: a later requested delivery still decides the run's level
    assert ledger.decide_trust(RUN_ID, 1, TrustLevel.TRUSTED, from_fork=False) is TrustLevel.TRUSTED


def test_a_job_with_an_environment_is_privileged_and_so_is_its_pool_labels_later_demand(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given a push's run whose job with an environment asks for LABEL and gpu
    starts = Starts()
    the_dispatcher = dispatcher(ingress, ledger, starts)
    dispatch(the_dispatcher, requested("push"), queued(10, GPU_KEY, privileged=True))
    # When later jobs of the same pool label come without an environment, of either run key
    ingress.clock.advance(120)  # another burst: each a first of its run key
    dispatch(the_dispatcher, queued(11), queued(12, GPU_KEY))
    # Then every provision of that pool label is privileged: any of them may serve the deploy job
    assert [(p.job_ids, p.trust) for p in starts.provisions] == [
        ((10,), TrustLevel.PRIVILEGED),
        ((11,), TrustLevel.PRIVILEGED),
        ((12,), TrustLevel.PRIVILEGED),
    ]


def test_a_privileged_pool_label_leaves_other_pool_labels_and_attempts_alone(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given a push's run (both attempts) whose job with an environment asks for LABEL in attempt 1
    starts = Starts()
    the_dispatcher = dispatcher(ingress, ledger, starts)
    dispatch(the_dispatcher, requested("push"), requested("push", attempt=2), queued(13, privileged=True))
    # When jobs of another pool label, and of attempt 2, come
    other = f"pool={RUN_ID}/class=xlarge"
    dispatch(the_dispatcher, queued(14, other), queued(15, f"{LABEL}@2", attempt=2))
    # Then those are served at the run's level
    assert [(p.job_ids, p.trust) for p in starts.provisions] == [
        ((13,), TrustLevel.PRIVILEGED),
        ((14,), TrustLevel.TRUSTED),
        ((15,), TrustLevel.TRUSTED),
    ]


def test_a_sealed_follow_up_is_privileged_when_its_pool_label_had_an_environment(
    ingress: IngressWorld, ledger: DynamoDbLedger
) -> None:
    # Given a push's run whose job with an environment was dispatched (its label marked)
    starts = Starts()
    dispatch(dispatcher(ingress, ledger, starts), requested("push"), queued(16, GPU_KEY, privileged=True))
    # When a follow-up of LABEL, gathered with none of its messages, is started
    group = Group(REPOSITORY, LABEL, known_attempts=((RUN_ID, 1),))
    the_starts = demand_starts(ledger, starts, ingress.clock, pause_on(ingress.clock))
    the_starts.start_sealed(DispatchReport(), group, FollowUp(frozenset({17, 18})), "holder", 10**10)
    # Then its provision is privileged
    assert [(p.job_ids, p.trust) for p in starts.provisions][-1] == ((17, 18), TrustLevel.PRIVILEGED)


def test_a_completed_runs_level_is_not_asked_of_github(ingress: IngressWorld, ledger: DynamoDbLedger) -> None:
    # Given a run that completed before its demand came
    starts, github = Starts(), FakeRunReader()
    the_dispatcher = dispatcher(ingress, ledger, starts, github)
    dispatch(the_dispatcher, RunCompleted(repository=REPOSITORY, run_id=RUN_ID, run_attempt=1))
    # When its late demand is dispatched / Then nothing starts and GitHub is not asked
    report = dispatch(the_dispatcher, queued(19))
    assert (starts.provisions, github.asked, report.stale) == ([], [], 1)
