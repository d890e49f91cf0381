"""The App as every function but one sees it: the token function, invoked for tokens and deliveries.

The request and answer are the token function's (handlers/github_token.py `AppRequest`, `AppAnswer`); a
GitHub error it met comes back as data and is raised here as the same error of ours, so a caller retries
or gives up exactly as it would have on GitHub's own answer. Invoked synchronously (Lambda API
Reference, Invoke: `InvocationType` RequestResponse, the answer in `Payload`; an error the function
raised is flagged by `FunctionError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.github_app_answers import AppAnswer, AppRequest, raised
from runner_pool.domain.clock import Epoch
from runner_pool.domain.github_tokens import InstallationToken, Permissions
from runner_pool.domain.runners import FailedDelivery, GitHubError, GitHubUnavailableError

TOKEN_FUNCTION_TIMEOUT_SECONDS = 20
"""The token function's timeout: past a read of the App's key throttled through every attempt
(aws_clients.throttled_wait_seconds, 13 s) and GitHub's answer to one token request."""


def invoking_client() -> Any:
    """A Lambda client whose read timeout outlasts the token function's own, so a slow invocation (a cold
    start, a throttled read of the key) is waited for, never given up and invoked again while it runs."""
    return aws_clients.long_poll_client("lambda", TOKEN_FUNCTION_TIMEOUT_SECONDS)


@dataclass(frozen=True)
class TokenFunction:
    """The AppIdentity (domain/github_tokens.py) of a function that may only invoke the token function;
    `client` is a Lambda client (`invoking_client`), `app_id` which of the stack's Apps (None: the first)."""

    function_name: str
    installation_id: int
    client: Any
    app_id: str | None = None

    def installation_token(self, permissions: Permissions | None) -> InstallationToken:
        answer = self._ask(
            AppRequest(permissions=None if permissions is None else dict(permissions), app_id=self.app_id)
        )
        if answer.token is None:
            raise GitHubError("the token function answered without a token")
        return answer.token.issued()

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        return list(self._ask(AppRequest(failed_deliveries_since=since, app_id=self.app_id)).deliveries or ())

    def redeliver(self, delivery_id: int) -> None:
        self._ask(AppRequest(redeliver=delivery_id, app_id=self.app_id))

    def _ask(self, request: AppRequest) -> AppAnswer:
        try:
            response = self.client.invoke(
                FunctionName=self.function_name,
                InvocationType="RequestResponse",
                Payload=request.model_dump_json(exclude_none=True).encode(),
            )
            payload = json.loads(response["Payload"].read() or b"null")
        except (ClientError, BotoCoreError) as exc:
            raise GitHubUnavailableError(f"the token function could not be invoked: {exc}") from exc
        if "FunctionError" in response:
            raise GitHubUnavailableError(f"the token function failed: {payload}")
        answer = AppAnswer.model_validate(payload)
        if answer.error is not None:
            raise raised(answer.error)
        return answer
