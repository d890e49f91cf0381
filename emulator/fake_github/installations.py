"""Which repositories an App installation covers, as the fake keeps, lists and announces them.

    GET /installation/repositories                                             installation token

"List repositories accessible to the app installation" (docs.github.com/rest/apps/installations#list-
repositories-accessible-to-the-app-installation) answers `total_count`, `repositories` and the
installation's `repository_selection` (`all` or `selected`), a page at a time; "The fine-grained token
does not require any permissions". An owner who changes the selection makes GitHub send the App an
`installation_repositories` event, `added` or `removed`, with `repository_selection`,
`repositories_added` and `repositories_removed`: "All GitHub Apps receive this event by default. You
cannot manually subscribe to this event" (docs.github.com, "Webhook events and payloads",
installation_repositories). A repository outside the selection is one the App hears nothing of
(state.GitHubState.installation_covering).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from emulator.fake_github.app_settings import installation_json
from emulator.fake_github.payloads import SENDER, account_json, repository_json
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, per_page, route, whole
from emulator.fake_github.state import FakeInstallation

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub


@route("GET", "/installation/repositories", Auth.INSTALLATION)
def list_installation_repositories(github: FakeGitHub, request: Request) -> Answer:
    installation = request.installation
    if installation is None:
        raise Refusal(401, "Bad credentials")
    state = github.state
    covered = state.repositories_of(installation)
    size = per_page(request)
    page = max(1, whole(request.query.get("page", "1")))
    shown = covered[(page - 1) * size : page * size]
    now = state.clock.now()
    return Answer(
        200,
        {
            "total_count": len(covered),
            "repository_selection": installation.repository_selection,
            "repositories": [
                _listed(
                    repository_json(
                        name,
                        state.repository_id(name),
                        _owner(installation),
                        public=name in state.public_repositories,
                        at=now,
                    )
                )
                for name in shown
            ],
        },
    )


def _listed(repository: dict[str, Any]) -> dict[str, Any]:
    """A repository as the REST list shows it: as an event does, less `has_downloads`, which only the
    events' description names."""
    return {key: value for key, value in repository.items() if key != "has_downloads"}


def select_repositories(github: FakeGitHub, account: str, repositories: set[str] | None) -> None:
    """The owner of `account`'s installation chooses "Only select repositories" with `repositories`
    (`owner/repo`), or "All repositories" (None); GitHub announces the change to the App with one
    `installation_repositories` event (`added` if any repository was added, else `removed`)."""
    state = github.state
    with state.lock:
        installation = state.installation_of(account)
        if installation is None:
            raise LookupError(f"no installation for {account}")
        before = set(state.repositories_of(installation))
        installation.repositories = None if repositories is None else {r.lower() for r in repositories}
        after = set(state.repositories_of(installation))
        payload = _change(github, installation, added=sorted(after - before), removed=sorted(before - after))
    github.webhooks.send(
        "installation_repositories",
        payload["action"],
        payload,
        order_key=f"installation-{installation.installation_id}",
        installation_id=installation.installation_id,
    )


def _change(
    github: FakeGitHub, installation: FakeInstallation, *, added: list[str], removed: list[str]
) -> dict[str, Any]:
    return {
        "action": "added" if added else "removed",
        "installation": installation_json(installation, github.state.app_id, github.state.app_events),
        "repository_selection": installation.repository_selection,
        "repositories_added": [_short(github, name) for name in added],
        "repositories_removed": [_short(github, name) for name in removed],
        "requester": None,
        "sender": account_json(*SENDER, "User"),
    }


def _short(github: FakeGitHub, name: str) -> dict[str, Any]:
    """A repository as the event lists it: "id", "node_id", "name", "full_name", "private"."""
    state = github.state
    repository_id = state.repository_id(name)
    return {
        "id": repository_id,
        "node_id": f"R_{repository_id}",
        "name": name.split("/", 1)[1],
        "full_name": name,
        "private": name not in state.public_repositories,
    }


def _owner(installation: FakeInstallation) -> dict[str, Any]:
    kind = "Organization" if installation.organization else "User"
    return account_json(installation.account, 9000 + installation.installation_id, kind)
