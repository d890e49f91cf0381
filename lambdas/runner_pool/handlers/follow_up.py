"""Lambda entry points of the follow-up state machine (infra/statemachines/follow_up.asl.json).

The dispatcher that leads a run key's follow-up batch starts this machine instead of waiting for the
window in its own Lambda (domain.follow_up). What each step does is steps.follow_up's FollowUpSteps;
these read the machine's state and answer what its next state needs.

    gather  in {"request": FollowUpRequest}
            out {"request", "gathered", "wait_seconds", "follow_up": {"job_ids", "public_ids"} | null}
    start   in {"request", "follow_up"}; out {"provisions": how many started}
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.domain.demand import lease_seconds
from runner_pool.domain.executions import FollowUpRequest
from runner_pool.domain.follow_up import FollowUp
from runner_pool.observability import count, log_provisions_started, logger, tracer
from runner_pool.wiring import control_plane


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def gather(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = FollowUpRequest.model_validate(event["request"])
    lease = lease_seconds(context.get_remaining_time_in_millis() / 1000)
    gathering = control_plane().follow_up_steps().gather(request, lease)
    follow_up = gathering.follow_up
    log_provisions_started(gathering.report.provisions)
    if gathering.error is not None:
        logger.warning("follow-up sealed, its provisions not started: tried again", error=gathering.error)
    if gathering.listing_error is not None:
        logger.warning("GitHub not asked for the run's queued jobs", error=gathering.listing_error)
    if gathering.listed:
        count("FollowUpJobsListed", gathering.listed)
    if gathering.gathered:
        count("FollowUpsGathered")
    return {
        "request": gathering.request.model_dump(mode="json"),
        "gathered": gathering.gathered,
        "wait_seconds": gathering.wait_seconds,
        "follow_up": None
        if follow_up is None
        else {"job_ids": sorted(follow_up.job_ids), "public_ids": sorted(follow_up.public_ids)},
    }


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def start(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = FollowUpRequest.model_validate(event["request"])
    sealed = event["follow_up"]
    follow_up = FollowUp(frozenset(sealed["job_ids"]), frozenset(sealed["public_ids"]))
    lease = lease_seconds(context.get_remaining_time_in_millis() / 1000)
    report = control_plane().follow_up_steps().start(request, follow_up, lease)
    log_provisions_started(report.provisions)
    if report.stale:
        logger.info("follow-up of a completed run: not started", run_key=request.run_key, jobs=report.stale)
    return {"provisions": len(report.provisions)}
