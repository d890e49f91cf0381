"""The provision state machine (DESIGN.md section 6) and what each of its steps may do."""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constructs import permissions
from infra.constructs.resources import StackResources
from infra.constructs.retries import IDEMPOTENT, IDEMPOTENT_LAUNCH, LAST_RESORT, REFUSE_OR_RETRY
from infra.constructs.workflow import Step, Workflow, state_machine_arn


class Provision(Construct):
    """`state_machine` is what the dispatcher starts, one execution per batch of demand."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        resources: StackResources,
        *,
        release: sfn.IStateMachine,
    ) -> None:
        super().__init__(scope, construct_id)
        config, functions, table = resources.config, resources.functions, resources.table
        pool_queues, instances, github_tokens = (
            resources.pool_queues,
            resources.instances,
            resources.github_tokens,
        )
        queues = pool_queues.queues
        notice_queues = instances.notice_queues
        hand_off = {
            "credentials_key_id": instances.credentials_key.key_id,
            "notice_queue_url_prefix": notice_queues.url_prefix,
        }
        # Finish and Dump start executions of this very machine (redrives): named, so their roles can
        # name its ARN without referring to the machine they are part of.
        name = f"{Stack.of(self).stack_name}-provision"
        own_arn = state_machine_arn(self, name)

        def claim(function: lambda_.Function) -> None:
            permissions.send_notices(function, notice_queues)  # the agent hears of its config at once
            permissions.take_from_pool(function, queues, table)
            permissions.write_records(function, table)
            permissions.find_by_run_key(function, table)  # a retried claim step finds its own claim
            permissions.hand_off_runner_configs(function, instances.credentials_key, github_tokens)
            permissions.start_from_stopped_tier(function, table, instances.volume_key)  # no hot instance

        def create(function: lambda_.Function) -> None:
            resources.grant_launches(function)
            permissions.describe_instances(function)
            permissions.open_notice_queues(function, notice_queues)
            hand_over(function)

        def hand_over(function: lambda_.Function) -> None:
            """Runner configs to created instances, as the registration budget (a state-table item) allows."""
            permissions.write_records(function, table)
            permissions.hand_off_runner_configs(function, instances.credentials_key, github_tokens)
            permissions.send_notices(function, notice_queues)

        def begin(function: lambda_.Function) -> None:
            permissions.write_records(function, table)  # the run's demand; the claims of its one pickup
            # One pickup for every slot
            permissions.take_from_pool(function, queues, table)
            permissions.find_by_run_key(function, table)  # a retried Begin finds its own claims
            # It hands its claims their configs side by side before the workers start.
            permissions.hand_off_runner_configs(function, instances.credentials_key, github_tokens)
            permissions.send_notices(function, notice_queues)

        def finish(function: lambda_.Function) -> None:
            expire(function)
            permissions.end_provisions(function, table, [own_arn, release.state_machine_arn], github_tokens)

        def expire(function: lambda_.Function) -> None:
            """Expire and terminate what failed or what a failed execution holds."""
            permissions.write_records(function, table)
            permissions.describe_instances(function)
            permissions.terminate_stack_instances(function)

        def dump(function: lambda_.Function) -> None:
            finish(function)
            permissions.find_by_run_key(function, table)
            permissions.offer_to_pool(function, queues)  # a claimed instance never handed a runner

        def check(function: lambda_.Function) -> None:
            permissions.check_readiness(function, table)

        # The fleet adapter is built with its subnets even when it only terminates.
        fleet_environment = {"subnet_ids": config.network.subnet_ids}
        # A Finish or Dump that finds its run finished hands what has a runner to a release of the run.
        finish_environment = {**fleet_environment, "release_state_machine_arn": release.state_machine_arn}
        self.workflow = Workflow(
            self,
            "Workflow",
            machine="provision",
            functions=functions,
            workflow_type=config.workflow_type,
            state_machine_name=name,
            steps={
                "begin": Step(
                    "resolves the label, notes the run's demand, picks up and claims warm instances for "
                    "every slot at once and hands them their runner configs",
                    begin,
                    {**hand_off, "pool_queue_url_prefix": pool_queues.url_prefix},
                    timeout_seconds=120,
                    retry=REFUSE_OR_RETRY,
                ),
                "claim": Step(
                    "picks up a warm instance (hot, else stopped and started), claims it and hands it its "
                    "runner config",
                    grant=claim,
                    environment={
                        **hand_off,
                        **fleet_environment,
                        "pool_queue_url_prefix": pool_queues.url_prefix,
                    },
                    retry=IDEMPOTENT,
                ),
                "check_claim": Step(
                    "reads a claimed instance's heartbeat and signal", check, retry=IDEMPOTENT
                ),
                "discard": Step(
                    "expires and terminates a candidate that failed",
                    expire,
                    fleet_environment,
                    retry=IDEMPOTENT,
                ),
                "create": Step(
                    "launches the shortfall with one CreateFleet and records every instance",
                    grant=create,
                    environment={
                        **hand_off,
                        **resources.launch_environment(),
                    },
                    timeout_seconds=120,
                    retry=IDEMPOTENT_LAUNCH,
                ),
                "check_fleet": Step(
                    "hands runner configs to new instances still waiting for one, reads their heartbeats",
                    hand_over,
                    hand_off,
                    # Create's time: it makes the same hand-overs, ten side by side, then reads each pending
                    # instance. At 30 s it timed out on every retry under load (the 1,000-job burst:
                    # one of three executions failed so).
                    timeout_seconds=120,
                    retry=IDEMPOTENT,
                ),
                "finish": Step(
                    "sets ready instances running, expires the rest, asks again for what is missing",
                    finish,
                    finish_environment,
                    timeout_seconds=60,
                    retry=IDEMPOTENT,
                ),
                "dump": Step(
                    "keeps what is registered, gives back or terminates the rest of a failed execution",
                    dump,
                    {**finish_environment, "pool_queue_url_prefix": pool_queues.url_prefix},
                    timeout_seconds=120,
                    retry=LAST_RESORT,
                ),
            },
        )
        self.state_machine = self.workflow.state_machine
