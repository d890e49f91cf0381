"""What IAM authorizes for each AWS call our code makes: one table, each row cited from AWS's docs.

A row turns a call's parameters (as boto3 takes them) into the IAM requests AWS evaluates for it:
the action, the resource ARN (index ARNs for index queries, every table of a batch, every resource a
launch touches) and the request-context keys that policy conditions read. The Service Authorization
Reference (SAR, docs.aws.amazon.com/service-authorization/latest/reference/list_<service>.html) gives
each action's resource types and condition keys; where a service's own guide says more, it is cited.

An operation missing from the table fails the check (`UnmappedCallError`) instead of passing unseen.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from emulator.iam_policy import ContextValue


@dataclass(frozen=True)
class Authorization:
    """One request IAM evaluates for a call: `action` on `resource`, with these context keys."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchInputs:
    """What a launch template brings to a launch: its AMI, security groups and instance role."""

    image_id: str
    security_group_ids: tuple[str, ...]
    role_arn: str | None


class Lookups(Protocol):
    """What the rows need to know of the local world beyond a call's own parameters."""

    partition: str
    region: str
    account: str

    def partition_key(self, table_name: str) -> str: ...
    def secret_arn(self, secret_id: str) -> str: ...
    def instance_tags(self, instance_id: str) -> Mapping[str, str]: ...
    def launch_inputs(self, template_id: str) -> LaunchInputs: ...
    def key_arn(self, key_id: str) -> str: ...
    def queue_tags(self, queue_url: str) -> Mapping[str, str] | None: ...


class UnmappedCallError(LookupError):
    def __init__(self, operation: str) -> None:
        super().__init__(
            f"{operation} has no row in emulator/iam_calls.py: add its IAM action, resources and "
            "condition keys from the Service Authorization Reference"
        )


Row = Callable[[Mapping[str, Any], Lookups], list[Authorization]]
ROWS: dict[str, Row] = {}


def authorizations(
    service: str, operation: str, params: Mapping[str, Any], world: Lookups
) -> list[Authorization]:
    """Every IAM request AWS evaluates for `service`'s `operation` called with `params`."""
    row = ROWS.get(f"{service}:{operation}")
    if row is None:
        raise UnmappedCallError(f"{service}:{operation}")
    return row(params, world)


def _row(*operations: str) -> Callable[[Row], Row]:
    def register(row: Row) -> Row:
        for operation in operations:
            ROWS[operation] = row
        return row

    return register


def _arn(world: Lookups, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
    return (
        f"arn:{world.partition}:{service}:{world.region if region else ''}:"
        f"{world.account if account else ''}:{resource}"
    )


# --- DynamoDB ------------------------------------------------------------------------------------
# SAR list_amazondynamodb.html: item actions authorize the table (`table/<name>`); Query with IndexName
# authorizes the index (`table/<name>/index/<index>`), not the table; BatchGetItem authorizes
# dynamodb:BatchGetItem on every table it names. Condition keys, from the DynamoDB Developer Guide
# "Using IAM policy conditions for fine-grained access control" (specifying-conditions.html):
# dynamodb:LeadingKeys is the partition key value(s) of the items the request reaches (multivalued);
# dynamodb:Attributes the attribute names the request writes or asks for (multivalued);
# dynamodb:ReturnValues and dynamodb:Select the request's parameters of those names.


def _table_arn(world: Lookups, table: str, index: str | None = None) -> str:
    return _arn(world, "dynamodb", f"table/{table}" + (f"/index/{index}" if index else ""))


def _leading_keys(world: Lookups, table: str, keys: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    name = world.partition_key(table)
    return tuple(dict.fromkeys(_scalar(key[name]) for key in keys if name in key))


def _scalar(value: Mapping[str, Any]) -> str:
    """A DynamoDB attribute value as IAM compares it (a string; numbers in their decimal form)."""
    ((_, scalar),) = value.items()
    return str(scalar)


def _expression_names(expression: str | None, aliases: Mapping[str, str]) -> list[str]:
    """The attribute names an expression mentions, `#aliases` resolved; values (`:v`), functions and
    keywords left out."""
    if not expression:
        return []
    names = []
    for word in re.findall(r"(?<![:\w#])#?[A-Za-z_][A-Za-z0-9_]*\b(?!\s*\()", expression):
        if word.upper() in _EXPRESSION_KEYWORDS:
            continue
        names.append(aliases.get(word, word) if word.startswith("#") else word)
    return list(dict.fromkeys(names))


_EXPRESSION_KEYWORDS = {"SET", "REMOVE", "ADD", "DELETE", "AND", "OR", "NOT", "IN", "BETWEEN"}


def _item_context(
    world: Lookups,
    table: str,
    keys: Iterable[Mapping[str, Any]],
    attributes: Iterable[str],
    params: Mapping[str, Any],
) -> dict[str, ContextValue]:
    context: dict[str, ContextValue] = {"dynamodb:LeadingKeys": _leading_keys(world, table, keys)}
    attributes = tuple(dict.fromkeys(attributes))
    if attributes:
        context["dynamodb:Attributes"] = attributes
    for parameter, key in (("ReturnValues", "dynamodb:ReturnValues"), ("Select", "dynamodb:Select")):
        if parameter in params:
            context[key] = str(params[parameter])
    return context


@_row("dynamodb:GetItem")
def _get_item(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    table = params["TableName"]
    asked = _expression_names(params.get("ProjectionExpression"), params.get("ExpressionAttributeNames", {}))
    context = _item_context(
        world, table, [params["Key"]], [*asked, *params.get("AttributesToGet", [])], params
    )
    return [Authorization("dynamodb:GetItem", _table_arn(world, table), context)]


@_row("dynamodb:PutItem")
def _put_item(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    table = params["TableName"]
    context = _item_context(world, table, [params["Item"]], params["Item"], params)
    return [Authorization("dynamodb:PutItem", _table_arn(world, table), context)]


@_row("dynamodb:UpdateItem")
def _update_item(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    table = params["TableName"]
    written = _expression_names(params.get("UpdateExpression"), params.get("ExpressionAttributeNames", {}))
    context = _item_context(world, table, [params["Key"]], [*params["Key"], *written], params)
    return [Authorization("dynamodb:UpdateItem", _table_arn(world, table), context)]


@_row("dynamodb:DeleteItem")
def _delete_item(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    table = params["TableName"]
    context = _item_context(world, table, [params["Key"]], [], params)
    return [Authorization("dynamodb:DeleteItem", _table_arn(world, table), context)]


@_row("dynamodb:BatchGetItem")
def _batch_get_item(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    return [
        Authorization(
            "dynamodb:BatchGetItem",
            _table_arn(world, table),
            _item_context(world, table, request["Keys"], [], params),
        )
        for table, request in params["RequestItems"].items()
    ]


@_row("dynamodb:Query")
def _query(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    table, index = params["TableName"], params.get("IndexName")
    context: dict[str, ContextValue] = {}
    if index is None:
        # The table's own partition key, in `pk = :value` form (the only one a Query can have).
        names = {world.partition_key(table)}
        names |= {
            alias for alias, name in params.get("ExpressionAttributeNames", {}).items() if name in names
        }
        for name, value in re.findall(r"(#?\w+)\s*=\s*(:\w+)", params.get("KeyConditionExpression", "")):
            if name in names:
                context["dynamodb:LeadingKeys"] = (_scalar(params["ExpressionAttributeValues"][value]),)
    if "Select" in params:
        context["dynamodb:Select"] = str(params["Select"])
    return [Authorization("dynamodb:Query", _table_arn(world, table, index), context)]


# --- SQS -----------------------------------------------------------------------------------------
# SAR list_amazonsqs.html: every action authorizes the queue, `arn:<p>:sqs:<region>:<account>:<name>`.
# The SQS Developer Guide's "Amazon SQS API permissions: Actions and resource reference"
# (sqs-api-permissions-reference.html): the batch operations need the permission of their single form
# (SendMessageBatch → sqs:SendMessage, DeleteMessageBatch → sqs:DeleteMessage, ...).


def _queue_arn(world: Lookups, url: str) -> str:
    return _arn(world, "sqs", url.rstrip("/").rsplit("/", 1)[-1])


# A queue's tags are aws:ResourceTag/<key> for every queue action (SQS Developer Guide, "ABAC condition
# keys for Amazon SQS", sqs-abac-condition-keys.html: "Amazon SQS queue resource operations"). A call on
# a queue that does not exist touches nothing whatever IAM says of it; it is left to the service's own
# answer (NonExistentQueue), as an agent meets it when it listens before its queue is opened.


def _queue_call(action: str) -> Row:
    def row(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
        tags = world.queue_tags(params["QueueUrl"])
        if tags is None:
            return []
        context = {f"aws:ResourceTag/{key}": value for key, value in tags.items()}
        return [Authorization(action, _queue_arn(world, params["QueueUrl"]), context)]

    return row


for _operation, _action in {
    "SendMessage": "sqs:SendMessage",
    "SendMessageBatch": "sqs:SendMessage",
    "ReceiveMessage": "sqs:ReceiveMessage",
    "DeleteMessage": "sqs:DeleteMessage",
    "DeleteMessageBatch": "sqs:DeleteMessage",
    "ChangeMessageVisibility": "sqs:ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
    "GetQueueAttributes": "sqs:GetQueueAttributes",
    "DeleteQueue": "sqs:DeleteQueue",
}.items():
    ROWS[f"sqs:{_operation}"] = _queue_call(_action)


@_row("sqs:CreateQueue")
def _create_queue(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """Tags given at creation need sqs:TagQueue as well (Amazon SQS API Reference, CreateQueue), and
    both are authorized with the request's tags (aws:RequestTag/<key>, aws:TagKeys)."""
    tags: Mapping[str, str] = params.get("tags", {})
    context: dict[str, ContextValue] = {f"aws:RequestTag/{key}": value for key, value in tags.items()}
    context["aws:TagKeys"] = tuple(tags)
    queue = _arn(world, "sqs", params["QueueName"])
    actions = ("sqs:CreateQueue", "sqs:TagQueue") if tags else ("sqs:CreateQueue",)
    return [Authorization(action, queue, context) for action in actions]


@_row("sqs:ListQueues")
def _list_queues(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """Authorizes `*`, whatever the prefix: ListQueues has no resource type (SAR list_amazonsqs.html)."""
    return [Authorization("sqs:ListQueues", "*")]


@_row("sqs:GetQueueUrl")
def _get_queue_url(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    return [Authorization("sqs:GetQueueUrl", _arn(world, "sqs", params["QueueName"]))]


# --- KMS -----------------------------------------------------------------------------------------
# SAR list_awskeymanagementservice.html: Encrypt and Decrypt authorize the key (`key/<id>`), with the
# condition keys kms:EncryptionContext:<key> (one per pair of the request's encryption context) and
# kms:EncryptionContextKeys (multivalued); the KMS Developer Guide's "kms:EncryptionContext: context
# key" (conditions-kms.html#conditions-kms-encryption-context). Decrypt's key is the one the ciphertext
# names when KeyId is not given (KMS API Reference, Decrypt).


def _encryption_context(params: Mapping[str, Any]) -> dict[str, ContextValue]:
    pairs: Mapping[str, str] = params.get("EncryptionContext", {})
    context: dict[str, ContextValue] = {f"kms:EncryptionContext:{k}": v for k, v in pairs.items()}
    context["kms:EncryptionContextKeys"] = tuple(pairs)
    return context


@_row("kms:Encrypt")
def _encrypt(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    return [Authorization("kms:Encrypt", world.key_arn(params["KeyId"]), _encryption_context(params))]


MOTO_KEY_ID_BYTES = 36
"""moto's ciphertext starts with the key's id (`_serialize_ciphertext_blob`: emulator/moto_internals.py)."""


@_row("kms:Decrypt")
def _decrypt(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    blob = params["CiphertextBlob"]
    if isinstance(blob, Mapping):  # a call replayed from another process carries bytes as base64
        blob = base64.b64decode(blob["bytes"])
    key = params.get("KeyId") or bytes(blob[:MOTO_KEY_ID_BYTES]).decode()
    return [Authorization("kms:Decrypt", world.key_arn(key), _encryption_context(params))]


# --- Lambda, Secrets Manager, Step Functions, STS-----------------------------------------------------


@_row("secretsmanager:GetSecretValue")
def _get_secret_value(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """SAR list_awssecretsmanager.html: the secret, by its full ARN (name plus six random characters)."""
    return [Authorization("secretsmanager:GetSecretValue", world.secret_arn(params["SecretId"]))]


@_row("lambda:Invoke")
def _invoke(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """SAR list_awslambda.html: Invoke is authorized as lambda:InvokeFunction on the function, named by
    its name or ARN (a qualified ARN, or `Qualifier`, names that version or alias)."""
    name = str(params["FunctionName"])
    qualifier = params.get("Qualifier")
    arn = name if name.startswith("arn:") else _arn(world, "lambda", f"function:{name}")
    return [Authorization("lambda:InvokeFunction", f"{arn}:{qualifier}" if qualifier else arn)]


@_row("stepfunctions:StartExecution")
def _start_execution(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """SAR list_awsstepfunctions.html: StartExecution authorizes the state machine."""
    return [Authorization("states:StartExecution", params["stateMachineArn"])]


@_row("sts:GetCallerIdentity")
def _get_caller_identity(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """No permission is needed: "No permissions are required to perform this operation" (STS API
    Reference, GetCallerIdentity)."""
    return []


# --- EC2 -----------------------------------------------------------------------------------------
# SAR list_amazonec2.html. Describe* actions support no resource-level permissions: `*` only.
# TerminateInstances, StopInstances and StartInstances authorize each instance, with its tags as
# aws:ResourceTag/<key> and its id as ec2:InstanceID (condition keys of the `instance` resource type).


def _describe(action: str) -> Row:
    def row(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
        return [Authorization(action, "*")]

    return row


for _operation in ("DescribeInstances", "DescribeInstanceTypes", "DescribeLaunchTemplateVersions"):
    ROWS[f"ec2:{_operation}"] = _describe(f"ec2:{_operation}")


def _instance_context(world: Lookups, instance_id: str) -> dict[str, ContextValue]:
    tags = world.instance_tags(instance_id)
    return {
        "ec2:InstanceID": instance_id,
        **{f"aws:ResourceTag/{key}": value for key, value in tags.items()},
        **{f"ec2:ResourceTag/{key}": value for key, value in tags.items()},
    }


def _on_instances(action: str) -> Row:
    def row(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
        return [
            Authorization(action, _arn(world, "ec2", f"instance/{i}"), _instance_context(world, i))
            for i in params["InstanceIds"]
        ]

    return row


for _operation in ("TerminateInstances", "StopInstances", "StartInstances"):
    ROWS[f"ec2:{_operation}"] = _on_instances(f"ec2:{_operation}")


NEW = "*"
"""The id of a resource a launch creates: unknown until the call returns, so only `type/*` can allow it."""


@_row("ec2:CreateFleet")
def _create_fleet(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    """An instant fleet. SAR: CreateFleet authorizes the fleet, the launch templates and the subnets of
    its overrides, and lists ec2:RunInstances, ec2:CreateTags and iam:PassRole as dependent actions;
    the EC2 User Guide's "EC2 Fleet prerequisites" (ec2-fleet-prerequisites.html) says an instant
    fleet launches with the caller's permissions: RunInstances on the instance, volume, network
    interface, subnet, security group, image and launch template (SAR, RunInstances), the spot
    request when it buys spot, CreateTags on what it tags at launch with ec2:CreateAction naming the
    launching call (supported-iam-actions-tagging.html), and iam:PassRole on the launch template's
    instance role, with iam:PassedToService ec2.amazonaws.com (id_roles_use_passrole.html)."""
    requests: list[Authorization] = [Authorization("ec2:CreateFleet", _arn(world, "ec2", f"fleet/{NEW}"))]
    spot = params.get("TargetCapacitySpecification", {}).get("DefaultTargetCapacityType") == "spot" or bool(
        params.get("TargetCapacitySpecification", {}).get("SpotTargetCapacity")
    )
    for config in params.get("LaunchTemplateConfigs", []):
        template_id = config["LaunchTemplateSpecification"]["LaunchTemplateId"]
        inputs = world.launch_inputs(template_id)
        template_arn = _arn(world, "ec2", f"launch-template/{template_id}")
        subnets = [o["SubnetId"] for o in config.get("Overrides", []) if "SubnetId" in o]
        requests.append(Authorization("ec2:CreateFleet", template_arn))
        requests += [Authorization("ec2:CreateFleet", _arn(world, "ec2", f"subnet/{s}")) for s in subnets]
        launched = [
            template_arn,
            *(_arn(world, "ec2", f"{kind}/{NEW}") for kind in ("instance", "volume", "network-interface")),
            *(_arn(world, "ec2", f"subnet/{s}") for s in subnets),
            *(_arn(world, "ec2", f"security-group/{g}") for g in inputs.security_group_ids),
            _arn(world, "ec2", f"image/{inputs.image_id}", account=False),
        ]
        if spot:
            launched.append(_arn(world, "ec2", f"spot-instances-request/{NEW}"))
        requests += [Authorization("ec2:RunInstances", arn) for arn in dict.fromkeys(launched)]
        if inputs.role_arn is not None:
            requests.append(
                Authorization("iam:PassRole", inputs.role_arn, {"iam:PassedToService": "ec2.amazonaws.com"})
            )
    # An instant fleet tags the fleet or its instances (CreateFleet's TagSpecifications, EC2 API Reference).
    tagged = {spec["ResourceType"] for spec in params.get("TagSpecifications", []) if spec.get("Tags")}
    requests += [
        Authorization(
            "ec2:CreateTags", _arn(world, "ec2", f"{kind}/{NEW}"), {"ec2:CreateAction": "CreateFleet"}
        )
        for kind in sorted(tagged)
    ]
    return requests


# --- CloudWatch Logs -------------------------------------------------------------------------------
# SAR list_amazoncloudwatchlogs.html: CreateLogStream and PutLogEvents authorize the log stream,
# `arn:<p>:logs:<region>:<account>:log-group:<group>:log-stream:<stream>` (earlier versions of the page gave
# CreateLogStream the log group; a grant on `log-group:<group>:*`, as the CloudWatch Logs User Guide's
# "Overview of managing access permissions" writes a group's ARN for IAM policies, covers both);
# FilterLogEvents and GetLogEvents authorize the log group, `log-group:<group>`.


def _log_stream_call(action: str) -> Row:
    def row(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
        group, stream = params["logGroupName"], params["logStreamName"]
        return [Authorization(action, _arn(world, "logs", f"log-group:{group}:log-stream:{stream}"))]

    return row


ROWS["logs:CreateLogStream"] = _log_stream_call("logs:CreateLogStream")
ROWS["logs:PutLogEvents"] = _log_stream_call("logs:PutLogEvents")


@_row("logs:FilterLogEvents")
def _filter_log_events(params: Mapping[str, Any], world: Lookups) -> list[Authorization]:
    return [Authorization("logs:FilterLogEvents", _arn(world, "logs", f"log-group:{params['logGroupName']}"))]
