"""Every answer of the fake GitHub validates against githubkit's models, generated from GitHub's API description.

Validation alone would let the fake send keys GitHub never sends (githubkit's models ignore unknown
keys), so each answer is also checked for keys the description does not name. The fake is asked
directly (`FakeGitHub.handle`), without a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from githubkit.rest.paginator import NEXT_LINK_PATTERN
from githubkit_schemas.latest.models import (
    AppHookDeliveriesDeliveryIdAttemptsPostResponse202,
    BasicError,
    HookDeliveryItem,
    Installation,
    InstallationRepositoriesGetResponse200,
    InstallationToken,
    Integration,
    IntegrationPropPermissions,
    OrgsOrgActionsRunnerGroupsGetResponse200,
    OrgsOrgActionsRunnersGenerateJitconfigPostResponse201,
    OrgsOrgActionsRunnersGetResponse200,
    ReposOwnerRepoActionsRunnersGetResponse200,
    RunnerGroupsOrg,
    SelfHostedRunnersSettings,
    ValidationErrorSimple,
    WebhookConfig,
    WorkflowRun,
)
from pydantic import BaseModel, TypeAdapter

from emulator.fake_github import Answer, FakeGitHub, JobSpec
from emulator.fake_github.state import RunTrigger
from emulator.harness.github_app import (
    APP_ID,
    INSTALLATION_ID,
    OWNER,
    REPO,
    AppKey,
    app_jwt,
    generate_app_key,
)
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runner_scope import OrganizationScope, RepositoryScope
from tests.support.builders import run_key

REPOSITORY = RepositoryScope(owner=OWNER, repo=REPO)
RUNNERS = f"/repos/{OWNER}/{REPO}/actions/runners"
ORG_RUNNERS = f"/orgs/{OWNER}/actions/runners"
JIT_BODY = {"name": "i-0abc-7", "runner_group_id": 1, "labels": [run_key(7)]}


@dataclass(frozen=True)
class Asking:
    """A request to the fake, made by a test: as the App (JWT) or as the installation (token)."""

    fake: FakeGitHub
    key: AppKey
    clock: ManualClock

    def as_app(self, method: str, target: str, body: Any = None) -> Answer:
        return self._send(method, target, f"Bearer {app_jwt(self.key, self.clock.now())}", body)

    def as_installation(self, method: str, target: str, body: Any = None) -> Answer:
        token, _ = self.fake.state.issue_token(INSTALLATION_ID)
        return self._send(method, target, f"token {token}", body)

    def _send(self, method: str, target: str, authorization: str, body: Any) -> Answer:
        payload = b"" if body is None else json.dumps(body).encode()
        headers = {"Authorization": authorization, "X-GitHub-Api-Version": "2022-11-28"}
        return self.fake.handle(method, target, headers, payload)


@pytest.fixture
def ask(app_key: AppKey, clock: ManualClock) -> Asking:
    fake = FakeGitHub(APP_ID, app_key.public_pem, clock=clock)
    fake.state.add_installation(INSTALLATION_ID, OWNER)
    return Asking(fake, app_key, clock)


OPEN_MODELS = (IntegrationPropPermissions,)
"""Models whose schema in GitHub's description takes any further key (`additionalProperties`): the App's
`permissions` names five and allows every other permission."""


def unknown_keys(model: Any, raw: Any, where: str = "") -> list[str]:
    """Keys of `raw` that the validated `model` has no field for, at any depth."""
    if isinstance(model, OPEN_MODELS):
        return []
    if isinstance(model, BaseModel) and isinstance(raw, dict):
        fields = {info.alias or name: name for name, info in type(model).model_fields.items()}
        found = [f"{where}.{key}" for key in raw if key not in fields]
        for key, value in raw.items():
            if key in fields:
                found += unknown_keys(getattr(model, fields[key]), value, f"{where}.{key}")
        return found
    if isinstance(model, list) and isinstance(raw, list):
        return [
            key
            for index, pair in enumerate(zip(model, raw, strict=True))
            for key in unknown_keys(*pair, f"{where}[{index}]")
        ]
    return []


def assert_shaped(answer: Answer, status: int, shape: Any) -> None:
    assert answer.status == status, answer.body
    model = TypeAdapter(shape).validate_python(answer.body)
    assert unknown_keys(model, answer.body) == []


def busy_runner(ask: Asking) -> int:
    runner = ask.fake.state.register_runner(REPOSITORY, "busy", [run_key(1)])
    ask.fake.state.set_runner_state(runner.runner_id, online=True, busy=True)
    return runner.runner_id


Call = Callable[[Asking], Answer]


def may_read_policy(ask: Asking) -> Asking:
    ask.fake.state.installations[INSTALLATION_ID].permissions["organization_administration"] = "read"
    return ask


def selects_the_repository(ask: Asking) -> Asking:
    ask.fake.state.installations[INSTALLATION_ID].repositories = {f"{OWNER}/{REPO}"}
    return ask


def has_a_busy_runner(ask: Asking) -> Asking:
    ask.fake.state.set_runner_state(busy_runner(ask), online=True)
    return ask


def has_spent_its_rate_limit(ask: Asking) -> Asking:
    ask.fake.state.exhaust_rate_limit(until=ask.clock.now() + 60)
    return ask


SUCCESSES: dict[str, tuple[Call, int, Any]] = {
    "the App": (lambda ask: ask.as_app("GET", "/app"), 200, Integration),
    "an installation": (
        lambda ask: ask.as_app("GET", f"/app/installations/{INSTALLATION_ID}"),
        200,
        Installation,
    ),
    "the webhook config": (lambda ask: ask.as_app("GET", "/app/hook/config"), 200, WebhookConfig),
    "an organisation's runner policy": (
        lambda ask: may_read_policy(ask).as_installation(
            "GET", f"/orgs/{OWNER}/actions/permissions/self-hosted-runners"
        ),
        200,
        SelfHostedRunnersSettings,
    ),
    "an organisation's selected-repositories policy": (
        lambda ask: (
            ask.fake.state.runner_policies.update({OWNER: "selected"}),
            may_read_policy(ask).as_installation(
                "GET", f"/orgs/{OWNER}/actions/permissions/self-hosted-runners"
            ),
        )[1],
        200,
        SelfHostedRunnersSettings,
    ),
    "an organisation's runner groups": (
        lambda ask: (
            ask.fake.state.add_runner_group(OWNER, 5),
            ask.as_installation("GET", f"/orgs/{OWNER}/actions/runner-groups"),
        )[1],
        200,
        OrgsOrgActionsRunnerGroupsGetResponse200,
    ),
    "a created runner group of selected repositories": (
        lambda ask: ask.as_installation(
            "POST",
            f"/orgs/{OWNER}/actions/runner-groups",
            {"name": "runner-pool-7", "visibility": "selected", "selected_repository_ids": [7]},
        ),
        201,
        RunnerGroupsOrg,
    ),
    "an installation's selected repositories": (
        lambda ask: selects_the_repository(ask).as_installation("GET", "/installation/repositories"),
        200,
        InstallationRepositoriesGetResponse200,
    ),
    "an updated runner group": (
        lambda ask: ask.as_installation(
            "PATCH",
            f"/orgs/{OWNER}/actions/runner-groups/"
            f"{ask.as_installation('POST', f'/orgs/{OWNER}/actions/runner-groups', {'name': 'g'}).body['id']}",
            {"name": "g", "visibility": "selected"},
        ),
        200,
        RunnerGroupsOrg,
    ),
    "installation token": (
        lambda ask: ask.as_app("POST", f"/app/installations/{INSTALLATION_ID}/access_tokens"),
        201,
        InstallationToken,
    ),
    "repository JIT config": (
        lambda ask: ask.as_installation("POST", f"{RUNNERS}/generate-jitconfig", JIT_BODY),
        201,
        OrgsOrgActionsRunnersGenerateJitconfigPostResponse201,  # githubkit's model for both scopes
    ),
    "organisation JIT config": (
        lambda ask: ask.as_installation("POST", f"{ORG_RUNNERS}/generate-jitconfig", JIT_BODY),
        201,
        OrgsOrgActionsRunnersGenerateJitconfigPostResponse201,
    ),
    "repository runners": (
        lambda ask: has_a_busy_runner(ask).as_installation("GET", RUNNERS),
        200,
        ReposOwnerRepoActionsRunnersGetResponse200,
    ),
    "organisation runners": (
        lambda ask: (
            ask.fake.state.register_runner(OrganizationScope(org=OWNER), "r", [run_key(1)]),
            ask.as_installation("GET", ORG_RUNNERS),
        )[1],
        200,
        OrgsOrgActionsRunnersGetResponse200,
    ),
    "hook deliveries": (
        lambda ask: (
            ask.fake.state.add_delivery("workflow_job", "queued", 502, installation_id=INSTALLATION_ID),
            ask.fake.state.add_delivery("ping", None, 200),
            ask.as_app("GET", "/app/hook/deliveries"),
        )[-1],
        200,
        list[HookDeliveryItem],
    ),
    "redelivery": (
        lambda ask: ask.as_app(
            "POST",
            f"/app/hook/deliveries/{ask.fake.state.add_delivery('ping', None, 0).delivery_id}/attempts",
        ),
        202,
        AppHookDeliveriesDeliveryIdAttemptsPostResponse202,
    ),
}


def run_attempt(ask: Asking, trigger: RunTrigger, attempt: int = 1) -> Answer:
    """GET a run attempt of a run started as `trigger` says."""
    run = ask.fake.actions.start_run(f"{OWNER}/{REPO}", "ci", [JobSpec("build", "ubuntu-latest")], trigger)
    return ask.as_installation("GET", f"/repos/{OWNER}/{REPO}/actions/runs/{run.run_id}/attempts/{attempt}")


SUCCESSES["a workflow run attempt"] = (lambda ask: run_attempt(ask, RunTrigger()), 200, WorkflowRun)
SUCCESSES["a fork's pull request's run attempt, by Dependabot"] = (
    lambda ask: run_attempt(
        ask, RunTrigger("pull_request", "dependabot[bot]", head_repository=f"someone/{REPO}")
    ),
    200,
    WorkflowRun,
)

REFUSALS: dict[str, tuple[Call, int, Any]] = {
    "a run attempt that does not exist": (lambda ask: run_attempt(ask, RunTrigger(), 2), 404, BasicError),
    "a run attempt GitHub cannot read": (
        lambda ask: run_attempt(ask, RunTrigger(read_fails=True)),
        503,
        BasicError,
    ),
    "token for an unknown installation": (
        lambda ask: ask.as_app("POST", "/app/installations/999/access_tokens"),
        404,
        BasicError,
    ),
    "token asked with a forged JWT": (
        lambda ask: ask.fake.handle(
            "POST",
            f"/app/installations/{INSTALLATION_ID}/access_tokens",
            {"Authorization": f"Bearer {app_jwt(generate_app_key(), ask.clock.now())}"},
        ),
        401,
        BasicError,
    ),
    "JIT config without runner_group_id": (
        lambda ask: ask.as_installation(
            "POST", f"{RUNNERS}/generate-jitconfig", {"name": "r", "labels": [run_key(1)]}
        ),
        422,
        ValidationErrorSimple,
    ),
    "JIT config without a name": (
        lambda ask: ask.as_installation(
            "POST", f"{RUNNERS}/generate-jitconfig", {"runner_group_id": 1, "labels": [run_key(1)]}
        ),
        422,
        ValidationErrorSimple,
    ),
    "JIT config for a name taken": (
        lambda ask: (
            ask.as_installation("POST", f"{RUNNERS}/generate-jitconfig", JIT_BODY),
            ask.as_installation("POST", f"{RUNNERS}/generate-jitconfig", JIT_BODY),
        )[1],
        409,
        BasicError,
    ),
    "runners of a repository outside the installation": (
        lambda ask: ask.as_installation("GET", f"/repos/someone-else/{REPO}/actions/runners"),
        404,
        BasicError,
    ),
    "runners asked with a bad token": (
        lambda ask: ask.fake.handle("GET", RUNNERS, {"Authorization": "token ghs_nonsense"}),
        401,
        BasicError,
    ),
    "deleting an unknown runner": (
        lambda ask: ask.as_installation("DELETE", f"{RUNNERS}/123456"),
        404,
        BasicError,
    ),
    "deleting a busy runner": (
        lambda ask: ask.as_installation("DELETE", f"{RUNNERS}/{busy_runner(ask)}"),
        422,
        ValidationErrorSimple,
    ),
    "a runner policy the installation may not read": (
        lambda ask: ask.as_installation("GET", f"/orgs/{OWNER}/actions/permissions/self-hosted-runners"),
        403,
        BasicError,
    ),
    "an unknown installation": (
        lambda ask: ask.as_app("GET", "/app/installations/123456"),
        404,
        BasicError,
    ),
    "redelivering an unknown delivery": (
        lambda ask: ask.as_app("POST", "/app/hook/deliveries/123456/attempts"),
        404,
        BasicError,
    ),
    "over the rate limit": (
        lambda ask: has_spent_its_rate_limit(ask).as_installation("GET", RUNNERS),
        403,
        BasicError,
    ),
}


@pytest.mark.parametrize("endpoint", SUCCESSES)
def test_each_answer_has_githubs_shape(ask: Asking, endpoint: str) -> None:
    # Given the fake
    call, status, shape = SUCCESSES[endpoint]

    # When it answers a request GitHub would grant
    answer = call(ask)

    # Then the answer is what GitHub's description says, and nothing else
    assert_shaped(answer, status, shape)


@pytest.mark.parametrize("refusal", REFUSALS)
def test_each_refusal_has_githubs_error_shape(ask: Asking, refusal: str) -> None:
    # Given the fake
    call, status, shape = REFUSALS[refusal]

    # When it refuses a request as GitHub would
    answer = call(ask)

    # Then the error is in the shape githubkit parses that endpoint's errors with
    assert_shaped(answer, status, shape)


def test_deleting_a_runner_answers_no_content(ask: Asking) -> None:
    # Given a registered runner
    runner = ask.fake.state.register_runner(REPOSITORY, "r", [run_key(1)])

    # When it is deleted
    answer = ask.as_installation("DELETE", f"{RUNNERS}/{runner.runner_id}")

    # Then GitHub's answer has no body
    assert (answer.status, answer.body) == (204, None)


def test_a_rate_limit_refusal_carries_githubs_rate_limit_headers(ask: Asking, clock: ManualClock) -> None:
    # Given an App over its rate limit for a minute
    ask.fake.state.exhaust_rate_limit(until=clock.now() + 60)

    # When a request comes
    answer = ask.as_installation("GET", RUNNERS)

    # Then the headers say none is left and when the limit resets, as githubkit reads them
    assert answer.headers["x-ratelimit-remaining"] == "0"
    assert int(answer.headers["x-ratelimit-reset"]) == int(clock.now() + 60)


def test_runner_pages_link_to_the_next_page_as_github_does(ask: Asking) -> None:
    # Given 5 runners
    for number in range(1, 6):
        ask.fake.state.register_runner(REPOSITORY, f"r{number}", [run_key(number)])

    # When the first page of 2 is asked for
    answer = ask.as_installation("GET", f"{RUNNERS}?per_page=2")

    # Then its Link header points to page 2, in the form githubkit's paginator follows
    match = re.search(NEXT_LINK_PATTERN, answer.headers["Link"])
    assert match is not None
    assert match.group(1).endswith(f"{RUNNERS}?per_page=2&page=2")
    assert answer.body["total_count"] == 5


def test_delivery_pages_link_to_the_next_page_by_cursor(ask: Asking) -> None:
    # Given 3 deliveries
    deliveries = [ask.fake.state.add_delivery("workflow_job", "queued", 200) for _ in range(3)]

    # When the first page of 2 is asked for, then the page its link names
    first = ask.as_app("GET", "/app/hook/deliveries?per_page=2")
    match = re.search(NEXT_LINK_PATTERN, first.headers["Link"])
    assert match is not None
    second = ask.as_app("GET", match.group(1).removeprefix(ask.fake.origin))

    # Then the pages hold the deliveries newest first, each once, and the last page links nowhere
    ids = [item["id"] for page in (first, second) for item in page.body]
    assert ids == [d.delivery_id for d in reversed(deliveries)]
    assert "Link" not in second.headers


GROUPS = f"/orgs/{OWNER}/actions/runner-groups"
GROUP_BODY = {"name": "runner-pool-7", "visibility": "selected", "selected_repository_ids": [7]}


def test_a_second_runner_group_of_the_same_name_is_refused_with_a_conflict(ask: Asking) -> None:
    # Given a runner group the organisation made
    assert ask.as_installation("POST", GROUPS, GROUP_BODY).status == 201

    # When another is created with its name
    answer = ask.as_installation("POST", GROUPS, GROUP_BODY)

    # Then it is refused as a conflict, and the organisation still has one group of that name
    assert answer.status == 409
    listed = ask.as_installation("GET", GROUPS).body["runner_groups"]
    assert [g["name"] for g in listed].count("runner-pool-7") == 1


def test_setting_a_groups_repositories_replaces_its_selection(ask: Asking) -> None:
    # Given a group that selects repository 7
    group = ask.as_installation("POST", GROUPS, GROUP_BODY).body["id"]

    # When its repositories are set to 8
    answer = ask.as_installation("PUT", f"{GROUPS}/{group}/repositories", {"selected_repository_ids": [8]})

    # Then GitHub answers with no content, and the group selects 8 only
    assert (answer.status, answer.body) == (204, None)
    assert ask.fake.state.runner_groups[group].selected_repository_ids == {8}


def test_a_group_of_visibility_all_takes_no_list_of_repositories(ask: Asking) -> None:
    # Given a group every repository of the organisation may use
    group = ask.as_installation("POST", GROUPS, {"name": "runner-pool-all"}).body["id"]
    # When its repositories are set / Then GitHub refuses: the list is a selected group's
    answer = ask.as_installation("PUT", f"{GROUPS}/{group}/repositories", {"selected_repository_ids": [8]})
    assert answer.status == 422
    assert ask.fake.state.runner_groups[group].visibility == "all"


def test_creating_a_runner_group_needs_the_organisations_self_hosted_runners_write(ask: Asking) -> None:
    # Given an installation that may only read the organisation's self-hosted runners
    ask.fake.state.installations[INSTALLATION_ID].permissions["organization_self_hosted_runners"] = "read"

    # When it creates a runner group
    answer = ask.as_installation("POST", GROUPS, GROUP_BODY)

    # Then GitHub refuses it, and no group was made
    assert answer.status == 403
    assert ask.fake.state.groups_of(OWNER) == []
