"""The HTTP client of one GitHub App installation: every call authenticated, pooled, and its failure ours.

A client makes its calls with installation tokens narrowed to one permission set (`narrowed` gives
another client over the same tokens and connections, for another set); only the client of the App's key
(adapters/github_app_key.py) also signs the App's JWT for `/app/...` routes.

Built on githubkit's generated REST methods, with three of its defaults replaced on purpose: the
authentication (adapters/github_app_auth.py), the retry (none: adapters/github_errors.py), and the
HTTP cache (none: every read must see GitHub as it is now).

githubkit opens and closes an HTTP client per call; the transport below keeps one connection pool
across calls, so a warm Lambda does not pay a TLS handshake per request.
"""

from __future__ import annotations

import copy
import functools
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pydantic
from githubkit import GitHub
from githubkit.exception import GitHubException
from githubkit.versions import RestVersionSwitcher

from runner_pool.adapters.github_app_auth import TOKEN_REFRESH_MARGIN_SECONDS, AppAuth, InstallationTokens
from runner_pool.adapters.github_errors import translate
from runner_pool.adapters.github_hourly import HourlyWatch, hourly_quota
from runner_pool.domain.clock import Clock, SystemClock
from runner_pool.domain.github_tokens import InstallationToken, Permissions
from runner_pool.domain.registration_budget import HourlyQuota

T = TypeVar("T")

GITHUB_API_URL = "https://api.github.com/"
PAGE_SIZE = 100


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR), made once a process:
    reading the CA bundle takes about 17 ms, and a cold start makes a client for the App's key and one
    for the App. An SSLContext serves any number of connections and threads (Python docs, ssl,
    "SSL Contexts")."""
    return httpx.create_ssl_context()


class GitHubApi:
    """The REST API as one App installation calls it, with tokens narrowed to `permissions` (None: all the
    installation was granted); `call` runs one operation and turns whatever it raises into a GitHubError."""

    def __init__(
        self,
        tokens: Callable[[Permissions | None], InstallationToken],
        installation_id: int,
        *,
        permissions: Permissions | None = None,
        app_jwt: Callable[[], str] | None = None,
        base_url: str = GITHUB_API_URL,
        api_version: str | None = None,
        clock: Clock | None = None,
        timeout_seconds: float = 10.0,
        token_refresh_margin_seconds: float = TOKEN_REFRESH_MARGIN_SECONDS,
        on_hourly_quota: Callable[[HourlyQuota], None] | None = None,
    ) -> None:
        """`tokens` issues a new installation token for a permission set (the App's key, or the token
        function); `app_jwt` signs the App's JWT, given only where the key is held."""
        self.installation_id = installation_id
        self.permissions = permissions
        self._clock: Clock = clock or SystemClock()
        self.headers = {"X-GitHub-Api-Version": api_version} if api_version else None
        self._hourly = HourlyWatch(on_hourly_quota)
        self._transport = _PooledTransport(httpx.HTTPTransport(verify=_tls_context()), self._hourly)
        self._tokens = InstallationTokens(tokens, self._clock, token_refresh_margin_seconds)
        self._app_jwt = app_jwt
        self._base_url = base_url
        self._timeout = timeout_seconds
        self._github = self._client(permissions)

    def narrowed(self, permissions: Permissions | None) -> GitHubApi:
        """A client over the same tokens, connections and hourly watch, whose calls carry tokens for
        `permissions`."""
        other = copy.copy(self)
        other.permissions = permissions
        other._github = self._client(permissions)
        return other

    def _client(self, permissions: Permissions | None) -> GitHub[Any]:
        return GitHub(
            AppAuth(self._app_jwt, self._tokens, permissions),
            base_url=self._base_url,
            user_agent="runner-pool",
            timeout=self._timeout,
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
        """Have this client's installation token in hand: asked for now unless held."""
        self.call(lambda: self._tokens.get(self.permissions))

    def call(self, operation: Callable[[], T]) -> T:
        """Run one githubkit operation; whatever it raises comes out as a GitHubError."""
        try:
            return operation()
        except (GitHubException, pydantic.ValidationError) as exc:
            raise translate(exc, self._clock.now()) from exc

    def close(self) -> None:
        self._transport.close_pool()


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
