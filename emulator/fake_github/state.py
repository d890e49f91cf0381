"""Everything the fake GitHub knows: the App and its installations, runners, runs and jobs, deliveries."""

from __future__ import annotations

import secrets
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from runner_pool.domain.clock import Clock, Epoch, SystemClock
from runner_pool.domain.runner_scope import RepositoryScope, RunnerScope

TOKEN_LIFETIME_SECONDS = 3600
DEFAULT_RUNNER_GROUP_ID = 1
DEFAULT_LABELS = ("self-hosted", "Linux", "X64")
"""What GitHub gives a self-hosted runner on its own: "self-hosted", its OS ("linux, windows, or
macOS") and its architecture ("x64, ARM, or ARM64") (docs.github.com, Actions, "Using self-hosted
runners in a workflow", Using default labels to route jobs). The fake's runners run Linux on x64."""
RUNNER_PERMISSIONS = {"administration": "write", "organization_self_hosted_runners": "write"}
"""What an App needs for repository runners and for organisation runners."""
APP_PERMISSIONS = {"actions": "write", "checks": "write", **RUNNER_PERMISSIONS}
"""The fake App's permissions, and what an installation accepts unless told otherwise: the runners',
`actions: write` to read a run's jobs and re-run its failed ones, and `checks: write` for the check run of
jobs waiting for capacity (what github-app-manifest.json and its personal-account twin ask)."""
APP_EVENTS = ("workflow_job", "workflow_run")


@dataclass
class FakeInstallation:
    installation_id: int
    account: str
    permissions: dict[str, str]
    organization: bool = True
    """Whether the account is an organisation (the installation's `target_type`), else a user."""
    repositories: set[str] | None = None
    """The repositories (`owner/repo`, lowercased) the owner selected for the App; None for all of the
    account's: the installation's `repository_selection` is `selected` or `all` ("Installing your own
    GitHub App": "All repositories" or "Only select repositories")."""
    app_id: int = 0
    """The App installed (GitHubState.other_apps); add_installation sets the fake's first App's."""

    def owns(self, account: str) -> bool:
        return self.account.lower() == account.lower()

    @property
    def repository_selection(self) -> str:
        return "all" if self.repositories is None else "selected"

    def covers(self, repository: str) -> bool:
        """Whether the App may see `repository`: the installation's account's, and selected if it selects."""
        owner = repository.split("/", 1)[0]
        return self.owns(owner) and (self.repositories is None or repository.lower() in self.repositories)


@dataclass(frozen=True)
class FakeLabel:
    label_id: int
    name: str
    type: str
    """`read-only` for the labels GitHub gives every self-hosted runner, `custom` for the ones asked for."""


@dataclass
class FakeRunner:
    runner_id: int
    name: str
    scope: RunnerScope
    runner_group_id: int
    labels: list[FakeLabel]
    work_folder: str
    secret: str = field(repr=False)
    """What a runner started from its JIT config authenticates with (the fake's runner protocol)."""
    online: bool = False
    busy: bool = False
    os: str = "unknown"
    """GitHub learns the OS when the runner first connects; a fresh JIT runner has none yet."""
    last_seen: Epoch | None = None
    """When the runner last talked to GitHub; a runner silent for too long is lost."""
    job_id: int | None = None

    @property
    def label_names(self) -> set[str]:
        return {label.name for label in self.labels}

    def carries(self, labels: list[str]) -> bool:
        """Whether the runner has every one of `labels`, compared as GitHub does: "Labels are
        case-insensitive" (docs.github.com, Actions, "Using labels with self-hosted runners")."""
        return {label.lower() for label in labels} <= {name.lower() for name in self.label_names}

    def serves(self, repository: str) -> bool:
        """Whether this runner may take jobs of `repository` (`owner/repo`): a repository's runner only
        that repository's ("You can add self-hosted runners to a single repository"), an
        organisation's any of its repositories' ("makes the runner available to multiple repositories
        in your organization") (docs.github.com, Actions, "Adding self-hosted runners")."""
        owner = repository.split("/", 1)[0]
        if isinstance(self.scope, RepositoryScope):
            return str(self.scope).lower() == repository.lower()
        return self.scope.org.lower() == owner.lower()


@dataclass
class FakeRunnerGroup:
    """An organisation's runner group: "Runner groups are used to collect sets of runners and create a
    security boundary around them. You can then decide which organizations or repositories are permitted
    to run jobs on those sets of machines" (docs.github.com, Actions, "Managing access to self-hosted
    runners using groups"). `visibility` is `all`, `selected` or `private`; with `selected`, only the
    repositories whose ids are in `selected_repository_ids` ("List of repository IDs that can access the
    runner group", REST API endpoints for self-hosted runner groups, "Create a self-hosted runner group
    for an organization"). Public repositories are refused unless `allows_public_repositories` ("Whether
    the runner group can be used by public repositories", default false; "By default, only private
    repositories can access runners in a runner group, but you can override this")."""

    runner_group_id: int
    org: str
    name: str
    visibility: str = "all"
    selected_repository_ids: set[int] = field(default_factory=set)
    allows_public_repositories: bool = False

    def admits(self, repository_id: int, public: bool) -> bool:
        """Whether a job of the repository `repository_id` may go to a runner of this group."""
        if public and not self.allows_public_repositories:
            return False
        if self.visibility == "selected":
            return repository_id in self.selected_repository_ids
        return True


@dataclass(frozen=True)
class FakeDelivery:
    delivery_id: int
    guid: str
    event: str
    action: str | None
    status_code: int
    delivered_at: Epoch
    redelivery: bool = False
    installation_id: int | None = None
    repository_id: int | None = None
    payload: bytes = field(default=b"", repr=False)
    """The body as sent, so a redelivery sends exactly the same bytes."""

    @property
    def status(self) -> str:
        if 200 <= self.status_code < 300:
            return "OK"
        if self.status_code == 0:
            return "failed to connect to host"
        return f"Invalid HTTP Response: {self.status_code}"

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status_code < 300


class JobStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class Conclusion(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"


@dataclass
class FakeJob:
    job_id: int
    run_id: int
    name: str
    labels: list[str]
    seconds: float
    """How long the job's steps take once a runner has it."""
    queued_at: Epoch
    run_attempt: int = 1
    fail_attempts: tuple[int, ...] = ()
    """The run attempts in which the job's steps fail (the runner reports failure); it succeeds in others."""
    status: JobStatus = JobStatus.QUEUED
    conclusion: Conclusion | None = None
    runner_id: int | None = None
    runner_name: str | None = None
    runner_labels: tuple[str, ...] = ()
    """The labels of the runner that took the job, as they were when it took it."""
    assigned_runner_id: int | None = None
    """The runner the job is offered to, not picked up yet: a queued job waits for it for a while."""
    assigned_at: Epoch | None = None
    started_at: Epoch | None = None
    completed_at: Epoch | None = None
    failed_because: str | None = None
    """Why the job failed, when it did: its steps, its runner gone (disconnected, or silent too long), or
    its wait in the queue (the fake's own note; GitHub shows it in the job's log)."""
    environment: str | None = None
    """The environment its YAML refers to (`environment:`), if any: its `workflow_job` deliveries then
    carry a `deployment` (GitHub changelog, "GitHub Actions: workflow_job webhook payload includes
    deployment")."""

    @property
    def fails(self) -> bool:
        return self.run_attempt in self.fail_attempts


@dataclass(frozen=True)
class RunTrigger:
    """What caused a run, as GitHub reports it in `workflow_run` (`event`, `actor`, `triggering_actor`,
    `head_repository`: "Webhook events and payloads", workflow_run; the same fields as "Get a workflow
    run attempt" answers). The default is a push by a human to the run's own repository."""

    event: str = "push"
    """Its event's name ("Events that trigger workflows"): `push`, `pull_request`, `schedule`, ..."""
    actor: str = "octocat"
    """Who caused its first attempt (`github.actor`); Dependabot's runs carry `dependabot[bot]`."""
    triggering_actor: str | None = None
    """Who caused the latest attempt (`github.triggering_actor`); None: the actor."""
    head_repository: str | None = None
    """`owner/repo` its commit comes from (a fork's, for a fork's pull request); None: its own."""
    read_fails: bool = False
    """The scenario's fault: "Get a workflow run attempt" answers 503 for this run. (To lose its
    `requested` delivery, a scenario drops it: Webhooks.drop_next.)"""


@dataclass
class FakeWorkflowRun:
    run_id: int
    repository: str
    """`owner/repo`."""
    workflow: str
    run_number: int
    created_at: Epoch
    job_ids: list[int] = field(default_factory=list)
    """The jobs of the latest attempt: those it ran, and those it kept from earlier attempts."""
    status: JobStatus = JobStatus.QUEUED
    conclusion: Conclusion | None = None
    updated_at: Epoch = 0.0
    run_attempt: int = 1
    attempt_started_at: Epoch | None = None
    public: bool = False
    """Whether the repository is public; its events say so in `repository.private` and `.visibility`."""
    trigger: RunTrigger = field(default_factory=RunTrigger)
    """What caused the run, as its `workflow_run` deliveries and its REST reads say."""

    @property
    def owner(self) -> str:
        return self.repository.split("/", 1)[0]


Receiver = Callable[[FakeDelivery], int]
"""Makes one attempt at a delivery (its event, action, guid and payload); answers the HTTP status
the receiver gave, 0 when it could not be reached."""


@dataclass
class GitHubState:
    """Everything the fake knows. Every method is safe to call from the server's threads and from tests."""

    app_id: int
    public_key_pem: str = field(repr=False)
    clock: Clock = field(default_factory=SystemClock)
    installations: dict[int, FakeInstallation] = field(default_factory=dict)
    runners: dict[int, FakeRunner] = field(default_factory=dict)
    deliveries: dict[int, FakeDelivery] = field(default_factory=dict)
    runs: dict[int, FakeWorkflowRun] = field(default_factory=dict)
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    runner_groups: dict[int, FakeRunnerGroup] = field(default_factory=dict)
    """Organisations' runner groups by id, beyond the Default group every owner has."""
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Check runs by id, as the check-run routes answer them (emulator/fake_github/check_runs.py)."""
    redelivery_requests: list[int] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    """Requests received, per route (`POST /app/installations/{installation_id}/access_tokens`)."""
    connections: int = 0
    rate_limited_until: Epoch | None = None
    hourly_limit: int = 5000
    """Requests an hour an installation may make: 5,000 at least, up to 12,500 for a large one
    (docs.github.com, "Rate limits for the REST API", "Primary rate limit for GitHub App installations":
    Apps "authenticating with an installation access token use the installation's minimum rate limit").
    Each installation has an hour of its own, so two Apps installed on one owner have two."""
    _hours: dict[int, tuple[int, Epoch]] = field(default_factory=dict, repr=False)
    """Each installation's hour by its id: the requests made in it, and when it ends; an hour begins
    with the installation's first request after its last one ended."""
    public_repositories: set[str] = field(default_factory=set)
    """Repositories (`owner/repo`, lowercased) that are public; every other one is private. The demo's
    repositories are private, the usual case for self-hosted runners, which GitHub advises against
    for public repositories ("Security hardening for GitHub Actions")."""
    jit_default_labels: bool = True
    """Whether a runner registered from a JIT config gets DEFAULT_LABELS beside the labels asked for.
    GitHub does not document it, and runner managers disagree on what they saw (github-aws-runners/
    terraform-aws-github-runner#3491: "When we introduced the JIT config the default labels are not
    added by default", answered "We're using JIT - and the default labels are added by default"), so
    the product must work either way and the tests run both."""
    app_permissions: dict[str, str] = field(default_factory=lambda: dict(APP_PERMISSIONS))
    """The App's own permissions (GET /app): what its settings ask of every installation."""
    app_events: list[str] = field(default_factory=lambda: list(APP_EVENTS))
    """The events the App is subscribed to (GET /app)."""
    hook_content_type: str = "json"
    """The App's webhook content type (GET /app/hook/config): `json` or `form`."""
    runner_policies: dict[str, str] = field(default_factory=dict)
    """Each organisation's (lowercased) `enabled_repositories` for repository-level runners, `all` when not
    set: "Organization owners can choose which repositories are allowed to create repository-level
    self-hosted runners" (docs.github.com, Actions, "Adding self-hosted runners")."""
    webhook_receiver: Receiver = field(default=lambda _delivery: 200, repr=False)
    """Where deliveries go. Accepts everything until the webhooks are pointed at an endpoint."""
    other_apps: dict[int, str] = field(default_factory=dict, repr=False)
    """More Apps than `app_id`, each by id with its public key: each holds its own installations, tokens
    and rate limits, as GitHub counts them per App and installation."""
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _tokens: dict[str, tuple[int, Epoch, dict[str, str] | None]] = field(default_factory=dict, repr=False)
    token_permissions: list[dict[str, str] | None] = field(default_factory=list)
    """What each token request narrowed its token to, in order (None: not narrowed)."""
    _label_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _repository_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _next_id: int = 1000

    # --- the App and its installations

    def add_installation(
        self,
        installation_id: int,
        account: str,
        permissions: Mapping[str, str] | None = None,
        *,
        organization: bool = True,
        app_id: int | None = None,
    ) -> FakeInstallation:
        """`app_id`: the App installed (None: the first; another must be added first, `add_app`)."""
        installation = FakeInstallation(
            installation_id,
            account,
            dict(APP_PERMISSIONS if permissions is None else permissions),
            organization,
            app_id=self.app_id if app_id is None else app_id,
        )
        with self.lock:
            self.installations[installation_id] = installation
        return installation

    def add_app(self, app_id: int, public_key_pem: str) -> None:
        """Another App, signing its JWTs with the private key of `public_key_pem`."""
        with self.lock:
            self.other_apps[app_id] = public_key_pem

    @property
    def app_ids(self) -> list[int]:
        with self.lock:
            return [self.app_id, *self.other_apps]

    def public_key_of(self, app_id: int) -> str | None:
        with self.lock:
            return self.public_key_pem if app_id == self.app_id else self.other_apps.get(app_id)

    def installation_of(self, account: str) -> FakeInstallation | None:
        with self.lock:
            return next((i for i in self.installations.values() if i.owns(account)), None)

    def installation_covering(self, repository: str) -> FakeInstallation | None:
        """The installation the App sees `repository` through: its account's, unless that installation
        selects repositories and not this one: "A webhook can only access events that are available in
        the ... GitHub App where it is installed" (docs.github.com, "Types of webhooks"), so the App hears
        nothing of a repository outside the selection."""
        installation = self.installation_of(repository.split("/", 1)[0])
        return installation if installation is not None and installation.covers(repository) else None

    def repositories_of(self, installation: FakeInstallation) -> list[str]:
        """The repositories (`owner/repo`, lowercased) the installation covers, of those the fake knows."""
        with self.lock:
            known = set(self._repository_ids) | set(installation.repositories or ())
            return sorted(name for name in known if installation.covers(name))

    def issue_token(
        self, installation_id: int, permissions: Mapping[str, str] | None = None
    ) -> tuple[str, Epoch]:
        """A token for the installation, narrowed to `permissions` (None: all it was granted); the caller
        has checked they are a subset of its grant (rest.py `create_installation_token`)."""
        token = f"ghs_{secrets.token_hex(18)}"
        expires_at = float(int(self.clock.now()) + TOKEN_LIFETIME_SECONDS)
        with self.lock:
            self._tokens[token] = (
                installation_id,
                expires_at,
                None if permissions is None else dict(permissions),
            )
            self.token_permissions.append(None if permissions is None else dict(permissions))
        return token, expires_at

    def installation_for(self, token: str) -> FakeInstallation | None:
        """The installation a token was issued to, as the token sees it (its permissions those it was
        narrowed to), while it is neither expired nor revoked."""
        with self.lock:
            issued = self._tokens.get(token)
            if issued is None or issued[1] <= self.clock.now():
                return None
            installation = self.installations.get(issued[0])
            narrowed = issued[2]
            if installation is None or narrowed is None:
                return installation
            return replace(installation, permissions=dict(narrowed))

    def revoke_tokens(self) -> None:
        with self.lock:
            self._tokens.clear()

    @property
    def token_requests(self) -> int:
        return self.calls["POST /app/installations/{installation_id}/access_tokens"]

    def exhaust_rate_limit(self, until: Epoch) -> None:
        """Refuse every authenticated request as over the primary rate limit until `until`."""
        with self.lock:
            self.rate_limited_until = until

    def limited_on_purpose(self) -> bool:
        """Whether `exhaust_rate_limit` holds now: every authenticated request is refused."""
        with self.lock:
            return self.rate_limited_until is not None and self.clock.now() < self.rate_limited_until

    def spend_hourly(self, installation_id: int) -> bool:
        """One request of the installation against its hour's limit; False (and nothing spent) once
        the hour is out."""
        with self.lock:
            used, reset = self.hourly_status(installation_id)
            if used >= self.hourly_limit:
                return False
            self._hours[installation_id] = (used + 1, reset)
            return True

    def hourly_status(self, installation_id: int) -> tuple[int, Epoch]:
        """(requests used, when the window resets) of the installation's hour, as GitHub's
        `x-ratelimit-*` headers report them."""
        with self.lock:
            now = self.clock.now()
            used, reset = self._hours.get(installation_id, (0, now))
            if now >= reset:
                used, reset = 0, now + 3600
                self._hours[installation_id] = (used, reset)
            return used, reset

    def use_hourly(self, installation_id: int, used: int) -> None:
        """Say the installation made `used` requests in its hour so far (its hour begins now if none
        is running), as other clients of the installation would have."""
        with self.lock:
            _, reset = self.hourly_status(installation_id)
            self._hours[installation_id] = (used, reset)

    def repository_id(self, repository: str) -> int:
        """A stable id per `owner/repo`, as GitHub's repository ids are."""
        with self.lock:
            return self._repository_ids.setdefault(repository.lower(), 186853000 + len(self._repository_ids))

    # --- runners

    def add_runner_group(
        self,
        org: str,
        runner_group_id: int,
        name: str | None = None,
        *,
        visibility: str = "all",
        selected_repository_ids: set[int] | None = None,
        allows_public_repositories: bool = False,
    ) -> FakeRunnerGroup:
        with self.lock:
            group = self.runner_groups[runner_group_id] = FakeRunnerGroup(
                runner_group_id,
                org,
                name or f"group-{runner_group_id}",
                visibility,
                set(selected_repository_ids or ()),
                allows_public_repositories,
            )
            return group

    def groups_of(self, org: str) -> list[FakeRunnerGroup]:
        """`org`'s runner groups beyond Default, oldest first."""
        with self.lock:
            return sorted(
                (g for g in self.runner_groups.values() if g.org.lower() == org.lower()),
                key=lambda g: g.runner_group_id,
            )

    def has_runner_group(self, scope: RunnerScope, runner_group_id: int) -> bool:
        """A repository has only the Default group: runner groups exist "at the organization and/or
        enterprise levels" (docs.github.com, Actions, "About runner groups")."""
        if runner_group_id == DEFAULT_RUNNER_GROUP_ID:
            return True
        if isinstance(scope, RepositoryScope):
            return False
        with self.lock:
            group = self.runner_groups.get(runner_group_id)
            return group is not None and group.org.lower() == scope.org.lower()

    def group_admits(self, runner: FakeRunner, repository: str) -> bool:
        """Whether `runner`'s group lets a job of `repository` reach it. The Default group admits every
        repository of its organisation; GitHub's own Default group also refuses public repositories
        unless allowed, which the fake leaves out so that existing organisation setups keep working."""
        with self.lock:
            group = self.runner_groups.get(runner.runner_group_id)
            if group is None:
                return True
            return group.admits(
                self.repository_id(repository), repository.lower() in self.public_repositories
            )

    def register_runner(
        self,
        scope: RunnerScope,
        name: str,
        labels: list[str],
        runner_group_id: int = DEFAULT_RUNNER_GROUP_ID,
        work_folder: str = "_work",
    ) -> FakeRunner:
        """A runner as GitHub records it at registration: offline until it connects.

        A custom label that repeats a default one in another case is the default one (labels are
        case-insensitive), not a second label: the fake's choice, GitHub documents neither.
        """
        with self.lock:
            defaults = list(DEFAULT_LABELS) if self.jit_default_labels else []
            taken = {name.lower() for name in defaults}
            custom = [n for n in dict.fromkeys(labels) if n.lower() not in taken]
            runner = FakeRunner(
                runner_id=self.new_id(),
                name=name,
                scope=scope,
                runner_group_id=runner_group_id,
                labels=[
                    *(self._label(n, "read-only") for n in defaults),
                    *(self._label(n, "custom") for n in custom),
                ],
                work_folder=work_folder,
                secret=secrets.token_hex(16),
            )
            self.runners[runner.runner_id] = runner
            return runner

    def runners_in(self, scope: RunnerScope, name: str | None = None) -> list[FakeRunner]:
        with self.lock:
            return [
                runner
                for runner in sorted(self.runners.values(), key=lambda r: r.runner_id)
                if runner.scope == scope and (name is None or runner.name == name)
            ]

    def runner_with_secret(self, secret: str) -> FakeRunner | None:
        with self.lock:
            return next((r for r in self.runners.values() if secrets.compare_digest(r.secret, secret)), None)

    def set_runner_state(self, runner_id: int, *, online: bool, busy: bool = False) -> None:
        with self.lock:
            runner = self.runners[runner_id]
            runner.online = online
            runner.busy = busy

    # --- webhook deliveries

    def add_delivery(
        self,
        event: str,
        action: str | None,
        status_code: int,
        *,
        guid: str | None = None,
        redelivery: bool = False,
        installation_id: int | None = None,
        repository_id: int | None = None,
        payload: bytes = b"",
    ) -> FakeDelivery:
        """One attempt at delivering an event, made now; `guid` names the event (new if not given)."""
        with self.lock:
            delivery = FakeDelivery(
                delivery_id=self.new_id(),
                guid=guid or str(uuid.uuid4()),
                event=event,
                action=action,
                status_code=status_code,
                delivered_at=self.clock.now(),
                redelivery=redelivery,
                installation_id=installation_id,
                repository_id=repository_id,
                payload=payload,
            )
            self.deliveries[delivery.delivery_id] = delivery
            return delivery

    def attempt(self, delivery: FakeDelivery, *, redelivery: bool = False) -> FakeDelivery:
        """Deliver `delivery`'s event (outside the lock) and record the attempt with the status it got."""
        status_code = self.webhook_receiver(delivery)
        return self.add_delivery(
            delivery.event,
            delivery.action,
            status_code,
            guid=delivery.guid,
            redelivery=redelivery,
            installation_id=delivery.installation_id,
            repository_id=delivery.repository_id,
            payload=delivery.payload,
        )

    def redeliver(self, delivery_id: int) -> FakeDelivery:
        """A new attempt at a delivery's event, made before answering, so its effect is seen at once."""
        with self.lock:
            original = self.deliveries[delivery_id]
            self.redelivery_requests.append(delivery_id)
        return self.attempt(original, redelivery=True)

    def new_id(self) -> int:
        with self.lock:
            self._next_id += 1
            return self._next_id

    def _label(self, name: str, kind: str) -> FakeLabel:
        with self.lock:
            label_id = self._label_ids.setdefault(name, len(self._label_ids) + 1)
        return FakeLabel(label_id, name, kind)
