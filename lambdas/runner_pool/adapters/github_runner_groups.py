"""An organisation's runner group per repository: the group only that repository's jobs can take runners from.

Used when runners are registered by runner group (domain.runner_scope.Registration.RUNNER_GROUP).
"""

from __future__ import annotations

import threading
from typing import Any, Literal

import httpx
from githubkit.utils import UNSET

from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi, validated
from runner_pool.domain.instant import TierGroupAccess, tier_group_access
from runner_pool.domain.runners import GitHubRejectedError

RUNNER_GROUP_PREFIX = "runner-pool-repository-"
"""A repository's runner group is named from its id, never its name: a renamed repository keeps its group,
and a new repository that takes an old name does not inherit it."""


INSTANT_RUNNER_GROUP = "runner-pool-instant"
"""The organisation's group for every class's instant tier (domain/instant.py)."""


def runner_group_name(repository_id: int) -> str:
    return f"{RUNNER_GROUP_PREFIX}{repository_id}"


class RepositoryRunnerGroups:
    """The runner groups of one organisation's repositories, one group each, found or created."""

    def __init__(self, api: GitHubApi, org: str, *, allow_public_repositories: bool = False) -> None:
        """`allow_public_repositories` lets the groups it creates take public repositories' jobs, which
        GitHub refuses by default."""
        self._api = api
        self._org = org
        self._allow_public = allow_public_repositories
        self._groups: dict[int, int] = {}
        """Runner group id per repository id, as found or created (`of`)."""
        self._lock = threading.Lock()

    def of(self, repository_id: int) -> int:
        """The id of the runner group of the repository `repository_id` alone: found by its name, or
        created with visibility `selected` and that one repository ("Create a self-hosted runner group for
        an organization": `visibility` "selected", `selected_repository_ids` "List of repository IDs that
        can access the runner group"; `allows_public_repositories` false unless configured). Held once
        found. A 409 on create means another hand-over created it first: its group is found and used."""
        with self._lock:
            held = self._groups.get(repository_id)
        if held is not None:
            return held
        name = runner_group_name(repository_id)
        group_id = self._api.call(lambda: self._find(name))
        if group_id is None:
            try:
                group_id = self._api.call(lambda: self._create(name, repository_id))
            except GitHubRejectedError as exc:
                if exc.status != httpx.codes.CONFLICT:
                    raise
                group_id = self._api.call(lambda: self._find(name))
                if group_id is None:
                    raise
        with self._lock:
            self._groups[repository_id] = group_id
        return group_id

    def _find(self, name: str) -> int | None:
        return find_group(self._api, self._org, name)

    def _create(self, name: str, repository_id: int) -> int:
        response = self._api.rest.actions.create_self_hosted_runner_group_for_org(
            self._org,
            name=name,
            visibility="selected",
            selected_repository_ids=[repository_id],
            allows_public_repositories=self._allow_public,
            headers=self._api.headers,
        )
        return int(response.parsed_data.id)


class InstantRunnerGroup:
    """The organisation's runner group of the instant tier, found or created once, admitting exactly the
    repositories the App's installation covers (domain/instant.py `TierGroupAccess`).

    An installation on all of the organisation's repositories leaves the group's visibility `all`: a
    repository's own group keeps a reused instance within that repository, but the tier's instances are
    pristine and serve one job each, so no job meets another repository's leftovers. One on selected
    repositories makes it `selected` with exactly those, so a repository the App is not installed on,
    whose jobs we never hear of, cannot take a tier runner. Public repositories are admitted only as the
    stack's groups admit them (`allow_public_repositories`), GitHub's default being no ("Managing access
    to self-hosted runners using groups")."""

    def __init__(self, api: GitHubApi, org: str, *, allow_public_repositories: bool = False) -> None:
        self._api = api
        self._org = org
        self._allow_public = allow_public_repositories
        self._group: int | None = None
        self._lock = threading.Lock()

    def id(self) -> int:
        """The group's id; created, when it is missing, with the installation's access."""
        with self._lock:
            if self._group is not None:
                return self._group
        group = self._api.call(self._find)
        group_id = int(group["id"]) if group is not None else self._create(self.access())
        with self._lock:
            self._group = group_id
        return group_id

    def access(self) -> TierGroupAccess:
        """The repositories the installation covers: "List repositories accessible to the app installation"
        (GET /installation/repositories, every page), which "does not require any permissions" of the
        token (docs.github.com/rest/apps/installations#list-repositories-accessible-to-the-app-
        installation)."""
        return self._api.call(lambda: installation_access(self._api))

    def keep_in_step(self) -> TierGroupAccess:
        """Set the group's access to the installation's, found or created: its visibility first ("Update a
        self-hosted runner group for an organization", PATCH /orgs/{org}/actions/runner-groups/{id}), then,
        when `selected`, its repositories ("Set repository access for a self-hosted runner group in an
        organization", PUT .../runner-groups/{id}/repositories, which "The runner group must have
        visibility set to selected" for). Both need the organisation permission
        `organization_self_hosted_runners` (write), the registration's own. Going from `all` to `selected`
        the group first keeps only the repositories it had selected, which is fewer, never more; the list
        is set whole every time, so a lost or repeated call leaves nothing behind."""
        access = self.access()
        group = self._api.call(self._find)
        if group is None:
            group_id = self._create(access)
        else:
            group_id = int(group["id"])
            if group.get("visibility") != access.visibility:
                self._api.call(lambda: self._set_visibility(group_id, access.visibility))
            if access.repository_ids is not None:
                self._api.call(lambda: self._set_repositories(group_id, access.repository_ids or frozenset()))
        with self._lock:
            self._group = group_id
        return access

    def _find(self) -> dict[str, Any] | None:
        return find_group_json(self._api, self._org, INSTANT_RUNNER_GROUP)

    def _create(self, access: TierGroupAccess) -> int:
        """Created with `access`; a 409 means another hand-over created it first: its group is used."""
        selected = sorted(access.repository_ids) if access.repository_ids is not None else UNSET
        try:
            response = self._api.call(
                lambda: self._api.rest.actions.create_self_hosted_runner_group_for_org(
                    self._org,
                    name=INSTANT_RUNNER_GROUP,
                    visibility=access.visibility,
                    selected_repository_ids=selected,
                    allows_public_repositories=self._allow_public,
                    headers=self._api.headers,
                )
            )
        except GitHubRejectedError as exc:
            if exc.status != httpx.codes.CONFLICT:
                raise
            group = self._api.call(self._find)
            if group is None:
                raise
            return int(group["id"])
        return int(response.parsed_data.id)

    def _set_visibility(self, group_id: int, visibility: Literal["all", "selected"]) -> None:
        self._api.rest.actions.update_self_hosted_runner_group_for_org(
            self._org, group_id, name=INSTANT_RUNNER_GROUP, visibility=visibility, headers=self._api.headers
        )

    def _set_repositories(self, group_id: int, repository_ids: frozenset[int]) -> None:
        self._api.rest.actions.set_repo_access_to_self_hosted_runner_group_in_org(
            self._org, group_id, selected_repository_ids=sorted(repository_ids), headers=self._api.headers
        )


def installation_access(api: GitHubApi) -> TierGroupAccess:
    """What GET /installation/repositories answers: its `repository_selection` and, when that selects,
    the ids of the repositories it lists, every page read. An installation on all repositories is known
    from the first page, so an organisation of thousands costs one request, not one per hundred."""
    page = 1
    ids: set[int] = set()
    while True:
        body = validated(
            api.rest.apps.list_repos_accessible_to_installation(
                per_page=PAGE_SIZE, page=page, headers=api.headers
            )
        )
        if body.get("repository_selection") == "all":
            return tier_group_access("all", ())
        repositories = body.get("repositories", [])
        ids.update(int(repository["id"]) for repository in repositories)
        if len(repositories) < PAGE_SIZE:
            return tier_group_access(str(body.get("repository_selection")), ids)
        page += 1


def find_group(api: GitHubApi, org: str, name: str) -> int | None:
    """The id of `org`'s runner group `name`, every page read until it is found; None if it has none."""
    group = find_group_json(api, org, name)
    return None if group is None else int(group["id"])


def find_group_json(api: GitHubApi, org: str, name: str) -> dict[str, Any] | None:
    """`org`'s runner group `name` as GitHub lists it, every page read until it is found; None if none."""
    rest = api.rest
    page = 1
    while True:
        body = validated(
            rest.actions.list_self_hosted_runner_groups_for_org(
                org, per_page=PAGE_SIZE, page=page, headers=api.headers
            )
        )
        groups = body.get("runner_groups", [])
        found = next((g for g in groups if g.get("name") == name), None)
        if found is not None or len(groups) < PAGE_SIZE:
            return found
        page += 1
