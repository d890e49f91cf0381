"""The runner image: an EC2 Image Builder pipeline per architecture that bakes what the user data installs.

Each architecture's image is the configured base AMI (`instances.ami_parameters`) with, installed at the
deploy's pins, the runner's OS packages, the pinned runner (its SHA-256 checked) and the agent's
wheelhouse (built from uv.lock), and Docker when `image.docker` is set. The bake is the user data
itself, run with `bake` (infra/instances/user_data.sh): one script, one set of pins, rendered by the
same `UserDataValues` as the launch template's, so what the image holds and what the boot expects
cannot drift apart. On a baked instance the boot only configures and starts the agent.

- **Which AMI instances boot.** The pipeline's distribution writes each new AMI's id to the stack's
  image parameter of its architecture (infra/constructs/instances.py `image_parameter_name`): "The
  image distribution creates the Parameter if it doesn't already exist. Otherwise, it updates the
  parameter" (Image Builder API Reference, SsmParameterConfiguration). The launch templates read that
  parameter at every launch (`resolve:ssm:`); until the first image exists it holds the base AMI, and
  the boot installs everything, as it did before there was an image.
- **When it rebuilds.** The component is named once per architecture, and the recipe asks for it as
  `x.x.x`, which Image Builder resolves to its highest version ("x.x.x = 2.2.4" of 2.2.4, 1.7.8 and 1.6.8,
  Image Builder User Guide, "Semantic versioning"). So each deploy's component must sort above the last
  one's, or the recipe keeps building the old pins: its version is stamped with the synth's time (see
  `component_version`), not derived from a digest alone, which sorts at random. The pipeline's schedule uses
  EXPRESSION_MATCH_AND_DEPENDENCY_UPDATES_AVAILABLE: at each `image.schedule` it "builds a new image
  only when there are new versions of the base image or components in your recipe that match the
  filter", and "if the recipe references its base image through an AWS Systems Manager Parameter Store
  parameter, a change in the parameter's value also counts" (Image Builder API Reference, Schedule).
  So a deploy that changes the pins, or a new base AMI, is built at the next scheduled check, and a
  check with nothing new costs nothing.
- **What is kept.** A lifecycle policy keeps the newest `image.images_kept` images of each recipe and
  deletes the rest with their AMIs and snapshots (Image Builder User Guide, "Manage Image Builder
  lifecycle policies").
- **The build instance's role** can do what Image Builder's build needs and no more: the Systems
  Manager agent's core (AWS's AmazonSSMManagedInstanceCore, which the Image Builder User Guide lists
  for the instance profile), and, narrowed from AWS's EC2InstanceProfileForImageBuilder, reading this
  stack's components, the Image Builder tools' buckets, writing the build's own log groups, and reading
  the two wheelhouse objects. It can read no record, decrypt nothing and launch nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType

from aws_cdk import Acknowledgment, ArnFormat, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder
from constructs import Construct

from infra.constructs.instances import BOOT_ONLY_VALUES, Instances, image_parameter_name, render_user_data
from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Arch

COMPONENT_DATA_LIMIT = 16000
"""AWS::ImageBuilder::Component's Data holds at most 16,000 characters (CloudFormation Template
Reference, AWS::ImageBuilder::Component, Data: Maximum 16000)."""

BAKE_TERMINATOR = "RUNNER_POOL_BAKE"
BAKED_MARKERS = "/var/lib/runner-pool/baked"
"""Where the bake records each part's pins (user_data.sh BAKED_DIR), checked by the component's validate
phase."""

_COMMENT_LINE = re.compile(r"^\s*#( .*)?$")
"""A comment line of the script (not a `#!` line): left out of the component, which must fit its limit,
as are blank lines (none of the script's here-documents needs one)."""

DOCKER_STEP = """\
. /etc/os-release
case "${ID} ${VERSION_ID}" in
    "amzn 2023") dnf install -y docker ;;
    "ubuntu 24.04") apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io ;;
    *) echo "runner-pool: no Docker for ${ID} ${VERSION_ID}" >&2; exit 1 ;;
esac
systemctl enable docker.service
"""
"""Docker from the distribution's own repositories (AL2023: `docker`, in its core repository; Ubuntu:
`docker.io`, in universe), enabled to start at boot. The runner account is not added to the docker
group: that is root (README, "What the scrub cannot undo")."""

IMAGE_STAMP_CONTEXT_KEY = "runner-pool-image-stamp"
"""`-c runner-pool-image-stamp=<seconds since the epoch>`: the time the components' versions are stamped
with (`image_stamp`); it must be later than the last deploy's."""

MANAGED_POLICY_ACKNOWLEDGED = "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


def bake_script(instances: Instances, arch: Arch) -> str:
    """The user data of `arch`, with the values only the boot reads left empty and its comments left out."""
    values = dataclasses.replace(instances.user_data_values[arch], **dict.fromkeys(BOOT_ONLY_VALUES, ""))
    script = render_user_data(values)
    return "".join(
        f"{line}\n" for line in script.splitlines() if line.strip() and not _COMMENT_LINE.match(line)
    )


def component_document(script: str, *, docker: bool, name: str) -> str:
    """The AWSTOE document: the build phase runs the bake (and installs Docker when asked), the
    validate phase checks every part recorded its pins. Sequences are not indented under their keys
    (YAML allows it), so the script, the bulk of it, is indented by 8 spaces only."""

    def step(name: str, commands: str) -> str:
        body = "".join(f"        {line}\n" for line in commands.splitlines())
        return f"  - name: {name}\n    action: ExecuteBash\n    inputs:\n      commands:\n      - |\n{body}"

    bake = f"cat >/tmp/runner-pool-bake.sh <<'{BAKE_TERMINATOR}'\n{script}{BAKE_TERMINATOR}\n"
    bake += "bash /tmp/runner-pool-bake.sh bake\nrm -f /tmp/runner-pool-bake.sh\n"
    build = step("Bake", bake) + (step("Docker", DOCKER_STEP) if docker else "")
    validate = "".join(f"test -s {BAKED_MARKERS}/{part}\n" for part in ("packages", "runner", "agent"))
    if docker:
        validate += "systemctl is-enabled docker.service\n"
    return (
        f"name: {name}\n"
        "description: runner-pool's runner, its prerequisites and the agent, at the deploy's pins\n"
        "schemaVersion: 1.0\n"
        "phases:\n"
        f"- name: build\n  steps:\n{build}"
        f"- name: validate\n  steps:\n{step('Baked', validate)}"
    )


def component_version(stamp: datetime, *parts: str) -> str:
    """A version Image Builder accepts (major.minor.patch, each at most 2^30-1) that sorts by `stamp`:
    its UTC date, then its time of day ("a date, such as 2021.01.01", Image Builder User Guide, "Semantic
    versioning"), then a digest of `parts`, so that what differs under one stamp is still a version of
    its own ("Image Builder uses semantic versioning to ... ensure that they have unique IDs")."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return f"{stamp:%Y%m%d}.{int(f'{stamp:%H%M%S}')}.{int(digest[:7], 16)}"


def recipe_version(*parts: str) -> str:
    """A version Image Builder accepts that changes with `parts`. Unlike the component's, its order does not
    matter: the pipeline names the recipe by its full ARN and the lifecycle policy by its exact version,
    and nothing asks for the highest. Stamping it too would give each deploy a new recipe, and the images
    of the earlier ones would leave the lifecycle policy's selection, never to be deleted."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return f"1.{int(digest[:7], 16)}.{int(digest[7:14], 16)}"


def image_stamp(scope: Construct) -> datetime:
    """The time this synth stamps the components' versions with: the IMAGE_STAMP_CONTEXT_KEY context when
    given, else now. Read once per RunnerImage, so both architectures' components carry the same stamp.

    The clock, not the source's commit time: a deploy of an older commit, or of settings edited and not
    committed, is still a later deploy, and its component must still sort above the deployed one. The
    price is that each synth's versions differ from the last: `cdk diff` shows both components replaced,
    and the pipeline builds once more after a deploy that changed nothing in the image. A deployer whose
    own clock only moves forward with what it deploys (a CI's commit time on a branch that is never
    rolled back) can pass that instead and get a quiet diff."""
    given = scope.node.try_get_context(IMAGE_STAMP_CONTEXT_KEY)
    if given is None:
        return datetime.fromtimestamp(time.time(), UTC)
    try:
        return datetime.fromtimestamp(int(str(given)), UTC)
    except ValueError:
        raise ValueError(
            f"{IMAGE_STAMP_CONTEXT_KEY}: {given!r} is not whole seconds since the epoch; fix: pass "
            f"-c {IMAGE_STAMP_CONTEXT_KEY}=$(date +%s)"
        ) from None


class RunnerImage(Construct):
    """`pipelines` maps each architecture to its image pipeline; `build_role` is the build instance's."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        instances: Instances,
        subnet_ids: Sequence[str],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.prefix = f"{stack.stack_name.lower()}-runner"
        self.stamp = image_stamp(self)
        self.components: dict[Arch, imagebuilder.CfnComponent] = {}
        self.recipes: dict[Arch, imagebuilder.CfnImageRecipe] = {}
        for arch in Arch:
            script = bake_script(instances, arch)
            name = f"{self.prefix}-{arch.value}"
            # The digest is of the script with the asset bucket's token left out: the bucket is the
            # environment's bootstrap bucket, and a token's text changes with the app's construct order.
            bucket = instances.user_data_values[arch].wheelhouse_bucket
            document = component_document(script, docker=config.image.docker, name=name)
            self.components[arch] = imagebuilder.CfnComponent(
                self,
                f"Component-{arch.value}",
                name=name,
                version=component_version(self.stamp, document.replace(bucket, "")),
                platform="Linux",
                description=f"runner {config.instances.runner_version} and the agent, for {arch.value}",
                change_description="the deploy's pins",
                data=document,
            )
        self.build_role = self._build_role(instances)
        self.instance_profile = iam.InstanceProfile(self, "BuildInstanceProfile", role=self.build_role)
        self.pipelines: Mapping[Arch, imagebuilder.CfnImagePipeline] = MappingProxyType(
            {arch: self._pipeline(arch, config, instances, subnet_ids) for arch in Arch}
        )
        self.lifecycle_policy = self._lifecycle_policy(config)

    def component_arn(self, arch: Arch, version: str = "x.x.x") -> str:
        return Stack.of(self).format_arn(
            service="imagebuilder",
            resource="component",
            resource_name=f"{self.prefix}-{arch.value}/{version}",
        )

    def _build_role(self, instances: Instances) -> iam.Role:
        stack = Stack.of(self)
        role = iam.Role(
            self,
            "BuildRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="runner-pool image builds: Systems Manager, this stack's components, the wheelhouses",
            # Image Builder drives the build through Systems Manager; the User Guide's "Set up IAM
            # roles" names this policy (with EC2InstanceProfileForImageBuilder) for the instance profile.
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")],
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="GetOwnComponents",
                actions=["imagebuilder:GetComponent"],
                resources=[self.component_arn(arch, "*") for arch in Arch],
            )
        )
        # AWSTOE, the component runner, is downloaded to the build instance from Image Builder's own
        # buckets; EC2InstanceProfileForImageBuilder grants exactly this.
        tools = f"arn:{stack.partition}:s3:::ec2imagebuilder*"
        role.add_to_policy(
            iam.PolicyStatement(sid="GetImageBuilderTools", actions=["s3:GetObject"], resources=[tools])
        )
        logs = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"/aws/imagebuilder/{self.prefix}-*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="WriteOwnBuildLogs",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[logs, f"{logs}:*"],
            )
        )
        instances.grant_read_wheelhouses(role)
        Validations.of(role).acknowledge(
            Acknowledgment(
                id=MANAGED_POLICY_ACKNOWLEDGED.format(name="AmazonSSMManagedInstanceCore"),
                reason=(
                    "Image Builder runs the build through the Systems Manager agent, which needs this "
                    "policy's actions (the Image Builder User Guide names it for the instance profile)."
                ),
            ),
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::ec2imagebuilder*]",
                reason=(
                    "AWSTOE, which runs the component on the build instance, is downloaded from Image "
                    "Builder's own regional buckets, all named ec2imagebuilder*, as AWS's policy grants."
                ),
            ),
            *(
                Acknowledgment(id=f"AwsSolutions-IAM5[Resource::{finding}]", reason=reason)
                for finding, reason in (
                    (
                        f"arn:<AWS::Partition>:imagebuilder:<AWS::Region>:<AWS::AccountId>:component/{self.prefix}-{arch.value}/*",
                        "Only this stack's components, by name; their build versions are known only once "
                        "Image Builder has made them, so the version part is a wildcard.",
                    )
                    for arch in Arch
                )
            ),
            *(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:/aws/imagebuilder/{self.prefix}-*{suffix}]",
                    reason=(
                        "Only this stack's build log groups: each group is named after its image, each "
                        "stream after its build, both known only when the build runs."
                    ),
                )
                for suffix in ("", ":*")
            ),
        )
        return role

    def _pipeline(
        self, arch: Arch, config: StackConfig, instances: Instances, subnet_ids: Sequence[str]
    ) -> imagebuilder.CfnImagePipeline:
        stack = Stack.of(self)
        name = f"{self.prefix}-{arch.value}"
        settings = config.instances
        block_device = imagebuilder.CfnImageRecipe.InstanceBlockDeviceMappingProperty(
            device_name=settings.root_device_name,
            ebs=imagebuilder.CfnImageRecipe.EbsInstanceBlockDeviceSpecificationProperty(
                volume_size=settings.root_volume_gib,
                volume_type="gp3",
                encrypted=True,
                delete_on_termination=True,
            ),
        )
        parent_image = f"ssm:{settings.ami_parameters[arch]}"
        recipe = imagebuilder.CfnImageRecipe(
            self,
            f"Recipe-{arch.value}",
            name=name,
            # A recipe cannot change in place: a new one is made whenever what it says changes.
            version=recipe_version(
                parent_image,
                settings.root_device_name,
                str(settings.root_volume_gib),
                self.component_arn(arch),
            ),
            parent_image=parent_image,
            components=[
                imagebuilder.CfnImageRecipe.ComponentConfigurationProperty(
                    component_arn=self.component_arn(arch)
                )
            ],
            block_device_mappings=[block_device],
            description=f"runner-pool's runner image for {arch.value}",
        )
        recipe.node.add_dependency(self.components[arch])
        self.recipes[arch] = recipe
        infrastructure = imagebuilder.CfnInfrastructureConfiguration(
            self,
            f"Infrastructure-{arch.value}",
            name=name,
            instance_profile_name=self.instance_profile.instance_profile_name,
            instance_types=list(config.image.build_instance_types[arch]),
            # In the runners' own network and security group (no inbound traffic), which reach GitHub,
            # AWS's APIs and the package repositories, as the build does.
            subnet_id=subnet_ids[0] if subnet_ids else None,
            security_group_ids=[instances.security_group.security_group_id],
            terminate_instance_on_failure=True,
            instance_metadata_options=imagebuilder.CfnInfrastructureConfiguration.InstanceMetadataOptionsProperty(
                http_tokens="required", http_put_response_hop_limit=1
            ),
            description=f"runner-pool image builds for {arch.value}",
        )
        distribution = imagebuilder.CfnDistributionConfiguration(
            self,
            f"Distribution-{arch.value}",
            name=name,
            distributions=[
                imagebuilder.CfnDistributionConfiguration.DistributionProperty(
                    region=stack.region,
                    ami_distribution_configuration={
                        "Name": f"{name}-{{{{ imagebuilder:buildDate }}}}",
                        "Description": f"runner-pool runner {settings.runner_version} for {arch.value}",
                        "AmiTags": {"runner-pool:stack": stack.stack_name, "runner-pool:arch": arch.value},
                    },
                    ssm_parameter_configurations=[
                        imagebuilder.CfnDistributionConfiguration.SsmParameterConfigurationProperty(
                            parameter_name=image_parameter_name(stack.stack_name, arch),
                            data_type="aws:ec2:image",
                        )
                    ],
                )
            ],
            description=f"runner-pool: each new {arch.value} image into the parameter instances boot",
        )
        distribution.node.add_dependency(instances.image_parameters[arch])
        return imagebuilder.CfnImagePipeline(
            self,
            f"Pipeline-{arch.value}",
            name=name,
            image_recipe_arn=recipe.attr_arn,
            infrastructure_configuration_arn=infrastructure.attr_arn,
            distribution_configuration_arn=distribution.attr_arn,
            schedule=imagebuilder.CfnImagePipeline.ScheduleProperty(
                schedule_expression=config.image.schedule,
                pipeline_execution_start_condition="EXPRESSION_MATCH_AND_DEPENDENCY_UPDATES_AVAILABLE",
            ),
            # The component's validate phase checks the bake on the build instance; a test instance
            # booted from the image would add a second launch to every build.
            image_tests_configuration=imagebuilder.CfnImagePipeline.ImageTestsConfigurationProperty(
                image_tests_enabled=False
            ),
            enhanced_image_metadata_enabled=True,
            status="ENABLED",
            description=f"runner-pool's runner image for {arch.value}",
        )

    def _lifecycle_policy(self, config: StackConfig) -> imagebuilder.CfnLifecyclePolicy:
        role = iam.Role(
            self,
            "LifecycleRole",
            assumed_by=iam.ServicePrincipal("imagebuilder.amazonaws.com"),
            description="runner-pool: Image Builder deletes the runner images past the newest kept",
            # The policy AWS provides for lifecycle execution roles (Image Builder User Guide,
            # "Prerequisites for lifecycle policies").
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name(
                    "service-role/EC2ImageBuilderLifecycleExecutionPolicy"
                )
            ],
        )
        Validations.of(role).acknowledge(
            Acknowledgment(
                id=MANAGED_POLICY_ACKNOWLEDGED.format(
                    name="service-role/EC2ImageBuilderLifecycleExecutionPolicy"
                ),
                reason=(
                    "AWS's own policy for Image Builder lifecycle execution roles, which the Image Builder "
                    "User Guide prescribes; it deletes only what the policy's selection names."
                ),
            )
        )
        policy = imagebuilder.CfnLifecyclePolicy
        return policy(
            self,
            "Lifecycle",
            name=f"{self.prefix}-images",
            description=f"runner-pool: keep the newest {config.image.images_kept} runner images of each arch",
            execution_role=role.role_arn,
            resource_type="AMI_IMAGE",
            status="ENABLED",
            policy_details=[
                policy.PolicyDetailProperty(
                    action=policy.ActionProperty(
                        type="DELETE",
                        include_resources=policy.IncludeResourcesProperty(amis=True, snapshots=True),
                    ),
                    filter=policy.FilterProperty(type="COUNT", value=config.image.images_kept),
                )
            ],
            resource_selection=policy.ResourceSelectionProperty(
                recipes=[
                    policy.RecipeSelectionProperty(name=recipe.name, semantic_version=recipe.version)
                    for recipe in self.recipes.values()
                ]
            ),
        )
