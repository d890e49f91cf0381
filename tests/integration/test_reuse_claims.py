"""The state table's reuse conditions (issue 14, item 2): which repository an instance serves, how often
and how long; and the quarantine of a hand-off whose runner ran a foreign job (item 1).

Pickup chooses from a read that may be a moment old, so each rule is also a condition of the claim's
own write: these tests write the claim against a record that no longer fits it.
"""

from __future__ import annotations

from typing import Any

import pytest

from emulator.harness.control_plane import NO_WAIT
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import ReuseSettings, StackConfig
from runner_pool.domain.lifecycle import InstanceState, Outcome
from runner_pool.domain.pickup import ClaimTerms
from runner_pool.domain.records import InstanceRecord, TransitionResult
from runner_pool.domain.trust import TrustLevel
from tests.conftest import TABLE_NAME
from tests.support import builders

RUN = builders.run_key(1, "/class=large")
NEXT_RUN = builders.run_key(2, "/class=large")
APP = "octo/app"
OTHER = "octo/other"
STRANGER = "someone/app"
ONE_ID = builders.facts(1).instance_id
TRUSTED = TrustLevel.TRUSTED


def served(table: StateTable, repository: str | None, *, jobs: int = 1) -> InstanceRecord:
    """One instance, idle after serving `jobs` jobs of `repository` (None: launched for the pool)."""
    if repository is None:
        assert table.create(builders.facts(1), None).succeeded
        return _ok(table.admit(ONE_ID))
    assert table.create(builders.facts(1), RUN, repository=repository, trust=TRUSTED).succeeded
    assert table.activate(ONE_ID, RUN, 60).succeeded
    record = _ok(table.release(ONE_ID, RUN))
    for job in range(1, jobs):
        token = f"again-{job}"
        assert table.claim(ONE_ID, RUN, token, ClaimTerms(repository=repository, trust=TRUSTED)).succeeded
        assert table.activate(ONE_ID, RUN, 60, claim_token=token).succeeded
        record = _ok(table.release(ONE_ID, RUN))
    return record


def _ok(result: TransitionResult) -> InstanceRecord:
    assert result.outcome is Outcome.APPLIED, result
    assert result.record is not None
    return result.record


def reuse(**settings: object) -> ReuseSettings:
    return StackConfig.model_validate({"reuse": settings}).reuse


def test_an_instance_created_for_a_run_names_its_repository_and_its_first_job(
    state_table: StateTable,
) -> None:
    # Given an instance launched for a public repository's run
    result = state_table.create(builders.facts(1), RUN, repository=APP, single_use=True)
    # Then its record names the repository, counts one job and is single use
    assert result.record is not None
    assert (result.record.repository, result.record.jobs_served, result.record.single_use) == (APP, 1, True)
    assert state_table.get(ONE_ID) == result.record


def test_a_claim_names_the_repository_and_counts_the_job(state_table: StateTable) -> None:
    # Given an instance that served one job of APP
    served(state_table, APP)
    # When a job of APP claims it
    result = state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(), trust=TRUSTED)
    )
    # Then it is held for that run, names APP, and has served two jobs
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert (result.record.repository, result.record.jobs_served) == (APP, 2)


@pytest.mark.parametrize(
    ("scope", "served_by", "asker", "outcome"),
    [
        ("repository", None, OTHER, Outcome.APPLIED),
        ("repository", APP, APP, Outcome.APPLIED),
        ("repository", APP, OTHER, Outcome.LOST),
        ("owner", APP, OTHER, Outcome.APPLIED),
        ("owner", APP, STRANGER, Outcome.LOST),
        ("any", APP, STRANGER, Outcome.APPLIED),
    ],
)
def test_a_claim_outside_the_reuse_scope_loses_whatever_pickup_saw(
    state_table: StateTable, scope: str, served_by: str | None, asker: str, outcome: Outcome
) -> None:
    # Given an idle instance that served `served_by` (pickup may have read it before that)
    before = served(state_table, served_by)
    # When a job of `asker` claims it under reuse.scope `scope`
    result = state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=asker, reuse=reuse(scope=scope), trust=TRUSTED)
    )
    # Then the write itself decides: in scope it applies, out of scope it loses and changes nothing
    assert result.outcome is outcome
    if outcome is Outcome.LOST:
        assert state_table.get(ONE_ID) == before


APP_ID_NOW, APP_ID_BEFORE = 186853010, 186853001


@pytest.mark.parametrize(
    ("served_id", "asker_id", "outcome"),
    [
        (APP_ID_NOW, APP_ID_NOW, Outcome.APPLIED),
        (APP_ID_BEFORE, APP_ID_NOW, Outcome.LOST),
        (None, APP_ID_NOW, Outcome.APPLIED),
    ],
)
def test_a_claim_under_the_repository_scope_compares_repository_ids_not_names(
    state_table: StateTable, served_id: int | None, asker_id: int, outcome: Outcome
) -> None:
    # Given an idle instance that served a job of a repository named APP whose id was `served_id` (None:
    # recorded before ids were kept), e.g. one deleted since, whose name a new repository took
    assert state_table.create(
        builders.facts(1), RUN, repository=APP, repository_id=served_id, trust=TRUSTED
    ).succeeded
    assert state_table.activate(ONE_ID, RUN, 60).succeeded
    before = _ok(state_table.release(ONE_ID, RUN))

    # When a job of the repository named APP with id `asker_id` claims it
    result = state_table.claim(
        ONE_ID,
        NEXT_RUN,
        "t",
        ClaimTerms(repository=APP, repository_id=asker_id, reuse=reuse(), trust=TRUSTED),
    )

    # Then the same id takes it (a record without one, by name), another id with the same name does not
    assert result.outcome is outcome
    if outcome is Outcome.LOST:
        assert state_table.get(ONE_ID) == before
    else:
        assert result.record is not None
        assert result.record.repository_id == asker_id


def test_a_claim_of_an_instance_that_served_its_maximum_of_jobs_loses(state_table: StateTable) -> None:
    # Given an instance that has served reuse.max_jobs (2) jobs of APP
    before = served(state_table, APP, jobs=2)
    # When a third job of APP claims it / Then the claim loses
    result = state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(max_jobs=2), trust=TRUSTED)
    )
    assert result.outcome is Outcome.LOST
    assert state_table.get(ONE_ID) == before


def test_a_claim_of_an_instance_past_its_maximum_age_loses(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given an idle instance launched reuse.max_age_minutes (1) ago, its idle time still running
    served(state_table, APP)
    clock.advance(60)
    # When a job of APP claims it / Then the claim loses
    result = state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(max_age_minutes=1), trust=TRUSTED)
    )
    assert result.outcome is Outcome.LOST


def running_with_runner(table: StateTable, runner_id: int) -> InstanceRecord:
    assert table.create(builders.facts(1), RUN, repository=APP, trust=TRUSTED).succeeded
    assert table.record_runner(ONE_ID, RUN, runner_id).succeeded
    return _ok(table.activate(ONE_ID, RUN, 60))


@pytest.mark.parametrize("released_first", [False, True], ids=["running", "released-first"])
def test_quarantine_expires_the_hand_off_whose_runner_ran_a_foreign_job(
    state_table: StateTable, clock: ManualClock, released_first: bool
) -> None:
    # Given an instance handed runner 7, still running or already released by its own run
    running_with_runner(state_table, 7)
    if released_first:
        assert state_table.release(ONE_ID, RUN).succeeded
    # When runner 7's hand-off is quarantined
    result = state_table.quarantine(ONE_ID, 7)
    # Then the record is expired (for refresh to terminate), in whatever state it was
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert result.record.threshold_passed(clock.now())
    # And a retry is recognised as its own
    clock.advance(1)
    assert state_table.quarantine(ONE_ID, 7).outcome is Outcome.REPLAYED


def test_quarantine_of_an_earlier_hand_off_leaves_a_later_one_alone(state_table: StateTable) -> None:
    # Given an instance released after runner 7's job and claimed again, its new runner 8 noted
    running_with_runner(state_table, 7)
    assert state_table.release(ONE_ID, RUN).succeeded
    assert state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(), trust=TRUSTED)
    ).succeeded
    assert state_table.record_runner(ONE_ID, NEXT_RUN, 8).succeeded
    before = state_table.get(ONE_ID)
    # When a late quarantine of runner 7 arrives / Then it loses and the new hand-off is untouched
    assert state_table.quarantine(ONE_ID, 7).outcome is Outcome.LOST
    assert state_table.get(ONE_ID) == before
    assert before is not None
    assert before.state is InstanceState.CLAIMED


def lagging(config: StackConfig, dynamodb: Any, clock: ManualClock, seconds: float) -> StateTable:
    """The state table as a writer whose clock is `seconds` behind `clock` sees it (another Lambda's)."""
    return StateTable(TABLE_NAME, config.timeouts, ManualClock(clock.now() - seconds), dynamodb, NO_WAIT)


@pytest.mark.parametrize("released_first", [False, True], ids=["running", "released-first"])
def test_no_claim_or_hand_off_clears_a_quarantine(
    state_table: StateTable, dynamodb: Any, clock: ManualClock, config: StackConfig, released_first: bool
) -> None:
    # Given runner 7's instance quarantined (idle: its run's release came first; or still running)
    running_with_runner(state_table, 7)
    if released_first:
        assert state_table.release(ONE_ID, RUN).succeeded
    assert state_table.quarantine(ONE_ID, 7).succeeded
    quarantined = state_table.get(ONE_ID)
    assert quarantined is not None
    assert quarantined.quarantined_at is not None
    # And writers whose clocks are 2 s behind the quarantine's, to whom its threshold is still ahead
    behind = lagging(config, dynamodb, clock, 2)

    # When one claims it, activates it, notes a runner or gives it back
    attempts = [
        behind.claim(ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(), trust=TRUSTED)),
        behind.release(ONE_ID, RUN),
        behind.release_served(ONE_ID, RUN, 7),
        behind.record_runner(ONE_ID, RUN, 8),
        behind.activate(ONE_ID, RUN, 60),
    ]

    # Then every write loses, and the record stays quarantined and expired, for refresh to terminate
    assert [attempt.outcome for attempt in attempts] == [Outcome.LOST] * len(attempts)
    assert state_table.get(ONE_ID) == quarantined


# --- the level of trust (domain/trust.py) ------------------------------------------------------------


def served_at(table: StateTable, level: TrustLevel | None) -> InstanceRecord:
    """One instance, idle after serving one job of APP at `level`."""
    assert table.create(builders.facts(1), RUN, repository=APP, trust=level).succeeded
    assert table.activate(ONE_ID, RUN, 60).succeeded
    return _ok(table.release(ONE_ID, RUN))


@pytest.mark.parametrize(
    ("served_level", "level", "single_use", "outcome"),
    [
        (TrustLevel.TRUSTED, TrustLevel.TRUSTED, False, Outcome.APPLIED),
        (TrustLevel.UNTRUSTED, TrustLevel.UNTRUSTED, False, Outcome.APPLIED),
        (TrustLevel.UNTRUSTED, TrustLevel.TRUSTED, False, Outcome.LOST),
        (TrustLevel.TRUSTED, TrustLevel.UNTRUSTED, False, Outcome.LOST),
        (TrustLevel.TRUSTED, TrustLevel.PRIVILEGED, False, Outcome.LOST),
        (TrustLevel.PRIVILEGED, TrustLevel.PRIVILEGED, False, Outcome.LOST),
        (TrustLevel.TRUSTED, None, False, Outcome.LOST),
        (None, None, False, Outcome.LOST),
        (TrustLevel.TRUSTED, TrustLevel.TRUSTED, True, Outcome.LOST),
    ],
    ids=[
        "trusted-after-trusted",
        "untrusted-after-untrusted",
        "trusted-after-untrusted",
        "untrusted-after-trusted",
        "privileged-after-trusted",
        "privileged-after-privileged",
        "undecided-after-trusted",
        "undecided-after-undecided",
        "single-use-after-trusted",
    ],
)
def test_a_claim_of_a_used_instance_across_levels_loses_whatever_the_message_said(
    state_table: StateTable,
    served_level: TrustLevel | None,
    level: TrustLevel | None,
    single_use: bool,
    outcome: Outcome,
) -> None:
    # Given an idle instance of APP that served a job of `served_level` (a stale or forged message may
    # have offered it as anything)
    before = served_at(state_table, served_level)
    # When a job of APP at `level` claims it (single use, or not)
    result = state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(), trust=level, single_use=single_use)
    )
    # Then only a job that reuses, of the very level it served, takes it; any other claim changes nothing
    assert result.outcome is outcome
    if outcome is Outcome.LOST:
        assert state_table.get(ONE_ID) == before
    else:
        assert result.record is not None
        assert result.record.trust is level


@pytest.mark.parametrize("level", [None, *TrustLevel], ids=str)
@pytest.mark.parametrize("single_use", [False, True], ids=["reuses", "single-use"])
def test_a_pristine_instance_is_claimed_by_any_job_and_then_names_its_level(
    state_table: StateTable, level: TrustLevel | None, single_use: bool
) -> None:
    # Given an instance launched for the pool and admitted: pristine
    assert served(state_table, None).pristine
    # When any job claims it
    result = state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(), trust=level, single_use=single_use)
    )
    # Then it applies, and the record names the job's level and is no longer pristine
    record = _ok(result)
    assert (record.trust, record.pristine, record.single_use) == (level, False, single_use)


def test_a_claim_given_back_leaves_the_instance_used(state_table: StateTable) -> None:
    # Given a pristine instance claimed by a trusted job, then given back (its hand-over deferred)
    served(state_table, None)
    assert state_table.claim(
        ONE_ID, NEXT_RUN, "t", ClaimTerms(repository=APP, reuse=reuse(), trust=TRUSTED)
    ).succeeded
    returned = _ok(state_table.unclaim(ONE_ID, NEXT_RUN, "t"))
    # Then it is not pristine again: a runner handed its config may have run a job (fail closed)
    assert (returned.jobs_served, returned.pristine, returned.trust) == (1, False, TRUSTED)
    # And a single-use job can no longer claim it
    single = state_table.claim(
        ONE_ID, RUN, "u", ClaimTerms(repository=APP, reuse=reuse(), trust=TRUSTED, single_use=True)
    )
    assert single.outcome is Outcome.LOST
