"""The dispatcher Lambda: a batch of demand from the demand queue in, provision and release executions out.

What it does with a batch is `runner_pool.steps.dispatcher.Dispatcher`; this module reads the SQS
records and reports the messages whose work failed as partial batch failures (Powertools' batch
processor), so SQS redelivers only those. A message that is not a demand message fails every time
and ends in the queue's dead-letter queue.

Event source: the demand queue, with ReportBatchItemFailures, no batching window (a run's first job
is dispatched the moment it is received) and batches of 10; a matrix split across Lambda's
concurrent batches is brought together by the ledger (domain.follow_up): an
invocation that leads a follow-up starts the follow-up state machine to gather it (handlers/follow_up.py)
and goes on, and one whose jobs meet a follow-up being started waits for that start (at most
SEALED_WAIT_SECONDS). Environment (RUNNER_POOL_*): IDEMPOTENCY_TABLE_NAME (the demand ledger),
PROVISION_STATE_MACHINE_ARN, RELEASE_STATE_MACHINE_ARN, FOLLOW_UP_STATE_MACHINE_ARN.
The AWS calls it makes are recorded in the tests and checked against its role (emulator/iam_check.py).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.domain.demand import DemandMessage, from_body, lease_seconds
from runner_pool.observability import log_provisions_started, logger, metrics, tracer
from runner_pool.steps.demand_starts import DispatchReport
from runner_pool.wiring import control_plane

processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
"""A batch whose every message failed is reported like any other (each message retried by SQS), not
raised: a batch of jobs held by another dispatch is routine, not an error of this function."""


class NotDispatchedError(RuntimeError):
    """The record's work failed in this batch; SQS will deliver it again."""


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def dispatch(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    batch, unreadable = _read(event)
    lease = lease_seconds(context.get_remaining_time_in_millis() / 1000)
    report = control_plane().dispatcher().dispatch(batch, context.aws_request_id, lease)
    _observe(report)
    failed = report.failed_message_ids | unreadable

    def settle(record: SQSRecord) -> None:
        if record.message_id in failed:
            raise NotDispatchedError(record.message_id)

    return process_partial_response(event=event, record_handler=settle, processor=processor, context=context)


def _read(event: dict[str, Any]) -> tuple[list[tuple[str, DemandMessage]], set[str]]:
    """(message id, message) of each record, and the ids of records that hold no demand message."""
    batch: list[tuple[str, DemandMessage]] = []
    unreadable: set[str] = set()
    for raw in event.get("Records", []):
        record = SQSRecord(raw)
        try:
            batch.append((record.message_id, from_body(record.body)))
        except ValueError as exc:
            logger.error("not a demand message", message_id=record.message_id, error=str(exc))
            unreadable.add(record.message_id)
    return batch, unreadable


def _observe(report: DispatchReport) -> None:
    log_provisions_started(report.provisions)
    if report.joined:
        logger.info("joined a follow-up batch", jobs=report.joined)
    for follow_up in report.follow_up_machines:
        logger.info(
            "follow-up machine started", run_key=follow_up.run_key, execution=follow_up.execution_name
        )
    for why in report.gathered_here:
        logger.warning("follow-up machine not started: gathered here", error=why)
    for failure in report.failures:
        logger.error("not dispatched", what=failure.what, error=failure.error, messages=failure.message_ids)
    figures = {
        "ProvisionsStarted": len(report.provisions),
        "RunnersRequested": sum(request.count for request in report.provisions),
        "ReleasesStarted": len(report.releases),
        "DuplicateDemand": report.duplicates,
        "StaleDemand": report.stale,
        "CancelledDemand": report.cancelled,
        "DispatchFailures": len(report.failures),
        "FollowUpMachinesStarted": len(report.follow_up_machines),
        "FollowUpsGatheredHere": len(report.gathered_here),
    }
    for name, value in figures.items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
