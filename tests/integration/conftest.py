"""The integration tier's shared fixtures: the control plane on moto (emulator/harness/control_plane.py),
the provision world around it (emulator/harness/provision_world.py), and the fake GitHub with the App
installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.fake_github import FakeGitHub
from emulator.harness.control_plane import LocalControlPlane, local_control_plane
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, AppKey
from emulator.harness.provision_world import ProvisionWorld, provision_world
from runner_pool.domain.clock import ManualClock


@pytest.fixture
def local() -> Iterator[LocalControlPlane]:
    """The control plane on moto, its steps' in-line pauses passing no time (the clock is a ManualClock
    the test moves); every test ends with the accounting check: each instance has a live record, and
    each live record an instance."""
    with local_control_plane(pause=lambda _seconds: None) as plane:
        yield plane
        accounting = plane.accounting()
        assert accounting.holds, accounting.problems


@pytest.fixture
def world() -> Iterator[ProvisionWorld]:
    """The provision world with the default config; every test ends with the accounting check."""
    with provision_world() as built:
        yield built
        accounting = built.accounting()
        assert accounting.holds, accounting.problems


@pytest.fixture
def fake(app_key: AppKey, clock: ManualClock) -> Iterator[FakeGitHub]:
    """The fake GitHub, on the test's clock, with the App installed on OWNER."""
    with FakeGitHub(APP_ID, app_key.public_pem, clock=clock) as github:
        github.state.add_installation(INSTALLATION_ID, OWNER)
        yield github
