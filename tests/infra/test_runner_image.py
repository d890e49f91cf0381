"""The runner image as synthesised: one Image Builder pipeline per architecture, baking the launch
template's own user data at its pins, distributing each image into the parameter the launch template
boots, rebuilding when the pins or the base AMI change, keeping a few images, on a narrow build role."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no types, and types-PyYAML is not in the lock

from infra.constructs.instances import BOOT_ONLY_VALUES, image_parameter_name, render_user_data
from infra.constructs.runner_image import (
    BAKE_TERMINATOR,
    COMPONENT_DATA_LIMIT,
    IMAGE_STAMP_CONTEXT_KEY,
    bake_script,
    component_document,
    component_version,
)
from runner_pool.domain.instance_settings import AL2023_AMI_PARAMETERS, DEFAULT_IMAGE_BUILD_INSTANCE_TYPES
from runner_pool.domain.records import Arch
from tests.infra.synthesis import Synthesis, synthesize
from tests.infra.test_instances import logical_id, values
from tests.infra.test_permissions import actions, statements

LONGEST_BUCKET = "b" * 63
"""An S3 bucket name is at most 63 characters: the longest the asset bucket's token can become."""


def of_type(synthesis: Synthesis, kind: str) -> dict[str, Mapping[str, Any]]:
    return {
        logical: resource["Properties"]
        for logical, resource in synthesis.resources.items()
        if resource["Type"] == f"AWS::ImageBuilder::{kind}"
    }


def arch_of(logical: str) -> Arch:
    return Arch.ARM64 if "arm64" in logical else Arch.X64


def component_text(properties: Mapping[str, Any], bucket: str = LONGEST_BUCKET) -> str:
    """The component's document with the asset bucket's intrinsic function as a bucket name."""
    data = properties["Data"]
    if isinstance(data, str):
        return data
    return "".join(part if isinstance(part, str) else bucket for part in data["Fn::Join"][1])


def bake_command(document: str) -> str:
    (build,) = [phase for phase in yaml.safe_load(document)["phases"] if phase["name"] == "build"]
    (bake,) = [step for step in build["steps"] if step["name"] == "Bake"]
    (command,) = bake["inputs"]["commands"]
    return str(command)


def test_there_is_one_pipeline_per_architecture_each_on_its_own_recipe(synthesis: Synthesis) -> None:
    # Given the synthesised pipelines and recipes
    pipelines, recipes = of_type(synthesis, "ImagePipeline"), of_type(synthesis, "ImageRecipe")

    # Then there is one of each per architecture, and each pipeline builds its arch's recipe
    assert sorted(arch_of(logical).value for logical in pipelines) == sorted(arch.value for arch in Arch)
    for logical, pipeline in pipelines.items():
        (recipe,) = [r for r in recipes if arch_of(r) is arch_of(logical)]
        assert pipeline["ImageRecipeArn"] == {"Fn::GetAtt": [recipe, "Arn"]}
        assert pipeline["Status"] == "ENABLED"


def test_each_recipe_builds_on_the_configured_base_ami_with_the_runners_disk(synthesis: Synthesis) -> None:
    for logical, recipe in of_type(synthesis, "ImageRecipe").items():
        arch = arch_of(logical)
        # Given the arch's recipe / Then its parent is the base AMI's parameter, resolved at each build
        # (Image Builder API Reference, ImageRecipe parentImage: "prefixed by ssm:")
        assert recipe["ParentImage"] == f"ssm:{AL2023_AMI_PARAMETERS[arch]}"
        # And its root volume is the launch templates': encrypted gp3 of the configured size
        (device,) = recipe["BlockDeviceMappings"]
        assert device["DeviceName"] == synthesis.config.instances.root_device_name
        assert device["Ebs"] == {
            "DeleteOnTermination": True,
            "Encrypted": True,
            "VolumeSize": synthesis.config.instances.root_volume_gib,
            "VolumeType": "gp3",
        }
        # And it takes the newest version of its arch's component (`x.x.x`), so a new component version
        # is a dependency update for the pipeline's schedule
        (component,) = recipe["Components"]
        assert component["ComponentArn"]["Fn::Join"][1][-1].endswith(f"-runner-{arch.value}/x.x.x")


def test_the_component_bakes_the_launch_templates_own_user_data_at_its_pins(synthesis: Synthesis) -> None:
    instances = synthesis.stack.instances
    for logical, component in of_type(synthesis, "Component").items():
        arch = arch_of(logical)
        # Given the arch's component document, as Image Builder will read it
        document = component_text(component)
        # Then it is YAML whose build step writes the bake script and runs it with `bake`
        command = bake_command(document)
        script = command.split(f"<<'{BAKE_TERMINATOR}'\n", 1)[1].split(f"\n{BAKE_TERMINATOR}\n", 1)[0] + "\n"
        assert command.endswith(
            f"{BAKE_TERMINATOR}\nbash /tmp/runner-pool-bake.sh bake\nrm -f /tmp/runner-pool-bake.sh\n"
        )
        # And that script is the launch template's user data: the same pins, the boot's own values
        # (the agent's settings) left empty, comments and blank lines left out
        boot = render_user_data(
            dataclasses.replace(instances.user_data_values[arch], **dict.fromkeys(BOOT_ONLY_VALUES, ""))
        )
        assert script.replace(LONGEST_BUCKET, "") == bake_script(instances, arch).replace(
            instances.user_data_values[arch].wheelhouse_bucket, ""
        )
        kept = [line for line in boot.splitlines() if line.strip() and not re.match(r"^\s*#( |$)", line)]
        assert [line for line in script.splitlines()] == [
            line.replace(instances.user_data_values[arch].wheelhouse_bucket, LONGEST_BUCKET) for line in kept
        ]
        for pin in ("RUNNER_VERSION", "RUNNER_SHA256", "WHEELHOUSE_KEY", "WHEELHOUSE_SHA256"):
            value = getattr(instances.user_data_values[arch], pin.lower())
            assert f'readonly {pin}="{value}"' in script, pin
        # And its validate phase checks each part recorded its pins
        (validate,) = [p for p in yaml.safe_load(document)["phases"] if p["name"] == "validate"]
        assert "test -s /var/lib/runner-pool/baked/runner" in validate["steps"][0]["inputs"]["commands"][0]


def test_the_component_fits_image_builders_limit_with_the_longest_bucket_name(synthesis: Synthesis) -> None:
    for logical, component in of_type(synthesis, "Component").items():
        # Given the document with the asset bucket at its longest / Then it fits Data's 16,000 characters
        assert len(component_text(component)) < COMPONENT_DATA_LIMIT, logical
        # And it has no `{{`, which AWSTOE would read as a variable
        assert "{{" not in component_text(component), logical


def test_under_one_stamp_the_component_version_changes_with_the_pins_and_only_with_them() -> None:
    # Given the bake document of one set of pins, rendered twice, and of a new runner release, at one stamp
    stamp = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    def version(**changed: str) -> str:
        script = render_user_data(dataclasses.replace(values(), **changed))
        return component_version(
            stamp, component_document(script, docker=False, name="runnerpool-runner-x64")
        )

    # Then the same pins give the same version, and a new runner, wheelhouse or Docker choice another
    assert version() == version()
    assert version(runner_version="2.329.0") != version()
    assert version(wheelhouse_sha256="0" * 64) != version()
    script = render_user_data(values())
    with_docker = component_version(
        stamp, component_document(script, docker=True, name="runnerpool-runner-x64")
    )
    assert with_docker != version()
    # And every version is one Image Builder accepts: major.minor.patch, each below 2^30, led by the stamp
    assert all(0 <= int(part) < 2**30 for part in version().split("."))
    assert version().startswith("20260102.30405.")


def component_versions(synthesis: Synthesis) -> dict[Arch, tuple[int, ...]]:
    return {
        arch_of(logical): tuple(int(node) for node in component["Version"].split("."))
        for logical, component in of_type(synthesis, "Component").items()
    }


def test_each_deploy_gets_a_component_version_above_the_last_whatever_it_installs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Given three deploys a minute apart: without Docker, with it, and without it again (the recipe asks
    # for `x.x.x`, the highest version, so a deploy whose component sorts lower is never built)
    first = int(datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp())
    deploys = [
        synthesize(
            {"image": {"docker": docker}},
            tmp_path_factory.mktemp("cdk.out-stamped"),
            stage_assets=False,
            context={IMAGE_STAMP_CONTEXT_KEY: str(first + 60 * minute)},
        )
        for minute, docker in enumerate((False, True, False))
    ]

    # When their components' versions are read, in Image Builder's order (node by node, as numbers)
    versions = [component_versions(deploy) for deploy in deploys]

    # Then each architecture's version rises with every deploy, also back to what an earlier one installed
    for arch in Arch:
        assert versions[0][arch] < versions[1][arch] < versions[2][arch], arch
    # And one synth stamps both architectures alike
    assert {v[:2] for v in versions[0].values()} == {(20260301, 120000)}


def test_an_image_stamp_that_is_not_seconds_is_refused_with_the_fix(tmp_path: Path) -> None:
    # Given a stamp given as a date / When the app is synthesised / Then the key and the fix are named
    with pytest.raises(ValueError, match=rf"{IMAGE_STAMP_CONTEXT_KEY}: '2026-03-01'.*date \+%s"):
        synthesize(
            None, tmp_path / "cdk.out", stage_assets=False, context={IMAGE_STAMP_CONTEXT_KEY: "2026-03-01"}
        )


def test_docker_is_installed_and_checked_only_when_configured() -> None:
    script = render_user_data(values())
    # Given the document without and with `image.docker`
    plain = yaml.safe_load(component_document(script, docker=False, name="n"))
    docker = yaml.safe_load(component_document(script, docker=True, name="n"))
    # Then only the second installs the distribution's Docker and checks it is enabled
    assert [s["name"] for s in plain["phases"][0]["steps"]] == ["Bake"]
    assert [s["name"] for s in docker["phases"][0]["steps"]] == ["Bake", "Docker"]
    commands = docker["phases"][0]["steps"][1]["inputs"]["commands"][0]
    assert '"amzn 2023") dnf install -y docker' in commands
    assert "docker.io" in commands
    assert "systemctl is-enabled docker.service" in docker["phases"][1]["steps"][0]["inputs"]["commands"][0]


def test_each_image_is_distributed_into_the_parameter_its_launch_template_boots(synthesis: Synthesis) -> None:
    for logical, distribution in of_type(synthesis, "DistributionConfiguration").items():
        arch = arch_of(logical)
        # Given the arch's distribution / Then it writes each new AMI's id into the stack's image parameter
        (target,) = distribution["Distributions"]
        (parameter,) = target["SsmParameterConfigurations"]
        name = image_parameter_name(synthesis.stack.stack_name, arch)
        assert parameter == {"ParameterName": name, "DataType": "aws:ec2:image"}
        # Which is the one the launch template resolves at launch
        template = synthesis.stack.instances.launch_templates[arch]
        data = synthesis.resources[logical_id(synthesis.stack, template)]["Properties"]["LaunchTemplateData"]
        assert data["ImageId"] == f"resolve:ssm:{name}"
        # And each AMI has a name of its own per build
        assert "{{ imagebuilder:buildDate }}" in target["AmiDistributionConfiguration"]["Name"]


def test_the_pipelines_rebuild_on_schedule_only_when_the_pins_or_base_ami_changed(
    synthesis: Synthesis,
) -> None:
    for pipeline in of_type(synthesis, "ImagePipeline").values():
        # Given each pipeline's schedule / Then it checks at the configured time and builds on news only
        assert pipeline["Schedule"] == {
            "ScheduleExpression": synthesis.config.image.schedule,
            "PipelineExecutionStartCondition": "EXPRESSION_MATCH_AND_DEPENDENCY_UPDATES_AVAILABLE",
        }


def test_old_images_are_deleted_with_their_snapshots_past_the_newest_kept(synthesis: Synthesis) -> None:
    # Given the lifecycle policy
    ((_, policy),) = of_type(synthesis, "LifecyclePolicy").items()
    recipes = of_type(synthesis, "ImageRecipe").values()

    # Then it deletes AMIs and snapshots beyond the newest `image.images_kept` of each of our recipes
    assert policy["ResourceType"] == "AMI_IMAGE"
    (detail,) = policy["PolicyDetails"]
    assert detail["Action"] == {"Type": "DELETE", "IncludeResources": {"Amis": True, "Snapshots": True}}
    assert detail["Filter"] == {"Type": "COUNT", "Value": synthesis.config.image.images_kept}
    assert sorted(
        (r["Name"], r["SemanticVersion"]) for r in policy["ResourceSelection"]["Recipes"]
    ) == sorted((r["Name"], r["Version"]) for r in recipes)


def test_builds_run_in_the_runners_network_on_their_own_profile(synthesis: Synthesis) -> None:
    stack = synthesis.stack
    for logical, infrastructure in of_type(synthesis, "InfrastructureConfiguration").items():
        # Given the arch's build infrastructure
        # Then it builds on the configured types, in the first configured subnet and the runners' group
        assert infrastructure["InstanceTypes"] == list(DEFAULT_IMAGE_BUILD_INSTANCE_TYPES[arch_of(logical)])
        assert infrastructure["SubnetId"] == synthesis.config.network.subnet_ids[0]
        assert infrastructure["SecurityGroupIds"] == [
            {"Fn::GetAtt": [logical_id(stack, stack.instances.security_group), "GroupId"]}
        ]
        assert infrastructure["TerminateInstanceOnFailure"] is True
        assert infrastructure["InstanceMetadataOptions"] == {
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
        }
        # And on the build profile, not the runners' instance profile
        assert infrastructure["InstanceProfileName"] == {
            "Ref": logical_id(stack, stack.runner_image.instance_profile)
        }


def test_the_build_role_reads_only_its_components_tools_logs_and_the_wheelhouses(
    synthesis: Synthesis,
) -> None:
    stack = synthesis.stack
    role_logical = logical_id(stack, stack.runner_image.build_role)
    role = synthesis.resources[role_logical]["Properties"]
    # Given the build role / Then its one managed policy is the Systems Manager agent's core
    (managed,) = role["ManagedPolicyArns"]
    assert managed["Fn::Join"][1][-1] == ":iam::aws:policy/AmazonSSMManagedInstanceCore"
    # And its own statements are exactly these, each on named resources
    found = {s["Sid"]: s for s in synthesis.statements_of_role(role_logical)}
    assert {sid: actions(s) for sid, s in found.items()} == {
        "GetOwnComponents": {"imagebuilder:GetComponent"},
        "GetImageBuilderTools": {"s3:GetObject"},
        "WriteOwnBuildLogs": {"logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"},
        "ReadAgentWheelhouses": {"s3:GetObject"},
    }
    components = found["GetOwnComponents"]["Resource"]
    assert len(components) == len(Arch)
    assert all(c["Fn::Join"][1][-1].startswith(":component/runnerpool-runner-") for c in components)
    # And the wheelhouses it reads are the instance role's, no other object
    (instance_reads,) = [
        s
        for s in synthesis.statements_of_role(logical_id(stack, stack.instances.role))
        if s.get("Sid") == "ReadAgentWheelhouses"
    ]
    assert found["ReadAgentWheelhouses"]["Resource"] == instance_reads["Resource"]


def test_launching_may_read_exactly_the_image_parameters(synthesis: Synthesis) -> None:
    names = [image_parameter_name(synthesis.stack.stack_name, arch) for arch in Arch]
    for handler in ("provision.create", "refresh.refresh"):
        # Given each launching function's statements
        found = [s for s in statements(synthesis, handler) if "ssm:GetParameters" in actions(s)]
        # Then it may read the two image parameters, which EC2 resolves with its permissions, and no other
        (statement,) = found
        resources = statement["Resource"]
        assert len(resources) == len(names)
        assert sorted(r["Fn::Join"][1][-1] for r in resources) == sorted(
            f":parameter{name}" for name in names
        )
