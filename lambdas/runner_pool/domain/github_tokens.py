"""Who may act as the GitHub App, and what each piece of work may ask GitHub for.

Only one function holds the App's private key (the token function, handlers/github_token.py); every
other function asks it for an installation access token narrowed to the permissions its work needs.
GitHub's "Create an installation access token for an app" (POST
/app/installations/{installation_id}/access_tokens, docs.github.com/rest/apps/apps#create-an-installation-
access-token-for-an-app) takes `permissions`, "The permissions granted to the user access token", and
`repositories`/`repository_ids` to narrow a token to a subset of what the installation was granted; the
token "will expire 1 hour from the time you create it".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from runner_pool.domain.clock import Epoch
from runner_pool.domain.runner_scope import REGISTRATION_PERMISSIONS, Registration
from runner_pool.domain.runners import FailedDelivery

Permissions = Mapping[str, str]
"""GitHub App permission name → level (`read`, `write`), as the token request's `permissions` spells it."""

RUN_READS: Permissions = MappingProxyType({"actions": "read"})
"""A run's jobs and a run attempt's trigger ("Get a workflow run attempt", "List jobs for a workflow run
attempt": fine-grained permission "Actions" repository permissions (read))."""
RUN_RERUNS: Permissions = MappingProxyType({"actions": "write"})
"""Re-running a run's failed jobs ("Re-run failed jobs from a workflow run": fine-grained permission
"Actions" repository permissions (write)), which includes reading the run first."""

CHECK_WRITES: Permissions = MappingProxyType({"checks": "write"})
"""The check run that tells a job's author why the job waits for capacity ("Create a check run", "Update a
check run": fine-grained permission "Checks" repository permissions (write); "To create a check run, you
must use a GitHub App")."""


def registration_permissions(registration: Registration) -> Permissions:
    """Registering, listing and removing our runners, and the runner groups they register into: the one
    permission the stack's registration needs (domain/runner_scope.py REGISTRATION_PERMISSIONS)."""
    permission, level = REGISTRATION_PERMISSIONS[registration]
    return MappingProxyType({permission: level})


def permission_key(permissions: Permissions | None) -> tuple[tuple[str, str], ...] | None:
    """One hashable key per permission set (None: everything the installation was granted)."""
    return None if permissions is None else tuple(sorted(permissions.items()))


@dataclass(frozen=True)
class InstallationToken:
    value: str = field(repr=False)
    expires_at: Epoch
    permissions: Permissions = field(default_factory=dict)
    """What GitHub says the token may do (its answer's `permissions`)."""


class AppIdentity(Protocol):
    """Acting as the App itself: what only the holder of its private key can do.

    Installation tokens for any permission set the installation has, and the App's own webhook deliveries
    (`/app/hook/deliveries`, authenticated by the App's JWT only)."""

    @property
    def installation_id(self) -> int: ...

    def installation_token(self, permissions: Permissions | None) -> InstallationToken:
        """A new token for the installation, narrowed to `permissions` (None: all it was granted)."""
        ...

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]: ...

    def redeliver(self, delivery_id: int) -> None: ...
