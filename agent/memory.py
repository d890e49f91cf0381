"""What the agent must remember across its own restarts, so a restart never repeats what was done.

systemd restarts a crashed agent; without this, it would run the pre-runner script again and could
start a second runner for a run key it already registered for.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from runner_pool.domain.records import Signal


class PendingSignal(BaseModel):
    model_config = ConfigDict(frozen=True)

    signal: Signal
    run_key: str | None = None
    reason: str | None = None


class Memory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    booted: bool = False
    """The pre-runner script has run (and its outcome is below)."""
    boot_failure: str | None = None
    first_boot_images: tuple[str, ...] = ()
    """The docker images the instance had once the pre-runner script ran: every scrub keeps them."""
    scrub_failure: str | None = None
    """What a scrub left behind: the instance serves no other run key (agent/scrub.py)."""
    serving_run_key: str | None = None
    """The run key a runner was started, or registration attempted, for; cleared once released."""
    used_config_id: str | None = None
    """The runner config the last runner was started with: a config is good for one runner only."""
    serving_runner_id: int | None = None
    """The GitHub runner of the hand-off being served: the record naming another one is a new hand-off."""
    pending_signal: PendingSignal | None = None
    """A signal not yet written: after a restart it is still owed to the control plane."""


class MemoryFile:
    """Keeps a Memory in a file (replaced atomically), or only in this process when `path` is None."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._memory = self._read()

    @property
    def current(self) -> Memory:
        return self._memory

    def update(self, **changes: object) -> Memory:
        self._memory = self._memory.model_copy(update=changes)
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self._path.parent, delete=False) as handle:
                handle.write(self._memory.model_dump_json())
            os.replace(handle.name, self._path)
        return self._memory

    def _read(self) -> Memory:
        if self._path is None or not self._path.exists():
            return Memory()
        try:
            return Memory.model_validate_json(self._path.read_text())
        except (OSError, ValidationError):
            # A torn or foreign file: starting afresh risks a repeated pre-runner script, nothing worse.
            return Memory()
