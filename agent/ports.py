"""What the agent needs of the control plane's table: its own record and config to read, its own heartbeat
and signal to write. The agent depends on these ports, not on the control plane's adapters (agent/wiring.py
builds them from runner_pool.adapters), so what an instance can do to the table is this page."""

from __future__ import annotations

from typing import Protocol

from runner_pool.domain.records import Heartbeat, InstanceRecord, Signal, WorkerSignal
from runner_pool.domain.runner_configs import RunnerConfig, StoredConfig


class OwnRecord(Protocol):
    """The instance's record (read) and its agent's items (written)."""

    def get(self, instance_id: str) -> InstanceRecord | None:
        """The instance's record, read consistently; None if it has none (or none that parses)."""
        ...

    def write_heartbeat(self, instance_id: str) -> Heartbeat: ...

    def write_signal(
        self, instance_id: str, signal: Signal, run_key: str | None = None, reason: str | None = None
    ) -> WorkerSignal: ...


class OwnRunnerConfig(Protocol):
    """The runner config stored for this instance, encrypted for it alone."""

    def stored(self, instance_id: str, arn: str) -> StoredConfig | None: ...

    def read_with_record(
        self, instance_id: str, arn: str
    ) -> tuple[InstanceRecord | None, StoredConfig | None]: ...

    def decrypt(self, stored: StoredConfig, arn: str) -> RunnerConfig: ...
