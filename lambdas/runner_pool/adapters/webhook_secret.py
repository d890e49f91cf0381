"""The webhook secret from Secrets Manager (through Powertools parameters, cached), checked so that a
rotation loses no delivery.

Rotating means two changes that cannot happen at the same instant: a new version of the secret in
Secrets Manager (the old one becomes AWSPREVIOUS) and the new secret in the GitHub App's settings.
Deliveries signed with either are accepted:

- the cached current version is tried first: the only cost of a normal delivery is the HMAC;
- then the previous version, remembered from the last look, for deliveries GitHub still signs with
  the old secret after Secrets Manager moved on;
- then, once per REFRESH_FLOOR_SECONDS at most, both versions are fetched afresh, for the cache
  that still holds the old secret after GitHub moved on. The floor keeps a flood of forged
  requests from turning into a flood of Secrets Manager calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_lambda_powertools.utilities.parameters import SecretsProvider
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError
from botocore.exceptions import ClientError

from runner_pool.adapters.aws_clients import error_code
from runner_pool.domain.clock import Clock
from runner_pool.domain.webhooks import signature_matches

CACHE_SECONDS = 300
REFRESH_FLOOR_SECONDS = 30
PREVIOUS_STAGE = "AWSPREVIOUS"


class WebhookSecret:
    def __init__(self, name: str, client: Any, clock: Clock) -> None:
        self._name = name
        self._clock = clock
        # Powertools caches by name alone, whatever version is asked for: one provider per version.
        self._current = SecretsProvider(boto3_client=client)
        self._previous_provider = SecretsProvider(boto3_client=client)
        self._previous: bytes | None = None
        self._refreshed_at: float | None = None

    def signed(self, body: bytes, signature: str) -> bool:
        """Whether the current or previous version of the secret signed `body` (see the module doc)."""
        if signature_matches(body, signature, self._versions(refresh=False)):
            return True
        now = self._clock.now()
        if self._refreshed_at is not None and now - self._refreshed_at < REFRESH_FLOOR_SECONDS:
            return False
        self._refreshed_at = now
        return signature_matches(body, signature, self._versions(refresh=True))

    def _versions(self, refresh: bool) -> list[bytes]:
        current = _bytes(self._current.get(self._name, max_age=CACHE_SECONDS, force_fetch=refresh))
        if refresh:
            self._previous = self._fetch_previous()
        return [current] if self._previous is None else [current, self._previous]

    def _fetch_previous(self) -> bytes | None:
        try:
            value = self._previous_provider.get(
                self._name, max_age=CACHE_SECONDS, force_fetch=True, VersionStage=PREVIOUS_STAGE
            )
        except GetParameterError as exc:
            # Powertools wraps the ClientError; a secret never rotated has no previous version.
            cause = exc.__context__
            if isinstance(cause, ClientError) and error_code(cause) == "ResourceNotFoundException":
                return None
            raise
        return _bytes(value)


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"the webhook secret is a {type(value).__name__}, not a string")


class AppsWebhookSecrets:
    """The webhook secrets of every App the stack acts as: a delivery signed by any of them is accepted.

    GitHub signs each App's deliveries with that App's own secret (docs.github.com, "Validating webhook
    deliveries": the `X-Hub-Signature-256` header is "the HMAC hex digest of the request body ... generated
    using the SHA-256 hash function and the secret as the HMAC key", to be compared with "a constant-time
    string comparison"). Every App's secret is compared, in constant time each, whichever matched first, so
    how long a refusal takes says nothing about which App's secret came close."""

    def __init__(self, names: Sequence[str], client: Any, clock: Clock) -> None:
        if not names:
            raise ValueError("at least one webhook secret is needed")
        self._secrets = [WebhookSecret(name, client, clock) for name in names]

    def signed(self, body: bytes, signature: str) -> bool:
        matched = [secret.signed(body, signature) for secret in self._secrets]  # each one, whatever matched
        return any(matched)
