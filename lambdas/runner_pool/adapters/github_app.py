"""The GitHub App client of one installation: JIT runner configs, our runners, failed webhook deliveries.

Built on githubkit's generated REST methods, with three of its defaults replaced on purpose:

- Authentication is ours. githubkit's AppInstallationAuthStrategy does cache the installation token,
  but in a store shared by the whole process and keyed by app and installation id only (not by
  GitHub host), with expiry read from the wall clock. Here each client holds its own token on the
  injected clock, asks for a new one shortly before expiry, and replaces at once a token GitHub
  refuses. The App JWT, signed per request, authenticates the `/app/...` routes (the token request
  and the webhook deliveries API); everything else carries the installation token.
- No automatic retry: githubkit would sleep in the Lambda until a rate limit resets (up to an hour)
  and retry server errors with sleeps of its own. Both become a GitHubRetryableError instead, and
  the caller's retry (Step Functions, the next refresh) does the waiting.
- No HTTP cache: every read must see GitHub as it is now.

githubkit opens and closes an HTTP client per call; the transport below keeps one connection pool
across calls, so a warm Lambda does not pay a TLS handshake per request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import jwt
import pydantic
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from githubkit import BaseAuthStrategy, GitHub, GitHubCore
from githubkit.exception import (
    GitHubException,
    RateLimitExceeded,
    RequestError,
    RequestFailed,
    RequestTimeout,
)
from githubkit.utils import UNSET

from runner_pool.adapters.github_hourly import HourlyWatch, hourly_quota
from runner_pool.domain.clock import Clock, Epoch, SystemClock
from runner_pool.domain.doctor import AppGrant, HookConfig, Installation, RunnerPolicy, Unread
from runner_pool.domain.registration_budget import HourlyQuota
from runner_pool.domain.runner_scope import (
    OrganizationScope,
    Registration,
    RepositoryScope,
    RunnerScope,
    runner_scope,
)
from runner_pool.domain.runners import (
    DEFAULT_RUNNER_GROUP_ID,
    FailedDelivery,
    GitHubAuthError,
    GitHubError,
    GitHubForbiddenError,
    GitHubNotFoundError,
    GitHubRateLimitedError,
    GitHubRejectedError,
    GitHubUnavailableError,
    JitRunner,
    RegisteredRunner,
    RepositoryUnknownError,
    RunJob,
    RunnerRemoval,
    RunnerStatus,
)

if TYPE_CHECKING:
    from githubkit_schemas.latest.models import Job, Runner

T = TypeVar("T")

GITHUB_API_URL = "https://api.github.com/"
MAX_RUNNER_LABELS = 100
PAGE_SIZE = 100
TOKEN_REFRESH_MARGIN_SECONDS = 300.0
"""A token this close to its expiry is replaced: room for clock skew and for a call still under way."""
APP_JWT_BACKDATE_SECONDS = 60
"""GitHub's advice: issue the JWT a minute in the past, against clock drift."""
APP_JWT_LIFETIME_SECONDS = 540
"""From the backdated `iat`; GitHub refuses an `exp` more than 10 minutes ahead."""
RATE_LIMIT_DEFAULT_WAIT_SECONDS = 60.0
RUNNER_GROUP_PREFIX = "runner-pool-repository-"
"""A repository's runner group is named from its id, never its name: a renamed repository keeps its group,
and a new repository that takes an old name does not inherit it."""


def runner_group_name(repository_id: int) -> str:
    return f"{RUNNER_GROUP_PREFIX}{repository_id}"


# --- the client --------------------------------------------------------------------------------


class GitHubApp:
    """The RunnerRegistry (domain.runners) of one App installation, for the runners of one scope
    (repository or organisation)."""

    def __init__(
        self,
        app_id: int | str,
        private_key: str,
        installation_id: int,
        scope: RunnerScope,
        *,
        base_url: str = GITHUB_API_URL,
        api_version: str | None = None,
        clock: Clock | None = None,
        timeout_seconds: float = 10.0,
        token_refresh_margin_seconds: float = TOKEN_REFRESH_MARGIN_SECONDS,
        registration: Registration = Registration.REPOSITORY,
        groups_allow_public_repositories: bool = False,
        on_hourly_quota: Callable[[HourlyQuota], None] | None = None,
    ) -> None:
        """`base_url` is `https://<host>/api/v3/` for GitHub Enterprise Server. `api_version` overrides
        the `X-GitHub-Api-Version` githubkit sends (its newest); GHES answers only the versions of
        its release, e.g. `2022-11-28`. `app_id` may be the App's id or its client id. `registration`
        is used by an organisation scope only (domain.runner_scope.Registration);
        `groups_allow_public_repositories` lets the runner groups it creates take public repositories'
        jobs, which GitHub refuses by default."""
        self._app_id = str(app_id)
        self._key = _load_private_key(private_key)
        self._installation_id = installation_id
        self._scope = scope
        self._registration = registration
        self._groups_allow_public = groups_allow_public_repositories
        self._groups: dict[int, int] = {}
        """Runner group id per repository id, as found or created (`_group_of`)."""
        self._groups_lock = threading.Lock()
        self._clock: Clock = clock or SystemClock()
        self._headers = {"X-GitHub-Api-Version": api_version} if api_version else None
        self._hourly = HourlyWatch(on_hourly_quota)
        self._transport = _PooledTransport(httpx.HTTPTransport(), self._hourly)
        self._tokens = _TokenCache(self._request_token, self._clock, token_refresh_margin_seconds)
        self._github = GitHub(
            _AppAuth(self._app_jwt, self._tokens),
            base_url=base_url,
            user_agent="runner-pool",
            timeout=timeout_seconds,
            http_cache=False,
            auto_retry=False,
            transport=self._transport,
        )

    @property
    def scope(self) -> RunnerScope:
        return self._scope

    @property
    def hourly_quota(self) -> HourlyQuota | None:
        """GitHub's hourly limit as its last answer to this client reported it."""
        return self._hourly.seen

    def close(self) -> None:
        self._transport.close_pool()

    def read(self, request: Callable[[Any, Mapping[str, str] | None], T]) -> T:
        """One call of githubkit's REST namespace (`request(rest, headers)`) with this client's headers,
        whatever it raises as a GitHubError: for reads that live in modules of their own."""
        return self._call(lambda: request(self._github.rest, self._headers))

    def authenticate(self) -> None:
        """Have the installation token in hand: asked for now unless held (a fresh environment's first
        call would ask for it), so a step can ask while its own calls run (steps.hand_over)."""
        self._call(self._tokens.get)

    # --- runners ---------------------------------------------------------------------------------

    def jit_config(
        self,
        name: str,
        labels: Sequence[str],
        runner_group_id: int = DEFAULT_RUNNER_GROUP_ID,
        work_folder: str | None = None,
        repository: str | None = None,
        *,
        repository_id: int | None = None,
    ) -> JitRunner:
        """Register a just-in-time runner `name` with exactly `labels` (for us: `[run key]`), at the
        repository `repository` (`owner/repo`) when given, else at the App's scope.

        With Registration.RUNNER_GROUP on an organisation, at the organisation instead, in the runner
        group of the repository `repository_id` alone (issue 36, item 5), in place of `runner_group_id`:
        POST /orgs/{org}/actions/runners/generate-jitconfig with that group's id ("Create configuration for
        a just-in-time runner for an organization", REST API endpoints for self-hosted runners), which
        with the group's endpoints needs only the organisation permission `organization_self_hosted_runners`
        ("GitHub Apps must have the administration permission for repositories or the
        organization_self_hosted_runners permission for organizations", REST API endpoints for
        self-hosted runner groups). Without a repository and its id that is RepositoryUnknownError: a
        runner is never registered where every repository's jobs could take it.

        At a repository, only that repository's jobs can take the runner, also when the App is
        installed on the whole organisation (issue 14, item 1): "Create configuration for a
        just-in-time runner for a repository", POST /repos/{owner}/{repo}/actions/runners/
        generate-jitconfig, needs `runner_group_id` and the App's repository Administration: write
        (docs.github.com, REST API endpoints for self-hosted runners). A repository outside the scope
        is a ValueError: the installation could not register there.

        A name is one registration: asking again for a name GitHub already knows replaces the earlier
        registration, so a retried step whose first answer was lost still gets a config. A runner of
        that name that is running a job is never replaced (GitHubRejectedError).
        """
        if not name:
            raise ValueError("a runner needs a name")
        if not 1 <= len(labels) <= MAX_RUNNER_LABELS:
            raise ValueError(f"a JIT runner takes 1 to {MAX_RUNNER_LABELS} labels, not {len(labels)}")
        where = self.registration_scope(repository)
        if self._by_group:
            if repository is None or repository_id is None:
                raise RepositoryUnknownError(f"no runner group without the repository's id ({repository})")
            runner_group_id = self._group_of(repository_id)
        try:
            return self._call(lambda: self._generate_jit(where, name, labels, runner_group_id, work_folder))
        except GitHubRejectedError as exc:
            if exc.status != httpx.codes.CONFLICT:
                raise
        for stale in self._runners_named(where, name):
            if self.delete_runner(stale.runner_id, repository) is RunnerRemoval.BUSY:
                raise GitHubRejectedError(
                    f"runner name {name!r} belongs to runner {stale.runner_id}, which is running a job",
                    httpx.codes.CONFLICT,
                )
        return self._call(lambda: self._generate_jit(where, name, labels, runner_group_id, work_folder))

    def registration_scope(self, repository: str | None) -> RunnerScope:
        """Where a runner for a job of `repository` is registered: at that repository, which must be
        the App's repository or one of its organisation's; at the App's scope when None."""
        if repository is None:
            return self._scope
        where = runner_scope(repository)
        if not isinstance(where, RepositoryScope):
            raise ValueError(f"{repository!r} is not an owner/repo")
        scope = self._scope
        inside = (
            str(where).lower() == str(scope).lower()
            if isinstance(scope, RepositoryScope)
            else where.owner.lower() == scope.org.lower()
        )
        if not inside:
            raise ValueError(f"repository {repository} is outside the App's runner scope {scope}")
        return scope if self._by_group else where

    @property
    def _by_group(self) -> bool:
        """Whether runners are registered in a runner group per repository (on an organisation only)."""
        return self._registration is Registration.RUNNER_GROUP and isinstance(self._scope, OrganizationScope)

    def _group_of(self, repository_id: int) -> int:
        """The id of the runner group of the repository `repository_id` alone: found by its name, or
        created with visibility `selected` and that one repository ("Create a self-hosted runner group for
        an organization": `visibility` "selected", `selected_repository_ids` "List of repository IDs that
        can access the runner group"; `allows_public_repositories` false unless configured). Held once
        found. A 409 on create means another hand-over created it first: its group is found and used."""
        with self._groups_lock:
            held = self._groups.get(repository_id)
        if held is not None:
            return held
        name = runner_group_name(repository_id)
        group_id = self._call(lambda: self._find_group(name))
        if group_id is None:
            try:
                group_id = self._call(lambda: self._create_group(name, repository_id))
            except GitHubRejectedError as exc:
                if exc.status != httpx.codes.CONFLICT:
                    raise
                group_id = self._call(lambda: self._find_group(name))
                if group_id is None:
                    raise
        with self._groups_lock:
            self._groups[repository_id] = group_id
        return group_id

    def _find_group(self, name: str) -> int | None:
        scope = self._scope
        assert isinstance(scope, OrganizationScope)  # noqa: S101 - _by_group holds
        rest = self._github.rest
        page = 1
        while True:
            body = _validated(
                rest.actions.list_self_hosted_runner_groups_for_org(
                    scope.org, per_page=PAGE_SIZE, page=page, headers=self._headers
                )
            )
            groups = body.get("runner_groups", [])
            found = next((int(g["id"]) for g in groups if g.get("name") == name), None)
            if found is not None or len(groups) < PAGE_SIZE:
                return found
            page += 1

    def _create_group(self, name: str, repository_id: int) -> int:
        scope = self._scope
        assert isinstance(scope, OrganizationScope)  # noqa: S101 - _by_group holds
        response = self._github.rest.actions.create_self_hosted_runner_group_for_org(
            scope.org,
            name=name,
            visibility="selected",
            selected_repository_ids=[repository_id],
            allows_public_repositories=self._groups_allow_public,
            headers=self._headers,
        )
        return int(response.parsed_data.id)

    def delete_runner(self, runner_id: int, repository: str | None = None) -> RunnerRemoval:
        """Remove a runner registration (at `repository` if it was registered there); one that is
        already gone is a normal outcome, not an error."""
        rest = self._github.rest
        scope = self.registration_scope(repository)
        try:
            if isinstance(scope, RepositoryScope):
                self._call(
                    lambda: rest.actions.delete_self_hosted_runner_from_repo(
                        scope.owner, scope.repo, runner_id, headers=self._headers
                    )
                )
            else:
                self._call(
                    lambda: rest.actions.delete_self_hosted_runner_from_org(
                        scope.org, runner_id, headers=self._headers
                    )
                )
        except GitHubNotFoundError:
            return RunnerRemoval.ALREADY_GONE
        except GitHubRejectedError as exc:
            if exc.status != httpx.codes.UNPROCESSABLE_ENTITY:
                raise
            return RunnerRemoval.BUSY
        return RunnerRemoval.DELETED

    def runners(self, repository: str | None = None) -> list[RegisteredRunner]:
        """Our runners (those registered with a `pool=` label) at `repository`, or at the App's scope,
        every page of them. An organisation's list does not hold its repositories' runners."""
        where = self.registration_scope(repository)
        return [
            runner for runner in self._call(lambda: self._list_runners(where)) if runner.run_key is not None
        ]

    # --- workflow jobs -----------------------------------------------------------------------------

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
        """The jobs of one attempt of a workflow run in `repository` (`owner/repo`), and the requests
        it took (one per page of 100): GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/
        {attempt_number}/jobs (docs.github.com, "REST API endpoints for workflow jobs", "List jobs
        for a workflow run attempt"). Needs `actions: read` on the repository."""
        owner, _, repo = repository.partition("/")
        rest = self._github.rest
        pages = 0

        def listed() -> list[RunJob]:
            nonlocal pages
            jobs: list[RunJob] = []
            page = 1
            while True:
                pages += 1
                response = rest.actions.list_jobs_for_workflow_run_attempt(
                    owner, repo, run_id, attempt, per_page=PAGE_SIZE, page=page, headers=self._headers
                )
                data = response.parsed_data
                jobs += [_run_job(job) for job in data.jobs]
                if len(data.jobs) < PAGE_SIZE or len(jobs) >= data.total_count:
                    return jobs
                page += 1

        return self._call(listed), pages

    # --- webhook deliveries ------------------------------------------------------------------------

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        """Webhook events since `since` that GitHub failed to deliver and has not delivered since.

        One entry per event (its latest attempt), oldest first. GitHub lists deliveries newest first,
        a page at a time behind a cursor, and keeps no `since` filter, so pages are read only until
        they reach `since`. Every status is read, not only failures: an event with a successful
        attempt (a redelivery that worked) is not failed any more.
        """

        def collect() -> list[FailedDelivery]:
            rest = self._github.rest
            succeeded: set[str] = set()
            latest_failure: dict[str, FailedDelivery] = {}
            pages = rest.paginate(
                rest.apps.list_webhook_deliveries, per_page=PAGE_SIZE, headers=self._headers
            )
            for item in pages:
                delivered_at = item.delivered_at.timestamp()
                if delivered_at < since:
                    break
                if _succeeded(item.status_code):
                    succeeded.add(item.guid)
                elif item.guid not in latest_failure:
                    latest_failure[item.guid] = FailedDelivery(
                        delivery_id=item.id,
                        guid=item.guid,
                        event=item.event,
                        action=item.action,
                        delivered_at=delivered_at,
                        status_code=item.status_code,
                    )
            failed = [d for guid, d in latest_failure.items() if guid not in succeeded]
            return sorted(failed, key=lambda delivery: (delivery.delivered_at, delivery.delivery_id))

        return self._call(collect)

    def redeliver(self, delivery_id: int) -> None:
        """Ask GitHub to deliver a delivery's event again; it answers at once and delivers shortly after."""
        rest = self._github.rest
        self._call(lambda: rest.apps.redeliver_webhook_delivery(delivery_id, headers=self._headers))

    # --- what the doctor reads (domain/doctor.py) ---------------------------------------------------

    def app_grant(self) -> AppGrant | Unread:
        """The App's permissions and events: GET /app with the App JWT ("Get the authenticated app",
        docs.github.com/rest/apps/apps#get-the-authenticated-app)."""
        rest = self._github.rest
        try:
            body = self._call(lambda: _validated(rest.apps.get_authenticated(headers=self._headers)))
        except GitHubError as exc:
            return _unread(exc)
        return AppGrant(dict(body.get("permissions") or {}), frozenset(body.get("events") or ()))

    def installation(self) -> Installation | Unread:
        """This installation's account and accepted permissions: GET /app/installations/{installation_id}
        ("Get an installation for the authenticated app", docs.github.com/rest/apps/apps#get-an-
        installation-for-the-authenticated-app)."""
        rest = self._github.rest
        try:
            body = self._call(
                lambda: _validated(rest.apps.get_installation(self._installation_id, headers=self._headers))
            )
        except GitHubError as exc:
            return _unread(exc)
        account = body.get("account") or {}
        return Installation(
            str(account.get("login", "")),
            body.get("target_type") == "Organization",
            dict(body.get("permissions") or {}),
        )

    def hook_config(self) -> HookConfig | Unread:
        """The App's webhook: GET /app/hook/config ("Get a webhook configuration for an app",
        docs.github.com/rest/apps/webhooks#get-a-webhook-configuration-for-an-app); GitHub answers a set
        secret as `********`."""
        rest = self._github.rest
        try:
            body = self._call(lambda: _validated(rest.apps.get_webhook_config_for_app(headers=self._headers)))
        except GitHubError as exc:
            return _unread(exc)
        return HookConfig(body.get("url"), body.get("content_type"), bool(body.get("secret")))

    def runner_policy(self, org: str) -> RunnerPolicy | Unread:
        """Which repositories of `org` may create repository-level self-hosted runners: GET
        /orgs/{org}/actions/permissions/self-hosted-runners ("Get self-hosted runners settings for an
        organization", docs.github.com/rest/actions/permissions#get-self-hosted-runners-settings-for-an-
        organization), `enabled_repositories`."""
        rest = self._github.rest
        try:
            body = self._call(
                lambda: _validated(
                    rest.actions.get_self_hosted_runners_permissions_organization(org, headers=self._headers)
                )
            )
        except GitHubError as exc:
            return _unread(exc)
        return RunnerPolicy(body["enabled_repositories"])

    def runner_groups(self, org: str) -> tuple[int, ...] | Unread:
        """The ids of `org`'s runner groups: GET /orgs/{org}/actions/runner-groups ("List self-hosted runner
        groups for an organization", docs.github.com/rest/actions/self-hosted-runner-groups), first page of
        100: enough to find the configured one in any organisation we know of."""
        rest = self._github.rest
        try:
            body = self._call(
                lambda: _validated(
                    rest.actions.list_self_hosted_runner_groups_for_org(
                        org, per_page=PAGE_SIZE, headers=self._headers
                    )
                )
            )
        except GitHubError as exc:
            return _unread(exc)
        return tuple(int(group["id"]) for group in body.get("runner_groups", []))

    # --- mechanics -------------------------------------------------------------------------------

    def _generate_jit(
        self,
        scope: RunnerScope,
        name: str,
        labels: Sequence[str],
        runner_group_id: int,
        work_folder: str | None,
    ) -> JitRunner:
        rest = self._github.rest
        folder = UNSET if work_folder is None else work_folder
        if isinstance(scope, RepositoryScope):
            response = rest.actions.generate_runner_jitconfig_for_repo(
                scope.owner,
                scope.repo,
                name=name,
                labels=list(labels),
                runner_group_id=runner_group_id,
                work_folder=folder,
                headers=self._headers,
            )
            runner_id = response.parsed_data.runner.id
            config = response.parsed_data.encoded_jit_config
        else:
            org_response = rest.actions.generate_runner_jitconfig_for_org(
                scope.org,
                name=name,
                labels=list(labels),
                runner_group_id=runner_group_id,
                work_folder=folder,
                headers=self._headers,
            )
            runner_id = org_response.parsed_data.runner.id
            config = org_response.parsed_data.encoded_jit_config
        return JitRunner(runner_id=runner_id, name=name, encoded_jit_config=config)

    def _list_runners(self, scope: RunnerScope, name: str | None = None) -> list[RegisteredRunner]:
        rest = self._github.rest
        only = UNSET if name is None else name
        if isinstance(scope, RepositoryScope):
            repo_pages = rest.paginate(
                rest.actions.list_self_hosted_runners_for_repo,
                map_func=lambda response: response.parsed_data.runners,
                owner=scope.owner,
                repo=scope.repo,
                name=only,
                per_page=PAGE_SIZE,
                headers=self._headers,
            )
            return [_registered(runner) for runner in repo_pages]
        org_pages = rest.paginate(
            rest.actions.list_self_hosted_runners_for_org,
            map_func=lambda response: response.parsed_data.runners,
            org=scope.org,
            name=only,
            per_page=PAGE_SIZE,
            headers=self._headers,
        )
        return [_registered(runner) for runner in org_pages]

    def _runners_named(self, scope: RunnerScope, name: str) -> list[RegisteredRunner]:
        listed = self._call(lambda: self._list_runners(scope, name))
        return [runner for runner in listed if runner.name == name]

    def _call(self, operation: Callable[[], T]) -> T:
        """Run one githubkit operation; whatever it raises comes out as a GitHubError."""
        try:
            return operation()
        except (GitHubException, pydantic.ValidationError) as exc:
            raise _translate(exc, self._clock.now()) from exc

    def _app_jwt(self) -> str:
        now = int(self._clock.now())
        issued_at = now - APP_JWT_BACKDATE_SECONDS
        claims = {"iat": issued_at, "exp": issued_at + APP_JWT_LIFETIME_SECONDS, "iss": self._app_id}
        return jwt.encode(claims, self._key, algorithm="RS256")

    def _request_token(self) -> _Token:
        response = self._github.rest.apps.create_installation_access_token(
            self._installation_id, headers=self._headers
        )
        issued = response.parsed_data
        return _Token(issued.token, datetime.fromisoformat(issued.expires_at).timestamp())


def _validated(response: Any) -> dict[str, Any]:
    """The answer's JSON body, once githubkit has checked it against GitHub's API description."""
    _ = response.parsed_data
    body: dict[str, Any] = response.raw_response.json()
    return body


def _unread(exc: GitHubError) -> Unread:
    """A read the doctor could not make; refused for want of a permission when GitHub said 403 or 404 (what
    it answers an installation for a resource it may not see)."""
    return Unread(str(exc), forbidden=isinstance(exc, GitHubForbiddenError | GitHubNotFoundError))


def _registered(runner: Runner) -> RegisteredRunner:
    if runner.busy:
        status = RunnerStatus.BUSY
    elif runner.status == RunnerStatus.ONLINE.value:
        status = RunnerStatus.ONLINE
    else:
        status = RunnerStatus.OFFLINE
    return RegisteredRunner(
        runner_id=runner.id,
        name=runner.name,
        status=status,
        labels=tuple(label.name for label in runner.labels),
    )


def _run_job(job: Job) -> RunJob:
    return RunJob(
        job_id=job.id,
        status=str(job.status),
        labels=tuple(job.labels),
        created_at=job.created_at.timestamp(),
        runner_id=job.runner_id,
        runner_name=job.runner_name,
    )


def _succeeded(status_code: int) -> bool:
    return 200 <= status_code < 300


def _load_private_key(pem: str) -> RSAPrivateKey:
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError("the GitHub App private key is not an unencrypted PEM private key") from exc
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("the GitHub App private key is not an RSA key; GitHub issues RSA keys")
    return key


# --- errors --------------------------------------------------------------------------------------

_ERRORS_BY_STATUS: Mapping[int, type[GitHubError]] = {
    401: GitHubAuthError,
    403: GitHubForbiddenError,
    404: GitHubNotFoundError,
    409: GitHubRejectedError,
    422: GitHubRejectedError,
}


def _translate(exc: BaseException, now: Epoch) -> GitHubError:
    """githubkit's exception as one of ours; the message names the request and GitHub's own words."""
    exc = _unwrapped(exc)
    if isinstance(exc, RequestFailed):
        return _refused(exc, now)
    if isinstance(exc, RequestTimeout | httpx.TransportError):
        return GitHubUnavailableError(f"could not reach GitHub: {exc!r}")
    if isinstance(exc, pydantic.ValidationError):
        return GitHubError(f"GitHub answered in a shape its API description does not allow: {exc}")
    return GitHubError(f"request to GitHub failed: {exc!r}")


def _unwrapped(exc: BaseException) -> BaseException:
    """What githubkit wrapped: whatever the HTTP client raised, including the failure of a token
    request our authentication made on the way."""
    while type(exc) is RequestError:
        exc = exc.exc
    return exc


def _refused(exc: RequestFailed, now: Epoch) -> GitHubError:
    status = exc.response.status_code
    if isinstance(exc, RateLimitExceeded) or _rate_limited(exc):
        wait = _retry_after(exc.response.headers, now)
        return GitHubRateLimitedError(f"{_described(exc)}; retry in {wait:.0f} s", status, wait)
    kind = GitHubUnavailableError if status >= 500 else _ERRORS_BY_STATUS.get(status, GitHubError)
    return kind(_described(exc), status)


def _rate_limited(exc: RequestFailed) -> bool:
    """A secondary rate limit that names itself only in its message (no `retry-after`, remaining not 0),
    which githubkit reads as a plain failure. GitHub answers it 403 or 429 "and an error message that
    indicates that you exceeded a secondary rate limit" (docs.github.com, "Rate limits for the REST
    API", "Exceeding the rate limit"); a 429 is a rate limit whatever it says."""
    status = exc.response.status_code
    if status == httpx.codes.TOO_MANY_REQUESTS:
        return True
    return status == httpx.codes.FORBIDDEN and "rate limit" in _message(exc).lower()


def _message(exc: RequestFailed) -> str:
    try:
        body = exc.response.json()
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) else ""


def _described(exc: RequestFailed) -> str:
    request = exc.request
    message = _message(exc)
    said = f": {message}" if message else ""
    return f"{request.method} {request.url.path} answered {exc.response.status_code}{said}"


def _retry_after(headers: httpx.Headers, now: Epoch) -> float:
    """How long GitHub asks us to wait, in the order its documentation gives ("Exceeding the rate
    limit"): `retry-after` seconds; else, when `x-ratelimit-remaining` is 0, until `x-ratelimit-reset`;
    otherwise at least a minute."""
    retry_after = headers.get("retry-after")
    if retry_after is not None:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            pass  # an HTTP date, which GitHub does not send; wait the default
    if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
        return max(0.0, float(headers["x-ratelimit-reset"]) - now)
    return RATE_LIMIT_DEFAULT_WAIT_SECONDS


# --- authentication and transport ---------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    value: str = field(repr=False)
    expires_at: Epoch


class _TokenCache:
    """The installation token: one request for many calls, a new one shortly before expiry."""

    def __init__(self, fetch: Callable[[], _Token], clock: Clock, margin_seconds: float) -> None:
        self._fetch = fetch
        self._clock = clock
        self._margin = margin_seconds
        self._token: _Token | None = None
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            token = self._token
            if token is None or self._clock.now() >= token.expires_at - self._margin:
                token = self._token = self._fetch()
            return token.value

    def forget(self, value: str) -> None:
        """Drop a token GitHub refused, unless another caller has replaced it already."""
        with self._lock:
            if self._token is not None and self._token.value == value:
                self._token = None


class _AuthFlow(httpx.Auth):
    requires_request_body = True
    requires_response_body = True

    def __init__(self, app_jwt: Callable[[], str], tokens: _TokenCache, base_path: str) -> None:
        self._app_jwt = app_jwt
        self._tokens = tokens
        self._base_path = base_path.rstrip("/")

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        route = request.url.path.removeprefix(self._base_path)
        if route == "/app" or route.startswith("/app/"):
            request.headers["Authorization"] = f"Bearer {self._app_jwt()}"
            yield request
            return
        token = self._tokens.get()
        request.headers["Authorization"] = f"token {token}"
        response = yield request
        if response.status_code == httpx.codes.UNAUTHORIZED:
            # Revoked, or expired early: once with a fresh token, then GitHub's answer stands.
            self._tokens.forget(token)
            request.headers["Authorization"] = f"token {self._tokens.get()}"
            yield request


@dataclass(frozen=True)
class _AppAuth(BaseAuthStrategy):
    app_jwt: Callable[[], str]
    tokens: _TokenCache

    def get_auth_flow(self, github: GitHubCore[Any]) -> httpx.Auth:
        return _AuthFlow(self.app_jwt, self.tokens, github.config.base_url.path)


class _PooledTransport(httpx.BaseTransport):
    """An HTTP transport whose connection pool outlives the per-call clients githubkit opens and closes;
    it reads GitHub's hourly limit off every answer (`x-ratelimit-*`, "Rate limits for the REST API")."""

    def __init__(self, transport: httpx.HTTPTransport, on_quota: Callable[[HourlyQuota], None]) -> None:
        self._transport = transport
        self._on_quota = on_quota

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._transport.handle_request(request)
        # Only an installation's answers report its hour; an App-JWT answer reports the App's own limit.
        installation = request.headers.get("authorization", "").startswith("token ")
        quota = hourly_quota(response.headers) if installation else None
        if quota is not None:
            self._on_quota(quota)
        return response

    def close(self) -> None:
        """Called by every per-call client; the pool stays open for the next call."""

    def close_pool(self) -> None:
        self._transport.close()
