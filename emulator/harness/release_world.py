"""The release state machine run to the end with every part it starts, and stand-ins for the instance agents
it waits on: each answers once its record lets go of the run.

The real agent (agent/loop.py) stops its runner, cleans the workspace and writes its receipt as soon as its
record no longer holds the run key it served; here that happens at each Wait of the release state machine,
after the clock has moved on by the Wait's seconds.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emulator.harness.control_plane import LocalControlPlane, LocalStateMachine, client
from emulator.step_functions import Execution, Handler, lambdas_in_process, without_waiting
from runner_pool.domain.records import Signal


@dataclass
class ReleaseAgents:
    """Simulated agents: each serves a run key until its record lets go of it, then answers `answer`
    (None: never)."""

    local: LocalControlPlane
    answer: Signal | None = Signal.UD_REMOVE_REG_OK
    serving: dict[str, str] = field(default_factory=dict)
    waits: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, instance_id: str, run_key: str) -> None:
        self.serving[instance_id] = run_key

    def on_wait(self, seconds: int) -> None:
        """Called by every Map iteration's Wait, on moto's threads: one at a time."""
        with self._lock:
            self.waits.append(seconds)
            self.local.clock.advance(seconds)
            for instance_id, run_key in list(self.serving.items()):
                record = self.local.table.get(instance_id)
                if record is None or record.run_key == run_key:
                    continue
                del self.serving[instance_id]
                if self.answer is not None:
                    self.local.table.write_signal(instance_id, self.answer, run_key)


@dataclass(frozen=True)
class ReleaseRun:
    """A release execution, and the executions of its parts (none unless it split), by name."""

    execution: Execution
    parts: dict[str, Execution]

    @property
    def executions(self) -> list[Execution]:
        return [self.execution, *self.parts.values()]


def run_release(
    machine: LocalStateMachine,
    payload: Any,
    *,
    name: str | None = None,
    on_wait: Callable[[int], None] | None = None,
    replace: Mapping[str, Handler] | None = None,
    timeout_seconds: float = 60,
) -> ReleaseRun:
    """Run a release and, with its tasks still on our handlers, every execution of the machine it started."""
    stepfunctions = client("stepfunctions")
    name = name or uuid.uuid4().hex
    before = set(_names(stepfunctions, machine.arn)) | {name}
    with without_waiting(on_wait), machine.swapped(replace or {}), lambdas_in_process(machine.routed):
        execution = machine.machines.run(machine.arn, payload, name=name, timeout_seconds=timeout_seconds)
        started = {
            part: arn for part, arn in _names(stepfunctions, machine.arn).items() if part not in before
        }
        parts = {part: machine.machines.wait(arn, timeout_seconds) for part, arn in sorted(started.items())}
    return ReleaseRun(execution, parts)


def _names(stepfunctions: Any, machine_arn: str) -> dict[str, str]:
    pages = stepfunctions.get_paginator("list_executions").paginate(stateMachineArn=machine_arn)
    return {
        execution["name"]: execution["executionArn"] for page in pages for execution in page["executions"]
    }
