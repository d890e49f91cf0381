"""The IAM evaluator (emulator/iam_policy.py) against AWS's documented rules, each test citing its page.

IAM = https://docs.aws.amazon.com/IAM/latest/UserGuide/ ; DDB = the DynamoDB Developer Guide's
specifying-conditions.html ; KMS = the KMS Developer Guide's conditions-kms.html.
"""

from __future__ import annotations

from typing import Any

import pytest

from emulator.iam_policy import ContextValue, Request, Statement, evaluate

TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/state"
INSTANCE_A = "arn:aws:ec2:us-east-1:123456789012:instance/i-0aaaaaaaaaaaaaaaa"
INSTANCE_B = "arn:aws:ec2:us-east-1:123456789012:instance/i-0bbbbbbbbbbbbbbbb"


def allow(action: Any = "dynamodb:GetItem", resource: Any = TABLE, **more: Any) -> Statement:
    return Statement.from_json({"Effect": "Allow", "Action": action, "Resource": resource, **more})


def deny(action: Any = "dynamodb:GetItem", resource: Any = TABLE, **more: Any) -> Statement:
    return Statement.from_json({"Effect": "Deny", "Action": action, "Resource": resource, **more})


def request(
    action: str = "dynamodb:GetItem", resource: str = TABLE, context: dict[str, ContextValue] | None = None
) -> Request:
    return Request(action, resource, context or {})


def allowed(statements: list[Statement], req: Request) -> bool:
    return evaluate(statements, req).allowed


# --- evaluation logic: IAM reference_policies_evaluation-logic.html -----------------------------


def test_a_request_no_statement_allows_is_implicitly_denied() -> None:
    # Given a policy allowing GetItem / When PutItem is asked / Then it is denied by default
    decision = evaluate([allow()], request("dynamodb:PutItem"))
    assert not decision.allowed
    assert decision.denied_by is None
    assert "no statement allows dynamodb:PutItem" in decision.explain()


def test_an_explicit_deny_wins_over_any_allow() -> None:
    # Given an Allow and a Deny for the same request / Then the Deny decides, whatever the order
    assert not allowed([allow(), deny()], request())
    assert not allowed([deny(), allow()], request())
    assert evaluate([allow(), deny()], request()).denied_by is not None


def test_a_deny_whose_condition_fails_does_not_apply() -> None:
    # Given a Deny conditioned on insecure transport / When the request is over TLS / Then the Allow stands
    insecure = deny(Condition={"Bool": {"aws:SecureTransport": "false"}})
    assert allowed([allow(), insecure], request(context={"aws:SecureTransport": "true"}))


# --- Action and NotAction: reference_policies_elements_action.html, _notaction.html --------------


def test_actions_match_case_insensitively_with_wildcards() -> None:
    statement = allow(["DynamoDB:get*", "sqs:Send?essage"])
    assert allowed([statement], request("dynamodb:GetItem"))
    assert allowed([statement], request("sqs:SendMessage", TABLE))
    assert not allowed([statement], request("dynamodb:PutItem"))


def test_not_action_applies_to_every_action_it_does_not_list() -> None:
    statement = Statement.from_json({"Effect": "Allow", "NotAction": "dynamodb:PutItem", "Resource": "*"})
    assert allowed([statement], request("dynamodb:GetItem"))
    assert not allowed([statement], request("dynamodb:PutItem"))


# --- Resource and NotResource: reference_policies_elements_resource.html, _notresource.html -------


def test_a_table_arn_does_not_cover_its_indexes() -> None:
    # The SAR names `table/<name>/index/<index>` a resource of its own, which Query on an index needs.
    index = f"{TABLE}/index/by-run-key"
    assert not allowed([allow("dynamodb:Query")], request("dynamodb:Query", index))
    assert allowed([allow("dynamodb:Query", f"{TABLE}/index/by-run-key")], request("dynamodb:Query", index))
    assert not allowed(
        [allow("dynamodb:Query", f"{TABLE}/index/by-run-key")], request("dynamodb:Query", TABLE)
    )


def test_resource_wildcards_match_within_a_segment_and_star_alone_matches_all() -> None:
    assert allowed(
        [allow("ec2:TerminateInstances", "arn:aws:ec2:*:123456789012:instance/*")],
        request("ec2:TerminateInstances", INSTANCE_A),
    )
    assert not allowed(
        [allow("ec2:TerminateInstances", "arn:aws:ec2:*:999999999999:instance/*")],
        request("ec2:TerminateInstances", INSTANCE_A),
    )
    assert allowed([allow("ec2:DescribeInstances", "*")], request("ec2:DescribeInstances", "*"))


def test_resource_arns_are_case_sensitive() -> None:
    assert not allowed([allow(resource=TABLE.upper())], request())


def test_not_resource_applies_to_every_resource_it_does_not_list() -> None:
    statement = Statement.from_json({"Effect": "Allow", "Action": "dynamodb:GetItem", "NotResource": TABLE})
    assert not allowed([statement], request())
    assert allowed([statement], request(resource=f"{TABLE}-other"))


# --- conditions: reference_policies_elements_condition_operators.html -------------------------------


def test_a_condition_key_absent_from_the_request_fails_a_positive_operator() -> None:
    statement = allow(Condition={"StringEquals": {"aws:ResourceTag/stack": "pool"}})
    assert not allowed([statement], request())
    assert allowed([statement], request(context={"aws:ResourceTag/stack": "pool"}))


def test_a_negated_operator_holds_when_the_key_is_absent() -> None:
    statement = allow(Condition={"StringNotEquals": {"aws:ResourceTag/stack": "other"}})
    assert allowed([statement], request())


def test_if_exists_holds_when_the_key_is_absent_and_checks_it_when_present() -> None:
    statement = allow(Condition={"StringEqualsIfExists": {"aws:ResourceTag/stack": "pool"}})
    assert allowed([statement], request())
    assert not allowed([statement], request(context={"aws:ResourceTag/stack": "other"}))


def test_condition_key_names_are_case_insensitive_and_values_case_sensitive() -> None:
    # reference_policies_elements_condition.html
    statement = allow(Condition={"StringEquals": {"AWS:resourcetag/Stack": "Pool"}})
    assert allowed([statement], request(context={"aws:ResourceTag/stack": "Pool"}))
    assert not allowed([statement], request(context={"aws:ResourceTag/stack": "pool"}))


def test_operators_and_keys_are_anded_and_values_ored() -> None:
    # reference_policies_multi-value-conditions.html: operators AND, keys AND, values OR
    statement = allow(
        Condition={
            "StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"], "aws:RequestTag/a": "1"},
        }
    )
    assert allowed(
        [statement], request(context={"ec2:CreateAction": "RunInstances", "aws:RequestTag/a": "1"})
    )
    assert not allowed(
        [statement], request(context={"ec2:CreateAction": "CreateTags", "aws:RequestTag/a": "1"})
    )
    assert not allowed([statement], request(context={"ec2:CreateAction": "CreateFleet"}))


def test_string_like_takes_wildcards_and_string_equals_does_not() -> None:
    like = allow(Condition={"StringLike": {"aws:ResourceTag/name": "runner-*"}})
    equals = allow(Condition={"StringEquals": {"aws:ResourceTag/name": "runner-*"}})
    assert allowed([like], request(context={"aws:ResourceTag/name": "runner-7"}))
    assert not allowed([equals], request(context={"aws:ResourceTag/name": "runner-7"}))


def test_arn_equals_compares_arns_segment_by_segment() -> None:
    statement = allow(
        Condition={"ArnEquals": {"ec2:SourceInstanceARN": "arn:aws:ec2:*:123456789012:instance/*"}}
    )
    assert allowed([statement], request(context={"ec2:SourceInstanceARN": INSTANCE_A}))
    assert not allowed(
        [statement], request(context={"ec2:SourceInstanceARN": "arn:aws:ec2:us-east-1:999:instance/i-1"})
    )


def test_an_operator_the_evaluator_does_not_model_fails_loudly() -> None:
    statement = allow(Condition={"NumericLessThan": {"aws:MultiFactorAuthAge": "3600"}})
    with pytest.raises(ValueError, match="not modelled"):
        evaluate([statement], request(context={"aws:MultiFactorAuthAge": "1"}))


# --- multivalued keys: reference_policies_condition-single-vs-multi-valued-context-keys.html --------


def test_for_all_values_needs_every_request_value_to_match() -> None:
    statement = allow(
        Condition={"ForAllValues:StringEquals": {"dynamodb:Attributes": ["pk", "sk", "beat_at"]}}
    )
    assert allowed([statement], request(context={"dynamodb:Attributes": ("pk", "sk", "beat_at")}))
    assert not allowed([statement], request(context={"dynamodb:Attributes": ("pk", "sk", "state")}))


def test_for_all_values_holds_when_the_key_is_absent_or_empty() -> None:
    # The documented pitfall: ForAllValues is true for a request without the key.
    statement = allow(Condition={"ForAllValues:StringEquals": {"dynamodb:Attributes": ["pk"]}})
    assert allowed([statement], request())
    assert allowed([statement], request(context={"dynamodb:Attributes": ()}))


def test_for_any_value_needs_one_match_and_fails_when_the_key_is_absent() -> None:
    statement = allow(Condition={"ForAnyValue:StringEquals": {"kms:EncryptionContextKeys": ["instance-arn"]}})
    assert allowed([statement], request(context={"kms:EncryptionContextKeys": ("other", "instance-arn")}))
    assert not allowed([statement], request(context={"kms:EncryptionContextKeys": ("other",)}))
    assert not allowed([statement], request())


# --- policy variables: reference_policies_variables.html ----------------------------------------------


def test_a_policy_variable_in_a_condition_takes_the_requests_value() -> None:
    # DDB: LeadingKeys limited to the caller's own instance ARN, the pattern of our instance role.
    statement = allow(
        Condition={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["${ec2:SourceInstanceARN}"]}}
    )
    own = request(context={"ec2:SourceInstanceARN": INSTANCE_A, "dynamodb:LeadingKeys": (INSTANCE_A,)})
    other = request(context={"ec2:SourceInstanceARN": INSTANCE_A, "dynamodb:LeadingKeys": (INSTANCE_B,)})
    both = request(
        context={"ec2:SourceInstanceARN": INSTANCE_A, "dynamodb:LeadingKeys": (INSTANCE_A, INSTANCE_B)}
    )
    assert allowed([statement], own)
    assert not allowed([statement], other)
    assert not allowed([statement], both)


def test_a_variable_the_request_cannot_resolve_makes_the_statement_match_nothing() -> None:
    statement = allow(
        Condition={"StringEquals": {"kms:EncryptionContext:instance-arn": "${ec2:SourceInstanceARN}"}}
    )
    # Given a request without the variable's key, whose value is the variable's own text
    unresolvable = request(context={"kms:EncryptionContext:instance-arn": "${ec2:SourceInstanceARN}"})
    # Then the statement does not match (no literal comparison with the unreplaced text)
    assert not allowed([statement], unresolvable)
    in_resource = allow(resource="arn:aws:dynamodb:us-east-1:123456789012:table/${aws:username}")
    assert not allowed([in_resource], request())


def test_a_variable_in_an_arn_condition_value_is_resolved_from_the_resources_keys() -> None:
    # Our instance role's TerminateSelf: the source instance must be the instance being terminated
    # (ec2:InstanceID is a condition key of the `instance` resource type, SAR list_amazonec2.html).
    statement = allow(
        "ec2:TerminateInstances",
        "arn:aws:ec2:us-east-1:123456789012:instance/*",
        Condition={
            "ArnEquals": {
                "ec2:SourceInstanceARN": "arn:aws:ec2:us-east-1:123456789012:instance/${ec2:InstanceID}"
            }
        },
    )
    itself = request(
        "ec2:TerminateInstances",
        INSTANCE_A,
        context={"ec2:SourceInstanceARN": INSTANCE_A, "ec2:InstanceID": "i-0aaaaaaaaaaaaaaaa"},
    )
    another = request(
        "ec2:TerminateInstances",
        INSTANCE_B,
        context={"ec2:SourceInstanceARN": INSTANCE_A, "ec2:InstanceID": "i-0bbbbbbbbbbbbbbbb"},
    )
    assert allowed([statement], itself)
    assert not allowed([statement], another)


def test_literal_variables_stand_for_their_characters() -> None:
    statement = allow(Condition={"StringEquals": {"aws:ResourceTag/name": "a${*}b"}})
    assert allowed([statement], request(context={"aws:ResourceTag/name": "a*b"}))
    assert not allowed([statement], request(context={"aws:ResourceTag/name": "axb"}))


def test_a_denied_request_names_the_statements_whose_conditions_failed() -> None:
    statement = allow(
        Condition={"StringEquals": {"kms:EncryptionContext:instance-arn": "${ec2:SourceInstanceARN}"}}
    )
    decision = evaluate(
        [statement],
        request(
            context={"ec2:SourceInstanceARN": INSTANCE_A, "kms:EncryptionContext:instance-arn": INSTANCE_B}
        ),
    )
    assert not decision.allowed
    assert "kms:EncryptionContext:instance-arn" in decision.explain()
