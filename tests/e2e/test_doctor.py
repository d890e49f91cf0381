"""`runner-pool doctor` against the emulator's own stack, deployed as `make demo` deploys it."""

from __future__ import annotations

import io

import pytest

from emulator.doctor import as_after_first_fleet, examine
from emulator.world import World

pytestmark = pytest.mark.slow


def test_the_emulators_stack_is_all_clear(system: World) -> None:
    # Given the emulator's stack, its account and App set up as the deploy guide says
    as_after_first_fleet(system)
    out = io.StringIO()

    # When the doctor examines it
    code = examine(system, out)

    # Then every check passes against the stack's own webhook, secrets, state machine and launch templates
    lines = out.getvalue().splitlines()
    assert code == 0, lines
    assert all(line.startswith("ok") for line in lines[:-1]), lines
    assert lines[-1] == "all clear: nothing stops jobs (0 warning(s))"
    assert system.stack.webhook.url in out.getvalue()
