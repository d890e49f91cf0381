"""The job's story (domain/job_story.py) on each path a job takes, from facts shaped as the stack records
them: the ledger's item, the executions' inputs and their states' outputs (the very models the steps
pass on), the instance's record and GitHub's job."""

from __future__ import annotations

from typing import Any

import pytest

from runner_pool.domain.config import StackConfig
from runner_pool.domain.executions import ProvisionRequest, ReleaseRequest, runner_name
from runner_pool.domain.job_story import (
    ExecutionFacts,
    GitHubJob,
    JobFacts,
    JobRef,
    LedgerJob,
    StateExit,
    Tier,
    instant_tier,
    parse_job_url,
    tell,
    unserved_reason,
)
from runner_pool.domain.labels import instant_label
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import ClaimWorker, Creation, ProvisionResult, Readiness, WorkerResult, plan
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.release import ReleaseStatus
from tests.support import builders

T0 = 1_800_000_000.0
REPOSITORY = "octo-org/app"
RUN_ID = 41
JOB_ID = 4101
LABEL = f"pool={RUN_ID}/class=large"
INSTANCE = builders.facts(1).instance_id
PROVISION = "provision-aaaa"
CONFIG = StackConfig()


def github_job(*, started: float | None = None, ended: float | None = None, **changes: Any) -> GitHubJob:
    fields: dict[str, Any] = {
        "job_id": JOB_ID,
        "run_attempt": 1,
        "name": "build",
        "status": "completed" if ended else ("in_progress" if started else "queued"),
        "labels": (LABEL,),
        "created_at": T0,
        "started_at": started,
        "completed_at": ended,
        "conclusion": "success" if ended else None,
        "runner_id": 7 if started else None,
        "runner_name": runner_name(INSTANCE, "claim") if started else None,
    }
    return GitHubJob(**(fields | changes))


def request(**changes: Any) -> ProvisionRequest:
    return ProvisionRequest(repository=REPOSITORY, run_key=LABEL, count=1, job_ids=(JOB_ID,), **changes)


def worker(**changes: Any) -> dict[str, Any]:
    """A claim worker's state as Claim and CheckClaim pass it on."""
    provision = plan(request(), CONFIG.spec_for(LABEL), PROVISION, CONFIG.timeouts, T0 + 1)
    fields = {"slot": 0, "instance_id": INSTANCE, "claimed": True, "handed_over_at": T0 + 1.5} | changes
    return ClaimWorker(plan=provision, **fields).model_dump(mode="json")


def created(**changes: Any) -> dict[str, Any]:
    """Creation's state as Create and CheckFleet pass it on."""
    return {"creation": {"created": Creation(**changes).model_dump(mode="json")}}


def provision(
    *exits: StateExit, name: str = PROVISION, ended: float | None = T0 + 10, **given: Any
) -> ExecutionFacts:
    return ExecutionFacts(
        name=name,
        status="SUCCEEDED" if ended else "RUNNING",
        started_at=T0 + 1,
        input=request(**given).model_dump(mode="json"),
        stopped_at=ended,
        exits=exits,
    )


def finish(at: float, **lists: tuple[str, ...]) -> StateExit:
    fields = {"warm": (), "cold": (), "expired": ()} | lists
    return StateExit(
        at, "Finish", ProvisionResult(run_key=LABEL, requested=1, **fields).model_dump(mode="json")
    )


def warm_provision(*, starting: bool = False) -> ExecutionFacts:
    return provision(
        StateExit(T0 + 1.6, "Claim", worker(readiness=Readiness.WAITING, starting=starting)),
        StateExit(
            T0 + 3, "CheckClaim", worker(readiness=Readiness.READY, reason="registered", starting=starting)
        ),
        StateExit(
            T0 + 3,
            "Selected",
            WorkerResult(slot=0, instance_id=INSTANCE, handed_over_at=T0 + 1.5).model_dump(),
        ),
        finish(T0 + 3.2, warm=(INSTANCE,)),
    )


def cold_provision(**given: Any) -> ExecutionFacts:
    launched = (INSTANCE,)
    return provision(
        StateExit(
            T0 + 2, "Create", created(requested=1, launched=launched, pending=launched, validating=True)
        ),
        StateExit(
            T0 + 5, "CheckFleet", created(requested=1, launched=launched, pending=launched, validating=True)
        ),
        StateExit(T0 + 9, "CheckFleet", created(requested=1, launched=launched, ready=launched)),
        finish(T0 + 9.5, cold=(INSTANCE,)),
        **given,
    )


def release(status: ReleaseStatus = ReleaseStatus.POOLED, reason: str | None = None) -> ExecutionFacts:
    given = ReleaseRequest(run_key=LABEL, instance_id=INSTANCE, runner_id=7, cause=f"job-{JOB_ID}")
    progress = {"instance_id": INSTANCE, "run_key": LABEL, "poll_seconds": 1}
    return ExecutionFacts(
        name="release-bbbb",
        status="SUCCEEDED",
        started_at=T0 + 30.5,
        input=given.model_dump(mode="json"),
        stopped_at=T0 + 33,
        exits=(
            StateExit(T0 + 31, "GiveBack", progress | {"status": ReleaseStatus.AWAITING_RECEIPT.value}),
            StateExit(T0 + 33, "CheckReceipt", progress | {"status": status.value, "reason": reason}),
        ),
    )


def record(**changes: Any) -> InstanceRecord:
    fields = builders.facts(1).model_dump() | {
        "state": InstanceState.IDLE,
        "threshold": T0 + 600,
        "created_at": T0 - 300,
        "updated_at": T0 + 33,
        "jobs_served": 2,
    }
    return InstanceRecord.model_validate(fields | changes)


def facts(**given: Any) -> JobFacts:
    fields: dict[str, Any] = {
        "ref": JobRef(REPOSITORY, RUN_ID, JOB_ID),
        "now": T0 + 60,
        "ledger": LedgerJob("started", PROVISION, T0 + 1),
    }
    return JobFacts(**(fields | given))


def served(*provisions: ExecutionFacts, started: float = T0 + 4, **given: Any) -> JobFacts:
    return facts(
        github=github_job(started=started, ended=T0 + 30),
        provisions=provisions,
        releases=(release(),),
        record=record(),
        **given,
    )


def test_a_warm_job_is_told_from_queued_to_the_verdict_of_its_scrub() -> None:
    # Given a job served by an instance claimed from the pool, which ran it and was scrubbed and pooled
    story = tell(served(warm_provision()))

    # Then every step is told in order, with the instance and where it came from
    assert story.kinds == [
        "queued",
        "demand",
        "batch",
        "hand-over",
        "ready",
        "provision end",
        "started",
        "ended",
        "release",
        "scrub",
        "instance",
    ]
    assert (story.instance_id, story.tier, story.waiting) == (INSTANCE, Tier.WARM, None)
    by_kind = {step.what: step for step in story.steps}
    assert "claimed from the pool" in by_kind["hand-over"].detail
    assert "verified clean (UD_REMOVE_REG_OK)" in by_kind["scrub"].detail
    # And each step's wait is the time since the step before it
    assert by_kind["ready"].wait_seconds == pytest.approx(1.5)
    assert by_kind["started"].wait_seconds == pytest.approx(0.8)


def test_githubs_whole_second_start_is_told_after_the_hand_over_of_the_same_second() -> None:
    # Given GitHub's start and end at the second in which the instance was handed over (at T0 + 1.5)
    story = tell(served(warm_provision(), started=T0 + 1))

    # Then the job starts after its hand-over, with no wait, and ends after it started
    order = story.kinds
    assert order.index("hand-over") < order.index("started") < order.index("ended")
    assert next(s for s in story.steps if s.what == "started").wait_seconds == 0.0


def test_a_job_served_from_the_stopped_tier_says_its_instance_was_started_for_it() -> None:
    # Given a claim worker that took a stopped instance and started it
    story = tell(served(warm_provision(starting=True)))

    # Then the story names the stopped tier
    assert story.tier is Tier.STOPPED
    assert "the stopped tier (started for it)" in next(s.detail for s in story.steps if s.what == "hand-over")


def test_a_cold_job_tells_the_launch_and_when_the_fleet_check_saw_it_registered() -> None:
    # Given a job whose provision launched its instance
    story = tell(served(cold_provision(), started=T0 + 10))

    # Then it was cold, launched at Create and registered at the fleet check that saw it ready
    assert story.tier is Tier.COLD
    steps = {step.what: step for step in story.steps}
    assert steps["creation"].detail == "CreateFleet for 1: launched 1"
    assert steps["hand-over"].at == T0 + 2
    assert steps["ready"].at == T0 + 9
    assert steps["ready"].wait_seconds == pytest.approx(7)


def test_a_redriven_job_tells_both_provisions_and_that_the_second_asked_again() -> None:
    # Given a first provision that ended short and its redrive, which launched the instance
    short = provision(finish(T0 + 8, expired=("i-0123456789abcdef0",)))
    again = cold_provision(redrives=1)

    # When the story is told
    story = tell(served(short, again))

    # Then both batches are told, the second as a redrive, and the instance came from it
    batches = [step.detail for step in story.steps if step.what == "batch"]
    assert len(batches) == 2
    assert "redrive 1 (an earlier provision ended short)" in batches[1]
    assert story.tier is Tier.COLD


def test_a_reconciled_job_says_refresh_asked_again() -> None:
    # Given a provision started by refresh's reconciliation of the run's queued jobs
    story = tell(served(cold_provision(origin="reconcile-1800000005")))

    # Then its batch says so
    batch = next(step.detail for step in story.steps if step.what == "batch")
    assert "asked again by refresh (reconcile-1800000005)" in batch


def test_an_unserved_label_is_the_reason_the_job_waits() -> None:
    # Given a queued job whose label names an unknown class, never counted
    job = github_job(labels=(f"pool={RUN_ID}/class=huge",))
    reason = unserved_reason(job, RUN_ID, CONFIG)

    # When its story is told
    story = tell(facts(github=job, ledger=None, unserved=reason))

    # Then it waits because its label is unserved, with the webhook's reason
    assert reason is not None
    assert "huge" in reason
    assert story.waiting == f"unserved label: {reason}"
    assert story.kinds == ["queued", "unserved", "demand"]


def test_a_label_of_another_run_is_unserved_with_the_fix() -> None:
    job = github_job(labels=("pool=999/class=large",))
    assert unserved_reason(job, RUN_ID, CONFIG) == (
        "pool=999 is not this job's run 41; use pool=${{ github.run_id }}"
    )
    assert unserved_reason(github_job(), RUN_ID, CONFIG) is None


def test_a_job_of_an_instant_tier_is_no_runs_demand_and_says_what_it_waits_for() -> None:
    # Given a queued job that asks for the large class's instant tier, which the ledger never counts
    job = github_job(labels=(instant_label("large"),))
    tier = instant_tier(job, CONFIG)

    # When its story is told
    story = tell(
        facts(github=job, ledger=None, unserved=unserved_reason(job, RUN_ID, CONFIG), instant_tier=tier)
    )

    # Then it is told as the tier's job, not as a job whose webhook was lost
    assert tier == "large"
    assert next(s.detail for s in story.steps if s.what == "demand") == (
        "a job of the large instant tier: no run's demand, no ledger item"
    )
    assert story.waiting == "for a runner of the large instant tier (its provisions are not told yet)"


def test_a_job_of_an_undefined_instant_tier_is_unserved() -> None:
    job = github_job(labels=(instant_label("huge"),))
    assert instant_tier(job, CONFIG) is None
    assert unserved_reason(job, RUN_ID, CONFIG) == f"{instant_label('huge')}: class='huge' is not defined"


def test_a_job_whose_instance_was_quarantined_says_so() -> None:
    # Given a job whose runner's instance was quarantined when GitHub gave it a foreign job
    quarantined = record(state=InstanceState.RUNNING, run_key=LABEL, quarantined_at=T0 + 20, threshold=T0)
    story = tell(
        facts(
            github=github_job(runner_name=runner_name(INSTANCE, "claim")),
            provisions=(warm_provision(),),
            record=quarantined,
        )
    )

    # Then the quarantine is a step, and the reason it waits
    assert "quarantined" in story.kinds
    assert story.waiting == f"its instance {INSTANCE} is quarantined"


def test_a_job_held_off_by_a_rate_limit_says_how_long_is_left() -> None:
    # Given a provision at work whose claim worker was deferred, and the budget held off after a 403
    deferred = worker(
        readiness=Readiness.DEFERRED, reason="GitHub rate-limited registrations", instance_id=None
    )
    at_work = provision(StateExit(T0 + 2, "Claim", deferred), ended=None)

    # When the story is told while the hold-off lasts
    story = tell(facts(github=github_job(), provisions=(at_work,), held_until=T0 + 105))

    # Then it waits on the rate limit, with the time left
    assert story.waiting == "registrations held off for 45 s more (GitHub rate limit)"
    # And once the hold-off has passed, the deferred worker's own reason is told
    later = tell(facts(github=github_job(), provisions=(at_work,), held_until=T0 + 30))
    assert later.waiting == "registration deferred: GitHub rate-limited registrations"


def test_a_job_without_capacity_shows_ec2s_error() -> None:
    # Given a provision whose fleet launched nothing for lack of capacity
    refused = created(requested=1, launch_errors={"InsufficientInstanceCapacity": 1})
    story = tell(
        facts(github=github_job(), provisions=(provision(StateExit(T0 + 2, "Create", refused), ended=None),))
    )

    # Then the creation step and the wait both name EC2's error
    assert "EC2 refused 1 (InsufficientInstanceCapacity)" in next(
        s.detail for s in story.steps if s.what == "creation"
    )
    assert story.waiting == f"no capacity: EC2 refused 1 (InsufficientInstanceCapacity) ({PROVISION})"


def test_without_github_the_story_says_what_is_not_recorded_and_finds_the_instance_by_its_release() -> None:
    # Given the records but no GitHub (no App key readable)
    story = tell(facts(provisions=(cold_provision(),), releases=(release(),), github_unread="no key"))

    # Then the instance comes from the release's input, and the queued time is a gap
    assert story.instance_id == INSTANCE
    assert story.gaps == ("queued time: no key",)
    assert "queued" not in story.kinds
    assert "started" not in story.kinds


def test_a_release_that_expired_the_instance_tells_the_agents_reason() -> None:
    failed = release(ReleaseStatus.EXPIRED, "scrub failed: a process survived")
    story = tell(
        facts(
            github=github_job(started=T0 + 4, ended=T0 + 30),
            provisions=(warm_provision(),),
            releases=(failed,),
        )
    )
    scrub = next(s.detail for s in story.steps if s.what == "scrub")
    assert scrub == "not pooled, expired: scrub failed: a process survived"


@pytest.mark.parametrize(
    ("url", "ref"),
    [
        (
            f"https://github.com/{REPOSITORY}/actions/runs/{RUN_ID}/job/{JOB_ID}",
            JobRef(REPOSITORY, RUN_ID, JOB_ID),
        ),
        (f"https://github.com/{REPOSITORY}/actions/runs/{RUN_ID}", JobRef(REPOSITORY, RUN_ID)),
        (f"https://github.com/{REPOSITORY}/actions/runs/{RUN_ID}/attempts/2", JobRef(REPOSITORY, RUN_ID)),
        (
            f"https://ghes.example/{REPOSITORY}/actions/runs/{RUN_ID}/job/{JOB_ID}?pr=3",
            JobRef(REPOSITORY, RUN_ID, JOB_ID),
        ),
    ],
)
def test_a_job_or_run_url_names_its_repository_run_and_job(url: str, ref: JobRef) -> None:
    assert parse_job_url(url) == ref


def test_any_other_url_is_refused() -> None:
    with pytest.raises(ValueError, match="not a job or run URL"):
        parse_job_url(f"https://github.com/{REPOSITORY}/pull/3")


def test_a_stack_of_express_workflows_says_its_executions_were_not_read() -> None:
    # Given a counted job on a stack whose state machines keep no history (EXPRESS)
    unread = "the stack's state machines are EXPRESS workflows"
    story = tell(facts(github=github_job(), executions_unread=unread))

    # Then the story says so, as a gap and as the reason it cannot tell why the job waits
    assert story.gaps == (f"provisions and releases: {unread}",)
    assert story.waiting == unread
