"""How the App proves who it is: the App JWT on `/app/...` routes, the installation token on all others.

Authentication is ours, not githubkit's. githubkit's AppInstallationAuthStrategy does cache the
installation token, but in a store shared by the whole process and keyed by app and installation id only
(not by GitHub host), with expiry read from the wall clock. Here each client holds its own token on the
injected clock, asks for a new one shortly before expiry, and replaces at once a token GitHub refuses.
The App JWT, signed per request, authenticates the `/app/...` routes (the token request and the webhook
deliveries API); everything else carries the installation token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from githubkit import BaseAuthStrategy, GitHubCore

from runner_pool.domain.clock import Clock, Epoch

TOKEN_REFRESH_MARGIN_SECONDS = 300.0
"""A token this close to its expiry is replaced: room for clock skew and for a call still under way."""
APP_JWT_BACKDATE_SECONDS = 60
"""GitHub's advice: issue the JWT a minute in the past, against clock drift."""
APP_JWT_LIFETIME_SECONDS = 540
"""From the backdated `iat`; GitHub refuses an `exp` more than 10 minutes ahead."""


def load_private_key(pem: str) -> RSAPrivateKey:
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


@dataclass(frozen=True)
class InstallationToken:
    value: str = field(repr=False)
    expires_at: Epoch


class InstallationTokens:
    """The installation token: one request for many calls, a new one shortly before expiry."""

    def __init__(self, fetch: Callable[[], InstallationToken], clock: Clock, margin_seconds: float) -> None:
        self._fetch = fetch
        self._clock = clock
        self._margin = margin_seconds
        self._token: InstallationToken | None = None
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

    def __init__(self, app_jwt: Callable[[], str], tokens: InstallationTokens, base_path: str) -> None:
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
class AppAuth(BaseAuthStrategy):
    app_jwt: Callable[[], str]
    tokens: InstallationTokens

    def get_auth_flow(self, github: GitHubCore[Any]) -> httpx.Auth:
        return _AuthFlow(self.app_jwt, self.tokens, github.config.base_url.path)
