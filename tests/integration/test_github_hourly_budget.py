"""GitHub's hourly limit budgeted (issue 38, item 4): the fake GitHub counts an installation's requests
in the hour as GitHub does ("Rate limits for the REST API"), our client reads the remainder off every
answer into the shared budget, and Create launches no more instances than the hour can register."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.harness.control_plane import LocalControlPlane, local_control_plane
from emulator.harness.github_app import INSTALLATION_ID
from emulator.harness.provision_world import ProvisionWorld, output
from runner_pool.domain.registration_budget import REGISTRATION_FLOOR

LIMIT = 5000
KEPT = int(LIMIT * REGISTRATION_FLOOR)


@pytest.fixture
def local() -> Iterator[LocalControlPlane]:
    with local_control_plane() as plane:
        yield plane


def test_the_fake_counts_the_installations_requests_and_refuses_past_the_hour(
    local: LocalControlPlane,
) -> None:
    # Given an installation with two requests left in its hour
    github = local.plane.github
    github.runners(None)
    local.github.state.use_hourly(INSTALLATION_ID, LIMIT - 2)
    # When it makes three / Then the first two are answered and the third is refused as rate limited
    github.runners(None)
    github.runners(None)
    with pytest.raises(Exception, match="rate limit"):
        github.runners(None)


def test_every_answers_hourly_remainder_reaches_the_shared_budget(local: LocalControlPlane) -> None:
    # Given a fresh hour / When the client makes a request
    local.plane.github.runners(None)
    # Then the budget knows what GitHub said is left: the limit less the requests made this hour
    hourly = local.plane.registration_budget.hourly()
    assert hourly is not None
    used, reset = local.github.state.hourly_status(INSTALLATION_ID)
    assert (hourly.limit, hourly.remaining, hourly.reset_at) == (LIMIT, LIMIT - used, int(reset))


def test_create_launches_no_more_than_the_hour_can_register(world: ProvisionWorld) -> None:
    # Given an hour with three requests left above the floor, as a GitHub answer told the budget
    world.plane.github.runners(None)  # the hour's window opens
    world.github.state.use_hourly(INSTALLATION_ID, LIMIT - KEPT - 4)
    world.plane.github.runners(None)
    # When a run asks for five runners with an empty pool
    result = output(world.provision("pool=5151", 5))
    # Then three instances were launched, not five
    launched = len(result["cold"]) + len(result["expired"])
    assert launched == 3
    assert world.ec2.calls["CreateFleet"] >= 1
