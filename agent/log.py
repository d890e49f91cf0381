"""Structured log lines for the journal: one JSON object per line, always naming the instance and run key."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

LOGGER_NAME = "runner_pool.agent"
_FIELDS = "fields"


class JsonLines(logging.Formatter):
    """Formats a record as {"time", "level", "message", ...fields}; the journal keeps one per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "message": record.getMessage(),
            **getattr(record, _FIELDS, {}),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class EventLog:
    """A logger that carries context fields (instance id, run key) into every line it writes."""

    def __init__(self, logger: logging.Logger, context: Mapping[str, Any] | None = None) -> None:
        self._logger = logger
        self._context = dict(context or {})

    def bind(self, **context: Any) -> EventLog:
        """The same log with more (or replaced) context fields."""
        return EventLog(self._logger, {**self._context, **context})

    def info(self, message: str, **fields: Any) -> None:
        self._emit(logging.INFO, message, fields)

    def warning(self, message: str, **fields: Any) -> None:
        self._emit(logging.WARNING, message, fields)

    def error(self, message: str, **fields: Any) -> None:
        self._emit(logging.ERROR, message, fields)

    def exception(self, message: str, **fields: Any) -> None:
        """An error with the traceback of the exception being handled."""
        self._logger.error(message, exc_info=True, extra={_FIELDS: {**self._context, **fields}})

    def _emit(self, level: int, message: str, fields: Mapping[str, Any]) -> None:
        self._logger.log(level, message, extra={_FIELDS: {**self._context, **fields}})


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
