"""Structured log lines for the journal: one JSON object per line, always naming the instance and run key."""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

LOGGER_NAME = "runner_pool.agent"
_FIELDS = "fields"


Sink = Callable[[float, dict[str, Any]], None]
"""Where a line goes besides the journal: its time (epoch seconds) and its fields (agent/log_shipping.py)."""


def line_fields(
    created: float, level: str, message: str, fields: Mapping[str, Any], error: str | None
) -> dict[str, Any]:
    """One line: {"time", "level", "message", ...fields, "error"?}, as the journal and CloudWatch keep it."""
    line: dict[str, Any] = {
        "time": datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds"),
        "level": level,
        "message": message,
        **fields,
    }
    if error:
        line["error"] = error
    return line


class JsonLines(logging.Formatter):
    """Formats a record as one JSON line; the journal keeps one per line."""

    def format(self, record: logging.LogRecord) -> str:
        error = self.formatException(record.exc_info) if record.exc_info else None
        fields = getattr(record, _FIELDS, {})
        return json.dumps(
            line_fields(record.created, record.levelname, record.getMessage(), fields, error), default=str
        )


class EventLog:
    """A logger that carries context fields (instance id, run key) into every line it writes, and each
    line to its sink too when it has one."""

    def __init__(
        self, logger: logging.Logger, context: Mapping[str, Any] | None = None, sink: Sink | None = None
    ) -> None:
        self._logger = logger
        self._context = dict(context or {})
        self._sink = sink

    def bind(self, **context: Any) -> EventLog:
        """The same log with more (or replaced) context fields."""
        return EventLog(self._logger, {**self._context, **context}, self._sink)

    def shipping_to(self, sink: Sink) -> EventLog:
        """The same log, each of whose lines (and its bound logs' lines) also goes to `sink`."""
        return EventLog(self._logger, self._context, sink)

    @property
    def journal(self) -> EventLog:
        """The same log, to the journal only: what the shipping itself says of its failures."""
        return EventLog(self._logger, self._context)

    def info(self, message: str, **fields: Any) -> None:
        self._emit(logging.INFO, message, fields)

    def warning(self, message: str, **fields: Any) -> None:
        self._emit(logging.WARNING, message, fields)

    def error(self, message: str, **fields: Any) -> None:
        self._emit(logging.ERROR, message, fields)

    def exception(self, message: str, **fields: Any) -> None:
        """An error with the traceback of the exception being handled."""
        self._logger.error(message, exc_info=True, extra={_FIELDS: {**self._context, **fields}})
        self._ship(logging.ERROR, message, fields, traceback.format_exc())

    def _emit(self, level: int, message: str, fields: Mapping[str, Any]) -> None:
        self._logger.log(level, message, extra={_FIELDS: {**self._context, **fields}})
        self._ship(level, message, fields, None)

    def _ship(self, level: int, message: str, fields: Mapping[str, Any], error: str | None) -> None:
        if self._sink is None:
            return
        now = time.time()
        self._sink(
            now, line_fields(now, logging.getLevelName(level), message, {**self._context, **fields}, error)
        )


def configure(stream: TextIO = sys.stdout, level: int = logging.INFO) -> EventLog:
    """Send the agent's lines, as JSON, to `stream` (systemd hands stdout to the journal)."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    return EventLog(logger)


def agent_log(**context: Any) -> EventLog:
    """The agent's log as configured (or, in tests, as pytest captures it), with `context` bound."""
    return EventLog(logging.getLogger(LOGGER_NAME), context)
