"""CloudWatch as far as the stack's alarms need it: metric data from the functions' embedded metric format
lines, and an alarm of the synthesized template evaluated over them, as CloudWatch evaluates one.

moto stores alarms and metric data but does not evaluate an alarm's state from its metric; this does, for
a metric alarm on one metric (the kind `infra/constructs/observability.py` makes from a product metric):

- Metric data. A Lambda's log line in the embedded metric format is a JSON object whose
  `_aws.CloudWatchMetrics` lists, per namespace, the metric names and the dimension sets; each metric's
  value is the object's member of that name, and `_aws.Timestamp` its time in epoch milliseconds
  ("Specification: Embedded metric format", Amazon CloudWatch User Guide,
  CloudWatch_Embedded_Metric_Format_Specification.html).
- Evaluation. The alarm's statistic over each `Period` (periods aligned to the epoch), the latest
  `EvaluationPeriods` of them up to now; a period breaches when its statistic compares with `Threshold`
  by `ComparisonOperator`; the alarm is ALARM when `DatapointsToAlarm` of them (default: all of them, the
  "M out of N" of "Evaluating an alarm", AlarmThatSendsEmail.html) breach. A period without data is
  treated by `TreatMissingData` ("Configuring how CloudWatch alarms treat missing data",
  alarms-and-missing-data.html): `notBreaching` as within the threshold, `breaching` as over it,
  `missing` (the default) and `ignore` not at all; with none left, `missing` is INSUFFICIENT_DATA and
  `ignore` keeps the state it was in.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ALARM = "ALARM"
OK = "OK"
INSUFFICIENT_DATA = "INSUFFICIENT_DATA"

_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": operator.ge,
    "GreaterThanThreshold": operator.gt,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}
_STATISTICS: dict[str, Callable[[list[float]], float]] = {
    "Maximum": max,
    "Minimum": min,
    "Sum": sum,
    "Average": lambda values: sum(values) / len(values),
    "SampleCount": len,
}


@dataclass(frozen=True)
class Datum:
    namespace: str
    name: str
    dimensions: Mapping[str, str]
    at: float
    """Epoch seconds."""
    value: float


def metric_data(lines: Iterable[str]) -> list[Datum]:
    """Every metric value the embedded-metric-format lines among `lines` carry; other lines are skipped."""
    found: list[Datum] = []
    for line in lines:
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if not isinstance(document, dict) or "_aws" not in document:
            continue
        meta = document["_aws"]
        at = float(meta["Timestamp"]) / 1000
        for directive in meta.get("CloudWatchMetrics", []):
            for dimension_set in directive.get("Dimensions", [[]]):
                dimensions = {name: str(document[name]) for name in dimension_set}
                for metric in directive.get("Metrics", []):
                    values = document[metric["Name"]]
                    for value in values if isinstance(values, list) else [values]:
                        found.append(
                            Datum(directive["Namespace"], metric["Name"], dimensions, at, float(value))
                        )
    return found


def evaluate(
    alarm: Mapping[str, Any], data: Iterable[Datum], now: float, state: str = INSUFFICIENT_DATA
) -> str:
    """The state `alarm` (a template's AWS::CloudWatch::Alarm Properties) takes at `now` over `data`;
    `state` is the one it was in (what `ignore` keeps)."""
    metric, period, stat = _watched(alarm)
    wanted = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
    values = [
        datum
        for datum in data
        if datum.namespace == metric["Namespace"]
        and datum.name == metric["MetricName"]
        and dict(datum.dimensions) == wanted
    ]
    count = int(alarm["EvaluationPeriods"])
    to_alarm = int(alarm.get("DatapointsToAlarm", count))
    statistic = _STATISTICS[stat]
    compare = _COMPARISONS[alarm["ComparisonOperator"]]
    threshold = float(alarm["Threshold"])
    missing = alarm.get("TreatMissingData", "missing")
    latest = math.floor(now / period) * period
    verdicts: list[bool] = []
    for index in range(count):
        start = latest - index * period
        inside = [datum.value for datum in values if start <= datum.at < start + period]
        if inside:
            verdicts.append(compare(statistic(inside), threshold))
        elif missing == "breaching":
            verdicts.append(True)
        elif missing == "notBreaching":
            verdicts.append(False)
    if not verdicts:
        return state if missing == "ignore" else INSUFFICIENT_DATA
    return ALARM if sum(verdicts) >= to_alarm else OK


def _watched(alarm: Mapping[str, Any]) -> tuple[Mapping[str, Any], float, str]:
    """The metric an alarm watches, its period and statistic: given in the alarm's own properties
    (`MetricName`, `Namespace`, `Period`, `Statistic`), or as the one `MetricStat` of its `Metrics` that
    returns data (CloudWatch API Reference, MetricDataQuery: "When used in PutMetricAlarm, specify true
    for the one expression result to use as the alarm"; CloudFormation's AWS::CloudWatch::Alarm `Metrics`
    takes the same objects, the form CDK synthesises for a metric with a label, as the budget alarm's
    template shows). An expression of several metrics is not evaluated here."""
    if "Metrics" not in alarm:
        return alarm, float(alarm["Period"]), alarm["Statistic"]
    (returned,) = [query for query in alarm["Metrics"] if query.get("ReturnData", True)]
    stat = returned["MetricStat"]
    return stat["Metric"], float(stat["Period"]), stat["Stat"]
