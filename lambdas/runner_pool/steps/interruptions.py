"""Hearing EC2's notices about an instance (domain/interruptions.py): read its record, write what it means.

The record may move between the read and the write (a claim takes an idle instance, a release gives a
running one back): the write's condition names what was read, so a lost write reads again and decides
anew, a few times at most, as a moving record settles within them.

An interruption warning of one of our spot instances is also counted for its class's spot circuit breaker
(domain/spot_breaker.py), after the record's own response, whatever state the record is in: an idle
instance taken back is as much a sign of a wave as a busy one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from runner_pool.domain.interruptions import Ec2Event, Notice, Response, respond
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.ports import InterruptionRecords, SpotBreakerNotes
from runner_pool.domain.records import InstanceRecord, UsageClass
from runner_pool.domain.spot_breaker import Noted

ATTEMPTS = 3
"""Reads and writes per notice: each lost write is someone else's transition, and a record makes few."""


@dataclass(frozen=True)
class Heard:
    """What became of one notice: the response written (or NOTHING), and why."""

    instance_id: str
    response: Response
    why: str
    written: bool
    breaker: Noted | None = None
    """The interruption as its class's spot circuit breaker counted it; None when not counted."""


class Interruptions:
    def __init__(self, table: InterruptionRecords, breaker: SpotBreakerNotes | None = None) -> None:
        self._table = table
        self._breaker = breaker

    def hear(self, event: Ec2Event) -> Heard:
        instance_id = event.instance_id
        row = respond(event, None)
        record: InstanceRecord | None = None
        heard: Heard | None = None
        for _attempt in range(ATTEMPTS):
            record = self._table.get(instance_id)
            row = respond(event, record)
            if record is None or row.response is Response.NOTHING:
                heard = Heard(instance_id, row.response, row.why, written=False)
                break
            if self._write(row.response, record):
                heard = Heard(instance_id, row.response, row.why, written=True)
                break
        if heard is None:
            heard = Heard(
                instance_id, row.response, f"{row.why}; the record kept moving, left as it is", False
            )
        return self._count(event, record, heard)

    def _count(self, event: Ec2Event, record: InstanceRecord | None, heard: Heard) -> Heard:
        """An interruption warning of a spot instance of ours, counted for its class's breaker."""
        if (
            self._breaker is None
            or event.notice is not Notice.INTERRUPTION
            or record is None
            or record.usage_class is not UsageClass.SPOT
            or record.state is InstanceState.TERMINATED
        ):
            return heard
        return replace(heard, breaker=self._breaker.note(record.resource_class, record.instance_id))

    def _write(self, response: Response, record: InstanceRecord) -> bool:
        """The response's writes, each conditional on the record as read; whether the last one held."""
        written = False
        if response in (Response.MARK_INTERRUPTED, Response.DISCARD) and record.run_key is not None:
            written = self._table.mark_interrupted(record.instance_id, record.run_key).succeeded
        if response in (Response.EXPIRE, Response.DISCARD):
            written = self._table.expire(record.instance_id, run_key=record.run_key).succeeded
        return written
