"""The EC2 fleet adapter: the CreateFleet request and its answers (Stubber), terminate and lookups (moto).

moto cannot execute a CreateFleet with InstanceRequirements, so creation is checked against
botocore's Stubber: the request field by field, and the adapter's reading of EC2's answers.
Terminate, the orphan lookup, states and DescribeInstanceTypes run against moto's EC2.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.stub import Stubber

from emulator.harness.control_plane import REGION
from runner_pool.adapters import aws_clients
from runner_pool.adapters.fleet import (
    RESOURCE_CLASS_TAG,
    RUN_KEY_TAG,
    Fleet,
    FleetSetup,
    InstanceShape,
    InstanceTypeCatalog,
    LaunchTemplate,
    NoLaunchTemplateError,
)
from runner_pool.domain.config import FleetSettings, StackConfig
from runner_pool.domain.fleet import (
    LAUNCH_TAG,
    Ec2State,
    FleetRequestError,
    LaunchAttempt,
    LaunchRequest,
    Termination,
)
from runner_pool.domain.records import Arch, InstanceFacts, UsageClass
from tests.support.aws_faults import RawBody, answer_busy

STACK_TAG = ("runner-pool:stack", "runner-pool-test")
SUBNETS = ("subnet-0a", "subnet-0b", "subnet-0c")
SETUP = FleetSetup(
    subnet_ids=SUBNETS,
    templates={Arch.X64: LaunchTemplate("lt-x64", "3"), Arch.ARM64: LaunchTemplate("lt-arm64", "5")},
    stack_tag_key=STACK_TAG[0],
    stack_tag_value=STACK_TAG[1],
)
KEY = "provision-42/create"
FALLBACK_ON = FleetSettings(spot_fallback_to_on_demand=True)
FALLBACK_OFF = FleetSettings(spot_fallback_to_on_demand=False)

SHAPES = {
    "c7i.large": (2, 4096, "x86_64"),
    "m7a.large": (2, 8192, "x86_64"),
    "c7g.xlarge": (4, 8192, "arm64"),
}


# --- Stubber: the request and the answers ------------------------------------------------------


class StubbedEc2:
    """A real EC2 client whose answers are queued by the test, and every request it sent."""

    def __init__(self) -> None:
        self.client: Any = boto3.client("ec2", region_name=REGION)
        self.stubber = Stubber(self.client)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.client.meta.events.register("provide-client-params.ec2.*", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.sent.append((model.name, dict(params)))

    def fleets_sent(self) -> list[dict[str, Any]]:
        return [params for name, params in self.sent if name == "CreateFleet"]

    def answer_fleet(
        self,
        launched: Sequence[tuple[str, list[str], str]] = (),
        errors: Sequence[tuple[str, str]] = (),
        error_lifecycle: str = "spot",
    ) -> None:
        """Queue one CreateFleet answer: (type, ids, lifecycle) launched; (code, subnet) refused."""
        self.stubber.add_response(
            "create_fleet",
            {
                "FleetId": "fleet-0123456789abcdef0",
                "Instances": [
                    {"InstanceIds": ids, "InstanceType": instance_type, "Lifecycle": lifecycle}
                    for instance_type, ids, lifecycle in launched
                ],
                "Errors": [
                    {
                        "ErrorCode": code,
                        "ErrorMessage": f"There is no {error_lifecycle} capacity in {subnet}",
                        "Lifecycle": error_lifecycle,
                        "LaunchTemplateAndOverrides": {
                            "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-x64", "Version": "3"},
                            "Overrides": {"SubnetId": subnet, "InstanceType": "c7i.large"},
                        },
                    }
                    for code, subnet in errors
                ],
            },
        )

    def answer_instance_types(self, *instance_types: str) -> None:
        self.stubber.add_response(
            "describe_instance_types",
            {
                "InstanceTypes": [
                    {
                        "InstanceType": name,
                        "VCpuInfo": {"DefaultVCpus": SHAPES[name][0]},
                        "MemoryInfo": {"SizeInMiB": SHAPES[name][1]},
                        "ProcessorInfo": {"SupportedArchitectures": [SHAPES[name][2]]},
                    }
                    for name in instance_types
                ]
            },
            {"InstanceTypes": sorted(instance_types)},
        )


@pytest.fixture
def stubbed() -> Iterator[StubbedEc2]:
    ec2 = StubbedEc2()
    with ec2.stubber:
        yield ec2
        ec2.stubber.assert_no_pending_responses()


@pytest.fixture
def fleet(stubbed: StubbedEc2) -> Fleet:
    return Fleet(SETUP, stubbed.client)


def request_for(config: StackConfig, label: str = "pool=42", count: int = 3, key: str = KEY) -> LaunchRequest:
    return LaunchRequest.for_run(config.spec_for(label), count, key)


def sent_request(fleet: Fleet, stubbed: StubbedEc2, request: LaunchRequest) -> dict[str, Any]:
    """The CreateFleet parameters actually sent for `request` (answered with nothing launched)."""
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[0])])
    fleet.launch(request)
    (params,) = stubbed.fleets_sent()
    return params


def requirements_of(params: dict[str, Any]) -> dict[str, Any]:
    (config,) = params["LaunchTemplateConfigs"]
    return dict(config["Overrides"][0]["InstanceRequirements"])


def test_the_request_for_a_default_spot_spec_is_exactly_this(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given the label `pool=42` (class large: 2 vCPU / 4 GiB, spot, x64, any type) and 3 to launch
    request = request_for(config, "pool=42", count=3)
    requirements = {
        "VCpuCount": {"Min": 2, "Max": 2},
        "MemoryMiB": {"Min": 4096, "Max": 8192},
        "CpuManufacturers": ["intel", "amd"],
        "BurstablePerformance": "excluded",
        "AcceleratorCount": {"Max": 0},
    }
    tags = [
        {"Key": "runner-pool:stack", "Value": "runner-pool-test"},
        {"Key": "runner-pool:resource-class", "Value": "large"},
        {"Key": "runner-pool:run-key", "Value": "pool=42"},
        {"Key": "runner-pool:launch", "Value": KEY},
    ]
    expected = {
        "Type": "instant",
        "ClientToken": "db69623b07d67b9635368a6f4fbf0218873bc71e3b249fcaefdb0eaa60368547",
        "TargetCapacitySpecification": {"TotalTargetCapacity": 3, "DefaultTargetCapacityType": "spot"},
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-x64", "Version": "3"},
                "Overrides": [
                    {"SubnetId": subnet, "InstanceRequirements": requirements} for subnet in SUBNETS
                ],
            }
        ],
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        "SpotOptions": {"AllocationStrategy": "price-capacity-optimized"},
    }
    stubbed.stubber.add_response("create_fleet", {"Instances": [], "Errors": []}, expected)
    # When it is launched / Then exactly this CreateFleet is sent (the Stubber compares every field)
    fleet.launch(request)


def test_the_fleet_is_instant_for_the_count_asked(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given 7 instances to launch
    params = sent_request(fleet, stubbed, request_for(config, count=7))
    # Then one synchronous fleet is asked for 7 instances
    assert params["Type"] == "instant"
    assert params["TargetCapacitySpecification"]["TotalTargetCapacity"] == 7


@pytest.mark.parametrize(
    ("usage", "options"),
    [
        ("spot", {"SpotOptions": {"AllocationStrategy": "price-capacity-optimized"}}),
        ("on-demand", {"OnDemandOptions": {"AllocationStrategy": "lowest-price"}}),
    ],
)
def test_a_usage_asks_for_its_capacity_type_allocated_its_way(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig, usage: str, options: dict[str, Any]
) -> None:
    # Given a label of that usage
    params = sent_request(fleet, stubbed, request_for(config, f"pool=42/usage={usage}"))
    # Then it is the capacity type, allocated its way (spot to the pools least likely to be interrupted,
    # on-demand lowest price first), and the other usage's options are not sent
    assert params["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == usage
    assert {key: params[key] for key in ("SpotOptions", "OnDemandOptions") if key in params} == options


def test_every_subnet_is_one_override_with_the_same_requirements(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a stack with three subnets, one per availability zone
    params = sent_request(fleet, stubbed, request_for(config))
    # Then the one template config has one override per subnet, all asking the same of the type
    (template_config,) = params["LaunchTemplateConfigs"]
    overrides = template_config["Overrides"]
    assert [override["SubnetId"] for override in overrides] == list(SUBNETS)
    assert all(override["InstanceRequirements"] == requirements_of(params) for override in overrides)
    assert all(set(override) == {"SubnetId", "InstanceRequirements"} for override in overrides)


@pytest.mark.parametrize(
    ("label", "requirements"),
    [
        # Class xlarge (4 vCPU / 8 GiB) and no types: exactly 4 vCPUs, 8 to 16 GiB, no burstable and no
        # accelerator types, any type name
        (
            "pool=42/class=xlarge",
            {
                "VCpuCount": {"Min": 4, "Max": 4},
                "MemoryMiB": {"Min": 8192, "Max": 16384},
                "CpuManufacturers": ["intel", "amd"],
                "BurstablePerformance": "excluded",
                "AcceleratorCount": {"Max": 0},
            },
        ),
        # Memory-optimised families named: only those globs, still at the class's vCPUs and at least its
        # memory
        (
            "pool=42/types=r7i*+r7a.large",
            {
                "VCpuCount": {"Min": 2, "Max": 2},
                "MemoryMiB": {"Min": 4096},
                "CpuManufacturers": ["intel", "amd"],
                "BurstablePerformance": "excluded",
                "AllowedInstanceTypes": ["r7i*", "r7a.large"],
            },
        ),
    ],
    ids=["without-named-types-the-class-fences", "named-types-lift-the-memory-fence"],
)
def test_the_requirements_are_the_labels_class_or_its_named_types(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig, label: str, requirements: dict[str, Any]
) -> None:
    # Given a label / When its launch is sent / Then the fleet asks for exactly its instance requirements
    params = sent_request(fleet, stubbed, request_for(config, label))
    assert requirements_of(params) == requirements


@pytest.mark.parametrize(
    ("arch", "template", "cpus"),
    [
        # The arm64 template (its AMI boots arm64 only) and only AWS-made (Graviton) CPUs
        ("arm64", {"LaunchTemplateId": "lt-arm64", "Version": "5"}, ["amazon-web-services"]),
        # The x64 template and only Intel or AMD CPUs
        ("x64", {"LaunchTemplateId": "lt-x64", "Version": "3"}, ["intel", "amd"]),
    ],
    ids=["arm64", "x64"],
)
def test_a_spec_takes_its_archs_template_and_cpus(
    fleet: Fleet,
    stubbed: StubbedEc2,
    config: StackConfig,
    *,
    arch: str,
    template: dict[str, str],
    cpus: list[str],
) -> None:
    # Given a label of `arch` / When its launch is sent / Then its arch's template and CPU makers
    params = sent_request(fleet, stubbed, request_for(config, f"pool=42/arch={arch}"))
    (template_config,) = params["LaunchTemplateConfigs"]
    assert template_config["LaunchTemplateSpecification"] == template
    assert requirements_of(params)["CpuManufacturers"] == cpus


def test_an_arch_without_a_template_is_refused_before_any_call(
    stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a stack deployed with an x64 template only
    fleet = Fleet(FleetSetup(SUBNETS, {Arch.X64: LaunchTemplate("lt-x64")}, *STACK_TAG), stubbed.client)
    # When an arm64 launch is asked for / Then it is refused, naming what the stack has
    with pytest.raises(NoLaunchTemplateError, match=r"arch=arm64.*x64"):
        fleet.launch(request_for(config, "pool=42/arch=arm64"))
    assert stubbed.fleets_sent() == []


def test_a_class_with_session_manager_launches_from_its_own_templates_and_no_other(
    stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a stack whose class xlarge has Session Manager, with its own template per architecture
    setup = FleetSetup(
        SUBNETS,
        {Arch.X64: LaunchTemplate("lt-x64")},
        *STACK_TAG,
        session_templates={Arch.X64: LaunchTemplate("lt-session-x64")},
        session_classes=frozenset({"xlarge"}),
    )
    fleet = Fleet(setup, stubbed.client)
    # When a job of xlarge and one of large are launched
    session = fleet.fleet_request(request_for(config, "pool=42/class=xlarge/arch=x64"))
    plain = fleet.fleet_request(request_for(config, "pool=43/class=large/arch=x64"))
    # Then each takes its class's template: the SSM agent's permissions reach xlarge's instances only
    assert session["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"]["LaunchTemplateId"] == (
        "lt-session-x64"
    )
    assert plain["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"]["LaunchTemplateId"] == "lt-x64"
    # And an architecture with no session template is refused for that class, not launched without it
    with pytest.raises(NoLaunchTemplateError, match=r"arch=arm64"):
        fleet.launch(request_for(config, "pool=44/class=xlarge/arch=arm64"))


def test_instances_and_volumes_are_tagged_with_the_stack_the_class_the_run_and_the_launch(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a launch for run key `pool=42/class=2xlarge`
    params = sent_request(fleet, stubbed, request_for(config, "pool=42/class=2xlarge"))
    # Then instances and their volumes carry the stack tag, the class and the run key
    expected = {
        STACK_TAG[0]: STACK_TAG[1],
        RESOURCE_CLASS_TAG: "2xlarge",
        RUN_KEY_TAG: "pool=42/class=2xlarge",
        LAUNCH_TAG: KEY,
    }
    tagged = {
        spec["ResourceType"]: {t["Key"]: t["Value"] for t in spec["Tags"]}
        for spec in params["TagSpecifications"]
    }
    assert tagged == {"instance": expected, "volume": expected}


def test_a_pool_launch_carries_no_run_key_tag(fleet: Fleet, stubbed: StubbedEc2, config: StackConfig) -> None:
    # Given a warm-pool launch for class xlarge (held by no run)
    params = sent_request(fleet, stubbed, LaunchRequest.for_pool(config, "xlarge", 2, "refresh-1/xlarge"))
    # Then the instances are tagged with the stack, the class and the launch only
    (instance_tags, _volume) = params["TagSpecifications"]
    assert {t["Key"]: t["Value"] for t in instance_tags["Tags"]} == {
        STACK_TAG[0]: STACK_TAG[1],
        RESOURCE_CLASS_TAG: "xlarge",
        LAUNCH_TAG: "refresh-1/xlarge",
    }


def test_a_run_key_longer_than_a_tag_value_is_clipped_in_the_tag(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a label whose type globs make it longer than EC2's 256-character tag values
    globs = "+".join(f"c{n}*" for n in range(100, 160))
    params = sent_request(fleet, stubbed, request_for(config, f"pool=42/types={globs}"))
    # Then the run-key tag holds its first 256 characters, and the request is still valid
    (instance_tags, _volume) = params["TagSpecifications"]
    run_tag = next(t["Value"] for t in instance_tags["Tags"] if t["Key"] == RUN_KEY_TAG)
    assert run_tag == f"pool=42/types={globs}"[:256]


def test_the_client_token_comes_from_the_idempotency_key(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given two launches with the same key and one with another
    same = [sent_request(fleet, stubbed, request_for(config, key=KEY))["ClientToken"]]
    stubbed.sent.clear()
    same.append(sent_request(fleet, stubbed, request_for(config, key=KEY))["ClientToken"])
    stubbed.sent.clear()
    other = sent_request(fleet, stubbed, request_for(config, key="provision-43/create"))["ClientToken"]
    # Then the same key gives the same token (EC2 replays instead of launching), another key another
    assert same[0] == same[1] == request_for(config).client_token
    assert other != same[0]
    assert len(same[0]) <= 64


def test_every_launched_instance_is_reported_with_its_real_shape(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given EC2 launches all three, on two types
    stubbed.answer_fleet(
        launched=[("c7i.large", ["i-0aaa", "i-0bbb"], "spot"), ("m7a.large", ["i-0ccc"], "spot")]
    )
    stubbed.answer_instance_types("c7i.large", "m7a.large")
    # When launched
    outcome = fleet.launch(request_for(config, count=3))
    # Then each instance has its facts, with the vCPU and memory of its real type
    assert outcome.launched == (
        InstanceFacts(
            instance_id="i-0aaa", resource_class="large", instance_type="c7i.large",
            usage_class=UsageClass.SPOT, arch=Arch.X64, cpu=2, memory_mib=4096,
        ),
        InstanceFacts(
            instance_id="i-0bbb", resource_class="large", instance_type="c7i.large",
            usage_class=UsageClass.SPOT, arch=Arch.X64, cpu=2, memory_mib=4096,
        ),
        InstanceFacts(
            instance_id="i-0ccc", resource_class="large", instance_type="m7a.large",
            usage_class=UsageClass.SPOT, arch=Arch.X64, cpu=2, memory_mib=8192,
        ),
    )  # fmt: skip
    assert (outcome.shortfall, outcome.failures) == (0, ())


def test_a_partial_launch_reports_what_launched_and_the_refusals_by_code(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given EC2 launches one of three and refuses two pools for lack of capacity, one for price
    stubbed.answer_fleet(
        launched=[("c7i.large", ["i-0aaa"], "spot")],
        errors=[
            ("InsufficientInstanceCapacity", SUBNETS[0]),
            ("InsufficientInstanceCapacity", SUBNETS[1]),
            ("SpotMaxPriceTooLow", SUBNETS[2]),
        ],
    )
    stubbed.answer_instance_types("c7i.large")
    # When launched
    outcome = fleet.launch(request_for(config, count=3))
    # Then the launched instance is reported, the remainder is 2, and each refusal is kept by code
    assert [facts.instance_id for facts in outcome.launched] == ["i-0aaa"]
    assert outcome.shortfall == 2
    by_code = outcome.failures_by_code()
    assert {code: [f.subnet_id for f in failures] for code, failures in by_code.items()} == {
        "InsufficientInstanceCapacity": [SUBNETS[0], SUBNETS[1]],
        "SpotMaxPriceTooLow": [SUBNETS[2]],
    }
    assert by_code["SpotMaxPriceTooLow"][0].usage is UsageClass.SPOT
    assert by_code["SpotMaxPriceTooLow"][0].instance_type == "c7i.large"


def test_a_launch_of_nothing_reports_only_the_refusals(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given EC2 launches nothing at all
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", subnet) for subnet in SUBNETS])
    # When launched (no instance type to describe, so no DescribeInstanceTypes either)
    outcome = fleet.launch(request_for(config, count=2))
    # Then nothing is reported launched, the whole count is short, and the refusals are kept
    assert outcome.launched == ()
    assert outcome.shortfall == 2
    assert len(outcome.failures_by_code()["InsufficientInstanceCapacity"]) == 3


def test_instance_types_are_described_once_per_process(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given two launches landing on the same type
    stubbed.answer_fleet(launched=[("c7i.large", ["i-0aaa"], "spot")])
    stubbed.answer_instance_types("c7i.large")
    stubbed.answer_fleet(launched=[("c7i.large", ["i-0bbb"], "spot")])
    # When both are launched through the same adapter
    fleet.launch(request_for(config, count=1, key="a"))
    second = fleet.launch(request_for(config, count=1, key="b"))
    # Then the type was described only for the first (the Stubber has no second answer queued)
    assert [name for name, _ in stubbed.sent] == ["CreateFleet", "DescribeInstanceTypes", "CreateFleet"]
    assert second.launched[0].cpu == 2


def test_a_spot_shortfall_is_retried_once_on_demand_with_its_own_token(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a spot launch of 3 where EC2 launches one spot and then two on-demand
    stubbed.answer_fleet(
        launched=[("c7i.large", ["i-0aaa"], "spot")], errors=[("InsufficientInstanceCapacity", SUBNETS[0])]
    )
    stubbed.answer_instance_types("c7i.large")
    stubbed.answer_fleet(launched=[("m7a.large", ["i-0bbb", "i-0ccc"], "on-demand")])
    stubbed.answer_instance_types("m7a.large")
    request = request_for(config, "pool=42/usage=spot", count=3)
    # When launched with the fallback allowed
    outcome = fleet.launch_with_fallback(request, FALLBACK_ON)
    # Then the second CreateFleet asks for the remainder of 2, on-demand, under another token
    first, retry = stubbed.fleets_sent()
    assert retry["TargetCapacitySpecification"] == {
        "TotalTargetCapacity": 2,
        "DefaultTargetCapacityType": "on-demand",
    }
    assert retry["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
    assert "SpotOptions" not in retry
    assert retry["ClientToken"] != first["ClientToken"]
    expected_retry = request.model_copy(update={"attempt": LaunchAttempt.ON_DEMAND_FALLBACK})
    assert retry["ClientToken"] == expected_retry.client_token
    # And the outcome holds all three, each with its real usage, and the first call's refusal
    assert [(f.instance_id, f.usage_class) for f in outcome.launched] == [
        ("i-0aaa", UsageClass.SPOT),
        ("i-0bbb", UsageClass.ON_DEMAND),
        ("i-0ccc", UsageClass.ON_DEMAND),
    ]
    assert (outcome.requested, outcome.shortfall) == (3, 0)
    assert [f.code for f in outcome.failures] == ["InsufficientInstanceCapacity"]


def test_the_retry_keeps_everything_but_usage_and_count(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a spot launch that launches nothing, then nothing again on-demand
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[0])])
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[0])], error_lifecycle="on-demand")
    # When launched with the fallback allowed
    fleet.launch_with_fallback(request_for(config, "pool=42/class=xlarge/types=c7*", count=2), FALLBACK_ON)
    # Then the retry has the same template, subnets, requirements and tags as the first call
    first, retry = stubbed.fleets_sent()
    for field in ("LaunchTemplateConfigs", "TagSpecifications", "Type"):
        assert retry[field] == first[field], field


def test_a_retry_that_falls_short_too_is_not_retried_again(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given EC2 has neither spot nor on-demand capacity
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[0])])
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[1])], error_lifecycle="on-demand")
    # When launched with the fallback allowed
    outcome = fleet.launch_with_fallback(request_for(config, count=2), FALLBACK_ON)
    # Then two calls were made, no more, and the outcome keeps both calls' refusals and the shortfall
    assert len(stubbed.fleets_sent()) == 2
    assert outcome.shortfall == 2
    assert [(f.subnet_id, f.usage) for f in outcome.failures] == [
        (SUBNETS[0], UsageClass.SPOT),
        (SUBNETS[1], UsageClass.ON_DEMAND),
    ]


def test_a_spot_shortfall_is_not_retried_when_the_fallback_is_off(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given a spot launch that falls short, and a config that keeps spot jobs on spot
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[0])])
    # When launched
    outcome = fleet.launch_with_fallback(request_for(config, "pool=42/usage=spot", count=2), FALLBACK_OFF)
    # Then only the one CreateFleet was made and the shortfall stands
    assert len(stubbed.fleets_sent()) == 1
    assert outcome.shortfall == 2


def test_an_on_demand_shortfall_is_not_retried(
    fleet: Fleet, stubbed: StubbedEc2, config: StackConfig
) -> None:
    # Given an on-demand launch that falls short
    stubbed.answer_fleet(errors=[("InsufficientInstanceCapacity", SUBNETS[0])], error_lifecycle="on-demand")
    # When launched with the fallback allowed
    outcome = fleet.launch_with_fallback(request_for(config, "pool=42/usage=on-demand", count=2), FALLBACK_ON)
    # Then there is nothing to fall back to: one call, the shortfall stands
    assert len(stubbed.fleets_sent()) == 1
    assert outcome.shortfall == 2


def test_a_full_launch_is_not_retried(fleet: Fleet, stubbed: StubbedEc2, config: StackConfig) -> None:
    # Given a spot launch where EC2 launches everything
    stubbed.answer_fleet(launched=[("c7i.large", ["i-0aaa", "i-0bbb"], "spot")])
    stubbed.answer_instance_types("c7i.large")
    # When launched with the fallback allowed
    outcome = fleet.launch_with_fallback(request_for(config, count=2), FALLBACK_ON)
    # Then one call was enough
    assert len(stubbed.fleets_sent()) == 1
    assert len(outcome.launched) == 2


def created_fleet_response(instance_id: str) -> AWSResponse:
    """EC2's wire answer to a CreateFleet that launched one spot c7i.large (CreateFleetResult's XML names)."""
    body = (
        '<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>test</requestId><fleetId>fleet-0test</fleetId><errorSet/>"
        "<fleetInstanceSet><item><instanceIds><item>"
        f"{instance_id}"
        "</item></instanceIds><instanceType>c7i.large</instanceType><lifecycle>spot</lifecycle></item>"
        "</fleetInstanceSet></CreateFleetResponse>"
    )
    headers = HTTPHeaders.from_dict({"Content-Type": "text/xml"})
    return AWSResponse("https://ec2.test/", 200, headers, RawBody(body.encode()))


def test_a_throttled_create_fleet_is_retried_by_botocore_with_the_same_token(
    aws: None, config: StackConfig
) -> None:
    # Given a client built as the product builds it, and EC2 throttling the first CreateFleet attempt
    # (RequestLimitExceeded, EC2's throttling code: https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html)
    ec2 = aws_clients.client("ec2", region_name=REGION)
    busy = answer_busy(ec2, "CreateFleet", times=1, code="RequestLimitExceeded", status=503)
    sent: list[str] = []

    def launched(request: Any, **_: Any) -> AWSResponse:
        sent.append(request.body)
        return created_fleet_response("i-0aaa")

    ec2.meta.events.register("before-send.ec2.CreateFleet", launched)
    # When launched
    outcome = Fleet(SETUP, ec2).launch(request_for(config, count=1))
    # Then botocore sent it again, under the same token, and its instance is reported
    assert busy.sent == 2
    assert len(sent) == 2
    assert sent[0] == sent[1]
    assert "ClientToken=" in sent[1]
    assert [facts.instance_id for facts in outcome.launched] == ["i-0aaa"]


def test_a_refused_call_raises_with_ec2s_code(fleet: Fleet, stubbed: StubbedEc2, config: StackConfig) -> None:
    # Given EC2 refuses the whole call: the key was used before for a different launch
    stubbed.stubber.add_client_error(
        "create_fleet", "IdempotentParameterMismatch", "The client token was used with other parameters", 400
    )
    # When launched / Then a FleetRequestError carries EC2's code
    with pytest.raises(FleetRequestError) as refused:
        fleet.launch(request_for(config, count=1))
    assert refused.value.code == "IdempotentParameterMismatch"


# --- moto: terminate, the orphan lookup, states, instance types --------------------------------


@pytest.fixture
def ec2(aws: None) -> Any:
    return aws_clients.client("ec2", region_name=REGION)


@pytest.fixture
def moto_fleet(ec2: Any) -> Fleet:
    return Fleet(SETUP, ec2)


MOTO_AMI = "ami-12c6146b"
"""One of the AMIs moto's EC2 starts with."""


def run(ec2: Any, count: int = 1, tags: dict[str, str] | None = None) -> list[str]:
    tag_spec = {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()]}
    response = ec2.run_instances(
        ImageId=MOTO_AMI,
        MinCount=count,
        MaxCount=count,
        InstanceType="c7i.large",
        TagSpecifications=[tag_spec] if tags else [],
    )
    return [instance["InstanceId"] for instance in response["Instances"]]


def calls_of(ec2: Any, operation: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    ec2.meta.events.register(
        f"provide-client-params.ec2.{operation}", lambda params, **_: calls.append(dict(params))
    )
    return calls


def ec2_state(ec2: Any, instance_id: str) -> str:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def test_terminate_reports_each_instance_terminating(ec2: Any, moto_fleet: Fleet) -> None:
    # Given two running instances
    ids = run(ec2, 2)
    # When they are terminated
    results = moto_fleet.terminate(ids)
    # Then each is reported on its way out, and EC2 has terminated both
    assert results == dict.fromkeys(ids, Termination.TERMINATING)
    assert [ec2_state(ec2, i) for i in ids] == ["terminated", "terminated"]


def test_unknown_ids_in_a_batch_are_reported_unknown_and_the_rest_terminated(
    ec2: Any, moto_fleet: Fleet
) -> None:
    # Given two running instances listed with an id EC2 never issued and a malformed one
    known = run(ec2, 2)
    ids = [known[0], "i-0123456789abcdef0", known[1], "not-an-instance"]
    # When the batch is terminated (EC2 refuses a batch holding an unknown id as a whole)
    results = moto_fleet.terminate(ids)
    # Then the unknown ids are reported gone, and the known ones are still terminated
    assert results == {
        known[0]: Termination.TERMINATING,
        "i-0123456789abcdef0": Termination.UNKNOWN,
        known[1]: Termination.TERMINATING,
        "not-an-instance": Termination.UNKNOWN,
    }
    assert [ec2_state(ec2, i) for i in known] == ["terminated", "terminated"]


def test_terminate_goes_in_batches_of_a_hundred(ec2: Any, moto_fleet: Fleet) -> None:
    # Given 101 running instances
    ids = run(ec2, 101)
    calls = calls_of(ec2, "TerminateInstances")
    # When they are terminated
    results = moto_fleet.terminate(ids)
    # Then two calls were made, of 100 and 1, and every instance is reported
    assert [len(call["InstanceIds"]) for call in calls] == [100, 1]
    assert set(results) == set(ids)


def test_a_throttled_terminate_is_retried(ec2: Any, moto_fleet: Fleet) -> None:
    # Given a running instance, and EC2 throttling the first TerminateInstances
    (instance_id,) = run(ec2)
    busy = answer_busy(ec2, "TerminateInstances", times=1, code="RequestLimitExceeded", status=503)
    # When it is terminated / Then it is, on botocore's second attempt
    assert moto_fleet.terminate([instance_id]) == {instance_id: Termination.TERMINATING}
    assert ec2_state(ec2, instance_id) == "terminated"
    assert busy.sent == 2


def test_an_already_terminated_instance_is_reported_terminated(stubbed: StubbedEc2, fleet: Fleet) -> None:
    # Given EC2 answers that the instance was already terminated
    stubbed.stubber.add_response(
        "terminate_instances",
        {
            "TerminatingInstances": [
                {
                    "InstanceId": "i-0aaa",
                    "CurrentState": {"Code": 48, "Name": "terminated"},
                    "PreviousState": {"Code": 48, "Name": "terminated"},
                }
            ]
        },
        {"InstanceIds": ["i-0aaa"]},
    )
    # When it is terminated / Then it is reported terminated
    assert fleet.terminate(["i-0aaa"]) == {"i-0aaa": Termination.TERMINATED}


def test_a_malformed_id_is_sorted_out_of_its_batch(stubbed: StubbedEc2, fleet: Fleet) -> None:
    # Given EC2 refuses a batch for a malformed id, and knows the other one
    stubbed.stubber.add_client_error(
        "terminate_instances", "InvalidInstanceID.Malformed", 'Invalid id: "bogus"'
    )
    stubbed.stubber.add_response(
        "describe_instances",
        {
            "Reservations": [
                {"Instances": [{"InstanceId": "i-0aaa", "State": {"Code": 16, "Name": "running"}}]}
            ]
        },
    )
    stubbed.stubber.add_response(
        "terminate_instances",
        {
            "TerminatingInstances": [
                {"InstanceId": "i-0aaa", "CurrentState": {"Code": 32, "Name": "shutting-down"}}
            ]
        },
        {"InstanceIds": ["i-0aaa"]},
    )
    # When both are terminated
    results = fleet.terminate(["i-0aaa", "bogus"])
    # Then the known one is terminated and the malformed one reported unknown
    assert results == {"i-0aaa": Termination.TERMINATING, "bogus": Termination.UNKNOWN}


def test_ids_ec2_both_shows_and_refuses_are_terminated_one_by_one(stubbed: StubbedEc2, fleet: Fleet) -> None:
    # Given EC2 refuses the batch as unknown, yet describes both ids (its views are eventually consistent)
    stubbed.stubber.add_client_error(
        "terminate_instances", "InvalidInstanceID.NotFound", "The instance ID 'i-0bbb' does not exist"
    )
    running = {"Code": 16, "Name": "running"}
    stubbed.stubber.add_response(
        "describe_instances",
        {
            "Reservations": [
                {
                    "Instances": [
                        {"InstanceId": "i-0aaa", "State": running},
                        {"InstanceId": "i-0bbb", "State": running},
                    ]
                }
            ]
        },
    )
    stubbed.stubber.add_response(
        "terminate_instances",
        {
            "TerminatingInstances": [
                {"InstanceId": "i-0aaa", "CurrentState": {"Code": 32, "Name": "shutting-down"}}
            ]
        },
        {"InstanceIds": ["i-0aaa"]},
    )
    stubbed.stubber.add_client_error(
        "terminate_instances", "InvalidInstanceID.NotFound", "The instance ID 'i-0bbb' does not exist"
    )
    # When both are terminated
    results = fleet.terminate(["i-0aaa", "i-0bbb"])
    # Then each was tried alone: the one EC2 accepts is terminating, the one it refuses unknown
    assert results == {"i-0aaa": Termination.TERMINATING, "i-0bbb": Termination.UNKNOWN}


def test_tagged_instances_are_the_live_ones_of_this_stack(ec2: Any, moto_fleet: Fleet) -> None:
    # Given two instances of this stack, one of another stack, and one of this stack terminated
    ours = run(ec2, 2, {STACK_TAG[0]: STACK_TAG[1]})
    run(ec2, 1, {STACK_TAG[0]: "another-stack"})
    (gone,) = run(ec2, 1, {STACK_TAG[0]: STACK_TAG[1]})
    ec2.terminate_instances(InstanceIds=[gone])
    # When this stack's tagged instances are listed
    tagged = moto_fleet.tagged_instances(*STACK_TAG)
    # Then only the two live ones of this stack are
    assert sorted(tagged) == sorted(ours)


def test_tagged_instances_leave_out_those_launched_since(ec2: Any, moto_fleet: Fleet) -> None:
    # Given an instance of this stack launched just now
    run(ec2, 1, {STACK_TAG[0]: STACK_TAG[1]})
    # When listed, asking only for instances launched before a minute ago / Then it is left out
    assert moto_fleet.tagged_instances(*STACK_TAG, launched_before=time.time() - 60) == []
    # And asking for those launched before a minute from now includes it
    assert len(moto_fleet.tagged_instances(*STACK_TAG, launched_before=time.time() + 60)) == 1


def test_tagged_instances_follow_every_page(stubbed: StubbedEc2, fleet: Fleet) -> None:
    # Given EC2 answers in two pages
    filters = [
        {"Name": f"tag:{STACK_TAG[0]}", "Values": [STACK_TAG[1]]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
    ]
    page = {"Code": 16, "Name": "running"}
    stubbed.stubber.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [{"InstanceId": "i-0aaa", "State": page}]}], "NextToken": "page-2"},
        {"Filters": filters, "MaxResults": 1000},
    )
    stubbed.stubber.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [{"InstanceId": "i-0bbb", "State": page}]}]},
        {"Filters": filters, "MaxResults": 1000, "NextToken": "page-2"},
    )
    # When this stack's instances are listed / Then both pages' instances are
    assert fleet.tagged_instances(*STACK_TAG) == ["i-0aaa", "i-0bbb"]


def test_states_name_each_instance_and_unknown_ones(ec2: Any, moto_fleet: Fleet) -> None:
    # Given a running instance, a terminated one, and an id EC2 does not know
    running, terminated = run(ec2, 2)
    ec2.terminate_instances(InstanceIds=[terminated])
    # When their states are asked for
    states = moto_fleet.states([running, terminated, "i-0123456789abcdef0"])
    # Then each id has EC2's state, the unknown one UNKNOWN, and only the running one is not gone
    assert states == {
        running: Ec2State.RUNNING,
        terminated: Ec2State.TERMINATED,
        "i-0123456789abcdef0": Ec2State.UNKNOWN,
    }
    assert [state.is_gone for state in states.values()] == [False, True, True]


def test_the_catalog_reads_shapes_from_describe_instance_types(ec2: Any) -> None:
    # Given moto's EC2 and a catalog over it
    catalog = InstanceTypeCatalog(ec2)
    # When two types are looked up
    shapes = catalog.shapes(["c7i.large", "m7g.xlarge"])
    # Then each has its vCPUs, memory and architecture
    assert shapes == {
        "c7i.large": InstanceShape(cpu=2, memory_mib=4096, arch=Arch.X64),
        "m7g.xlarge": InstanceShape(cpu=4, memory_mib=16384, arch=Arch.ARM64),
    }


def test_the_catalog_describes_a_type_only_once(ec2: Any) -> None:
    # Given a catalog that has looked up one type
    catalog = InstanceTypeCatalog(ec2)
    catalog.shapes(["c7i.large"])
    calls = calls_of(ec2, "DescribeInstanceTypes")
    # When it and a new one are looked up
    catalog.shapes(["c7i.large", "c7g.large"])
    # Then only the new one is described
    assert [call["InstanceTypes"] for call in calls] == [["c7g.large"]]
