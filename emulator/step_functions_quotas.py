"""Step Functions' quotas, enforced on moto's interpreter: what AWS would refuse, the harness refuses.

AWS (https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html):
- "Maximum input or output size for a task, state, or execution: 256 KiB of data as a UTF-8 encoded
  string"; above it the state fails with `States.DataLimitExceeded`, which no `States.ALL` Catch
  catches (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html);
- "Maximum execution history size: 25,000 events in a single execution history"; above it a Standard
  execution fails.

moto 5.2 checks a state's output against the first and nothing else. So, once per process, `install()`
wraps moto's interpreter: every state's input and output is measured, and every history event counted
per execution. A breach fails the execution as AWS would where moto already can (output), and is
always noted in `violations`: tests/conftest.py fails the test during which one was noted, naming the
state machine, the state and the size, since a breach that the product survived (a redrive) would
otherwise pass unseen. `largest` keeps the biggest payload and history seen, for `make bench`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
    StateTaskService,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda import StateTaskLambda
from moto.stepfunctions.parser.asl.component.state.state import CommonStateField
from moto.stepfunctions.parser.asl.eval.event.event_manager import EventManager
from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

PAYLOAD_LIMIT_BYTES = 256 * 1024
"""A state's input or output, as UTF-8 JSON."""
HISTORY_LIMIT_EVENTS = 25_000
"""Events in one execution's history."""


@dataclass
class QuotaWatch:
    """What the interpreter measured in this process: breaches, and the largest sizes seen."""

    history_limit: int = HISTORY_LIMIT_EVENTS
    payload_limit: int = PAYLOAD_LIMIT_BYTES
    violations: list[str] = field(default_factory=list)
    largest_payload_bytes: int = 0
    largest_payload_state: str = ""
    largest_history_events: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def payload(self, where: str, value: Any) -> None:
        size = len((value if isinstance(value, str) else to_json_str(value)).encode("utf-8"))
        with self._lock:
            if size > self.largest_payload_bytes:
                self.largest_payload_bytes, self.largest_payload_state = size, where
            if size > self.payload_limit:
                self.violations.append(
                    f"{where}: {size:,} bytes, over Step Functions' {self.payload_limit:,}-byte payload quota"
                )

    def history(self, events: int) -> None:
        with self._lock:
            self.largest_history_events = max(self.largest_history_events, events)
            if events == self.history_limit + 1:
                self.violations.append(
                    f"an execution's history passed Step Functions' {self.history_limit:,}-event quota"
                )

    def take_violations(self) -> list[str]:
        with self._lock:
            taken, self.violations[:] = list(self.violations), []
        return taken

    def reset_largest(self) -> None:
        with self._lock:
            self.largest_payload_bytes, self.largest_payload_state, self.largest_history_events = 0, "", 0


WATCH = QuotaWatch()
_INSTALLED: list[bool] = []
_INSTALL_LOCK = threading.Lock()


def install() -> QuotaWatch:
    """Wrap moto's interpreter once per process; returns the process's watch."""
    with _INSTALL_LOCK:
        if _INSTALLED:
            return WATCH
        _INSTALLED.append(True)
    eval_input = CommonStateField._eval_state_input
    eval_output = CommonStateField._eval_state_output
    add_event = EventManager.add_event

    def _eval_state_input(self: CommonStateField, env: Any) -> None:
        WATCH.payload(f"state {self.name!r} input", env.states.get_input())
        eval_input(self, env)

    def _eval_state_output(self: CommonStateField, env: Any) -> None:
        eval_output(self, env)
        WATCH.payload(f"state {self.name!r} output", env.states.get_input())

    def _add_event(self: EventManager, *args: Any, **kwargs: Any) -> int:
        event_id = add_event(self, *args, **kwargs)
        WATCH.history(len(self._history_event_list))
        return event_id

    CommonStateField._eval_state_input = _eval_state_input  # type: ignore[method-assign]
    CommonStateField._eval_state_output = _eval_state_output  # type: ignore[method-assign]
    # moto's own checks of a state's or a task's result fail the state as AWS does; noted here too
    for checking in (CommonStateField, StateTaskLambda, StateTaskService):
        checking._verify_size_quota = _noted(checking._verify_size_quota)  # type: ignore[method-assign]
    EventManager.add_event = _add_event  # type: ignore[method-assign]
    return WATCH


def _noted(verify: Callable[[Any, Any, Any], None]) -> Callable[[Any, Any, Any], None]:
    def verify_and_note(state: Any, env: Any, value: Any) -> None:
        WATCH.payload(f"state {state.name!r} result", value)
        verify(state, env, value)

    return verify_and_note
