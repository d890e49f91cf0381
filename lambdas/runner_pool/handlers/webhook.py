"""The webhook Lambda: GitHub App deliveries in through API Gateway (REST, Lambda proxy), demand out to SQS.

It only checks and enqueues, so it answers in milliseconds, far inside GitHub's 10 s: the order of
the checks and what each answer means are in `runner_pool.domain.webhooks`. A delivery that asks for
something puts one message on the demand queue, once per `X-GitHub-Delivery` (Powertools
idempotency on DynamoDB): a repeated delivery gets the first one's answer and queues nothing.

Route: POST /webhook. Environment (RUNNER_POOL_*): CONFIG (labels; every App's webhook secret name),
DEMAND_QUEUE_URL, IDEMPOTENCY_TABLE_NAME. The AWS calls it makes are recorded in the tests and
checked against its role (emulator/iam_check.py).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import ServiceError
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError
from aws_lambda_powertools.utilities.typing import LambdaContext

from runner_pool.adapters.demand_queue import DemandQueue
from runner_pool.adapters.webhook_secret import AppsWebhookSecrets
from runner_pool.domain.demand import DemandMessage
from runner_pool.domain.webhooks import Accepted, Ignored, Refusal, Unserved, read_delivery, verdict
from runner_pool.observability import logger, metrics, tracer
from runner_pool.wiring import ControlPlane, control_plane

WEBHOOK_PATH = "/webhook"
DELIVERY_RETENTION_SECONDS = 3 * 24 * 3600
"""GitHub lets a delivery be redelivered for 3 days; its idempotency record lasts as long."""

app = APIGatewayRestResolver()


@app.post(WEBHOOK_PATH)
def on_delivery() -> Response[dict[str, str]]:
    ingress = _ingress()
    request: APIGatewayProxyEvent = app.current_event
    body = _raw_body(request)
    if body is None:
        return _answer(400, "body is marked base64 but is not")
    received = read_delivery(request.headers, body, ingress.secret.signed)
    if isinstance(received, Refusal):
        logger.info("delivery refused", status=received.status, reason=received.reason)
        metrics.add_metric(name="DeliveriesRefused", unit=MetricUnit.Count, value=1)
        return _answer(received.status, received.reason)
    logger.append_keys(delivery_id=received.delivery_id, github_event=received.event)
    match verdict(received, ingress.plane.config):
        case Ignored(reason):
            return _answer(200, reason)
        case Unserved(label, reason):
            logger.warning("label not served", label=label, reason=reason)
            metrics.add_metric(name="UnservedLabels", unit=MetricUnit.Count, value=1)
            return _answer(200, f"label {label!r} is not served: {reason}")
        case Accepted(message, summary):
            ingress.idempotency.register_lambda_context(app.lambda_context)
            try:
                answer = ingress.enqueue_once(
                    delivery={"id": received.delivery_id}, message=message, summary=summary
                )
            except IdempotencyAlreadyInProgressError:
                return _answer(409, "this delivery is being handled now; redeliver it if it fails")
            return _answer(int(answer["status"]), str(answer["message"]))
    raise AssertionError("unreachable: every verdict is answered")


def fault(exc: Exception) -> Response[dict[str, str]]:
    """Our side failed (SQS, DynamoDB, the secret): 503, so GitHub records a failed delivery to redeliver."""
    if isinstance(exc, ServiceError):  # the resolver's own answers, such as 404 for another path
        return _answer(exc.status_code, str(exc.msg))
    logger.exception("delivery not handled", error=repr(exc))
    metrics.add_metric(name="DeliveriesFailed", unit=MetricUnit.Count, value=1)
    return _answer(503, "not handled this time; redeliver it")


app.exception_handler(Exception)(fault)  # registered by call: the decorator is untyped


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def receive(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


def _answer(status: int, message: str) -> Response[dict[str, str]]:
    return Response(status_code=status, content_type="application/json", body={"message": message})


def _raw_body(request: APIGatewayProxyEvent) -> bytes | None:
    """The body's bytes as GitHub signed them; None for a body marked base64 that is not."""
    body = request.body or ""
    if request.is_base64_encoded:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return None
    # surrogatepass: text that is not UTF-8 still becomes bytes, and then fails the signature check.
    return body.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class _Ingress:
    """What the webhook keeps for the life of its process: the secret's cache above all."""

    plane: ControlPlane
    secret: AppsWebhookSecrets
    idempotency: IdempotencyConfig
    enqueue_once: Callable[..., dict[str, Any]]
    """(delivery={"id": ...}, message=DemandMessage, summary=str) -> {"status", "message"}, once per id."""


_current: _Ingress | None = None


def _ingress() -> _Ingress:
    global _current  # noqa: PLW0603 - one per Lambda process, rebuilt when tests install another plane
    plane = control_plane()
    if _current is None or _current.plane is not plane:
        _current = _build(plane)
    return _current


def _build(plane: ControlPlane) -> _Ingress:
    settings = plane.settings
    queue = DemandQueue(settings.require("demand_queue_url", "queuing demand"), plane.client("sqs"))

    def enqueue(*, delivery: dict[str, str], message: DemandMessage, summary: str) -> dict[str, Any]:
        queue.send(message)
        metrics.add_metric(name="DemandQueued", unit=MetricUnit.Count, value=1)
        logger.info("queued", kind=message.kind, delivery_id=delivery["id"])
        return {"status": 202, "message": summary}

    config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=DELIVERY_RETENTION_SECONDS)
    store = DynamoDBPersistenceLayer(
        table_name=settings.require("idempotency_table_name", "remembering deliveries"),
        boto3_client=plane.client("dynamodb"),
    )
    return _Ingress(
        plane=plane,
        secret=AppsWebhookSecrets(
            plane.config.github.webhook_secret_names, plane.client("secretsmanager"), plane.clock
        ),
        idempotency=config,
        enqueue_once=idempotent_function(
            enqueue,
            data_keyword_argument="delivery",
            persistence_store=store,
            config=config,
            key_prefix="delivery",
        ),
    )
