"""The spot circuit breaker: a resource class whose spot instances EC2 keeps taking back is served on-demand
for a while.

EC2 reclaims spot capacity pool by pool, and when it does it takes many instances of one size within
minutes: a job launched on spot into such a wave is interrupted again, and its re-run too. The background
rate is far lower: the Spot Instance Advisor's worst band of "frequency of interruption" is ">20%" of
instances a month (https://aws.amazon.com/ec2/spot/instance-advisor/), so even a hundred instances of one
class in that band lose about 100 * 0.2 / (30 * 24 * 6) ≈ 0.005 to interruptions in ten minutes. Three in
ten minutes is a wave, not bad luck: the breaker opens, and the class's spot demand is launched (and picked
up) on-demand for the cool-down.

Interruptions are counted per instance (EventBridge may deliver a warning twice: "Events are emitted on a
best effort basis", and a rule's target is invoked at least once, EventBridge User Guide, "Amazon
EventBridge event retry policy"), within a sliding window. The one writer that finds the window over the
threshold while the breaker is closed opens it, once, for the cool-down; after it the class is on spot
again, and one more interruption while the window still holds the threshold opens it again at once (the
half-open state of a circuit breaker: spot was tried, and failed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.domain.clock import Epoch
from runner_pool.domain.records import UsageClass

DEFAULT_INTERRUPTIONS = 3
DEFAULT_WINDOW_SECONDS = 600.0
DEFAULT_COOLDOWN_SECONDS = 1800.0


class SpotBreakerSettings(BaseModel):
    """When a class's spot demand goes on-demand (module docstring for the defaults' reasons)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interruptions: int = Field(DEFAULT_INTERRUPTIONS, ge=0)
    """Interruption warnings of a class's spot instances within `window_seconds` that open the breaker;
    0 turns it off."""
    window_seconds: float = Field(DEFAULT_WINDOW_SECONDS, gt=0)
    cooldown_seconds: float = Field(DEFAULT_COOLDOWN_SECONDS, gt=0)
    """How long the class's spot demand is served on-demand once the breaker opens. Three windows: well
    past the wave that opened it, yet short, as every minute of it pays on-demand's price for spot demand;
    a wave that goes on opens it again at its next interruption (module docstring), so a longer cool-down
    would buy little."""

    @property
    def enabled(self) -> bool:
        return self.interruptions > 0


@dataclass(frozen=True)
class Interruption:
    """One spot instance of the class EC2 warned of, when the warning was heard."""

    instance_id: str
    at: Epoch


def in_window(interruptions: Iterable[Interruption], now: Epoch, settings: SpotBreakerSettings) -> int:
    """How many distinct instances were interrupted within the window ending `now`."""
    since = now - settings.window_seconds
    return len({i.instance_id for i in interruptions if since <= i.at <= now})


def trips(interruptions: Iterable[Interruption], now: Epoch, settings: SpotBreakerSettings) -> bool:
    """Whether the window ending `now` holds enough interruptions to open the breaker."""
    return settings.enabled and in_window(interruptions, now, settings) >= settings.interruptions


def is_open(open_until: Epoch | None, now: Epoch) -> bool:
    return open_until is not None and now < open_until


def usage_for(asked: UsageClass, open_until: Epoch | None, now: Epoch) -> UsageClass:
    """The usage a provision serves a job with: on-demand while its class's breaker is open, else asked."""
    if asked is UsageClass.SPOT and is_open(open_until, now):
        return UsageClass.ON_DEMAND
    return asked


@dataclass(frozen=True)
class Noted:
    """What counting one interruption found: the window's count, and whether this call opened the breaker."""

    resource_class: str
    interruptions: int
    opened: bool
    open_until: Epoch | None
