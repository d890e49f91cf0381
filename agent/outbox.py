"""The agent's signals on their way to the state table: the latest one is kept until it is written.

The signal item holds one signal, so a newer signal replaces one that could not be written yet
(a UD_REG_OK still waiting out throttling is moot once the run key is released). The pending
signal is remembered across restarts of the agent: a receipt the control plane waits for is never
lost to a crash.
"""

from __future__ import annotations

from agent.aws_errors import AWS_FAILURES, fault_of
from agent.log import EventLog
from agent.memory import MemoryFile, PendingSignal
from agent.ports import OwnRecord
from runner_pool.domain.records import Signal


class Outbox:
    def __init__(self, records: OwnRecord, instance_id: str, memory: MemoryFile, log: EventLog) -> None:
        self._records = records
        self._instance_id = instance_id
        self._memory = memory
        self._log = log

    @property
    def pending(self) -> PendingSignal | None:
        return self._memory.current.pending_signal

    def send(self, signal: Signal, run_key: str | None = None, reason: str | None = None) -> bool:
        """Write `signal` now if possible, else keep it (replacing any older one) for `flush`."""
        self._memory.update(pending_signal=PendingSignal(signal=signal, run_key=run_key, reason=reason))
        return self.flush()

    def flush(self) -> bool:
        """Try to write the pending signal; True once nothing is pending."""
        pending = self.pending
        if pending is None:
            return True
        try:
            self._records.write_signal(self._instance_id, pending.signal, pending.run_key, pending.reason)
        except AWS_FAILURES as exc:
            self._log.warning(
                "signal not written yet; will retry",
                signal=pending.signal.value,
                fault=fault_of(exc),
                error=str(exc),
            )
            return False
        self._memory.update(pending_signal=None)
        self._log.info(
            "signal written",
            signal=pending.signal.value,
            signal_run_key=pending.run_key,
            reason=pending.reason,
        )
        return True
