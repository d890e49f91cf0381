"""What a control-plane Lambda may do, one grant per kind of work, each as narrow as the service allows.

Written as statements rather than CDK's `grant_*` where those grant more than the work needs:
`Table.grant` adds every index (`index/*`) and `grant_invoke` every version (`:*`); here each
statement names the table, the one index, the queues, the key or the instances' tag it is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs

from infra.constructs.notice_queues import NoticeQueueNames
from runner_pool.adapters import state_items as schema
from runner_pool.adapters.capacity_waits import WAITS_PARTITION
from runner_pool.adapters.class_history import HISTORY_PREFIX
from runner_pool.adapters.cost_ledger import COST_PREFIX
from runner_pool.adapters.registration_budget import BUDGET_PREFIX
from runner_pool.adapters.spot_breaker import BREAKER_PREFIX
from runner_pool.domain import doctor_readings
from runner_pool.environment import ENV_PREFIX, STACK_TAG_KEY

LAUNCHED_RESOURCES = ("fleet", "instance", "volume", "network-interface", "spot-instances-request")
"""What one CreateFleet creates; their ids exist only once it has."""
LAUNCH_INPUTS = ("subnet", "security-group")
ANY_INSTANCE = "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*"
"""How cdk-nag spells instance/* of this account and region."""
SERVICE_LINKED_ROLES = tuple(
    (service, role) for role, service in doctor_readings.SERVICE_LINKED_ROLES.items()
)
"""(service, role) of the roles EC2 Fleet and Spot act through: the doctor's (domain/doctor_readings.py)."""


def read_records(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Reads of named items: one (GetItem), or an instance's record, heartbeat and signal at once
    (BatchGetItem, StateTable.observe)."""
    _allow(grantee, ["dynamodb:BatchGetItem", "dynamodb:GetItem"], [table.table_arn])


def write_records(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Conditional transitions (UpdateItem) and new records (PutItem), with reads of named items."""
    _allow(
        grantee,
        ["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"],
        [table.table_arn],
    )


def transition_records(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Read one record (GetItem) and write its transitions (UpdateItem); never a new record."""
    _allow(grantee, ["dynamodb:GetItem", "dynamodb:UpdateItem"], [table.table_arn])


def find_by_run_key(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    _allow(grantee, ["dynamodb:Query"], [f"{table.table_arn}/index/{schema.RUN_KEY_INDEX}"])


def find_stopped(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """The stopped tier of a pool partition (StateTable.stopped), from its sparse index."""
    _allow(grantee, ["dynamodb:Query"], [f"{table.table_arn}/index/{schema.STOPPED_INDEX}"])


def mark_runs_finished(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Put a run's finished mark (StateTable.mark_run_finished) and no other item: every partition key
    written must carry the marks' prefix (dynamodb:LeadingKeys, DynamoDB Developer Guide,
    specifying-conditions.html; Null keeps ForAllValues from holding for a request without keys)."""
    _allow_on_keys(grantee, "dynamodb:PutItem", table, schema.FINISHED_RUN_PREFIX)


def count_spot_interruptions(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Put, count and open the spot circuit breaker's items (adapters/spot_breaker.py) and no other
    (dynamodb:LeadingKeys as in `mark_runs_finished`)."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"],
            resources=[table.table_arn],
            conditions={
                "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{BREAKER_PREFIX}*"]},
                "Null": {"dynamodb:LeadingKeys": "false"},
            },
        )
    )


def end_capacity_waits(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Delete a run key's wait for capacity once its jobs are served (adapters/capacity_waits.py), and no
    other item (dynamodb:LeadingKeys as in `mark_runs_finished`); noting one is a PutItem of
    `write_records`."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["dynamodb:DeleteItem"],
            resources=[table.table_arn],
            conditions={
                "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [WAITS_PARTITION]},
                "Null": {"dynamodb:LeadingKeys": "false"},
            },
        )
    )


def sweep_thresholds(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    _allow(grantee, ["dynamodb:Query"], [f"{table.table_arn}/index/{schema.THRESHOLD_INDEX}"])


def take_from_pool(grantee: iam.IGrantable, queues: Iterable[sqs.IQueue], table: dynamodb.ITable) -> None:
    """Receive, hold and release pool messages, delete what is taken, move offers to their own queue;
    and ask the by-idle index whether a partition has anything to take before reading its queue."""
    _allow(
        grantee,
        ["sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:SendMessage"],
        [queue.queue_arn for queue in queues],
    )
    _allow(grantee, ["dynamodb:Query"], [f"{table.table_arn}/index/{schema.IDLE_INDEX}"])


def offer_to_pool(grantee: iam.IGrantable, queues: Iterable[sqs.IQueue]) -> None:
    _allow(grantee, ["sqs:SendMessage"], [queue.queue_arn for queue in queues])


def sweep_pool(grantee: iam.IGrantable, queues: Iterable[sqs.IQueue], table: dynamodb.ITable) -> None:
    """Offer to the pool, and count, read and drop what no request can take from the queues of partitions
    the by-idle index shows empty (refresh's admissions and pool sweep). One statement: refresh's role is
    near IAM's 10,240-character inline limit, past which CDK moves statements to a managed policy."""
    _allow(
        grantee,
        [
            "sqs:SendMessage",
            "sqs:GetQueueAttributes",
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
        ],
        [queue.queue_arn for queue in queues],
    )
    _allow(grantee, ["dynamodb:Query"], [f"{table.table_arn}/index/{schema.IDLE_INDEX}"])


def send_notices(grantee: lambda_.Function, notice_queues: NoticeQueueNames) -> None:
    """Send to any instance's notice queue of the stack (domain/notices.py): the queues exist only at run
    time, one per instance, so the statement names the stack's prefix."""
    _allow(grantee, ["sqs:SendMessage"], [notice_queues.arns])
    _acknowledge_notice_queues(grantee, notice_queues)


def open_notice_queues(grantee: lambda_.Function, notice_queues: NoticeQueueNames) -> None:
    """Create (and tag at creation) a notice queue of the stack for each new instance, and only with the
    stack's tag: tagging on creation needs sqs:TagQueue as well as sqs:CreateQueue (Amazon SQS API
    Reference, CreateQueue), and aws:RequestTag applies to both (SQS Developer Guide, "ABAC condition
    keys for Amazon SQS", sqs-abac-condition-keys.html)."""
    stack = Stack.of(grantee)
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["sqs:CreateQueue", "sqs:TagQueue"],
            resources=[notice_queues.arns],
            conditions={"StringEquals": {f"aws:RequestTag/{STACK_TAG_KEY}": stack.stack_name}},
        )
    )
    _acknowledge_notice_queues(grantee, notice_queues)


def sweep_notice_queues(grantee: lambda_.Function, notice_queues: NoticeQueueNames) -> None:
    """List the stack's notice queues and delete those whose instance has ended. ListQueues has no
    resource type, so it is granted on `*` (Service Authorization Reference, "Actions, resources, and
    condition keys for Amazon SQS", https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonsqs.html:
    an action with no resource type must name all resources); it only lists names (the function asks
    for the stack's notice prefix) and grants nothing on a queue."""
    _allow(grantee, ["sqs:ListQueues"], ["*"])
    _allow(grantee, ["sqs:DeleteQueue"], [notice_queues.arns])
    _acknowledge_notice_queues(grantee, notice_queues)


def _acknowledge_notice_queues(grantee: lambda_.Function, notice_queues: NoticeQueueNames) -> None:
    acknowledge_wildcards(
        grantee,
        [notice_queues.finding],
        "Notice queues are opened at run time, one per instance, named by the instance id after the "
        "stack's prefix: only the prefix is known at deploy time.",
    )


def hand_off_runner_configs(
    grantee: lambda_.Function, key: kms.IKey, github_tokens: lambda_.IFunction
) -> None:
    """Ask GitHub for JIT configs (with a token for registration from the token function) and encrypt them
    for their instance."""
    act_as_github_app(grantee, github_tokens)
    _allow(grantee, ["kms:Encrypt"], [key.key_arn])


def act_as_github_app(grantee: lambda_.Function, github_tokens: lambda_.IFunction) -> None:
    """Call GitHub with installation tokens the token function mints (infra/constructs/github_tokens.py),
    never with the App's key: invoke that one function (its unqualified ARN, so no version or alias of
    it either), and be told its name."""
    _allow(grantee, ["lambda:InvokeFunction"], [github_tokens.function_arn])
    grantee.add_environment(f"{ENV_PREFIX}GITHUB_TOKEN_FUNCTION_NAME", github_tokens.function_name)


def share_github_hour(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Write GitHub's hourly remainder, read off an answer, onto the registration budget's item and no
    other (DynamoDbRegistrationBudget.observe; dynamodb:LeadingKeys as in `mark_runs_finished`)."""
    _allow_on_keys(grantee, "dynamodb:UpdateItem", table, BUDGET_PREFIX)


def note_class_history(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Add arrivals and boot times to the class history's items and no other (DynamoDbClassHistory.note;
    dynamodb:LeadingKeys as in `mark_runs_finished`)."""
    _allow_on_keys(grantee, "dynamodb:UpdateItem", table, HISTORY_PREFIX)


def record_costs(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Put the cost items (a hand-over's, an instance's life) and no other (DynamoDbCostLedger;
    dynamodb:LeadingKeys as in `mark_runs_finished`)."""
    _allow_on_keys(grantee, "dynamodb:PutItem", table, COST_PREFIX)


def read_costs(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Read a UTC day's cost items (Query) and no other: the daily budget, and the `cost` command's grant
    (dynamodb:LeadingKeys as in `mark_runs_finished`)."""
    _allow_on_keys(grantee, "dynamodb:Query", table, COST_PREFIX)


def check_readiness(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Read a held instance's record, heartbeat and signal, and note a started one's start -> ready."""
    read_records(grantee, table)
    note_class_history(grantee, table)


def read_class_history(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Read the class history (Query) and start a class's watch (UpdateItem): adaptive sizing."""
    _allow(grantee, ["dynamodb:Query", "dynamodb:UpdateItem"], [table.table_arn])


def read_github_runs(
    grantee: lambda_.Function, github_tokens: lambda_.IFunction, table: dynamodb.ITable
) -> None:
    """Ask GitHub about a run whose `requested` delivery never came (steps/run_trust.py): act as the App,
    read the registration budget's item (GitHub's hourly remainder) and no other, and share the hourly
    remainder GitHub's answer reports."""
    act_as_github_app(grantee, github_tokens)
    share_github_hour(grantee, table)
    _allow_on_keys(grantee, "dynamodb:GetItem", table, BUDGET_PREFIX)


def describe_instances(grantee: iam.IGrantable) -> None:
    """EC2's Describe actions support no resource-level permissions: `*` is the only resource (its
    cdk-nag finding is acknowledged with X-Ray's, by the function helper)."""
    _allow(
        grantee,
        ["ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplateVersions"],
        ["*"],
    )


def terminate_stack_instances(grantee: lambda_.Function) -> None:
    """TerminateInstances on instances that carry this stack's tag, and no other instance in the account."""
    _on_stack_instances(grantee, "ec2:TerminateInstances")


def stop_stack_instances(grantee: lambda_.Function) -> None:
    """StopInstances on this stack's instances: refresh stops idle on-demand ones for the stopped tier
    (issue 16, item 2)."""
    _on_stack_instances(grantee, "ec2:StopInstances")


def start_stack_instances(grantee: lambda_.Function) -> None:
    """StartInstances on this stack's instances: a claim worker starts a stopped one it claimed."""
    _on_stack_instances(grantee, "ec2:StartInstances")


def start_from_stopped_tier(
    grantee: lambda_.Function, table: dynamodb.ITable, volume_key: kms.IKey | None
) -> None:
    """Find a stopped instance of a partition, start it, and terminate one EC2 will not start (as any
    candidate that failed a check: its termination sorts out an id EC2 no longer knows by describing).
    Starting an instance attaches its encrypted volumes again, so the starter uses their key."""
    find_stopped(grantee, table)
    start_stack_instances(grantee)
    use_volume_key(grantee, volume_key)
    describe_instances(grantee)
    terminate_stack_instances(grantee)


def _on_stack_instances(grantee: lambda_.Function, action: str) -> None:
    """One EC2 instance action on instances that carry this stack's tag, and no other instance."""
    stack = Stack.of(grantee)
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=[action],
            resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
            conditions={"StringEquals": {f"aws:ResourceTag/{STACK_TAG_KEY}": stack.stack_name}},
        )
    )
    acknowledge_wildcards(
        grantee,
        [ANY_INSTANCE],
        "instance ids are known only at launch, so the statement names instance/* and its condition "
        f"requires the instance to carry this stack's {STACK_TAG_KEY} tag, which CreateFleet sets at launch: "
        "no other instance of the account can be acted on.",
    )


def launch_instances(
    grantee: lambda_.Function,
    *,
    launch_templates: Sequence[ec2.ILaunchTemplate],
    instance_roles: Sequence[iam.IRole],
    image_parameter_arns: Sequence[str],
    volume_key: kms.IKey | None,
    images: str = "*",
) -> None:
    """One instant CreateFleet (and the RunInstances it makes) from the stack's launch templates.

    The fleet, instances, volumes and interfaces are new, so their ARNs end in `*`; the launch
    templates are named one by one, the roles passed are the instance roles alone, and tags may only
    be written as part of the launch. The templates' AMIs are SSM parameters EC2 resolves with the
    caller's permissions (`image_parameter_arns`, infra/constructs/instances.py).
    """
    stack = Stack.of(grantee)

    def arn(resource: str, name: str = "*") -> str:
        return stack.format_arn(service="ec2", resource=resource, resource_name=name)

    templates = [arn("launch-template", template.launch_template_id or "") for template in launch_templates]
    _allow(
        grantee,
        ["ec2:CreateFleet", "ec2:RunInstances"],
        [
            *templates,
            *(arn(resource) for resource in (*LAUNCHED_RESOURCES, *LAUNCH_INPUTS)),
            stack.format_arn(service="ec2", resource="image", resource_name=images, account=""),
        ],
    )
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["ec2:CreateTags"],
            resources=[arn(resource) for resource in LAUNCHED_RESOURCES],
            conditions={"StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"]}},
        )
    )
    for role in instance_roles:
        role.grant_pass_role(grantee.grant_principal)
    _allow(grantee, ["ssm:GetParameters"], list(image_parameter_arns))
    use_volume_key(grantee, volume_key)
    acknowledge_wildcards(
        grantee,
        [
            *(
                f"arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:{resource}/*"
                for resource in LAUNCHED_RESOURCES
            ),
            *(
                f"arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:{resource}/*"
                for resource in LAUNCH_INPUTS
            ),
            f"arn:<AWS::Partition>:ec2:<AWS::Region>::image/{images}",
        ],
        "CreateFleet creates the fleet, instances, volumes, interfaces and spot requests, whose ids "
        "exist only after the call, so they are `*`; the subnets (the fleet's overrides, from the "
        "Lambda's environment), security group and AMI are chosen at run time by the launch templates, "
        "which are named one by one; CreateTags is allowed only as part of the launch.",
    )
    # An instant fleet needs EC2 Fleet's service-linked role, and spot capacity EC2 Spot's; the first
    # CreateFleet of an account makes them.
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["iam:CreateServiceLinkedRole"],
            resources=[
                stack.format_arn(
                    service="iam",
                    region="",
                    resource="role",
                    resource_name=f"aws-service-role/{service}/{role}",
                )
                for service, role in SERVICE_LINKED_ROLES
            ],
            conditions={
                "StringEquals": {"iam:AWSServiceName": [service for service, _ in SERVICE_LINKED_ROLES]}
            },
        )
    )


VOLUME_KEY_ACTIONS = (
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
)
"""What the principal that launches or starts an instance with volumes encrypted under a customer managed key
calls on that key, beside kms:CreateGrant: the EBS User Guide's "Requirements for Amazon EBS encryption",
"Permissions for users" (https://docs.aws.amazon.com/ebs/latest/userguide/ebs-encryption-requirements.html)
lists kms:CreateGrant, kms:Decrypt, kms:DescribeKey, kms:GenerateDataKeyWithoutPlainText and kms:ReEncrypt,
which IAM authorizes as kms:ReEncryptFrom and kms:ReEncryptTo (named, not `kms:ReEncrypt*`: no statement of
the stack grants by wildcard)."""


def use_volume_key(grantee: iam.IGrantable, volume_key: kms.IKey | None) -> None:
    """What EBS needs of the caller to create or attach volumes under `volume_key` (none without one): the
    key's use, and grants only for EBS itself (kms:GrantIsForAWSResource, as the same page advises)."""
    if volume_key is None:
        return
    _allow(grantee, list(VOLUME_KEY_ACTIONS), [volume_key.key_arn])
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["kms:CreateGrant"],
            resources=[volume_key.key_arn],
            conditions={"Bool": {"kms:GrantIsForAWSResource": True}},
        )
    )


def acknowledge_wildcards(grantee: lambda_.Function, resources: Sequence[str], reason: str) -> None:
    """Acknowledge cdk-nag's IAM5 for each wildcard resource (as cdk-nag spells it) of `grantee`'s role."""
    for resource in resources:
        Validations.of(grantee.role or grantee).acknowledge(
            Acknowledgment(id=f"AwsSolutions-IAM5[Resource::{resource}]", reason=reason)
        )


def _allow_on_keys(grantee: iam.IGrantable, action: str, table: dynamodb.ITable, prefix: str) -> None:
    """`action` on the table's items whose partition key starts with `prefix` and no other: every key the
    request names must carry it (dynamodb:LeadingKeys, DynamoDB Developer Guide, specifying-conditions.html;
    Null keeps ForAllValues from holding for a request without keys)."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=[action],
            resources=[table.table_arn],
            conditions={
                "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{prefix}*"]},
                "Null": {"dynamodb:LeadingKeys": "false"},
            },
        )
    )


def ship_job_logs(grantee: iam.IGrantable, log_group_arn: str) -> None:
    """An instance's lines into the job logs' group: make a stream and put events in it, nothing else (no
    read, no other group). IAM cannot tie a stream to the calling instance: a stream's name is in no
    condition key, only in the resource, and the keys naming the instance (`ec2:SourceInstanceARN`, and
    `aws:userid`, `<role id>:<instance id>` for a role on an instance: IAM User Guide, "IAM policy
    elements: Variables and tags") hold a ':', which no stream name may (CloudWatch Logs API Reference,
    CreateLogStream). README "Security model" says what that lets a job with root write."""
    _allow(grantee, ["logs:CreateLogStream", "logs:PutLogEvents"], [log_group_arn])


def _allow(grantee: iam.IGrantable, actions: list[str], resources: list[str]) -> None:
    grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=resources))


def start_executions(grantee: iam.IGrantable, state_machine_arns: Sequence[str]) -> None:
    """Start executions of the named state machines (a redrive, a reconciled job, a dead runner's release)."""
    _allow(grantee, ["states:StartExecution"], list(state_machine_arns))


def end_provisions(
    grantee: lambda_.Function,
    table: dynamodb.ITable,
    state_machine_arns: Sequence[str],
    github_tokens: lambda_.IFunction,
) -> None:
    """What Finish (and Dump) do beyond expiring: ask again for what a provision could not serve, and
    note, tell (a check run, as the App) and end a run key's wait for capacity."""
    start_executions(grantee, state_machine_arns)
    end_capacity_waits(grantee, table)
    act_as_github_app(grantee, github_tokens)


def reconcile_recent_demand(grantee: iam.IGrantable, table: dynamodb.ITable) -> None:
    """Read and forget the runs with recent demand (one partition of the state table, by Query)."""
    _allow(grantee, ["dynamodb:Query", "dynamodb:DeleteItem"], [table.table_arn])
