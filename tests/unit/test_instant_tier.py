"""A class's instant tier: its generic label, which jobs are its demand, its size, and what its webhooks ask."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.harness.webhooks import REPOSITORY, completed_job, queued_job
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import (
    DemandLedger,
    ExecutionStarter,
    InstanceRelease,
    InstantQueued,
    TierGroupChanged,
)
from runner_pool.domain.executions import ProvisionRequest, ReleaseRequest, runner_name
from runner_pool.domain.instant import (
    TierGroupAccess,
    instant_job,
    surplus_waiting,
    tier_group_access,
    tier_holds,
    tier_shortfall,
    waited_offline,
)
from runner_pool.domain.labels import CLASS_NAME, LabelError, RunnerLabel, instant_class, instant_label
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import single_use
from runner_pool.domain.records import Arch, InstanceRecord
from runner_pool.domain.release import ReleaseItem, ran_a_foreign_job
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import GitHubUnavailableError, RegisteredRunner, RunnerStatus
from runner_pool.domain.webhooks import (
    Accepted,
    Delivery,
    Ignored,
    InstallationRepositoriesEvent,
    Unserved,
    WorkflowJobEvent,
    verdict,
)
from runner_pool.steps.dispatcher import Dispatcher
from tests.support import builders

CLASSES = st.from_regex(CLASS_NAME, fullmatch=True)
LABEL = instant_label("large")
INSTANCE = "i-0123456789abcdef0"
RUNNER = runner_name(INSTANCE, "claim-1")


def judged(payload: dict[str, Any], config: StackConfig | None = None) -> Any:
    event = WorkflowJobEvent.model_validate(payload)
    return verdict(Delivery("d-1", "workflow_job", event), config or StackConfig())


# --- the label ----------------------------------------------------------------------------------------


@given(CLASSES)
def test_a_tiers_label_parses_as_its_class_and_formats_back(resource_class: str) -> None:
    # Given a class's generic label
    label = instant_label(resource_class)
    # When parsed / Then it names the class's tier, and formats back to the text it was read from
    parsed = RunnerLabel.parse(label)
    assert parsed.instant
    assert parsed.resource_class == resource_class
    assert parsed.format() == label
    assert RunKey.parse(label).runner_labels == (label,)


@given(CLASSES, st.data())
def test_a_tiers_label_is_recognised_in_any_case_as_github_matches_labels(
    resource_class: str, data: st.DataObject
) -> None:
    # Given the label written in any mix of cases (GitHub: "Labels are case-insensitive")
    label = instant_label(resource_class)
    written = "".join(data.draw(st.sampled_from([c.lower(), c.upper()])) for c in label)
    # When recognised / Then it is the class's tier all the same
    assert instant_class(written) == resource_class


@pytest.mark.parametrize(
    "text",
    [
        "pool=instant",
        "pool=instant/usage=spot",
        "pool=instant/class=large/usage=spot",
        "pool=instant/class=L!",
    ],
)
def test_a_tier_label_with_other_keys_or_no_class_is_refused_with_its_form(text: str) -> None:
    # Given a label that asks for the tier but not in its one spelling
    # When parsed / Then it is refused: the tier's runners carry exactly pool=instant/class=<class>
    with pytest.raises(LabelError):
        RunnerLabel.parse(text)


def test_a_run_label_is_no_tiers() -> None:
    assert instant_class("pool=4242/class=large") is None
    assert instant_class("self-hosted") is None


# --- which jobs are a tier's demand ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "labels",
    [[LABEL], ["self-hosted", LABEL], ["Self-Hosted", "linux", "X64", LABEL.upper()]],
    ids=["alone", "beside-self-hosted", "defaults-in-any-case"],
)
def test_a_job_whose_labels_a_tier_runner_carries_is_the_tiers(labels: list[str]) -> None:
    assert instant_job(labels, Arch.X64) == "large"


@pytest.mark.parametrize(
    "labels",
    [[LABEL, "gpu"], [LABEL, "arm64"], [LABEL, "pool=4242/class=large"], [LABEL, instant_label("xlarge")]],
    ids=["other-label", "other-arch", "with-a-run-label", "two-tiers"],
)
def test_a_job_asking_for_a_label_no_tier_runner_carries_is_refused(labels: list[str]) -> None:
    # Given a job GitHub would never give a tier's runner (it needs every label the job lists)
    # When judged / Then it is not the tier's demand, with the reason
    with pytest.raises(LabelError):
        instant_job(labels, Arch.X64)


def test_a_job_without_a_tier_label_is_none_of_the_tiers() -> None:
    assert instant_job(["pool=4242/class=large", "self-hosted"], Arch.X64) is None


# --- its size -----------------------------------------------------------------------------------------


def record(state: InstanceState, run_key: str | None, threshold: float = 100.0) -> InstanceRecord:
    return InstanceRecord(
        **builders.facts(0x123456789ABCDEF0).model_dump(),
        state=state,
        run_key=run_key,
        threshold=threshold,
        claim_token="t" if state is InstanceState.CLAIMED else None,
        created_at=0.0,
        updated_at=0.0,
    )


def test_the_tier_holds_what_holds_its_label_in_date() -> None:
    # Given records created, claimed and running for the tier, one past its threshold, one of a run
    records = [
        record(InstanceState.CREATED, LABEL),
        record(InstanceState.CLAIMED, LABEL),
        record(InstanceState.RUNNING, LABEL),
        record(InstanceState.RUNNING, LABEL, threshold=10.0),
        record(InstanceState.RUNNING, "pool=4242/class=large"),
        record(InstanceState.IDLE, None),
    ]
    # When counted at 50 / Then the three in date that hold its label
    assert tier_holds(records, "large", 50.0) == 3


@given(st.integers(0, 50), st.integers(0, 100))
def test_the_shortfall_brings_the_tier_to_its_size_and_never_past_it(size: int, held: int) -> None:
    short = tier_shortfall(size, held)
    assert short >= 0
    assert held + short == max(size, held)


def test_waiting_runners_beyond_the_size_are_surplus_those_on_a_job_never() -> None:
    # Given four instances running for the tier with a runner, one of them on a job (its repository
    # noted), and one still created
    def waiting(number: int, **update: object) -> InstanceRecord:
        found = record(InstanceState.RUNNING, LABEL).model_copy(
            update={"instance_id": f"i-{number:017x}", "runner_id": number, "updated_at": float(number)}
        )
        return found.model_copy(update=update)

    records = [
        waiting(1),
        waiting(2, repository="octo-org/app"),
        waiting(3),
        waiting(4),
        record(InstanceState.CREATED, LABEL),
    ]
    # When a tier of 2 is judged / Then the one waiting longest beyond it is surplus, never the busy one
    assert surplus_waiting(records, "large", 2, 50.0) == [f"i-{1:017x}"]
    assert surplus_waiting(records, "large", 3, 50.0) == []


def offline(runner_id: int = 7, label: str = LABEL) -> RegisteredRunner:
    return RegisteredRunner(runner_id, RUNNER, RunnerStatus.OFFLINE, (label, "self-hosted"))


def test_a_tier_runner_offline_while_its_instance_ran_for_it_waited_offline() -> None:
    # Given a record running for the tier with runner 7, which GitHub lists offline
    held = record(InstanceState.RUNNING, LABEL).model_copy(update={"runner_id": 7})
    # When judged at 50 / Then it died waiting: its instance is to be ended and replaced
    assert waited_offline(held, offline(), 50.0)


@pytest.mark.parametrize(
    ("state", "runner_id", "label"),
    [
        (InstanceState.CREATED, 7, LABEL),
        (InstanceState.CLAIMED, 7, LABEL),
        (InstanceState.RUNNING, 8, LABEL),
        (InstanceState.RUNNING, 7, "pool=4242/class=large"),
    ],
    ids=["created-may-still-start", "claimed-may-still-start", "another-runner", "a-runs-runner"],
)
def test_an_offline_runner_that_may_still_start_or_is_not_the_tiers_did_not_wait_offline(
    state: InstanceState, runner_id: int, label: str
) -> None:
    held = record(state, label).model_copy(update={"runner_id": runner_id})
    assert not waited_offline(held, offline(7, label), 50.0)


def test_a_schedule_sizes_the_tier_by_its_open_window() -> None:
    # Given a tier of 1, and 4 on Mondays 08:00-18:00 UTC
    window = {"days": ["mon"], "start": "08:00", "end": "18:00", "hot": 0, "instant": 4}
    config = StackConfig(warm_pool_minimum={"large": {"instant": 1, "windows": [window]}})
    monday_noon = 1_767_614_400.0  # 2026-01-05 12:00 UTC, a Monday
    # When sized / Then the window's inside it, the plain size outside
    assert config.instant_tier("large", monday_noon) == 4
    assert config.instant_tier("large", monday_noon + 86_400) == 1
    assert config.instant_tier("xlarge", monday_noon) == 0


def test_a_tier_on_an_organisation_registering_at_repositories_is_refused() -> None:
    # Given an organisation that registers each job's runner at its repository
    # When a tier is configured / Then the config says it has no place to register the tier's runners
    with pytest.raises(ValueError, match="instant"):
        StackConfig.model_validate(
            {
                "github": {"scope": "octo-org", "registration": "repository"},
                "warm_pool_minimum": {"large": {"instant": 2}},
            }
        )


def test_a_tiers_provision_is_single_use_whatever_its_level() -> None:
    # Given a provision for the tier, even one that says its jobs' level is trusted
    config = StackConfig()
    request = ProvisionRequest(repository=REPOSITORY, run_key=LABEL, count=1, trust="trusted")
    # When planned / Then it is single use: pristine instances only, terminated after their job
    assert single_use(request, request.key.resolve(config), config.reuse)


# --- its webhooks -------------------------------------------------------------------------------------


def private(payload: dict[str, Any]) -> dict[str, Any]:
    payload["repository"].update(private=True, visibility="private")
    return payload


def test_a_queued_tier_job_asks_for_one_more_runner_of_its_class() -> None:
    # Given a private repository's job queued on the tier's label
    # When judged / Then one runner more is asked for the class, by the job
    found = judged(private(queued_job(LABEL, job_id=401)))
    assert isinstance(found, Accepted)
    assert found.message == InstantQueued(repository=REPOSITORY, resource_class="large", job_id=401)


def test_a_queued_tier_job_of_an_undefined_class_is_unserved() -> None:
    found = judged(private(queued_job(instant_label("huge"), job_id=402)))
    assert isinstance(found, Unserved)


def test_a_public_repositorys_tier_job_is_refused_when_the_groups_take_no_public_repository() -> None:
    # Given the default organisation stack (runner groups, public repositories not allowed)
    config = StackConfig(github={"scope": "octo-org"})
    # When a public repository's tier job is judged / Then it is unserved, naming the setting
    found = judged(queued_job(LABEL, job_id=403), config)
    assert isinstance(found, Unserved)
    assert "runner_groups_allow_public_repositories" in found.reason


def test_a_completed_tier_job_releases_its_instance_by_the_runner_it_ran_on() -> None:
    found = judged(completed_job(LABEL, runner_name=RUNNER, job_id=404))
    assert isinstance(found, Accepted)
    assert found.message == InstanceRelease(
        request=ReleaseRequest(
            run_key=LABEL, instance_id=INSTANCE, runner_id=5, cause="job-404", repository=REPOSITORY
        )
    )


def test_a_started_tier_job_is_sent_to_be_judged_against_its_runners_hand_over() -> None:
    # Given a tier job in progress on a runner of ours
    payload = completed_job(LABEL, runner_name=RUNNER, job_id=405)
    payload["action"] = "in_progress"
    # When judged / Then the release judges it (a runner of a run given it is quarantined), releasing nothing
    found = judged(payload)
    assert isinstance(found, Accepted)
    assert isinstance(found.message, InstanceRelease)
    assert found.message.request.suspect
    assert found.message.request.cause == "started-job-405"


def test_a_tier_job_on_a_runner_not_ours_needs_nothing() -> None:
    found = judged(completed_job(LABEL, runner_name="someone-elses", job_id=406))
    assert isinstance(found, Ignored)


# --- the tier's runner group and the installation's repositories ---------------------------------------

TIER_STACK = {
    "github": {"scope": "octo-org", "installation_id": 77},
    "warm_pool_minimum": {"large": {"instant": 2}},
}


def installation_change(installation_id: int = 77, action: str = "added") -> Delivery:
    event = InstallationRepositoriesEvent.model_validate(
        {"action": action, "installation": {"id": installation_id}, "repository_selection": "selected"}
    )
    return Delivery("d-2", "installation_repositories", event)


@pytest.mark.parametrize("action", ["added", "removed"])
def test_a_change_of_the_installations_repositories_sets_the_tier_group_again(action: str) -> None:
    # Given an organisation stack that keeps an instant tier
    # When the installation's repositories change / Then the tier group is queued to be set to them
    found = verdict(installation_change(action=action), StackConfig.model_validate(TIER_STACK))
    assert isinstance(found, Accepted)
    assert found.message == TierGroupChanged(installation_id=77)


def test_a_change_of_another_installation_or_of_a_stack_without_a_tier_needs_nothing() -> None:
    tier = StackConfig.model_validate(TIER_STACK)
    assert isinstance(verdict(installation_change(installation_id=78), tier), Ignored)
    without = StackConfig.model_validate({"github": TIER_STACK["github"]})
    assert isinstance(verdict(installation_change(), without), Ignored)


@given(st.sets(st.integers(min_value=1, max_value=10**9), max_size=20), st.text(max_size=10))
def test_the_tier_group_admits_every_repository_only_for_an_installation_on_all(
    repository_ids: set[int], selection: str
) -> None:
    # Given an installation's answer: its selection and the repositories it listed
    # When the tier group's access is decided / Then `all` admits every repository, and anything else
    # exactly those listed, never more
    assert tier_group_access("all", repository_ids) == TierGroupAccess(None)
    access = tier_group_access(selection, repository_ids)
    if selection != "all":
        assert access == TierGroupAccess(frozenset(repository_ids))
        assert access.visibility == "selected"


def tier_group_dispatcher(tier_group: Callable[[], object]) -> Dispatcher:
    """A dispatcher for batches of installation changes only, which ask nothing of the ledger or starter."""
    none = builders.demand_starts(
        cast(DemandLedger, None), cast(ExecutionStarter, None), ManualClock(), lambda _seconds: None
    )
    return Dispatcher(none, tier_group=tier_group)


def test_the_changes_of_one_batch_set_the_tier_group_once() -> None:
    # Given two deliveries of installation changes in one batch
    asked: list[str] = []
    batch = [(f"m{n}", TierGroupChanged(installation_id=77)) for n in (1, 2)]
    # When dispatched / Then one read of the installation's whole list serves both, and neither is retried
    report = tier_group_dispatcher(lambda: asked.append("set")).dispatch(batch, "holder", 60.0)
    assert asked == ["set"]
    assert report.tier_groups == 1
    assert report.failed_message_ids == set()


def test_a_tier_group_github_did_not_set_is_delivered_again() -> None:
    # Given GitHub failing the change of the tier group
    def unavailable() -> None:
        raise GitHubUnavailableError("502 from GitHub")

    batch = [(f"m{n}", TierGroupChanged(installation_id=77)) for n in (1, 2)]
    # When dispatched / Then every message of the change fails, for SQS to deliver again
    report = tier_group_dispatcher(unavailable).dispatch(batch, "holder", 60.0)
    assert report.failed_message_ids == {"m1", "m2"}
    assert report.tier_groups == 0


# --- a runner of ours given a job it was not registered for --------------------------------------------


@pytest.mark.parametrize(
    ("registered_for", "job_of"),
    [("pool=4242/class=large", LABEL), (LABEL, "pool=4242/class=large")],
    ids=["a tier job on a run's runner", "a run's job on a tier runner"],
)
def test_a_job_on_a_runner_we_did_not_register_for_it_is_foreign(registered_for: str, job_of: str) -> None:
    # Given an instance whose runner 7 we registered for one label
    held = record(InstanceState.RUNNING, registered_for).model_copy(
        update={"runner_id": 7, "runner_run_key": registered_for}
    )
    # When GitHub reports runner 7 on a job of the other / Then the release quarantines it
    item = ReleaseItem(
        instance_id=held.instance_id, run_key=job_of, poll_seconds=1, runner_id=7, suspect=True
    )
    assert ran_a_foreign_job(held, item)


def test_a_tier_job_on_the_tier_runner_we_registered_is_its_own() -> None:
    held = record(InstanceState.RUNNING, LABEL).model_copy(update={"runner_id": 7, "runner_run_key": LABEL})
    item = ReleaseItem(instance_id=held.instance_id, run_key=LABEL, poll_seconds=1, runner_id=7, suspect=True)
    assert not ran_a_foreign_job(held, item)
