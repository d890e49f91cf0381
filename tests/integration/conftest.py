"""The integration tier's shared fixture: the control plane on moto (emulator/harness/control_plane.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.harness.control_plane import LocalControlPlane, local_control_plane


@pytest.fixture
def local() -> Iterator[LocalControlPlane]:
    """The control plane on moto, its steps' in-line pauses passing no time (the clock is a ManualClock
    the test moves); every test ends with the accounting check: each instance has a live record, and
    each live record an instance."""
    with local_control_plane(pause=lambda _seconds: None) as plane:
        yield plane
        accounting = plane.accounting()
        assert accounting.holds, accounting.problems
