"""The heartbeat, in a thread of its own: a slow runner start or cleanup never makes the agent look dead."""

from __future__ import annotations

import threading

from agent.aws_errors import AWS_FAILURES, fault_of
from agent.log import EventLog
from agent.ports import OwnRecord


class Heartbeat(threading.Thread):
    def __init__(
        self,
        records: OwnRecord,
        instance_id: str,
        period_seconds: float,
        stop: threading.Event,
        log: EventLog,
    ) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._records = records
        self._instance_id = instance_id
        self._period = period_seconds
        self._stopping = stop
        self._log = log
        self._failing = False

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._records.write_heartbeat(self._instance_id)
            except AWS_FAILURES as exc:
                if not self._failing:
                    self._log.warning(
                        "heartbeat not written; retrying every period", fault=fault_of(exc), error=str(exc)
                    )
                self._failing = True
            except Exception:
                # Whatever went wrong, the next period tries again: a dead heartbeat thread would
                # get a healthy instance discarded.
                self._log.exception("heartbeat failed unexpectedly")
                self._failing = True
            else:
                if self._failing:
                    self._log.info("heartbeat written again")
                self._failing = False
            self._stopping.wait(self._period)
