"""Lambda entry point of the follow-up state machine (infra/statemachines/follow_up.asl.json).

The dispatcher that leads a run key's follow-up batch starts this machine instead of waiting for the
window in its own Lambda (domain.demand): `gather` seals the follow-up once its window closed and starts
its provisions, or answers how long the machine's Wait state should wait before it looks again.
Input and output: {"request": FollowUpRequest}, the output with `gathered` and `wait_seconds`.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.domain.executions import FollowUpRequest
from runner_pool.observability import count, logger, tracer
from runner_pool.wiring import control_plane

LEASE_MARGIN_SECONDS = 60
"""The reservations of a follow-up's jobs outlive this invocation by this much (as the dispatcher's)."""


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def gather(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = FollowUpRequest.model_validate(event["request"])
    lease_seconds = context.get_remaining_time_in_millis() / 1000 + LEASE_MARGIN_SECONDS
    gathering = control_plane().dispatcher().gather(request, lease_seconds)
    for provision in gathering.report.provisions:
        logger.info(
            "provision started",
            run_key=provision.run_key,
            count=provision.count,
            execution=provision.execution_name,
        )
    if gathering.gathered:
        count("FollowUpsGathered")
    return {
        "request": gathering.request.model_dump(mode="json"),
        "gathered": gathering.gathered,
        "wait_seconds": gathering.wait_seconds,
    }
