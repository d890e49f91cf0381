"""The dashboard and alarms as synthesised: metrics the handlers really emit, and alarms that reach a person
when the config names where."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from infra.constructs.observability import PER_KEY_LOWEST, PER_KEY_METRICS, PRODUCT_METRICS
from runner_pool.domain.pool_partitions import PoolPartition
from tests.infra.synthesis import Synthesis

LAMBDAS = Path(__file__).resolve().parents[2] / "lambdas" / "runner_pool"
ALARM = "AWS::CloudWatch::Alarm"


def emitted_source() -> str:
    return "\n".join(path.read_text() for path in LAMBDAS.rglob("*.py"))


def alarms(synthesis: Synthesis) -> dict[str, Any]:
    return {
        logical_id.removeprefix("Observability"): r["Properties"]
        for logical_id, r in synthesis.resources.items()
        if r["Type"] == ALARM
    }


def test_every_metric_on_the_dashboard_is_one_a_handler_emits() -> None:
    # Given the control plane's source / Then each product metric name appears there as a literal
    source = emitted_source()
    names = [name for metrics in PRODUCT_METRICS.values() for _, name in metrics]
    missing = [name for name in names if f'"{name}"' not in source]
    assert missing == []
    # And each per-key family is emitted under its prefix
    prefixes = [*PER_KEY_METRICS.values(), *PER_KEY_LOWEST.values()]
    assert all(re.search(rf'f"{re.escape(prefix)}\{{', source) for prefix in prefixes)


def test_the_alarms_watch_dead_letters_failed_executions_and_refresh_errors(synthesis: Synthesis) -> None:
    # Given the synthesised alarms / Then there is one for each thing that needs a person
    names = {re.sub(r"[0-9A-F]{8}$", "", name) for name in alarms(synthesis)}
    assert names == {
        "DemandDeadLetters",
        "ProvisionFailures",
        "FollowUpFailures",
        "ReleaseFailures",
        "RefreshErrors",
        "RunnersQuarantined",
        "UnreadableRecords",
        "GitHubHourlyBudget",
        "SpotBreakerOpened",
        "InterruptedRerunsRefused",
        "JobsWaitingForCapacity",
    }


def test_the_spot_breaker_alarm_fires_when_a_class_goes_on_demand(synthesis: Synthesis) -> None:
    # Given the synthesised alarms / Then one fires on the first opening of a class's spot breaker
    (alarm,) = [a for name, a in alarms(synthesis).items() if name.startswith("SpotBreakerOpened")]
    assert "'SpotBreakerOpened'" in repr(alarm)
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_without_a_topic_the_alarms_notify_nobody(synthesis: Synthesis) -> None:
    # Given cdk.json's config, which names no alarm address or topic / Then alarms have no actions
    assert all("AlarmActions" not in alarm for alarm in alarms(synthesis).values())
    assert not any(r["Type"] == "AWS::SNS::Topic" for r in synthesis.resources.values())


def test_an_alarm_address_gets_an_encrypted_topic_that_every_alarm_notifies(
    custom_synthesis: Synthesis,
) -> None:
    # Given an operator's alarm address
    topics = {i: r for i, r in custom_synthesis.resources.items() if r["Type"] == "AWS::SNS::Topic"}
    (topic_id,) = topics

    # Then the topic is encrypted with a key CloudWatch may use, and the address is subscribed
    key = topics[topic_id]["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key_policy = custom_synthesis.resources[key]["Properties"]["KeyPolicy"]["Statement"]
    assert any(s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"} for s in key_policy)
    (subscription,) = [
        r for r in custom_synthesis.resources.values() if r["Type"] == "AWS::SNS::Subscription"
    ]
    assert subscription["Properties"] == {
        "Endpoint": "oncall@example.com",
        "Protocol": "email",
        "TopicArn": {"Ref": topic_id},
    }
    # And every alarm notifies it when it fires and when it clears
    for alarm in alarms(custom_synthesis).values():
        assert alarm["AlarmActions"] == [{"Ref": topic_id}]
        assert alarm["OKActions"] == [{"Ref": topic_id}]


def test_the_dashboard_shows_pool_size_per_partition(synthesis: Synthesis) -> None:
    # Given the dashboard's body
    (dashboard,) = [r for r in synthesis.resources.values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    body = json.dumps(dashboard["Properties"]["DashboardBody"])

    # Then each partition's pool queue depth is graphed under the partition's name
    for partition in PoolPartition.every(synthesis.config.resource_classes):
        assert f'\\"label\\":\\"{partition.name}\\"' in body, partition
    assert "ApproximateNumberOfMessagesVisible" in body


def test_the_dashboard_shows_the_control_planes_share_of_queue_time(synthesis: Synthesis) -> None:
    # Given the dashboard's body / Then it charts provision-to-ready percentiles, a metric provision emits
    (dashboard,) = [r for r in synthesis.resources.values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "ProvisionToReadySeconds" in body
    assert "p95" in body
    assert '"ProvisionToReadySeconds"' in emitted_source()


def test_the_github_budget_alarm_watches_refresh_reads_spared_for_registrations(synthesis: Synthesis) -> None:
    # Given the synthesised alarms / Then one fires when refresh stops reading GitHub for the hour's sake
    (alarm,) = [a for name, a in alarms(synthesis).items() if name.startswith("GitHubHourlyBudget")]
    assert "'GitHubHourShortJobs'" in repr(alarm)
    assert alarm["Threshold"] == 1
