"""The webhook's secrets on moto's Secrets Manager: every App's secret signs deliveries the webhook takes."""

from __future__ import annotations

import hashlib
import hmac

from moto import mock_aws

from runner_pool.adapters import aws_clients
from runner_pool.adapters.webhook_secret import AppsWebhookSecrets
from runner_pool.domain.clock import ManualClock

BODY = b'{"zen": "Keep it logically awesome."}'


def signature(secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), BODY, hashlib.sha256).hexdigest()


def test_a_delivery_signed_by_any_of_the_apps_is_taken_and_one_signed_by_none_is_not() -> None:
    with mock_aws():
        # Given two Apps' webhook secrets in Secrets Manager
        client = aws_clients.client("secretsmanager")
        for name, secret in (("app-1-webhook", "first"), ("app-2-webhook", "second")):
            client.create_secret(Name=name, SecretString=secret)
        secrets = AppsWebhookSecrets(["app-1-webhook", "app-2-webhook"], client, ManualClock())
        # When deliveries signed by each App, and one signed with neither secret, are checked
        checked = [secrets.signed(BODY, signature(secret)) for secret in ("first", "second", "a guess")]
    # Then each App's delivery is taken, and the forgery is not
    assert checked == [True, True, False]
