"""`runner-pool doctor` against the emulator's own stack, deployed as `make demo` deploys it: on the
organisation, registering in runner groups."""

from __future__ import annotations

import io

import pytest

from emulator.doctor import as_after_first_fleet, examine
from emulator.fake_github import JobSpec
from emulator.world import World
from tests.e2e.conftest import LABEL, completed

pytestmark = pytest.mark.slow


def doctor_lines(system: World) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = examine(system, out)
    return code, out.getvalue().splitlines()


def test_the_emulators_stack_is_all_clear_once_a_job_made_its_repositorys_group(system: World) -> None:
    # Given the emulator's stack, its account and App set up as the deploy guide says
    as_after_first_fleet(system)

    # When the doctor examines it before any job, and again after one job
    before, first = doctor_lines(system)
    completed(system, system.start_run("build", JobSpec("build", LABEL, seconds=0.5)))
    code, lines = doctor_lines(system)

    # Then before the job only the runner group line warns (none made yet), and nothing stops jobs
    assert before == 0, first
    assert [line.split("  ")[1].strip() for line in first if line.startswith("warn")] == ["runner group"], (
        first
    )
    # And after it every check passes against the stack's own webhook, secrets, state machine, launch
    # templates and the repository's runner group
    assert code == 0, lines
    assert all(line.startswith("ok") for line in lines[:-1]), lines
    assert lines[-1] == "all clear: nothing stops jobs (0 warning(s))"
    assert system.stack.webhook.url in "\n".join(lines)
    assert any(
        "github.registration runner-group (the default for the scope octo-org)" in line for line in lines
    )
