"""The App's private key at work: installation tokens narrowed on request, and the App's own deliveries.

Only the token function (handlers/github_token.py) and the operator's doctor build one; every other
function reaches it through adapters/github_token_function.py. The App's JWT, signed per request,
authenticates its `/app/...` calls; the token request names the permissions wanted, and GitHub refuses
one the installation was not granted (docs.github.com/rest/apps/apps#create-an-installation-access-token-
for-an-app: `permissions`, "The permissions granted to the user access token").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from runner_pool.adapters import github_deliveries
from runner_pool.adapters.github_api import GITHUB_API_URL, GitHubApi, validated
from runner_pool.adapters.github_app_auth import app_jwt, load_private_key
from runner_pool.domain.clock import Clock, Epoch, SystemClock
from runner_pool.domain.github_tokens import InstallationToken, Permissions
from runner_pool.domain.registration_budget import HourlyQuota
from runner_pool.domain.runners import FailedDelivery


class GitHubAppKey:
    """The AppIdentity (domain/github_tokens.py) of the holder of the App's private key."""

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
        on_hourly_quota: Callable[[HourlyQuota], None] | None = None,
    ) -> None:
        """`app_id` may be the App's id or its client id; `base_url` is `https://<host>/api/v3/` for
        GitHub Enterprise Server."""
        self._app_id = str(app_id)
        self._key = load_private_key(private_key)
        self._installation_id = installation_id
        self._clock: Clock = clock or SystemClock()
        self.api = GitHubApi(
            self.installation_token,
            installation_id,
            app_jwt=self.app_jwt,
            base_url=base_url,
            api_version=api_version,
            clock=self._clock,
            timeout_seconds=timeout_seconds,
            on_hourly_quota=on_hourly_quota,
        )
        """The App's own client: its `/app/...` routes with the JWT, the rest with unnarrowed tokens."""

    @property
    def installation_id(self) -> int:
        return self._installation_id

    def app_jwt(self) -> str:
        return app_jwt(self._app_id, self._key, self._clock.now())

    def installation_token(self, permissions: Permissions | None) -> InstallationToken:
        api = self.api
        body = {} if permissions is None else {"permissions": dict(permissions)}

        def request() -> InstallationToken:
            issued = validated(
                api.rest.apps.create_installation_access_token(
                    self._installation_id, headers=api.headers, data=cast(Any, body)
                )
            )
            return InstallationToken(
                issued["token"],
                datetime.fromisoformat(issued["expires_at"]).timestamp(),
                dict(issued.get("permissions") or {}),
            )

        return api.call(request)

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        return github_deliveries.failed_deliveries(self.api, since)

    def redeliver(self, delivery_id: int) -> None:
        github_deliveries.redeliver(self.api, delivery_id)

    def close(self) -> None:
        self.api.close()
