"""A job's level of trust from GitHub's facts about its run (domain/trust.py), one row per rule, and who
may follow whom on an instance. Every run fact here is a field GitHub's `workflow_run` payload carries
(event, actor.login, triggering_actor.login, head_repository.full_name: ../shared/fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from runner_pool.domain.config import StackConfig
from runner_pool.domain.trust import (
    DEPENDABOT,
    TRUSTED_EVENTS,
    UNTRUSTED_EVENTS,
    WORKFLOW_EVENTS,
    RunFacts,
    TrustLevel,
    job_trust,
    may_follow,
    reuses,
    run_trust,
)

REPO = "octo-org/app"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "github-webhooks"


def run(event: str, **facts: str | None) -> RunFacts:
    return RunFacts(repository=REPO, event=event, head_repository=facts.pop("head", REPO), **facts)


@pytest.mark.parametrize(
    ("facts", "level"),
    [
        (run("push", actor="octocat"), TrustLevel.TRUSTED),
        (run("schedule"), TrustLevel.TRUSTED),
        (run("workflow_dispatch", actor="octocat"), TrustLevel.TRUSTED),
        (run("release"), TrustLevel.TRUSTED),
        (run("pull_request", actor="octocat"), TrustLevel.UNTRUSTED),
        (run("pull_request_target", actor="octocat"), TrustLevel.UNTRUSTED),
        (run("pull_request_review"), TrustLevel.UNTRUSTED),
        (run("merge_group"), TrustLevel.UNTRUSTED),
        (run("issue_comment", actor="anyone"), TrustLevel.UNTRUSTED),
        (run("workflow_run"), TrustLevel.UNTRUSTED),
        (run("push", actor=DEPENDABOT), TrustLevel.UNTRUSTED),
        (run("push", actor="octocat", triggering_actor=DEPENDABOT), TrustLevel.UNTRUSTED),
        (run("push", actor="octocat", head="someone/app"), TrustLevel.UNTRUSTED),
        (run("push", actor="octocat", head=None), TrustLevel.UNTRUSTED),
        (run("a_future_event"), TrustLevel.UNTRUSTED),
    ],
)
def test_a_runs_level_follows_githubs_facts(facts: RunFacts, level: TrustLevel) -> None:
    # Given what GitHub says about a run / Then its jobs' level is the rule's
    assert run_trust(facts) is level


def test_the_fixture_runs_are_read_by_the_same_rules() -> None:
    # Given GitHub's own workflow_run payload (repository_dispatch, by its repository's own actor)
    payload = json.loads((FIXTURES / "workflow_run.requested.payload.json").read_text())
    workflow_run = payload["workflow_run"]
    facts = RunFacts(
        repository=payload["repository"]["full_name"],
        event=workflow_run["event"],
        actor=workflow_run["actor"]["login"],
        triggering_actor=workflow_run["triggering_actor"]["login"],
        head_repository=workflow_run["head_repository"]["full_name"],
    )
    # Then it is trusted: reviewed code of the repository, on its own dispatch
    assert run_trust(facts) is TrustLevel.TRUSTED


def test_an_operator_maps_an_event_but_never_above_a_fork_or_dependabot() -> None:
    # Given a stack that trusts its pull requests
    by_event = {"pull_request": TrustLevel.TRUSTED}
    # Then a pull request of the repository's own branch is trusted; a fork's or Dependabot's is not
    assert run_trust(run("pull_request"), by_event) is TrustLevel.TRUSTED
    assert run_trust(run("pull_request", head="fork/app"), by_event) is TrustLevel.UNTRUSTED
    assert run_trust(run("pull_request", actor=DEPENDABOT), by_event) is TrustLevel.UNTRUSTED


@given(run_level=st.sampled_from([*TrustLevel, None]))
def test_a_job_with_an_environment_is_privileged_whatever_its_run(run_level: TrustLevel | None) -> None:
    assert job_trust(run_level, deployment=True) is TrustLevel.PRIVILEGED
    assert job_trust(run_level, deployment=False) is run_level


@given(
    served=st.sampled_from([*TrustLevel, None]),
    level=st.sampled_from([*TrustLevel, None]),
)
def test_only_a_pristine_instance_serves_across_levels(
    served: TrustLevel | None, level: TrustLevel | None
) -> None:
    # Given any two levels / Then a pristine instance serves anyone, a used one only its own reusing level
    assert may_follow(served, level, used=False)
    assert may_follow(served, level, used=True) == (served is level and reuses(level))


def test_a_privileged_or_unknown_job_never_reuses() -> None:
    assert not reuses(TrustLevel.PRIVILEGED)
    assert not reuses(None)
    assert not may_follow(TrustLevel.PRIVILEGED, TrustLevel.PRIVILEGED, used=True)


def test_no_event_is_both_trusted_and_untrusted() -> None:
    assert not TRUSTED_EVENTS & UNTRUSTED_EVENTS
    assert "pull_request" in WORKFLOW_EVENTS - TRUSTED_EVENTS


def test_synth_refuses_a_mapping_of_an_event_github_never_sends() -> None:
    # Given a config that maps a misspelt event / Then it is refused, naming the key and the fix
    with pytest.raises(ValidationError, match=r"pull_requests.*never sends"):
        StackConfig.model_validate({"reuse": {"trust_by_event": {"pull_requests": "trusted"}}})
    assert StackConfig.model_validate({"reuse": {"trust_by_event": {"pull_request": "trusted"}}})


def test_synth_refuses_a_level_that_is_not_one() -> None:
    with pytest.raises(ValidationError, match="trust_by_event"):
        StackConfig.model_validate({"reuse": {"trust_by_event": {"push": "very-trusted"}}})
