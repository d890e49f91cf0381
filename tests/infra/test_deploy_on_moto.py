"""The synthesised template deployed into moto's CloudFormation, as `cdk deploy` would after bootstrap.

The bootstrap version parameter and the asset bucket are prepared as `cdk bootstrap` leaves them, and
the assets are uploaded as `cdk deploy` does; then the stack must reach CREATE_COMPLETE. moto's
CloudFormation does not implement every resource type the stack uses: those it skips are listed here
by name (MOTO_SKIPS), so the list shrinks, and this test says so, as moto learns them.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.cloudformation.parsing import resource_class_from_type

from emulator.harness.control_plane import REGION
from infra.constructs.instances import image_parameter_name
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Arch
from tests.infra.synthesis import Synthesis

ACCOUNT = "123456789012"
BOOTSTRAP_QUALIFIER = "hnb659fds"
"""CDK's default bootstrap qualifier, which the synthesised template's asset locations name."""
MOTO_SKIPS = {
    "AWS::ApiGateway::Account",
    "AWS::ApiGateway::GatewayResponse",
    "AWS::ApiGateway::RequestValidator",
    "AWS::ApiGateway::Stage",
    "AWS::CloudWatch::Alarm",
    "AWS::ImageBuilder::Component",
    "AWS::ImageBuilder::DistributionConfiguration",
    "AWS::ImageBuilder::ImagePipeline",
    "AWS::ImageBuilder::ImageRecipe",
    "AWS::ImageBuilder::InfrastructureConfiguration",
    "AWS::ImageBuilder::LifecyclePolicy",
    "AWS::SQS::QueuePolicy",
}
"""Resource types of the stack that moto 5.2's CloudFormation does not create (it warns and goes on)."""
DASHBOARD = "AWS::CloudWatch::Dashboard"
"""Created by moto, but its body names the alarms' ARNs (Fn::GetAtt), which moto cannot resolve for alarms
it skipped: the one resource left out of the deployed template."""


def zipped(directory: Path) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zip_file:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                zip_file.write(path, path.relative_to(directory))
    return archive.getvalue()


def deployable(template: Mapping[str, Any]) -> dict[str, Any]:
    """The template without the dashboard, and without the outputs that name it or an attribute of a
    resource moto skips (such as the image pipelines' ARNs), which moto cannot resolve."""
    trimmed: dict[str, Any] = json.loads(json.dumps(template))
    trimmed["Resources"] = {k: r for k, r in trimmed["Resources"].items() if r["Type"] != DASHBOARD}
    skipped = [k for k, r in template["Resources"].items() if r["Type"] in MOTO_SKIPS]
    trimmed["Outputs"] = {
        k: o
        for k, o in trimmed["Outputs"].items()
        if "Dashboard" not in json.dumps(o)
        and not any(f'"Fn::GetAtt": ["{logical}"' in json.dumps(o) for logical in skipped)
    }
    return trimmed


@pytest.fixture(scope="module")
def deployed(synthesis: Synthesis) -> Iterator[dict[str, Any]]:
    """The stack deployed into moto: its description, resources and outputs."""
    outdir = Path(synthesis.app.outdir)
    manifest = json.loads((outdir / f"{synthesis.stack.artifact_id}.assets.json").read_text())
    with mock_aws(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # moto's "not supported" warnings: MOTO_SKIPS lists them
        # What `cdk bootstrap` leaves: the version parameter the template checks, and the asset bucket
        bucket = f"cdk-{BOOTSTRAP_QUALIFIER}-assets-{ACCOUNT}-{REGION}"
        boto3.client("ssm", region_name=REGION).put_parameter(
            Name=f"/cdk-bootstrap/{BOOTSTRAP_QUALIFIER}/version", Value="27", Type="String"
        )
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=bucket)
        # What `cdk deploy` uploads: each asset, zipped, and the template
        template_key = ""
        for asset in manifest["files"].values():
            (destination,) = asset["destinations"].values()
            source = outdir / asset["source"]["path"]
            if asset["source"]["packaging"] == "zip":
                body = zipped(source)
            elif source.name.endswith(".template.json"):
                body = json.dumps(deployable(json.loads(source.read_text()))).encode()
                template_key = destination["objectKey"]
            else:
                # A file asset (the agent's wheelhouse zips) is uploaded as it is.
                body = source.read_bytes()
            s3.put_object(Bucket=bucket, Key=destination["objectKey"], Body=body)
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        cloudformation.create_stack(
            StackName=synthesis.stack.stack_name,
            TemplateURL=f"https://{bucket}.s3.{REGION}.amazonaws.com/{template_key}",
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"],
        )
        (stack,) = cloudformation.describe_stacks(StackName=synthesis.stack.stack_name)["Stacks"]
        resources = cloudformation.list_stack_resources(StackName=synthesis.stack.stack_name)[
            "StackResourceSummaries"
        ]
        outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
        yield {
            "status": stack["StackStatus"],
            "resources": resources,
            "outputs": outputs,
            "dynamodb": boto3.client("dynamodb", region_name=REGION),
            "sqs": boto3.client("sqs", region_name=REGION),
            "ssm": boto3.client("ssm", region_name=REGION),
        }


def test_moto_skips_exactly_the_resource_types_listed(synthesis: Synthesis) -> None:
    # Given the template's resource types / Then the ones moto cannot create are the listed ones
    types = {resource["Type"] for resource in synthesis.resources.values()}
    assert {kind for kind in types if resource_class_from_type(kind) is None} == MOTO_SKIPS


def test_the_template_deploys_to_create_complete(deployed: dict[str, Any], synthesis: Synthesis) -> None:
    # Given the stack deployed into moto / Then it completed
    assert deployed["status"] == "CREATE_COMPLETE"

    # And every resource moto implements was created
    expected = {
        logical_id
        for logical_id, resource in synthesis.resources.items()
        if resource["Type"] not in MOTO_SKIPS | {DASHBOARD}
    }
    created = {
        r["LogicalResourceId"] for r in deployed["resources"] if r["ResourceStatus"] == "CREATE_COMPLETE"
    }
    assert expected <= created


def test_the_outputs_name_the_deployed_table_and_queues(
    deployed: dict[str, Any], synthesis: Synthesis
) -> None:
    # Given the deployed stack's outputs (what the operator CLI reads)
    outputs = deployed["outputs"]

    # Then the table output names a real table, and the queue outputs a real queue per partition
    deployed["dynamodb"].describe_table(TableName=outputs["StateTableName"])
    # And the demand ledger's output names a real table (`runner-pool job` reads the job's item there)
    deployed["dynamodb"].describe_table(TableName=outputs["DemandLedgerTableName"])
    classes = json.loads(outputs["ResourceClasses"])
    assert set(classes) == set(synthesis.config.resource_classes)
    for partition in PoolPartition.every(classes):
        url = partition.queue_name(outputs["PoolQueueUrlPrefix"])
        deployed["sqs"].get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    # And the webhook URL is the API's /webhook path
    assert outputs["WebhookUrl"].endswith("/webhook")


def test_before_any_image_the_parameters_instances_boot_hold_the_base_ami(
    deployed: dict[str, Any], synthesis: Synthesis
) -> None:
    # Given the stack deployed, and no image built (moto has no Image Builder: the pipelines are skipped)
    for arch in Arch:
        name = image_parameter_name(synthesis.stack.stack_name, arch)
        # Then the parameter each launch template boots exists, an AMI id made from the base AMI's
        # parameter (moto keeps the dynamic reference as written; CloudFormation resolves it)
        parameter = deployed["ssm"].get_parameter(Name=name)["Parameter"]
        assert parameter["DataType"] == "aws:ec2:image"
        assert parameter["Value"] == f"{{{{resolve:ssm:{synthesis.config.instances.ami_parameters[arch]}}}}}"
