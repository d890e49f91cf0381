"""The release state machine (DESIGN.md section 7) and what each of its steps may do."""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.constructs import permissions
from infra.constructs.resources import StackResources
from infra.constructs.retries import IDEMPOTENT, RELEASE
from infra.constructs.workflow import Step, Workflow, state_machine_arn


class Release(Construct):
    """`state_machine` is what the dispatcher starts when a job or a run completes."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        resources: StackResources,
    ) -> None:
        super().__init__(scope, construct_id)
        config, functions, table = resources.config, resources.functions, resources.table
        pool_queues, github_tokens = resources.pool_queues, resources.github_tokens
        notice_queues = resources.instances.notice_queues
        # StartParts starts executions of this very machine (a run's release in parts): named, so its role
        # can name its ARN without referring to the machine it is part of.
        name = f"{Stack.of(self).stack_name}-release"
        own_arn = state_machine_arn(self, name)

        def plan(function: lambda_.Function) -> None:
            permissions.find_by_run_key(function, table)
            permissions.mark_runs_finished(function, table)

        def start_parts(function: lambda_.Function) -> None:
            permissions.start_executions(function, [own_arn])

        def give_back(function: lambda_.Function) -> None:
            permissions.write_records(function, table)
            permissions.send_notices(function, notice_queues)  # the agent cleans up at once
            permissions.act_as_github_app(function, github_tokens)
            permissions.record_costs(function, table)  # the hand-over it ends

        def check_receipt(function: lambda_.Function) -> None:
            permissions.write_records(function, table)
            permissions.offer_to_pool(function, pool_queues.queues)

        def salvage(function: lambda_.Function) -> None:
            permissions.write_records(function, table)

        self.workflow = Workflow(
            self,
            "Workflow",
            machine="release",
            functions=functions,
            workflow_type=config.workflow_type,
            state_machine_name=name,
            steps={
                "plan": Step("finds the instances a completed job or run holds", plan, retry=RELEASE),
                "start_parts": Step(
                    "starts the parts of a run's release too large for one execution",
                    start_parts,
                    retry=IDEMPOTENT,
                ),
                "give_back": Step(
                    "sets an instance idle and deletes its runner if no job took it",
                    give_back,
                    {"notice_queue_url_prefix": notice_queues.url_prefix},
                    retry=RELEASE,
                ),
                "check_receipt": Step(
                    "pools an instance once its agent has cleaned up, or expires it",
                    check_receipt,
                    {"pool_queue_url_prefix": pool_queues.url_prefix},
                    retry=RELEASE,
                ),
                "salvage": Step("expires what a failed release step held", salvage, retry=IDEMPOTENT),
            },
        )
        self.state_machine = self.workflow.state_machine
