"""The stack configuration of DESIGN.md section 9: resource classes, timeouts and defaults, validated.

Every setting has the design's default. A bad setting fails with a message that names the setting
and says how to fix it, because the operator reads it in a failed `cdk synth`, not in a debugger.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Self

from pydantic import (
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from runner_pool.domain.budget import BudgetSettings
from runner_pool.domain.clock import Epoch
from runner_pool.domain.github_settings import GitHubSettings
from runner_pool.domain.instance_settings import ImageSettings, InstanceSettings
from runner_pool.domain.labels import (
    CLASS_NAME,
    LABEL_KEYS,
    ConfigDefault,
    LabelError,
    RunnerLabel,
    RunnerSpec,
)
from runner_pool.domain.logs_settings import LogsSettings
from runner_pool.domain.records import UsageClass
from runner_pool.domain.reuse import ReuseMode, ReuseScope, ReuseSettings
from runner_pool.domain.runner_scope import OrganizationScope, Registration
from runner_pool.domain.settings import SettingError, Settings
from runner_pool.domain.sizing import HORIZON_SECONDS
from runner_pool.domain.spot_breaker import SpotBreakerSettings
from runner_pool.domain.timeouts import Timeouts
from runner_pool.domain.warm_schedule import WarmMinimum

# The settings kept in modules of their own are named here too: StackConfig's is the one entry point.
__all__ = [
    "DEFAULT_RESOURCE_CLASSES",
    "EXPRESS_LIMIT_SECONDS",
    "EXPRESS_MARGIN_SECONDS",
    "SQS_MAX_DELAY_SECONDS",
    "AlarmSettings",
    "ConfigError",
    "FleetSettings",
    "GitHubSettings",
    "LabelDefaults",
    "NetworkSettings",
    "PickupSettings",
    "PoolSettings",
    "PoolSizing",
    "ResourceClass",
    "ReuseMode",
    "ReuseScope",
    "ReuseSettings",
    "StackConfig",
    "WorkflowType",
    "load_config",
    "load_deployable_config",
]

SQS_MAX_DELAY_SECONDS = 900
EXPRESS_LIMIT_SECONDS = 300
"""How long a Step Functions Express execution may run."""
EXPRESS_MARGIN_SECONDS = 60
"""What an Express provision spends besides its waits: Lambda tasks, CreateFleet, GitHub calls."""


class ResourceClass(Settings):
    """A size of runner a job can ask for with `class=`: the minimum vCPU and memory."""

    cpu: int = Field(gt=0, description="vCPUs")
    memory_mib: int = Field(gt=0, description="memory in MiB")
    ssm: bool = False
    """Whether an operator may open Session Manager sessions on the class's instances (`runner-pool
    connect`). Off by default: it gives the class's instance role the SSM agent's permissions, which a job
    that gains root on the instance can use too (README, Security model)."""


DEFAULT_RESOURCE_CLASSES: dict[str, ResourceClass] = {
    "large": ResourceClass(cpu=2, memory_mib=4 * 1024),
    "xlarge": ResourceClass(cpu=4, memory_mib=8 * 1024),
    "2xlarge": ResourceClass(cpu=8, memory_mib=16 * 1024),
    "4xlarge": ResourceClass(cpu=16, memory_mib=32 * 1024),
    "8xlarge": ResourceClass(cpu=32, memory_mib=64 * 1024),
}


if TYPE_CHECKING:

    class LabelDefaults(Settings):
        def __getattr__(self, setting: str) -> Any: ...

else:
    LabelDefaults = create_model(
        "LabelDefaults",
        __base__=Settings,
        __doc__="What a label that leaves a key out gets: one setting per key of LABEL_KEYS with a "
        "config default.",
        __module__=__name__,
        **{
            key.attribute: key.default.setting()
            for key in LABEL_KEYS
            if isinstance(key.default, ConfigDefault)
        },
    )


class PickupSettings(Settings):
    same_instance_tolerance: int = Field(5, gt=0)
    requeue_delay_seconds: int = Field(0, ge=0, le=SQS_MAX_DELAY_SECONDS)
    """0, not DESIGN.md's 1 s: a delayed misfit is hidden from every other request too, and under
    concurrent claim workers that hid most of the pool (the pool scenario: 4 of 13 fitting instances
    claimed warm with 1 s, 13 of 13 with 0). A request stops re-reading its own misfits through
    `same_instance_tolerance` anyway."""


class PoolSizing(StrEnum):
    SCHEDULE = "schedule"
    ADAPTIVE = "adaptive"


class PoolSettings(Settings):
    """The stopped tier of the warm pool: idle on-demand instances kept stopped.

    EC2 bills a stopped instance for its EBS volumes only ("You are not charged for usage of a stopped
    instance", EC2 API Reference, StopInstances), and starts it in seconds where a launch boots and
    installs from scratch. Spot instances are never stopped: an instant fleet's spot instances come from
    one-time requests, and a Spot Instance can be stopped only if its request is persistent, or for a
    fleet, of type `maintain` (EC2 User Guide, "Behavior of Spot Instance interruptions"); EC2 answers a
    stop of another with UnsupportedOperation ("You can only stop Spot Instances associated with
    persistent Spot Instance requests").
    """

    stopped_maximum: int = Field(0, ge=0)
    """Stopped (and stopping) instances to keep per resource class; 0, the default, keeps no stopped tier:
    an idle instance whose idle time runs out is terminated."""
    stopped_max_age_minutes: int = Field(1440, ge=1)
    """How long an instance stays stopped, from its stop, before refresh terminates it. Measured from the
    stop, because the tier's cost is its volumes' time in it; the time since launch is bounded already by
    `reuse.max_age_minutes`, which caps this too."""
    sizing: PoolSizing = PoolSizing.SCHEDULE
    """How refresh decides how many hot and stopped instances each class holds: `schedule` (the default),
    its `warm_pool_minimum` in force; `adaptive`, the sizing rule over its recorded arrivals and boot times
    (domain/sizing.py), the schedule in force its floor. Adaptive is opted into: it launches instances no
    operator asked for, and a stack that upgrades keeps the numbers it was deployed with."""
    target_wait_seconds: float = Field(15.0, gt=0)
    """The p95 of a job's wait for its runner that adaptive sizing holds instances for: 15 s, issue 40's
    target, under which the day trace (bench/day_trace.py) held cost within 1.25x of no pool."""
    hot_maximum: int = Field(20, ge=0)
    """The most idle instances adaptive sizing holds per class (the schedule's floor is held above it): a
    bound on a runaway bill. 20 covers the day trace's largest matrix."""
    sizing_horizon_minutes: int = Field(int(HORIZON_SECONDS // 60), ge=1)
    """How far back adaptive sizing reads a class's arrivals, and how long it must have watched a class
    before the rule's number replaces the schedule's (domain/sizing.py HORIZON_SECONDS)."""


class FleetSettings(Settings):
    """How creation reacts when EC2 launches fewer instances than asked (DESIGN.md 6.3)."""

    spot_fallback_to_on_demand: bool = True
    """Launch a spot shortfall once more as on-demand: the job runs at the on-demand price rather
    than waiting for spot capacity that may not come back before the validation timeout."""
    rerun_interrupted_jobs: bool = True
    """Ask GitHub to re-run a run's failed jobs, once per attempt, when one failed because EC2 interrupted
    its spot instance; the re-run is served on-demand (domain/reruns.py)."""
    spot_breaker: SpotBreakerSettings = SpotBreakerSettings()
    """When a class's spot demand is served on-demand for a while (domain/spot_breaker.py)."""
    capacity_retry_seconds: float = Field(60, gt=0)
    """How long after a provision EC2 left short (no capacity) refresh first provisions its jobs again; each
    next wait is twice the last, up to fifteen times this (domain/capacity_waits.py). Refresh runs every
    minute, so a shorter first wait only helps where refresh runs more often (the emulator)."""


class NetworkSettings(Settings):
    """Where runner instances launch: the operator's VPC and one subnet per Availability Zone."""

    vpc_id: str | None = Field(None, pattern=r"^vpc-[0-9a-f]{8,17}$")
    """Required to deploy; its subnets need a route to GitHub and to AWS's APIs."""
    subnet_ids: tuple[str, ...] = ()
    """Required to deploy; CreateFleet gets one override per subnet and picks where capacity is."""

    @model_validator(mode="after")
    def _subnets_are_subnets(self) -> Self:
        for subnet_id in self.subnet_ids:
            if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", subnet_id):
                raise SettingError("subnet_ids", f"{subnet_id!r} is not a subnet id", "write subnet-<hex>")
        if len(set(self.subnet_ids)) != len(self.subnet_ids):
            raise SettingError("subnet_ids", "names a subnet twice", "list each subnet once")
        return self


class WorkflowType(StrEnum):
    """Step Functions' two kinds of state machine: Standard (up to a year, exactly-once, billed per
    transition) and Express (up to 5 minutes, at-least-once, billed per duration)."""

    STANDARD = "STANDARD"
    EXPRESS = "EXPRESS"


class AlarmSettings(Settings):
    """Where the stack's alarms notify; with neither set they only show in the CloudWatch console."""

    email: str | None = Field(None, pattern=r"^[^@\s]+@[^@\s]+$")
    """An address the stack subscribes to a topic of its own (the address confirms by e-mail)."""
    topic_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]+$")
    """An existing SNS topic to notify instead (chat, paging); its policy must let CloudWatch publish."""


class StackConfig(Settings):
    """Everything about pool behaviour an operator may set; every field has the design's default."""

    resource_classes: dict[str, ResourceClass] = Field(default_factory=lambda: dict(DEFAULT_RESOURCE_CLASSES))
    timeouts: Timeouts = Timeouts()
    defaults: LabelDefaults = LabelDefaults()
    pickup: PickupSettings = PickupSettings()
    fleet: FleetSettings = FleetSettings()
    pool: PoolSettings = PoolSettings()
    github: GitHubSettings = GitHubSettings()
    warm_pool_minimum: dict[str, WarmMinimum] = Field(default_factory=dict)
    refresh_rate_minutes: int = Field(1, gt=0)
    network: NetworkSettings = NetworkSettings()
    workflow_type: WorkflowType = WorkflowType.STANDARD
    alarms: AlarmSettings = AlarmSettings()
    instances: InstanceSettings = InstanceSettings()
    image: ImageSettings = ImageSettings()
    reuse: ReuseSettings = ReuseSettings()
    logs: LogsSettings = LogsSettings()
    budget: BudgetSettings = BudgetSettings()

    @model_validator(mode="after")
    def _classes_are_coherent(self) -> Self:
        if not self.resource_classes:
            raise SettingError("resource_classes", "is empty", "define at least one class, e.g. large")
        for name in self.resource_classes:
            if not CLASS_NAME.fullmatch(name):
                raise SettingError(
                    f"resource_classes.{name}",
                    "is not usable in a label",
                    "name classes with lowercase letters, digits and '-' (at most 32 characters)",
                )
        by_cpu = sorted(self.resource_classes.items(), key=lambda item: (item[1].cpu, item[1].memory_mib))
        for (smaller, low), (larger, high) in pairwise(by_cpu):
            if high.cpu == low.cpu:
                raise SettingError(
                    f"resource_classes.{larger}.cpu",
                    f"equals the cpu of class {smaller} ({low.cpu})",
                    "give each class its own vCPU count",
                )
            if high.memory_mib <= low.memory_mib:
                raise SettingError(
                    f"resource_classes.{larger}.memory_mib",
                    f"{high.memory_mib} MiB does not rise with cpu: class {smaller} has fewer vCPUs "
                    f"({low.cpu}) but {low.memory_mib} MiB",
                    f"give {larger} more than {low.memory_mib} MiB, or fewer vCPUs than {smaller}",
                )
        known = ", ".join(self.resource_classes)
        if self.defaults.resource_class not in self.resource_classes:
            raise SettingError(
                "defaults.resource_class",
                f"{self.defaults.resource_class!r} is not a defined class",
                f"use one of: {known}",
            )
        for name in self.warm_pool_minimum:
            if name not in self.resource_classes:
                raise SettingError(
                    f"warm_pool_minimum.{name}", "names no defined class", f"use one of: {known}"
                )
        for name in self.reuse.mode_by_class:
            if name not in self.resource_classes:
                raise SettingError(
                    f"reuse.mode_by_class.{name}", "names no defined class", f"use one of: {known}"
                )
        return self

    @model_validator(mode="after")
    def _stopped_minimum_fits_the_tier(self) -> Self:
        for name, minimum in self.warm_pool_minimum.items():
            path, stopped = minimum.most_stopped()
            if stopped == 0:
                continue
            if stopped > self.pool.stopped_maximum:
                raise SettingError(
                    f"warm_pool_minimum.{name}.{path}",
                    f"is {stopped}, above pool.stopped_maximum ({self.pool.stopped_maximum}), so refresh "
                    "would launch instances the tier has no room to keep",
                    f"raise pool.stopped_maximum to at least {stopped}, or keep fewer stopped",
                )
            # A class's pool instances take the stack's label defaults (LaunchRequest.for_pool), usage
            # included; the tier is on-demand only (PoolSettings), and a job whose usage resolves to spot
            # never picks an on-demand instance, so a stopped minimum under spot would serve no default job.
            if self.defaults.usage is UsageClass.SPOT:
                raise SettingError(
                    f"warm_pool_minimum.{name}.{path}",
                    f"is {stopped}, but defaults.usage is spot: a Spot Instance of an instant fleet cannot "
                    "be stopped, and the class's pool instances and default jobs are spot",
                    'set defaults.usage to "on-demand", or keep no stopped minimum',
                )
        return self

    @model_validator(mode="after")
    def _instant_tier_has_a_home(self) -> Self:
        """The tier's runners are for any repository the stack serves, so they are registered where that is
        what GitHub does: at the one repository of a repository scope, or at the organisation in the
        tier's own runner group (adapters/github_runner_groups.py `InstantRunnerGroup`). Registering at
        each job's repository is not possible for a runner registered before its job is known."""
        github = self.github
        if not isinstance(github.scope, OrganizationScope):
            return self
        if github.effective_registration is Registration.RUNNER_GROUP:
            return self
        for name, minimum in self.warm_pool_minimum.items():
            if minimum.keeps_instant():
                raise SettingError(
                    f"warm_pool_minimum.{name}.instant",
                    f"keeps an instant tier, but github.registration is "
                    f"{github.effective_registration.value}: a runner registered ahead of its job "
                    "cannot be registered at the job's repository",
                    "leave github.registration out (runner-group), or keep no instant tier",
                )
        return self

    @model_validator(mode="after")
    def _express_fits_its_limit(self) -> Self:
        if self.workflow_type is not WorkflowType.EXPRESS:
            return self
        t = self.timeouts
        longest = {
            "provision": (
                t.claim_registration_seconds + t.fleet_validation_seconds,
                "timeouts.claim_registration_seconds + timeouts.fleet_validation_seconds",
            ),
            "release": (t.release_receipt_seconds, "timeouts.release_receipt_seconds"),
        }
        for machine, (waits, settings) in longest.items():
            if waits + EXPRESS_MARGIN_SECONDS > EXPRESS_LIMIT_SECONDS:
                raise SettingError(
                    "workflow_type",
                    f"an EXPRESS execution stops after {EXPRESS_LIMIT_SECONDS} s, but {machine} waits "
                    f"{waits:g} s ({settings}) plus up to {EXPRESS_MARGIN_SECONDS} s of work",
                    f"use STANDARD, or shorten those waits to at most "
                    f"{EXPRESS_LIMIT_SECONDS - EXPRESS_MARGIN_SECONDS} s in all",
                )
        return self

    def deploy_problems(self) -> list[str]:
        """What a deployable stack needs and this config leaves unset, each with its fix."""
        required = {
            "github.app_id": (self.github.apps or self.github.app_id, "the App's id, from its settings page"),
            "github.installation_id": (
                self.github.apps or self.github.installation_id,
                "the id in the installation's URL",
            ),
            "github.scope": (self.github.scope, "`org` or `owner/repo`, where runners register"),
            "network.vpc_id": (self.network.vpc_id, "the VPC runners launch in"),
            "network.subnet_ids": (self.network.subnet_ids, "one subnet per Availability Zone"),
        }
        return [
            f"{setting}: is required to deploy; fix: set {what}"
            for setting, (value, what) in required.items()
            if not value
        ]

    @property
    def session_classes(self) -> frozenset[str]:
        """The classes whose instances run with the instance role that Session Manager can reach."""
        return frozenset(name for name, resource_class in self.resource_classes.items() if resource_class.ssm)

    def warm_minimum(self, resource_class: str, now: Epoch) -> int:
        """Idle instances of a class refresh keeps at `now`: its schedule's window then, if any."""
        return self._in_force(resource_class, now, WarmMinimum.in_force)

    def stopped_minimum(self, resource_class: str, now: Epoch) -> int:
        """Stopped instances of a class refresh keeps at `now`: its schedule's window then, if any."""
        return self._in_force(resource_class, now, WarmMinimum.stopped_in_force)

    def pristine_minimum(self, resource_class: str, now: Epoch) -> int:
        """Pristine idle instances of a class refresh keeps at `now` (a floor among the warm minimum's)."""
        return self._in_force(resource_class, now, WarmMinimum.pristine_in_force)

    def pristine_stopped_minimum(self, resource_class: str, now: Epoch) -> int:
        """Pristine stopped instances of a class refresh keeps at `now` (a floor among the tier's)."""
        return self._in_force(resource_class, now, WarmMinimum.pristine_stopped_in_force)

    def instant_tier(self, resource_class: str, now: Epoch) -> int:
        """Instant-tier runners of a class refresh keeps waiting registered at `now`."""
        return self._in_force(resource_class, now, WarmMinimum.instant_in_force)

    def _in_force(self, resource_class: str, now: Epoch, which: Callable[[WarmMinimum, Epoch], int]) -> int:
        """`which` of the class's minimums at `now`; a class without a warm minimum keeps none of any kind."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return 0 if minimum is None else which(minimum, now)

    def keeps_pristine(self, resource_class: str) -> bool:
        """Whether the class keeps pristine instances at any hour: only then do single-use jobs look in its
        pool, where a used instance is nothing they may take."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return minimum is not None and minimum.keeps_pristine()

    def resolve(self, label: RunnerLabel) -> RunnerSpec:
        """Fill the label's missing keys with their defaults; an unknown class is a LabelError."""
        resolved = {
            key.attribute: key.default_value(self.defaults) if value is None else value
            for key in LABEL_KEYS
            for value in [getattr(label, key.attribute)]
        }
        class_name = resolved["resource_class"]
        resource_class = self.resource_classes.get(class_name)
        if resource_class is None:
            raise LabelError(
                label.format(),
                f"class={class_name!r} is not defined; use one of {', '.join(self.resource_classes)}",
            )
        return RunnerSpec(
            run_key=label.format(),
            run_id=label.run_id,
            cpu=resource_class.cpu,
            memory_mib=resource_class.memory_mib,
            **resolved,
        )

    def spec_for(self, label_text: str) -> RunnerSpec:
        """Parse and resolve a `runs-on` label in one step; raises LabelError with the reason."""
        return self.resolve(RunnerLabel.parse(label_text))


class ConfigError(ValueError):
    """A stack configuration that cannot be deployed; the message lists each bad setting and its fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid runner-pool configuration:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


def load_config(settings: Mapping[str, Any] | None = None) -> StackConfig:
    """Validate operator settings (from cdk.json context or a config file) into a StackConfig."""
    try:
        return StackConfig.model_validate(dict(settings or {}))
    except ValidationError as exc:
        raise ConfigError([_describe(error) for error in exc.errors()]) from None


def load_deployable_config(settings: Mapping[str, Any] | None = None) -> StackConfig:
    """Like load_config, and every setting a deployed stack cannot do without is set."""
    config = load_config(settings)
    problems = config.deploy_problems()
    if problems:
        raise ConfigError(problems)
    return config


def _describe(error: Any) -> str:
    location = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, SettingError):
        setting = ".".join(part for part in (location, cause.setting) if part)
        return f"{setting}: {cause.problem}; fix: {cause.fix}"
    value = error.get("input")
    bound = {
        key: f"{value:g}" for key, value in error.get("ctx", {}).items() if isinstance(value, int | float)
    }
    fixes = {
        "greater_than": f"set a number above {bound.get('gt')}",
        "greater_than_equal": f"set a number of at least {bound.get('ge')}",
        "less_than_equal": f"set a number of at most {bound.get('le')}",
        "extra_forbidden": "remove it or check its spelling against the README's configuration table",
        "int_parsing": "write a whole number",
        "int_from_float": "write a whole number",
        "float_parsing": "write a number of seconds",
        "enum": f"use one of the values listed ({error.get('ctx', {}).get('expected')})",
    }
    fix = fixes.get(kind, "see the README's configuration table")
    return f"{location}: {error['msg'].lower()} (got {value!r}); fix: {fix}"
