"""The stack's log group of job logs over CloudWatch Logs (domain/job_logs.py): an instance's streams
written, a hand-over's lines read back.

Writing is best effort by design: a line that cannot be sent is counted and dropped by the agent
(agent/log_shipping.py), never retried past the product's one retry policy (adapters/aws_clients.py),
so an unreachable or throttling CloudWatch Logs never holds up a job or the scrub.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from runner_pool.adapters import aws_clients
from runner_pool.domain.job_logs import HandOverWindow, LogEvent

STREAM_EXISTS = "ResourceAlreadyExistsException"
"""CreateLogStream's answer for a name already taken (API Reference, CreateLogStream, Errors): the stream
an agent made before its restart, or a stopped instance's before its start."""
FILTER_PAGE = 10_000
"""FilterLogEvents' largest page (API Reference, FilterLogEvents: `limit`, 1 to 10,000)."""


class JobLogStreams:
    """One instance's streams in the log group: made once each, then written a batch at a time."""

    def __init__(self, log_group: str, client: Any) -> None:
        self._group = log_group
        self._client = client
        self._made: set[str] = set()

    def put(self, stream: str, batch: Sequence[LogEvent]) -> int:
        """Send one batch (domain/job_logs.py `batches` makes them); returns how many events CloudWatch
        rejected as too old or too new (`rejectedLogEventsInfo`)."""
        if stream not in self._made:
            aws_clients.attempt(
                lambda: self._client.create_log_stream(logGroupName=self._group, logStreamName=stream),
                (STREAM_EXISTS,),
            )
            self._made.add(stream)
        answer = self._client.put_log_events(
            logGroupName=self._group,
            logStreamName=stream,
            logEvents=[{"timestamp": e.timestamp_ms, "message": e.message} for e in batch],
        )
        return _rejected(answer.get("rejectedLogEventsInfo") or {}, len(batch))


def _rejected(info: dict[str, int], count: int) -> int:
    """Events CloudWatch did not take: those before `tooOldLogEventEndIndex` or `expiredLogEventEndIndex`
    (inclusive) and from `tooNewLogEventStartIndex` on (API Reference, RejectedLogEventsInfo)."""
    old = max(info.get("tooOldLogEventEndIndex", -1), info.get("expiredLogEventEndIndex", -1)) + 1
    new = count - info["tooNewLogEventStartIndex"] if "tooNewLogEventStartIndex" in info else 0
    return min(count, old + new)


class JobLogReader:
    """The operator's reads: an instance's streams between two times."""

    def __init__(self, log_group: str, client: Any) -> None:
        self._group = log_group
        self._client = client

    def events(self, window: HandOverWindow) -> Iterator[tuple[str, int, str]]:
        """(stream, timestamp in ms, message) of every event of the window's streams and times, every page
        of FilterLogEvents (no filter pattern: which lines are the hand-over's is the domain's rule)."""
        request: dict[str, Any] = {
            "logGroupName": self._group,
            "logStreamNames": window.streams,
            "startTime": window.start_ms(),
            "endTime": window.end_ms(),
            "limit": FILTER_PAGE,
        }
        while True:
            page = self._client.filter_log_events(**request)
            for event in page.get("events", []):
                yield event["logStreamName"], int(event["timestamp"]), event["message"]
            # A page may be empty and still name a next one (API Reference, FilterLogEvents: nextToken).
            token = page.get("nextToken")
            if not token or token == request.get("nextToken"):
                return
            request["nextToken"] = token
