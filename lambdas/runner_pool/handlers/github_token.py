"""The token function: the one Lambda that reads the App's private key, asked by the others for
installation tokens narrowed to their work, and for the App's failed webhook deliveries."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.adapters.github_app_answers import AppRequest, answer, refusal
from runner_pool.domain.runners import GitHubError
from runner_pool.observability import logger, tracer
from runner_pool.wiring import control_plane


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)  # the answer may hold a token: never in a trace
def github_token(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = AppRequest.model_validate(event)
    try:
        answered = answer(control_plane().app_key_of(request.app_id), request)
    except GitHubError as exc:  # the App's key does not load: answered, so the caller skips the App
        answered = refusal(exc)
    logger.info(
        "acted as the App",
        app_id=request.app_id,
        permissions=request.permissions,
        failed_deliveries_since=request.failed_deliveries_since,
        redeliver=request.redeliver,
        refused=None if answered.error is None else answered.error.kind,
    )
    return answered.model_dump(mode="json")
