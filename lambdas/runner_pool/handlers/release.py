"""Lambda entry points of the release state machine (infra/statemachines/release.asl.json), one per task."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict

from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.release import (
    ReleaseItem,
    ReleasePlan,
    ReleaseProgress,
    ReleaseStatus,
    SalvageRequest,
)
from runner_pool.observability import count, logger, tracer
from runner_pool.steps.release import Release
from runner_pool.steps.release_parts import ReleaseParts
from runner_pool.wiring import ControlPlane, control_plane

SETTLED_METRICS = {
    ReleaseStatus.POOLED: "ReleasesPooled",
    ReleaseStatus.EXPIRED: "ReleasesExpired",
    ReleaseStatus.SALVAGED: "ReleasesSalvaged",
    ReleaseStatus.RETIRED: "ReleasesRetired",
    ReleaseStatus.QUARANTINED: "RunnersQuarantined",
}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def plan(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    planned = release_of(control_plane()).plan(ReleaseRequest.model_validate(event))
    logger.info(
        "release planned",
        run_key=planned.run_key,
        cause=planned.cause,
        instances=list(planned.instance_ids),
        parts=[list(part.part or ()) for part in planned.parts],
    )
    return planned.model_dump(mode="json")


class StartPartsEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: ReleasePlan
    machine: str
    """The release state machine's own ARN (`$$.StateMachine.Id`): each part is an execution of it."""


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def start_parts(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    parsed = StartPartsEvent.model_validate(event)
    executions = control_plane().executions(release_machine_arn=parsed.machine)
    started = ReleaseParts(executions).start(parsed.plan)
    logger.info(
        "release parts started",
        run_key=parsed.plan.run_key,
        cause=parsed.plan.cause,
        parts=list(started.names),
    )
    return started.model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def give_back(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return _reported(release_of(control_plane()).give_back(ReleaseItem.model_validate(event)))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def check_receipt(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return _reported(release_of(control_plane()).check_receipt(ReleaseProgress.model_validate(event)))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def salvage(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = SalvageRequest.model_validate(event)
    logger.error(
        "a release step failed; expiring what it held", instance_id=request.instance_id, error=request.error
    )
    return _reported(release_of(control_plane()).salvage(request))


def release_of(plane: ControlPlane) -> Release:
    return Release(
        plane.state_table,
        lambda: plane.pool_queues,
        lambda: plane.github,
        clock=plane.clock,
        timeouts=plane.config.timeouts,
        reuse=plane.config.reuse,
        notices=lambda: plane.notices,
        instant_runtime_minutes=plane.config.defaults.max_runtime_minutes,
        reruns=plane.reruns,
        spend=plane.spend,
    )


def _reported(progress: ReleaseProgress) -> dict[str, Any]:
    if progress.status is ReleaseStatus.QUARANTINED:
        logger.error(
            "instance quarantined",
            instance_id=progress.instance_id,
            run_key=progress.run_key,
            reason=progress.reason,
        )
    elif progress.status is not ReleaseStatus.AWAITING_RECEIPT:
        logger.info(
            "release settled",
            instance_id=progress.instance_id,
            run_key=progress.run_key,
            status=progress.status.value,
            runner=progress.runner,
            reason=progress.reason,
        )
    if progress.status in SETTLED_METRICS:
        count(SETTLED_METRICS[progress.status])
    return progress.model_dump(mode="json")
