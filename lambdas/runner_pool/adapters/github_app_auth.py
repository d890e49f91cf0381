"""How a client proves who it is: the App JWT on `/app/...` routes, an installation token on all others.

Authentication is ours, not githubkit's. githubkit's AppInstallationAuthStrategy does cache the
installation token, but in a store shared by the whole process and keyed by app and installation id only
(not by GitHub host, nor by the permissions it was narrowed to), with expiry read from the wall clock.
Here each client holds its tokens, one per permission set, on the injected clock, asks for a new one
shortly before expiry, and replaces at once a token GitHub refuses. The App JWT, signed per request,
authenticates the `/app/...` routes (the token request and the webhook deliveries API) of the one client
that holds the App's key; every other request carries an installation token.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from githubkit import BaseAuthStrategy, GitHubCore

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.github_tokens import InstallationToken, Permissions, permission_key

TOKEN_REFRESH_MARGIN_SECONDS = 300.0
"""A token this close to its expiry is replaced: room for clock skew and for a call still under way."""
APP_JWT_BACKDATE_SECONDS = 60
"""GitHub's advice: issue the JWT a minute in the past, against clock drift."""
APP_JWT_LIFETIME_SECONDS = 540
"""From the backdated `iat`; GitHub refuses an `exp` more than 10 minutes ahead."""


@functools.lru_cache(maxsize=8)
def load_private_key(pem: str) -> RSAPrivateKey:
    """The App's key, parsed once a process for each PEM: parsing checks the RSA key, about 28 ms, and
    every GitHubAppKey parses its own (a key is immutable, so they may share it)."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError("the GitHub App private key is not an unencrypted PEM private key") from exc
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("the GitHub App private key is not an RSA key; GitHub issues RSA keys")
    return key


def app_jwt(app_id: str, key: RSAPrivateKey, now: Epoch) -> str:
    issued_at = int(now) - APP_JWT_BACKDATE_SECONDS
    claims = {"iat": issued_at, "exp": issued_at + APP_JWT_LIFETIME_SECONDS, "iss": app_id}
    return jwt.encode(claims, key, algorithm="RS256")


class InstallationTokens:
    """Installation tokens, one per permission set: one request for many calls, a new one shortly before
    expiry."""

    def __init__(
        self,
        fetch: Callable[[Permissions | None], InstallationToken],
        clock: Clock,
        margin_seconds: float,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._margin = margin_seconds
        self._tokens: dict[tuple[tuple[str, str], ...] | None, InstallationToken] = {}
        self._lock = threading.Lock()

    def get(self, permissions: Permissions | None) -> str:
        key = permission_key(permissions)
        with self._lock:
            token = self._tokens.get(key)
            if token is None or self._clock.now() >= token.expires_at - self._margin:
                token = self._tokens[key] = self._fetch(permissions)
            return token.value

    def forget(self, permissions: Permissions | None, value: str) -> None:
        """Drop a token GitHub refused, unless another caller has replaced it already."""
        key = permission_key(permissions)
        with self._lock:
            token = self._tokens.get(key)
            if token is not None and token.value == value:
                del self._tokens[key]


class _AuthFlow(httpx.Auth):
    requires_request_body = True
    requires_response_body = True

    def __init__(
        self,
        app_jwt: Callable[[], str] | None,
        tokens: InstallationTokens,
        permissions: Permissions | None,
        base_path: str,
    ) -> None:
        self._app_jwt = app_jwt
        self._tokens = tokens
        self._permissions = permissions
        self._base_path = base_path.rstrip("/")

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        route = request.url.path.removeprefix(self._base_path)
        if route == "/app" or route.startswith("/app/"):
            if self._app_jwt is None:
                raise PermissionError(f"{route} needs the App's JWT, which only the token function can sign")
            request.headers["Authorization"] = f"Bearer {self._app_jwt()}"
            yield request
            return
        token = self._tokens.get(self._permissions)
        request.headers["Authorization"] = f"token {token}"
        response = yield request
        if response.status_code == httpx.codes.UNAUTHORIZED:
            # Revoked, or expired early: once with a fresh token, then GitHub's answer stands.
            self._tokens.forget(self._permissions, token)
            request.headers["Authorization"] = f"token {self._tokens.get(self._permissions)}"
            yield request


@dataclass(frozen=True)
class AppAuth(BaseAuthStrategy):
    """`app_jwt` None: a client that cannot act as the App itself, only with installation tokens."""

    app_jwt: Callable[[], str] | None
    tokens: InstallationTokens
    permissions: Permissions | None

    def get_auth_flow(self, github: GitHubCore[Any]) -> httpx.Auth:
        return _AuthFlow(self.app_jwt, self.tokens, self.permissions, github.config.base_url.path)
