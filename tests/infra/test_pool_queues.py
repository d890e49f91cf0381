"""The pool queues as synthesised: one per configured class, encrypted, SSL only, retained long enough."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from aws_cdk import CfnElement

from infra.constructs.pool_queues import SQS_MAX_RETENTION_SECONDS
from runner_pool.domain.config import ConfigError
from tests.infra.synthesis import Synthesis, app_with

QUEUE = "AWS::SQS::Queue"
QUEUE_POLICY = "AWS::SQS::QueuePolicy"


def queues(synthesis: Synthesis) -> Mapping[str, Mapping[str, Any]]:
    """The pool queues (the stack's other queues are the demand queue and its dead letters)."""
    pool = set(queue_ids_by_class(synthesis).values())
    return {logical_id: queue for logical_id, queue in all_queues(synthesis).items() if logical_id in pool}


def all_queues(synthesis: Synthesis) -> Mapping[str, Mapping[str, Any]]:
    return {
        logical_id: resource
        for logical_id, resource in synthesis.resources.items()
        if resource["Type"] == QUEUE
    }


def queue_ids_by_class(synthesis: Synthesis) -> dict[str, str]:
    """Each class of the construct's mapping and the logical id of its queue in the template."""
    stack = synthesis.stack
    return {
        name: stack.get_logical_id(cast(CfnElement, queue.node.default_child))
        for name, queue in stack.pool_queues.by_class.items()
    }


def test_each_configured_class_has_its_own_queue(synthesis: Synthesis) -> None:
    # Given the classes cdk.json configures
    classes = set(synthesis.config.resource_classes)

    # When the stack is synthesised
    by_class = queue_ids_by_class(synthesis)

    # Then each class maps to a distinct queue of the template, and there are no other pool queues
    assert set(by_class) == classes
    assert len(set(by_class.values())) == len(classes)
    pool_paths = {logical_id for logical_id in all_queues(synthesis) if logical_id.startswith("PoolQueues")}
    assert set(by_class.values()) == pool_paths


def test_an_operators_own_classes_get_exactly_their_queues(custom_synthesis: Synthesis) -> None:
    # Given an operator's class list / When the stack is synthesised / Then only those classes have queues
    by_class = queue_ids_by_class(custom_synthesis)
    assert set(by_class) == {"small", "build-farm"}
    pool_paths = {
        logical_id for logical_id in all_queues(custom_synthesis) if logical_id.startswith("PoolQueues")
    }
    assert set(by_class.values()) == pool_paths


def test_every_queue_is_encrypted(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When all its queues are read (pool, demand, dead letters)
    encrypted = {
        logical_id: q["Properties"].get("SqsManagedSseEnabled")
        for logical_id, q in all_queues(synthesis).items()
    }

    # Then there are queues, and each uses SQS-managed server-side encryption
    assert encrypted
    assert set(encrypted.values()) == {True}


def test_every_queue_refuses_requests_without_tls(synthesis: Synthesis) -> None:
    # Given the synthesised stack
    denies_plain_http = {
        "Effect": "Deny",
        "Action": "sqs:*",
        "Principal": {"AWS": "*"},
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }

    # When its queue policies are read
    guarded = {
        queue["Ref"]
        for policy in synthesis.resources.values()
        if policy["Type"] == QUEUE_POLICY
        if any(
            {key: statement.get(key) for key in denies_plain_http} == denies_plain_http
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        )
        for queue in policy["Properties"]["Queues"]
    }

    # Then every queue of the stack has a policy that denies plain HTTP
    assert guarded == set(all_queues(synthesis))


@pytest.mark.parametrize("synthesis_name", ["synthesis", "custom_synthesis"])
def test_a_message_outlives_its_instances_idle_time(
    synthesis_name: str, request: pytest.FixtureRequest
) -> None:
    # Given a stack synthesised with the design's idle time, or an operator's longer one
    synthesis: Synthesis = request.getfixturevalue(synthesis_name)

    # When its queues' retention is read
    retention = {q["Properties"]["MessageRetentionPeriod"] for q in queues(synthesis).values()}

    # Then SQS keeps every pool message at least as long as its instance may stay idle
    assert len(retention) == 1
    assert retention.pop() >= synthesis.config.timeouts.idle_seconds


def test_an_idle_time_longer_than_sqs_can_keep_a_message_fails_naming_the_setting(tmp_path: Path) -> None:
    # Given an idle time beyond SQS's 14-day retention limit
    settings = {"timeouts": {"idle_seconds": SQS_MAX_RETENTION_SECONDS + 1}}

    # When the app is built / Then it fails with a message that names the setting and the fix
    with pytest.raises(ConfigError, match=r"timeouts\.idle_seconds: .* fix: set at most"):
        app_with(settings, tmp_path)
