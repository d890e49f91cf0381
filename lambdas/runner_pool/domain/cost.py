"""What the jobs cost: each hand-over's instance time, the pool's idle time and the control plane, priced.

One function prices them (`price`), for the `cost` command, refresh's daily budget and the day trace
(bench/day_trace.py) alike, so the benchmark measures the product's arithmetic rather than a copy of it.

A hand-over is priced from its claim (or its launch for the run) to its release: the instance-seconds a
job's runner held the instance, at the price in force when it ended, EC2 and the gp3 root volume, plus
the control plane's share of one job (warm or cold). The idle share is the rest of each instance's life:
from its launch to its end, less its hand-overs; EC2 and the volume while it ran idle, the volume alone
while it was stopped ("We don't charge usage for a stopped instance", EC2 API Reference, StopInstances).
It is counted when the instance ends, so an instance still alive adds its idle time later; and a
hand-over that ended without a release (quarantined, expired before its runner took a job) is idle time.
These are list prices (runner_pool/prices.py): a yardstick, not a bill.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.domain.clock import Epoch
from runner_pool.domain.records import HandOverTier, InstanceRecord, UsageClass

COST_RETENTION_DAYS = 35
"""How long a cost item is kept (its TTL): a month's report, and a few days' margin to ask for it."""
EC2_MINIMUM_SECONDS = 60.0
"""EC2 per-second billing: "Every time you start your instance, Amazon EC2 charges a one-minute minimum for
instance usage, and thereafter charges per second" (EC2 API Reference, StopInstances)."""


def ec2_billed_seconds(running_seconds: float) -> float:
    """What EC2 bills for one running period of `running_seconds`."""
    return max(EC2_MINIMUM_SECONDS, running_seconds)


def utc_day(at: Epoch) -> str:
    """The UTC day (`yyyy-mm-dd`) an epoch second falls in: the day a cost item is filed under."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")


def day_start(at: Epoch) -> Epoch:
    """The first second of `at`'s UTC day."""
    return float(int(at // 86_400) * 86_400)


@dataclass(frozen=True)
class PriceList:
    """The prices `price` applies besides each use's own EC2 price."""

    gp3_gib_hourly_usd: float
    control_plane_per_job_usd: Mapping[str, float]
    """Per job served `warm` (hot or stopped) and `cold` (launched for it)."""

    def control_plane(self, tier: HandOverTier) -> float:
        return self.control_plane_per_job_usd["cold" if tier is HandOverTier.COLD else "warm"]


@dataclass(frozen=True)
class InstanceUse:
    """Instance time priced as one: a hand-over's (its tier, one job) or an idle span's (no tier, no job)."""

    ec2_seconds: float
    """Billed EC2 seconds: running time."""
    ebs_seconds: float
    """Seconds the root volume existed: running or stopped."""
    ec2_hourly_usd: float | None
    """The type's hourly price as it ran (spot or on-demand); None when the price list does not know it."""
    volume_gib: float
    tier: HandOverTier | None = None
    jobs: int = 0


@dataclass(frozen=True)
class Charges:
    """Dollars at list prices, and what could not be priced."""

    ec2_usd: float = 0.0
    ebs_usd: float = 0.0
    control_plane_usd: float = 0.0
    jobs: int = 0
    unpriced_seconds: float = 0.0
    """EC2 seconds of types the price list does not know: shown, never taken for free."""

    @property
    def total_usd(self) -> float:
        return self.ec2_usd + self.ebs_usd + self.control_plane_usd

    def __add__(self, other: Charges) -> Charges:
        return Charges(
            self.ec2_usd + other.ec2_usd,
            self.ebs_usd + other.ebs_usd,
            self.control_plane_usd + other.control_plane_usd,
            self.jobs + other.jobs,
            self.unpriced_seconds + other.unpriced_seconds,
        )


def price(uses: Iterable[InstanceUse], prices: PriceList) -> Charges:
    """EC2 by the second at each use's hourly price, gp3 by the GiB-hour, and the control plane per job."""
    total = Charges()
    for use in uses:
        ec2 = 0.0 if use.ec2_hourly_usd is None else use.ec2_seconds / 3600 * use.ec2_hourly_usd
        total += Charges(
            ec2_usd=ec2,
            ebs_usd=use.ebs_seconds / 3600 * use.volume_gib * prices.gp3_gib_hourly_usd,
            control_plane_usd=0.0 if use.tier is None else use.jobs * prices.control_plane(use.tier),
            jobs=use.jobs,
            unpriced_seconds=use.ec2_seconds if use.ec2_hourly_usd is None else 0.0,
        )
    return total


class _Item(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: str
    resource_class: str
    instance_type: str
    usage_class: UsageClass
    ec2_hourly_usd: float | None = None
    """The price in force when the item was written (runner_pool/prices.py `ec2_hourly`)."""
    volume_gib: float = Field(gt=0)
    ended_at: Epoch

    @property
    def day(self) -> str:
        return utc_day(self.ended_at)


class HandOverCost(_Item):
    """One hand-over, recorded when its release ends it."""

    repository: str | None = None
    tier: HandOverTier
    started_at: Epoch
    stopped_before_seconds: float = Field(0.0, ge=0)
    """For a hand-over from the stopped tier: how long the instance was stopped before it (idle time,
    priced at its volume alone)."""

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended_at - self.started_at)

    def use(self) -> InstanceUse:
        return InstanceUse(
            self.seconds, self.seconds, self.ec2_hourly_usd, self.volume_gib, tier=self.tier, jobs=1
        )

    @classmethod
    def of(
        cls, released: InstanceRecord, volume_gib: float, hourly: Callable[[str, str], float | None]
    ) -> HandOverCost | None:
        """The hand-over `released` (the record its release made idle) ended; None for a record that does
        not say when its hand-over began (written before hand-overs were timed)."""
        if released.handed_over_at is None or released.handed_over_from is None:
            return None
        stopped = released.handed_over_from is HandOverTier.STOPPED and released.stopped_at is not None
        return cls(
            **_priced(released, volume_gib, hourly),
            ended_at=released.updated_at,
            repository=released.repository,
            tier=released.handed_over_from,
            started_at=released.handed_over_at,
            stopped_before_seconds=(
                max(0.0, released.handed_over_at - (released.stopped_at or 0.0)) if stopped else 0.0
            ),
        )


class InstanceLife(_Item):
    """One instance from its launch to its end, recorded when refresh marks it terminated."""

    launched_at: Epoch
    stopped_seconds: float = Field(0.0, ge=0)
    """Its last stretch in the stopped tier, if it ended there (earlier stretches are its hand-overs')."""

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended_at - self.launched_at)

    @classmethod
    def of(
        cls,
        record: InstanceRecord,
        ended_at: Epoch,
        volume_gib: float,
        hourly: Callable[[str, str], float | None],
    ) -> InstanceLife:
        """`record` as it was when it was due (stopped, or not), ended at `ended_at`."""
        stopped = record.stopped_at is not None and record.stopped_at >= (record.handed_over_at or 0.0)
        return cls(
            **_priced(record, volume_gib, hourly),
            ended_at=ended_at,
            launched_at=record.created_at,
            stopped_seconds=max(0.0, ended_at - (record.stopped_at or ended_at)) if stopped else 0.0,
        )


def _priced(
    record: InstanceRecord, volume_gib: float, hourly: Callable[[str, str], float | None]
) -> dict[str, Any]:
    """What every cost item says of its instance: which it is, and its prices in force."""
    return {
        "instance_id": record.instance_id,
        "resource_class": record.resource_class,
        "instance_type": record.instance_type,
        "usage_class": record.usage_class,
        "ec2_hourly_usd": hourly(record.instance_type, record.usage_class.value),
        "volume_gib": volume_gib,
    }


def idle_use(life: InstanceLife, hand_overs: Iterable[HandOverCost]) -> InstanceUse:
    """The idle share of an instance's life: what its hand-overs did not use; stopped time at EBS only."""
    handed = 0.0
    stopped = life.stopped_seconds
    for hand_over in hand_overs:
        if hand_over.instance_id == life.instance_id:
            handed += hand_over.seconds
            stopped += hand_over.stopped_before_seconds
    existed = max(0.0, life.seconds - handed)
    return InstanceUse(max(0.0, existed - stopped), existed, life.ec2_hourly_usd, life.volume_gib)


class Grouping(StrEnum):
    REPOSITORY = "repository"
    CLASS = "class"
    DAY = "day"


IDLE = "(idle pool)"
"""The group of the idle share, apart from every job's."""


@dataclass(frozen=True)
class CostReport:
    """Jobs' charges per group, the idle share apart, and the whole."""

    groups: dict[str, Charges]
    idle: Charges
    idle_by_group: dict[str, Charges]
    """The idle share per class or day (an idle instance served no repository): empty by repository."""

    @property
    def jobs(self) -> Charges:
        total = Charges()
        for charges in self.groups.values():
            total += charges
        return total

    @property
    def total(self) -> Charges:
        return self.jobs + self.idle


def report(
    hand_overs: list[HandOverCost], lives: list[InstanceLife], prices: PriceList, by: Grouping
) -> CostReport:
    """The hand-overs priced per group, and each ended instance's idle share (per class or day)."""

    def key(item: HandOverCost | InstanceLife) -> str:
        if by is Grouping.DAY:
            return item.day
        if by is Grouping.CLASS:
            return item.resource_class
        return (item.repository if isinstance(item, HandOverCost) else None) or IDLE

    uses: dict[str, list[InstanceUse]] = defaultdict(list)
    for hand_over in hand_overs:
        uses[key(hand_over)].append(hand_over.use())
    idle: dict[str, list[InstanceUse]] = defaultdict(list)
    for life in lives:
        idle[key(life)].append(idle_use(life, hand_overs))
    idle_by_group = {name: price(found, prices) for name, found in sorted(idle.items())}
    whole = Charges()
    for charges in idle_by_group.values():
        whole += charges
    return CostReport(
        groups={name: price(found, prices) for name, found in sorted(uses.items())},
        idle=whole,
        idle_by_group={} if by is Grouping.REPOSITORY else idle_by_group,
    )
