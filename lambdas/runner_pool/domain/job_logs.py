"""The job logs: what each instance ships to the stack's log group, in which streams, in batches CloudWatch
Logs accepts, and how one hand-over's lines are picked out of a reused instance's.

Each instance writes two streams, `<instance id>/agent` (the agent's own JSON lines) and
`<instance id>/runner` (the runner's diagnostic logs, `_diag/Runner_*.log` and `Worker_*.log`, one event a
line). Two, not one with a source field: the agent's lines go out as they are written while the runner's
are read at the end of each hand-over, so each stream's events reach it in their own order, and an
operator can read one source alone in the console (`aws logs tail --log-stream-name-prefix`). Every event
is one JSON object carrying the hand-over it belongs to: its run key and the id of the runner GitHub
registered for it (`runner_id`), one per hand-over even when a run's next job comes to the same instance
under the same run key. A line of no hand-over (the boot, an idle instance) carries neither.

PutLogEvents' rules (Amazon CloudWatch Logs API Reference, PutLogEvents): "The maximum batch size is
1,048,576 bytes. This size is calculated as the sum of all event messages in UTF-8, plus 26 bytes for
each log event"; "The maximum number of log events in a batch is 10,000"; "The log events in the batch
must be in chronological order by their timestamp"; "A batch of log events in a single request cannot
span more than 24 hours"; each event at most 256 KB (1 MB since 2025; the smaller is kept); and events
"more than 2 hours in the future" or "older than 14 days or preceding the log group's retention period"
are rejected. The sequence token "is now ignored": batches need no order between them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runner_pool.domain.clock import Epoch
from runner_pool.domain.job_story import Story

MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD_BYTES = 26
MAX_BATCH_EVENTS = 10_000
MAX_BATCH_SPAN_MS = 24 * 3600 * 1000
MAX_EVENT_BYTES = 256 * 1024 - EVENT_OVERHEAD_BYTES
"""An event's message at most, so that message and overhead stay within the older 256 KB limit."""
TRUNCATED = " …[truncated]"
MAX_PAST_MS = 14 * 24 * 3600 * 1000
MAX_FUTURE_MS = 2 * 3600 * 1000


class Source(StrEnum):
    """Where a line comes from: the stream it goes to after the instance's id."""

    AGENT = "agent"
    RUNNER = "runner"


def stream_name(instance_id: str, source: Source) -> str:
    """`<instance id>/<source>`: CreateLogStream refuses ':' and '*' in a name (API Reference), which
    neither part holds."""
    return f"{instance_id}/{source.value}"


@dataclass(frozen=True)
class LogEvent:
    timestamp_ms: int
    message: str

    @property
    def size(self) -> int:
        """What the event counts against a batch's bytes."""
        return len(self.message.encode()) + EVENT_OVERHEAD_BYTES

    @classmethod
    def of(cls, timestamp_ms: int, fields: Mapping[str, Any]) -> LogEvent:
        """An event of one JSON object that fits one event: while it does not, its longest text is halved
        (and says so), so the message stays a JSON object whatever a line held."""
        kept = dict(fields)
        while True:
            message = json.dumps(kept, default=str)
            if len(message.encode()) <= MAX_EVENT_BYTES:
                return cls(timestamp_ms, message)
            key = max(kept, key=lambda name: len(str(kept[name])))
            text = str(kept[key])
            kept[key] = text[: len(text) // 2] + TRUNCATED


@dataclass(frozen=True)
class Batches:
    """Events split into PutLogEvents batches, and those no batch may carry."""

    batches: tuple[tuple[LogEvent, ...], ...]
    stale: int = 0
    """Older than CloudWatch keeps (14 days): it would reject them, so they are not sent."""


def batches(events: Iterable[LogEvent], now_ms: int) -> Batches:
    """The events in time order (stably: lines of one time keep the order they were written in), cut into
    batches within PutLogEvents' count, bytes and 24-hour span; an event from the future (a clock that
    jumped) is sent as of the latest time CloudWatch takes, never rejected."""
    kept: list[LogEvent] = []
    stale = 0
    for event in events:
        if event.timestamp_ms < now_ms - MAX_PAST_MS:
            stale += 1
            continue
        at = min(event.timestamp_ms, now_ms + MAX_FUTURE_MS - 1000)
        kept.append(event if at == event.timestamp_ms else LogEvent(at, event.message))
    kept.sort(key=lambda event: event.timestamp_ms)
    cut: list[tuple[LogEvent, ...]] = []
    current: list[LogEvent] = []
    size = 0
    for event in kept:
        full = (
            len(current) == MAX_BATCH_EVENTS
            or size + event.size > MAX_BATCH_BYTES
            or (current and event.timestamp_ms - current[0].timestamp_ms > MAX_BATCH_SPAN_MS)
        )
        if full:
            cut.append(tuple(current))
            current, size = [], 0
        current.append(event)
        size += event.size
    if current:
        cut.append(tuple(current))
    return Batches(tuple(cut), stale)


# --- one hand-over's lines, read back ------------------------------------------------------------------


@dataclass(frozen=True)
class HandOverWindow:
    """Which lines of an instance's streams belong to one job's hand-over."""

    instance_id: str
    start: Epoch
    end: Epoch
    runner_id: int | None
    """GitHub's id of the job's runner; None when GitHub was not asked: every line of the window then."""

    MARGIN_SECONDS = 5.0
    """Read this much around the story's times: the agent's clock is checked within 1 s at boot
    (agent/clock_check.py), and a step's time is when the control plane saw it, after the agent wrote."""

    @property
    def streams(self) -> list[str]:
        return [stream_name(self.instance_id, source) for source in Source]

    def start_ms(self) -> int:
        return int((self.start - self.MARGIN_SECONDS) * 1000)

    def end_ms(self) -> int:
        return int((self.end + self.MARGIN_SECONDS) * 1000)

    def holds(self, fields: Mapping[str, Any]) -> bool:
        return self.runner_id is None or fields.get("runner_id") == self.runner_id


@dataclass(frozen=True)
class JobLine:
    at: Epoch
    source: Source
    fields: Mapping[str, Any]
    """The event's JSON object (`message`, `level`, the hand-over's identity, ...)."""


def lines_of(window: HandOverWindow, events: Iterable[tuple[str, int, str]]) -> list[JobLine]:
    """The hand-over's lines among (stream, timestamp in ms, message) events, in time order (the order
    written within one time); an event that is not one of ours (not a JSON object) is left out."""
    found = []
    for stream, timestamp_ms, message in events:
        source = stream.rpartition("/")[2]
        try:
            fields = json.loads(message)
        except ValueError:
            continue
        if source not in Source.__members__.values() or not isinstance(fields, dict):
            continue
        if window.holds(fields):
            found.append(JobLine(timestamp_ms / 1000, Source(source), fields))
    return sorted(found, key=lambda line: line.at)


def window_of(story: Story, now: Epoch) -> HandOverWindow | None:
    """The window of a job's hand-over, from its story: from its first timed step (queued) to the scrub's
    verdict, or to now while there is none (the job still under way); None when no instance is named."""
    if story.instance_id is None:
        return None
    times = [step.at for step in story.steps if step.at is not None]
    scrubbed = [step.at for step in story.steps if step.what == "scrub" and step.at is not None]
    return HandOverWindow(
        story.instance_id, min(times, default=now), max(scrubbed, default=now), story.runner_id
    )
