"""The stopped tier: which idle instances refresh stops, how long they stay stopped, and
which stopped instance a request may start.

An idle on-demand instance whose idle time is about to run out is stopped instead of terminated, up to
`pool.stopped_maximum` per class; a request that finds no hot instance starts a stopped one before it
launches. EC2 bills a stopped instance for its EBS volumes only (EC2 API Reference, StopInstances: "We
don't charge usage for a stopped instance ... you are charged for Amazon EBS volume usage"), and a start
skips the launch, the OS's first boot and the install.

Why before the idle time runs out, not after: once a threshold has passed no transition applies (the
whole lifecycle relies on it: refresh terminates a due instance before it marks it, and the agent
terminates its own instance past its threshold plus a grace). So refresh stops an instance whose idle
time ends before its next run, at most one refresh period early.

A class's stopped minimum (`warm_pool_minimum.<class>.stopped`, in force by the same schedule as `hot`)
is kept by launching on-demand pool instances marked for the tier (`InstanceRecord.for_stopped_tier`),
which refresh stops as soon as it admits them, instead of offering them hot.

Spot instances are never stopped: an instant fleet's spot instances come from one-time requests, and EC2
stops a Spot Instance only of a persistent request (for a fleet, of type `maintain`: EC2 User Guide,
"Behavior of Spot Instance interruptions"); it refuses the rest with UnsupportedOperation ("You can't stop
the Spot Instance ... because it is associated with a one-time Spot Instance request").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import Taker, Verdict, judge
from runner_pool.domain.records import InstanceRecord, PoolMessage, Signal, UsageClass, WorkerSignal

STOPPABLE_AFTER = frozenset({Signal.UD_OK, Signal.UD_REMOVE_REG_OK})
"""The agent's last word before a stop: booted and never served, or its verified scrub done. Anything
else (a runner registered, a scrub that failed) and the instance is terminated as due instead."""


def in_tier(record: InstanceRecord, now: Epoch) -> bool:
    """Stopping or stopped, and not yet due: it counts against `pool.stopped_maximum`."""
    return record.state in (InstanceState.STOPPING, InstanceState.STOPPED) and not record.threshold_passed(
        now
    )


def launched_for_tier(record: InstanceRecord, now: Epoch) -> bool:
    """Launched for the stopped minimum and not stopped yet: booting (created), or admitted and waiting for
    its stop (idle, never served: it was offered to no job). It counts toward the tier, not the hot pool."""
    return (
        record.for_stopped_tier
        and record.jobs_served == 0
        and record.run_key is None
        and record.state in (InstanceState.CREATED, InstanceState.IDLE)
        and not record.threshold_passed(now)
    )


def awaiting_stop(record: InstanceRecord, now: Epoch) -> bool:
    """Launched for the stopped minimum, admitted, and not yet stopping: refresh stops it at once."""
    return launched_for_tier(record, now) and record.state is InstanceState.IDLE


def stopped_shortfall(
    records: Iterable[InstanceRecord],
    config: StackConfig,
    now: Epoch,
    minimum: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Per class, the instances to launch for the stopped minimum in force now (or `minimum`'s, adaptive
    sizing's number): the minimum less the tier (stopping and stopped, not due) and those launched for it
    and not stopped yet, or the pristine floor less the tier's pristine members, whichever is short of
    more (what is launched for the tier is pristine, so it counts toward both). A minimum that drops stops
    and terminates nothing: the tier's members run out their time as before."""
    records = list(records)
    have = _tier_by_class(records, now)
    pristine = _tier_by_class(records, now, pristine_only=True)
    short = {
        name: max(
            (config.stopped_minimum(name, now) if minimum is None else minimum[name]) - have[name],
            config.pristine_stopped_minimum(name, now) - pristine[name],
        )
        for name in config.resource_classes
    }
    return {name: count for name, count in short.items() if count > 0}


def _tier_by_class(
    records: Iterable[InstanceRecord], now: Epoch, *, pristine_only: bool = False
) -> Counter[str]:
    """Per class, the tier's members: stopping and stopped (not due), and those launched for it and not
    stopped yet. What the stopped minimum is short of, and what takes room under the maximum."""
    return Counter(
        record.resource_class
        for record in records
        if (in_tier(record, now) or launched_for_tier(record, now)) and (record.pristine or not pristine_only)
    )


def idle_ending(record: InstanceRecord, now: Epoch, lead_seconds: float) -> bool:
    """An unheld idle on-demand instance whose idle time runs out within `lead_seconds` (before refresh's
    next run), and has not yet."""
    return (
        record.state is InstanceState.IDLE
        and record.run_key is None
        and record.usage_class is UsageClass.ON_DEMAND
        and record.threshold is not None
        and now < record.threshold <= now + lead_seconds
    )


def stopped_until(record: InstanceRecord, config: StackConfig, now: Epoch) -> Epoch:
    """When a stop now ends: `pool.stopped_max_age_minutes` from now, but never past the instance's
    `reuse.max_age_minutes` from launch, after which no claim may take it anyway."""
    return min(
        now + config.pool.stopped_max_age_minutes * 60.0,
        record.created_at + config.reuse.max_age_minutes * 60.0,
    )


def to_stop(
    records: Iterable[InstanceRecord],
    config: StackConfig,
    now: Epoch,
    clean: Callable[[InstanceRecord], bool] = lambda _: True,
    tier: Mapping[str, int] | None = None,
) -> list[InstanceRecord]:
    """The idle instances to stop now: per class, as many as `pool.stopped_maximum` (or `tier`'s number for
    it: adaptive sizing's) leaves room for, those whose idle time ends first first, each one whose agent is
    `clean` (asked only while there is room)."""
    records = list(records)
    lead = config.refresh_rate_minutes * 60.0
    room = Counter(
        {
            name: config.pool.stopped_maximum if tier is None else tier.get(name, config.pool.stopped_maximum)
            for name in config.resource_classes
        }
    )
    # Those launched for the stopped minimum are stopped when admitted: their room is taken already.
    room.subtract(_tier_by_class(records, now))
    chosen: list[InstanceRecord] = []
    for record in sorted(
        (r for r in records if idle_ending(r, now, lead) and not launched_for_tier(r, now)),
        key=lambda r: (r.threshold or 0.0, r.instance_id),
    ):
        # A stop that would end before a start could use it is no stop: terminated as due instead.
        if (
            room[record.resource_class] > 0
            and stopped_until(record, config, now) > now + lead
            and clean(record)
        ):
            room[record.resource_class] -= 1
            chosen.append(record)
    return chosen


def clean_to_stop(signal: WorkerSignal | None) -> bool:
    return signal is not None and signal.signal in STOPPABLE_AFTER


def fits(
    record: InstanceRecord, spec: RunnerSpec, now: Epoch, taker: Taker | None, config: StackConfig
) -> bool:
    """Whether a stopped instance may serve a request: by the very rule pickup judges a hot offer by
    (types, who it served, reuse scope and age; its partition chose class, usage and architecture
    already)."""
    if record.state is not InstanceState.STOPPED or record.threshold_passed(now):
        return False
    offer = PoolMessage.for_stopped(record)
    return judge(offer, spec, now, taker, config.reuse) is Verdict.MATCH


def in_order_of_use(records: Iterable[InstanceRecord]) -> list[InstanceRecord]:
    """Stopped instances in the order a request tries them: used ones first, so that a job that reuses
    leaves the pristine ones to single-use jobs while it has one of its own (as pickup does)."""
    return sorted(records, key=lambda record: record.pristine)


def surplus_stopped(
    records: Iterable[InstanceRecord], tier: Mapping[str, int], now: Epoch
) -> list[InstanceRecord]:
    """Per class, the stopped instances beyond `tier`'s number for it (adaptive sizing's), the oldest
    launched first (the nearest to `reuse.max_age_minutes`): only stopped ones no job holds, as a claim
    that starts one writes its run key first. Those stopping and those launched for the tier count toward
    it but are not chosen: they are the tier's newest."""
    records = list(records)
    have = _tier_by_class(records, now)
    chosen: list[InstanceRecord] = []
    for name, wanted in tier.items():
        stopped = sorted(
            (
                r
                for r in records
                if r.resource_class == name
                and r.state is InstanceState.STOPPED
                and r.run_key is None
                and not r.threshold_passed(now)
            ),
            key=lambda r: (r.created_at, r.instance_id),
        )
        chosen += stopped[: max(0, have[name] - wanted)]
    return chosen
