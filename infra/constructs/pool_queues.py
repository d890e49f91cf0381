"""The pool queues: one SQS queue per resource class, one message per idle, vetted instance of that class."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from aws_cdk import Acknowledgment, Duration, Validations
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from runner_pool.domain.config import ConfigError, StackConfig

SQS_MIN_RETENTION_SECONDS = 60
SQS_MAX_RETENTION_SECONDS = 14 * 86_400
RETENTION_MARGIN_SECONDS = 300
"""Slack past the idle time, so clock skew never lets SQS drop a message whose instance is still idle."""


class PoolQueues(Construct):
    """The pool queue of every resource class in the config; `by_class` maps each class to its queue."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig) -> None:
        super().__init__(scope, construct_id)
        retention = Duration.seconds(message_retention_seconds(config))
        self.by_class: Mapping[str, sqs.Queue] = MappingProxyType(
            {
                name: sqs.Queue(
                    self,
                    name,
                    # SQS-owned keys: pool messages hold instance facts, not secrets, and no
                    # producer or consumer then needs a KMS grant.
                    encryption=sqs.QueueEncryption.SQS_MANAGED,
                    enforce_ssl=True,
                    retention_period=retention,
                )
                for name in config.resource_classes
            }
        )
        Validations.of(self).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason=(
                    "Pool messages are never redriven: the pickup manager deletes each batch right after "
                    "receiving it and sends non-matches back as new messages, so no message is received "
                    "again and again and a receive-count redrive would never fire. A message that a "
                    "crashed pickup took with it only leaves its idle instance unused until the "
                    "instance's threshold passes and refresh terminates it."
                ),
            )
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
