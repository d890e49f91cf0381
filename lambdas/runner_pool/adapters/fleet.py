"""The EC2 fleet: creation through one CreateFleet of type instant, and the EC2 calls refresh and dump need.

Creation (DESIGN.md 6.3) sends one CreateFleet per attempt: one launch template config (the
template of the requested architecture) with one override per configured subnet, each carrying
the same attribute-based instance requirements. An instant fleet answers synchronously with the
instances it launched and an `Errors` entry per pool it could not fill; both become a
LaunchOutcome whose facts carry each instance's real vCPU and memory (from DescribeInstanceTypes).

The architecture is pinned twice. InstanceRequirements has no architecture attribute, so the
template (whose AMI boots only one architecture) is chosen per Arch, and `CpuManufacturers`
restricts EC2's choice to types of that architecture (Graviton is arm64, Intel and AMD are
x86_64), so EC2 is never left to pair an arm64 AMI with an x86_64 type.

botocore retries every call on throttling with the same parameters (aws_clients); CreateFleet's
ClientToken makes a retried or replayed call (a retried Lambda, a redriven step) return the first
call's result instead of launching again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from botocore.exceptions import ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, attempt, error_code
from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import FleetSettings
from runner_pool.domain.fleet import (
    LAUNCH_TAG,
    Ec2State,
    FleetRequestError,
    LaunchFailure,
    LaunchOutcome,
    LaunchRequest,
    Start,
    Termination,
    fallback_for,
)
from runner_pool.domain.records import Arch, InstanceFacts, UsageClass

if TYPE_CHECKING:
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_ec2.literals import (
        CpuManufacturerType,
        DefaultTargetCapacityTypeType,
        FleetOnDemandAllocationStrategyType,
        InstanceTypeType,
        SpotAllocationStrategyType,
    )
    from mypy_boto3_ec2.type_defs import (
        CreateFleetErrorTypeDef,
        CreateFleetRequestTypeDef,
        FilterTypeDef,
        InstanceRequirementsRequestTypeDef,
        InstanceTypeDef,
        TagTypeDef,
    )

_Item = TypeVar("_Item")

RUN_KEY_TAG = "runner-pool:run-key"
RESOURCE_CLASS_TAG = "runner-pool:resource-class"
TAG_VALUE_LIMIT = 256
"""EC2's longest tag value. A run key with many type globs can be longer; the tag is for people and
cost reports, the record holds the exact key."""

TERMINATE_BATCH = 100
"""TerminateInstances takes up to 1000 ids; AWS recommends smaller batches, and one unknown id
fails the whole call, so a smaller batch also limits what has to be sorted out after one."""
FILTER_BATCH = 100
"""Instance ids per `instance-id` filter of DescribeInstances (EC2 caps the values of a filter)."""
INSTANCE_TYPES_BATCH = 100
"""DescribeInstanceTypes takes at most 100 types per call."""
PAGE_SIZE = 1000

UNKNOWN_INSTANCE_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
UNAUTHORIZED = "UnauthorizedOperation"
NO_CAPACITY = "InsufficientInstanceCapacity"
START_REFUSALS = frozenset({"IncorrectInstanceState", *UNKNOWN_INSTANCE_CODES})
STOP_REFUSALS = frozenset({"IncorrectInstanceState", "UnsupportedOperation", *UNKNOWN_INSTANCE_CODES})
"""A stop EC2 refuses: gone, not running, or a spot instance of a one-time request (UnsupportedOperation:
"You can only stop Spot Instances associated with persistent Spot Instance requests")."""
LIVE_EC2_STATES = ("pending", "running", "stopping", "stopped")
"""States of an instance that still has to be terminated; shutting-down ones already are being."""

_CPU_MANUFACTURERS: dict[Arch, list[CpuManufacturerType]] = {
    Arch.X64: ["intel", "amd"],
    Arch.ARM64: ["amazon-web-services"],
}
_CAPACITY_TYPE: dict[UsageClass, DefaultTargetCapacityTypeType] = {
    UsageClass.SPOT: "spot",
    UsageClass.ON_DEMAND: "on-demand",
}
SPOT_ALLOCATION: SpotAllocationStrategyType = "price-capacity-optimized"
"""AWS's recommended spot strategy: the pools least likely to be interrupted, cheapest among those."""
ON_DEMAND_ALLOCATION: FleetOnDemandAllocationStrategyType = "lowest-price"
"""Cheapest type first; `prioritized`, the other choice, orders overrides by priority, and ours differ
only by subnet, so there is nothing to prioritise."""


class NoLaunchTemplateError(LookupError):
    """A spec asks for an architecture the stack has no launch template (no AMI) for."""

    def __init__(self, arch: Arch, known: Iterable[Arch]) -> None:
        deployed = ", ".join(sorted(a.value for a in known)) or "none"
        super().__init__(f"no launch template for arch={arch.value}; the stack has templates for: {deployed}")
        self.arch = arch


@dataclass(frozen=True)
class LaunchTemplate:
    template_id: str
    version: str = "$Default"


@dataclass(frozen=True)
class FleetSetup:
    """Where instances are launched and how they are marked: what the stack hands a launching Lambda."""

    subnet_ids: tuple[str, ...]
    """One subnet per availability zone; each becomes one override of every CreateFleet."""
    templates: Mapping[Arch, LaunchTemplate]
    stack_tag_key: str
    stack_tag_value: str
    session_templates: Mapping[Arch, LaunchTemplate] = field(default_factory=dict)
    """The templates of the classes an operator may open Session Manager sessions on."""
    session_classes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.subnet_ids:
            raise ValueError("a fleet needs at least one subnet to launch into")
        if len(set(self.subnet_ids)) != len(self.subnet_ids):
            raise ValueError(f"subnets are listed twice: {self.subnet_ids}")

    def template_for(self, arch: Arch, resource_class: str) -> LaunchTemplate:
        """A class with Session Manager launches from its own templates, whose profile the SSM agent can use;
        with none deployed it is not launched from the others, whose instances no session could reach."""
        templates = self.session_templates if resource_class in self.session_classes else self.templates
        template = templates.get(arch)
        if template is None:
            raise NoLaunchTemplateError(arch, templates)
        return template


@dataclass(frozen=True)
class InstanceShape:
    cpu: int
    memory_mib: int
    arch: Arch


@dataclass
class InstanceTypeCatalog:
    """vCPU, memory and architecture of instance types, from DescribeInstanceTypes.

    Looked up in batches and kept for the life of the object; a Lambda builds one at cold start,
    so each type is described once per process. Types never change shape.
    """

    client: EC2Client
    _shapes: dict[str, InstanceShape] = field(default_factory=dict, init=False)

    def shapes(self, instance_types: Iterable[str]) -> dict[str, InstanceShape]:
        wanted = set(instance_types)
        missing = sorted(wanted - self._shapes.keys())
        for chunk in _chunks(missing, INSTANCE_TYPES_BATCH):
            for page in _pages(functools.partial(self._describe, chunk)):
                for info in page.get("InstanceTypes", []):
                    archs = info.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
                    self._shapes[info["InstanceType"]] = InstanceShape(
                        cpu=info["VCpuInfo"]["DefaultVCpus"],
                        memory_mib=info["MemoryInfo"]["SizeInMiB"],
                        arch=Arch.ARM64 if "arm64" in archs else Arch.X64,
                    )
        return {instance_type: self._shapes[instance_type] for instance_type in wanted}

    def _describe(self, chunk: list[str], token: str | None) -> Any:
        names = cast("list[InstanceTypeType]", chunk)
        if token is None:
            return self.client.describe_instance_types(InstanceTypes=names)
        return self.client.describe_instance_types(InstanceTypes=names, NextToken=token)


class Fleet:
    def __init__(
        self,
        setup: FleetSetup,
        client: EC2Client | None = None,
        catalog: InstanceTypeCatalog | None = None,
    ) -> None:
        self._setup = setup
        self._client: EC2Client = client or aws_clients.client("ec2")
        self._catalog = catalog or InstanceTypeCatalog(self._client)

    # --- creation ------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        """One CreateFleet of type instant; what launched and what EC2 refused, per pool.

        Raises FleetRequestError when EC2 refuses the call as a whole (nothing launched), and
        ServiceBusyError when throttling outlasts every retry.
        """
        params = self.fleet_request(request)
        try:
            response = self._client.create_fleet(**params)
        except ClientError as exc:
            raise FleetRequestError(
                error_code(exc), str(exc.response.get("Error", {}).get("Message", ""))
            ) from exc
        launched = [
            (instance_id, item["InstanceType"], _usage(item.get("Lifecycle"), request.usage))
            for item in response.get("Instances", [])
            for instance_id in item.get("InstanceIds", [])
        ]
        shapes = self._catalog.shapes(instance_type for _, instance_type, _ in launched)
        return LaunchOutcome(
            requested=request.count,
            launched=tuple(
                InstanceFacts(
                    instance_id=instance_id,
                    resource_class=request.resource_class,
                    instance_type=instance_type,
                    usage_class=usage,
                    arch=shapes[instance_type].arch,
                    cpu=shapes[instance_type].cpu,
                    memory_mib=shapes[instance_type].memory_mib,
                )
                for instance_id, instance_type, usage in launched
            ),
            failures=tuple(_failure(error) for error in response.get("Errors", [])),
        )

    def launch_with_fallback(self, request: LaunchRequest, settings: FleetSettings) -> LaunchOutcome:
        """`launch`, then the remainder once more as DESIGN.md 6.3 and the config allow.

        The outcome holds everything launched by both calls and every refusal of both. A caller
        retried between the two calls replays the first (same token, same answer) and then makes
        the second, so nothing is launched twice.
        """
        first = self.launch(request)
        retry = fallback_for(request, first, settings)
        return first if retry is None else first.then(self.launch(retry))

    def fleet_request(self, request: LaunchRequest) -> CreateFleetRequestTypeDef:
        """The CreateFleet parameters for a request; a pure function of the request and the setup."""
        template = self._setup.template_for(request.arch, request.resource_class)
        requirements = _requirements(request)
        tags = self._tags(request)
        params: CreateFleetRequestTypeDef = {
            "Type": "instant",
            "ClientToken": request.client_token,
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": request.count,
                "DefaultTargetCapacityType": _CAPACITY_TYPE[request.usage],
            },
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {
                        "LaunchTemplateId": template.template_id,
                        "Version": template.version,
                    },
                    "Overrides": [
                        {"SubnetId": subnet_id, "InstanceRequirements": requirements}
                        for subnet_id in self._setup.subnet_ids
                    ],
                }
            ],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        }
        if request.usage is UsageClass.SPOT:
            params["SpotOptions"] = {"AllocationStrategy": SPOT_ALLOCATION}
        else:
            params["OnDemandOptions"] = {"AllocationStrategy": ON_DEMAND_ALLOCATION}
        return params

    def _tags(self, request: LaunchRequest) -> list[TagTypeDef]:
        tags: list[TagTypeDef] = [
            {"Key": self._setup.stack_tag_key, "Value": self._setup.stack_tag_value},
            {"Key": RESOURCE_CLASS_TAG, "Value": request.resource_class},
        ]
        if request.run_key is not None:
            tags.append({"Key": RUN_KEY_TAG, "Value": request.run_key[:TAG_VALUE_LIMIT]})
        tags.append({"Key": LAUNCH_TAG, "Value": request.idempotency_key[:TAG_VALUE_LIMIT]})
        return tags

    # --- refresh and dump ----------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str]) -> dict[str, Termination]:
        """TerminateInstances in batches; every id is reported, unknown ones as UNKNOWN (gone)."""
        results: dict[str, Termination] = {}
        for chunk in _chunks(list(dict.fromkeys(instance_ids)), TERMINATE_BATCH):
            results.update(self._terminate_batch(chunk))
        return results

    def stop(self, instance_id: str) -> bool:
        """StopInstances on one instance of the stopped tier; whether EC2 took it. EC2 shuts the OS down
        and stops the instance (stopping, then stopped), forcing it after a while if the OS does not
        finish (EC2 API Reference, StopInstances); a stop of a stopping or stopped instance is accepted
        again. One instance a call: an unknown id fails a whole batch, and the tier is a few a class."""
        stopped = attempt(lambda: self._client.stop_instances(InstanceIds=[instance_id]), STOP_REFUSALS)
        return not isinstance(stopped, Refusal)

    def start(self, instance_id: str) -> Start:
        """StartInstances on one stopped instance claimed for a run (EC2 API Reference, StartInstances:
        stopped → pending → running; a start of a pending or running instance is accepted again)."""
        started = attempt(
            lambda: self._client.start_instances(InstanceIds=[instance_id]), (NO_CAPACITY, *START_REFUSALS)
        )
        if isinstance(started, Refusal):
            return Start.NO_CAPACITY if started.code == NO_CAPACITY else Start.REFUSED
        return Start.STARTING

    def states(self, instance_ids: Sequence[str]) -> dict[str, Ec2State]:
        """EC2's state of each id; UNKNOWN for ids EC2 does not know (or no longer shows).

        Right after a launch EC2 may not show an instance yet, so a young record is not proof of a
        lost instance on UNKNOWN alone.
        """
        unique = list(dict.fromkeys(instance_ids))
        found: dict[str, Ec2State] = {}
        for chunk in _chunks(unique, FILTER_BATCH):
            for instance in self._describe([{"Name": "instance-id", "Values": chunk}]):
                found[instance["InstanceId"]] = Ec2State(instance["State"]["Name"])
        return {instance_id: found.get(instance_id, Ec2State.UNKNOWN) for instance_id in unique}

    def tagged_instances(
        self, tag_key: str, tag_value: str, launched_before: Epoch | None = None
    ) -> list[str]:
        """Ids of instances carrying the tag that still need terminating, for refresh's orphan sweep.

        `launched_before` leaves out instances launched since: creation records an instance right
        after CreateFleet returns, so a sweep must not judge an instance younger than that gap.
        """
        filters: list[FilterTypeDef] = [
            {"Name": f"tag:{tag_key}", "Values": [tag_value]},
            {"Name": "instance-state-name", "Values": list(LIVE_EC2_STATES)},
        ]
        return [
            instance["InstanceId"]
            for instance in self._describe(filters)
            if launched_before is None or instance["LaunchTime"].timestamp() < launched_before
        ]

    def _terminate_batch(self, instance_ids: list[str]) -> dict[str, Termination]:
        response = attempt(
            lambda: self._client.terminate_instances(InstanceIds=instance_ids),
            (*UNKNOWN_INSTANCE_CODES, UNAUTHORIZED),
        )
        if isinstance(response, Refusal):
            if response.code == UNAUTHORIZED:
                return self._sort_out_denied(instance_ids, response)
            return self._sort_out_unknown(instance_ids)
        return {
            item["InstanceId"]: _termination(item["CurrentState"]["Name"])
            for item in response.get("TerminatingInstances", [])
        }

    def _sort_out_denied(self, instance_ids: list[str], denial: Refusal) -> dict[str, Termination]:
        """Our TerminateInstances is allowed only on instances carrying the stack's tag, and an instance
        EC2 no longer has carries none: IAM then denies the whole batch (UnauthorizedOperation) where
        EC2 would have said NotFound (runs-on/terraform-aws-runs-on#60). The ids EC2 does not show are
        gone; the rest are terminated on their own. A denial with every id still there is a real one."""
        gone = {i for i, state in self.states(instance_ids).items() if state is Ec2State.UNKNOWN}
        if not gone:
            raise denial.error
        results = dict.fromkeys(gone, Termination.UNKNOWN)
        known = [i for i in instance_ids if i not in gone]
        if known:
            results.update(self._terminate_batch(known))
        return results

    def _sort_out_unknown(self, instance_ids: list[str]) -> dict[str, Termination]:
        """One unknown id failed the whole batch and terminated none: terminate the ids EC2 knows.

        EC2 names the unknown ids only in its message, so the batch is described instead (a filter,
        unlike InstanceIds, does not fail on unknown ids). Should EC2 still disagree with itself
        (eventual consistency), the ids are tried one by one, where an unknown one fails alone.
        """
        if len(instance_ids) == 1:
            return {instance_ids[0]: Termination.UNKNOWN}
        known = {
            instance_id
            for instance_id, state in self.states(instance_ids).items()
            if state is not Ec2State.UNKNOWN
        }
        if len(known) == len(instance_ids):
            return {
                instance_id: result
                for one in instance_ids
                for instance_id, result in self._terminate_batch([one]).items()
            }
        results = {
            instance_id: Termination.UNKNOWN for instance_id in instance_ids if instance_id not in known
        }
        if known:
            results.update(self._terminate_batch([i for i in instance_ids if i in known]))
        return results

    def _describe(self, filters: list[FilterTypeDef]) -> Iterator[InstanceTypeDef]:
        def page(token: str | None) -> Any:
            if token is None:
                return self._client.describe_instances(Filters=filters, MaxResults=PAGE_SIZE)
            return self._client.describe_instances(Filters=filters, MaxResults=PAGE_SIZE, NextToken=token)

        for response in _pages(page):
            for reservation in response.get("Reservations", []):
                yield from reservation.get("Instances", [])


def _requirements(request: LaunchRequest) -> InstanceRequirementsRequestTypeDef:
    requirements: InstanceRequirementsRequestTypeDef = {
        "VCpuCount": {"Min": request.cpu, "Max": request.cpu},
        "MemoryMiB": {"Min": request.memory_mib},
        "CpuManufacturers": _CPU_MANUFACTURERS[request.arch],
        "BurstablePerformance": "excluded",
    }
    if request.memory_max_mib is not None:
        requirements["MemoryMiB"]["Max"] = request.memory_max_mib
    if request.excludes_accelerators:
        requirements["AcceleratorCount"] = {"Max": 0}
    if request.types:
        requirements["AllowedInstanceTypes"] = list(request.types)
    return requirements


def _usage(lifecycle: str | None, requested: UsageClass) -> UsageClass:
    """EC2's `Lifecycle` of a launched instance; absent, the instance is of the usage asked for."""
    if lifecycle is None:
        return requested
    return UsageClass.SPOT if lifecycle == "spot" else UsageClass.ON_DEMAND


def _failure(error: CreateFleetErrorTypeDef) -> LaunchFailure:
    overrides = error.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
    lifecycle = error.get("Lifecycle")
    return LaunchFailure(
        code=error.get("ErrorCode", "Unknown"),
        message=error.get("ErrorMessage", ""),
        usage=None if lifecycle is None else _usage(lifecycle, UsageClass.ON_DEMAND),
        subnet_id=overrides.get("SubnetId"),
        instance_type=overrides.get("InstanceType"),
    )


def _termination(state: str) -> Termination:
    return Termination.TERMINATED if state == "terminated" else Termination.TERMINATING


def _chunks(items: Sequence[_Item], size: int) -> Iterator[list[_Item]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _pages(page: Callable[[str | None], Any]) -> Iterator[Any]:
    """Every page of a paginated call; `page(token)` fetches one."""
    token: str | None = None
    while True:
        response = page(token)
        yield response
        token = response.get("NextToken")
        if not token:
            return
