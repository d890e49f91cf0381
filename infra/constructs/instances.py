"""The instances: one launch template per architecture, the role every instance runs as, and its key.

The role lets an instance do exactly its side of the protocol and nothing else:

- read only its own items of the state table: `dynamodb:LeadingKeys` must be the
  `${ec2:SourceInstanceARN}` policy variable, which IAM resolves, for requests signed with an
  instance profile's credentials, to the ARN of the instance that made them (its record and runner
  config), or `agent#` and that ARN (its agent's items). It reads one item (GetItem) or, woken by a
  notice, its record and its runner config together (BatchGetItem, authorized as
  `dynamodb:BatchGetItem` on the table: Service Authorization Reference, "Actions, resources, and
  condition keys for Amazon DynamoDB"), both under that one condition; a batch's LeadingKeys are the
  partition keys of every item it names (DynamoDB Developer Guide, specifying-conditions.html), so no
  batch reaches another instance's item;
- write only its agent's items (heartbeat, signal): PutItem whose `dynamodb:LeadingKeys` is
  `agent#${ec2:SourceInstanceARN}`, of the agent's attributes alone. Never under its bare ARN: IAM can
  pin a DynamoDB request to partition keys and attribute names but not to a sort key (DynamoDB
  Developer Guide, specifying-conditions.html), so a write allowed there could replace the control
  plane's `state` item with one that does not parse;
- decrypt only its own runner config: `kms:EncryptionContext:instance-arn` must equal the same
  `${ec2:SourceInstanceARN}`, and the control plane encrypts each config under the ARN of the
  instance it is for (runner_pool.adapters.runner_credentials);
- terminate only itself: `ec2:SourceInstanceARN` must be the ARN of the instance acted on
  (`${ec2:InstanceID}`), the pattern of AWS's own AWSEC2VssSnapshotPolicy;
- read the S3 objects that hold the agent's wheelhouses (one per architecture), and no other;
- write its lines into the job logs' group (infra/constructs/job_logs.py): CreateLogStream and
  PutLogEvents there, no read and no other group (permissions.ship_job_logs says why not its own stream
  only);
- receive (and delete) notices from its own notice queue only: the queue's `runner-pool:instance` tag
  must equal the same `${ec2:SourceInstanceARN}` (aws:ResourceTag, which SQS supports for its queue
  actions: SQS Developer Guide, "ABAC condition keys for Amazon SQS"), and the control plane tags each
  queue with its instance's ARN when it opens it (runner_pool.domain.notices).

Those credentials are the agent's alone: with `instances.block_imds_from_jobs` (the default) the user
data lets only root reach the instance metadata service, so a job, running as the runner user,
cannot take them to forge the instance's signals or read its runner config.

How instances are built (runner version, AMIs, root volume, pre-runner script, the agent's grace
before it ends its own instance) is the `instances` section of the stack config.

What an instance boots is the stack's runner image of its architecture once Image Builder has built one
(infra/constructs/runner_image.py), else the base AMI: each launch template names an SSM parameter of
the stack's (`resolve:ssm:`, resolved by EC2 at every launch), created holding the base AMI and
overwritten by the image pipeline's distribution with each new image. The user data installs what the
image does not already hold at this deploy's pins (infra/instances/user_data.sh).

The agent is installed from a CDK asset per architecture: a wheelhouse of the project's wheel and the
wheels uv.lock pins for its dependencies (infra/agent_wheelhouse.py), which the user data checks by
its SHA-256 and installs offline, so the instance runs the same record models as the control plane,
at the same versions the tests ran. The runner archive is checked by the SHA-256 the `instances`
config gives or knows for its version.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.agent_wheelhouse import BOOT_PYTHONS, AgentWheelhouse, agent_wheelhouse
from infra.constructs import permissions
from infra.constructs.job_logs import JobLogs
from infra.constructs.keys import stack_key
from infra.constructs.notice_queues import NoticeQueueNames
from runner_pool.adapters import state_items as schema
from runner_pool.adapters.runner_credentials import ENCRYPTION_CONTEXT_KEY
from runner_pool.domain import notices
from runner_pool.domain.config import StackConfig
from runner_pool.domain.instance_settings import InstanceSettings
from runner_pool.domain.records import Arch

PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")
USER_DATA_TEMPLATE = Path(__file__).resolve().parents[1] / "instances" / "user_data.sh"
SOURCE_INSTANCE_ARN = "${ec2:SourceInstanceARN}"
"""IAM's policy variable for the instance whose profile credentials signed the request."""
TARGET_INSTANCE_ID = "${ec2:InstanceID}"
"""EC2's condition key for the instance an EC2 action acts on, as a policy variable."""

ANY_INSTANCE_FINDING = "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*"
"""How cdk-nag names the one wildcard of the role, the instance/* of TerminateSelf."""

AGENT_ITEM_ATTRIBUTES = (
    schema.PARTITION_KEY,
    schema.SORT_KEY,
    schema.TTL_ATTRIBUTE,
    "beat_at",
    "signal",
    "signal_run_key",
    "at",
    "reason",
)
"""Every attribute the agent writes (StateTable.write_heartbeat and write_signal), and no other."""
OWN_AGENT_PARTITION = schema.AGENT_PARTITION_PREFIX + SOURCE_INSTANCE_ARN
"""The partition key of the calling instance's agent's items: the only one the instance writes under."""
SESSION_MANAGER_ACTIONS = (
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)
"""What the SSM agent calls to register the instance and carry a session (`_grant_session_manager`)."""


@dataclass(frozen=True)
class UserDataValues:
    """Every placeholder of the user data template, by its lowercase name."""

    runner_version: str
    runner_arch: str
    runner_sha256: str
    wheelhouse_bucket: str
    wheelhouse_key: str
    wheelhouse_sha256: str
    al2023_python: str
    ubuntu_python: str
    pre_runner_script_base64: str
    table_name: str
    credentials_key_id: str
    notice_queue_url_prefix: str
    heartbeat_period_seconds: str
    termination_grace_seconds: str
    retention_days: str
    log_group_name: str
    block_imds_from_jobs: str


BOOT_ONLY_VALUES = (
    "pre_runner_script_base64",
    "table_name",
    "credentials_key_id",
    "notice_queue_url_prefix",
    "heartbeat_period_seconds",
    "termination_grace_seconds",
    "retention_days",
    "log_group_name",
)
"""The placeholders only the boot reads (the agent's settings): the bake leaves them empty, so an image
depends on the pins alone and one image serves every deploy of the same pins."""

IMAGE_PARAMETER_PREFIX = "/imagebuilder/runner-pool"
"""Where the image parameters live. Image Builder writes them with its service-linked role; the prefix is
the one AWS's own examples of SSM output parameters use (aws-cdk's imagebuilder README: `/imagebuilder/ami`),
as that role's policy may scope ssm:PutParameter by it."""


def image_parameter_name(stack_name: str, arch: Arch) -> str:
    """The SSM parameter naming the AMI that instances of `arch` boot: the newest image, else the base AMI."""
    return f"{IMAGE_PARAMETER_PREFIX}/{stack_name}/{arch.value}"


def render_user_data(values: UserDataValues, template: str | None = None) -> str:
    """The user data script with every placeholder replaced; a placeholder left over is an error."""
    script = USER_DATA_TEMPLATE.read_text() if template is None else template
    for field in fields(values):
        script = script.replace(f"@{field.name.upper()}@", getattr(values, field.name))
    leftover = sorted(set(PLACEHOLDER.findall(script)))
    if leftover:
        raise ValueError(f"user data placeholders without a value: {', '.join(leftover)}")
    return script


class Instances(Construct):
    """`launch_templates` maps each architecture to its template; `role` is what CreateFleet passes.

    `wheelhouses` are the agent's, per architecture; built from uv.lock (or taken from their cache)
    when not given.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        vpc: ec2.IVpc,
        table: dynamodb.ITable,
        job_logs: JobLogs,
        wheelhouses: Mapping[Arch, AgentWheelhouse] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        settings = config.instances
        self.notice_queues = NoticeQueueNames(self)
        # What it protects lives minutes: a config is of no use once its claim has expired.
        self.credentials_key = stack_key(
            self,
            "RunnerCredentialsKey",
            "runner-pool: encrypts each instance's JIT runner config for that instance alone",
        )
        self.volume_key: kms.IKey | None = (
            kms.Key.from_key_arn(self, "VolumeKey", settings.ebs_kms_key_arn)
            if settings.ebs_kms_key_arn
            else None
        )
        """The customer managed key of the root volumes (`instances.ebs_kms_key_arn`); None: the account's
        default EBS key."""
        self.wheelhouses: Mapping[Arch, AgentWheelhouse] = MappingProxyType(
            dict(wheelhouses) if wheelhouses is not None else {arch: agent_wheelhouse(arch) for arch in Arch}
        )
        self.wheelhouse_assets: Mapping[Arch, s3_assets.Asset] = MappingProxyType(
            {
                arch: s3_assets.Asset(self, f"AgentWheelhouse-{arch.value}", path=str(wheelhouse.path))
                for arch, wheelhouse in self.wheelhouses.items()
            }
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="runner-pool instances: no inbound traffic; outbound to GitHub, AWS and packages",
            allow_all_outbound=True,
        )
        self._job_logs = job_logs
        self.role = self._instance_role(
            "Role",
            "runner-pool instances: their own items, their own runner config, ending themselves",
            table,
        )
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)
        self.image_parameters: Mapping[Arch, ssm.CfnParameter] = MappingProxyType(
            {arch: self._image_parameter(arch, settings) for arch in Arch}
        )
        self.user_data_values: Mapping[Arch, UserDataValues] = MappingProxyType(
            {arch: self._user_data_values(arch, settings, config, table, job_logs) for arch in Arch}
        )
        self.launch_templates: Mapping[Arch, ec2.LaunchTemplate] = MappingProxyType(
            {arch: self._launch_template(arch, settings, self.instance_profile) for arch in Arch}
        )
        self.session_role: iam.Role | None = None
        """The role of the classes an operator may open Session Manager sessions on (`resource_classes.<class>
        .ssm`): the instance role and the SSM agent's permissions. None when no class has it."""
        self.session_launch_templates: Mapping[Arch, ec2.LaunchTemplate] = MappingProxyType({})
        if config.session_classes:
            self.session_role = self._instance_role(
                "SessionRole",
                "runner-pool instances of classes with Session Manager: the instance role and the SSM agent",
                table,
            )
            self._grant_session_manager(self.session_role)
            profile = iam.InstanceProfile(self, "SessionInstanceProfile", role=self.session_role)
            self.session_launch_templates = MappingProxyType(
                {arch: self._launch_template(arch, settings, profile, prefix="Session") for arch in Arch}
            )

    @property
    def roles(self) -> Sequence[iam.IRole]:
        """Every role an instance of the stack runs as: what launching passes."""
        return [self.role] + ([self.session_role] if self.session_role is not None else [])

    @property
    def every_launch_template(self) -> list[ec2.LaunchTemplate]:
        return [*self.launch_templates.values(), *self.session_launch_templates.values()]

    @property
    def launch_environment(self) -> dict[str, dict[str, str | None]]:
        """What a launching function is told of the templates: one per architecture, and those of the
        classes with Session Manager (runner_pool/environment.py)."""
        environment = {"launch_templates": _template_ids(self.launch_templates)}
        if self.session_launch_templates:
            environment["session_launch_templates"] = _template_ids(self.session_launch_templates)
        return environment

    def _instance_role(self, construct_id: str, description: str, table: dynamodb.ITable) -> iam.Role:
        role = iam.Role(
            self, construct_id, assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"), description=description
        )
        self._grant_own_items(role, table)
        self._grant_own_runner_config(role)
        self._grant_self_termination(role)
        self._grant_own_notices(role)
        permissions.ship_job_logs(role, self._job_logs.arn)
        self.grant_read_wheelhouses(role)
        Validations.of(role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{ANY_INSTANCE_FINDING}]",
                reason=(
                    "ec2:TerminateInstances names instance/* because an instance id is only known at "
                    "launch; the statement's condition requires ec2:SourceInstanceARN (the caller) to "
                    "be the instance acted on, so each instance can terminate itself and no other."
                ),
            )
        )
        return role

    def grant_read_wheelhouses(self, role: iam.IRole) -> None:
        """The agent's wheelhouses, which an instance (or an image build) installs the agent from."""
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ReadAgentWheelhouses",
                actions=["s3:GetObject"],
                resources=[
                    asset.bucket.arn_for_objects(asset.s3_object_key)
                    for asset in self.wheelhouse_assets.values()
                ],
            )
        )

    @staticmethod
    def _grant_session_manager(role: iam.Role) -> None:
        """What the SSM agent needs for Session Manager and nothing else of Systems Manager: the Systems
        Manager User Guide's "Create a custom IAM role with permissions for Session Manager only"
        (getting-started-create-iam-instance-profile.html), the same five actions as AWS's managed
        AWSCloud9SSMInstanceProfile, on `*` as both write them. Not AmazonSSMManagedInstanceCore: no
        ec2messages (Run Command's channel), no ssm:GetParameter(s), documents or associations, so an operator
        with ssm:SendCommand still cannot run commands here. Session logging to S3 or CloudWatch, or KMS
        encryption of sessions, would need more (that guide's optional statements); neither is set up."""
        role.add_to_policy(
            iam.PolicyStatement(
                sid="SessionManagerAgent",
                actions=[*SESSION_MANAGER_ACTIONS],
                resources=["*"],
            )
        )
        Validations.of(role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason=(
                    "Session Manager's agent actions (ssm:UpdateInstanceInformation, ssmmessages:*Channel) "
                    "on *, as the Systems Manager User Guide's Session-Manager-only instance policy writes "
                    "them; only the classes an operator set ssm on run with this role."
                ),
            )
        )

    def _grant_own_items(self, role: iam.Role, table: dynamodb.ITable) -> None:
        own_partitions = [SOURCE_INSTANCE_ARN, OWN_AGENT_PARTITION]
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadOwnItems",
                actions=["dynamodb:GetItem", "dynamodb:BatchGetItem"],
                resources=[table.table_arn],
                conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": own_partitions}},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="WriteOwnHeartbeatAndSignal",
                actions=["dynamodb:PutItem"],
                resources=[table.table_arn],
                conditions={
                    "ForAllValues:StringEquals": {
                        "dynamodb:LeadingKeys": [OWN_AGENT_PARTITION],
                        "dynamodb:Attributes": list(AGENT_ITEM_ATTRIBUTES),
                    }
                },
            )
        )

    def _grant_own_runner_config(self, role: iam.Role) -> None:
        role.add_to_policy(
            iam.PolicyStatement(
                sid="DecryptOwnRunnerConfig",
                actions=["kms:Decrypt"],
                resources=[self.credentials_key.key_arn],
                conditions={
                    "StringEquals": {f"kms:EncryptionContext:{ENCRYPTION_CONTEXT_KEY}": SOURCE_INSTANCE_ARN}
                },
            )
        )

    def _grant_own_notices(self, role: iam.Role) -> None:
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ReceiveOwnNotices",
                actions=["sqs:ReceiveMessage", "sqs:DeleteMessage"],
                resources=[self.notice_queues.arns],
                conditions={
                    "StringEquals": {f"aws:ResourceTag/{notices.INSTANCE_TAG_KEY}": SOURCE_INSTANCE_ARN}
                },
            )
        )
        Validations.of(role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{self.notice_queues.finding}]",
                reason=(
                    "Notice queues are opened at run time, one per instance; the statement's condition "
                    "requires the queue's runner-pool:instance tag to be the calling instance's own ARN, "
                    "so each instance receives from its own queue and no other."
                ),
            )
        )

    def _grant_self_termination(self, role: iam.Role) -> None:
        stack = Stack.of(self)
        instance_arn = stack.format_arn(service="ec2", resource="instance", resource_name="*")
        own_arn = stack.format_arn(service="ec2", resource="instance", resource_name=TARGET_INSTANCE_ID)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="TerminateSelf",
                actions=["ec2:TerminateInstances"],
                resources=[instance_arn],
                conditions={"ArnEquals": {"ec2:SourceInstanceARN": own_arn}},
            )
        )

    @property
    def image_parameter_arns(self) -> list[str]:
        """What launching needs `ssm:GetParameters` on: EC2 resolves a launch template's `resolve:ssm:`
        AMI with the caller's permissions (EC2 Auto Scaling User Guide, "Use AWS Systems Manager
        parameters instead of AMI IDs in launch templates": "Anyone who uses the launch template also
        needs the ssm:GetParameters permission")."""
        stack = Stack.of(self)
        return [
            stack.format_arn(
                service="ssm",
                resource="parameter",
                resource_name=image_parameter_name(stack.stack_name, arch)[1:],
            )
            for arch in Arch
        ]

    def _image_parameter(self, arch: Arch, settings: InstanceSettings) -> ssm.CfnParameter:
        """The parameter EC2 reads the AMI from at every launch, created holding the base AMI.

        Its value is a dynamic reference CloudFormation resolves when it creates the parameter; a later
        deploy leaves it alone while this resource's template is unchanged (CloudFormation does not
        re-resolve an unchanged dynamic reference: aws-cloudformation/cloudformation-coverage-roadmap#844,
        and the User Guide's "Get a plaintext value from Systems Manager Parameter Store"), so the image
        the pipeline wrote stays. Changing `instances.ami_parameters` changes it, and resets it to the new
        base AMI until the pipeline has built on that one.
        """
        return ssm.CfnParameter(
            self,
            f"RunnerImage-{arch.value}",
            name=image_parameter_name(Stack.of(self).stack_name, arch),
            type="String",
            data_type="aws:ec2:image",
            value=f"{{{{resolve:ssm:{settings.ami_parameters[arch]}}}}}",
            description=(
                f"runner-pool: the AMI {arch.value} instances boot; the base AMI until the runner image "
                "pipeline writes its newest image here"
            ),
        )

    def _user_data_values(
        self,
        arch: Arch,
        settings: InstanceSettings,
        config: StackConfig,
        table: dynamodb.ITable,
        job_logs: JobLogs,
    ) -> UserDataValues:
        wheelhouse = self.wheelhouse_assets[arch]
        checksum = settings.runner_checksum(arch)
        if checksum is None:
            raise ValueError(f"no runner checksum for {arch.value}: the config should have refused this")
        return UserDataValues(
            runner_version=settings.runner_version,
            runner_arch=arch.value,
            runner_sha256=checksum,
            wheelhouse_bucket=wheelhouse.s3_bucket_name,
            wheelhouse_key=wheelhouse.s3_object_key,
            wheelhouse_sha256=self.wheelhouses[arch].sha256,
            al2023_python=BOOT_PYTHONS["al2023"],
            ubuntu_python=BOOT_PYTHONS["ubuntu-24.04"],
            pre_runner_script_base64=base64.b64encode(settings.pre_runner_script.encode()).decode(),
            table_name=table.table_name,
            credentials_key_id=self.credentials_key.key_id,
            notice_queue_url_prefix=self.notice_queues.url_prefix,
            heartbeat_period_seconds=f"{config.timeouts.heartbeat_period_seconds:g}",
            termination_grace_seconds=str(settings.termination_grace_seconds),
            retention_days=str(config.timeouts.terminated_retention_days),
            log_group_name=job_logs.name,
            block_imds_from_jobs="true" if settings.block_imds_from_jobs else "false",
        )

    def _launch_template(
        self, arch: Arch, settings: InstanceSettings, profile: iam.InstanceProfile, prefix: str = ""
    ) -> ec2.LaunchTemplate:
        parameter = self.image_parameters[arch]
        user_data = render_user_data(self.user_data_values[arch])
        template = ec2.LaunchTemplate(
            self,
            f"{prefix}LaunchTemplate-{arch.value}",
            # Resolved by EC2 at each launch, so a new image is used from the moment the pipeline writes
            # it (instant fleets take it: "resolve:ssm:" in the EC2 API Reference's
            # FleetLaunchTemplateOverridesRequest ImageId, "only available for fleets of type instant").
            machine_image=ec2.MachineImage.resolve_ssm_parameter_at_launch(
                image_parameter_name(Stack.of(self).stack_name, arch),
                os=ec2.OperatingSystemType.LINUX,
            ),
            user_data=ec2.UserData.custom(user_data),
            instance_profile=profile,
            security_group=self.security_group,
            http_endpoint=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            # One hop: the agent on the host reaches the metadata service, a job's containers do not.
            http_put_response_hop_limit=1,
            # A poweroff from inside (the agent's last resort) ends the instance for good.
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            block_devices=[
                ec2.BlockDevice(
                    device_name=settings.root_device_name,
                    volume=ec2.BlockDeviceVolume.ebs(
                        settings.root_volume_gib,
                        encrypted=True,
                        kms_key=self.volume_key,
                        delete_on_termination=True,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                    ),
                )
            ],
            version_description=f"runner {settings.runner_version}, {arch.value}",
        )
        # EC2 checks the parameter when the template is created, so it must exist first.
        template.node.add_dependency(parameter)
        return template


def _template_ids(templates: Mapping[Arch, ec2.LaunchTemplate]) -> dict[str, str | None]:
    return {arch.value: template.launch_template_id for arch, template in templates.items()}
