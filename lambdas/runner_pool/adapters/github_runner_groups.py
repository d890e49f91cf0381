"""An organisation's runner group per repository: the group only that repository's jobs can take runners from.

Used when runners are registered by runner group (domain.runner_scope.Registration.RUNNER_GROUP).
"""

from __future__ import annotations

import threading

import httpx

from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi, validated
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
    """The organisation's runner group of the instant tier, found or created once.

    Its visibility is `all`: any repository of the organisation may take its runners. A repository's own
    group keeps a reused instance within that repository; the tier's instances are pristine and serve one
    job each (domain/instant.py), so no job meets another repository's leftovers. Public repositories are
    admitted only as the stack's groups admit them (`allow_public_repositories`), GitHub's default being
    no ("Managing access to self-hosted runners using groups")."""

    def __init__(self, api: GitHubApi, org: str, *, allow_public_repositories: bool = False) -> None:
        self._api = api
        self._org = org
        self._allow_public = allow_public_repositories
        self._group: int | None = None
        self._lock = threading.Lock()

    def id(self) -> int:
        with self._lock:
            if self._group is not None:
                return self._group
        group_id = self._api.call(self._find)
        if group_id is None:
            try:
                group_id = self._api.call(self._create)
            except GitHubRejectedError as exc:
                if exc.status != httpx.codes.CONFLICT:
                    raise
                group_id = self._api.call(self._find)
                if group_id is None:
                    raise
        with self._lock:
            self._group = group_id
        return group_id

    def _find(self) -> int | None:
        return find_group(self._api, self._org, INSTANT_RUNNER_GROUP)

    def _create(self) -> int:
        response = self._api.rest.actions.create_self_hosted_runner_group_for_org(
            self._org,
            name=INSTANT_RUNNER_GROUP,
            visibility="all",
            allows_public_repositories=self._allow_public,
            headers=self._api.headers,
        )
        return int(response.parsed_data.id)


def find_group(api: GitHubApi, org: str, name: str) -> int | None:
    """The id of `org`'s runner group `name`, every page read until it is found; None if it has none."""
    rest = api.rest
    page = 1
    while True:
        body = validated(
            rest.actions.list_self_hosted_runner_groups_for_org(
                org, per_page=PAGE_SIZE, page=page, headers=api.headers
            )
        )
        groups = body.get("runner_groups", [])
        found = next((int(g["id"]) for g in groups if g.get("name") == name), None)
        if found is not None or len(groups) < PAGE_SIZE:
            return found
        page += 1
