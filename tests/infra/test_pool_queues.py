"""The pool queues as synthesised: one per partition of the configured classes, named by one prefix,
encrypted, SSL only, retained long enough."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from aws_cdk import CfnElement

from infra.app import STACK_ID
from infra.constructs.pool_queues import SQS_MAX_RETENTION_SECONDS
from runner_pool.domain.config import ConfigError
from runner_pool.domain.pool_partitions import (
    QUEUE_NAME_LIMIT,
    PoolPartition,
    longest_queue_name,
    queue_name_prefix,
)
from runner_pool.domain.records import Arch, UsageClass
from tests.infra.synthesis import Synthesis, app_with

QUEUE = "AWS::SQS::Queue"
QUEUE_POLICY = "AWS::SQS::QueuePolicy"


def queues(synthesis: Synthesis) -> Mapping[str, Mapping[str, Any]]:
    """The pool queues (the stack's other queues are the demand queue and its dead letters)."""
    pool = set(queue_ids_by_partition(synthesis).values())
    return {logical_id: queue for logical_id, queue in all_queues(synthesis).items() if logical_id in pool}


def all_queues(synthesis: Synthesis) -> Mapping[str, Mapping[str, Any]]:
    return {
        logical_id: resource
        for logical_id, resource in synthesis.resources.items()
        if resource["Type"] == QUEUE
    }


def queue_ids_by_partition(synthesis: Synthesis) -> dict[PoolPartition, str]:
    """Each partition of the construct's mapping and the logical id of its queue in the template."""
    stack = synthesis.stack
    return {
        partition: stack.get_logical_id(cast(CfnElement, queue.node.default_child))
        for partition, queue in stack.pool_queues.by_partition.items()
    }


@pytest.mark.parametrize("synthesis_name", ["synthesis", "custom_synthesis"])
def test_each_class_usage_and_architecture_has_its_own_queue_named_by_its_partition(
    synthesis_name: str, request: pytest.FixtureRequest
) -> None:
    # Given the classes cdk.json configures, or an operator's own
    synthesis: Synthesis = request.getfixturevalue(synthesis_name)
    classes = set(synthesis.config.resource_classes)

    # When the stack is synthesised
    by_partition = queue_ids_by_partition(synthesis)

    # Then each class has a distinct queue per usage and architecture, and there are no other pool queues
    assert set(by_partition) == {
        PoolPartition(name, usage, arch) for name in classes for usage in UsageClass for arch in Arch
    }
    pool_paths = {logical_id for logical_id in all_queues(synthesis) if logical_id.startswith("PoolQueues")}
    assert set(by_partition.values()) == pool_paths
    # And each is named `<stack>-pool-<class>-<usage>-<arch>`, within SQS's 80 characters
    names = {p: synthesis.resources[i]["Properties"]["QueueName"] for p, i in by_partition.items()}
    assert names == {p: f"RunnerPool-pool-{p.resource_class}-{p.usage}-{p.arch}" for p in by_partition}
    assert max(len(name) for name in names.values()) <= QUEUE_NAME_LIMIT


def test_the_longest_class_name_still_gives_queue_names_sqs_takes() -> None:
    # Given a class with the longest name a label allows (32 characters), on-demand arm64
    longest = longest_queue_name(queue_name_prefix(STACK_ID), ["a" * 32])
    # Then its queue's name, the longest the stack can have, is within SQS's limit
    assert longest.endswith("-on-demand-arm64")
    assert len(longest) <= QUEUE_NAME_LIMIT


def test_the_stack_stays_far_below_cloudformations_resource_quota(custom_synthesis: Synthesis) -> None:
    # Given the stack with ten classes, twice the default (CloudFormation takes 500 resources a template:
    # CloudFormation User Guide, "CloudFormation quotas"), synthesised with the operator's settings
    # When its resources are counted, and those its pool queues add per class
    classes = len(custom_synthesis.config.resource_classes)
    per_class = len(queues(custom_synthesis)) // classes
    total = len(custom_synthesis.resources) + (10 - classes) * per_class
    # Then each class costs four queues and nothing else (one policy guards them all), and ten classes
    # leave the stack at less than half the quota
    assert per_class == 4
    assert total < 250


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
