"""Refresh keeps the instant tier's runner group in step with the App's installation, whatever deliveries
were lost: its handler on moto, against the fake GitHub."""

from __future__ import annotations

from emulator.harness.control_plane import local_control_plane, stack_config
from emulator.harness.github_app import INSTALLATION_ID, OWNER
from runner_pool.adapters.github_runner_groups import INSTANT_RUNNER_GROUP
from tests.integration.conftest import app_github


def test_refresh_sets_the_tier_group_to_the_installations_repositories_without_their_delivery() -> None:
    # Given an organisation stack keeping an instant tier, whose installation selects one repository
    config = stack_config(
        github=app_github(scope=OWNER),
        warm_pool_minimum={"large": {"instant": 1}},
    )
    with local_control_plane(config, pause=lambda _seconds: None) as local:
        state = local.github.state
        app, lib = f"{OWNER}/app", f"{OWNER}/lib"
        installation = state.installations[INSTALLATION_ID]
        installation.repositories = {app}
        # When refresh runs / Then the tier's group admits that repository alone
        local.refresh()
        [group] = [g for g in state.groups_of(OWNER) if g.name == INSTANT_RUNNER_GROUP]
        assert (group.visibility, group.selected_repository_ids) == ("selected", {state.repository_id(app)})
        # When the owner changes the selection and its delivery never comes, and refresh runs again
        installation.repositories = {lib}
        local.refresh()
        # Then the group follows the installation
        assert group.selected_repository_ids == {state.repository_id(lib)}
        accounting = local.accounting()
        assert accounting.holds, accounting.problems
