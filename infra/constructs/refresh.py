"""Refresh (DESIGN.md section 8): one Lambda on an EventBridge schedule at the configured rate."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constructs import permissions
from infra.constructs.resources import StackResources

REFRESH_TIMEOUT_SECONDS = 50
"""Under the shortest schedule (one minute), so one run ends before the next is due."""


class Refresh(Construct):
    """`function` is the refresh Lambda; `schedule` the rule that invokes it."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        resources: StackResources,
        *,
        provision: sfn.IStateMachine,
        release: sfn.IStateMachine,
    ) -> None:
        super().__init__(scope, construct_id)
        functions, table, pool_queues = resources.functions, resources.table, resources.pool_queues
        notice_queues, github_tokens = resources.instances.notice_queues, resources.github_tokens
        self.function = functions.function(
            self,
            "refresh.refresh",
            description="terminates what expired, sweeps orphans, keeps the warm pool, asks for redeliveries",
            environment={
                "pool_queue_url_prefix": pool_queues.url_prefix,
                "notice_queue_url_prefix": notice_queues.url_prefix,
                **resources.launch_environment(),
                # A dead runner's release and replacement, and reconciled queued jobs.
                "provision_state_machine_arn": provision.state_machine_arn,
                "release_state_machine_arn": release.state_machine_arn,
            },
            timeout=Duration.seconds(REFRESH_TIMEOUT_SECONDS),
            # No reserved concurrency (accounts with a low quota could not create the stack): two
            # overlapping runs are safe, each piece of work is claimed by a conditional write.
        )
        permissions.sweep_thresholds(self.function, table)
        permissions.write_records(self.function, table)
        permissions.describe_instances(self.function)
        permissions.terminate_stack_instances(self.function)
        permissions.stop_stack_instances(self.function)  # the stopped tier
        resources.grant_launches(self.function)
        permissions.sweep_pool(self.function, pool_queues.queues, table)
        permissions.open_notice_queues(self.function, notice_queues)
        permissions.sweep_notice_queues(self.function, notice_queues)
        permissions.act_as_github_app(self.function, github_tokens)
        permissions.start_executions(self.function, [provision.state_machine_arn, release.state_machine_arn])
        permissions.reconcile_recent_demand(self.function, table)
        permissions.read_class_history(self.function, table)  # adaptive sizing; boot times it admits
        permissions.record_costs(self.function, table)  # each instance's life as it ends
        permissions.read_costs(self.function, table)  # the daily budget
        # Reconciling a run's queued jobs counts the runners of ours it still holds (StateTable.held_by).
        permissions.find_by_run_key(self.function, table)
        self.schedule = events.Rule(
            self,
            "Schedule",
            description="runner-pool: refresh",
            schedule=events.Schedule.rate(Duration.minutes(resources.config.refresh_rate_minutes)),
            # A missed slot is covered by the next one; retrying a stale one only piles up.
            targets=[targets.LambdaFunction(self.function, retry_attempts=0)],
        )
