"""The demo's machinery on a short scenario: steps played, the report printed, the chart written."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo import scenario
from demo.cost import print_cost
from demo.report import holds, print_report, summary_lines, totals
from demo.timeline_chart import write_chart
from emulator.fake_github import JobSpec
from emulator.world import World

pytestmark = pytest.mark.slow

SHORT = (
    scenario.Arrive(0, "build", (JobSpec("build", scenario.LABEL, seconds=0.5),)),
    scenario.Arrive(1, "lint", (JobSpec("lint", scenario.LABEL, seconds=0.5),), drop_first_queued=True),
)


def test_a_played_scenario_is_reported_and_charted(
    system: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a short scenario, one of whose webhooks is lost
    # When it is played and reported
    played = scenario.play(system, SHORT)
    found = totals(system)
    print_report(system, played, found)
    priced = print_cost(system)
    chart = write_chart(tmp_path / "timeline.html", system.events(), "demo", summary_lines(found))

    # Then both jobs were served, the accounting holds, and the report and the chart say so
    printed = capsys.readouterr().out
    assert holds(found, played, expected_jobs=2), printed
    assert "accounting holds" in printed
    assert "1 failed, 1 redelivered by refresh" in printed
    assert "build" in chart.read_text()
    # And `runner-pool cost` priced the jobs' hand-overs at list prices, the idle pool apart
    assert priced
    assert "(idle pool)" in printed
    assert "2 job(s): $" in printed
