"""Ingress and refresh as synthesised: the webhook API, the demand queue and its consumer, the idempotency
table, and refresh's schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.constructs.ingress import (
    DEMAND_BATCH_SIZE,
    DEMAND_BATCHING_WINDOW_SECONDS,
    DEMAND_MAX_RECEIVES,
    GITHUB_DELIVERY_BURST,
    REQUIRED_HEADERS,
    THROTTLE_BURST,
    THROTTLE_RATE_PER_SECOND,
)
from runner_pool.adapters.ledger_items import EXPIRY_ATTRIBUTE, KEY_ATTRIBUTE
from tests.infra.synthesis import Synthesis


def of_type(synthesis: Synthesis, kind: str) -> dict[str, Mapping[str, Any]]:
    return {logical_id: r for logical_id, r in synthesis.resources.items() if r["Type"] == kind}


def only(synthesis: Synthesis, kind: str) -> Mapping[str, Any]:
    (resource,) = of_type(synthesis, kind).values()
    properties: Mapping[str, Any] = resource["Properties"]
    return properties


def logical_id(synthesis: Synthesis, construct: Any) -> str:
    return synthesis.stack.get_logical_id(construct.node.default_child)


def test_the_stage_throttles_logs_every_request_and_traces(synthesis: Synthesis) -> None:
    # Given the API's one stage
    stage = only(synthesis, "AWS::ApiGateway::Stage")

    # Then every method is throttled, every request is access-logged as JSON, and requests are traced
    (settings,) = stage["MethodSettings"]
    assert (settings["ThrottlingRateLimit"], settings["ThrottlingBurstLimit"]) == (
        THROTTLE_RATE_PER_SECOND,
        THROTTLE_BURST,
    )
    # And the bucket takes GitHub's burst of 1,000 deliveries whole: a 429 is a failed delivery that
    # GitHub does not redeliver on its own ("Handling failed webhook deliveries")
    assert settings["ThrottlingBurstLimit"] >= GITHUB_DELIVERY_BURST == 1000
    assert settings["ThrottlingRateLimit"] >= GITHUB_DELIVERY_BURST / 2
    assert settings["LoggingLevel"] == "ERROR"
    assert "$context.requestId" in stage["AccessLogSetting"]["Format"]
    access_logs = logical_id(synthesis, synthesis.stack.ingress.access_logs)
    assert {"Ref": access_logs} in stage["AccessLogSetting"]["DestinationArn"]["Fn::Join"][1]
    assert stage["TracingEnabled"] is True


def test_the_webhook_method_refuses_what_is_not_a_delivery_before_the_lambda(synthesis: Synthesis) -> None:
    # Given the one method of the API
    method = only(synthesis, "AWS::ApiGateway::Method")
    validator = only(synthesis, "AWS::ApiGateway::RequestValidator")

    # Then it is a POST proxied to the webhook Lambda
    assert method["HttpMethod"] == "POST"
    assert method["Integration"]["Type"] == "AWS_PROXY"
    webhook = logical_id(synthesis, synthesis.stack.ingress.webhook)
    assert webhook in str(method["Integration"]["Uri"])
    # And GitHub's delivery headers are required by a validator, which leaves the body unread
    # until the webhook has checked its signature
    assert method["RequestParameters"] == {f"method.request.header.{h}": True for h in REQUIRED_HEADERS}
    assert method["RequestValidatorId"] == {
        "Ref": next(iter(of_type(synthesis, "AWS::ApiGateway::RequestValidator")))
    }
    assert (validator["ValidateRequestParameters"], validator["ValidateRequestBody"]) == (True, False)
    assert of_type(synthesis, "AWS::ApiGateway::Model") == {}


def test_demand_has_a_dead_letter_queue_after_a_few_receives(synthesis: Synthesis) -> None:
    # Given the demand queue / Then a message that keeps failing moves to the dead-letter queue
    demand = synthesis.resources[logical_id(synthesis, synthesis.stack.ingress.demand_queue)]["Properties"]
    dead_letters = logical_id(synthesis, synthesis.stack.ingress.dead_letters)
    assert demand["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": [dead_letters, "Arn"]},
        "maxReceiveCount": DEMAND_MAX_RECEIVES,
    }


def test_the_dispatcher_takes_demand_in_batches_and_reports_partial_failures(synthesis: Synthesis) -> None:
    # Given the event source of the dispatcher
    mapping = only(synthesis, "AWS::Lambda::EventSourceMapping")

    # Then a run's first job is not held for a batching window (the dispatcher's follow-up batch
    # gathers the rest), so a batch is at most 10 messages (CreateEventSourceMapping: a larger one
    # needs a window of at least 1 s), and only failed messages come back
    assert mapping.get("MaximumBatchingWindowInSeconds", 0) == DEMAND_BATCHING_WINDOW_SECONDS == 0
    assert mapping["BatchSize"] == DEMAND_BATCH_SIZE == 10
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["FunctionName"] == {"Ref": logical_id(synthesis, synthesis.stack.ingress.dispatcher)}
    # And the queue hides a message long enough for the dispatcher to finish with it
    demand = synthesis.resources[logical_id(synthesis, synthesis.stack.ingress.demand_queue)]["Properties"]
    assert (
        demand["VisibilityTimeout"]
        >= 6 * synthesis.resources[mapping["FunctionName"]["Ref"]]["Properties"]["Timeout"]
    )


def test_the_dispatcher_may_start_the_three_state_machines_and_no_other(synthesis: Synthesis) -> None:
    # Given the dispatcher's role
    role = synthesis.resources[logical_id(synthesis, synthesis.stack.ingress.dispatcher)]["Properties"][
        "Role"
    ]
    starting = [
        s
        for p in of_type(synthesis, "AWS::IAM::Policy").values()
        if {"Ref": role["Fn::GetAtt"][0]} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if s["Action"] == "states:StartExecution"
    ]

    # Then it starts provision, release and follow-up executions, by their ARNs, and nothing else
    machines = {
        logical_id(synthesis, synthesis.stack.provision.state_machine),
        logical_id(synthesis, synthesis.stack.release.state_machine),
        logical_id(synthesis, synthesis.stack.ingress.follow_up.state_machine),
    }
    (statement,) = starting
    assert {resource["Ref"] for resource in statement["Resource"]} == machines


def test_the_idempotency_table_has_powertools_key_and_ttl(synthesis: Synthesis) -> None:
    # Given the idempotency table / Then its key and TTL are the ones Powertools and the ledger use
    table = synthesis.resources[logical_id(synthesis, synthesis.stack.ingress.idempotency_table)][
        "Properties"
    ]
    assert table["KeySchema"] == [{"AttributeName": KEY_ATTRIBUTE, "KeyType": "HASH"}]
    assert table["TimeToLiveSpecification"] == {"AttributeName": EXPIRY_ATTRIBUTE, "Enabled": True}
    # And it is encrypted and recoverable like the state table
    assert table["SSESpecification"] == {"SSEEnabled": True}
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


def test_refresh_runs_on_a_schedule_at_the_configured_rate(synthesis: Synthesis) -> None:
    # Given the schedule rule / Then it invokes the refresh function every refresh_rate_minutes
    rule = synthesis.resources[logical_id(synthesis, synthesis.stack.refresh.schedule)]["Properties"]
    minutes = synthesis.config.refresh_rate_minutes
    assert rule["ScheduleExpression"] == f"rate({minutes} minute{'s' if minutes != 1 else ''})"
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [logical_id(synthesis, synthesis.stack.refresh.function), "Arn"]}
