"""The integration tier's shared fixtures: the control plane on moto (emulator/harness/control_plane.py),
the provision world around it (emulator/harness/provision_world.py), the webhook and the dispatcher on
moto (emulator/harness/webhooks.py), and the fake GitHub with the App installed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from emulator.fake_github import FakeGitHub
from emulator.harness.control_plane import LocalControlPlane, local_control_plane, stack_config
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from emulator.harness.provision_world import ProvisionWorld, provision_world
from emulator.harness.webhooks import IngressWorld, ingress_world
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig


def app_github(**settings: Any) -> dict[str, Any]:
    """The `github` settings of the test App installed at its repository, `settings` on top (another scope,
    a runner group, a registration budget)."""
    return {"app_id": str(APP_ID), "installation_id": INSTALLATION_ID, "scope": f"{OWNER}/{REPO}", **settings}


@contextmanager
def accounted_plane(
    config: StackConfig | None = None, *, pause: Callable[[float], None] = time.sleep
) -> Iterator[LocalControlPlane]:
    """The control plane on moto (local_control_plane), checked when the test is done with it: each
    instance has a live record, and each live record an instance."""
    with local_control_plane(config, pause=pause) as plane:
        yield plane
        accounting = plane.accounting()
        assert accounting.holds, accounting.problems


@contextmanager
def accounted_world(config: StackConfig | None = None) -> Iterator[ProvisionWorld]:
    """The provision world (provision_world), checked as `accounted_plane` is when the test is done."""
    with provision_world(config) as built:
        yield built
        accounting = built.accounting()
        assert accounting.holds, accounting.problems


@pytest.fixture
def local() -> Iterator[LocalControlPlane]:
    """The control plane on moto, its steps' in-line pauses passing no time (the clock is a ManualClock
    the test moves); every test ends with the accounting check: each instance has a live record, and
    each live record an instance."""
    with accounted_plane(pause=lambda _seconds: None) as plane:
        yield plane


@pytest.fixture
def world() -> Iterator[ProvisionWorld]:
    """The provision world with the default config; every test ends with the accounting check."""
    with accounted_world() as built:
        yield built


@pytest.fixture
def ingress() -> Iterator[IngressWorld]:
    """The webhook's and the dispatcher's AWS on moto, with both handlers (`ingress_world`)."""
    with ingress_world() as world:
        yield world


@pytest.fixture
def refusing_world() -> Iterator[ProvisionWorld]:
    """A runner group the repository does not have: GitHub answers every registration 422."""
    with accounted_world(stack_config(github=app_github(runner_group_id=7))) as built:
        yield built


@pytest.fixture
def fake(app_key: AppKey, clock: ManualClock) -> Iterator[FakeGitHub]:
    """The fake GitHub, on the test's clock, with the App installed on OWNER."""
    with FakeGitHub(APP_ID, app_key.public_pem, clock=clock) as github:
        github.state.add_installation(INSTALLATION_ID, OWNER)
        yield github
