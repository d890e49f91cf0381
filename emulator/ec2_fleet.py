"""A simulated EC2 for moto: the real client for everything, and an instant CreateFleet moto cannot run.

moto's CreateFleet fails on `InstanceRequirements` (attribute-based selection), which is the only
way the control plane launches (runner_pool.adapters.fleet). `SimulatedEc2` wraps a real EC2 client
pointed at moto (in-process `mock_aws` or the moto server) and answers CreateFleet itself, the way
EC2 answers an instant fleet:

- the parameters are validated against botocore's own model of CreateFleet, so a malformed request
  fails with the ParamValidationError a real client raises before sending anything;
- each override's requirements are resolved to a real instance type from `CATALOG` (shapes from
  moto's DescribeInstanceTypes), of the architecture of the launch template's AMI;
- a launch template's AMI given as `resolve:ssm:<parameter>` (the stack's: infra/constructs/instances.py)
  is resolved at each launch from Parameter Store, as EC2 does ("The Systems Manager parameter will
  resolve to an AMI ID on launch": EC2 API Reference, FleetLaunchTemplateOverridesRequest ImageId);
- the instances are launched with moto's RunInstances, so everything after the launch (describe,
  tags, terminate) is moto's real EC2;
- capacity is finite when a test says so: what fits is launched and the rest is reported in
  `Errors`, as EC2 does for instant fleets, instead of failing the call (EC2 API Reference, CreateFleet,
  response element `Errors`: "Information about the instances that could not be launched by the fleet.
  Supported only for fleets of type instant."); a size of instance can run out of one market or both
  and come back (`exhaust`, `replenish`), reported with the code a scenario picks from EC2's own
  (`InsufficientInstanceCapacity`, or `UnfulfillableCapacity` for spot: EC2 API Reference, "Error
  codes for the Amazon EC2 API");
- the same ClientToken answers with the first call's response and launches nothing again.

The wrapper is thread-safe: Step Functions' Map runs the launching handlers on several threads.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import threading
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters

RESOLVE_SSM = "resolve:ssm:"
"""How a launch template names its AMI by an SSM parameter, resolved at launch."""

Market = Literal["spot", "on-demand"]
MARKETS: tuple[Market, ...] = ("spot", "on-demand")

_SIZES = ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge")
CATALOG: tuple[str, ...] = (
    *(f"{family}.{size}" for family in ("c7i", "m7i", "c6i", "m6i", "r7i", "c7g", "m7g") for size in _SIZES),
    *(f"{family}.{size}" for family in ("t3", "t4g") for size in _SIZES[:3]),
    *(f"g5.{size}" for size in _SIZES[1:]),
)
"""The instance types the simulated EC2 chooses from: compute, general and memory-optimised x86_64
families, burstable ones (which our requests exclude), a GPU family (which they fence out), and the
Graviton equivalents, each from large (2 vCPU) to 8xlarge (32 vCPU) like the resource classes."""

INSUFFICIENT_CAPACITY = "InsufficientInstanceCapacity"
UNFULFILLABLE_CAPACITY = "UnfulfillableCapacity"
CAPACITY_ERRORS = (INSUFFICIENT_CAPACITY, UNFULFILLABLE_CAPACITY)
"""The codes EC2 reports in a fleet's `Errors` for a pool without capacity ("Error codes for the Amazon EC2
API": InsufficientInstanceCapacity, "not enough capacity to fulfill your request"; UnfulfillableCapacity,
"not enough spare capacity to fulfill your request for Spot Instances")."""

_MANUFACTURERS = {"Intel": "intel", "AMD": "amd", "AWS": "amazon-web-services"}
"""DescribeInstanceTypes' CPU manufacturer, as InstanceRequirements' CpuManufacturers names it."""


@dataclass(frozen=True)
class InstanceType:
    """What attribute-based selection looks at, of one instance type."""

    name: str
    cpu: int
    memory_mib: int
    architectures: tuple[str, ...]
    manufacturer: str
    burstable: bool
    accelerators: int

    def satisfies(self, requirements: Mapping[str, Any], architecture: str) -> bool:
        """Whether EC2 could pick this type for these InstanceRequirements on an AMI of `architecture`."""
        vcpu = requirements.get("VCpuCount", {})
        memory = requirements.get("MemoryMiB", {})
        allowed = requirements.get("AllowedInstanceTypes") or ["*"]
        excluded = requirements.get("ExcludedInstanceTypes") or []
        manufacturers = requirements.get("CpuManufacturers") or list(_MANUFACTURERS.values())
        accelerators_max = requirements.get("AcceleratorCount", {}).get("Max")
        return (
            architecture in self.architectures
            and _within(self.cpu, vcpu.get("Min"), vcpu.get("Max"))
            and _within(self.memory_mib, memory.get("Min"), memory.get("Max"))
            and any(fnmatch.fnmatchcase(self.name, glob) for glob in allowed)
            and not any(fnmatch.fnmatchcase(self.name, glob) for glob in excluded)
            and self.manufacturer in manufacturers
            and not (self.burstable and requirements.get("BurstablePerformance") == "excluded")
            and (accelerators_max is None or self.accelerators <= accelerators_max)
        )


@dataclass(frozen=True)
class _Pool:
    """One override resolved: a launch template, a subnet and the instance type EC2 would pick."""

    template: Mapping[str, str]
    subnet_id: str | None
    instance_type: str | None
    image_id: str
    """The AMI the instances boot, as EC2 resolved the template's at this launch."""

    def overrides(self) -> dict[str, str]:
        overrides = {"SubnetId": self.subnet_id, "InstanceType": self.instance_type}
        return {key: value for key, value in overrides.items() if value is not None}

    def launched_from(self) -> dict[str, Any]:
        """The `LaunchTemplateAndOverrides` of an `Instances` or `Errors` entry."""
        return {"LaunchTemplateSpecification": dict(self.template), "Overrides": self.overrides()}


class SimulatedEc2:
    """A real EC2 client (for moto) whose CreateFleet is simulated; every other attribute is the client's.

    Capacity knobs: `capacity[market]` is how many more instances of that market EC2 has (None, the
    default, is unlimited); `subnet_capacity[subnet_id]` limits one subnet across both markets.
    `fail_next(n, code)` makes the next n CreateFleet calls fail as a whole with that error code: each
    is the answer to every attempt of the call, so a client built by `aws_clients` turns a code botocore
    retries (RequestLimitExceeded) into its ServiceBusyError, as it does when the simulator answers a
    Lambda's call from beneath its client (emulator/lambda_runtime.py).
    `exhaust(cpu, markets, code)` leaves no capacity of any type of that many vCPUs (a resource class's
    size) in those markets, each pool reported in `Errors` with `code`, until `replenish(cpu)`.
    `refuse_starts(n)` makes the next n StartInstances calls fail with InsufficientInstanceCapacity, as EC2
    answers a start when it has no capacity of the instance's type in its zone.
    `calls` counts CreateFleet calls (failed, replayed and launching ones) and StartInstances calls,
    `launched` the instances.
    `ssm` is the Parameter Store client that `resolve:ssm:` AMIs are read with.
    """

    def __init__(
        self,
        client: Any,
        capacity: Mapping[Market, int | None] | None = None,
        subnet_capacity: Mapping[str, int] | None = None,
        ssm: Any = None,
    ) -> None:
        self._client = client
        self._ssm = ssm
        self._lock = threading.RLock()
        self.capacity: dict[Market, int | None] = {market: None for market in MARKETS}
        self.capacity.update(capacity or {})
        self.subnet_capacity: dict[str, int] = dict(subnet_capacity or {})
        self.calls: Counter[str] = Counter()
        self.launched = 0
        self._failures: list[tuple[str, str]] = []
        self._start_refusals = 0
        self._exhausted: dict[tuple[int, Market], str] = {}
        self._by_token: dict[str, tuple[str, dict[str, Any]]] = {}
        self._catalog: tuple[InstanceType, ...] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    # --- knobs ---------------------------------------------------------------------------------

    def set_capacity(self, market: Market, remaining: int | None) -> None:
        with self._lock:
            self.capacity[market] = remaining

    def fail_next(self, count: int, code: str, message: str = "") -> None:
        """The next `count` CreateFleet calls fail as a whole with `code` (e.g. RequestLimitExceeded)."""
        with self._lock:
            self._failures.extend([(code, message or f"simulated {code}")] * count)

    def exhaust(
        self, cpu: int, markets: Sequence[Market] = MARKETS, code: str = INSUFFICIENT_CAPACITY
    ) -> None:
        """No capacity of any instance type with `cpu` vCPUs in `markets` until `replenish(cpu)`."""
        if code not in CAPACITY_ERRORS:
            raise ValueError(f"{code} is not an error EC2 reports for a pool without capacity")
        with self._lock:
            self._exhausted.update({(cpu, market): code for market in markets})

    def replenish(self, cpu: int) -> None:
        """Capacity of `cpu`-vCPU types is back in every market."""
        with self._lock:
            self._exhausted = {key: code for key, code in self._exhausted.items() if key[0] != cpu}

    def refuse_starts(self, count: int) -> None:
        with self._lock:
            self._start_refusals += count

    # --- StartInstances ------------------------------------------------------------------------

    def start_instances(self, **params: Any) -> Any:
        """moto's StartInstances, counted, or refused for want of capacity while `refuse_starts` says so."""
        with self._lock:
            self.calls["StartInstances"] += 1
            refused = self._start_refusals > 0
            self._start_refusals -= 1 if refused else 0
        if refused:
            raise _client_error(
                "InsufficientInstanceCapacity",
                "We currently do not have sufficient capacity in the Availability Zone you requested.",
                "StartInstances",
            )
        return self._client.start_instances(**params)

    # --- CreateFleet ---------------------------------------------------------------------------

    def create_fleet(self, **params: Any) -> dict[str, Any]:
        """CreateFleet as a caller of the client sees it: an error goes through the client's own
        after-call handlers first, as an answer given from beneath the client does."""
        try:
            return self.answer_create_fleet(**params)
        except ClientError as refused:
            status = refused.response["ResponseMetadata"]["HTTPStatusCode"]
            self._client.meta.events.emit(
                "after-call.ec2.CreateFleet",
                http_response=AWSResponse("https://ec2.test/", status, HTTPHeaders(), None),
                parsed=refused.response,
                model=self._client.meta.service_model.operation_model("CreateFleet"),
                context={},
            )
            raise

    def answer_create_fleet(self, **params: Any) -> dict[str, Any]:
        """CreateFleet of type instant, answered as EC2 answers it; see the module docstring."""
        operation = self._client.meta.service_model.operation_model("CreateFleet")
        validate_parameters(params, operation.input_shape)
        with self._lock:
            self.calls["CreateFleet"] += 1
            if self._failures:
                code, message = self._failures.pop(0)
                raise _client_error(code, message)
            if params.get("Type") != "instant":
                raise _client_error(
                    "InvalidParameterValue",
                    f"the simulated EC2 supports only instant fleets, not Type={params.get('Type')!r}",
                )
            token = params.get("ClientToken")
            fingerprint = json.dumps(params, sort_keys=True, default=str)
            if token is not None and token in self._by_token:
                first_fingerprint, response = self._by_token[token]
                if first_fingerprint != fingerprint:
                    raise _client_error(
                        "IdempotentParameterMismatch",
                        "The client token you have provided is associated with a resource that has "
                        "different parameters.",
                    )
                self.calls["CreateFleet replayed"] += 1
                return copy.deepcopy(response)
            response = self._launch(params)
            if token is not None:
                self._by_token[token] = (fingerprint, response)
            return copy.deepcopy(response)

    def _launch(self, params: Mapping[str, Any]) -> dict[str, Any]:
        target = params["TargetCapacitySpecification"]
        default_market: Market = target.get("DefaultTargetCapacityType", "on-demand")
        total = target["TotalTargetCapacity"]
        spot = target.get("SpotTargetCapacity", total if default_market == "spot" else 0)
        on_demand = target.get("OnDemandTargetCapacity", total - spot)
        wanted: dict[Market, int] = {"spot": spot, "on-demand": on_demand}
        if sum(wanted.values()) < total:
            wanted[default_market] += total - sum(wanted.values())
        pools, errors = self._pools(params["LaunchTemplateConfigs"])
        instances: list[dict[str, Any]] = []
        for market in MARKETS:
            if wanted[market] > 0 and pools:
                launched, short = self._fill(market, wanted[market], pools, params)
                instances.extend(launched)
                errors.extend(short)
        return {
            "FleetId": f"fleet-{uuid.uuid4()}",
            "Errors": errors,
            "Instances": instances,
        }

    def _pools(self, configs: Sequence[Mapping[str, Any]]) -> tuple[list[_Pool], list[dict[str, Any]]]:
        """Every override resolved to its instance type; overrides no type satisfies become errors."""
        pools: list[_Pool] = []
        errors: list[dict[str, Any]] = []
        for config in configs:
            template = self._template(config["LaunchTemplateSpecification"])
            image_id, architecture = self._image(template)
            for override in config.get("Overrides") or [{}]:
                instance_type = override.get("InstanceType") or self._choose(
                    override.get("InstanceRequirements"), architecture
                )
                pool = _Pool(template, override.get("SubnetId"), instance_type, image_id)
                if instance_type is None:
                    errors.append(
                        {
                            **_entry(pool),
                            "ErrorCode": "InvalidFleetConfiguration",
                            "ErrorMessage": "No instance type satisfies the specified instance requirements.",
                        }
                    )
                else:
                    pools.append(pool)
        return pools, errors

    def _fill(
        self, market: Market, wanted: int, pools: Sequence[_Pool], params: Mapping[str, Any]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Launch `wanted` instances of `market` across the pools in order, as far as capacity goes."""
        instances: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for pool in pools:
            if wanted == 0:
                break
            exhausted = self._exhausted_by(market, pool)
            if exhausted is not None:
                errors.append({**_entry(pool), "Lifecycle": market, **_no_capacity(exhausted, market, pool)})
                continue
            count = min(wanted, self._room(market, pool.subnet_id))
            if count > 0:
                instance_ids = self._run(market, pool, count, params)
                instances.append(
                    {
                        **_entry(pool),
                        "Lifecycle": market,
                        "InstanceIds": instance_ids,
                        "InstanceType": pool.instance_type,
                    }
                )
                wanted -= count
            if wanted > 0:
                errors.append(
                    {**_entry(pool), "Lifecycle": market, **_no_capacity(INSUFFICIENT_CAPACITY, market, pool)}
                )
        return instances, errors

    def _exhausted_by(self, market: Market, pool: _Pool) -> str | None:
        """The error code `exhaust` set for the pool's size in `market`, if it did."""
        if not self._exhausted:
            return None
        shape = next((t for t in self.catalog() if t.name == pool.instance_type), None)
        return None if shape is None else self._exhausted.get((shape.cpu, market))

    def _room(self, market: Market, subnet_id: str | None) -> int:
        limits = [self.capacity[market], self.subnet_capacity.get(subnet_id or "")]
        known = [limit for limit in limits if limit is not None]
        return min(known) if known else 1_000_000

    def _run(self, market: Market, pool: _Pool, count: int, params: Mapping[str, Any]) -> list[str]:
        request: dict[str, Any] = {
            "LaunchTemplate": dict(pool.template),
            "ImageId": pool.image_id,
            "InstanceType": pool.instance_type,
            "MinCount": count,
            "MaxCount": count,
            "TagSpecifications": [
                spec
                for spec in params.get("TagSpecifications", [])
                if spec["ResourceType"] in ("instance", "volume")
            ],
        }
        if pool.subnet_id is not None:
            request["SubnetId"] = pool.subnet_id
        if market == "spot":
            request["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        response = self._client.run_instances(**request)
        if self.capacity[market] is not None:
            self.capacity[market] = max(0, (self.capacity[market] or 0) - count)
        if pool.subnet_id in self.subnet_capacity:
            self.subnet_capacity[pool.subnet_id] -= count
        self.launched += count
        return [instance["InstanceId"] for instance in response["Instances"]]

    # --- what EC2 knows: templates, AMIs, instance types ---------------------------------------

    def _template(self, specification: Mapping[str, str]) -> dict[str, str]:
        """The launch template as named by id or name, with its version (EC2's default: $Default)."""
        version = specification.get("Version", "$Default")
        if "LaunchTemplateId" in specification:
            return {"LaunchTemplateId": specification["LaunchTemplateId"], "Version": version}
        return {"LaunchTemplateName": specification["LaunchTemplateName"], "Version": version}

    def _image(self, template: Mapping[str, str]) -> tuple[str, str]:
        """The template's AMI as EC2 resolves it at launch, and its architecture: the only one its
        instances can boot."""
        selector = {key: value for key, value in template.items() if key != "Version"}
        try:
            versions = self._client.describe_launch_template_versions(
                **selector, Versions=[template["Version"]]
            )["LaunchTemplateVersions"]
        except ClientError as exc:
            raise _client_error(
                str(exc.response.get("Error", {}).get("Code", "InvalidLaunchTemplateId.NotFound")),
                str(exc.response.get("Error", {}).get("Message", "")),
            ) from exc
        image_id = versions[0]["LaunchTemplateData"].get("ImageId")
        if image_id is None:
            raise _client_error("InvalidLaunchTemplate", f"launch template {selector} has no ImageId")
        if image_id.startswith(RESOLVE_SSM):
            image_id = self._parameter(image_id.removeprefix(RESOLVE_SSM))
        (image,) = self._client.describe_images(ImageIds=[image_id])["Images"]
        return str(image["ImageId"]), str(image["Architecture"])

    def _parameter(self, name: str) -> str:
        if self._ssm is None:
            raise _client_error(
                "InvalidLaunchTemplate", f"the simulated EC2 has no Parameter Store to resolve {name} with"
            )
        try:
            return str(self._ssm.get_parameter(Name=name)["Parameter"]["Value"])
        except ClientError as exc:
            # EC2 refuses a launch whose AMI parameter it cannot read.
            raise _client_error("InvalidParameterValue", f"cannot resolve resolve:ssm:{name}: {exc}") from exc

    def _choose(self, requirements: Mapping[str, Any] | None, architecture: str) -> str | None:
        """The type attribute-based selection settles on: the smallest (cheapest) that qualifies."""
        if requirements is None:
            return None
        fitting = [t for t in self.catalog() if t.satisfies(requirements, architecture)]
        cheapest = min(fitting, key=lambda t: (t.cpu, t.memory_mib, t.name), default=None)
        return None if cheapest is None else cheapest.name

    def catalog(self) -> tuple[InstanceType, ...]:
        """`CATALOG` with each type's shape, described by moto once."""
        with self._lock:
            if self._catalog is None:
                described = self._client.describe_instance_types(InstanceTypes=list(CATALOG))
                self._catalog = tuple(_instance_type(info) for info in described["InstanceTypes"])
            return self._catalog


def _within(value: int, low: int | None, high: int | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _entry(pool: _Pool) -> dict[str, Any]:
    return {"LaunchTemplateAndOverrides": pool.launched_from()}


def _no_capacity(code: str, market: Market, pool: _Pool) -> dict[str, str]:
    if code == UNFULFILLABLE_CAPACITY:
        message = (
            "Unable to fulfill capacity due to your request configuration. "
            "Please adjust your request and try again."
        )
    elif market == "spot":
        message = "There is no Spot capacity available that matches your request."
    else:
        message = (
            f"We currently do not have sufficient {pool.instance_type} capacity in the Availability "
            f"Zone of {pool.subnet_id}. Our system will be working on provisioning additional capacity."
        )
    return {"ErrorCode": code, "ErrorMessage": message}


def _instance_type(info: Mapping[str, Any]) -> InstanceType:
    processor = info.get("ProcessorInfo", {})
    accelerators = sum(gpu.get("Count", 0) for gpu in info.get("GpuInfo", {}).get("Gpus", []))
    accelerators += sum(
        accelerator.get("Count", 0)
        for accelerator in info.get("InferenceAcceleratorInfo", {}).get("Accelerators", [])
    )
    accelerators += sum(fpga.get("Count", 0) for fpga in info.get("FpgaInfo", {}).get("Fpgas", []))
    return InstanceType(
        name=info["InstanceType"],
        cpu=info["VCpuInfo"]["DefaultVCpus"],
        memory_mib=info["MemoryInfo"]["SizeInMiB"],
        architectures=tuple(processor.get("SupportedArchitectures", ())),
        manufacturer=_MANUFACTURERS.get(processor.get("Manufacturer", ""), "intel"),
        burstable=bool(info.get("BurstablePerformanceSupported", False)),
        accelerators=accelerators,
    )


def _client_error(code: str, message: str, operation: str = "CreateFleet") -> ClientError:
    status = 503 if code == "RequestLimitExceeded" else 400
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)
