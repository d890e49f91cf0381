"""The simulated EC2's CreateFleet, driven by the real fleet adapter against moto's EC2."""

from __future__ import annotations

import dataclasses
import fnmatch
from functools import partial
from typing import Any, NamedTuple

import pytest
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import validate_parameters

from emulator.ec2_fleet import SimulatedEc2
from emulator.harness.control_plane import REGION
from emulator.resources import create_fleet_setup
from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import ServiceBusyError
from runner_pool.adapters.fleet import RESOURCE_CLASS_TAG, RUN_KEY_TAG, Fleet, FleetSetup, LaunchTemplate
from runner_pool.domain.config import FleetSettings, StackConfig
from runner_pool.domain.fleet import FleetRequestError, LaunchOutcome, LaunchRequest
from runner_pool.domain.records import Arch, UsageClass
from runner_pool.environment import STACK_TAG_KEY
from tests.support.racing import at_once

STACK = "runner-pool-test"
FALLBACK_ON = FleetSettings(spot_fallback_to_on_demand=True)


@pytest.fixture
def ec2(aws: None) -> Any:
    return aws_clients.client("ec2", region_name=REGION)


@pytest.fixture
def simulated(ec2: Any) -> SimulatedEc2:
    return SimulatedEc2(ec2)


@pytest.fixture
def setup(ec2: Any) -> FleetSetup:
    return create_fleet_setup(ec2, STACK)


@pytest.fixture
def fleet(setup: FleetSetup, simulated: SimulatedEc2) -> Fleet:
    return Fleet(setup, simulated)  # type: ignore[arg-type]


class Fence(NamedTuple):
    """What a launched type must be: the vCPUs, the memory range (None: no ceiling), and type globs."""

    cpu: int
    memory_min: int
    memory_max: int | None
    types: tuple[str, ...]


def request_for(
    config: StackConfig, label: str = "pool=42", count: int = 3, key: str = "p-1"
) -> LaunchRequest:
    return LaunchRequest.for_run(config.spec_for(label), count, key)


def described(ec2: Any, outcome: LaunchOutcome) -> dict[str, dict[str, Any]]:
    """moto's own view of every instance the outcome names."""
    ids = [facts.instance_id for facts in outcome.launched]
    reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"] if ids else []
    return {i["InstanceId"]: i for r in reservations for i in r["Instances"]}


def ec2_instance_count(ec2: Any) -> int:
    return sum(len(r["Instances"]) for r in ec2.describe_instances()["Reservations"])


def test_a_launch_starts_every_instance_in_ec2_with_the_stack_class_and_run_tags(
    fleet: Fleet, ec2: Any, setup: FleetSetup, config: StackConfig
) -> None:
    # Given a spot request for 3 runners of run key `pool=42`
    request = request_for(config, "pool=42", count=3)
    # When the fleet adapter launches it
    outcome = fleet.launch(request)
    # Then EC2 has 3 live spot instances in the stack's subnets, each tagged for stack, class and run
    instances = described(ec2, outcome)
    assert len(instances) == 3
    for instance in instances.values():
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags[STACK_TAG_KEY] == STACK
        assert (tags[RESOURCE_CLASS_TAG], tags[RUN_KEY_TAG]) == ("large", "pool=42")
        assert instance["State"]["Name"] in ("pending", "running")
        assert instance["SubnetId"] in setup.subnet_ids
        assert instance["InstanceLifecycle"] == "spot"


@pytest.mark.parametrize(
    ("label", "fence"),
    [
        ("pool=1", Fence(2, 4096, 8192, ("c*i.large", "m*i.large"))),
        ("pool=1/class=xlarge", Fence(4, 8192, 16384, ("c*i.xlarge", "m*i.xlarge"))),
        ("pool=1/class=8xlarge", Fence(32, 65536, 131072, ("c*i.8xlarge", "m*i.8xlarge"))),
        ("pool=1/arch=arm64", Fence(2, 4096, 8192, ("c7g.large", "m7g.large"))),
        ("pool=1/types=r7i*", Fence(2, 4096, None, ("r7i.large",))),
        ("pool=1/types=t3*+r7i*", Fence(2, 4096, None, ("r7i.large",))),
    ],
)
def test_the_chosen_type_lies_inside_the_class_fence(
    fleet: Fleet, ec2: Any, config: StackConfig, label: str, fence: Fence
) -> None:
    # Given a label's class, architecture and allowed types
    # When one instance is launched for it
    outcome = fleet.launch(request_for(config, label, count=1))
    # Then its type has the class's vCPUs and memory, is not burstable nor a GPU type, and fits the globs
    (facts,) = outcome.launched
    assert facts.cpu == fence.cpu
    assert fence.memory_min <= facts.memory_mib <= (fence.memory_max or facts.memory_mib)
    assert any(fnmatch.fnmatchcase(facts.instance_type, glob) for glob in fence.types)
    assert described(ec2, outcome)[facts.instance_id]["InstanceType"] == facts.instance_type


def test_a_gpu_type_is_chosen_only_when_accelerators_are_allowed(
    fleet: Fleet, simulated: SimulatedEc2, config: StackConfig
) -> None:
    # Given requirements that a GPU type (g5.xlarge: 4 vCPU, 16 GiB) meets as well as m6i.xlarge
    params: Any = fleet.fleet_request(request_for(config, "pool=1/class=xlarge", count=1))
    for override in params["LaunchTemplateConfigs"][0]["Overrides"]:
        override["InstanceRequirements"]["MemoryMiB"] = {"Min": 16384, "Max": 16384}
    # When CreateFleet is asked with accelerators fenced out, and then without that fence
    (fenced,) = simulated.create_fleet(**params)["Instances"]
    for override in params["LaunchTemplateConfigs"][0]["Overrides"]:
        override["InstanceRequirements"].pop("AcceleratorCount", None)
    params["ClientToken"] = "unfenced"
    (unfenced,) = simulated.create_fleet(**params)["Instances"]
    # Then only the unfenced request may land on the GPU type
    assert (fenced["InstanceType"], unfenced["InstanceType"]) == ("m6i.xlarge", "g5.xlarge")


def test_types_no_catalog_type_satisfies_launch_nothing_and_say_why(
    fleet: Fleet, config: StackConfig
) -> None:
    # Given a label allowing only types EC2 has no such size of
    request = request_for(config, "pool=1/class=8xlarge/types=t3*", count=2)
    # When launched
    outcome = fleet.launch(request)
    # Then nothing is launched and every override reports the configuration error
    assert outcome.launched == ()
    assert {f.code for f in outcome.failures} == {"InvalidFleetConfiguration"}


def test_short_spot_capacity_launches_what_fits_and_reports_each_refused_pool(
    fleet: Fleet, simulated: SimulatedEc2, setup: FleetSetup, config: StackConfig
) -> None:
    # Given EC2 has room for one more spot instance
    simulated.set_capacity("spot", 1)
    # When 3 spot instances are launched
    outcome = fleet.launch(request_for(config, "pool=42/usage=spot", count=3))
    # Then one is, and every subnet's pool reports spot InsufficientInstanceCapacity
    assert len(outcome.launched) == 1
    assert outcome.shortfall == 2
    assert [(f.code, f.usage, f.subnet_id) for f in outcome.failures] == [
        ("InsufficientInstanceCapacity", UsageClass.SPOT, subnet) for subnet in setup.subnet_ids
    ]


def test_the_on_demand_fallback_launches_the_spot_remainder(
    fleet: Fleet, simulated: SimulatedEc2, ec2: Any, config: StackConfig
) -> None:
    # Given EC2 has room for one more spot instance and any number of on-demand ones
    simulated.set_capacity("spot", 1)
    # When 3 spot instances are launched with the on-demand fallback allowed
    outcome = fleet.launch_with_fallback(request_for(config, "pool=42/usage=spot", count=3), FALLBACK_ON)
    # Then all 3 run: one spot and two on-demand, as EC2 itself reports them
    assert outcome.shortfall == 0
    usage = sorted(facts.usage_class for facts in outcome.launched)
    assert usage == [UsageClass.ON_DEMAND, UsageClass.ON_DEMAND, UsageClass.SPOT]
    lifecycles = sorted(i.get("InstanceLifecycle", "on-demand") for i in described(ec2, outcome).values())
    assert lifecycles == ["on-demand", "on-demand", "spot"]


def test_a_subnet_without_room_leaves_its_share_to_the_next_subnet(
    fleet: Fleet, simulated: SimulatedEc2, ec2: Any, setup: FleetSetup, config: StackConfig
) -> None:
    # Given the first subnet has room for one instance
    simulated.subnet_capacity[setup.subnet_ids[0]] = 1
    # When 3 on-demand instances are launched
    outcome = fleet.launch(request_for(config, "pool=42/usage=on-demand", count=3))
    # Then all 3 run, one in the first subnet and two in the second, and the first reports its refusal
    subnets = sorted(i["SubnetId"] for i in described(ec2, outcome).values())
    assert subnets == sorted([setup.subnet_ids[0], setup.subnet_ids[1], setup.subnet_ids[1]])
    assert [(f.code, f.subnet_id) for f in outcome.failures] == [
        ("InsufficientInstanceCapacity", setup.subnet_ids[0])
    ]


def test_the_same_client_token_answers_with_the_first_launch_and_launches_nothing_more(
    fleet: Fleet, simulated: SimulatedEc2, ec2: Any, config: StackConfig
) -> None:
    # Given a launch of 2 that has happened
    request = request_for(config, count=2, key="provision-7/create")
    first = fleet.launch(request)
    # When the same request (same token) is launched again, as a retried step would
    again = fleet.launch(request)
    # Then it reports the same instances and EC2 holds only those 2
    assert again.launched == first.launched
    assert ec2_instance_count(ec2) == 2


def test_a_token_reused_for_another_launch_is_refused(fleet: Fleet, config: StackConfig) -> None:
    # Given a launch of 2 under a key
    fleet.launch(request_for(config, count=2, key="provision-7/create"))
    # When the same key asks for 3 / Then EC2 refuses the whole call
    with pytest.raises(FleetRequestError) as refused:
        fleet.launch(request_for(config, count=3, key="provision-7/create"))
    assert refused.value.code == "IdempotentParameterMismatch"


def test_a_create_fleet_throttled_past_botocores_retries_is_service_busy_and_the_callers_retry_launches(
    fleet: Fleet, simulated: SimulatedEc2, config: StackConfig
) -> None:
    # Given EC2 throttling the next CreateFleet through every attempt the client makes
    simulated.fail_next(1, "RequestLimitExceeded")
    # When 2 instances are launched, the adapter does not try again itself: the caller is told EC2
    # is busy (Step Functions retries the step), and nothing was launched
    with pytest.raises(ServiceBusyError):
        fleet.launch(request_for(config, count=2))
    assert ec2_instance_count(simulated) == 0
    # Then the caller's retry, under the same key, launches them
    outcome = fleet.launch(request_for(config, count=2))
    assert len(outcome.launched) == 2
    assert simulated.calls["CreateFleet"] == 2


def test_a_refused_call_launches_nothing_and_carries_ec2s_code(
    fleet: Fleet, simulated: SimulatedEc2, ec2: Any, config: StackConfig
) -> None:
    # Given the launching role may not call CreateFleet
    simulated.fail_next(1, "UnauthorizedOperation")
    # When a launch is tried / Then it is refused with EC2's code and nothing runs
    with pytest.raises(FleetRequestError) as refused:
        fleet.launch(request_for(config, count=2))
    assert refused.value.code == "UnauthorizedOperation"
    assert ec2_instance_count(ec2) == 0


def test_a_malformed_request_fails_validation_like_a_real_client(
    fleet: Fleet, simulated: SimulatedEc2, ec2: Any, config: StackConfig
) -> None:
    # Given the adapter's request with a count that is not an integer
    params: Any = fleet.fleet_request(request_for(config, count=2))
    params["TargetCapacitySpecification"]["TotalTargetCapacity"] = "two"
    # When it is sent / Then botocore's model rejects it before anything is launched
    with pytest.raises(ParamValidationError, match="TotalTargetCapacity"):
        simulated.create_fleet(**params)
    assert ec2_instance_count(ec2) == 0


def test_only_instant_fleets_are_simulated(
    fleet: Fleet, simulated: SimulatedEc2, config: StackConfig
) -> None:
    # Given the adapter's request turned into a maintained fleet
    params: Any = fleet.fleet_request(request_for(config, count=1))
    params["Type"] = "maintain"
    # When it is sent / Then it is refused as an invalid parameter value
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        simulated.create_fleet(**params)


def test_the_answer_has_the_shape_of_ec2s_create_fleet_output(
    fleet: Fleet, simulated: SimulatedEc2, config: StackConfig
) -> None:
    # Given a launch that partly succeeds (so Instances and Errors are both filled)
    simulated.set_capacity("spot", 1)
    # When CreateFleet answers
    response = simulated.create_fleet(**fleet.fleet_request(request_for(config, count=2)))
    # Then the answer is valid against botocore's output shape of CreateFleet, with both lists filled
    output = simulated.meta.service_model.operation_model("CreateFleet").output_shape
    validate_parameters(response, output)
    assert response["FleetId"].startswith("fleet-")
    (launched,) = response["Instances"]
    assert launched["Lifecycle"] == "spot"
    assert set(launched["LaunchTemplateAndOverrides"]["Overrides"]) == {"SubnetId", "InstanceType"}
    assert {error["ErrorCode"] for error in response["Errors"]} == {"InsufficientInstanceCapacity"}


def test_concurrent_launches_never_exceed_the_capacity(
    fleet: Fleet, simulated: SimulatedEc2, ec2: Any, config: StackConfig
) -> None:
    # Given room for 5 spot instances and 4 threads each launching 2 under its own key
    simulated.set_capacity("spot", 5)
    outcomes: list[LaunchOutcome] = []

    def launch(number: int) -> None:
        outcomes.append(fleet.launch(request_for(config, count=2, key=f"provision-{number}")))

    # When they launch at once
    at_once(*(partial(launch, n) for n in range(4)))
    # Then exactly 5 are launched in all, and EC2 holds exactly those
    assert sum(len(outcome.launched) for outcome in outcomes) == 5
    assert ec2_instance_count(ec2) == 5


# --- the runner image: launch templates that boot an SSM parameter ----------------------------------


def image_parameter_name(stack: str, arch: Arch) -> str:
    """Named as infra/constructs/instances.py names the stack's (not imported: that would start CDK)."""
    return f"/imagebuilder/runner-pool/{stack}/{arch.value}"


def test_without_an_image_instances_boot_the_base_ami_and_the_next_launch_after_one_boots_it(
    aws: None, ec2: Any, config: StackConfig
) -> None:
    # Given launch templates shaped as the stack's: each boots the stack's image parameter, which the
    # stack creates holding the base AMI (infra/constructs/instances.py), and no image built yet
    ssm = aws_clients.client("ssm", region_name=REGION)
    base = create_fleet_setup(ec2, STACK)
    base_ami = {
        arch: ec2.describe_launch_template_versions(LaunchTemplateId=t.template_id, Versions=["$Default"])[
            "LaunchTemplateVersions"
        ][0]["LaunchTemplateData"]["ImageId"]
        for arch, t in base.templates.items()
    }
    templates = {}
    for arch, ami in base_ami.items():
        name = image_parameter_name(STACK, arch)
        ssm.put_parameter(Name=name, Value=ami, Type="String", DataType="aws:ec2:image")
        templates[arch] = LaunchTemplate(
            ec2.create_launch_template(
                LaunchTemplateName=f"{STACK}-image-{arch.value}",
                LaunchTemplateData={"ImageId": f"resolve:ssm:{name}"},
            )["LaunchTemplate"]["LaunchTemplateId"]
        )
    setup = dataclasses.replace(base, templates=templates)
    fleet = Fleet(setup, SimulatedEc2(ec2, ssm=ssm))  # type: ignore[arg-type]

    # When runners are launched
    first = fleet.launch(request_for(config, "pool=42", count=2, key="before"))

    # Then they boot the base AMI: the fallback, on which the user data installs everything
    assert {i["ImageId"] for i in described(ec2, first).values()} == {base_ami[Arch.X64]}

    # When the pipeline's distribution writes a new image into the parameter (as Image Builder does)
    (instance_id, *_) = described(ec2, first)
    image = ec2.create_image(InstanceId=instance_id, Name="runnerpool-runner-x64-2026-11-26")["ImageId"]
    ssm.put_parameter(Name=image_parameter_name(STACK, Arch.X64), Value=image, Type="String", Overwrite=True)
    later = fleet.launch(request_for(config, "pool=43", count=2, key="after"))

    # Then the next launch boots the image, with no change to the launch template
    assert {i["ImageId"] for i in described(ec2, later).values()} == {image}


def test_a_launch_whose_image_parameter_is_missing_is_refused(
    aws: None, ec2: Any, config: StackConfig
) -> None:
    # Given a launch template naming an image parameter that does not exist
    ssm = aws_clients.client("ssm", region_name=REGION)
    base = create_fleet_setup(ec2, STACK)
    template = ec2.create_launch_template(
        LaunchTemplateName=f"{STACK}-missing", LaunchTemplateData={"ImageId": "resolve:ssm:/nowhere/x64"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    setup = dataclasses.replace(base, templates={Arch.X64: LaunchTemplate(template)})
    simulated = SimulatedEc2(ec2, ssm=ssm)

    # When runners are launched / Then EC2 refuses the call, and nothing is launched
    with pytest.raises(FleetRequestError):
        Fleet(setup, simulated).launch(request_for(config, count=1))  # type: ignore[arg-type]
    assert ec2_instance_count(ec2) == 0


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "UnfulfillableCapacity"])
def test_a_size_run_out_of_both_markets_launches_nothing_and_says_why_until_it_is_back(
    fleet: Fleet, simulated: SimulatedEc2, setup: FleetSetup, config: StackConfig, code: str
) -> None:
    # Given EC2 has no capacity of any 2-vCPU type (the large class) in either market
    simulated.exhaust(2, code=code)
    # When 2 large spot runners are launched, with the on-demand fallback
    outcome = fleet.launch_with_fallback(request_for(config, "pool=42/usage=spot", count=2), FALLBACK_ON)
    # Then nothing runs, and every subnet's pool of each market reports EC2's code
    assert outcome.launched == ()
    assert [(f.code, f.usage, f.subnet_id) for f in outcome.failures] == [
        (code, usage, subnet)
        for usage in (UsageClass.SPOT, UsageClass.ON_DEMAND)
        for subnet in setup.subnet_ids
    ]
    # And another size is launched as before
    assert len(fleet.launch(request_for(config, "pool=43/class=xlarge", count=1, key="p-2")).launched) == 1
    # When the capacity comes back / Then the class launches again
    simulated.replenish(2)
    assert len(fleet.launch(request_for(config, "pool=42/usage=spot", count=2, key="p-3")).launched) == 2


def test_a_size_run_out_of_spot_only_is_served_by_the_on_demand_fallback(
    fleet: Fleet, simulated: SimulatedEc2, config: StackConfig
) -> None:
    # Given no spot capacity of 2-vCPU types
    simulated.exhaust(2, markets=["spot"])
    # When 2 large spot runners are launched with the fallback / Then both run on-demand
    outcome = fleet.launch_with_fallback(request_for(config, "pool=42/usage=spot", count=2), FALLBACK_ON)
    assert [facts.usage_class for facts in outcome.launched] == [UsageClass.ON_DEMAND] * 2


def test_only_ec2s_capacity_codes_can_be_played(simulated: SimulatedEc2) -> None:
    with pytest.raises(ValueError, match="RequestLimitExceeded"):
        simulated.exhaust(2, code="RequestLimitExceeded")
