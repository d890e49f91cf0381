"""List prices the operator CLI, the cost records and the cost bench read: EC2 by instance type and
usage class, gp3 storage, and the control plane's share of a job.

US East (N. Virginia), Linux, as listed in November 2026: other regions, spot's moving prices, savings
plans and reserved instances differ, so these are a yardstick for what capacity costs, not a bill.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from runner_pool.domain.cost import PriceList

PRICES_AS_OF = "2026-11, us-east-1"

_LARGE_HOURLY_USD = {
    "c7i": 0.08925,
    "m7i": 0.1008,
    "r7i": 0.1323,
    "c6i": 0.085,
    "m6i": 0.096,
    "c7g": 0.0725,
    "m7g": 0.0816,
}
"""The `large` size of each family: https://aws.amazon.com/ec2/pricing/on-demand/ (Linux, US East
(N. Virginia)). Within these families the on-demand price doubles with each size, as the vCPUs do."""

_SIZES = ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge")

EC2_ON_DEMAND_HOURLY_USD: Mapping[str, float] = MappingProxyType(
    {
        f"{family}.{size}": round(price * 2**step, 6)
        for family, price in _LARGE_HOURLY_USD.items()
        for step, size in enumerate(_SIZES)
    }
)

GP3_GB_MONTH_USD = 0.08
"""gp3 storage per GB-month, baseline 3,000 IOPS and 125 MB/s included (https://aws.amazon.com/ebs/pricing/).
A stopped instance pays for its volumes only: "We don't charge usage for a stopped instance ... you are
charged for Amazon EBS volume usage" (EC2 API Reference, StopInstances)."""

HOURS_PER_MONTH = 730
"""The month AWS's price pages convert monthly prices with."""


def on_demand_hourly(instance_type: str) -> float | None:
    """The on-demand hourly list price of `instance_type`, or None if this table does not know it."""
    return EC2_ON_DEMAND_HOURLY_USD.get(instance_type)


def gp3_hourly(gib: float) -> float:
    """What a gp3 volume of `gib` costs an hour."""
    return gib * GP3_GB_MONTH_USD / HOURS_PER_MONTH


SPOT_PRICE_RATIO = 0.041 / 0.096
"""Spot's price as a share of on-demand's, at the top of a published us-east-1 range for a large
current-generation x86 type, m6i.large: spot "$0.029-0.041/hr" against on-demand $0.096/hr
(cloudprice.app, "Spot instance economics: when interruption is fine", a 2026 snapshot). Spot prices move
with supply and demand ("Spot Instance pricing", https://aws.amazon.com/ec2/spot/pricing/), so this is a
yardstick, applied to every type's on-demand price."""

CONTROL_PLANE_PER_JOB_USD: Mapping[str, float] = MappingProxyType({"warm": 514.0e-6, "cold": 606.3e-6})
"""What the control plane spends on one job served warm (from the hot pool or the stopped tier) and cold
(a launch), Step Functions Standard: the emulator bench's measured use (bench/emulator.py: the
webhook's API Gateway request, every Lambda invocation and its GB-seconds at 512 MB, the state
transitions, DynamoDB and SQS requests, KMS and Secrets Manager reads) priced at the list prices it
cites (https://aws.amazon.com/lambda/pricing/, /step-functions/pricing/, /dynamodb/pricing/on-demand/,
/sqs/pricing/, /api-gateway/pricing/), as measured in November 2026. Refresh's runs, every minute
whatever the demand, are no job's."""


def ec2_hourly(instance_type: str, usage_class: str) -> float | None:
    """The hourly list price of `instance_type` as `usage_class` runs it (spot at SPOT_PRICE_RATIO of
    on-demand), or None if this table does not know the type."""
    on_demand = on_demand_hourly(instance_type)
    if on_demand is None or usage_class != "spot":
        return on_demand
    return on_demand * SPOT_PRICE_RATIO


def list_prices(control_plane_per_job_usd: Mapping[str, float] = CONTROL_PLANE_PER_JOB_USD) -> PriceList:
    """The prices domain/cost.py `price` applies: gp3 by the GiB-hour, and the control plane per job (the
    day trace passes the emulator bench's latest measure instead)."""
    return PriceList(gp3_hourly(1), control_plane_per_job_usd)
