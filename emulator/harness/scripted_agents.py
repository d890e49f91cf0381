"""Stand-ins for the instance agents in state-machine tests: each acts on its items while the machine waits.

The real agent is tested against moto in tests/agent and runs in the emulator; here what matters is
what the control plane reads, so each instance follows a script: beat and register (the default),
beat but never register, fail to register, or stay silent (a dead agent, a stale heartbeat).
A healthy agent registers only once it can decrypt the runner config handed to it, so the
credential hand-off is part of what every state-machine test proves.
"""

from __future__ import annotations

import threading
from enum import StrEnum

from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Clock
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import Signal

TIER_STATES = (InstanceState.STOPPING, InstanceState.STOPPED)


class Script(StrEnum):
    REGISTERS = "registers"
    NEVER_REGISTERS = "never-registers"
    FAILS_REGISTRATION = "fails-registration"
    SILENT = "silent"
    """No heartbeat and no signal: the agent is dead."""


class ScriptedAgents:
    """`beat_every_seconds`: 0 beats at every round (a test's clock moves only between rounds); a world
    on the system clock beats each instance once per the agent's heartbeat period, as the real agent
    does (agent/heartbeat.py), so a round over hundreds of instances stays a round over the held ones."""

    def __init__(
        self,
        table: StateTable,
        credentials: RunnerCredentials,
        arn_of: object,
        clock: Clock,
        beat_every_seconds: float = 0.0,
    ) -> None:
        self._table = table
        self._credentials = credentials
        self._arn_of = arn_of
        self._clock = clock
        self._beat_every = beat_every_seconds
        self._beaten_at: dict[str, float] = {}
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
        self._asking = threading.Lock()
        self._asked = 0
        self._covered = 0
        self.registrations: list[tuple[str, str, str]] = []
        """(instance id, run key, config id) of every runner started from a decrypted config."""

    def script(self, instance_id: str, script: Script) -> None:
        self._scripts[instance_id] = script

    def act(self) -> None:
        """One round: every live instance's agent does what its script says, at the clock's now.

        Asked for while a round runs (many claim workers' waits end at once), it waits for that round to
        end, then runs one more only if no round began after it asked: one round that begins after every
        waiting request answers them all, as a world of agents acting side by side would, and hundreds of
        waiting workers never queue hundreds of rounds."""
        with self._asking:
            self._asked += 1
            asked = self._asked
        with self._lock:
            if self._covered >= asked:
                return  # a round that began after this request has run
            with self._asking:
                self._covered = self._asked
            for record in self._table.live():
                script = self._scripts.get(record.instance_id, Script.REGISTERS)
                if script is Script.SILENT or record.state in TIER_STATES:
                    continue  # a stopped instance's agent is halted with it
                self._beat(record.instance_id)
                held = record.state in (InstanceState.CLAIMED, InstanceState.CREATED) and record.run_key
                if not held or record.run_key is None:
                    continue
                self._register(record.instance_id, record.run_key, script)

    def _beat(self, instance_id: str) -> None:
        now = self._clock.now()
        if now - self._beaten_at.get(instance_id, float("-inf")) >= self._beat_every:
            self._table.write_heartbeat(instance_id)
            self._beaten_at[instance_id] = now

    def _register(self, instance_id: str, run_key: str, script: Script) -> None:
        config = self._credentials.load(instance_id, self._arn_of(instance_id), run_key)  # type: ignore[operator]
        if config is None:
            return
        started = (instance_id, run_key, config.config_id)
        if started in self.registrations:
            return
        if script is Script.REGISTERS:
            self.registrations.append(started)
            self._table.write_signal(instance_id, Signal.UD_REG_OK, run_key)
        elif script is Script.FAILS_REGISTRATION:
            self.registrations.append(started)
            self._table.write_signal(
                instance_id, Signal.UD_REG_FAILED, run_key, reason="runner exited with 1"
            )
