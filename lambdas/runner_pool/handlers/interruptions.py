"""The interruptions Lambda: EC2's notices about instances, from constructs/interruptions.py's rules."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.domain.interruptions import Ec2Event
from runner_pool.observability import count, logger, tracer
from runner_pool.steps.interruptions import Interruptions
from runner_pool.wiring import control_plane


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def hear(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    heard = Interruptions(control_plane().state_table).hear(Ec2Event.model_validate(event))
    logger.info("ec2 notice heard", notice=event.get("detail-type"), **vars(heard))
    if heard.written:
        count(f"Ec2Notice.{heard.response}")
    return {**vars(heard), "response": heard.response.value}
