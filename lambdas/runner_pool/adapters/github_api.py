"""The HTTP client of one GitHub App installation: every call authenticated, pooled, and its failure ours.

Built on githubkit's generated REST methods, with three of its defaults replaced on purpose: the
authentication (adapters/github_app_auth.py), the retry (none: adapters/github_errors.py), and the
HTTP cache (none: every read must see GitHub as it is now).

githubkit opens and closes an HTTP client per call; the transport below keeps one connection pool
across calls, so a warm Lambda does not pay a TLS handshake per request.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import httpx
import pydantic
from githubkit import GitHub
from githubkit.exception import GitHubException
from githubkit.versions import RestVersionSwitcher

from runner_pool.adapters.github_app_auth import (
    TOKEN_REFRESH_MARGIN_SECONDS,
    AppAuth,
    InstallationToken,
    InstallationTokens,
    app_jwt,
    load_private_key,
)
from runner_pool.adapters.github_errors import translate
from runner_pool.adapters.github_hourly import HourlyWatch, hourly_quota
from runner_pool.domain.clock import Clock, SystemClock
from runner_pool.domain.registration_budget import HourlyQuota

T = TypeVar("T")

GITHUB_API_URL = "https://api.github.com/"
PAGE_SIZE = 100


class GitHubApi:
    """The REST API as one App installation calls it; `call` runs one operation and turns whatever it
    raises into a GitHubError."""

    def __init__(
        self,
        app_id: int | str,
        private_key: str,
        installation_id: int,
        *,
        base_url: str = GITHUB_API_URL,
        api_version: str | None = None,
        clock: Clock | None = None,
        timeout_seconds: float = 10.0,
        token_refresh_margin_seconds: float = TOKEN_REFRESH_MARGIN_SECONDS,
        on_hourly_quota: Callable[[HourlyQuota], None] | None = None,
    ) -> None:
        self._app_id = str(app_id)
        self._key = load_private_key(private_key)
        self.installation_id = installation_id
        self._clock: Clock = clock or SystemClock()
        self.headers = {"X-GitHub-Api-Version": api_version} if api_version else None
        self._hourly = HourlyWatch(on_hourly_quota)
        self._transport = _PooledTransport(httpx.HTTPTransport(), self._hourly)
        self._tokens = InstallationTokens(self._request_token, self._clock, token_refresh_margin_seconds)
        self._github = GitHub(
            AppAuth(self._app_jwt, self._tokens),
            base_url=base_url,
            user_agent="runner-pool",
            timeout=timeout_seconds,
            http_cache=False,
            auto_retry=False,
            transport=self._transport,
        )

    @property
    def rest(self) -> RestVersionSwitcher:
        return self._github.rest

    @property
    def hourly_quota(self) -> HourlyQuota | None:
        """GitHub's hourly limit as its last answer to this client reported it."""
        return self._hourly.seen

    def authenticate(self) -> None:
        """Have the installation token in hand: asked for now unless held."""
        self.call(self._tokens.get)

    def call(self, operation: Callable[[], T]) -> T:
        """Run one githubkit operation; whatever it raises comes out as a GitHubError."""
        try:
            return operation()
        except (GitHubException, pydantic.ValidationError) as exc:
            raise translate(exc, self._clock.now()) from exc

    def close(self) -> None:
        self._transport.close_pool()

    def _app_jwt(self) -> str:
        return app_jwt(self._app_id, self._key, self._clock.now())

    def _request_token(self) -> InstallationToken:
        response = self._github.rest.apps.create_installation_access_token(
            self.installation_id, headers=self.headers
        )
        issued = response.parsed_data
        return InstallationToken(issued.token, datetime.fromisoformat(issued.expires_at).timestamp())


def validated(response: Any) -> dict[str, Any]:
    """The answer's JSON body, once githubkit has checked it against GitHub's API description."""
    _ = response.parsed_data
    body: dict[str, Any] = response.raw_response.json()
    return body


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
