"""The pool queues: one SQS queue per pool partition (resource class, usage, architecture), one message
per idle, vetted instance of that partition (domain/pool_partitions.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from aws_cdk import Acknowledgment, Aws, Duration, Fn, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from runner_pool.domain.config import ConfigError, StackConfig
from runner_pool.domain.pool_partitions import (
    QUEUE_NAME_LIMIT,
    PoolPartition,
    longest_queue_name,
    queue_name_prefix,
)

SQS_MIN_RETENTION_SECONDS = 60
SQS_MAX_RETENTION_SECONDS = 14 * 86_400
RETENTION_MARGIN_SECONDS = 300
"""Slack past the idle time, so clock skew never lets SQS drop a message whose instance is still idle."""


class PoolQueues(Construct):
    """The pool queue of every partition of the config's classes; `by_partition` maps each to its queue.

    Queues are named `<stack>-pool-<partition>` so that a function is told one URL prefix
    (`url_prefix`) instead of every queue's URL.
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig) -> None:
        super().__init__(scope, construct_id)
        self.resource_classes = tuple(config.resource_classes)
        retention = Duration.seconds(message_retention_seconds(config))
        prefix = queue_name_prefix(Stack.of(self).stack_name)
        longest = longest_queue_name(prefix, config.resource_classes)
        if len(longest) > QUEUE_NAME_LIMIT:
            raise ConfigError(
                [
                    f"resource_classes: the pool queue {longest!r} would have {len(longest)} characters, "
                    f"more than SQS's {QUEUE_NAME_LIMIT}; fix: shorten the longest class name or the "
                    "stack's name"
                ]
            )
        self.by_partition: Mapping[PoolPartition, sqs.Queue] = MappingProxyType(
            {
                partition: sqs.Queue(
                    self,
                    partition.name,
                    queue_name=partition.queue_name(prefix),
                    # SQS-owned keys: pool messages hold instance facts, not secrets, and no
                    # producer or consumer then needs a KMS grant.
                    encryption=sqs.QueueEncryption.SQS_MANAGED,
                    retention_period=retention,
                )
                for partition in PoolPartition.every(config.resource_classes)
            }
        )
        # One policy for every pool queue rather than CDK's one per queue (`enforce_ssl`): a stack has
        # four queues per class, and each resource counts against CloudFormation's 500 per template
        # (CloudFormation User Guide, "CloudFormation quotas": Resources).
        require_tls = sqs.QueuePolicy(self, "RequireTls", queues=list(self.queues))
        require_tls.document.add_statements(
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["sqs:*"],
                resources=[queue.queue_arn for queue in self.queues],
                conditions={"Bool": {"aws:SecureTransport": "false"}},
            )
        )
        self.url_prefix: str = queue_url_prefix(prefix)
        Validations.of(self).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason=(
                    "Pool messages are never redriven: a pool message is an offer, not work that can fail, "
                    "and every pickup that reads past an offer it cannot use receives it and releases it "
                    "again, so a receive count says nothing about a message being poison and a redrive "
                    "would take good offers out of the pool. A message whose idle time has run out is "
                    "dropped by pickup, and SQS's retention removes it soon after."
                ),
            )
        )

    @property
    def queues(self) -> list[sqs.Queue]:
        return list(self.by_partition.values())


def queue_url_prefix(name_prefix: str) -> str:
    """The URL of every queue of this stack's account and region whose name starts with `name_prefix`,
    up to the rest of its name: a queue's URL is `https://sqs.<region>.<domain>/<account>/<name>` (SQS
    Developer Guide, "Amazon SQS queue and message identifiers": Queue name and URL)."""
    return Fn.join(
        "", ["https://sqs.", Aws.REGION, ".", Aws.URL_SUFFIX, "/", Aws.ACCOUNT_ID, "/", name_prefix]
    )


def message_retention_seconds(config: StackConfig) -> int:
    """Long enough for a message to outlive its instance's idle time, and no longer than that by much.

    A pool message is worth something only while its instance is idle; after that the pickup manager
    drops it as stale, so SQS may as well drop it first.
    """
    idle_seconds = config.timeouts.idle_seconds
    seconds = max(SQS_MIN_RETENTION_SECONDS, math.ceil(idle_seconds) + RETENTION_MARGIN_SECONDS)
    if seconds > SQS_MAX_RETENTION_SECONDS:
        limit = SQS_MAX_RETENTION_SECONDS - RETENTION_MARGIN_SECONDS
        raise ConfigError(
            [
                f"timeouts.idle_seconds: {idle_seconds:.0f} s is longer than a pool queue "
                f"can keep a message (14 days); fix: set at most {limit}"
            ]
        )
    return seconds
