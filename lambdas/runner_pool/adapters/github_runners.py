"""Our runners at GitHub: registered just in time with their run key, listed, and removed.

A runner is registered at the repository whose job it serves, or, by runner group, at the organisation in
that repository's own group (adapters/github_runner_groups.py); never where every repository's jobs could
take it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import httpx
from githubkit.utils import UNSET

from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi
from runner_pool.adapters.github_runner_groups import InstantRunnerGroup, RepositoryRunnerGroups
from runner_pool.domain.github_tokens import registration_permissions
from runner_pool.domain.instant import TierGroupAccess
from runner_pool.domain.runner_scope import (
    OrganizationScope,
    Registration,
    RepositoryScope,
    RunnerScope,
    runner_scope,
)
from runner_pool.domain.runners import (
    DEFAULT_RUNNER_GROUP_ID,
    GitHubNotFoundError,
    GitHubRejectedError,
    JitRunner,
    RegisteredRunner,
    RepositoryUnknownError,
    RunnerRemoval,
    RunnerStatus,
)

if TYPE_CHECKING:
    from githubkit_schemas.latest.models import Runner

MAX_RUNNER_LABELS = 100


class GitHubRunners:
    """The runners of one App installation's scope (repository or organisation)."""

    def __init__(
        self,
        api: GitHubApi,
        scope: RunnerScope,
        *,
        registration: Registration = Registration.REPOSITORY,
        groups_allow_public_repositories: bool = False,
    ) -> None:
        """`registration` is used by an organisation scope only (domain.runner_scope.Registration). Calls at
        a repository carry a token for its `administration: write`, calls at the organisation one for its
        `organization_self_hosted_runners: write` (REGISTRATION_PERMISSIONS), each asked for on first use."""
        self._repository_api = api.narrowed(registration_permissions(Registration.REPOSITORY))
        self._organization_api = api.narrowed(registration_permissions(Registration.RUNNER_GROUP))
        self._scope = scope
        self._groups = (
            RepositoryRunnerGroups(
                self._organization_api, scope.org, allow_public_repositories=groups_allow_public_repositories
            )
            if registration is Registration.RUNNER_GROUP and isinstance(scope, OrganizationScope)
            else None
        )
        """A runner group per repository, when runners are registered so (on an organisation only)."""
        self._instant_group = (
            InstantRunnerGroup(
                self._organization_api, scope.org, allow_public_repositories=groups_allow_public_repositories
            )
            if self._groups is not None and isinstance(scope, OrganizationScope)
            else None
        )

    @property
    def scope(self) -> RunnerScope:
        return self._scope

    def keep_instant_group_in_step(self) -> TierGroupAccess | None:
        """The instant tier's runner group set to the installation's repositories (InstantRunnerGroup);
        None without such a group."""
        return None if self._instant_group is None else self._instant_group.keep_in_step()

    def _at(self, scope: RunnerScope) -> GitHubApi:
        """The client whose token may manage runners at `scope`."""
        return self._repository_api if isinstance(scope, RepositoryScope) else self._organization_api

    def jit_config(
        self,
        name: str,
        labels: Sequence[str],
        runner_group_id: int = DEFAULT_RUNNER_GROUP_ID,
        work_folder: str | None = None,
        repository: str | None = None,
        *,
        repository_id: int | None = None,
        instant: bool = False,
    ) -> JitRunner:
        """Register a just-in-time runner `name` with exactly `labels` (for us: `[run key]`), at the
        repository `repository` (`owner/repo`) when given, else at the App's scope.

        With Registration.RUNNER_GROUP on an organisation, at the organisation instead, in the runner
        group of the repository `repository_id` alone, in place of `runner_group_id`:
        POST /orgs/{org}/actions/runners/generate-jitconfig with that group's id ("Create configuration for
        a just-in-time runner for an organization", REST API endpoints for self-hosted runners), which
        with the group's endpoints needs only the organisation permission `organization_self_hosted_runners`
        ("GitHub Apps must have the administration permission for repositories or the
        organization_self_hosted_runners permission for organizations", REST API endpoints for
        self-hosted runner groups). Without a repository and its id that is RepositoryUnknownError: a
        runner is never registered where every repository's jobs could take it.

        At a repository, only that repository's jobs can take the runner, also when the App is
        installed on the whole organisation: "Create configuration for a
        just-in-time runner for a repository", POST /repos/{owner}/{repo}/actions/runners/
        generate-jitconfig, needs `runner_group_id` and the App's repository Administration: write
        (docs.github.com, REST API endpoints for self-hosted runners). A repository outside the scope
        is a ValueError: the installation could not register there.

        A name is one registration: asking again for a name GitHub already knows replaces the earlier
        registration, so a retried step whose first answer was lost still gets a config. A runner of
        that name that is running a job is never replaced (GitHubRejectedError).

        `instant`: a runner of an instant tier (domain/instant.py), registered before any job is known and
        for any repository's: at a repository scope's one repository, or at the organisation in the tier's
        runner group (InstantRunnerGroup). An organisation that registers at each job's repository has no
        place for it (RepositoryUnknownError; the config refuses such a tier).
        """
        if not name:
            raise ValueError("a runner needs a name")
        if not 1 <= len(labels) <= MAX_RUNNER_LABELS:
            raise ValueError(f"a JIT runner takes 1 to {MAX_RUNNER_LABELS} labels, not {len(labels)}")
        where = self.registration_scope(None if instant else repository)
        if instant:
            if isinstance(where, OrganizationScope):
                if self._instant_group is None:
                    raise RepositoryUnknownError(
                        f"{where} registers at each job's repository: no instant runner is registered"
                    )
                runner_group_id = self._instant_group.id()
            repository = None
        elif self._groups is not None:
            if repository is None or repository_id is None:
                raise RepositoryUnknownError(f"no runner group without the repository's id ({repository})")
            runner_group_id = self._groups.of(repository_id)
        try:
            return self._at(where).call(
                lambda: self._generate_jit(where, name, labels, runner_group_id, work_folder)
            )
        except GitHubRejectedError as exc:
            if exc.status != httpx.codes.CONFLICT:
                raise
        for stale in self._runners_named(where, name):
            if self.delete_runner(stale.runner_id, repository) is RunnerRemoval.BUSY:
                raise GitHubRejectedError(
                    f"runner name {name!r} belongs to runner {stale.runner_id}, which is running a job",
                    httpx.codes.CONFLICT,
                )
        return self._at(where).call(
            lambda: self._generate_jit(where, name, labels, runner_group_id, work_folder)
        )

    def registration_scope(self, repository: str | None) -> RunnerScope:
        """Where a runner for a job of `repository` is registered: at that repository, which must be
        the App's repository or one of its organisation's; at the App's scope when None."""
        if repository is None:
            return self._scope
        where = runner_scope(repository)
        if not isinstance(where, RepositoryScope):
            raise ValueError(f"{repository!r} is not an owner/repo")
        scope = self._scope
        inside = (
            str(where).lower() == str(scope).lower()
            if isinstance(scope, RepositoryScope)
            else where.owner.lower() == scope.org.lower()
        )
        if not inside:
            raise ValueError(f"repository {repository} is outside the App's runner scope {scope}")
        return scope if self._groups is not None else where

    def delete_runner(self, runner_id: int, repository: str | None = None) -> RunnerRemoval:
        """Remove a runner registration (at `repository` if it was registered there); one that is
        already gone is a normal outcome, not an error."""
        scope = self.registration_scope(repository)
        api = self._at(scope)
        rest, headers = api.rest, api.headers
        try:
            if isinstance(scope, RepositoryScope):
                api.call(
                    lambda: rest.actions.delete_self_hosted_runner_from_repo(
                        scope.owner, scope.repo, runner_id, headers=headers
                    )
                )
            else:
                api.call(
                    lambda: rest.actions.delete_self_hosted_runner_from_org(
                        scope.org, runner_id, headers=headers
                    )
                )
        except GitHubNotFoundError:
            return RunnerRemoval.ALREADY_GONE
        except GitHubRejectedError as exc:
            if exc.status != httpx.codes.UNPROCESSABLE_ENTITY:
                raise
            return RunnerRemoval.BUSY
        return RunnerRemoval.DELETED

    def runners(self, repository: str | None = None) -> list[RegisteredRunner]:
        """Our runners (those registered with a `pool=` label) at `repository`, or at the App's scope,
        every page of them. An organisation's list does not hold its repositories' runners."""
        where = self.registration_scope(repository)
        return [
            runner
            for runner in self._at(where).call(lambda: self._list_runners(where))
            if runner.run_key is not None
        ]

    def _generate_jit(
        self,
        scope: RunnerScope,
        name: str,
        labels: Sequence[str],
        runner_group_id: int,
        work_folder: str | None,
    ) -> JitRunner:
        api = self._at(scope)
        rest = api.rest
        folder = UNSET if work_folder is None else work_folder
        generate = (
            partial(rest.actions.generate_runner_jitconfig_for_repo, scope.owner, scope.repo)
            if isinstance(scope, RepositoryScope)
            else partial(rest.actions.generate_runner_jitconfig_for_org, scope.org)
        )
        made = generate(
            name=name,
            labels=list(labels),
            runner_group_id=runner_group_id,
            work_folder=folder,
            headers=api.headers,
        ).parsed_data
        return JitRunner(runner_id=made.runner.id, name=name, encoded_jit_config=made.encoded_jit_config)

    def _list_runners(self, scope: RunnerScope, name: str | None = None) -> list[RegisteredRunner]:
        api = self._at(scope)
        rest = api.rest
        only = UNSET if name is None else name
        if isinstance(scope, RepositoryScope):
            repo_pages = rest.paginate(
                rest.actions.list_self_hosted_runners_for_repo,
                map_func=lambda response: response.parsed_data.runners,
                owner=scope.owner,
                repo=scope.repo,
                name=only,
                per_page=PAGE_SIZE,
                headers=api.headers,
            )
            return [_registered(runner) for runner in repo_pages]
        org_pages = rest.paginate(
            rest.actions.list_self_hosted_runners_for_org,
            map_func=lambda response: response.parsed_data.runners,
            org=scope.org,
            name=only,
            per_page=PAGE_SIZE,
            headers=api.headers,
        )
        return [_registered(runner) for runner in org_pages]

    def _runners_named(self, scope: RunnerScope, name: str) -> list[RegisteredRunner]:
        listed = self._at(scope).call(lambda: self._list_runners(scope, name))
        return [runner for runner in listed if runner.name == name]


def _registered(runner: Runner) -> RegisteredRunner:
    if runner.busy:
        status = RunnerStatus.BUSY
    elif runner.status == RunnerStatus.ONLINE.value:
        status = RunnerStatus.ONLINE
    else:
        status = RunnerStatus.OFFLINE
    return RegisteredRunner(
        runner_id=runner.id,
        name=runner.name,
        status=status,
        labels=tuple(label.name for label in runner.labels),
    )
