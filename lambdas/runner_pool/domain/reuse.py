"""How far one instance is reused between jobs (DESIGN.md section 9, `reuse`): the scope, the mode per class,
and the rules that retire an instance after its job."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from runner_pool.domain.clock import Epoch
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.settings import SettingError, Settings
from runner_pool.domain.trust import WORKFLOW_EVENTS, TrustLevel, reuses


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


class ReuseSettings(Settings):
    """How far one instance is reused between jobs.

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
            raise SettingError(
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
