"""A failure reason as long as an agent cares to write stays inside Step Functions' quotas (issue 12, defect 5).

Run on f478fe5 with the quota harness ported, this failed: the Claim state's result was 308,067 bytes of
the 262,144 Step Functions allows (Quotas: "Maximum input or output size for a task, state, or
execution"), and the provision failed with States.DataLimitExceeded, which no Catch can take.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from emulator.harness.provision_world import ProvisionWorld, output, provision_world
from emulator.harness.scripted_agents import Script

RUN = "pool=4242"


@pytest.fixture
def world() -> Iterator[ProvisionWorld]:
    with provision_world() as built:
        yield built


def test_an_agents_long_failure_reason_stays_within_step_functions_quotas(
    world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a warm instance whose runner fails to start with a 300 KiB reason (e.g. its log tail)
    failing = world.warm(1).instance_id
    world.agents.script(failing, Script.FAILS_REGISTRATION)
    healthy = world.warm(2).instance_id
    table = world.agents._table
    real = table.write_signal

    def long_reason(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("reason"):
            kwargs["reason"] = "x" * (300 * 1024)
        return real(*args, **kwargs)

    monkeypatch.setattr(table, "write_signal", long_reason)
    # When a run asks for one runner
    result = output(world.provision(RUN, 1))
    # Then the healthy one serves it (and the autouse quota fixture finds no breach)
    assert result["warm"] == [healthy]
