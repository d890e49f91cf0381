"""The interruptions construct as synthesised: its two rules, what they match, and the one function they invoke."""

from __future__ import annotations

from typing import Any

from infra.constructs.interruptions import RETRY_ATTEMPTS
from runner_pool.domain.interruptions import Notice
from tests.infra.synthesis import Synthesis


def _properties(synthesis: Synthesis, construct: Any) -> Any:
    return synthesis.resources[synthesis.logical_id(construct)]["Properties"]


def _hear_arn(synthesis: Synthesis) -> Any:
    function = synthesis.stack.interruptions.function
    return {"Fn::GetAtt": [synthesis.logical_id(function), "Arn"]}


def test_the_warnings_rule_sends_every_spot_warning_and_rebalance_recommendation(
    synthesis: Synthesis,
) -> None:
    # Given the warnings rule as synthesised
    rule = _properties(synthesis, synthesis.stack.interruptions.warnings)
    # Then it matches EC2's two warnings, of any instance, and invokes the function with retries
    assert rule["EventPattern"] == {
        "source": ["aws.ec2"],
        "detail-type": [Notice.INTERRUPTION.value, Notice.REBALANCE.value],
    }
    (target,) = rule["Targets"]
    assert target["Arn"] == _hear_arn(synthesis)
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == RETRY_ATTEMPTS


def test_the_state_changes_rule_sends_only_stops_and_terminations(synthesis: Synthesis) -> None:
    # Given the state-changes rule as synthesised
    rule = _properties(synthesis, synthesis.stack.interruptions.state_changes)
    # Then it matches only the states that change what a record means
    assert rule["EventPattern"] == {
        "source": ["aws.ec2"],
        "detail-type": [Notice.STATE_CHANGE.value],
        "detail": {"state": ["shutting-down", "stopped", "stopping", "terminated"]},
    }
    (target,) = rule["Targets"]
    assert target["Arn"] == _hear_arn(synthesis)
