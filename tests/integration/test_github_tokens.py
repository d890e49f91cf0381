"""Installation tokens narrowed to each concern's permissions, against the fake GitHub over real HTTP, and
the token function's answers as its callers see them."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from emulator.fake_github import FakeGitHub, JobSpec
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_answers import AppRequest, answer
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.github_token_function import TokenFunction
from runner_pool.domain.clock import Epoch, ManualClock
from runner_pool.domain.github_tokens import RUN_READS, InstallationToken, Permissions
from runner_pool.domain.runner_scope import RepositoryScope
from runner_pool.domain.runners import FailedDelivery, GitHubForbiddenError, GitHubRejectedError
from tests.support.builders import run_key

REPOSITORY = RepositoryScope(owner=OWNER, repo=REPO)
TOKEN_FUNCTION = "runner-pool-GitHubToken"


@pytest.fixture
def key(fake: FakeGitHub, app_key: AppKey, clock: ManualClock) -> Iterator[GitHubAppKey]:
    holder = GitHubAppKey(APP_ID, app_key.private_pem, INSTALLATION_ID, base_url=fake.url, clock=clock)
    yield holder
    holder.close()


class InvokedLambda:
    """A Lambda client whose Invoke runs the token function's answer in this process, in the shape
    botocore gives Invoke's answer (`Payload` a stream); it records what it was asked."""

    def __init__(self, key: GitHubAppKey) -> None:
        self._key = key
        self.asked: list[dict[str, Any]] = []

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> dict[str, Any]:  # noqa: N803
        assert (FunctionName, InvocationType) == (TOKEN_FUNCTION, "RequestResponse")
        self.asked.append(json.loads(Payload))
        answered = answer(self._key, AppRequest.model_validate_json(Payload))
        return {"StatusCode": 200, "Payload": io.BytesIO(answered.model_dump_json().encode())}


class RunReadsOnly:
    """An identity that hands out `actions: read` tokens whatever it is asked for."""

    def __init__(self, key: GitHubAppKey) -> None:
        self._key = key

    @property
    def installation_id(self) -> int:
        return self._key.installation_id

    def installation_token(self, permissions: Permissions | None) -> InstallationToken:
        return self._key.installation_token(RUN_READS)

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        return self._key.failed_deliveries(since)

    def redeliver(self, delivery_id: int) -> None:
        self._key.redeliver(delivery_id)


def test_a_token_for_run_reads_cannot_register_a_runner(
    fake: FakeGitHub, key: GitHubAppKey, clock: ManualClock
) -> None:
    # Given a client whose tokens may only read runs
    github = GitHubApp(RunReadsOnly(key), REPOSITORY, base_url=fake.url, clock=clock)

    # When it asks GitHub to register a runner
    with pytest.raises(GitHubForbiddenError, match="Resource not accessible by integration"):
        github.jit_config("i-0abc-1", [run_key(1)])
    github.close()

    # Then GitHub refused it, having issued only a run-reading token, and no runner exists
    assert fake.state.token_permissions == [{"actions": "read"}]
    assert not fake.state.runners


def test_each_concern_asks_for_its_own_permissions_once(
    fake: FakeGitHub, key: GitHubAppKey, clock: ManualClock
) -> None:
    # Given a client over the token function, registering repository runners
    lambdas = InvokedLambda(key)
    github = GitHubApp(
        TokenFunction(TOKEN_FUNCTION, INSTALLATION_ID, lambdas), REPOSITORY, base_url=fake.url, clock=clock
    )
    run = fake.actions.start_run(f"{OWNER}/{REPO}", "ci", [JobSpec("build", "ubuntu-latest")])

    # When it registers two runners, lists them, and reads a run's jobs twice
    github.jit_config("i-0abc-1", [run_key(1)])
    github.jit_config("i-0abc-2", [run_key(2)])
    github.runners()
    github.run_jobs(f"{OWNER}/{REPO}", run.run_id, 1)
    github.run_jobs(f"{OWNER}/{REPO}", run.run_id, 1)
    github.close()

    # Then it asked the token function twice, once per concern, each narrowed to what it needs
    assert lambdas.asked == [
        {"permissions": {"administration": "write"}},
        {"permissions": {"actions": "read"}},
    ]
    assert fake.state.token_permissions == [{"administration": "write"}, {"actions": "read"}]


def test_a_token_beyond_the_installations_grant_is_refused_as_github_refused_it(
    fake: FakeGitHub, key: GitHubAppKey
) -> None:
    # Given the token function's caller
    function = TokenFunction(TOKEN_FUNCTION, INSTALLATION_ID, InvokedLambda(key))

    # When it asks for a permission the installation was never granted
    # Then GitHub's refusal reaches it as the same error of ours, and no token was issued
    with pytest.raises(GitHubRejectedError) as refused:
        function.installation_token({"contents": "write"})
    assert refused.value.status == 422
    assert fake.state.token_permissions == []


def test_the_token_function_refuses_a_request_for_every_permission() -> None:
    # Given a request whose permissions name nothing (GitHub would grant all the installation has)
    # When it is read / Then it is refused before GitHub is asked
    with pytest.raises(ValueError, match="at least one permission"):
        AppRequest.model_validate({"permissions": {}})
