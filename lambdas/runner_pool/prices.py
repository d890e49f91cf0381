"""List prices the operator CLI and the cost bench read: EC2 on-demand by instance type, and gp3 storage.

US East (N. Virginia), Linux, on-demand, as listed in November 2026: other regions, spot, savings plans
and reserved instances differ, so these are a yardstick for what idle capacity costs, not a bill.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

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
