"""The logger, tracer and metrics every Lambda handler uses: one place, so logic never imports a handler."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = "runner-pool"
METRICS_NAMESPACE = "RunnerPool"

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
