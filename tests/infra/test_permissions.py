"""The shape of what the control-plane roles grant, as synthesised: narrow resources and conditions.

What each function calls is not listed here: every call a test makes is checked against its role by
emulator/iam_check.py, and the test session reports the grants no call used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infra.constructs import permissions
from infra.constructs.functions import HANDLERS_PACKAGE
from runner_pool.adapters import state_items as schema
from runner_pool.adapters.cost_ledger import COST_PREFIX
from runner_pool.adapters.spot_breaker import BREAKER_PREFIX
from runner_pool.environment import ENV_PREFIX, STACK_TAG_KEY
from tests.infra.synthesis import Synthesis

LAUNCH = {"ec2:CreateFleet", "ec2:RunInstances", "iam:PassRole"}
TOKEN_HANDLER = "github_token.github_token"
EVERY_FUNCTION = {
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
}


def statements(synthesis: Synthesis, handler: str) -> list[Mapping[str, Any]]:
    """The statements of the role of the function whose handler is `handler` (relative to handlers)."""
    (function,) = [
        r
        for r in synthesis.resources.values()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"]["Handler"] == f"{HANDLERS_PACKAGE}.{handler}"
    ]
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return [
        statement
        for policy in synthesis.resources.values()
        if policy["Type"] == "AWS::IAM::Policy" and {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def actions(statement: Mapping[str, Any]) -> set[str]:
    action = statement["Action"]
    return {action} if isinstance(action, str) else set(action)


def granted(synthesis: Synthesis, handler: str) -> set[str]:
    return {action for s in statements(synthesis, handler) for action in actions(s)} - EVERY_FUNCTION


def handlers(synthesis: Synthesis) -> list[str]:
    return [
        r["Properties"]["Handler"].removeprefix(f"{HANDLERS_PACKAGE}.")
        for r in synthesis.resources.values()
        if r["Type"] == "AWS::Lambda::Function"
    ]


def test_no_policy_of_the_stack_grants_an_action_by_wildcard(synthesis: Synthesis) -> None:
    # Given every IAM policy of the stack / Then each action is named in full
    named = {
        action
        for r in synthesis.resources.values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
        for action in actions(s)
    }
    assert named
    assert not {action for action in named if "*" in action}


def test_every_role_keeps_its_statements_inline(synthesis: Synthesis) -> None:
    # Given the stack's template / Then no role's policy overflowed into a managed policy: CDK moves
    # statements there past IAM's 10,240-character inline limit, and the emulator's IAM check
    # (emulator/iam_stack.py) reads each role's inline policies, so it would deny what AWS allows
    overflowed = [k for k, r in synthesis.resources.items() if r["Type"] == "AWS::IAM::ManagedPolicy"]
    assert overflowed == []


def test_launching_passes_only_the_instance_role_and_tags_only_at_launch(synthesis: Synthesis) -> None:
    instance_role = synthesis.logical_id(synthesis.stack.instances.role)
    launching = [h for h in handlers(synthesis) if granted(synthesis, h) & LAUNCH]
    assert launching
    for handler in launching:
        # Given a launching function's statements
        found = statements(synthesis, handler)
        (pass_role,) = [s for s in found if "iam:PassRole" in actions(s)]
        (tagging,) = [s for s in found if "ec2:CreateTags" in actions(s)]
        # Then it passes the instance role, and only that
        assert pass_role["Resource"] == {"Fn::GetAtt": [instance_role, "Arn"]}, handler
        # And tags only as part of CreateFleet or RunInstances
        assert tagging["Condition"] == {
            "StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"]}
        }, handler


def test_the_functions_that_launch_or_start_instances_may_use_the_configured_ebs_key(
    synthesis: Synthesis, custom_synthesis: Synthesis
) -> None:
    # Given a stack configured with a customer managed EBS key, and one without
    key_arn = custom_synthesis.config.instances.ebs_kms_key_arn
    volume_starters = [
        h
        for h in handlers(custom_synthesis)
        if granted(custom_synthesis, h) & (LAUNCH | {"ec2:StartInstances"})
    ]
    assert {"provision.claim", "provision.create", "refresh.refresh"} <= set(volume_starters), volume_starters
    for handler in handlers(custom_synthesis):
        on_key = [s for s in statements(custom_synthesis, handler) if s["Resource"] == key_arn]
        if handler not in volume_starters:
            # Then a function that neither launches nor starts instances has nothing on the key
            assert not on_key, handler
            continue
        # Then each one that does may use it as EBS requires, and create grants only for EBS itself
        used = {a for s in on_key if "Condition" not in s for a in actions(s)}
        assert used == set(permissions.VOLUME_KEY_ACTIONS), handler
        (grant,) = [s for s in on_key if "kms:CreateGrant" in actions(s)]
        assert grant["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": True}}, handler
    # And without a configured key no function is granted any EBS key's use
    assert not any(
        "kms:GenerateDataKeyWithoutPlaintext" in granted(synthesis, h) for h in handlers(synthesis)
    )


def test_every_termination_is_limited_to_the_stacks_tagged_instances(synthesis: Synthesis) -> None:
    terminating = [
        (handler, s)
        for handler in handlers(synthesis)
        for s in statements(synthesis, handler)
        if "ec2:TerminateInstances" in actions(s)
    ]
    assert terminating
    # Given every statement that allows TerminateInstances / Then it requires this stack's tag
    for handler, statement in terminating:
        assert statement["Condition"] == {
            "StringEquals": {f"aws:ResourceTag/{STACK_TAG_KEY}": synthesis.stack.stack_name}
        }, handler


def test_no_function_may_decrypt_runner_configs(synthesis: Synthesis) -> None:
    # Given every function / Then none may decrypt: only the instance a config is for can
    assert not any("kms:Decrypt" in granted(synthesis, h) for h in handlers(synthesis))


def test_table_queries_name_one_index_each(synthesis: Synthesis) -> None:
    # Given every Query statement / Then it names exactly one index of the state table, never index/*
    table = synthesis.logical_id(synthesis.stack.state_table.table)
    queries = [
        (handler, resource)
        for handler in handlers(synthesis)
        for s in statements(synthesis, handler)
        if "dynamodb:Query" in actions(s)
        for resource in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
    ]
    assert queries
    # ... but for refresh's runs with recent demand, one partition of the table itself (its key is fixed),
    # and the spot breaker's and the day's cost partitions, which the interruptions function and refresh
    # may reach only by their prefix
    on_table = [handler for handler, resource in queries if resource == {"Fn::GetAtt": [table, "Arn"]}]
    assert sorted(on_table) == ["interruptions.hear", "refresh.refresh", "refresh.refresh"]
    for handler, prefix in (("interruptions.hear", BREAKER_PREFIX), ("refresh.refresh", COST_PREFIX)):
        (keyed,) = [
            s for s in statements(synthesis, handler) if "dynamodb:Query" in actions(s) and "Condition" in s
        ]
        assert keyed["Condition"]["ForAllValues:StringLike"] == {"dynamodb:LeadingKeys": [f"{prefix}*"]}
    for handler, resource in queries:
        if resource == {"Fn::GetAtt": [table, "Arn"]}:
            continue
        (index,) = [part for part in resource["Fn::Join"][1] if isinstance(part, str)]
        assert resource["Fn::Join"][1][0] == {"Fn::GetAtt": [table, "Arn"]}, handler
        assert index in {
            f"/index/{schema.RUN_KEY_INDEX}",
            f"/index/{schema.THRESHOLD_INDEX}",
            f"/index/{schema.STOPPED_INDEX}",
            f"/index/{schema.IDLE_INDEX}",
        }, handler


POOL_USERS = {
    # Begin's one pickup for every slot (issue 15, item 2); a claim worker's own, after a discard
    "provision.begin": {
        "sqs:ReceiveMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
        "sqs:SendMessage",
    },
    "provision.claim": {
        "sqs:ReceiveMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
        "sqs:SendMessage",
    },
    "provision.dump": {"sqs:SendMessage"},
    "release.check_receipt": {"sqs:SendMessage"},
    # Admissions offer; the pool sweep counts, reads and drops what no request can take.
    "refresh.refresh": {
        "sqs:SendMessage",
        "sqs:GetQueueAttributes",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
    },
}
"""What each function that reads or writes the pool does with its queues (DESIGN.md 6.2, 6.5, 7, 8)."""


def test_the_pool_grants_name_exactly_the_partition_queues(synthesis: Synthesis) -> None:
    # Given the pool queues of every partition, by their ARNs in the template
    pool = [
        {"Fn::GetAtt": [synthesis.logical_id(queue), "Arn"]} for queue in synthesis.stack.pool_queues.queues
    ]
    assert len(pool) == len(synthesis.config.resource_classes) * 4
    for handler in handlers(synthesis):
        # When the function's SQS statements on pool queues are read
        on_pool = [
            s for s in statements(synthesis, handler) if any(resource in pool for resource in _resources(s))
        ]
        # Then a function that uses the pool is granted its actions on every partition's queue and on
        # nothing else, and no other function is granted anything on a pool queue
        granted_actions = {action for s in on_pool for action in actions(s)}
        assert granted_actions == POOL_USERS.get(handler, set()), handler
        for statement in on_pool:
            assert sorted(map(str, _resources(statement))) == sorted(map(str, pool)), handler


def _resources(statement: Mapping[str, Any]) -> list[Any]:
    resource = statement["Resource"]
    return resource if isinstance(resource, list) else [resource]


def roles_granted(synthesis: Synthesis, action: str, resource_mentions: str) -> set[str]:
    """The logical ids of every role of the stack (functions', the instances', any other) with a statement
    allowing `action` on a resource whose template form mentions `resource_mentions`."""
    return {
        role["Ref"]
        for policy in synthesis.resources.values()
        if policy["Type"] == "AWS::IAM::Policy"
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Effect"] == "Allow"
        and action in actions(statement)
        and resource_mentions in json.dumps(statement["Resource"])
        for role in policy["Properties"]["Roles"]
    }


def role_of(synthesis: Synthesis, handler: str) -> str:
    (function,) = [
        r
        for r in synthesis.resources.values()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"]["Handler"] == f"{HANDLERS_PACKAGE}.{handler}"
    ]
    role: str = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return role


def test_only_the_token_function_may_read_the_apps_key(synthesis: Synthesis) -> None:
    # Given the App's key, imported by name / Then exactly one role of the stack may read it: the token
    # function's
    key_name = synthesis.stack.github_app_key.secret_name
    readers = roles_granted(synthesis, "secretsmanager:GetSecretValue", key_name)
    assert readers == {role_of(synthesis, TOKEN_HANDLER)}


def test_with_two_apps_the_token_function_alone_reads_both_keys_and_the_webhook_both_secrets(
    custom_synthesis: Synthesis,
) -> None:
    # Given a stack of two Apps / Then each App's key is read by the token function's role alone, and each
    # App's webhook secret by the webhook's alone
    for app in custom_synthesis.config.github.every_app:
        keys = roles_granted(custom_synthesis, "secretsmanager:GetSecretValue", app.private_key_secret_name)
        hooks = roles_granted(custom_synthesis, "secretsmanager:GetSecretValue", app.webhook_secret_name)
        assert keys == {role_of(custom_synthesis, TOKEN_HANDLER)}
        assert hooks == {role_of(custom_synthesis, "webhook.receive")}


def test_every_function_that_calls_github_invokes_the_token_function_and_is_told_its_name(
    synthesis: Synthesis,
) -> None:
    token_function = synthesis.logical_id(synthesis.stack.github_tokens.function)
    invokers = roles_granted(synthesis, "lambda:InvokeFunction", token_function)
    functions = {
        r["Properties"]["Handler"].removeprefix(f"{HANDLERS_PACKAGE}."): r
        for r in synthesis.resources.values()
        if r["Type"] == "AWS::Lambda::Function"
    }
    told = {
        handler
        for handler, function in functions.items()
        if f"{ENV_PREFIX}GITHUB_TOKEN_FUNCTION_NAME" in function["Properties"]["Environment"]["Variables"]
    }
    # Given the functions that act as the App: provision's, refresh, release's, the dispatcher, follow-up's
    # Then each may invoke the token function, on its unqualified ARN only, and is told its name
    assert told
    assert invokers == {role_of(synthesis, handler) for handler in told}
    assert TOKEN_HANDLER not in told
    for handler in told:
        invoking = [s for s in statements(synthesis, handler) if "lambda:InvokeFunction" in actions(s)]
        assert [s["Resource"] for s in invoking] == [{"Fn::GetAtt": [token_function, "Arn"]}], handler
