"""The GitHub App client against the fake GitHub over real HTTP: tokens, JIT runners, runners, deliveries, errors."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from emulator.fake_github import FakeGitHub, JobSpec, decode_jit_config
from emulator.fake_github.payloads import HEAD_SHA
from emulator.fake_github.state import RunTrigger
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey, generate_app_key
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_auth import TOKEN_REFRESH_MARGIN_SECONDS
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.github_runner_groups import INSTANT_RUNNER_GROUP, runner_group_name
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.instant import TierGroupAccess
from runner_pool.domain.runner_scope import OrganizationScope, Registration, RepositoryScope, RunnerScope
from runner_pool.domain.runners import (
    GitHubAuthError,
    GitHubError,
    GitHubNotFoundError,
    GitHubRateLimitedError,
    GitHubRejectedError,
    GitHubRetryableError,
    GitHubUnavailableError,
    RepositoryUnknownError,
    RunnerRemoval,
    RunnerStatus,
    refused_for_good,
)
from runner_pool.domain.trust import RunFacts, TrustLevel, run_trust
from tests.support.builders import run_key
from tests.support.racing import at_once
from tests.support.waiting import eventually

REPOSITORY = RepositoryScope(owner=OWNER, repo=REPO)
ORGANIZATION = OrganizationScope(org=OWNER)
TOKEN_LIFETIME = 3600.0
JIT_ROUTE = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"
RUNNERS_ROUTE = "GET /repos/{owner}/{repo}/actions/runners"
DELIVERIES_ROUTE = "GET /app/hook/deliveries"

Connect = Callable[..., GitHubApp]


@pytest.fixture
def connect(fake: FakeGitHub, app_key: AppKey, clock: ManualClock) -> Iterator[Connect]:
    """Clients of the fake's App installation; by default for the repository, on the fake's clock."""
    clients: list[GitHubApp] = []

    def client(
        scope: RunnerScope = REPOSITORY,
        *,
        private_key: str = app_key.private_pem,
        client_clock: ManualClock = clock,
        base_url: str | None = None,
        api_version: str | None = None,
        registration: Registration = Registration.REPOSITORY,
    ) -> GitHubApp:
        url = base_url or fake.url
        identity = GitHubAppKey(
            APP_ID, private_key, INSTALLATION_ID, base_url=url, api_version=api_version, clock=client_clock
        )
        app = GitHubApp(
            identity,
            scope,
            base_url=url,
            api_version=api_version,
            clock=client_clock,
            registration=registration,
        )
        clients.append(app)
        return app

    yield client
    for app in clients:
        app.close()


@pytest.fixture
def github(connect: Connect) -> GitHubApp:
    return connect()


# --- the installation token ------------------------------------------------------------------------


def test_one_installation_token_serves_many_calls(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a client that has not called GitHub yet
    # When it registers a runner, lists runners and deletes the runner
    runner = github.jit_config("runner-1", [run_key(1)])
    github.runners()
    github.delete_runner(runner.runner_id)

    # Then GitHub was asked for an installation token once
    assert fake.state.token_requests == 1


def test_the_token_is_kept_until_shortly_before_it_expires(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given a token issued for an hour
    github.runners()

    # When a call comes just before the refresh margin begins
    clock.advance(TOKEN_LIFETIME - TOKEN_REFRESH_MARGIN_SECONDS - 1)
    github.runners()

    # Then it still uses the first token
    assert fake.state.token_requests == 1


def test_a_new_token_is_requested_once_the_cached_one_nears_expiry(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given a token issued for an hour
    github.runners()

    # When calls come once the refresh margin has begun
    clock.advance(TOKEN_LIFETIME - TOKEN_REFRESH_MARGIN_SECONDS)
    github.runners()
    github.runners()

    # Then one new token serves them
    assert fake.state.token_requests == 2


def test_a_token_github_no_longer_accepts_is_replaced_on_the_spot(
    github: GitHubApp, fake: FakeGitHub
) -> None:
    # Given a cached token that GitHub has since revoked
    github.runners()
    fake.state.revoke_tokens()

    # When the client calls again
    runner = github.jit_config("runner-1", [run_key(1)])

    # Then the call succeeds with a new token
    assert runner.runner_id in fake.state.runners
    assert fake.state.token_requests == 2


def test_concurrent_first_calls_share_one_token_request(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a client without a token, and eight threads ready to call at once
    start = threading.Barrier(8)
    failures: list[BaseException] = []

    def call() -> None:
        start.wait()
        try:
            github.runners()
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    # When they all call
    at_once(*[call] * 8)

    # Then one token request served all of them
    assert failures == []
    assert fake.state.token_requests == 1


def test_calls_reuse_one_connection(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a client
    # When it makes several calls, one after the other
    for number in range(1, 4):
        github.jit_config(f"runner-{number}", [run_key(number)])
    github.runners()

    # Then they all went over one connection (no new handshake per call), beside the one the key's holder
    # asked for the token on (in the stack, the token function's own)
    assert fake.state.connections == 2


# --- JIT runners ---------------------------------------------------------------------------------


def test_jit_config_for_a_repository_registers_the_run_key_in_the_default_group(
    github: GitHubApp, fake: FakeGitHub
) -> None:
    # Given a client for a repository's runners
    label = run_key(7, "/class=xlarge")

    # When it asks for a JIT runner with the run key as its one label
    runner = github.jit_config("i-0abc-7", [label])

    # Then GitHub registered that runner, in the Default group, with the run key as its label
    registered = fake.state.runners[runner.runner_id]
    assert registered.scope == REPOSITORY
    assert registered.runner_group_id == 1
    assert [label.name for label in registered.labels if label.type == "custom"] == [label]
    # and the config is that runner's
    assert decode_jit_config(runner.encoded_jit_config)[".runner"]["AgentId"] == runner.runner_id


def test_jit_config_for_an_organisation_registers_in_the_group_asked_for(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given a client for an organisation's runners, whose organisation has runner group 7
    fake.state.add_runner_group(OWNER, 7)
    github = connect(ORGANIZATION)

    # When it asks for a JIT runner in group 7
    runner = github.jit_config("i-0abc-7", [run_key(7)], runner_group_id=7, work_folder="work")

    # Then GitHub registered an organisation runner in group 7
    registered = fake.state.runners[runner.runner_id]
    assert registered.scope == ORGANIZATION
    assert registered.runner_group_id == 7
    assert registered.work_folder == "work"


def test_an_organisation_installation_registers_each_runner_at_its_jobs_repository(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given a client of the App installed on the organisation
    github = connect(ORGANIZATION)

    # When it asks for a JIT runner for a job of one of the organisation's repositories (issue 14)
    runner = github.jit_config("i-0abc-8", [run_key(8)], repository=f"{OWNER}/lib")

    # Then GitHub registered it at that repository, not at the organisation, so only its jobs can take it
    registered = fake.state.runners[runner.runner_id]
    assert registered.scope == RepositoryScope(owner=OWNER, repo="lib")
    assert registered.serves(f"{OWNER}/lib")
    assert not registered.serves(f"{OWNER}/{REPO}")
    # And it is listed, and deleted, there
    assert [r.runner_id for r in github.runners(f"{OWNER}/lib")] == [runner.runner_id]
    assert github.runners() == []
    assert github.delete_runner(runner.runner_id, f"{OWNER}/lib") is RunnerRemoval.DELETED


def test_a_runner_group_registration_puts_the_runner_in_a_group_of_its_repository_alone(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given a client that registers by runner group, for an installation without repository
    # administration (issue 36, item 5)
    fake.state.installations[INSTALLATION_ID].permissions.pop("administration")
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)
    lib = f"{OWNER}/lib"
    lib_id = fake.state.repository_id(lib)

    # When it asks twice for a runner for jobs of one repository
    first = github.jit_config("i-0abc-1", [run_key(1)], repository=lib, repository_id=lib_id)
    second = github.jit_config("i-0abc-2", [run_key(2)], repository=lib, repository_id=lib_id)

    # Then both are organisation runners in one group, created once, that selects that repository only
    [group] = fake.state.groups_of(OWNER)
    assert (group.name, group.visibility, group.selected_repository_ids) == (
        runner_group_name(lib_id),
        "selected",
        {lib_id},
    )
    assert group.allows_public_repositories is False
    for runner in (first, second):
        registered = fake.state.runners[runner.runner_id]
        assert (registered.scope, registered.runner_group_id) == (ORGANIZATION, group.runner_group_id)
    assert fake.state.calls["POST /orgs/{org}/actions/runner-groups"] == 1
    # And it is deleted at the organisation
    assert github.delete_runner(first.runner_id, lib) is RunnerRemoval.DELETED


def test_a_runner_group_registration_finds_a_group_another_client_made(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given a repository's group that another client (another Lambda environment) created
    lib = f"{OWNER}/lib"
    lib_id = fake.state.repository_id(lib)
    connect(ORGANIZATION, registration=Registration.RUNNER_GROUP).jit_config(
        "i-0abc-1", [run_key(1)], repository=lib, repository_id=lib_id
    )

    # When a fresh client registers a runner for the same repository
    runner = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP).jit_config(
        "i-0abc-2", [run_key(2)], repository=lib, repository_id=lib_id
    )

    # Then it uses that group, and no second one was made
    [group] = fake.state.groups_of(OWNER)
    assert fake.state.runners[runner.runner_id].runner_group_id == group.runner_group_id


def test_a_runner_group_registration_that_loses_the_race_to_create_uses_the_winners_group(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given a client that looked for the repository's group before another made it: the group is
    # created between its look and its create
    lib = f"{OWNER}/lib"
    lib_id = fake.state.repository_id(lib)
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)
    looks = 0
    groups = github._runners._groups
    assert groups is not None
    find = groups._find

    def look_then_lose(name: str) -> int | None:
        nonlocal looks
        looks += 1
        found = find(name)
        if looks == 1:
            fake.state.add_runner_group(
                OWNER, 4242, name, visibility="selected", selected_repository_ids={lib_id}
            )
        return found

    groups._find = look_then_lose  # type: ignore[method-assign]

    # When it registers a runner for the repository
    runner = github.jit_config("i-0abc-3", [run_key(3)], repository=lib, repository_id=lib_id)

    # Then its create met 409 and it used the other's group
    assert fake.state.runners[runner.runner_id].runner_group_id == 4242
    assert [g.runner_group_id for g in fake.state.groups_of(OWNER)] == [4242]


@pytest.mark.parametrize("given", [{}, {"repository": f"{OWNER}/lib"}])
def test_a_runner_group_registration_without_a_repository_and_its_id_is_refused(
    connect: Connect, fake: FakeGitHub, given: dict[str, str]
) -> None:
    # Given a client that registers by runner group
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)

    # When it is asked for a runner without the job's repository or its id / Then it refuses, and
    # registers nothing at the organisation
    with pytest.raises(RepositoryUnknownError, match="repository"):
        github.jit_config("i-0abc-4", [run_key(4)], **given)
    assert fake.state.runners == {}


def test_a_repository_runner_can_join_only_the_default_group(connect: Connect, fake: FakeGitHub) -> None:
    # Given an organisation with runner group 7, and an App installed on it
    fake.state.add_runner_group(OWNER, 7)
    github = connect(ORGANIZATION)
    # When a runner is asked for at one of its repositories in group 7 / Then GitHub refuses it: runner
    # groups are the organisation's ("About runner groups"), a repository has the Default group only
    with pytest.raises(GitHubRejectedError):
        github.jit_config("i-0abc-6", [run_key(6)], runner_group_id=7, repository=f"{OWNER}/lib")
    assert fake.state.runners == {}


def test_a_repository_runner_is_offered_only_its_repositorys_jobs(connect: Connect, fake: FakeGitHub) -> None:
    # Given a runner registered at repository lib, and a queued job of repository app that carries
    # exactly its labels (it copied lib's run's pool= label)
    github = connect(ORGANIZATION)
    label = run_key(5)
    runner = github.jit_config("i-0abc-5", [label], repository=f"{OWNER}/lib")
    fake.actions.start_run(f"{OWNER}/{REPO}", "copycat", [JobSpec("copycat", label)])
    # When the runner asks GitHub for work / Then it is offered nothing ("Adding self-hosted runners":
    # a repository's runner is that repository's alone)
    assert fake.actions.offer(fake.state.runners[runner.runner_id]) is None
    # And a job of lib with those labels is offered to it
    lib_run = fake.actions.start_run(f"{OWNER}/lib", "build", [JobSpec("build", label)])
    offered = fake.actions.offer(fake.state.runners[runner.runner_id])
    assert offered is not None
    assert offered.run_id == lib_run.run_id


@pytest.mark.parametrize(
    ("scope", "repository"), [(ORGANIZATION, "someone-else/lib"), (REPOSITORY, f"{OWNER}/other")]
)
def test_a_runner_for_a_repository_outside_the_apps_scope_is_refused(
    connect: Connect, fake: FakeGitHub, scope: RunnerScope, repository: str
) -> None:
    # Given a client of one scope / When asked for a runner at a repository outside it
    with pytest.raises(ValueError, match="outside the App's runner scope"):
        connect(scope).jit_config("i-0abc-9", [run_key(9)], repository=repository)
    # Then nothing was registered
    assert fake.state.runners == {}


def test_asking_again_for_a_name_replaces_the_earlier_registration(
    github: GitHubApp, fake: FakeGitHub
) -> None:
    # Given a runner registered under a name, whose config the caller then lost
    first = github.jit_config("i-0abc-7", [run_key(7)])

    # When the caller asks again for the same name
    second = github.jit_config("i-0abc-7", [run_key(7)])

    # Then it gets a new registration, and only that one is left
    assert second.runner_id != first.runner_id
    assert [r.runner_id for r in fake.state.runners_in(REPOSITORY, "i-0abc-7")] == [second.runner_id]


def test_a_name_held_by_a_busy_runner_is_not_replaced(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a runner of that name running a job
    first = github.jit_config("i-0abc-7", [run_key(7)])
    fake.state.set_runner_state(first.runner_id, online=True, busy=True)

    # When the caller asks for the name again
    with pytest.raises(GitHubRejectedError) as refused:
        github.jit_config("i-0abc-7", [run_key(7)])

    # Then it is refused as a conflict and the busy runner stays
    assert refused.value.status == 409
    assert first.runner_id in fake.state.runners


# --- deleting runners ----------------------------------------------------------------------------


def test_delete_removes_the_runner(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a registered runner
    runner = github.jit_config("i-0abc-7", [run_key(7)])

    # When it is deleted
    outcome = github.delete_runner(runner.runner_id)

    # Then GitHub no longer has it
    assert outcome is RunnerRemoval.DELETED
    assert runner.runner_id not in fake.state.runners


def test_deleting_a_runner_already_gone_is_a_normal_outcome(github: GitHubApp) -> None:
    # Given a runner that GitHub already removed (a JIT runner after its job)
    runner = github.jit_config("i-0abc-7", [run_key(7)])
    github.delete_runner(runner.runner_id)

    # When it is deleted again
    outcome = github.delete_runner(runner.runner_id)

    # Then that is reported, not raised
    assert outcome is RunnerRemoval.ALREADY_GONE


def test_deleting_a_busy_runner_reports_it_busy_and_keeps_it(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a runner running a job
    runner = github.jit_config("i-0abc-7", [run_key(7)])
    fake.state.set_runner_state(runner.runner_id, online=True, busy=True)

    # When it is deleted
    outcome = github.delete_runner(runner.runner_id)

    # Then GitHub refused, and the outcome says why
    assert outcome is RunnerRemoval.BUSY
    assert runner.runner_id in fake.state.runners


# --- listing runners -----------------------------------------------------------------------------


def test_runners_reads_every_page(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given 250 of our runners, more than two pages of 100
    for number in range(1, 251):
        fake.state.register_runner(REPOSITORY, f"runner-{number}", [run_key(number)])

    # When the client lists runners
    runners = github.runners()

    # Then it has read all three pages
    assert sorted(runner.name for runner in runners) == sorted(f"runner-{n}" for n in range(1, 251))
    assert fake.state.calls[RUNNERS_ROUTE] == 3


def test_runners_lists_only_ours_with_their_status(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given our runners offline, online and busy, and a runner of someone else's
    offline = fake.state.register_runner(REPOSITORY, "offline", [run_key(1)])
    online = fake.state.register_runner(REPOSITORY, "online", [run_key(2)])
    busy = fake.state.register_runner(REPOSITORY, "busy", [run_key(3)])
    fake.state.register_runner(REPOSITORY, "theirs", ["gpu"])
    fake.state.set_runner_state(online.runner_id, online=True)
    fake.state.set_runner_state(busy.runner_id, online=True, busy=True)

    # When the client lists runners
    runners = {runner.name: runner for runner in github.runners()}

    # Then it sees exactly ours, each with its status and run key
    assert {name: runner.status for name, runner in runners.items()} == {
        "offline": RunnerStatus.OFFLINE,
        "online": RunnerStatus.ONLINE,
        "busy": RunnerStatus.BUSY,
    }
    assert runners["offline"].run_key == run_key(1)
    assert runners["offline"].runner_id == offline.runner_id


# --- webhook deliveries --------------------------------------------------------------------------


def test_failed_deliveries_lists_each_undelivered_event_once_oldest_first(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given, within the last hour: an event delivered; one that failed twice; one that failed and
    # was then redelivered; one that failed last
    since = clock.now()
    clock.advance(60)
    state = fake.state
    state.add_delivery("workflow_job", "queued", 200)
    twice = state.add_delivery("workflow_job", "queued", 502)
    clock.advance(60)
    recovered = state.add_delivery("workflow_run", "completed", 0)
    state.add_delivery("workflow_job", "queued", 504, guid=twice.guid, redelivery=True)
    state.add_delivery("workflow_run", "completed", 200, guid=recovered.guid, redelivery=True)
    clock.advance(60)
    last = state.add_delivery("workflow_job", "completed", 500)

    # When the client asks for failed deliveries since then
    failed = github.failed_deliveries(since)

    # Then it gets the latest attempt of each event still undelivered, oldest first
    assert [(d.guid, d.status_code) for d in failed] == [(twice.guid, 504), (last.guid, 500)]
    assert failed[0].event == "workflow_job"
    assert failed[0].action == "queued"


def test_failed_deliveries_are_found_on_later_pages(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given a failed delivery followed by 150 successful ones (newest first, it is on page two)
    since = clock.now()
    failed_one = fake.state.add_delivery("workflow_job", "queued", 502)
    for _ in range(150):
        fake.state.add_delivery("workflow_job", "completed", 200)

    # When the client asks for failed deliveries
    failed = github.failed_deliveries(since)

    # Then it found it behind GitHub's cursor
    assert [d.delivery_id for d in failed] == [failed_one.delivery_id]
    assert fake.state.calls[DELIVERIES_ROUTE] == 2


def test_failed_deliveries_stops_reading_once_it_reaches_since(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given 250 failed deliveries of the day before, and one failed in the last hour
    for _ in range(250):
        fake.state.add_delivery("workflow_job", "queued", 502)
    clock.advance(86_400)
    since = clock.now() - 3600
    recent = fake.state.add_delivery("workflow_job", "queued", 502)

    # When the client asks for failed deliveries of the last hour
    failed = github.failed_deliveries(since)

    # Then it reads only the first page, and lists only the recent one
    assert [d.delivery_id for d in failed] == [recent.delivery_id]
    assert fake.state.calls[DELIVERIES_ROUTE] == 1


def test_redeliver_asks_github_to_deliver_the_event_again(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given a failed delivery
    since = clock.now()
    failed = fake.state.add_delivery("workflow_job", "queued", 502)

    # When the client asks for it to be redelivered
    github.redeliver(failed.delivery_id)

    # Then GitHub attempted it again (it answers before the attempt, which may come a moment later), and
    # the event is no longer failed
    assert fake.state.redelivery_requests == [failed.delivery_id]
    eventually(lambda: github.failed_deliveries(since) == [], "the redelivery's attempt")


# --- refusals and failures -----------------------------------------------------------------------


def test_an_app_jwt_signed_with_another_key_is_refused(connect: Connect, fake: FakeGitHub) -> None:
    # Given a client holding a key that is not the App's
    forger = connect(private_key=generate_app_key().private_pem)

    # When it calls GitHub
    with pytest.raises(GitHubAuthError) as refused:
        forger.jit_config("i-0abc-7", [run_key(7)])

    # Then its token request was refused as unauthenticated, and nothing was registered
    assert refused.value.status == 401
    assert fake.state.token_requests == 1
    assert fake.state.runners == {}


def test_an_expired_app_jwt_is_refused(connect: Connect, fake: FakeGitHub, clock: ManualClock) -> None:
    # Given a client whose clock is an hour slow, so its JWTs expired before they were sent
    late = connect(client_clock=ManualClock(clock.now() - 3600))

    # When it calls GitHub
    # Then the token request is refused as unauthenticated
    with pytest.raises(GitHubAuthError, match="Expiration time"):
        late.runners()


def test_a_rate_limit_is_a_retryable_error_carrying_the_wait(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given an App over its rate limit for the next two minutes
    github.runners()
    fake.state.exhaust_rate_limit(until=clock.now() + 120)

    # When the client calls GitHub
    with pytest.raises(GitHubRateLimitedError) as limited:
        github.jit_config("i-0abc-7", [run_key(7)])

    # Then the error says to retry, and when (on the client's clock, from GitHub's reset time)
    assert isinstance(limited.value, GitHubRetryableError)
    assert limited.value.retry_after_seconds == 120


def test_a_missing_permission_is_forbidden(connect: Connect, fake: FakeGitHub) -> None:
    # Given an installation whose App may manage repository runners but not organisation runners
    fake.state.add_installation(INSTALLATION_ID, OWNER, permissions={"administration": "write"})
    github = connect(ORGANIZATION)

    # When it asks for an organisation runner
    # Then GitHub refuses the token it needs for that, narrowed to a permission the installation has not
    # got, for good: no retry will change it
    with pytest.raises(GitHubRejectedError) as refused:
        github.jit_config("i-0abc-7", [run_key(7)])
    assert refused.value.status == 422
    assert refused_for_good(refused.value)


def test_a_repository_the_installation_cannot_see_is_not_found(connect: Connect) -> None:
    # Given a client for a repository outside the installation's account
    github = connect(RepositoryScope(owner="someone-else", repo=REPO))

    # When it asks for a runner there
    # Then GitHub answers not found
    with pytest.raises(GitHubNotFoundError):
        github.jit_config("i-0abc-7", [run_key(7)])


def test_an_unknown_runner_group_is_rejected(github: GitHubApp) -> None:
    # Given a client
    # When it asks for a runner in a group the repository does not have
    with pytest.raises(GitHubRejectedError) as rejected:
        github.jit_config("i-0abc-7", [run_key(7)], runner_group_id=99)

    # Then GitHub rejects the request as invalid
    assert rejected.value.status == 422


def test_an_unreachable_github_is_a_retryable_error(connect: Connect) -> None:
    # Given a base URL where nothing listens
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    github = connect(base_url=f"http://127.0.0.1:{port}/")

    # When the client calls
    # Then it is told GitHub is unavailable, worth a retry
    with pytest.raises(GitHubUnavailableError):
        github.runners()


# --- GitHub Enterprise Server --------------------------------------------------------------------


def test_an_enterprise_server_is_reached_below_its_api_path_with_its_api_version(
    app_key: AppKey, clock: ManualClock
) -> None:
    # Given a GitHub Enterprise Server: the API below /api/v3, answering only the 2022-11-28 version
    with FakeGitHub(
        APP_ID, app_key.public_pem, clock=clock, path_prefix="/api/v3", api_versions=("2022-11-28",)
    ) as server:
        server.state.add_installation(INSTALLATION_ID, OWNER)
        for number in range(1, 151):
            server.state.register_runner(REPOSITORY, f"runner-{number}", [run_key(number)])
        identity = GitHubAppKey(
            APP_ID,
            app_key.private_pem,
            INSTALLATION_ID,
            base_url=server.url,
            api_version="2022-11-28",
            clock=clock,
        )
        github = GitHubApp(identity, REPOSITORY, base_url=server.url, api_version="2022-11-28", clock=clock)

        # When the client registers a runner and lists runners over two pages
        runner = github.jit_config("i-0abc-7", [run_key(7)])
        runners = github.runners()
        github.close()

    # Then both worked against the server's paths and version
    assert server.url.endswith("/api/v3/")
    assert runner.runner_id in {r.runner_id for r in runners}
    assert len(runners) == 151


# --- a workflow run attempt (adapters/github_runs.py) -----------------------------------------------


def test_a_run_attempt_read_gives_what_its_level_is_decided_from(fake: FakeGitHub, connect: Connect) -> None:
    # Given a fork's pull request run by Dependabot, re-run by a maintainer
    trigger = RunTrigger("pull_request", "dependabot[bot]", "maintainer", head_repository=f"someone/{REPO}")
    run = fake.actions.start_run(f"{OWNER}/{REPO}", "ci", [JobSpec("build", "ubuntu-latest")], trigger)
    # When its attempt is read through the App's client
    facts = connect().run_attempt(f"{OWNER}/{REPO}", run.run_id, 1)
    # Then it says what GitHub said, and the level decided from it is untrusted
    assert facts == RunFacts(
        f"{OWNER}/{REPO}", "pull_request", "dependabot[bot]", "maintainer", f"someone/{REPO}"
    )
    assert run_trust(facts) is TrustLevel.UNTRUSTED


@pytest.mark.parametrize("fault", ["unreadable", "unknown-attempt"])
def test_a_run_attempt_github_does_not_give_is_a_github_error(
    fake: FakeGitHub, connect: Connect, fault: str
) -> None:
    # Given a run GitHub cannot read now, or an attempt it never had
    trigger = RunTrigger(read_fails=fault == "unreadable")
    run = fake.actions.start_run(f"{OWNER}/{REPO}", "ci", [JobSpec("build", "ubuntu-latest")], trigger)
    attempt = 2 if fault == "unknown-attempt" else 1
    # When it is read / Then the product's own error comes out (the dispatcher then serves single use)
    with pytest.raises(GitHubError):
        connect().run_attempt(f"{OWNER}/{REPO}", run.run_id, attempt)


# --- the instant tier's runner group -------------------------------------------------------------------


def test_the_tier_group_of_an_installation_on_selected_repositories_admits_exactly_those(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given an organisation installation on two selected repositories, registering by runner group
    app, lib = f"{OWNER}/app", f"{OWNER}/lib"
    fake.state.installations[INSTALLATION_ID].repositories = {app, lib}
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)
    # When a tier runner is registered before the group exists
    runner = github.jit_config("i-0abc-1", ["pool=instant/class=large"], instant=True)
    # Then the group was created `selected`, with exactly the installation's repositories
    [group] = fake.state.groups_of(OWNER)
    assert (group.name, group.visibility) == (INSTANT_RUNNER_GROUP, "selected")
    assert group.selected_repository_ids == {fake.state.repository_id(app), fake.state.repository_id(lib)}
    assert fake.state.runners[runner.runner_id].runner_group_id == group.runner_group_id


def test_the_tier_group_follows_the_installations_repositories_both_ways(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given a tier group made while the installation covered every repository
    installation = fake.state.installations[INSTALLATION_ID]
    app, lib = f"{OWNER}/app", f"{OWNER}/lib"
    fake.state.repository_id(app)
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)
    assert github.keep_instant_group_in_step() == TierGroupAccess(None)
    [group] = fake.state.groups_of(OWNER)
    assert group.visibility == "all"
    # When the owner selects one repository, and the group is brought in step
    installation.repositories = {lib}
    access = github.keep_instant_group_in_step()
    # Then the group selects exactly that repository
    lib_id = fake.state.repository_id(lib)
    assert access == TierGroupAccess(frozenset({lib_id}))
    assert (group.visibility, group.selected_repository_ids) == ("selected", {lib_id})
    # And when the selection changes, and again when it is every repository, the group follows
    installation.repositories = {app}
    github.keep_instant_group_in_step()
    assert group.selected_repository_ids == {fake.state.repository_id(app)}
    installation.repositories = None
    github.keep_instant_group_in_step()
    assert group.visibility == "all"
    assert len(fake.state.groups_of(OWNER)) == 1


def test_an_installation_on_all_repositories_is_read_in_one_request(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given an installation on every repository of an organisation with more than a page of them
    for number in range(250):
        fake.state.repository_id(f"{OWNER}/repo-{number}")
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)
    # When the tier group is kept in step / Then its answer's first page said enough
    assert github.keep_instant_group_in_step() == TierGroupAccess(None)
    assert fake.state.calls["GET /installation/repositories"] == 1


def test_a_selection_longer_than_a_page_is_read_whole(connect: Connect, fake: FakeGitHub) -> None:
    # Given an installation selecting more repositories than a page holds
    selected = {f"{OWNER}/repo-{number}" for number in range(150)}
    fake.state.installations[INSTALLATION_ID].repositories = selected
    github = connect(ORGANIZATION, registration=Registration.RUNNER_GROUP)
    # When the tier group is kept in step / Then every page was read, and the group selects them all
    access = github.keep_instant_group_in_step()
    assert access == TierGroupAccess(frozenset(fake.state.repository_id(name) for name in selected))
    assert fake.state.calls["GET /installation/repositories"] == 2


def test_a_repository_scope_has_no_tier_group_to_keep(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given a client for one repository's runners / When asked to keep the tier group in step
    # Then there is none, and GitHub was not asked
    assert github.keep_instant_group_in_step() is None
    assert not fake.state.calls["GET /installation/repositories"]


# --- check runs: why a job waits for capacity ------------------------------------------------------

CHECKS_REPOSITORY = f"{OWNER}/{REPO}"


def test_a_check_run_is_created_in_progress_on_the_commit_and_completed(
    connect: Connect, fake: FakeGitHub
) -> None:
    # Given an installation that may write checks (the fake App's permissions, as installed by default)
    github = connect()
    # When the control plane creates a check run on a commit
    check_run = github.create_check_run(
        CHECKS_REPOSITORY,
        head_sha=HEAD_SHA,
        name="runner-pool: waiting",
        title="`build` waits",
        summary="EC2 ...",
    )
    # Then GitHub holds it in progress, with its output, on that commit
    created = dict(fake.state.check_runs[check_run.check_run_id])
    assert (created["name"], created["head_sha"], created["status"], created["conclusion"]) == (
        "runner-pool: waiting",
        HEAD_SHA,
        "in_progress",
        None,
    )
    assert created["output"]["title"] == "`build` waits"
    # When it is completed / Then it is, with its conclusion and last word
    github.complete_check_run(
        CHECKS_REPOSITORY, check_run, conclusion="success", title="back", summary="served"
    )
    completed = fake.state.check_runs[check_run.check_run_id]
    assert (completed["status"], completed["conclusion"], completed["output"]["summary"]) == (
        "completed",
        "success",
        "served",
    )
    assert completed["completed_at"] is not None
    # And the token that did it was narrowed to checks: write
    assert {"checks": "write"} in fake.state.token_permissions


def test_an_installation_without_checks_write_is_refused(connect: Connect, fake: FakeGitHub) -> None:
    # Given an installation whose owner never accepted checks: write
    fake.state.add_installation(
        INSTALLATION_ID, OWNER, permissions={"actions": "read", "administration": "write"}
    )
    github = connect()
    # When a check run is asked for / Then GitHub refuses, and nothing is created
    with pytest.raises(GitHubError):
        github.create_check_run(CHECKS_REPOSITORY, head_sha=HEAD_SHA, name="n", title="t", summary="s")
    assert fake.state.check_runs == {}


def test_completing_a_check_run_of_another_repository_is_not_found(
    connect: Connect, fake: FakeGitHub
) -> None:
    github = connect()
    check_run = github.create_check_run(
        CHECKS_REPOSITORY, head_sha=HEAD_SHA, name="n", title="t", summary="s"
    )
    with pytest.raises(GitHubNotFoundError):
        github.complete_check_run(f"{OWNER}/other", check_run, conclusion="success", title="t", summary="s")
    assert fake.state.check_runs[check_run.check_run_id]["status"] == "in_progress"


def test_a_runs_jobs_are_listed_with_their_names_and_head_commit(connect: Connect, fake: FakeGitHub) -> None:
    # Given a run with a queued job
    github = connect()
    run = fake.actions.start_run(CHECKS_REPOSITORY, "ci", [JobSpec("build", "pool=${{ github.run_id }}")])
    # When its jobs are listed / Then each carries the name the check run names and the commit it goes on
    (job,), _ = github.run_jobs(CHECKS_REPOSITORY, run.run_id, 1)
    assert (job.name, job.head_sha) == ("build", HEAD_SHA)
