"""The stack configuration of DESIGN.md section 9: resource classes, timeouts and defaults, validated.

Every setting has the design's default. A bad setting fails with a message that names the setting
and says how to fix it, because the operator reads it in a failed `cdk synth`, not in a debugger.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from itertools import pairwise
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from runner_pool.domain.clock import Epoch
from runner_pool.domain.github_apps import GitHubAppEntry, repeated
from runner_pool.domain.labels import (
    CLASS_NAME,
    LABEL_KEYS,
    ConfigDefault,
    LabelError,
    RunnerLabel,
    RunnerSpec,
)
from runner_pool.domain.records import Arch, InstanceRecord, UsageClass
from runner_pool.domain.runner_scope import (
    OrganizationScope,
    Registration,
    RepositoryScope,
    RunnerScopeSetting,
    registration_for,
)
from runner_pool.domain.trust import WORKFLOW_EVENTS, TrustLevel, reuses

SQS_MAX_DELAY_SECONDS = 900
EXPRESS_LIMIT_SECONDS = 300
"""How long a Step Functions Express execution may run."""
EXPRESS_MARGIN_SECONDS = 60
"""What an Express provision spends besides its waits: Lambda tasks, CreateFleet, GitHub calls."""
FINISH_MARGIN_SECONDS = 30
"""What a provision needs after its waits: the Map's last hand-offs and Finish's own Lambda."""


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ResourceClass(_Settings):
    """A size of runner a job can ask for with `class=`: the minimum vCPU and memory."""

    cpu: int = Field(gt=0, description="vCPUs")
    memory_mib: int = Field(gt=0, description="memory in MiB")


DEFAULT_RESOURCE_CLASSES: dict[str, ResourceClass] = {
    "large": ResourceClass(cpu=2, memory_mib=4 * 1024),
    "xlarge": ResourceClass(cpu=4, memory_mib=8 * 1024),
    "2xlarge": ResourceClass(cpu=8, memory_mib=16 * 1024),
    "4xlarge": ResourceClass(cpu=16, memory_mib=32 * 1024),
    "8xlarge": ResourceClass(cpu=32, memory_mib=64 * 1024),
}


class Timeouts(_Settings):
    """How long each wait of the lifecycle lasts, in seconds."""

    heartbeat_period_seconds: float = Field(30, gt=0)
    """The agent's heartbeat; with notices (domain/notices.py) no claim waits on it: slow and cheap."""
    healthy_window_seconds: float = Field(90, gt=0)
    claim_registration_seconds: float = Field(30, gt=0)
    """How long a claim waits for the agent's runner to listen: more than the agent's watch period (15 s),
    so a claim whose notice was lost is still served by the agent's next look at its record."""
    fleet_validation_seconds: float = Field(180, gt=0)
    fleet_validation_poll_seconds: float = Field(5, gt=0)
    release_receipt_seconds: float = Field(120, gt=0)
    release_receipt_poll_seconds: float = Field(2, gt=0)
    """How often a release looks for the agent's receipt; the agent hears of its release at once (a
    notice) and cleans up in a second or two."""
    created_threshold_seconds: float = Field(600, gt=0)
    claimed_threshold_seconds: float = Field(300, gt=0)
    idle_seconds: float = Field(600, gt=0)
    stopping_seconds: float = Field(600, gt=0)
    """How long an instance chosen for the stopped tier may take to stop before refresh terminates it
    instead. EC2 stops an instance by an OS shutdown: "When you stop an instance, we shut it down", and
    "we attempt to shut it down forcibly after a short while" (EC2 API Reference, StopInstances)."""
    start_registration_seconds: float = Field(180, gt=0)
    """How long a stopped instance, claimed and started, has to register its runner: EC2's pending, the
    OS's boot and the agent's start, where a hot claim's `claim_registration_seconds` has none of these."""
    terminated_retention_days: int = Field(7, gt=0)

    @model_validator(mode="after")
    def _waits_fit_together(self) -> Self:
        if self.healthy_window_seconds <= self.heartbeat_period_seconds:
            raise _SettingError(
                "healthy_window_seconds",
                f"{self.healthy_window_seconds:g} s is not longer than heartbeat_period_seconds "
                f"({self.heartbeat_period_seconds:g} s), so every instance would look dead",
                "make it at least 3 x heartbeat_period_seconds",
            )
        if self.fleet_validation_poll_seconds >= self.fleet_validation_seconds:
            raise _SettingError(
                "fleet_validation_poll_seconds",
                "polls no more often than the validation timeout, so validation would check at most once",
                "make it a fraction of fleet_validation_seconds",
            )
        # A warm instance claimed for a batch stays claimed until Finish, which runs once the batch's
        # cold part has passed fleet validation; a created one likewise. Their thresholds must outlast
        # both waits and Finish's own work, or a live runner is expired under its job (issue 12, defect 7).
        provision = self.claim_registration_seconds + self.fleet_validation_seconds + FINISH_MARGIN_SECONDS
        for setting in ("claimed_threshold_seconds", "created_threshold_seconds"):
            if getattr(self, setting) < provision:
                raise _SettingError(
                    setting,
                    f"{getattr(self, setting):g} s is shorter than a provision can take: "
                    f"claim_registration_seconds + fleet_validation_seconds + {FINISH_MARGIN_SECONDS} s "
                    f"for Finish = {provision:g} s, "
                    "so an instance would expire before Finish sets it running",
                    f"make it at least {provision:g} s, or shorten those waits",
                )
        if self.idle_seconds <= self.release_receipt_seconds:
            raise _SettingError(
                "idle_seconds",
                f"{self.idle_seconds:g} s is not longer than release_receipt_seconds "
                f"({self.release_receipt_seconds:g} s), so a released instance's idle time would run out "
                "while its release still waits for the agent's receipt",
                "make it longer than release_receipt_seconds",
            )
        return self


if TYPE_CHECKING:

    class LabelDefaults(_Settings):
        def __getattr__(self, setting: str) -> Any: ...

else:
    LabelDefaults = create_model(
        "LabelDefaults",
        __base__=_Settings,
        __doc__="What a label that leaves a key out gets: one setting per key of LABEL_KEYS with a "
        "config default.",
        __module__=__name__,
        **{
            key.attribute: key.default.setting()
            for key in LABEL_KEYS
            if isinstance(key.default, ConfigDefault)
        },
    )


class PickupSettings(_Settings):
    same_instance_tolerance: int = Field(5, gt=0)
    requeue_delay_seconds: int = Field(0, ge=0, le=SQS_MAX_DELAY_SECONDS)
    """0, not DESIGN.md's 1 s: a delayed misfit is hidden from every other request too, and under
    concurrent claim workers that hid most of the pool (the pool scenario: 4 of 13 fitting instances
    claimed warm with 1 s, 13 of 13 with 0). A request stops re-reading its own misfits through
    `same_instance_tolerance` anyway."""


class PoolSettings(_Settings):
    """The stopped tier of the warm pool (issue 16, item 2): idle on-demand instances kept stopped.

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


class FleetSettings(_Settings):
    """How creation reacts when EC2 launches fewer instances than asked (DESIGN.md 6.3)."""

    spot_fallback_to_on_demand: bool = True
    """Launch a spot shortfall once more as on-demand: the job runs at the on-demand price rather
    than waiting for spot capacity that may not come back before the validation timeout."""
    rerun_interrupted_jobs: bool = True
    """Ask GitHub to re-run a run's failed jobs, once per attempt, when one failed because EC2 interrupted
    its spot instance; the re-run is served on-demand (domain/reruns.py)."""


class ReuseScope(StrEnum):
    """Which jobs an instance that served a job may serve next (README, Security model)."""

    REPOSITORY = "repository"
    """Only jobs of the repository it served: GitHub's guidance for reused runners, and the default."""
    OWNER = "owner"
    """Jobs of any repository of the same owner (organisation or user)."""
    ANY = "any"
    """Jobs of any repository the App is installed on."""


class ReuseMode(StrEnum):
    """Whether the instances of a class (or of the whole stack) serve more than one job."""

    REUSE = "reuse"
    """Jobs that may follow one another (the same repository and level of trust) share instances."""
    SINGLE_USE = "single-use"
    """Every job gets an instance no job has used, pristine from the pool when there is one, terminated
    after its job: a hot pool of one-job instances. Keep a pristine minimum (`warm_pool_minimum`) so
    that jobs find one."""


class ReuseSettings(_Settings):
    """How far one instance is reused between jobs (issue 14, item 2).

    GitHub: self-hosted runners "can be persistently compromised by untrusted code in a workflow"
    (docs.github.com, "Security hardening for GitHub Actions", Hardening for self-hosted runners).
    Reuse is therefore kept within one repository by default, never offered to public repositories,
    and bounded, so that whatever a scrub could not see lives a few jobs and a few hours at most.
    """

    scope: ReuseScope = ReuseScope.REPOSITORY
    public_repositories: bool = False
    """Whether a public repository's job may take a reused instance and leave its own to the pool."""
    max_jobs: int = Field(20, ge=1)
    """Jobs one instance serves at most; then it is terminated instead of pooled."""
    max_age_minutes: int = Field(360, ge=1)
    """How long after its launch an instance is still pooled or picked up; then it is terminated."""
    trust_by_event: dict[str, TrustLevel] = Field(default_factory=dict)
    """A run's event → the level of its jobs (domain/trust.py), over the built-in table; a fork's or
    Dependabot's run stays untrusted whatever its event."""
    mode: ReuseMode = ReuseMode.REUSE
    """`single-use`: no instance serves a second job, in any class but those `mode_by_class` sets."""
    mode_by_class: dict[str, ReuseMode] = Field(default_factory=dict)
    """A resource class → its own mode, over `mode`."""

    @model_validator(mode="after")
    def _events_github_sends(self) -> ReuseSettings:
        unknown = sorted(set(self.trust_by_event) - WORKFLOW_EVENTS)
        if unknown:
            raise _SettingError(
                "trust_by_event",
                f"names {', '.join(map(repr, unknown))}, which GitHub never sends as a run's event",
                'use an event of "Events that trigger workflows" (push, pull_request, ...)',
            )
        return self

    def single_use_class(self, resource_class: str) -> bool:
        """Whether the class's instances serve one job each."""
        return self.mode_by_class.get(resource_class, self.mode) is ReuseMode.SINGLE_USE

    def in_scope(
        self,
        served: str | None,
        repository: str,
        *,
        served_id: int | None = None,
        repository_id: int | None = None,
    ) -> bool:
        """Whether an instance that last served `served` (None: no job yet) may serve `repository`. Within
        one repository, by id when both sides have one (a repository renamed keeps its id; a new one that
        took an old name does not get it), else by name."""
        if served is None or self.scope is ReuseScope.ANY:
            return True
        if self.scope is ReuseScope.OWNER:
            return served.split("/", 1)[0].lower() == repository.split("/", 1)[0].lower()
        if served_id is not None and repository_id is not None:
            return served_id == repository_id
        return served.lower() == repository.lower()

    def retire_reason(self, record: InstanceRecord, now: Epoch) -> str | None:
        """Why an instance that has just served a job must not go back to the pool; None if it may."""
        if record.single_use:
            return f"single use: served {record.repository}, whose jobs never share an instance"
        if not record.pristine and not reuses(record.trust):
            level = "an undecided level" if record.trust is None else f"level {record.trust}"
            return f"served a job of {level}, which no later job may follow"
        if record.jobs_served >= self.max_jobs:
            return f"served {record.jobs_served} jobs, reuse.max_jobs is {self.max_jobs}"
        if self.too_old(record.created_at, now):
            return f"launched more than reuse.max_age_minutes ({self.max_age_minutes}) ago"
        return None

    def too_old(self, launched_at: Epoch | None, now: Epoch) -> bool:
        return launched_at is not None and now - launched_at >= self.max_age_minutes * 60


class GitHubSettings(_Settings):
    """The GitHub App the control plane acts as, and where its runners are registered."""

    app_id: str | None = None
    """The App's id (or client id); required to deploy."""
    installation_id: int | None = Field(None, gt=0)
    """The App's installation on the organisation or repository; required to deploy."""
    scope: RunnerScopeSetting | None = None
    """`org` for organisation runners, `owner/repo` for one repository's; required to deploy."""
    api_url: str = "https://api.github.com/"
    """`https://<host>/api/v3/` for GitHub Enterprise Server."""
    api_version: str | None = None
    """The `X-GitHub-Api-Version` to send; GitHub Enterprise Server answers only its release's."""
    runner_group_id: int = Field(1, gt=0)
    registration: Registration | None = None
    """Where each job's runner is registered so that only its repository can take it. Left out, it follows
    the scope with the least privilege (`effective_registration`): an organisation's registers in
    `runner-group`s, at the organisation in a runner group of the job's repository alone, made on first use
    (the App needs only `organization_self_hosted_runners: write`; `runner_group_id` is then not used); a
    repository's at that `repository` (the App needs repository `administration: write`: the only way for a
    personal account, which has no runner groups). `repository` on an organisation is the choice to
    register at each job's repository instead."""
    runner_groups_allow_public_repositories: bool = False
    """Whether the runner groups `runner-group` creates take public repositories' jobs (GitHub's default
    for a group is no)."""
    registrations_per_minute: float = Field(150, gt=0)
    """JIT runner registrations the stack makes a minute on average, shared by every provision; GitHub's
    secondary rate limits allow about 180 (900 points a minute per endpoint, 5 points a POST)."""
    registration_burst: int = Field(20, ge=1)
    """How many registrations may go at once after a quiet spell, within the average."""
    private_key_secret_name: str = "runner-pool/github-app-private-key"  # noqa: S105 - a name, not a secret
    webhook_secret_name: str = "runner-pool/github-webhook-secret"  # noqa: S105 - a name, not a secret
    apps: tuple[GitHubAppEntry, ...] = ()
    """Several Apps installed on the scope (domain/github_apps.py), in place of `app_id`, `installation_id`
    and the two secret names: each registration goes through the one with the most budget left."""

    @property
    def every_app(self) -> tuple[GitHubAppEntry, ...]:
        """`apps`, or the one App of the single-App settings (none while its ids are unset)."""
        if self.apps or self.app_id is None or self.installation_id is None:
            return self.apps
        return (
            GitHubAppEntry(
                app_id=self.app_id,
                installation_id=self.installation_id,
                private_key_secret_name=self.private_key_secret_name,
                webhook_secret_name=self.webhook_secret_name,
            ),
        )

    @property
    def webhook_secret_names(self) -> tuple[str, ...]:
        """Every App's webhook secret: a delivery signed with any of them is GitHub's."""
        return tuple(app.webhook_secret_name for app in self.every_app) or (self.webhook_secret_name,)

    @model_validator(mode="after")
    def _one_form_of_apps(self) -> Self:
        if self.apps and (self.app_id is not None or self.installation_id is not None):
            raise _SettingError(
                "apps",
                "is set together with app_id or installation_id",
                "list every App under apps (the first as well), or keep the single-App settings",
            )
        shared = repeated(self.apps)
        if shared is not None:
            raise _SettingError(
                "apps",
                f"lists {shared[0]} {shared[1]!r} twice",
                "give each App its own id, installation and secrets",
            )
        return self

    @model_validator(mode="after")
    def _runner_groups_are_an_organisations(self) -> Self:
        if self.registration is Registration.RUNNER_GROUP and isinstance(self.scope, RepositoryScope):
            raise _SettingError(
                "registration",
                f"runner groups are an organisation's, and the scope {self.scope} is one repository",
                "set scope to the organisation, or leave registration out to register at the repository",
            )
        return self

    @property
    def effective_registration(self) -> Registration:
        """The registration in use: the one set, else the least privileged the scope allows."""
        return registration_for(self.scope, self.registration)


class NetworkSettings(_Settings):
    """Where runner instances launch: the operator's VPC and one subnet per Availability Zone."""

    vpc_id: str | None = Field(None, pattern=r"^vpc-[0-9a-f]{8,17}$")
    """Required to deploy; its subnets need a route to GitHub and to AWS's APIs."""
    subnet_ids: tuple[str, ...] = ()
    """Required to deploy; CreateFleet gets one override per subnet and picks where capacity is."""

    @model_validator(mode="after")
    def _subnets_are_subnets(self) -> Self:
        for subnet_id in self.subnet_ids:
            if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", subnet_id):
                raise _SettingError("subnet_ids", f"{subnet_id!r} is not a subnet id", "write subnet-<hex>")
        if len(set(self.subnet_ids)) != len(self.subnet_ids):
            raise _SettingError("subnet_ids", "names a subnet twice", "list each subnet once")
        return self


class WorkflowType(StrEnum):
    """Step Functions' two kinds of state machine: Standard (up to a year, exactly-once, billed per
    transition) and Express (up to 5 minutes, at-least-once, billed per duration)."""

    STANDARD = "STANDARD"
    EXPRESS = "EXPRESS"


class AlarmSettings(_Settings):
    """Where the stack's alarms notify; with neither set they only show in the CloudWatch console."""

    email: str | None = Field(None, pattern=r"^[^@\s]+@[^@\s]+$")
    """An address the stack subscribes to a topic of its own (the address confirms by e-mail)."""
    topic_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]+$")
    """An existing SNS topic to notify instead (chat, paging); its policy must let CloudWatch publish."""


AL2023_AMI_PARAMETERS: Mapping[Arch, str] = MappingProxyType(
    {
        Arch.X64: "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        Arch.ARM64: "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    }
)
"""AWS's public SSM parameters naming the latest Amazon Linux 2023 image of each architecture."""


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest in lowercase hex."""

DEFAULT_RUNNER_VERSION = "2.328.0"
KNOWN_RUNNER_CHECKSUMS: Mapping[str, Mapping[Arch, str]] = MappingProxyType(
    {
        # The "SHA-256 Checksums" section of https://github.com/actions/runner/releases/tag/v2.328.0
        # (actions/runner's releaseNote.md fills one line per package at release time); the same two
        # digests appear in the "Validate the hash" step GitHub's "New self-hosted runner" page shows.
        DEFAULT_RUNNER_VERSION: MappingProxyType(
            {
                Arch.X64: "01066fad3a2893e63e6ca880ae3a1fad5bf9329d60e77ee15f2b97c148c3cd4e",
                Arch.ARM64: "b801b9809c4d9301932bccadf57ca13533073b2aa9fa9b8e625a8db905b5d8eb",
            }
        ),
    }
)
"""SHA-256 of `actions-runner-linux-<arch>-<version>.tar.gz` for the runner releases this code knows,
so that the default version is checked without the operator copying digests into the config."""


class InstanceSettings(_Settings):
    """How runner instances are built: the launch templates and the user data that bootstraps them."""

    runner_version: str = Field(DEFAULT_RUNNER_VERSION, pattern=r"^\d+\.\d+\.\d+$")
    """The GitHub Actions runner release installed at boot."""
    runner_checksums: dict[Arch, Sha256] = Field(default_factory=dict)
    """SHA-256 of the runner archive per architecture; the user data refuses an archive that differs.
    Needed for every architecture unless KNOWN_RUNNER_CHECKSUMS has the version's."""
    ami_parameters: dict[Arch, str] = Field(default_factory=lambda: dict(AL2023_AMI_PARAMETERS))
    """SSM parameter holding the AMI id of each architecture; an architecture left out keeps AL2023's."""
    root_device_name: str = Field("/dev/xvda", pattern=r"^/dev/[a-z0-9]+$")
    """The AMI's root device: `/dev/xvda` on Amazon Linux, `/dev/sda1` on Ubuntu."""
    root_volume_gib: int = Field(40, ge=8, le=16384)
    ebs_kms_key_arn: str | None = Field(
        None,
        pattern=r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/"
        r"(mrk-[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$",
    )
    """The customer managed KMS key that encrypts root volumes, by its key ARN (an alias ARN cannot name a
    key in an IAM policy); the roles that launch and start instances get what EBS needs on it. None: EBS
    uses the account's default key, which must then be AWS managed (`runner-pool doctor` says so)."""
    pre_runner_script: str = ""
    """Run once at boot, as root, before any runner; its failure is signalled UD_FAILED."""
    termination_grace_seconds: int = Field(300, ge=0)
    """How long past its threshold an instance waits for the control plane before it ends itself."""
    block_imds_from_jobs: bool = True
    """Let only root (the agent) reach the instance metadata service: a job, running as the runner
    user, must not take the instance role's credentials and act as the instance (forge its signals,
    read its runner config). Jobs that need AWS use GitHub's OIDC provider instead."""

    @field_validator("ami_parameters")
    @classmethod
    def _every_arch_has_an_ami(cls, parameters: dict[Arch, str]) -> dict[Arch, str]:
        return {**AL2023_AMI_PARAMETERS, **parameters}

    @model_validator(mode="after")
    def _every_arch_has_a_checksum(self) -> Self:
        missing = [arch.value for arch in Arch if self.runner_checksum(arch) is None]
        if missing:
            raise _SettingError(
                "runner_checksums",
                f"has no SHA-256 for runner {self.runner_version} on {', '.join(missing)}, and an "
                "instance installs only an archive whose checksum it can check",
                "copy each digest from the SHA-256 Checksums of https://github.com/actions/runner/"
                f'releases/tag/v{self.runner_version}, e.g. {{"{missing[0]}": "<64 hex digits>"}}',
            )
        return self

    def runner_checksum(self, arch: Arch) -> str | None:
        """The SHA-256 the runner archive of `arch` must have: the configured one, else the known one."""
        return self.runner_checksums.get(arch) or KNOWN_RUNNER_CHECKSUMS.get(self.runner_version, {}).get(
            arch
        )


DEFAULT_IMAGE_BUILD_INSTANCE_TYPES: Mapping[Arch, tuple[str, ...]] = MappingProxyType(
    {Arch.X64: ("c7i.large", "m7i.large", "c6i.large"), Arch.ARM64: ("c7g.large", "m7g.large", "c6g.large")}
)
"""The instances Image Builder may build each architecture's image on: 2 vCPUs are enough to unpack the
runner and install the wheelhouse, and Image Builder picks the first of them with capacity."""


class ImageSettings(_Settings):
    """The runner image the stack builds with EC2 Image Builder (infra/constructs/runner_image.py).

    It bakes what the user data would install at every boot (the runner's prerequisites, the pinned runner,
    the agent's wheelhouse), so that a baked instance only configures and starts its agent.
    """

    docker: bool = False
    """Also install the distribution's Docker engine and enable its service (`docker` on AL2023,
    `docker.io` on Ubuntu 24.04). The runner account is never put in the `docker` group: see the
    README's security model."""
    schedule: str = Field("cron(0 4 * * ? *)", min_length=1, max_length=1024)
    """When Image Builder checks for changes (Image Builder's cron syntax, UTC): it builds only when a
    component's version (each deploy stamps a new one) or the base AMI changed since its last image."""
    images_kept: int = Field(3, ge=1, le=100)
    """Images of each architecture kept; older ones are deregistered with their snapshots."""
    build_instance_types: dict[Arch, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_IMAGE_BUILD_INSTANCE_TYPES)
    )
    """The instance types Image Builder may build each architecture's image on; an architecture left
    out keeps the default."""

    @field_validator("build_instance_types")
    @classmethod
    def _every_arch_has_build_types(cls, types: dict[Arch, tuple[str, ...]]) -> dict[Arch, tuple[str, ...]]:
        merged = {**DEFAULT_IMAGE_BUILD_INSTANCE_TYPES, **types}
        for arch, names in merged.items():
            if not names:
                raise ValueError(f"names no instance type for {arch.value}")
        return merged


class Weekday(StrEnum):
    """A day of the week as a schedule names it; in `datetime.weekday()` order, Monday first."""

    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


MINUTES_PER_DAY = 24 * 60
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY
_CLOCK_TIME = re.compile(r"(?P<hour>[01]\d|2[0-3]):(?P<minute>[0-5]\d)")


def _minute_of_day(text: str, *, end: bool) -> int | None:
    """`HH:MM` as minutes after midnight; an end may also be `24:00`. None if it is neither."""
    if end and text == "24:00":
        return MINUTES_PER_DAY
    match = _CLOCK_TIME.fullmatch(text)
    return None if match is None else int(match["hour"]) * 60 + int(match["minute"])


class WarmWindow(_Settings):
    """A weekly window of local time in which a class keeps its own warm minimum.

    It opens at `start` on each of its `days` and closes at `end`; an `end` at or before `start`
    closes on the next day (`22:00` to `06:00` on fri runs into Saturday morning). Local time is the
    schedule's time zone's wall clock, so a window keeps its hours across a daylight-saving change.
    """

    days: tuple[Weekday, ...] = tuple(Weekday)
    start: str
    """Local time of day the window opens, `HH:MM`."""
    end: str
    """Local time of day it closes, `HH:MM` or `24:00`; the window does not include it."""
    hot: int = Field(ge=0)
    """Idle (running) instances to keep while the window is open."""
    stopped: int = Field(0, ge=0)
    """Stopped instances to keep while the window is open (the stopped tier, README "The stopped tier")."""
    pristine: int = Field(0, ge=0)
    """Of the idle instances, how many at least are pristine while the window is open (WarmMinimum)."""
    pristine_stopped: int = Field(0, ge=0)
    """Of the stopped tier, how many at least are pristine while the window is open (WarmMinimum)."""
    instant: int = Field(0, ge=0)
    """Instant-tier runners waiting registered while the window is open (WarmMinimum)."""

    @model_validator(mode="after")
    def _times_are_times(self) -> Self:
        for setting in ("start", "end"):
            if _minute_of_day(getattr(self, setting), end=setting == "end") is None:
                raise _SettingError(
                    setting,
                    f"{getattr(self, setting)!r} is not a time of day",
                    "write HH:MM on a 24-hour clock, 00:00 to 23:59 (an end may be 24:00)",
                )
        if self.start_minute == self.end_minute:
            raise _SettingError(
                "end",
                f"equals start ({self.start}), so the window would be empty or never close",
                "for a whole day write start 00:00 and end 24:00",
            )
        if not self.days or len(set(self.days)) != len(self.days):
            raise _SettingError(
                "days", "is empty or names a day twice", 'list each day once, e.g. ["mon", "tue"]'
            )
        return self

    @property
    def start_minute(self) -> int:
        return _minute_of_day(self.start, end=False) or 0

    @property
    def end_minute(self) -> int:
        return _minute_of_day(self.end, end=True) or 0

    def spans(self) -> list[tuple[int, int]]:
        """The minutes of the week it is open, one `[from, to)` per day; `to` passes the week's end
        for a Sunday window that closes on Monday."""
        length = (self.end_minute - self.start_minute) % MINUTES_PER_DAY or MINUTES_PER_DAY
        starts = [list(Weekday).index(day) * MINUTES_PER_DAY + self.start_minute for day in self.days]
        return [(start, start + length) for start in sorted(starts)]

    def is_open(self, minute_of_week: int) -> bool:
        return any(
            start <= minute < end
            for start, end in self.spans()
            for minute in (minute_of_week, minute_of_week + MINUTES_PER_WEEK)
        )


class WarmMinimum(_Settings):
    """A class's warm minimum: `hot` idle instances and `stopped` stopped ones, or other numbers in each
    window of a schedule.

    A plain number in the config (`{"large": 2}`) is this with `hot` 2, no stopped ones and no windows.

    `pristine` and `pristine_stopped` are floors among those: of the idle instances, at least `pristine`
    have never served a job, and of the stopped tier at least `pristine_stopped`. A pristine instance
    counts toward `hot` (or `stopped`) too, so refresh keeps max(`hot`, `pristine`) idle instances of
    which `pristine` never served; `{"hot": 4, "pristine": 2}` is four idle, two of them pristine, and
    `{"pristine": 2}` alone two idle, both pristine. Single-use jobs (README, "Security model") take only
    pristine instances, and look in the pool only when their class keeps a pristine minimum at some hour
    (`keeps_pristine`): without one, they go straight to a launch, as fast as before. Jobs that reuse
    take a used instance of their own repository and level first, so the pristine ones are left for
    single-use jobs while there is another.
    """

    hot: int = Field(0, ge=0)
    """Idle instances to keep when no window is open (all the time, without windows)."""
    stopped: int = Field(0, ge=0)
    """Stopped instances to keep when no window is open: launched for the stopped tier, and stopped as
    soon as they are ready."""
    pristine: int = Field(0, ge=0)
    """Of the idle instances, how many at least are pristine when no window is open."""
    pristine_stopped: int = Field(0, ge=0)
    """Of the stopped tier, how many at least are pristine when no window is open."""
    instant: int = Field(0, ge=0)
    """The instant tier when no window is open: pristine instances, besides the idle ones above, whose
    runner waits registered with the class's generic label (domain/labels.py `instant_label`), so GitHub
    gives a job that asks for it to one of them with no step of ours in between. Each serves one job and
    is terminated (domain/instant.py)."""
    time_zone: str = "UTC"
    """The IANA time zone the windows' days and times are in, e.g. `Europe/Berlin`."""
    windows: tuple[WarmWindow, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _a_number_is_a_constant_minimum(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise _SettingError("", f"is {value}", "set 0 or more idle instances")
            return {"hot": value}
        if not isinstance(value, Mapping | WarmMinimum):
            raise _SettingError(
                "",
                f"is {value!r}",
                'write a number of idle instances, or a schedule such as {"time_zone": "Europe/Berlin", '
                '"windows": [{"days": ["mon"], "start": "08:00", "end": "18:00", "hot": 2}]}',
            )
        return value

    @model_validator(mode="after")
    def _schedule_is_coherent(self) -> Self:
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise _SettingError(
                "time_zone",
                f"{self.time_zone!r} is not an IANA time zone",
                "use a name from the tz database, e.g. Europe/Berlin, America/New_York or UTC",
            ) from None
        for later, window in enumerate(self.windows):
            for earlier in range(later):
                overlap = _first_overlap(self.windows[earlier], window)
                if overlap is not None:
                    day = list(Weekday)[overlap // MINUTES_PER_DAY % 7].value
                    raise _SettingError(
                        f"windows.{later}",
                        f"{window.start}-{window.end} overlaps windows.{earlier} "
                        f"({self.windows[earlier].start}-{self.windows[earlier].end}) on {day}, "
                        "so the minimum in force there would be ambiguous",
                        "let one window end where the next starts (an end equal to a start does not overlap)",
                    )
        return self

    def in_force(self, now: Epoch) -> int:
        """The hot minimum at `now`: the open window's, else `hot`."""
        return self._open_at(now).hot

    def stopped_in_force(self, now: Epoch) -> int:
        """The stopped minimum at `now`: the open window's, else `stopped`."""
        return self._open_at(now).stopped

    def pristine_in_force(self, now: Epoch) -> int:
        """The pristine floor among idle instances at `now`: the open window's, else `pristine`."""
        return self._open_at(now).pristine

    def pristine_stopped_in_force(self, now: Epoch) -> int:
        """The pristine floor among the stopped tier at `now`: the open window's, else `pristine_stopped`."""
        return self._open_at(now).pristine_stopped

    def instant_in_force(self, now: Epoch) -> int:
        """The instant tier's size at `now`: the open window's, else `instant`."""
        return self._open_at(now).instant

    def keeps_instant(self) -> bool:
        """Whether it keeps an instant tier at any hour."""
        settings: list[WarmMinimum | WarmWindow] = [self, *self.windows]
        return any(setting.instant for setting in settings)

    def keeps_pristine(self) -> bool:
        """Whether it keeps a pristine instance, hot or stopped, at any hour."""
        settings: list[WarmMinimum | WarmWindow] = [self, *self.windows]
        return any(setting.pristine or setting.pristine_stopped for setting in settings)

    def most_stopped(self) -> tuple[str, int]:
        """The largest stopped minimum it ever keeps (`stopped`, or a larger `pristine_stopped`, which
        lives in the same tier), and its setting's path under the class."""
        return max(
            [(name, getattr(self, name)) for name in ("stopped", "pristine_stopped")]
            + [
                (f"windows.{index}.{name}", getattr(window, name))
                for index, window in enumerate(self.windows)
                for name in ("stopped", "pristine_stopped")
            ],
            key=lambda item: item[1],
        )

    def _open_at(self, now: Epoch) -> WarmMinimum | WarmWindow:
        """The window open at `now`, else the schedule itself (its `hot` and `stopped` outside them)."""
        if not self.windows:
            return self
        local = datetime.fromtimestamp(now, ZoneInfo(self.time_zone))
        minute = local.weekday() * MINUTES_PER_DAY + local.hour * 60 + local.minute
        return next((window for window in self.windows if window.is_open(minute)), self)


def _first_overlap(first: WarmWindow, second: WarmWindow) -> int | None:
    """The first minute of the week both windows are open, or None; the week wraps (Sunday into Monday)."""
    for a_start, a_end in first.spans():
        for b_start, b_end in second.spans():
            for shift in (-MINUTES_PER_WEEK, 0, MINUTES_PER_WEEK):
                if max(a_start, b_start + shift) < min(a_end, b_end + shift):
                    return max(a_start, b_start + shift)
    return None


class StackConfig(_Settings):
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

    @model_validator(mode="after")
    def _classes_are_coherent(self) -> Self:
        if not self.resource_classes:
            raise _SettingError("resource_classes", "is empty", "define at least one class, e.g. large")
        for name in self.resource_classes:
            if not CLASS_NAME.fullmatch(name):
                raise _SettingError(
                    f"resource_classes.{name}",
                    "is not usable in a label",
                    "name classes with lowercase letters, digits and '-' (at most 32 characters)",
                )
        by_cpu = sorted(self.resource_classes.items(), key=lambda item: (item[1].cpu, item[1].memory_mib))
        for (smaller, low), (larger, high) in pairwise(by_cpu):
            if high.cpu == low.cpu:
                raise _SettingError(
                    f"resource_classes.{larger}.cpu",
                    f"equals the cpu of class {smaller} ({low.cpu})",
                    "give each class its own vCPU count",
                )
            if high.memory_mib <= low.memory_mib:
                raise _SettingError(
                    f"resource_classes.{larger}.memory_mib",
                    f"{high.memory_mib} MiB does not rise with cpu: class {smaller} has fewer vCPUs "
                    f"({low.cpu}) but {low.memory_mib} MiB",
                    f"give {larger} more than {low.memory_mib} MiB, or fewer vCPUs than {smaller}",
                )
        known = ", ".join(self.resource_classes)
        if self.defaults.resource_class not in self.resource_classes:
            raise _SettingError(
                "defaults.resource_class",
                f"{self.defaults.resource_class!r} is not a defined class",
                f"use one of: {known}",
            )
        for name in self.warm_pool_minimum:
            if name not in self.resource_classes:
                raise _SettingError(
                    f"warm_pool_minimum.{name}", "names no defined class", f"use one of: {known}"
                )
        for name in self.reuse.mode_by_class:
            if name not in self.resource_classes:
                raise _SettingError(
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
                raise _SettingError(
                    f"warm_pool_minimum.{name}.{path}",
                    f"is {stopped}, above pool.stopped_maximum ({self.pool.stopped_maximum}), so refresh "
                    "would launch instances the tier has no room to keep",
                    f"raise pool.stopped_maximum to at least {stopped}, or keep fewer stopped",
                )
            # A class's pool instances take the stack's label defaults (LaunchRequest.for_pool), usage
            # included; the tier is on-demand only (PoolSettings), and a job whose usage resolves to spot
            # never picks an on-demand instance, so a stopped minimum under spot would serve no default job.
            if self.defaults.usage is UsageClass.SPOT:
                raise _SettingError(
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
                raise _SettingError(
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
                raise _SettingError(
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

    def warm_minimum(self, resource_class: str, now: Epoch) -> int:
        """Idle instances of a class refresh keeps at `now`: its schedule's window then, if any."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return 0 if minimum is None else minimum.in_force(now)

    def stopped_minimum(self, resource_class: str, now: Epoch) -> int:
        """Stopped instances of a class refresh keeps at `now`: its schedule's window then, if any."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return 0 if minimum is None else minimum.stopped_in_force(now)

    def pristine_minimum(self, resource_class: str, now: Epoch) -> int:
        """Pristine idle instances of a class refresh keeps at `now` (a floor among the warm minimum's)."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return 0 if minimum is None else minimum.pristine_in_force(now)

    def pristine_stopped_minimum(self, resource_class: str, now: Epoch) -> int:
        """Pristine stopped instances of a class refresh keeps at `now` (a floor among the tier's)."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return 0 if minimum is None else minimum.pristine_stopped_in_force(now)

    def instant_tier(self, resource_class: str, now: Epoch) -> int:
        """Instant-tier runners of a class refresh keeps waiting registered at `now`."""
        minimum = self.warm_pool_minimum.get(resource_class)
        return 0 if minimum is None else minimum.instant_in_force(now)

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


class _SettingError(ValueError):
    """A rule across settings was broken; `setting` is relative to the model that checked it."""

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        super().__init__(f"{setting}: {problem}; fix: {fix}")
        self.setting = setting
        self.problem = problem
        self.fix = fix


def _describe(error: Any) -> str:
    location = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, _SettingError):
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
