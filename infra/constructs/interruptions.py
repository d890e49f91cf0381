"""EC2's notices about instances (domain/interruptions.py): EventBridge rules into the Lambda."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from constructs import Construct

from infra.constructs import permissions
from infra.constructs.resources import StackResources
from runner_pool.domain.interruptions import EC2_SOURCE, GONE, STOPPING, Notice

INTERRUPTIONS_TIMEOUT_SECONDS = 30
"""A few reads and conditional writes of one record; far within the two minutes a warning gives."""
RETRY_ATTEMPTS = 8
"""EventBridge retries a failed invocation (a throttled function, a table briefly unreachable): a notice
lost is an instance that waits for refresh to notice it gone, or a job whose interruption goes unseen."""


class Interruptions(Construct):
    """`function` hears the notices; `warnings` and `state_changes` are the rules that deliver them."""

    def __init__(self, scope: Construct, construct_id: str, resources: StackResources) -> None:
        super().__init__(scope, construct_id)
        self.function = resources.functions.function(
            self,
            "interruptions.hear",
            description="hears EC2's spot interruption warnings, rebalance recommendations and state changes",
            environment={},
            timeout=Duration.seconds(INTERRUPTIONS_TIMEOUT_SECONDS),
        )
        # Expire, or mark interrupted: conditional writes of the record it has just read.
        permissions.transition_records(self.function, resources.table)
        # A spot instance's interruption counted for its class's circuit breaker.
        permissions.count_spot_interruptions(self.function, resources.table)
        # EC2's events carry no tags, so no pattern can narrow them to the stack's instances: the function
        # leaves alone an instance with no record (domain/interruptions.py).
        target = targets.LambdaFunction(
            self.function, retry_attempts=RETRY_ATTEMPTS, max_event_age=Duration.minutes(2)
        )
        self.warnings = events.Rule(
            self,
            "Warnings",
            description="runner-pool: EC2 spot interruption warnings and rebalance recommendations",
            event_pattern=events.EventPattern(
                source=[EC2_SOURCE], detail_type=[Notice.INTERRUPTION.value, Notice.REBALANCE.value]
            ),
            targets=[target],
        )
        self.state_changes = events.Rule(
            self,
            "StateChanges",
            description="runner-pool: EC2 instances stopping or going away",
            event_pattern=events.EventPattern(
                source=[EC2_SOURCE],
                detail_type=[Notice.STATE_CHANGE.value],
                # Only states that can change what a record means: launches and starts say nothing new.
                detail={"state": sorted(GONE | STOPPING)},
            ),
            targets=[target],
        )
