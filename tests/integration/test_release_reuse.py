"""Release under the reuse rules (issue 14): an instance that must not serve again is retired instead of
pooled, and one whose runner ran a foreign job is quarantined, on moto's table and a fake GitHub."""

from __future__ import annotations

import pytest

from emulator.harness.control_plane import LocalControlPlane
from emulator.harness.github_app import OWNER, REPO
from runner_pool.domain.config import ReuseSettings
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord, Signal
from runner_pool.domain.release import ReleaseItem, ReleaseProgress, ReleaseStatus
from runner_pool.domain.trust import TrustLevel

RUN = "pool=101"
FOREIGN_RUN = "pool=101 gpu"
REPOSITORY = f"{OWNER}/{REPO}"


def running(
    local: LocalControlPlane, *, single_use: bool = False, trust: TrustLevel | None = TrustLevel.TRUSTED
) -> InstanceRecord:
    """An instance created for a (by default trusted) job of REPOSITORY, its runner registered there,
    running the job."""
    request = LaunchRequest.for_run(local.config.spec_for(RUN), 1, "reuse-test")
    (facts,) = local.plane.fleet.launch(request).launched
    created = local.table.create(facts, RUN, repository=REPOSITORY, single_use=single_use, trust=trust)
    assert created.succeeded
    local.register_runner(facts.instance_id, RUN)
    local.table.write_signal(facts.instance_id, Signal.UD_REG_OK, RUN)
    activated = local.table.activate(facts.instance_id, RUN, 60)
    assert activated.record is not None
    return activated.record


def give_back(
    local: LocalControlPlane, record: InstanceRecord, reuse: ReuseSettings | None = None, **item: object
) -> ReleaseProgress:
    fields: dict[str, object] = {
        "instance_id": record.instance_id,
        "run_key": RUN,
        "poll_seconds": 5,
        "runner_id": record.runner_id,
        "repository": REPOSITORY,
    }
    return local.release(reuse or local.config.reuse).give_back(ReleaseItem.model_validate(fields | item))


def never_pooled(local: LocalControlPlane, record: InstanceRecord) -> None:
    current = local.record(record.instance_id)
    assert current.threshold_passed(local.clock.now())
    assert not [m for m in local.drain_pool() if m.instance_id == record.instance_id]


def test_a_single_use_instance_is_retired_after_its_job(local: LocalControlPlane) -> None:
    # Given an instance running a public repository's job (single use)
    record = running(local, single_use=True)
    # When its job's completion is given back
    progress = give_back(local, record)
    # Then it is retired: expired for refresh to terminate, never pooled
    assert progress.status is ReleaseStatus.RETIRED
    assert "single use" in (progress.reason or "")
    never_pooled(local, record)


@pytest.mark.parametrize("trust", [TrustLevel.PRIVILEGED, None], ids=["privileged", "undecided"])
def test_an_instance_that_served_a_level_no_job_may_follow_is_retired(
    local: LocalControlPlane, trust: TrustLevel | None
) -> None:
    # Given an instance running a job whose level never reuses, its record (say, from an older release)
    # not marked single use
    record = running(local, trust=trust)
    # When the job is given back / Then the instance is retired, never pooled
    progress = give_back(local, record)
    assert progress.status is ReleaseStatus.RETIRED
    assert "no later job may follow" in (progress.reason or "")
    never_pooled(local, record)


def test_an_instance_that_served_its_maximum_of_jobs_is_retired(local: LocalControlPlane) -> None:
    # Given an instance running its first job, and reuse.max_jobs 1
    record = running(local)
    limits = ReuseSettings(max_jobs=1)
    # When the job is given back / Then the instance is retired, naming the limit
    progress = give_back(local, record, limits)
    assert progress.status is ReleaseStatus.RETIRED
    assert "reuse.max_jobs" in (progress.reason or "")
    never_pooled(local, record)


def test_an_instance_past_its_maximum_age_is_retired(local: LocalControlPlane) -> None:
    # Given an instance launched reuse.max_age_minutes (1) ago, still running its job
    record = running(local)
    local.clock.advance(60)
    # When the job is given back / Then the instance is retired
    progress = give_back(local, record, ReuseSettings(max_age_minutes=1))
    assert progress.status is ReleaseStatus.RETIRED
    never_pooled(local, record)


def test_an_instance_within_every_limit_awaits_its_receipt_to_be_pooled(local: LocalControlPlane) -> None:
    # Given a private repository's instance after its first job / When given back
    progress = give_back(local, running(local))
    # Then it waits for the agent's scrub, as ever
    assert progress.status is ReleaseStatus.AWAITING_RECEIPT


@pytest.mark.parametrize("own_release_first", [False, True], ids=["running", "released-first"])
def test_a_foreign_job_on_our_runner_quarantines_the_instance(
    local: LocalControlPlane, own_release_first: bool
) -> None:
    # Given an instance running for RUN under its runner (or already given back by RUN's own release,
    # its pool message on the way)
    record = running(local)
    if own_release_first:
        assert give_back(local, record).status is ReleaseStatus.AWAITING_RECEIPT
    # When GitHub reports that runner running a job of another run
    progress = give_back(local, record, run_key=FOREIGN_RUN, quarantine=True)
    # Then the instance is quarantined: expired, never pooled, the reason naming both runs
    assert progress.status is ReleaseStatus.QUARANTINED
    assert RUN in (progress.reason or "")
    assert FOREIGN_RUN in (progress.reason or "")
    never_pooled(local, record)
    # And the run's own release, later, moves on without pooling it
    assert give_back(local, record).status is ReleaseStatus.MOVED_ON
    never_pooled(local, record)


def test_a_completed_job_of_another_repository_on_our_runner_quarantines_the_instance(
    local: LocalControlPlane,
) -> None:
    # Given an instance handed to a job of REPOSITORY
    record = running(local)
    # When GitHub reports its runner completed a job of another repository under the same run key
    progress = give_back(local, record, repository=f"{OWNER}/elsewhere")
    # Then it is quarantined, never released to the pool
    assert progress.status is ReleaseStatus.QUARANTINED
    assert local.record(record.instance_id).state is InstanceState.RUNNING
    never_pooled(local, record)


@pytest.mark.parametrize("own_release_first", [False, True], ids=["running", "released-first"])
def test_a_job_of_another_attempt_of_the_same_run_on_our_runner_quarantines_the_instance(
    local: LocalControlPlane, own_release_first: bool
) -> None:
    # Given an instance whose runner was registered for attempt 1 of the run (still running, or given
    # back by that attempt's own release)
    record = running(local)
    if own_release_first:
        assert give_back(local, record).status is ReleaseStatus.AWAITING_RECEIPT
    # When GitHub reports that runner completed a job of the run's attempt 2: a re-run, whose jobs carry
    # the very same pool= label
    progress = give_back(local, record, run_key=f"{RUN}@2")
    # Then the instance is quarantined, the reason naming both attempts, and never pooled
    assert progress.status is ReleaseStatus.QUARANTINED
    assert f"({RUN})" in (progress.reason or "")
    assert f"{RUN}@2" in (progress.reason or "")
    assert local.record(record.instance_id).quarantined_at is not None
    never_pooled(local, record)


@pytest.mark.parametrize(
    ("job_run_key", "status"),
    [(f"{RUN}@2", ReleaseStatus.QUARANTINED), (RUN, ReleaseStatus.MOVED_ON)],
    ids=["another-attempt", "its-own-attempt"],
)
def test_a_started_job_is_judged_by_its_runners_attempt_and_never_released(
    local: LocalControlPlane, job_run_key: str, status: ReleaseStatus
) -> None:
    # Given an instance running a job under the runner registered for attempt 1 of the run
    record = running(local)
    # When GitHub reports a job started on that runner, of attempt 2 or of attempt 1 itself
    progress = give_back(local, record, run_key=job_run_key, suspect=True)
    # Then a job of attempt 2 quarantines the instance; one of its own attempt leaves it running
    assert progress.status is status
    current = local.record(record.instance_id)
    assert (current.quarantined_at is not None) is (status is ReleaseStatus.QUARANTINED)
    if status is ReleaseStatus.MOVED_ON:
        assert current == record


def test_a_scrub_receipt_that_comes_after_the_quarantine_does_not_pool_the_instance(
    local: LocalControlPlane,
) -> None:
    # Given an instance released by its own run and awaiting its agent's receipt, then quarantined
    record = running(local)
    awaiting = give_back(local, record)
    assert awaiting.status is ReleaseStatus.AWAITING_RECEIPT
    assert give_back(local, record, run_key=FOREIGN_RUN, quarantine=True).status is ReleaseStatus.QUARANTINED
    # When the agent's scrub confirms, and the release looks
    local.table.write_signal(record.instance_id, Signal.UD_REMOVE_REG_OK, RUN)
    checked = local.release().check_receipt(awaiting)
    # Then the release does not pool it: the quarantine's expiry stands
    assert checked.status is not ReleaseStatus.POOLED
    never_pooled(local, record)


# --- a job with an environment -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("single_use", "status"),
    [(False, ReleaseStatus.QUARANTINED), (True, ReleaseStatus.MOVED_ON)],
    ids=["handed-over-for-reuse", "handed-over-single-use"],
)
def test_a_job_with_an_environment_started_on_a_shared_instance_quarantines_it(
    local: LocalControlPlane, single_use: bool, status: ReleaseStatus
) -> None:
    # Given an instance running under a runner of the run, handed over for reuse or single use (GitHub
    # may give a job any runner carrying all its labels: a runner an earlier batch provisioned)
    record = running(local, single_use=single_use)
    # When GitHub reports a job with an environment started on that runner
    progress = give_back(local, record, suspect=True, privileged=True)
    # Then an instance not handed over single use is quarantined, the reason naming the privileged job;
    # a single-use one is left to its job, whose completion releases it
    assert progress.status is status
    if single_use:
        assert local.record(record.instance_id).state is InstanceState.RUNNING
    else:
        assert "privileged job" in (progress.reason or "")
        assert local.record(record.instance_id).quarantined_at is not None
        never_pooled(local, record)


def test_a_job_with_an_environment_completed_on_a_reusable_instance_retires_it(
    local: LocalControlPlane,
) -> None:
    # Given an instance handed over for reuse (its record says nothing of single use)
    record = running(local)
    # When GitHub reports a job with an environment completed on its runner
    progress = give_back(local, record, privileged=True)
    # Then it is retired, never pooled, whatever its record says
    assert progress.status is ReleaseStatus.RETIRED
    assert "environment" in (progress.reason or "")
    never_pooled(local, record)


def test_a_job_without_an_environment_started_on_a_shared_instance_is_left_to_run(
    local: LocalControlPlane,
) -> None:
    # Given an instance handed over for reuse, running a job of its own run attempt
    record = running(local)
    # When a job without an environment is reported started on it / Then nothing changes
    progress = give_back(local, record, suspect=True)
    assert progress.status is ReleaseStatus.MOVED_ON
    assert local.record(record.instance_id).state is InstanceState.RUNNING
