"""The logger, tracer and metrics every Lambda handler uses: one place, so logic never imports a handler."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric

if TYPE_CHECKING:
    from runner_pool.domain.executions import ProvisionRequest

SERVICE = "runner-pool"
METRICS_NAMESPACE = "RunnerPool"

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)


def count(name: str, value: float = 1, unit: MetricUnit = MetricUnit.Count) -> None:
    """Publish one count metric at once, on its own.

    Not the process-wide `metrics` set: the local emulator runs a Map's iterations as threads of
    one process, where one handler's flush would empty another's set mid-way. Honours
    POWERTOOLS_METRICS_DISABLED, which Powertools' single_metric does not.
    """
    if os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() in ("1", "true"):
        return
    with single_metric(
        name=name,
        unit=unit,
        value=value,
        namespace=METRICS_NAMESPACE,
        default_dimensions={"service": SERVICE},
    ):
        pass


def seconds(name: str, value: float) -> None:
    """Publish one duration metric at once (CloudWatch keeps percentiles of these)."""
    count(name, value, MetricUnit.Seconds)


def log_provisions_started(provisions: Iterable[ProvisionRequest]) -> None:
    """One line per provision execution started (by the dispatcher, or a follow-up's gather step)."""
    for request in provisions:
        logger.info(
            "provision started",
            run_key=request.run_key,
            count=request.count,
            execution=request.execution_name,
        )
