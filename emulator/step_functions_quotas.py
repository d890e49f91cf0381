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

from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

from emulator.moto_internals import patch_point

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


_ASL = "moto.stepfunctions.parser.asl"
_STATE = f"{_ASL}.component.state.state:CommonStateField"
_TASK = f"{_ASL}.component.state.exec.state_task"
_SIZE_CHECKS = (
    f"{_STATE}._verify_size_quota",
    f"{_TASK}.state_task_lambda:StateTaskLambda._verify_size_quota",
    f"{_TASK}.service.state_task_service:StateTaskService._verify_size_quota",
)
"""moto's own checks of a state's or a task's result: they fail the state as AWS does; noted here too."""


def install() -> QuotaWatch:
    """Wrap moto's interpreter once per process; returns the process's watch."""
    with _INSTALL_LOCK:
        if _INSTALLED:
            return WATCH
        _INSTALLED.append(True)
    _wrap(f"{_STATE}._eval_state_input", _measured_input)
    _wrap(f"{_STATE}._eval_state_output", _measured_output)
    for check in _SIZE_CHECKS:
        _wrap(check, _noted)
    _wrap(f"{_ASL}.eval.event.event_manager:EventManager.add_event", _counted)
    return WATCH


def _wrap(path: str, wrapper: Callable[[Any], Any]) -> None:
    owner, name = patch_point(path)
    setattr(owner, name, wrapper(getattr(owner, name)))


def _measured_input(eval_input: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def _eval_state_input(state: Any, env: Any) -> None:
        WATCH.payload(f"state {state.name!r} input", env.states.get_input())
        eval_input(state, env)

    return _eval_state_input


def _measured_output(eval_output: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def _eval_state_output(state: Any, env: Any) -> None:
        eval_output(state, env)
        WATCH.payload(f"state {state.name!r} output", env.states.get_input())

    return _eval_state_output


def _counted(add_event: Callable[..., int]) -> Callable[..., int]:
    def _add_event(events: Any, *args: Any, **kwargs: Any) -> int:
        event_id = add_event(events, *args, **kwargs)
        WATCH.history(len(events._history_event_list))
        return event_id

    return _add_event


def _noted(verify: Callable[[Any, Any, Any], None]) -> Callable[[Any, Any, Any], None]:
    def verify_and_note(state: Any, env: Any, value: Any) -> None:
        WATCH.payload(f"state {state.name!r} result", value)
        verify(state, env, value)

    return verify_and_note
