"""Hearing EC2's notices about an instance (domain/interruptions.py): read its record, write what it means.

The record may move between the read and the write (a claim takes an idle instance, a release gives a
running one back): the write's condition names what was read, so a lost write reads again and decides
anew, a few times at most, as a moving record settles within them.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner_pool.domain.interruptions import Ec2Event, Response, respond
from runner_pool.domain.ports import InterruptionRecords
from runner_pool.domain.records import InstanceRecord

ATTEMPTS = 3
"""Reads and writes per notice: each lost write is someone else's transition, and a record makes few."""


@dataclass(frozen=True)
class Heard:
    """What became of one notice: the response written (or NOTHING), and why."""

    instance_id: str
    response: Response
    why: str
    written: bool


class Interruptions:
    def __init__(self, table: InterruptionRecords) -> None:
        self._table = table

    def hear(self, event: Ec2Event) -> Heard:
        instance_id = event.instance_id
        row = respond(event, None)
        for _attempt in range(ATTEMPTS):
            record = self._table.get(instance_id)
            row = respond(event, record)
            if record is None or row.response is Response.NOTHING:
                return Heard(instance_id, row.response, row.why, written=False)
            if self._write(row.response, record):
                return Heard(instance_id, row.response, row.why, written=True)
        return Heard(instance_id, row.response, f"{row.why}; the record kept moving, left as it is", False)

    def _write(self, response: Response, record: InstanceRecord) -> bool:
        """The response's writes, each conditional on the record as read; whether the last one held."""
        written = False
        if response in (Response.MARK_INTERRUPTED, Response.DISCARD) and record.run_key is not None:
            written = self._table.mark_interrupted(record.instance_id, record.run_key).succeeded
        if response in (Response.EXPIRE, Response.DISCARD):
            written = self._table.expire(record.instance_id, run_key=record.run_key).succeeded
        return written
