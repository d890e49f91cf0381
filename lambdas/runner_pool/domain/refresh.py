"""Refresh (DESIGN.md section 8): what one run of the scheduled sweep reports, and the rules it decides by.

The sweep itself is steps.refresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import privileged_label
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import RegisteredRunner
from runner_pool.domain.trust import TrustLevel

_Item = TypeVar("_Item")

ORPHAN_GRACE_SECONDS = 60.0
"""An untracked instance younger than this may be one a creation launched and has not recorded yet."""
REDELIVERY_WINDOW_SECONDS = 3600.0
"""How far back failed webhook deliveries are redelivered; older events are too stale to act on."""
SWEEP_BATCH = 100
"""Due instances terminated, then marked, per batch: a run that dies loses at most one batch's marks."""
WARM_POOL_MARKER = "refresh-warm-pool"
"""The last refresh tick whose warm-pool top-up was claimed."""
STOPPED_TIER_MARKER = "refresh-stopped-tier"
"""The last refresh tick whose choice of instances to stop was claimed."""
REDELIVERY_MARKER = "refresh-redelivery"
"""The highest webhook delivery id asked for again (GitHub's delivery ids grow with time)."""
MAY_STILL_SERVE = frozenset({InstanceState.CREATED, InstanceState.CLAIMED, InstanceState.RUNNING})
RECONCILE_REQUESTS_PER_RUN = 20
"""GitHub requests one refresh run may make to reconcile (a page of 100 jobs each); with the default
schedule, 20 a minute: a sliver of the App's 5,000 an hour, and of 900 points a minute per endpoint."""
RECENT_DEMAND_SECONDS = 3600.0
"""How long after its last provision a run is still reconciled; GitHub keeps a job queued 24 hours, but
a run of ours that has waited an hour without runners is an incident, not something to paper over."""
RECONCILE_GRACE_SECONDS = 30.0
"""A job queued this recently may still be on its way through the webhook and the dispatcher."""
REFUSAL_BACKOFF_SECONDS = 900.0
"""How long reconciliation leaves alone a run whose registration GitHub refused for good (an organisation
that forbids repository runners, a runner group the repository may not use): asked every minute, it
would be refused every minute. Bounded, so that a policy the owner fixes is picked up within a quarter
of an hour, at four refused asks an hour per run instead of sixty."""
JOB_RESERVE_SECONDS = 10.0
"""A job starts, and a long job takes its next step (a GitHub read, a run reconciled), only with this much
of the Lambda's time left: more than one step's worst case (a GitHub request with the client's retries,
a batch of TerminateInstances), so no step is cut off by the timeout half done."""
RUNNERS_MARKER = "refresh-runners"
"""Where in the sorted list of repositories with recent demand the last run's runner lists stopped."""
RESUME_MARKER = "refresh-resume"
"""The place in the order of refresh's jobs of the first job a run left to the next for lack of time."""


@dataclass
class RefreshReport:
    """What one run did; only what this run changed is counted, so racing runs never count twice."""

    vanished: int = 0
    """Live records expired because EC2 reports their instance gone."""
    terminated: Counter[str] = field(default_factory=Counter)
    """Due instances terminated and marked, by the state their record expired in."""
    already_gone: int = 0
    """Of those, instances EC2 had already terminated (or no longer knew)."""
    stopping: int = 0
    """Idle instances this run chose for the stopped tier and asked EC2 to stop."""
    stopped: int = 0
    """Stopping instances EC2 reported stopped, marked stopped."""
    orphans_terminated: int = 0
    unreadable: int = 0
    """`state` items that did not parse: their instances terminated, the items set aside."""
    admitted: int = 0
    unready: int = 0
    """Instances launched for the pool whose agent reported UD_FAILED; expired."""
    launched: Counter[str] = field(default_factory=Counter)
    launched_for_stopped: Counter[str] = field(default_factory=Counter)
    instant: dict[str, int] = field(default_factory=dict)
    """Per class with an instant tier, the instances holding its label at this run."""
    instant_asked: Counter[str] = field(default_factory=Counter)
    """Per class, the runners its instant tier was short of and a provision was asked for."""
    """Instances launched per class for the stopped minimum (stopped once admitted)."""
    idle: dict[str, int] = field(default_factory=dict)
    """Idle instances per class before the top-up: the pool's size."""
    idle_pristine: dict[str, int] = field(default_factory=dict)
    """Of those, the pristine ones (never served a job) per class."""
    minimum: dict[str, int] = field(default_factory=dict)
    """The warm minimum in force per class at this run (a schedule's window, or the plain number)."""
    pristine_minimum: dict[str, int] = field(default_factory=dict)
    """The pristine minimum in force per class at this run: a floor among the idle instances."""
    stopped_minimum: dict[str, int] = field(default_factory=dict)
    """The stopped minimum in force per class at this run."""
    trimmed: Counter[str] = field(default_factory=Counter)
    """Idle instances per class ended (or stopped, for the stopped tier) beyond what adaptive sizing holds."""
    runners_deleted: int = 0
    redelivered: int = 0
    runners_replaced: int = 0
    """Running instances whose runner exited before it took a job: released, and a runner asked for."""
    runs_reconciled: int = 0
    """Runs whose jobs GitHub was asked about."""
    jobs_reprovisioned: int = 0
    """Queued jobs no runner of ours was free to take, provisioned again."""
    notice_queues_closed: int = 0
    """Notice queues of instances that have ended, deleted."""
    notice_queues_opened: int = 0
    """Live instances found without a notice queue, given one."""
    pool_messages_dropped: int = 0
    """Messages no request could take (unparseable, or offers of instances no longer idle), dropped from
    the queues of partitions with no idle instance."""
    runs_refused: int = 0
    """Runs with recent demand not reconciled because GitHub refused their registration for good
    recently (within REFUSAL_BACKOFF_SECONDS): their queued jobs stay unserved, with GitHub's reason."""
    failed: list[str] = field(default_factory=list)
    """Jobs that failed; the next run tries them again."""
    ran: list[str] = field(default_factory=list)
    """Jobs this run began, in the order it ran them (failed ones included)."""
    deferred: list[str] = field(default_factory=list)
    """Jobs this run did not begin because its time was short: the next run begins with the first."""
    cut_short: list[str] = field(default_factory=list)
    """Jobs that stopped part way for lack of time; what they left, the next run does."""
    hour_short: list[str] = field(default_factory=list)
    """Jobs that read nothing more from GitHub, its hourly remainder kept for registrations."""
    github_hourly_remaining: int | None = None
    """GitHub's hourly remainder as the shared budget last knew it (None: never read)."""

    def as_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it rebuilds a Counter from its items, counting them again.
        return {name: dict(value) if isinstance(value, dict) else value for name, value in vars(self).items()}


@dataclass(frozen=True)
class RecentRun:
    repository: str
    run_id: int
    attempt: int
    run_keys: frozenset[str]
    demand_at: Epoch
    busy_until: Epoch
    reconciled_at: Epoch = 0.0
    single_use: bool = False
    """Its jobs were public or a fork's: what refresh provisions again for it stays single use."""
    trust: TrustLevel | None = None
    """The run's level as its provisions had it (None: not known; see `trust_of`)."""
    privileged_labels: frozenset[str] = frozenset()
    repository_id: int | None = None
    """The repository's id, when its demand carried one: what refresh provisions again carries it too."""
    refused_at: Epoch | None = None
    """When GitHub last refused its registration for good, unless a provision has begun since."""
    refused_reason: str | None = None
    """GitHub's words for that refusal."""
    on_demand_keys: frozenset[str] = frozenset()
    """Its run keys whose provisions were served on-demand: what refresh provisions again for them is too."""

    @property
    def key(self) -> str:
        return f"{self.repository}#{self.run_id}#{self.attempt}"

    def trust_of(self, run_key: str) -> TrustLevel | None:
        """The level a job of `run_key` is provisioned again at: privileged when a provision of its pool
        label was, else the run's (None, not known, is served single use)."""
        if privileged_label(run_key) in self.privileged_labels:
            return TrustLevel.PRIVILEGED
        return self.trust


class RecentRuns(Protocol):
    """The runs with recent demand, as reconcile reads and marks them (adapters/recent_demand.py)."""

    def runs(self) -> list[RecentRun]:
        """Every run noted and not forgotten yet, least recently reconciled first."""
        ...

    def reconciled(self, run: RecentRun) -> None: ...

    def busy(self, run: RecentRun, busy_for: float) -> None:
        """A provision was started for the run (by refresh): leave it alone until it has had its chance."""
        ...

    def forget(self, run: RecentRun) -> None:
        """Unless the run had new demand since it was read (its demand_at moved on)."""
        ...


def refresh_tick(at: Epoch, config: StackConfig) -> int:
    """Which scheduled run a time belongs to: runs of the same schedule slot share one warm-pool top-up."""
    return int(at // (config.refresh_rate_minutes * 60))


def pool_shortfall(
    minimum: int, pristine_minimum: int, *, idle: int, idle_pristine: int, booting: int
) -> int:
    """How many instances of a class refresh launches for the pool: the shortfall of idle ones below its
    warm minimum, or of pristine ones among them below its pristine minimum, whichever is larger. What is
    launched for the pool is pristine, so it counts toward both (domain/config.py WarmMinimum), as do the
    instances still booting for the pool; 0 when neither falls short."""
    return max(0, minimum - idle - booting, pristine_minimum - idle_pristine - booting)


def surplus_idle(idle: Sequence[InstanceRecord], hot: int, pristine_minimum: int) -> list[InstanceRecord]:
    """Which of a class's idle instances to take back when it holds more than `hot`: as many as it holds
    beyond, used ones first (the pristine ones serve any job), then those whose idle time ends first; a
    pristine one only while more than `pristine_minimum` remain."""
    surplus = len(idle) - hot
    pristine_left = sum(record.pristine for record in idle)
    chosen: list[InstanceRecord] = []
    for record in sorted(idle, key=lambda r: (r.pristine, r.threshold or 0.0, r.instance_id)):
        if len(chosen) >= surplus:
            break
        if record.pristine:
            if pristine_left <= pristine_minimum:
                continue
            pristine_left -= 1
        chosen.append(record)
    return chosen


def untracked(record: InstanceRecord | None) -> bool:
    return record is None or record.state is InstanceState.TERMINATED


def booting_for_pool(record: InstanceRecord, now: Epoch) -> bool:
    return (
        record.state is InstanceState.CREATED and record.run_key is None and not record.threshold_passed(now)
    )


def may_still_start(record: InstanceRecord | None, runner: RegisteredRunner, now: Epoch) -> bool:
    """Whether an offline runner is (or may be about to be) its instance's runner for a run.

    A runner is registered before the record notes its id, so a held record that notes none yet may
    be waiting for this very runner to start.
    """
    return (
        record is not None
        and record.state in MAY_STILL_SERVE
        and not record.threshold_passed(now)
        and record.run_key is not None
        and RunKey.parse(record.run_key).label == runner.run_key
        and record.runner_id in (None, runner.runner_id)
    )


def refusal_stands(refused_at: Epoch, now: Epoch) -> bool:
    """Whether a refusal GitHub gave at `refused_at` is still taken as GitHub's answer at `now`."""
    return now - refused_at < REFUSAL_BACKOFF_SECONDS


def in_turn(items: Sequence[_Item], turn: int) -> list[_Item]:
    """`items` begun at the `turn`th (cyclically): runs cut short each begin somewhere else."""
    if not items:
        return []
    start = turn % len(items)
    return list(items[start:]) + list(items[:start])


def batches(items: Sequence[_Item], size: int) -> Iterator[list[_Item]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
