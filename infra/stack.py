"""The runner-pool stack: composes one construct per concern and nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import CfnOutput, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.constructs import (
    ControlPlaneFunctions,
    GitHubTokens,
    Ingress,
    Instances,
    Interruptions,
    Observability,
    PoolQueues,
    Provision,
    Refresh,
    Release,
    RunnerImage,
    StateTable,
)
from infra.constructs.ingress import WEBHOOK_PATH
from infra.constructs.job_logs import JobLogs
from infra.constructs.resources import StackResources
from infra.dependency_layer import DependencyLayer
from runner_pool.domain.config import StackConfig


class RunnerPoolStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        layer: DependencyLayer,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description="runner-pool: a warm pool of self-hosted EC2 runners for GitHub Actions",
            **kwargs,
        )
        self.state_table = StateTable(self, "StateTable")
        self.pool_queues = PoolQueues(self, "PoolQueues", config=config)
        self.job_logs = JobLogs(self, "JobLogs", config=config)
        self.instances = Instances(
            self,
            "Instances",
            config=config,
            vpc=self._runner_vpc(config),
            table=self.state_table.table,
            job_logs=self.job_logs,
        )
        self.runner_image = RunnerImage(
            self,
            "RunnerImage",
            config=config,
            instances=self.instances,
            subnet_ids=config.network.subnet_ids,
        )
        # Imported by name, never created here: the operator stores them before the first deploy, so
        # the key never passes through CloudFormation and outlives a stack teardown (README: Deploying).
        # One of each per App; the first keeps the single App's construct id, so its import is unchanged.
        apps = config.github.every_app
        self.github_app_keys = self._imported_secrets(
            "GitHubAppPrivateKey",
            [app.private_key_secret_name for app in apps] or [config.github.private_key_secret_name],
        )
        self.github_app_key = self.github_app_keys[0]
        self.webhook_secrets = self._imported_secrets(
            "GitHubWebhookSecret", config.github.webhook_secret_names
        )
        self.functions = ControlPlaneFunctions(
            self, "Functions", config=config, layer=layer, table=self.state_table.table
        )
        self.github_tokens = GitHubTokens(
            self, "GitHubTokens", functions=self.functions, github_app_keys=self.github_app_keys
        )
        resources = StackResources(
            config=config,
            functions=self.functions,
            table=self.state_table.table,
            pool_queues=self.pool_queues,
            instances=self.instances,
            github_tokens=self.github_tokens.function,
        )
        self.release = Release(self, "Release", resources)
        self.provision = Provision(self, "Provision", resources, release=self.release.state_machine)
        self.refresh = Refresh(
            self,
            "Refresh",
            resources,
            provision=self.provision.state_machine,
            release=self.release.state_machine,
        )
        self.interruptions = Interruptions(self, "Interruptions", resources)
        self.ingress = Ingress(
            self,
            "Ingress",
            resources,
            webhook_secrets=self.webhook_secrets,
            provision=self.provision.state_machine,
            release=self.release.state_machine,
        )
        self.ingress.rerun_from(self.release.workflow.functions["give_back"])
        self.observability = Observability(
            self,
            "Observability",
            config=config,
            state_machines={
                "provision": self.provision.state_machine,
                "release": self.release.state_machine,
                "follow_up": self.ingress.follow_up.state_machine,
            },
            pool_queues={p.name: q for p, q in self.pool_queues.by_partition.items()},
            dead_letter_queues={"Demand": self.ingress.dead_letters},
            scheduled_functions={"refresh": self.refresh.function},
            functions=[
                self.interruptions.function,
                *self.provision.workflow.functions.values(),
                *self.release.workflow.functions.values(),
                *self.ingress.follow_up.functions.values(),
                self.refresh.function,
                self.ingress.webhook,
                self.ingress.dispatcher,
                self.github_tokens.function,
            ],
            api_name=self.ingress.api.rest_api_name,
        )
        self._outputs(config)

    def _imported_secrets(self, construct_id: str, names: Sequence[str]) -> list[secretsmanager.ISecret]:
        return [
            secretsmanager.Secret.from_secret_name_v2(self, construct_id + (str(i) if i else ""), name)
            for i, name in enumerate(names)
        ]

    def _runner_vpc(self, config: StackConfig) -> ec2.IVpc:
        """The operator's VPC, by id: nothing is looked up at synth, so synth needs no AWS credentials.

        Only the instances' security group reads it, and that needs the id alone; the zone is one CDK
        requires and nothing reads (the subnets reach CreateFleet through the Lambdas' environment).
        """
        return ec2.Vpc.from_vpc_attributes(
            self,
            "RunnerVpc",
            vpc_id=config.network.vpc_id or "",
            availability_zones=[Fn.select(0, Fn.get_azs())],
        )

    def _outputs(self, config: StackConfig) -> None:
        """What the operator CLI (`runner-pool`) reads to find the tables, queues and state machines, and to
        price them."""
        CfnOutput(self, "StateTableName", value=self.state_table.table.table_name)
        CfnOutput(
            self,
            "DemandLedgerTableName",
            value=self.ingress.idempotency_table.table_name,
            description="The demand ledger: which jobs were counted, and by which provision",
        )
        CfnOutput(
            self,
            "RootVolumeGib",
            value=str(config.instances.root_volume_gib),
            description="Each instance's gp3 root volume: what a stopped instance still pays for",
        )
        CfnOutput(self, "PoolQueueUrlPrefix", value=self.pool_queues.url_prefix)
        CfnOutput(
            self,
            "JobLogGroupName",
            value=self.job_logs.name,
            description="The instances' agent and runner logs, two streams per instance (runner-pool logs)",
        )
        CfnOutput(self, "NoticeQueueUrlPrefix", value=self.instances.notice_queues.url_prefix)
        CfnOutput(
            self, "ResourceClasses", value=self.to_json_string(sorted(self.pool_queues.resource_classes))
        )
        CfnOutput(
            self,
            "WebhookUrl",
            value=self.ingress.api.url_for_path(f"/{WEBHOOK_PATH}"),
            description="The GitHub App's webhook URL",
        )
        CfnOutput(self, "ProvisionStateMachineArn", value=self.provision.state_machine.state_machine_arn)
        CfnOutput(self, "ReleaseStateMachineArn", value=self.release.state_machine.state_machine_arn)
        CfnOutput(self, "DashboardName", value=self.observability.dashboard.dashboard_name)
        CfnOutput(
            self,
            "RunnerImagePipelineArns",
            value=self.to_json_string(
                {arch.value: pipeline.attr_arn for arch, pipeline in self.runner_image.pipelines.items()}
            ),
            description="The runner image pipelines (aws imagebuilder start-image-pipeline-execution)",
        )
