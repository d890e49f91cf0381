"""Lambda entry points of the release state machine (infra/statemachines/release.asl.json), one per task.

Their AWS calls are checked against each function's role in the synthesized stack wherever a test
invokes them (emulator/iam_check.py); `give_back` also deletes unused runners on GitHub.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.domain import release
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.release import ReleaseItem, ReleaseProgress, ReleaseStatus, SalvageRequest
from runner_pool.observability import count, logger, tracer
from runner_pool.wiring import control_plane

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
    plane = control_plane()
    planned = release.plan(ReleaseRequest.model_validate(event), plane.state_table, plane.config.timeouts)
    logger.info(
        "release planned", run_key=planned.run_key, cause=planned.cause, instances=list(planned.instance_ids)
    )
    return planned.model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def give_back(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    plane = control_plane()
    progress = release.give_back(
        ReleaseItem.model_validate(event),
        plane.state_table,
        lambda: plane.github,
        plane.config.timeouts,
        plane.clock.now(),
        reuse=plane.config.reuse,
    )
    return _reported(progress)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def check_receipt(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    plane = control_plane()
    progress = release.check_receipt(
        ReleaseProgress.model_validate(event), plane.state_table, plane.pool_queues, plane.clock.now()
    )
    return _reported(progress)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def salvage(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = SalvageRequest.model_validate(event)
    logger.error(
        "a release step failed; expiring what it held", instance_id=request.instance_id, error=request.error
    )
    return _reported(release.salvage(request, control_plane().state_table))


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
