"""A working day of jobs through the pool, per policy: jobs warm/stopped/cold, queued→ready, dollars per job.

A discrete-event model in simulated time (not the emulator: a day takes well under a second). The trace
is one weekday of workflow runs in one time zone, shaped like a working day (a morning ramp, a lunch
dip, an afternoon peak, a quiet night), each run a matrix of 1 to 20 jobs queued at once, each job of
a lognormal length; all drawn from a seeded generator.

What is the product's own code: the hot and stopped minimums in force at each moment
(`StackConfig.warm_minimum` and `StackConfig.stopped_minimum`, one weekly schedule in the time zone),
the stopped tier's maximum (`pool.stopped_maximum`), the idle time in the pool
(`timeouts.idle_seconds`), whether a released instance is retired or pooled (`reuse.retire_reason`:
`max_jobs`, `max_age_minutes`), which pool instance pickup still offers (`reuse.too_old`), the
refresh period (`refresh_rate_minutes`), and the volume size (`instances.root_volume_gib`). Who may
take what is the product's too: whether a job is served single use (domain/provision.py `single_use`:
`reuse.mode: single-use`, `reuse.max_jobs: 1`, its level of trust; the trace's jobs are trusted, a
push's), and which idle or stopped instance its jobs may take (domain/pickup.py `Taker.may_take`: a
single-use job only a pristine one). What refresh does is modelled as refresh does it
(lambdas/runner_pool/domain/refresh.py): each tick terminates what is due, then admits booted pool
instances, then launches the shortfall below the minimum (`pool_shortfall`: below the warm minimum or
below the pristine minimum, `StackConfig.pristine_minimum`, whichever is larger), counting idle
instances whose idle time has not passed and pool instances still booting. An idle instance at the
minimum is not kept: its idle time runs out and refresh replaces it, as the product does today.

The instant tier is the product's too (domain/instant.py): its size in force (`StackConfig.instant_tier`),
what holds its label (`tier_holds`), what refresh takes back and tops up (`surplus_waiting`,
`tier_shortfall`), and when a waiting runner's record is due (the label's max runtime). Its jobs ask
for the tier's label; GitHub gives each to a waiting runner, or to the first that listens after it,
in the time bench/aws_model.py models for it; each `queued` launches one runner (steps/dispatcher.py)
and each instance is terminated after its one job.

The adaptive policy holds what the sizing rule (domain/sizing.py `pool_size`, the product's function)
says at each refresh, from what the simulated stack has recorded: the day's arrivals so far, the share
of jobs served by an instance that had served before (the reuse rate), and the p95 of its latest
launch -> ready and start -> ready; its floor is the schedule in force (0) and its ceilings
`pool.hot_maximum` and `pool.stopped_maximum` (20: `policies`). Refresh applies it as the
product's does (steps/refresh.py): the hot and stopped shortfalls are launched; an idle instance beyond
the hot number is stopped while the stopped tier is short of the rule's stopped number, else ended; an
idle instance whose idle time passes is stopped only while the tier is short of it; and stopped instances
beyond it are ended.

A second trace, the storm (`storm_day`), has another shape: half the pushes over the same hours,
scheduled workflows at the top of every hour day and night, and one matrix of 100 jobs at once; the
baked policies run it too (`day_trace_storm_*`). For each trace, `p95_reach` reads what a p95 within the
adaptive target asks of any pool, whatever its rule: how many jobs may wait longer, how often the boot
model's stopped and launch paths are ready within it, and how many of the largest run must be ready at once
(`day_trace_*p95_slower_jobs_allowed_count`, `day_trace_*largest_run_jobs_count`); its note says whether
the pool's ceilings could ever have that many ready in time.

The stopped tier is the product's (domain/stopped_tier.py), and the model
follows it in outline: an idle instance whose idle time passes is stopped instead of terminated while
the class has fewer than `pool.stopped_maximum` stopped; pickup prefers hot, then stopped
(StartInstances), then a launch; refresh keeps the stopped minimum by launching instances that boot and
are stopped as soon as they are admitted. What is still only modelled: a stop is instant (the product
waits for EC2 to report it stopped, up to `timeouts.stopping_seconds`), a stopped instance is
terminated once `reuse.max_age_minutes` after its launch (the product also ends it after
`pool.stopped_max_age_minutes` stopped), and the agent's clean-signal check before a stop is assumed.

How long each step takes is emulator/boot_model.py's published figures. Prices: every instance is the
default class's on-demand c7i.large (a stopped tier needs on-demand: an instant fleet's spot
instances cannot be stopped), billed per second from running to stopped or terminated with a
60-second minimum each time it starts; its gp3 root volume is billed from launch to termination,
stopped or not (runner_pool/prices.py has both prices and their sources). The control plane's share
per job is the emulator's measured Step Functions cost per warm or cold job (bench/results.json). The
dollars are the product's own arithmetic: domain/cost.py `price`, which `runner-pool cost` and the daily
budget use on the stack's records, prices each policy's billed seconds, volume seconds and jobs by tier.

A third run, the spot day (`SpotDay`), serves the working day's jobs without a pool on spot instances
that EC2 interrupts at a published rate, and keeps what re-runs cost and whether any job is lost
(`day_trace_spot_*`): see SPOT_ADVISOR_MONTHLY and REPORTED_RUNS_INTERRUPTED for the rates, and
`SpotDay` for what is the product's own code in it.
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time
from enum import StrEnum
from functools import partial
from itertools import count
from zoneinfo import ZoneInfo

from bench import aws_model
from bench.results import RESULTS_PATH, BenchTable
from emulator.boot_model import BootModel, Path
from emulator.ec2_events import NOTICE_SECONDS, interruption_warning
from emulator.instances import instance_facts
from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import ReuseMode, ReuseSettings, StackConfig, WorkflowType
from runner_pool.domain.cost import Charges, InstanceUse, PriceList, ec2_billed_seconds, price
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.instant import surplus_waiting, tier_holds, tier_shortfall
from runner_pool.domain.interruptions import Ec2Event, Response, respond
from runner_pool.domain.labels import instant_label
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import Taker
from runner_pool.domain.provision import single_use
from runner_pool.domain.records import HandOverTier, InstanceRecord, PoolMessage, UsageClass
from runner_pool.domain.refresh import pool_shortfall
from runner_pool.domain.reruns import RunNow, Verdict, decide, job_failed, label_set, served_on_demand
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.sizing import HORIZON_SECONDS, Demand, Holding, pool_size
from runner_pool.domain.trust import TrustLevel
from runner_pool.domain.warm_schedule import WarmMinimum, WarmWindow, Weekday
from runner_pool.prices import (
    CONTROL_PLANE_PER_JOB_USD,
    HOURS_PER_MONTH,
    SPOT_PRICE_RATIO,
    ec2_hourly,
    gp3_hourly,
    list_prices,
    on_demand_hourly,
)

DAY = date(2026, 11, 24)
"""A Tuesday."""
TIME_ZONE = "Europe/Berlin"
RESOURCE_CLASS = "large"
INSTANCE_TYPE = "c7i.large"
"""The smallest current-generation compute type in class large's fence (2 vCPU, 4 GiB)."""
REPOSITORY = "octo/app"
TRUST = TrustLevel.TRUSTED
"""The trace's runs are pushes of the repository's own code: jobs that may follow one another."""
WEEKDAYS = (Weekday.MON, Weekday.TUE, Weekday.WED, Weekday.THU, Weekday.FRI)

RUNS_PER_LOCAL_HOUR = (
    0.2, 0.1, 0.1, 0.1, 0.1, 0.2, 0.5, 1.5, 4, 8, 10, 9, 6, 8, 10, 9, 7, 4, 2, 1.2, 0.8, 0.6, 0.4, 0.3,
)  # fmt: skip
"""Relative workflow runs started in each local hour: a working day with a lunch dip."""
MATRIX_SIZES = ((1, 0.55), (2, 0.12), (3, 0.1), (4, 0.08), (6, 0.06), (8, 0.05), (12, 0.02), (20, 0.02))
"""How many jobs a run queues at once, and how often: mostly single jobs, some matrices."""
JOB_MEDIAN_SECONDS = 300.0
JOB_SIGMA = 0.8
"""Job lengths are lognormal: median 5 min, p95 about 19 min; capped at an hour."""

FALLBACK_CONTROL_PLANE_MICRODOLLARS = {path: usd * 1e6 for path, usd in CONTROL_PLANE_PER_JOB_USD.items()}
"""The product's control plane per warm and cold job (runner_pool/prices.py), for a results file without
the emulator bench's own measure."""

TARGET_WAIT_SECONDS = 15.0
"""The adaptive policy's p95 target wait (the sizing rule's `target_wait_seconds`)."""
MEASURED = 50
"""How many of the latest launches (and starts) the adaptive policy's boot times are measured over."""
INSTANT_START_SECONDS = aws_model.instant_seconds()
"""Queued -> in_progress of a job GitHub gives to a runner already listening (bench/aws_model.py)."""

SMALL = {"runs": 40, "storm_pushes": 20}
"""`make test`'s size (tests/bench): a sparse day."""


@dataclass(frozen=True)
class Job:
    run: int
    queued_at: Epoch
    duration: float


def working_day(runs: int, seed: int, day: date = DAY, time_zone: str = TIME_ZONE) -> list[Job]:
    """`runs` workflow runs over one day in `time_zone`, each a matrix of jobs queued together."""
    rng = random.Random(seed)
    midnight = datetime.combine(day, time(0), ZoneInfo(time_zone)).timestamp()
    sizes, weights = zip(*MATRIX_SIZES, strict=True)
    jobs = []
    for run in range(runs):
        (hour,) = rng.choices(range(24), weights=RUNS_PER_LOCAL_HOUR)
        queued_at = midnight + hour * 3600 + rng.uniform(0, 3600)
        (size,) = rng.choices(sizes, weights=weights)
        jobs += [Job(run, queued_at, _duration(rng)) for _ in range(size)]
    return sorted(jobs, key=lambda job: job.queued_at)


SCHEDULED_RUNS_PER_HOUR = 4
"""The storm trace's scheduled workflows (`on: schedule`, cron `0 * * * *`): runs started at the top of
every hour, day and night."""
SCHEDULED_DELAY_SECONDS = 120.0
"""How late a scheduled run may start: GitHub says "The schedule event can be delayed during periods of
high loads of GitHub Actions workflow runs. High load times include the start of every hour"
(docs.github.com, Actions, "Events that trigger workflows", schedule) and gives no figure; two minutes
is an assumption that keeps each hour's runs together."""
STORM_JOBS = 100
STORM_AT = time(15, 10)
"""The storm trace's one matrix storm: a run of STORM_JOBS jobs queued at once, mid-afternoon."""
STORM_PUSHES = 300
"""The storm trace's pushes, over the working day's shape (half the working day's)."""


def storm_day(pushes: int, seed: int, day: date = DAY, time_zone: str = TIME_ZONE) -> list[Job]:
    """A day of another shape: `pushes` runs over the working day's hours (its quiet night), scheduled
    runs at the top of every hour, and one matrix storm of STORM_JOBS jobs."""
    rng = random.Random(seed + 1)
    midnight = datetime.combine(day, time(0), ZoneInfo(time_zone)).timestamp()
    jobs = working_day(pushes, seed, day, time_zone)
    run = pushes
    for hour in range(24):
        for _ in range(SCHEDULED_RUNS_PER_HOUR):
            queued_at = midnight + hour * 3600 + rng.uniform(0, SCHEDULED_DELAY_SECONDS)
            jobs += [Job(run, queued_at, _duration(rng)) for _ in range(rng.choice((1, 2, 3)))]
            run += 1
    storm_at = datetime.combine(day, STORM_AT, ZoneInfo(time_zone)).timestamp()
    jobs += [Job(run, storm_at, _duration(rng)) for _ in range(STORM_JOBS)]
    return sorted(jobs, key=lambda job: job.queued_at)


def _duration(rng: random.Random) -> float:
    return min(3600.0, rng.lognormvariate(math.log(JOB_MEDIAN_SECONDS), JOB_SIGMA))


def working_hours_minimum(
    count: int, time_zone: str = TIME_ZONE, stopped: int = 0, pristine: int = 0, instant: int = 0
) -> WarmMinimum:
    """A warm minimum of `count` hot and `stopped` stopped, `pristine` of the idle ones never used, and an
    instant tier of `instant`, on weekdays 08:00-18:00 in `time_zone`, none outside."""
    window = WarmWindow(
        days=WEEKDAYS,
        start="08:00",
        end="18:00",
        hot=count,
        stopped=stopped,
        pristine=pristine,
        instant=instant,
    )
    return WarmMinimum(time_zone=time_zone, windows=(window,))


@dataclass(frozen=True)
class Policy:
    """A pool policy: the product's config (its stopped tier's settings too) and the image."""

    name: str
    config: StackConfig
    baked: bool
    instant: bool = False
    """Its jobs ask for the class's instant tier (`pool=instant/class=large`) instead of `pool=<run>`."""
    adaptive: bool = False
    """Refresh holds what the sizing rule (domain/sizing.py) says, the schedule its floor."""

    @property
    def cold_path(self) -> Path:
        return Path.COLD_BAKED if self.baked else Path.COLD_INSTALL


def policies(
    *,
    hot: int = 6,
    hot_with_stopped: int = 3,
    stopped: int = 6,
    stopped_maximum: int = 12,
    pristine: int = 6,
    instant: int = 6,
    adaptive_stopped_maximum: int = 20,
) -> list[Policy]:
    """No pool, hot only, hot+stopped, single use (a pool of `pristine` instances no job has used, each
    job's instance terminated after it), and instant (jobs on the class's instant label, a tier of
    `instant` runners waiting registered); each with a boot-time install and with a baked image. And the
    adaptive policy (baked): the sizing rule's numbers, the stopped tier up to `adaptive_stopped_maximum`,
    as many as `pool.hot_maximum`'s default, since a stopped instance costs its volume only and the rule
    leans on the tier to catch what the hot one misses."""
    shapes = {
        "no_pool": StackConfig(reuse=ReuseSettings(max_jobs=1)),
        "hot": StackConfig(warm_pool_minimum={RESOURCE_CLASS: working_hours_minimum(hot)}),
        "hot_stopped": stopped_tier_config(
            working_hours_minimum(hot_with_stopped, stopped=stopped), stopped_maximum
        ),
        "single_use": StackConfig(
            reuse=ReuseSettings(mode=ReuseMode.SINGLE_USE),
            warm_pool_minimum={RESOURCE_CLASS: working_hours_minimum(0, pristine=pristine)},
        ),
    }
    shapes["instant"] = StackConfig(
        warm_pool_minimum={RESOURCE_CLASS: working_hours_minimum(0, instant=instant)}
    )
    return [
        Policy(f"{name}_{'baked' if baked else 'install'}", config, baked, instant=name == "instant")
        for name, config in shapes.items()
        for baked in (False, True)
    ] + [
        Policy(
            "adaptive",
            stopped_tier_config(WarmMinimum(), adaptive_stopped_maximum),
            baked=True,
            adaptive=True,
        )
    ]


def stopped_tier_config(minimum: WarmMinimum, stopped_maximum: int) -> StackConfig:
    """A stack keeping `minimum` (hot and stopped) of the class, with a tier of `stopped_maximum`: on-demand
    by default, as the product requires of a stopped minimum."""
    return StackConfig.model_validate(
        {
            "defaults": {"usage": "on-demand"},
            "pool": {"stopped_maximum": stopped_maximum},
            "warm_pool_minimum": {RESOURCE_CLASS: minimum},
        }
    )


class Tier(StrEnum):
    BOOTING = "booting for the pool"
    IDLE = "idle"
    WAITING = "waiting registered (instant tier)"
    BUSY = "busy"
    EXPIRED = "expired"
    STOPPED = "stopped"
    GONE = "terminated"


INSTANT_HELD = (Tier.BOOTING, Tier.WAITING, Tier.BUSY)
"""The instant tier's instances that hold its label (domain/instant.py `tier_holds`)."""


@dataclass
class Instance:
    number: int
    launched_at: Epoch
    tier: Tier
    running_since: Epoch | None = None
    """When its current running period began (EC2 bills from running); None while stopped or gone."""
    agent_up_at: Epoch = 0.0
    for_stopped: bool = False
    jobs_served: int = 0
    trust: TrustLevel | None = None
    single_use: bool = False
    """As the product's record has them after its last hand-off: the level served, and whether single use."""
    threshold: Epoch = 0.0
    offered_at: Epoch = 0.0
    billed_seconds: float = 0.0
    volume_seconds: float = 0.0


@dataclass
class Outcome:
    """One policy's day: each job's path and queued→ready, and what the instances were billed."""

    policy: Policy
    paths: list[Path] = field(default_factory=list)
    ready_seconds: list[float] = field(default_factory=list)
    billed_seconds: float = 0.0
    volume_seconds: float = 0.0
    launches: int = 0

    def jobs(self, path: Path | None = None) -> int:
        return len(self.paths) if path is None else self.paths.count(path)

    def cold_jobs(self) -> int:
        return self.jobs(Path.COLD_INSTALL) + self.jobs(Path.COLD_BAKED)

    def ready_percentile(self, q: float) -> float:
        ordered = sorted(self.ready_seconds)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    def charges(
        self,
        per_job: dict[str, float],
        instance_type: str = INSTANCE_TYPE,
        usage: UsageClass = UsageClass.ON_DEMAND,
    ) -> Charges:
        """The day priced by the product's own function (domain/cost.py `price`): the instances' billed
        time and volume time as one use (on `instance_type` as `usage` runs it), and each job's control
        plane by the tier that served it."""
        volume_gib = self.policy.config.instances.root_volume_gib
        hourly = ec2_hourly(instance_type, usage.value)
        if self.policy.instant:
            # Every queued job of the instant tier asks for a runner, which a provision launches, whether
            # the job took a waiting runner or the one launched.
            tiers = {HandOverTier.COLD: self.jobs()}
        else:
            warm = {HandOverTier.HOT: self.jobs(Path.HOT), HandOverTier.STOPPED: self.jobs(Path.STOPPED)}
            tiers = {**warm, HandOverTier.COLD: self.cold_jobs()}
        uses = [InstanceUse(self.billed_seconds, self.volume_seconds, hourly, volume_gib)] + [
            InstanceUse(0.0, 0.0, hourly, volume_gib, tier=tier, jobs=jobs) for tier, jobs in tiers.items()
        ]
        return price(uses, trace_prices(per_job))

    def control_plane_dollars(self, per_job: dict[str, float]) -> float:
        return self.charges(per_job).control_plane_usd


def trace_prices(per_job: dict[str, float]) -> PriceList:
    """The product's price list with the control plane per warm and cold job in microdollars `per_job`."""
    return list_prices({path: microdollars / 1e6 for path, microdollars in per_job.items()})


class Simulated:
    """Events in simulated time, in the order they are due (ties in the order scheduled), and draws of
    the boot model's segments from one seeded generator."""

    def __init__(self, boot: BootModel, seed: int) -> None:
        self._boot = boot
        self._rng = random.Random(seed)
        self._events: list[tuple[Epoch, int, Callable[[Epoch], None]]] = []
        self._order = count()

    def _at(self, when: Epoch, action: Callable[[Epoch], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def _draw(self, *segments: object) -> float:
        return sum(segment.draw(self._rng) for segment in segments)  # type: ignore[attr-defined]

    def _until_done(self, start: Epoch) -> Epoch:
        """Run every event, those the events schedule too; the time of the last."""
        now = start
        while self._events:
            now, _, action = heapq.heappop(self._events)
            action(now)
        return now


class DaySimulation(Simulated):
    """One policy over one trace, event by event in simulated time."""

    def __init__(self, policy: Policy, boot: BootModel, seed: int) -> None:
        super().__init__(boot, seed)
        self._policy = policy
        self._config = policy.config
        self._instances: list[Instance] = []
        self._outstanding = 0
        self._day_end = 0.0
        self._taker = taker(policy.config)
        self._reused: list[tuple[Epoch, bool]] = []
        """Each pickup: when, and whether the instance had served a job before (the reuse rate)."""
        self._launched: list[float] = []
        self._started: list[float] = []
        """Launch -> ready and start -> ready of the jobs served cold and stopped, as the stack measures
        them."""
        self._arrivals: list[Epoch] = []
        self._watched_since = 0.0
        self._unassigned: deque[Job] = deque()
        """Instant-tier jobs queued at GitHub with no runner listening yet, oldest first."""
        label = RunKey.of_job([instant_label(RESOURCE_CLASS)], attempt=1)
        self._instant_runtime_seconds = label.resolve(policy.config).max_runtime_minutes * 60.0
        self.outcome = Outcome(policy)

    def run(self, jobs: list[Job]) -> Outcome:
        if not jobs:
            return self.outcome
        first = datetime.fromtimestamp(jobs[0].queued_at, ZoneInfo(TIME_ZONE))
        midnight = datetime.combine(first.date(), time(0), first.tzinfo).timestamp()
        self._day_end = max(midnight + 86_400, jobs[-1].queued_at)
        self._outstanding = len(jobs)
        self._watched_since = midnight
        for job in jobs:
            self._at(job.queued_at, partial(self._queued, job))
            if self._policy.instant:
                self._at(job.queued_at, partial(self._queued_instant, job))
                continue
            self._at(job.queued_at + self._draw(self._boot.control_plane), partial(self._pickup, job))
        self._at(midnight, self._refresh)
        now = self._until_done(midnight)
        for instance in self._instances:
            self._end(instance, now)
        return self.outcome

    # --- events

    def _pickup(self, job: Job, now: Epoch) -> None:
        """Pickup prefers an idle instance still offered, then a stopped one (modelled), then a launch; of
        each, only those the jobs may take (`Taker.may_take`: a single-use job only a pristine one)."""
        reuse = self._config.reuse
        hot = [
            i
            for i in self._instances
            if i.tier is Tier.IDLE
            and i.offered_at <= now < i.threshold
            and not reuse.too_old(i.launched_at, now)
            and self._taker.may_take(self._offer(i, now), reuse)
        ]
        stopped = [
            i
            for i in self._instances
            if i.tier is Tier.STOPPED
            and not reuse.too_old(i.launched_at, now)
            and self._taker.may_take(self._offer(i, now), reuse)
        ]
        if hot:
            instance, path = min(hot, key=lambda i: i.offered_at), Path.HOT
        elif stopped:
            instance, path = min(stopped, key=lambda i: i.offered_at), Path.STOPPED
        else:
            instance, path = self._launch(now, Tier.BUSY), self._policy.cold_path
        instance.tier = Tier.BUSY
        self._reused.append((now, instance.jobs_served > 0))
        instance.jobs_served += 1
        instance.trust, instance.single_use = self._taker.trust, self._taker.single_use
        # The control plane's share is already behind `now`; a hot instance is running (and billed) already.
        to_running = self._draw(*self._boot.to_running(path))
        if path is not Path.HOT:
            instance.running_since = now + to_running
        ready = now + to_running + self._draw(*self._boot.running_to_agent(path), self._boot.registration)
        if path is not Path.HOT:
            (self._started if path is Path.STOPPED else self._launched).append(ready - now)
        self.outcome.paths.append(path)
        self.outcome.ready_seconds.append(ready - job.queued_at)
        self._at(ready + job.duration, lambda at: self._release(instance, at))

    def _release(self, instance: Instance, now: Epoch) -> None:
        """Release: retired as the product's reuse settings say, else idle, offered once the agent's receipt
        is in (a control-plane round trip), with the idle time from now."""
        self._outstanding -= 1
        if self._config.reuse.retire_reason(self._record(instance, now), now) is not None:
            instance.tier = Tier.EXPIRED
            return
        instance.tier = Tier.IDLE
        instance.threshold = now + self._config.timeouts.idle_seconds
        instance.offered_at = now + self._draw(self._boot.control_plane)

    def _queued(self, job: Job, now: Epoch) -> None:
        """The job's `queued` as the stack records it (the ledger's arrivals)."""
        self._arrivals.append(now)

    # --- the instant tier (domain/instant.py)

    def _queued_instant(self, job: Job, now: Epoch) -> None:
        """GitHub gives the job to a runner of the tier listening for it, if one is; else it waits for the
        first to listen. Either way the `queued` delivery asks the control plane for one more runner."""
        waiting = [i for i in self._instances if i.tier is Tier.WAITING]
        if waiting:
            self._start_instant(job, min(waiting, key=lambda i: i.offered_at), now, Path.HOT)
        else:
            self._unassigned.append(job)
        self._at(now + self._draw(self._boot.control_plane), self._launch_instant)

    def _launch_instant(self, now: Epoch) -> None:
        """A pristine instance launched for the tier, its runner registered with the label: listening once
        booted (the boot model's cold path), when GitHub gives it the oldest job waiting, if any."""
        instance = self._launch(now, Tier.BOOTING)
        path = self._policy.cold_path
        instance.running_since = now + self._draw(*self._boot.to_running(path))
        listening = (
            instance.running_since
            + self._draw(*self._boot.running_to_agent(path))
            + self._draw(self._boot.registration)
        )
        self._at(listening, lambda at: self._listening(instance, at))

    def _listening(self, instance: Instance, now: Epoch) -> None:
        if instance.tier is not Tier.BOOTING:
            return
        if self._unassigned:
            self._start_instant(self._unassigned.popleft(), instance, now, self._policy.cold_path)
            return
        instance.tier = Tier.WAITING
        instance.offered_at = now

    def _start_instant(self, job: Job, instance: Instance, now: Epoch, path: Path) -> None:
        """The runner takes the job in GitHub's assignment and its own calls (bench/aws_model.py); the
        instance is terminated when the job completes, never pooled."""
        instance.tier = Tier.BUSY
        instance.jobs_served = 1
        instance.offered_at = now
        ready = now + INSTANT_START_SECONDS
        self.outcome.paths.append(path)
        self.outcome.ready_seconds.append(ready - job.queued_at)
        self._at(ready + job.duration, lambda at: self._completed_instant(instance, at))

    def _completed_instant(self, instance: Instance, now: Epoch) -> None:
        self._outstanding -= 1
        self._end(instance, now)

    def _keep_instant(self, now: Epoch) -> None:
        """Refresh for the instant tier (steps/refresh.py, domain/instant.py): what is due is ended (a
        runner waits, and then runs its job, for the label's max runtime; a launch has the created
        threshold to register); then, for a class whose tier has a size now, the waiting runners
        beyond it are taken back and the tier is topped up to it. A class whose tier has no size now is
        skipped, as refresh skips it: its waiting runners wait out their runtime."""
        records = {i.number: self._tier_record(i, now) for i in self._instances if i.tier in INSTANT_HELD}
        for instance in self._instances:
            record = records.get(instance.number)
            if record is not None and record.threshold_passed(now):
                self._end(instance, now)
                del records[instance.number]
        size = self._config.instant_tier(RESOURCE_CLASS, now)
        if size == 0:
            return
        surplus = set(surplus_waiting(records.values(), RESOURCE_CLASS, size, now))
        for instance in self._instances:
            if instance.number in records and records[instance.number].instance_id in surplus:
                self._end(instance, now)
        held = tier_holds(records.values(), RESOURCE_CLASS, now) - len(surplus)
        for _ in range(tier_shortfall(size, held)):
            self._launch_instant(now)

    def _tier_record(self, instance: Instance, now: Epoch) -> InstanceRecord:
        """A tier instance as the product's record holds it: created with its runner registered while it
        boots, running once its runner listens (its runtime from then), with the job's repository and
        its runtime from the start once GitHub gave it one (`StateTable.job_started`)."""
        facts = instance_facts(
            instance.number + 1, usage_class=UsageClass.ON_DEMAND, instance_type=INSTANCE_TYPE
        )
        booting = instance.tier is Tier.BOOTING
        threshold = (
            instance.launched_at + self._config.timeouts.created_threshold_seconds
            if booting
            else instance.offered_at + self._instant_runtime_seconds
        )
        return InstanceRecord(
            **facts.model_dump(),
            state=InstanceState.CREATED if booting else InstanceState.RUNNING,
            run_key=instant_label(RESOURCE_CLASS),
            threshold=threshold,
            runner_id=instance.number + 1,
            repository=REPOSITORY if instance.tier is Tier.BUSY else None,
            jobs_served=instance.jobs_served,
            created_at=instance.launched_at,
            updated_at=instance.offered_at or instance.launched_at,
        )

    # --- refresh

    def _refresh(self, now: Epoch) -> None:
        """One refresh run (domain/refresh.py's order): what is due, then admissions, then the minimums."""
        need = self._sized(now) if self._policy.adaptive else None
        self._terminate_due(now, need)
        self._instances = [i for i in self._instances if i.tier is not Tier.GONE]
        if self._policy.instant:
            self._keep_instant(now)
        elif need is not None:
            self._admit_booted(now)
            self._keep_sized(now, need)
        else:
            self._admit_booted(now)
            self._keep_minimums(now)
        # The day ends at the next midnight, or when its last job is done if later; what is left then is
        # billed up to that moment.
        if self._outstanding or now < self._day_end:
            self._at(now + self._config.refresh_rate_minutes * 60, self._refresh)

    def _terminate_due(self, now: Epoch, need: Holding | None) -> None:
        """What is due: an idle instance whose idle time has passed is stopped while the tier has room (the
        rule's stopped number under adaptive sizing, else `pool.stopped_maximum`), ended otherwise."""
        reuse = self._config.reuse
        for instance in self._instances:
            if instance.tier is Tier.EXPIRED:
                self._end(instance, now)
            elif instance.tier is Tier.IDLE and instance.threshold <= now:
                if self._room_to_stop(need) and not reuse.too_old(instance.launched_at, now):
                    self._stop(instance, now)
                else:
                    self._end(instance, now)
            elif instance.tier is Tier.STOPPED and reuse.too_old(instance.launched_at, now):
                self._end(instance, now)

    def _admit_booted(self, now: Epoch) -> None:
        for instance in self._instances:
            if instance.tier is Tier.BOOTING and instance.agent_up_at <= now:
                if instance.for_stopped:
                    self._stop(instance, now)
                else:
                    instance.tier = Tier.IDLE
                    instance.threshold = now + self._config.timeouts.idle_seconds
                    instance.offered_at = now

    def _keep_minimums(self, now: Epoch) -> None:
        idle = [i for i in self._instances if i.tier is Tier.IDLE and i.threshold > now]
        booting = sum(1 for i in self._instances if i.tier is Tier.BOOTING and not i.for_stopped)
        short = pool_shortfall(
            self._config.warm_minimum(RESOURCE_CLASS, now),
            self._config.pristine_minimum(RESOURCE_CLASS, now),
            idle=len(idle),
            idle_pristine=sum(1 for i in idle if i.jobs_served == 0),
            booting=booting,
        )
        for _ in range(short):
            self._launch_for_pool(now, for_stopped=False)
        # The product's rule; synth has checked it is within pool.stopped_maximum.
        stopped_minimum = self._config.stopped_minimum(RESOURCE_CLASS, now)
        stopped = sum(
            1 for i in self._instances if i.tier is Tier.STOPPED or (i.tier is Tier.BOOTING and i.for_stopped)
        )
        for _ in range(stopped_minimum - stopped):
            self._launch_for_pool(now, for_stopped=True)

    # --- the sizing rule (domain/sizing.py), as refresh would apply it

    def _sized(self, now: Epoch) -> Holding:
        """What the rule says now, the schedule in force its floor and `pool.hot_maximum` and
        `pool.stopped_maximum` its ceiling, as refresh asks it (steps/refresh.py)."""
        config = self._config
        floor = Holding(config.warm_minimum(RESOURCE_CLASS, now), config.stopped_minimum(RESOURCE_CLASS, now))
        ceiling = Holding(max(config.pool.hot_maximum, floor.hot), config.pool.stopped_maximum)
        return pool_size(self._demand(now), TARGET_WAIT_SECONDS, now, floor, ceiling)

    def _keep_sized(self, now: Epoch, need: Holding) -> None:
        """Hold what the rule says: launch the hot and stopped shortfalls, counting what still boots. It
        scales down as deliberately: an idle instance beyond the rule's hot number is stopped while the
        stopped tier is short of the rule's stopped number (ended otherwise), so it can serve a later job in
        a start rather than a launch; stopped instances beyond it are ended, the oldest first."""
        config = self._config
        idle = sorted(
            (i for i in self._instances if i.tier is Tier.IDLE and i.threshold > now),
            key=lambda i: i.offered_at,
        )
        stopped = sum(
            1 for i in self._instances if i.tier is Tier.STOPPED or (i.tier is Tier.BOOTING and i.for_stopped)
        )
        for instance in idle[: max(0, len(idle) - need.hot)]:
            if stopped < need.stopped and not config.reuse.too_old(instance.launched_at, now):
                self._stop(instance, now)
                stopped += 1
            else:
                self._end(instance, now)
        booting = sum(1 for i in self._instances if i.tier is Tier.BOOTING and not i.for_stopped)
        kept = min(len(idle), need.hot)
        for _ in range(pool_shortfall(need.hot, 0, idle=kept, idle_pristine=0, booting=booting)):
            self._launch_for_pool(now, for_stopped=False)
        for _ in range(need.stopped - stopped):
            self._launch_for_pool(now, for_stopped=True)
        held = sorted((i for i in self._instances if i.tier is Tier.STOPPED), key=lambda i: i.launched_at)
        for instance in held[: max(0, stopped - need.stopped)]:
            self._end(instance, now)

    def _demand(self, now: Epoch) -> Demand | None:
        """The class's demand as the stack has recorded it: arrivals, the reuse rate over the horizon, and
        the p95 of its measured launch -> ready and start -> ready (a start is taken to be as slow as a
        launch until one is measured); none before a launch has been measured."""
        if not self._launched:
            return None
        recent = [reused for at, reused in self._reused if at > now - HORIZON_SECONDS]
        launch = _p95(self._launched[-MEASURED:])
        return Demand(
            arrivals=self._arrivals,
            watched_since=self._watched_since,
            reuse_rate=sum(recent) / len(recent) if recent else 0.0,
            launch_seconds=launch,
            start_seconds=_p95(self._started[-MEASURED:]) if self._started else launch,
            refresh_seconds=self._config.refresh_rate_minutes * 60.0,
        )

    # --- instances

    def _launch(self, now: Epoch, tier: Tier) -> Instance:
        instance = Instance(self.outcome.launches, launched_at=now, tier=tier)
        self._instances.append(instance)
        self.outcome.launches += 1
        return instance

    def _launch_for_pool(self, now: Epoch, for_stopped: bool) -> None:
        instance = self._launch(now, Tier.BOOTING)
        instance.for_stopped = for_stopped
        path = self._policy.cold_path
        instance.running_since = now + self._draw(*self._boot.to_running(path))
        instance.agent_up_at = instance.running_since + self._draw(*self._boot.running_to_agent(path))

    def _room_to_stop(self, need: Holding | None = None) -> bool:
        stopped = sum(1 for i in self._instances if i.tier is Tier.STOPPED)
        return stopped < (self._config.pool.stopped_maximum if need is None else need.stopped)

    def _stop(self, instance: Instance, now: Epoch) -> None:
        self._close_running(instance, now)
        instance.tier = Tier.STOPPED
        instance.offered_at = now

    def _end(self, instance: Instance, now: Epoch) -> None:
        if instance.tier is Tier.GONE:
            return
        self._close_running(instance, now)
        instance.volume_seconds = now - instance.launched_at
        self.outcome.volume_seconds += instance.volume_seconds
        instance.tier = Tier.GONE

    def _close_running(self, instance: Instance, now: Epoch) -> None:
        if instance.running_since is not None:
            billed = ec2_billed_seconds(max(0.0, now - instance.running_since))
            instance.billed_seconds += billed
            self.outcome.billed_seconds += billed
            instance.running_since = None

    def _record(
        self, instance: Instance, now: Epoch, state: InstanceState = InstanceState.RUNNING
    ) -> InstanceRecord:
        """The instance as the product's records would hold it (at release, by default), for
        `reuse.retire_reason` and pickup's rules."""
        facts = instance_facts(
            instance.number + 1, usage_class=UsageClass.ON_DEMAND, instance_type=INSTANCE_TYPE
        )
        return InstanceRecord(
            **facts.model_dump(),
            state=state,
            run_key="pool=1" if state is InstanceState.RUNNING else None,
            threshold=max(now, instance.threshold),
            repository=REPOSITORY if instance.jobs_served else None,
            jobs_served=instance.jobs_served,
            trust=instance.trust,
            single_use=instance.single_use,
            created_at=instance.launched_at,
            updated_at=now,
        )

    def _offer(self, instance: Instance, now: Epoch) -> PoolMessage:
        """An idle or stopped instance as pickup judges it."""
        if instance.tier is Tier.STOPPED:
            return PoolMessage.for_stopped(self._record(instance, now, InstanceState.STOPPED))
        return PoolMessage.for_idle(self._record(instance, now, InstanceState.IDLE))


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def taker(config: StackConfig) -> Taker:
    """Whose instances the trace's jobs may take under `config`, as a provision of one of its runs decides
    it (domain/provision.py `single_use`): trusted jobs of one private repository, single use if the
    config says so."""
    key = RunKey.of_job([f"pool=1/class={RESOURCE_CLASS}"], attempt=1)
    request = ProvisionRequest(repository=REPOSITORY, run_key=str(key), count=1, trust=TRUST)
    return Taker(REPOSITORY, trust=TRUST, single_use=single_use(request, key.resolve(config), config.reuse))


def control_plane_per_job(config: StackConfig) -> tuple[dict[str, float], str]:
    """Microdollars of Step Functions per warm and cold job, from the emulator bench's figures if present."""
    kind = "express" if config.workflow_type is WorkflowType.EXPRESS else "standard"
    figures = json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {}
    keys = {path: f"emulator_{path}_{kind}_cost_per_job_microdollars_count" for path in ("warm", "cold")}
    if all(key in figures for key in keys.values()):
        return {
            path: float(figures[key]) for path, key in keys.items()
        }, f"bench/results.json emulator_*_{kind}_*"
    return dict(FALLBACK_CONTROL_PLANE_MICRODOLLARS), "the 2026-11 emulator figures (no results file)"


# --- the spot day: interruptions at a published rate, and the product's re-runs of interrupted jobs

SPOT_ADVISOR_MONTHLY = 0.20
"""The Spot Instance Advisor's highest frequency-of-interruption band, ">20%", at its edge: "Frequency of
interruption represents the rate at which Spot has reclaimed capacity during the trailing month. They are
in ranges of < 5%, 5-10%, 10-15%, 15-20% and >20%" (https://aws.amazon.com/ec2/spot/instance-advisor/,
its data https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json). c7i.large's own band in
us-east-1 changes month by month and is not read here: a type in any lower band is interrupted less, and
one in this band may be interrupted more (the reported rate below is far higher). It is read as the
share of instances running a whole month that EC2 takes back in it, at a constant hazard:
1 - exp(-h * 730 h) = 0.20, so h = -ln(0.8) / 730 = 3.1e-4 per instance-hour (`hazard_per_hour`)."""
REPORTED_RUNS_INTERRUPTED = 0.25
REPORTED_RUN_INSTANCE_SECONDS = 251 + 499 + 277 + 636
"""A user's report of a much higher rate: "Approx 25% of our workflow runs experience a spot termination",
for runs of four jobs of 4m11s, 8m19s, 4m37s and 10m36s on large spot instances (runs-on/runs-on issue
#160). As a hazard over a run's instance time: 1 - exp(-h * 27.7 min) = 0.25, h = 0.62 per instance-hour.
The spot day runs at both rates: the advisor's (`day_trace_spot_*`) and this one
(`day_trace_spot_reported_*`), at which a day's re-runs are many."""


def hazard_per_hour(share: float, over_hours: float) -> float:
    """The constant hazard per instance-hour at which `share` of instances are interrupted within
    `over_hours` of running: 1 - exp(-h * over_hours) = share."""
    return -math.log1p(-share) / over_hours


ADVISOR_HAZARD = hazard_per_hour(SPOT_ADVISOR_MONTHLY, HOURS_PER_MONTH)
REPORTED_HAZARD = hazard_per_hour(REPORTED_RUNS_INTERRUPTED, REPORTED_RUN_INSTANCE_SECONDS / 3600)


def spot_config(*, rerun: bool = True, usage: UsageClass = UsageClass.SPOT) -> StackConfig:
    """No pool (every instance serves one job), `usage` by default, re-runs of interrupted jobs as set."""
    return StackConfig.model_validate(
        {
            "defaults": {"usage": usage.value},
            "reuse": {"max_jobs": 1},
            "fleet": {"rerun_interrupted_jobs": rerun},
        }
    )


@dataclass(frozen=True)
class JobAttempt:
    job: Job
    index: int
    """The job's place in the trace: one job, however many attempts run it."""
    run_key: str


@dataclass
class SpotOutcome:
    """A spot day: what was interrupted, re-run and lost, and what the instances were billed."""

    jobs: int
    spot_seconds: float = 0.0
    on_demand_seconds: float = 0.0
    volume_seconds: float = 0.0
    attempts: int = 0
    launches: int = 0
    discarded: int = 0
    """Instances warned before their job started: the provision serves the job with another launch."""
    interrupted: int = 0
    """Job attempts failed because EC2 ended their instance before the job did."""
    rerun: int = 0
    """Job attempts queued again by a re-run of their run's failed jobs."""
    verdicts: dict[Verdict, int] = field(default_factory=dict)
    last_failed: set[int] = field(default_factory=set)
    """The jobs whose latest attempt failed: lost, unless a later attempt served them."""

    @property
    def lost(self) -> int:
        return len(self.last_failed)

    def dollars(self, per_job: dict[str, float], volume_gib: int) -> float:
        """EC2 (spot at SPOT_PRICE_RATIO of on-demand), EBS and the control plane's cold provision per
        attempt, per job of the trace."""
        uses = [
            InstanceUse(self.spot_seconds, 0.0, ec2_hourly(INSTANCE_TYPE, UsageClass.SPOT.value), volume_gib),
            InstanceUse(
                self.on_demand_seconds,
                self.volume_seconds,
                ec2_hourly(INSTANCE_TYPE, UsageClass.ON_DEMAND.value),
                volume_gib,
            ),
            InstanceUse(0.0, 0.0, None, volume_gib, tier=HandOverTier.COLD, jobs=self.attempts),
        ]
        return price(uses, trace_prices(per_job)).total_usd / self.jobs


class SpotDay(Simulated):
    """The working day's jobs, each on an instance of its own (no pool), spot unless the product says
    on-demand, EC2 interrupting spot instances at `hazard` per instance-hour from running.

    The product's own code: the usage a job's run key resolves to (`RunKey.resolve`), and on-demand for an
    attempt that re-runs a label set an interruption failed (domain/reruns.py `served_on_demand`); what a
    warning means for the instance's record (domain/interruptions.py `respond`, on the event the emulator
    sends): one warned before its job starts is discarded and the job served by another launch, one
    running a job is marked interrupted and ended at the end of the notice (NOTICE_SECONDS), its job
    failed unless done by then; which jobs a re-run of failed jobs runs again (`job_failed`), and whether
    a run attempt that completed with a job failed on an interrupted instance is re-run (`decide`, with
    what this stack asked before: its own re-run's interruption is not re-run). Modelled: GitHub fails the
    job when its instance ends, the run completes with its last job, and its re-run's jobs are queued a
    control-plane round trip later. Billing is per second with a minute's minimum, spot too: "Linux based
    instances that are launched in On-Demand, Reserved and Spot form will be billed on one second
    increments, with a minimum of 60 seconds" (AWS What's New, "Announcing Amazon EC2 per second billing",
    2017-10-02); an interrupted spot instance is billed up to its end, which errs on the dear side."""

    def __init__(self, config: StackConfig, boot: BootModel, seed: int, hazard: float) -> None:
        super().__init__(boot, seed)
        self._config = config
        self._hazard = hazard
        self._running: dict[tuple[int, int], int] = {}
        """Job attempts of each (run, attempt) not yet completed."""
        self._failed: dict[tuple[int, int], list[JobAttempt]] = {}
        """Each run attempt's job attempts failed on an interrupted instance."""
        self._asked: set[tuple[int, int]] = set()
        """Run attempts this stack asked GitHub to re-run."""
        self.outcome = SpotOutcome(jobs=0)

    def run(self, jobs: list[Job]) -> SpotOutcome:
        self.outcome = SpotOutcome(jobs=len(jobs))
        for index, job in enumerate(jobs):
            self._at(job.queued_at, partial(self._queued, job, index, 1, frozenset()))
        self._until_done(jobs[0].queued_at if jobs else 0.0)
        return self.outcome

    def _queued(self, job: Job, index: int, attempt: int, on_demand: frozenset[str], now: Epoch) -> None:
        key = RunKey.of_job([f"pool={job.run + 1}/class={RESOURCE_CLASS}"], attempt=attempt)
        usage = key.resolve(self._config).usage
        if served_on_demand(str(key), on_demand):
            usage = UsageClass.ON_DEMAND
        self._running[job.run, attempt] = self._running.get((job.run, attempt), 0) + 1
        self.outcome.attempts += 1
        self._at(
            now + self._draw(self._boot.control_plane),
            partial(self._launch, JobAttempt(job, index, str(key)), usage),
        )

    def _launch(self, attempt: JobAttempt, usage: UsageClass, now: Epoch) -> None:
        self.outcome.launches += 1
        path = Path.COLD_BAKED
        running = now + self._draw(*self._boot.to_running(path))
        ready = running + self._draw(*self._boot.running_to_agent(path), self._boot.registration)
        done = ready + attempt.job.duration
        spot = usage is UsageClass.SPOT and self._hazard > 0
        warned = running + self._rng.expovariate(self._hazard / 3600) if spot else math.inf
        if warned >= done:
            self._ended(usage, now, running, done)
            self._at(done, partial(self._completed, attempt, False))
            return
        state = InstanceState.CREATED if warned < ready else InstanceState.RUNNING
        row = respond(self._warning(warned), self._warned_record(attempt, state, now, warned))
        if row.response is Response.MARK_INTERRUPTED:
            end = min(done, warned + NOTICE_SECONDS)
            self._ended(usage, now, running, end)
            self._at(end, partial(self._completed, attempt, end < done))
            return
        # Discarded (or left the pool): the provision serves the job with another launch.
        self.outcome.discarded += 1
        self._ended(usage, now, running, warned)
        self._at(warned + self._draw(self._boot.control_plane), partial(self._launch, attempt, usage))

    def _warning(self, at: Epoch) -> Ec2Event:
        return Ec2Event.model_validate(
            interruption_warning(instance_facts(self.outcome.launches).instance_id, at)
        )

    def _warned_record(
        self, attempt: JobAttempt, state: InstanceState, launched: Epoch, at: Epoch
    ) -> InstanceRecord:
        facts = instance_facts(self.outcome.launches, instance_type=INSTANCE_TYPE)
        return InstanceRecord(
            **facts.model_dump(),
            state=state,
            run_key=attempt.run_key,
            threshold=at + self._config.timeouts.created_threshold_seconds,
            repository=REPOSITORY,
            created_at=launched,
            updated_at=at,
        )

    def _ended(self, usage: UsageClass, launched: Epoch, running: Epoch, end: Epoch) -> None:
        billed = ec2_billed_seconds(max(0.0, end - running)) if end > running else 0.0
        if usage is UsageClass.SPOT:
            self.outcome.spot_seconds += billed
        else:
            self.outcome.on_demand_seconds += billed
        self.outcome.volume_seconds += end - launched

    def _completed(self, attempt: JobAttempt, interrupted: bool, now: Epoch) -> None:
        run_attempt = RunKey.parse(attempt.run_key).attempt
        key = (attempt.job.run, run_attempt)
        conclusion = "failure" if interrupted else "success"
        if interrupted:
            self.outcome.interrupted += 1
            self._failed.setdefault(key, []).append(attempt)
        if job_failed(conclusion):
            self.outcome.last_failed.add(attempt.index)
        else:
            self.outcome.last_failed.discard(attempt.index)
        self._running[key] -= 1
        if self._running[key] == 0:
            self._run_completed(attempt.job.run, run_attempt, now)

    def _run_completed(self, run: int, attempt: int, now: Epoch) -> None:
        failed = self._failed.pop((run, attempt), [])
        if not failed:
            return
        verdict, _ = decide(
            enabled=self._config.fleet.rerun_interrupted_jobs,
            attempt=attempt,
            run=RunNow(status="completed", conclusion="failure", latest_attempt=attempt),
            asked_for_previous=(run, attempt - 1) in self._asked,
            asked_for_this=(run, attempt) in self._asked,
        )
        self.outcome.verdicts[verdict] = self.outcome.verdicts.get(verdict, 0) + 1
        if verdict is not Verdict.RERUN:
            return
        self._asked.add((run, attempt))
        on_demand = frozenset(label_set(each.run_key) for each in failed)
        queued = now + self._draw(self._boot.control_plane)
        for each in failed:
            self.outcome.rerun += 1
            self._at(queued, partial(self._queued, each.job, each.index, attempt + 1, on_demand))


STORM_POLICIES = ("no_pool_baked", "hot_baked", "hot_stopped_baked", "instant_baked", "adaptive")
"""The policies the storm trace runs: the baked ones, against no pool's."""


def run(
    runs: int = 600, seed: int = 16, boot: BootModel | None = None, storm_pushes: int = STORM_PUSHES
) -> BenchTable:
    jobs = working_day(runs, seed)
    stormy = storm_day(storm_pushes, seed)
    everyone = policies()
    outcomes = [DaySimulation(policy, boot or BootModel(), seed).run(jobs) for policy in everyone]
    storm = [
        DaySimulation(policy, boot or BootModel(), seed).run(stormy)
        for policy in everyone
        if policy.name in STORM_POLICIES
    ]
    per_job, per_job_source = control_plane_per_job(outcomes[0].policy.config)
    table = BenchTable(
        f"day trace: {len(jobs)} jobs in {runs} runs over a working day ({DAY:%a %Y-%m-%d}, {TIME_ZONE}); "
        f"storm: {len(stormy)} jobs ({storm_pushes} pushes, {SCHEDULED_RUNS_PER_HOUR} scheduled runs at the "
        f"top of every hour, one matrix of {STORM_JOBS} at {STORM_AT:%H:%M})",
        (
            "policy",
            "warm",
            "stopped",
            "cold",
            "ready p50 s",
            "ready p95 s",
            "EC2 $/job",
            "EBS $/job",
            "control $/job",
            "total $/job",
            "launches",
        ),
    )
    totals = _report(table, outcomes, per_job, "")
    storm_totals = _report(table, storm, per_job, "storm_")
    _explain(table, totals, per_job, per_job_source)
    _adaptive_verdict(table, totals, "working day")
    _adaptive_verdict(table, storm_totals, "storm")
    adaptive = next(policy for policy in everyone if policy.adaptive)
    _reach_note(table, p95_reach(jobs, boot or BootModel()), adaptive, "working day", "")
    _reach_note(table, p95_reach(stormy, boot or BootModel()), adaptive, "storm", "storm_")
    _spot_report(table, jobs, boot or BootModel(), seed, per_job)
    return table


SPOT_RATES = (
    ("", ADVISOR_HAZARD, "the Spot Instance Advisor's >20% band"),
    ("reported_", REPORTED_HAZARD, "runs-on #160's 25% of runs"),
)


def spot_day(
    jobs: list[Job],
    boot: BootModel,
    seed: int,
    hazard: float,
    *,
    rerun: bool = True,
    usage: UsageClass = UsageClass.SPOT,
) -> SpotOutcome:
    """`jobs` served without a pool, `usage` by default, EC2 interrupting spot at `hazard` an hour."""
    return SpotDay(spot_config(rerun=rerun, usage=usage), boot, seed, hazard).run(jobs)


def _spot_report(
    table: BenchTable, jobs: list[Job], boot: BootModel, seed: int, per_job: dict[str, float]
) -> None:
    """The spot day at each rate, against the same jobs all on-demand (`day_trace_spot_*`)."""
    volume_gib = spot_config().instances.root_volume_gib
    on_demand = spot_day(jobs, boot, seed, hazard=0.0, usage=UsageClass.ON_DEMAND)
    on_demand_cost = on_demand.dollars(per_job, volume_gib)
    table.figure("day_trace_spot_on_demand_cost_per_job_microdollars_count", round(on_demand_cost * 1e6, 1))
    for prefix, hazard, source in SPOT_RATES:
        outcome = spot_day(jobs, boot, seed, hazard)
        cost = outcome.dollars(per_job, volume_gib)
        name = f"day_trace_spot_{prefix}"
        table.figure(f"{name}interrupted_jobs_count", outcome.interrupted)
        table.figure(f"{name}interrupted_jobs_rerun_count", outcome.rerun)
        table.figure(f"{name}interrupted_jobs_lost_count", outcome.lost)
        table.figure(f"{name}discarded_launches_count", outcome.discarded)
        table.figure(f"{name}cost_per_job_microdollars_count", round(cost * 1e6, 1))
        table.note(
            f"spot day at {source} ({hazard:.2e} per instance-hour), no pool, spot at "
            f"{SPOT_PRICE_RATIO:.0%} of on-demand: {outcome.interrupted} job attempts interrupted, "
            f"{outcome.discarded} instances warned before their job and replaced, {outcome.rerun} re-run "
            f"on on-demand, {outcome.lost} lost; ${cost:.5f} per job against ${on_demand_cost:.5f} all "
            "on-demand."
        )


def _report(
    table: BenchTable, outcomes: list[Outcome], per_job: dict[str, float], trace: str
) -> dict[str, tuple[float, float, float]]:
    """A row and the figures (`day_trace_<trace><policy>_*`) per policy; each one's $/job, p50 and p95."""
    totals = {}
    for outcome in outcomes:
        name = outcome.policy.name
        jobs_count = outcome.jobs()
        charges = outcome.charges(per_job)
        ec2, ebs = charges.ec2_usd / jobs_count, charges.ebs_usd / jobs_count
        control = charges.control_plane_usd / jobs_count
        total = ec2 + ebs + control
        p50, p95 = outcome.ready_percentile(0.5), outcome.ready_percentile(0.95)
        totals[name] = (total, p50, p95)
        table.row(
            f"{trace.replace('_', ': ')}{name}",
            outcome.jobs(Path.HOT),
            outcome.jobs(Path.STOPPED),
            outcome.cold_jobs(),
            f"{p50:.1f}",
            f"{p95:.1f}",
            f"{ec2:.5f}",
            f"{ebs:.5f}",
            f"{control:.5f}",
            f"{total:.5f}",
            outcome.launches,
        )
        prefix = f"day_trace_{trace}{name}"
        table.figure(f"{prefix}_warm_jobs_count", outcome.jobs(Path.HOT))
        table.figure(f"{prefix}_stopped_jobs_count", outcome.jobs(Path.STOPPED))
        table.figure(f"{prefix}_cold_jobs_count", outcome.cold_jobs())
        table.figure(f"{prefix}_ready_p50_seconds", round(p50, 2))
        table.figure(f"{prefix}_ready_p95_seconds", round(p95, 2))
        table.figure(f"{prefix}_ec2_cost_per_job_microdollars_count", round(ec2 * 1e6, 1))
        table.figure(f"{prefix}_ebs_cost_per_job_microdollars_count", round(ebs * 1e6, 1))
        table.figure(f"{prefix}_control_plane_cost_per_job_microdollars_count", round(control * 1e6, 1))
        table.figure(f"{prefix}_cost_per_job_microdollars_count", round(total * 1e6, 1))
    return totals


ADAPTIVE_COST_RATIO = 1.25
ADAPTIVE_P95_SECONDS = 15.0
ADAPTIVE_P50_SECONDS = 8.0
"""Issue 40's targets for the adaptive policy: $/job against no pool's (baked), and queued -> ready."""


def _adaptive_verdict(table: BenchTable, totals: dict[str, tuple[float, float, float]], trace: str) -> None:
    cost, p50, p95 = totals["adaptive"]
    ratio = cost / totals["no_pool_baked"][0]
    verdicts = [
        f"$/job {ratio:.2f}x no pool's (<= {ADAPTIVE_COST_RATIO:g}x: {_met(ratio, ADAPTIVE_COST_RATIO)})",
        f"p95 {p95:.1f} s (<= {ADAPTIVE_P95_SECONDS:g}: {_met(p95, ADAPTIVE_P95_SECONDS)})",
        f"p50 {p50:.1f} s (<= {ADAPTIVE_P50_SECONDS:g}: {_met(p50, ADAPTIVE_P50_SECONDS)})",
    ]
    table.note(f"adaptive on the {trace}: " + ", ".join(verdicts) + ".")


@dataclass(frozen=True)
class P95Reach:
    """What a queued -> ready p95 within ADAPTIVE_P95_SECONDS asks of any pool on a trace, by any rule."""

    jobs: int
    slower_allowed: int
    """How many jobs may wait longer (`Outcome.ready_percentile`: the ceil(0.95 n)th fastest is the p95)."""
    stopped_in_time: float
    """The share of the boot model's stopped-path draws (queued -> ready) within the target."""
    cold_in_time: float
    """The same of its baked launch path."""
    largest_run: int
    """The most jobs one run queues at once."""

    @property
    def at_once(self) -> int:
        """Instances that must be ready within the target when the largest run comes, even if every other
        job of the trace is."""
        return max(0, self.largest_run - self.slower_allowed)


def p95_reach(jobs: list[Job], boot: BootModel, draws: int = 20_000, seed: int = 16) -> P95Reach:
    """The trace's `jobs` against the p95 target (`P95Reach`), each path drawn `draws` times."""
    rng = random.Random(seed)

    def in_time(path: Path) -> float:
        return sum(1 for _ in range(draws) if boot.draw(path, rng) <= ADAPTIVE_P95_SECONDS) / draws

    runs = Counter(job.run for job in jobs)
    return P95Reach(
        jobs=len(jobs),
        slower_allowed=len(jobs) - math.ceil(0.95 * len(jobs)),
        stopped_in_time=in_time(Path.STOPPED),
        cold_in_time=in_time(Path.COLD_BAKED),
        largest_run=max(runs.values(), default=0),
    )


def _reach_note(table: BenchTable, reach: P95Reach, adaptive: Policy, trace: str, prefix: str) -> None:
    """Why the adaptive p95 is or is not within reach on a trace: the jobs it lets wait longer, against the
    largest run and what the pool's ceilings can have ready within the target at once."""
    pool = adaptive.config.pool
    table.figure(f"day_trace_{prefix}p95_slower_jobs_allowed_count", reach.slower_allowed)
    table.figure(f"day_trace_{prefix}largest_run_jobs_count", reach.largest_run)
    launched = max(0, reach.largest_run - pool.hot_maximum - pool.stopped_maximum)
    in_time = pool.hot_maximum + reach.stopped_in_time * pool.stopped_maximum + reach.cold_in_time * launched
    verdict = (
        f"more than the ceilings can have ready within it at once (pool.hot_maximum {pool.hot_maximum} hot, "
        f"{reach.stopped_in_time:.0%} of pool.stopped_maximum {pool.stopped_maximum} and "
        f"{reach.cold_in_time:.0%} of the launches in time): no sizing within them meets the p95 here"
        if reach.at_once > in_time
        else "within the ceilings, so the p95 is a matter of what is held hot when"
    )
    table.note(
        f"p95 reach on the {trace}: a p95 within {ADAPTIVE_P95_SECONDS:g} s lets {reach.slower_allowed} of "
        f"{reach.jobs} jobs wait longer; a stopped instance is ready within it in "
        f"{reach.stopped_in_time:.0%} of the boot model's draws and a launch in {reach.cold_in_time:.0%} "
        "(the rest of the jobs they serve are among those that wait longer); the largest run queues "
        f"{reach.largest_run} at once, {reach.at_once} of which must be ready within it, {verdict}."
    )


def _met(value: float, bound: float) -> str:
    return "met" if value <= bound else "NOT met"


def _explain(
    table: BenchTable, totals: dict[str, tuple[float, float, float]], per_job: dict[str, float], source: str
) -> None:
    """The policies' settings, the prices, and the answer to: is hot+stopped cheaper per job
    than hot-only at the same or better p95?"""
    by_name = {policy.name: policy for policy in policies()}
    hot, hot_stopped = by_name["hot_baked"], by_name["hot_stopped_baked"]
    single, instant = by_name["single_use_baked"], by_name["instant_baked"]
    noon = datetime.combine(DAY, time(12), ZoneInfo(TIME_ZONE)).timestamp()
    stopped = hot_stopped.config.stopped_minimum(RESOURCE_CLASS, noon)
    volume_gib = hot.config.instances.root_volume_gib
    table.note(
        f"hot: warm minimum {hot.config.warm_minimum(RESOURCE_CLASS, noon)} on weekdays 08:00-18:00 "
        f"{TIME_ZONE}; "
        f"hot_stopped: {hot_stopped.config.warm_minimum(RESOURCE_CLASS, noon)} hot and {stopped} stopped in "
        f"the same hours, at most {hot_stopped.config.pool.stopped_maximum} stopped; "
        f"single_use: reuse.mode {single.config.reuse.mode}, a pristine minimum of "
        f"{single.config.pristine_minimum(RESOURCE_CLASS, noon)} in the same hours, every job's instance "
        f"terminated after it; "
        f"instant: every job on {instant_label(RESOURCE_CLASS)}, an instant tier of "
        f"{instant.config.instant_tier(RESOURCE_CLASS, noon)} runners waiting registered in the same hours, "
        f"a job given to a waiting runner starting in {INSTANT_START_SECONDS:.3f} s (bench/aws_model.py), "
        "each job's `queued` launching one runner and its instance terminated after it; "
        f"no_pool: reuse.max_jobs 1, no minimum. Idle time {hot.config.timeouts.idle_seconds:g} s, "
        f"max age {hot.config.reuse.max_age_minutes} min (config defaults). Jobs are trusted (a push's)."
    )
    table.note(
        f"Prices: {INSTANCE_TYPE} on-demand ${on_demand_hourly(INSTANCE_TYPE)}/h by the second, "
        f"60 s minimum per start; gp3 {volume_gib} GiB ${gp3_hourly(volume_gib):.5f}/h from launch to "
        f"termination; control plane {per_job['warm']:g}/{per_job['cold']:g} microdollars per warm/cold "
        f"job ({source})."
    )
    cheapest = min(totals, key=lambda name: totals[name][0])
    table.note(
        f"Cheapest per job: {cheapest} (${totals[cheapest][0]:.5f}); a pool buys queued→ready with idle "
        f"instance time. Launches beyond cold jobs are pool launches: refresh lets an idle instance at the "
        f"minimum run out its idle time and launches its replacement, so an unused pool is relaunched "
        f"every idle time plus a boot (domain/refresh.py)."
    )
    for image in ("install", "baked"):
        single_cost, _, single_p95 = totals[f"single_use_{image}"]
        none_cost, _, none_p95 = totals[f"no_pool_{image}"]
        reused_cost, _, reused_p95 = totals[f"hot_{image}"]
        table.note(
            f"{image}: single use ${single_cost:.5f} per job, p95 {single_p95:.1f} s; no pool "
            f"${none_cost:.5f}, p95 {none_p95:.1f} s; hot (reused) ${reused_cost:.5f}, "
            f"p95 {reused_p95:.1f} s."
        )
    for image in ("install", "baked"):
        hot_cost, _, hot_p95 = totals[f"hot_{image}"]
        stopped_cost, _, stopped_p95 = totals[f"hot_stopped_{image}"]
        cheaper = "costs less" if stopped_cost < hot_cost else "does NOT cost less"
        p95 = "at the same or better" if stopped_p95 <= hot_p95 else "at a WORSE"
        table.note(
            f"{image}: hot+stopped {cheaper} per job than hot-only (${stopped_cost:.5f} vs ${hot_cost:.5f}) "
            f"{p95} p95 queued→ready ({stopped_p95:.1f} s vs {hot_p95:.1f} s)."
        )
