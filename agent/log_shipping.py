"""The agent's lines and the runner's diagnostic logs, shipped to the stack's log group (domain/job_logs.py).

The agent's own lines go to `<instance id>/agent` as they are written; the runner's `_diag` files
(`Runner_*.log`, `Worker_*.log`: actions/runner writes them under its directory) are read once the runner
has stopped and before the scrub empties `_diag`, each line wrapped with the hand-over it belongs to, and
sent to `<instance id>/runner`. Nothing of them stays on disk for the next job: the scrub removes the
files as before, and what is read lives in this process's memory until sent.

A background thread sends a batch every period, or at once when asked (the release waits for the runner's
lines to be sent, for at most `flush_seconds`, then goes on with the scrub whatever happened). Sending is
best effort: a call the product's retry policy (adapters/aws_clients.py: three tries, throttling backed
off) could not get through drops its batch, counted, and the journal says so; lines past `max_pending`
waiting are dropped and counted the same way. So CloudWatch Logs unreachable, throttling or refusing
never blocks a job, the scrub or the agent's loop, and never grows the agent's memory without bound.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from agent.log import EventLog
from runner_pool.domain.job_logs import LogEvent, Source, batches, stream_name

DIAG_FILES = ("Runner_*.log", "Worker_*.log")
"""The runner's diagnostic logs in `_diag` (actions/runner: the listener's `Runner_<time>-utc.log`, each
job's worker's `Worker_<time>-utc.log`)."""
MAX_DIAG_BYTES = 8 * 1024 * 1024
"""The most of one hand-over's diagnostic logs that is read: a job can write anything into `_diag` (it
runs as the runner's account), and the agent's memory is not the job's to fill."""
_DIAG_TIME = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})Z (\w+) ")
"""A diagnostic line's start, `[2026-11-29 13:22:23Z INFO Runner] ...`: its time (UTC) and level; a line
without it (a stack trace's) belongs to the line before."""


class Streams(Protocol):
    """What the shipper writes through (adapters/job_logs.py JobLogStreams)."""

    def put(self, stream: str, batch: list[LogEvent]) -> int: ...


@dataclass
class _Pending:
    events: dict[Source, list[LogEvent]] = field(default_factory=lambda: {source: [] for source in Source})
    count: int = 0
    queued: int = 0
    """Lines queued since the start; `done` catches up as they are sent or dropped."""
    done: int = 0


class LogShipper:
    def __init__(
        self,
        streams: Streams,
        instance_id: str,
        log: EventLog,
        *,
        period_seconds: float = 5.0,
        max_pending: int = 20_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._streams = streams
        self._instance_id = instance_id
        self._log = log.journal
        self._period = period_seconds
        self._max_pending = max_pending
        self._clock = clock
        self._pending = _Pending()
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"log-shipper-{instance_id}", daemon=True)
        self.sent = 0
        self.dropped = 0

    # --- what the agent hands over

    def agent_line(self, at: float, fields: dict[str, Any]) -> None:
        """An agent's line (agent/log.py's sink): queued, never waited on."""
        self._queue(Source.AGENT, [LogEvent.of(int(at * 1000), fields)])

    def runner_lines(self, events: list[LogEvent]) -> None:
        self._queue(Source.RUNNER, events)

    def _queue(self, source: Source, events: list[LogEvent]) -> None:
        with self._changed:
            room = max(0, self._max_pending - self._pending.count)
            kept, over = events[:room], len(events) - min(room, len(events))
            self._pending.events[source] += kept
            self._pending.count += len(kept)
            self._pending.queued += len(events)
            self._pending.done += over
            self.dropped += over

    # --- the thread

    def start(self) -> None:
        self._thread.start()

    def flush(self, timeout_seconds: float) -> bool:
        """Send what is queued now, waiting at most `timeout_seconds`; whether all went or was dropped."""
        if not self._thread.is_alive():
            return False
        with self._changed:
            target = self._pending.queued
        self._wake.set()
        deadline = time.monotonic() + timeout_seconds
        with self._changed:
            while self._pending.done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def close(self, timeout_seconds: float) -> None:
        """The last lines sent, for at most `timeout_seconds`; then the thread ends."""
        self.flush(timeout_seconds)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_seconds)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._period)
            self._wake.clear()
            self._send_pending()

    def _send_pending(self) -> None:
        with self._changed:
            taken, self._pending.events = self._pending.events, {source: [] for source in Source}
            self._pending.count = 0
        for source, events in taken.items():
            if events:
                self._send(source, events)

    def _send(self, source: Source, events: list[LogEvent]) -> None:
        cut = batches(events, int(self._clock() * 1000))
        refused = cut.stale
        stream = stream_name(self._instance_id, source)
        for batch in cut.batches:
            try:
                rejected = self._streams.put(stream, list(batch))
            except Exception as exc:  # whatever stopped the call, its lines are dropped
                self.dropped += len(batch)
                self._log.warning(
                    "could not ship log lines to CloudWatch Logs; dropped",
                    stream=stream,
                    dropped=len(batch),
                    dropped_in_all=self.dropped,
                    error=str(exc),
                )
                continue
            self.sent += len(batch) - rejected
            refused += rejected
        self.dropped += refused
        with self._changed:
            self._pending.done += len(events)
            self._changed.notify_all()


def diag_events(diag_dir: Path, identity: Mapping[str, Any], now: float) -> tuple[list[LogEvent], int]:
    """The runner's diagnostic lines, one event each, as JSON carrying `identity` (the hand-over's run key
    and runner id), and how many bytes were left unread past MAX_DIAG_BYTES. Only regular files are read,
    never through a link the job may have planted."""
    events: list[LogEvent] = []
    budget = MAX_DIAG_BYTES
    left_unread = 0
    names = sorted({path.name for pattern in DIAG_FILES for path in diag_dir.glob(pattern)})
    for name in names:
        content, size = _read_regular(diag_dir / name, budget)
        budget -= len(content)
        left_unread += size - len(content)
        events += _diag_lines(name, content.decode(errors="replace"), identity, now)
    return events, left_unread


def _read_regular(path: Path, budget: int) -> tuple[bytes, int]:
    """At most `budget` bytes of a regular file, and its size; nothing of anything else."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b"", 0
    with contextlib.closing(os.fdopen(descriptor, "rb")) as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return b"", 0
        return handle.read(max(0, budget)), info.st_size


def _diag_lines(name: str, text: str, identity: Mapping[str, Any], now: float) -> list[LogEvent]:
    events = []
    at, level = now, None
    for line in text.splitlines():
        if not line.strip():
            continue
        found = _DIAG_TIME.match(line)
        if found is not None:
            stamped = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            at, level = stamped.timestamp(), found[2]
        fields = {
            "time": datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds"),
            "level": level,
            "file": name,
            "message": line,
            **identity,
        }
        events.append(LogEvent.of(int(at * 1000), fields))
    return events
