"""The interruptions Lambda: EC2's notices about instances, from constructs/interruptions.py's rules."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.domain.interruptions import Ec2Event
from runner_pool.observability import count, logger, tracer
from runner_pool.steps.interruptions import Interruptions
from runner_pool.wiring import control_plane


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def hear(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    plane = control_plane()
    heard = Interruptions(plane.state_table, plane.spot_breaker).hear(Ec2Event.model_validate(event))
    answer = {**asdict(heard), "response": heard.response.value}
    logger.info("ec2 notice heard", notice=event.get("detail-type"), **answer)
    if heard.written:
        count(f"Ec2Notice.{heard.response}")
    if heard.breaker is not None:
        count("SpotInterruptions")
        if heard.breaker.opened:
            count("SpotBreakerOpened")
            logger.warning(
                "spot circuit breaker opened: the class's spot demand is served on-demand until open_until",
                **asdict(heard.breaker),
            )
    return answer
