"""`runner-pool doctor` finds what it examines in the stack as deployed: the synthesised template in moto."""

from __future__ import annotations

from typing import Any

import boto3

from emulator.harness.control_plane import REGION
from runner_pool.checkup import Target
from runner_pool.domain.records import Arch
from tests.infra.synthesis import Synthesis
from tests.infra.test_deploy_on_moto import deployed

__all__ = ["deployed"]  # the deployed stack, a fixture of this module too


def test_the_doctor_reads_the_deployed_stacks_outputs_and_its_functions_environment(
    deployed: dict[str, Any], synthesis: Synthesis
) -> None:
    # Given the stack deployed as `cdk deploy` deploys it
    cloudformation = boto3.client("cloudformation", region_name=REGION)

    # When the doctor looks for its target
    target = Target.of_stack(
        synthesis.stack.stack_name, cloudformation, boto3.client("lambda", region_name=REGION)
    )

    # Then it has the stack's config, webhook URL, provision state machine and launch templates
    assert target.stack.config == synthesis.config
    assert target.stack.webhook_url == deployed["outputs"]["WebhookUrl"]
    assert target.provision_state_machine_arn == deployed["outputs"]["ProvisionStateMachineArn"]
    assert set(target.launch_templates) == set(Arch)
    ec2 = boto3.client("ec2", region_name=REGION)
    found = ec2.describe_launch_templates(LaunchTemplateIds=list(target.launch_templates.values()))
    assert len(found["LaunchTemplates"]) == len(Arch)
