"""The timeline as a chart: one self-contained HTML file (inline SVG, no script, no external asset).

Top: a lane per instance, from launch to termination, coloured by the state its record was in,
with the jobs it ran drawn on it and a mark where it crashed. Bottom: a lane per job, from queued
to started (the wait for a runner) to completed, naming the instance that ran it. Hovering any bar
shows what it is (SVG titles).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from emulator.timeline import Happening, TimelineEvent
from runner_pool.domain.clock import Epoch

WIDTH = 1200
LABEL_WIDTH = 210
RIGHT_MARGIN = 190
LANE = 18
GAP = 5
AXIS = 28
STATE_COLOURS = {
    "booting": "#deebf7",
    "created": "#9ecae1",
    "claimed": "#fdae6b",
    "running": "#74c476",
    "idle": "#d9d9d9",
    "expired": "#fb6a4a",
}
JOB_COLOURS = {"waiting": "#fee391", "success": "#238b45", "failure": "#cb181d", "cancelled": "#737373"}
TICKS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class Bar:
    start: Epoch
    end: Epoch
    colour: str
    title: str


@dataclass
class Lane:
    label: str
    bars: list[Bar]
    marks: list[tuple[Epoch, str, str]]
    """(time, symbol, title)."""
    note: str = ""


def write_chart(path: Path, events: Sequence[TimelineEvent], title: str, summary: Iterable[str] = ()) -> Path:
    """Write the chart of `events` to `path` (an .html file); returns the path."""
    path.write_text(render(events, title, summary))
    return path


def render(events: Sequence[TimelineEvent], title: str, summary: Iterable[str] = ()) -> str:
    if not events:
        raise ValueError("nothing happened: a timeline needs events")
    start, end = min(e.at for e in events), max(e.at for e in events)
    end = max(end, start + 1.0)
    instances, jobs = instance_lanes(events, end), job_lanes(events, end)
    scale = _Scale(start, end)
    rows: list[str] = []
    y = AXIS
    rows.append(_heading("Instances (coloured by the state of their record)", y))
    y += LANE
    for lane in instances:
        rows.append(_lane(lane, y, scale, inner=True))
        y += LANE + GAP
    y += LANE
    rows.append(_heading("Jobs (waiting for a runner, then running)", y))
    y += LANE
    for lane in jobs:
        rows.append(_lane(lane, y, scale, inner=False))
        y += LANE + GAP
    height = y + LANE
    svg = "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
            _axis(scale, height),
            *rows,
            "</svg>",
        ]
    )
    legend = " ".join(
        f'<span class="key"><i style="background:{colour}"></i>{html.escape(name)}</span>'
        for name, colour in [*STATE_COLOURS.items(), *JOB_COLOURS.items()]
    )
    items = "".join(f"<li>{html.escape(line)}</li>" for line in summary)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #252525; }}
.key {{ margin-right: 14px; white-space: nowrap; }}
.key i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -2px; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
<ul>{items}</ul>
<p>{legend} <span class="key">&#x2715; crashed</span></p>
{svg}
</body></html>
"""


def instance_lanes(events: Sequence[TimelineEvent], end: Epoch) -> list[Lane]:
    lanes: list[Lane] = []
    for instance_id in _in_order(e.instance_id for e in events if e.happening is Happening.LAUNCHED):
        own = [e for e in events if e.instance_id == instance_id]
        launched = _at(own, Happening.LAUNCHED) or own[0].at
        terminated = _at(own, Happening.TERMINATED)
        finish = terminated or end
        bars: list[Bar] = []
        booted = _at(own, Happening.BOOTED)
        bars.append(Bar(launched, booted or finish, STATE_COLOURS["booting"], "booting"))
        states = [e for e in own if e.happening is Happening.STATE and e.detail in STATE_COLOURS]
        for state, following in zip(states, [*states[1:], None], strict=True):
            until = min(following.at if following else finish, finish)
            bars.append(Bar(max(state.at, launched), until, STATE_COLOURS[state.detail], state.detail))
        for job, started, ended, outcome in _runs_on(own, finish):
            bars.append(Bar(started, ended, JOB_COLOURS.get(outcome, JOB_COLOURS["success"]), f"job {job}"))
        marks = [(e.at, "\u2715", "crashed") for e in own if e.happening is Happening.CRASHED]
        note = "terminated" if terminated else "still there at the end"
        lanes.append(Lane(instance_id, bars, marks, note))
    return lanes


def job_lanes(events: Sequence[TimelineEvent], end: Epoch) -> list[Lane]:
    lanes: list[Lane] = []
    for job in _in_order(e.job for e in events if e.happening is Happening.JOB_QUEUED):
        own = {e.happening: e for e in events if e.job == job}
        queued = own[Happening.JOB_QUEUED].at
        started, ended = own.get(Happening.JOB_STARTED), own.get(Happening.JOB_ENDED)
        outcome = ended.detail if ended else ""
        waited_until = started.at if started else (ended.at if ended else end)
        bars = [Bar(queued, waited_until, JOB_COLOURS["waiting"], f"waiting {waited_until - queued:.1f} s")]
        if started is not None:
            run_end = ended.at if ended else end
            bars.append(Bar(started.at, run_end, JOB_COLOURS.get(outcome, JOB_COLOURS["success"]), outcome))
            note = f"{started.instance_id or '?'}, waited {started.at - queued:.1f} s"
        else:
            note = outcome or "still queued"
        lanes.append(Lane(job, bars, [], note))
    return lanes


class _Scale:
    def __init__(self, start: Epoch, end: Epoch) -> None:
        self.start, self.end = start, end
        self._per_second = (WIDTH - LABEL_WIDTH - RIGHT_MARGIN) / (end - start)

    def x(self, at: Epoch) -> float:
        return LABEL_WIDTH + (at - self.start) * self._per_second

    def tick(self) -> int:
        span = self.end - self.start
        return next((t for t in TICKS if span / t <= 12), TICKS[-1])


def _axis(scale: _Scale, height: int) -> str:
    tick = scale.tick()
    parts = []
    for n in range(math.floor((scale.end - scale.start) / tick) + 1):
        x = scale.x(scale.start + n * tick)
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS - 6}" x2="{x:.1f}" y2="{height}" stroke="#f0f0f0"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{AXIS - 10}" text-anchor="middle" fill="#636363">+{n * tick}s</text>'
        )
    return "\n".join(parts)


def _heading(text: str, y: int) -> str:
    return f'<text x="4" y="{y + LANE - 5}" font-weight="bold" font-size="13">{html.escape(text)}</text>'


def _lane(lane: Lane, y: int, scale: _Scale, *, inner: bool) -> str:
    parts = [f'<text x="4" y="{y + LANE - 5}">{html.escape(lane.label)}</text>']
    for index, bar in enumerate(lane.bars):
        x0, x1 = scale.x(bar.start), scale.x(max(bar.end, bar.start))
        # On an instance's lane the jobs (drawn last) sit inside the state bars, half their height.
        job_bar = inner and bar.title.startswith("job ")
        top, tall = (y + LANE / 4, LANE / 2) if job_bar else (y, LANE)
        title = f"<title>{html.escape(bar.title)}</title>" if bar.title else ""
        parts.append(
            f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 1.0):.1f}" height="{tall:.1f}" '
            f'fill="{bar.colour}" data-bar="{index}">{title}</rect>'
        )
    for at, symbol, title in lane.marks:
        parts.append(
            f'<text x="{scale.x(at):.1f}" y="{y + LANE - 4}" text-anchor="middle" fill="#a50f15" '
            f'font-size="15" font-weight="bold">{symbol}<title>{html.escape(title)}</title></text>'
        )
    last = max((bar.end for bar in lane.bars), default=scale.start)
    parts.append(
        f'<text x="{scale.x(last) + 6:.1f}" y="{y + LANE - 5}" fill="#636363">{html.escape(lane.note)}</text>'
    )
    return "\n".join(parts)


def _runs_on(own: Sequence[TimelineEvent], finish: Epoch) -> list[tuple[str, Epoch, Epoch, str]]:
    """(job, started, ended, outcome) for each job that ran on this instance."""
    ended = {e.job: e for e in own if e.happening is Happening.JOB_ENDED}
    return [
        (
            e.job or "",
            e.at,
            ended[e.job].at if e.job in ended else finish,
            ended[e.job].detail if e.job in ended else "",
        )
        for e in own
        if e.happening is Happening.JOB_STARTED
    ]


def _at(events: Sequence[TimelineEvent], happening: Happening) -> Epoch | None:
    return next((e.at for e in events if e.happening is happening), None)


def _in_order(names: Iterable[str | None]) -> list[str]:
    """Distinct names, in the order they first appear."""
    return list(dict.fromkeys(name for name in names if name))
