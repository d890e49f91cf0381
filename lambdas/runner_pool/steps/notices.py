"""What every step does with notices (domain/notices.py): send or open them, and log what SQS refused.

A refusal never fails a step: the agent reads its record at its watch period anyway, and refresh opens
a queue that is missing. So each failure is logged and counted, and the step goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from runner_pool.domain.notices import NoticeFailure, NoticeQueues
from runner_pool.observability import count, logger

NoticeSource = Callable[[], NoticeQueues | None]
"""How a step reaches the notice queues, built on first use; None where the stack has none."""


def no_notices() -> NoticeQueues | None:
    """For steps built without notice queues (the unit tests' planes): nothing is sent."""
    return None


def notify(source: NoticeSource, instance_id: str) -> None:
    """Tell the instance's agent to read its record now."""
    queues = source()
    if queues is None:
        return
    failure = queues.notify(instance_id)
    _failed(
        "notice not sent; the agent will see its record at its watch period", [failure] if failure else []
    )


def open_queues(source: NoticeSource, instance_ids: Iterable[str]) -> int:
    """Open the notice queue of each newly recorded instance; returns how many were asked for."""
    queues = source()
    wanted = list(instance_ids)
    if queues is None or not wanted:
        return 0
    _failed("notice queue not opened; refresh opens it later", queues.open(wanted))
    return len(wanted)


def close_queues(queues: NoticeQueues, instance_ids: Iterable[str]) -> int:
    """Delete the notice queues of ended instances; returns how many are gone."""
    ended = list(instance_ids)
    failures = queues.close(ended)
    _failed("notice queue not deleted; refresh tries again", failures)
    return len(ended) - len(failures)


def _failed(message: str, failures: list[NoticeFailure]) -> None:
    if not failures:
        return
    count("NoticeFailures", len(failures))
    for failure in failures:
        logger.warning(message, instance_id=failure.instance_id, reason=failure.reason)
