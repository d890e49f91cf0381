"""The demo's pool scenario, run as `make demo` runs it, so CI notices if the demo stops adding up."""

from __future__ import annotations

import pytest

from emulator import pool_scenario


@pytest.mark.slow
def test_pool_scenario_accounts_for_every_instance(capsys: pytest.CaptureFixture[str]) -> None:
    # Given a warm pool on moto's server and 20 claim workers of four runs racing for it
    # When the scenario runs
    accounted = pool_scenario.run()
    # Then every instance is claimed once, pooled once, or stale, whatever the timing
    # (how many jobs got a warm runner depends on timing under load: the demo prints it, no test asserts it)
    printed = capsys.readouterr().out
    assert accounted, printed
    assert "accounting check: every instance is claimed once, pooled once, or stale" in printed
