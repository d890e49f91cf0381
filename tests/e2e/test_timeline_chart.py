"""The timeline chart: a self-contained HTML page with a lane per instance and per job."""

from __future__ import annotations

import re
from xml.etree import ElementTree

from demo.timeline_chart import JOB_COLOURS, STATE_COLOURS, render
from emulator.timeline import Happening, Timeline

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_800_000_000.0


def story() -> Timeline:
    """One instance that boots, is claimed, runs one job and is terminated; a second job never starts."""
    timeline = Timeline()
    instance = "i-0abc"
    for at, happening, detail in [
        (0, Happening.LAUNCHED, ""),
        (0, Happening.STATE, "created"),
        (2, Happening.BOOTED, ""),
        (3, Happening.STATE, "running"),
        (9, Happening.STATE, "idle"),
        (12, Happening.TERMINATED, ""),
    ]:
        timeline.record(happening, instance, detail=detail, at=T0 + at)
    timeline.record(Happening.JOB_QUEUED, job="7/build", at=T0 + 0.5)
    timeline.record(Happening.JOB_STARTED, instance, job="7/build", at=T0 + 4)
    timeline.record(Happening.JOB_ENDED, instance, job="7/build", detail="success", at=T0 + 8)
    timeline.record(Happening.JOB_QUEUED, job="8/test", at=T0 + 5)
    return timeline


def svg_of(page: str) -> ElementTree.Element:
    match = re.search(r"<svg.*</svg>", page, re.DOTALL)
    assert match is not None
    return ElementTree.fromstring(match.group(0))  # noqa: S314 - our own output


def test_the_chart_is_one_page_with_nothing_to_fetch() -> None:
    # Given a timeline
    # When it is rendered
    page = render(story().events(), "demo")

    # Then the page carries its picture inline: no script, no stylesheet or image from elsewhere
    assert "<script" not in page
    assert not re.search(r"(src|href)=", page)
    assert svg_of(page).tag == f"{SVG}svg"


def test_the_instance_lane_shows_its_states_and_the_job_it_ran() -> None:
    # Given an instance that went created -> running -> idle and ran one job
    # When the chart is rendered
    svg = svg_of(render(story().events(), "demo"))

    # Then its bars are coloured by those states, with the job's bar among them
    fills = [rect.get("fill") for rect in svg.iter(f"{SVG}rect")]
    for colour in (STATE_COLOURS["created"], STATE_COLOURS["running"], STATE_COLOURS["idle"]):
        assert colour in fills
    assert fills.count(JOB_COLOURS["success"]) == 2  # on the instance's lane and on the job's own


def test_each_job_lane_says_where_it_ran_and_how_long_it_waited() -> None:
    # Given a job that waited 3.5 s for a runner and one that never got one
    # When the chart is rendered
    texts = [text.text or "" for text in svg_of(render(story().events(), "demo")).iter(f"{SVG}text")]

    # Then the lanes say so
    assert "i-0abc, waited 3.5 s" in texts
    assert "still queued" in texts
