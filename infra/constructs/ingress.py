"""Ingress: GitHub's webhook deliveries in through API Gateway, demand through SQS to the dispatcher.

    POST /webhook ─▶ webhook Lambda ─▶ demand queue (DLQ) ─▶ dispatcher Lambda ─▶ StartExecution
                                                              └─▶ follow-up state machine ─▶ StartExecution

The REST API throttles, logs every request and turns away what is not a GitHub delivery at all
(no `X-GitHub-Event` or `X-GitHub-Delivery` header, or a JSON body that is not an object: 400)
before any Lambda runs; everything else, the signature first, is the webhook's to judge
(runner_pool.domain.webhooks). The idempotency table
remembers deliveries (Powertools idempotency) and holds the dispatcher's demand ledger. The follow-up
state machine gathers a run's follow-up batch (domain.follow_up) for the dispatch that leads it, so that
dispatch need not wait for the batch's window in a Lambda holding one of the demand queue's pollers.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constructs import permissions
from infra.constructs.functions import LOG_RETENTION, ControlPlaneFunctions
from infra.constructs.resources import StackResources
from infra.constructs.retries import FOLLOW_UP
from infra.constructs.workflow import Step, Workflow
from runner_pool.adapters.ledger_items import EXPIRY_ATTRIBUTE, KEY_ATTRIBUTE
from runner_pool.domain.config import WorkflowType
from runner_pool.environment import ENV_PREFIX

WEBHOOK_PATH = "webhook"
REQUIRED_HEADERS = ("X-GitHub-Event", "X-GitHub-Delivery")
"""Headers GitHub sends with every delivery; a request without them is refused by API Gateway."""
GITHUB_DELIVERY_BURST = 1000
"""The burst of deliveries the stage must take without refusing one: a thousand jobs queued at once
(four 256-job matrices, GitHub's matrix limit) are a thousand `queued` deliveries within seconds."""
THROTTLE_BURST = GITHUB_DELIVERY_BURST
THROTTLE_RATE_PER_SECOND = 500
"""API Gateway's stage throttle is a token bucket: THROTTLE_BURST requests at once, refilled at the
rate. A refused request is a 429, and "GitHub does not automatically redeliver failed deliveries"
(GitHub Docs, "Handling failed webhook deliveries"): the job waits until refresh asks for the
failed delivery again, a minute or more. So the bucket holds the whole burst (it starts full) and
refills it in two seconds; the old 50 rps with a burst of 100 turned most of such a burst into failed
deliveries. Both stay within the account's Regional limit (10,000 rps, burst 5,000: API Gateway
quotas), and a flood of forged requests still stops at 500 a second, each refused by the webhook in
milliseconds."""
DISPATCHER_TIMEOUT_SECONDS = 60
DEMAND_BATCH_SIZE = 10
DEMAND_BATCHING_WINDOW_SECONDS = 0
"""No batching window: a run's first job is dispatched the moment the event source receives it, and
the rest of its matrix is gathered by the dispatcher's follow-up batch (domain.follow_up), which holds
across Lambda's concurrent batches where a window does not (each poller gathers its own). With no
window a batch is at most 10 messages ("when you set BatchSize to a value greater than 10, you must
set MaximumBatchingWindowInSeconds to at least 1", CreateEventSourceMapping); Lambda's event source
reads the queue with five concurrent batches and adds up to 300 a minute while messages remain
(services-sqs-scaling.html), so a burst of 1,000 deliveries is 100 batches, the first 5 at once.
The dispatcher reserves no concurrency (the stack fits an account's first quota of 10): what bounds
its concurrency is that scaling; a follow-up's leader does not wait for its window there (the follow-up
state machine does), only should that machine not start."""
DEMAND_MAX_RECEIVES = 5


class Ingress(Construct):
    """`api` is the webhook endpoint; `demand_queue` and `dead_letters` the demand path's queues."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        resources: StackResources,
        *,
        webhook_secrets: Sequence[secretsmanager.ISecret],
        provision: sfn.IStateMachine,
        release: sfn.IStateMachine,
    ) -> None:
        super().__init__(scope, construct_id)
        functions, table, github_tokens = resources.functions, resources.table, resources.github_tokens
        workflow_type = resources.config.workflow_type
        self._table = table
        self.idempotency_table = dynamodb.Table(
            self,
            "IdempotencyTable",
            partition_key=dynamodb.Attribute(name=KEY_ATTRIBUTE, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=EXPIRY_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Days of delivery ids and job reservations: nothing to keep once the stack is gone.
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.dead_letters = sqs.Queue(
            self,
            "DemandDeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.demand_queue = sqs.Queue(
            self,
            "DemandQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            # AWS's advice for a Lambda event source: six times the function's timeout.
            visibility_timeout=Duration.seconds(6 * DISPATCHER_TIMEOUT_SECONDS),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letters, max_receive_count=DEMAND_MAX_RECEIVES
            ),
        )
        self.webhook = functions.function(
            self,
            "webhook.receive",
            construct_id="Webhook",
            description="checks a GitHub delivery and queues the demand it carries, once per delivery",
            environment={
                "demand_queue_url": self.demand_queue.queue_url,
                "idempotency_table_name": self.idempotency_table.table_name,
            },
            timeout=Duration.seconds(10),
        )
        self.follow_up = self._follow_up(functions, provision, workflow_type, github_tokens)
        for webhook_secret in webhook_secrets:
            webhook_secret.grant_read(self.webhook)
        self.demand_queue.grant_send_messages(self.webhook)
        self._remember(self.webhook)
        self.dispatcher = functions.function(
            self,
            "dispatcher.dispatch",
            construct_id="Dispatcher",
            description="turns a batch of demand into provision and release executions",
            environment={
                "idempotency_table_name": self.idempotency_table.table_name,
                "provision_state_machine_arn": provision.state_machine_arn,
                "release_state_machine_arn": release.state_machine_arn,
                "follow_up_state_machine_arn": self.follow_up.state_machine.state_machine_arn,
            },
            timeout=Duration.seconds(DISPATCHER_TIMEOUT_SECONDS),
        )
        provision.grant_start_execution(self.dispatcher)
        release.grant_start_execution(self.dispatcher)
        self.follow_up.state_machine.grant_start_execution(self.dispatcher)
        self._remember(self.dispatcher, counts_jobs=True)
        permissions.read_github_runs(self.dispatcher, github_tokens, self._table)
        permissions.note_class_history(self.dispatcher, self._table)  # each job's arrival in its class
        self.dispatcher.add_event_source(
            event_sources.SqsEventSource(
                self.demand_queue,
                batch_size=DEMAND_BATCH_SIZE,
                max_batching_window=Duration.seconds(DEMAND_BATCHING_WINDOW_SECONDS),
                report_batch_item_failures=True,
            )
        )
        self.api = self._api()

    def _follow_up(
        self,
        functions: ControlPlaneFunctions,
        provision: sfn.IStateMachine,
        workflow_type: WorkflowType,
        github_tokens: lambda_.IFunction,
    ) -> Workflow:
        def list_seal_and_start(function: lambda_.Function) -> None:
            self._remember(function, counts_jobs=True)
            provision.grant_start_execution(function)
            # Lists the run's queued jobs, and reads the run when its level is not known.
            permissions.read_github_runs(function, github_tokens, self._table)

        def start(function: lambda_.Function) -> None:
            self._remember(function)
            provision.grant_start_execution(function)
            permissions.read_github_runs(function, github_tokens, self._table)  # a run's level

        starting = {
            "idempotency_table_name": self.idempotency_table.table_name,
            "provision_state_machine_arn": provision.state_machine_arn,
        }
        return Workflow(
            self,
            "FollowUp",
            machine="follow_up",
            functions=functions,
            workflow_type=workflow_type,
            steps={
                "gather": Step(
                    "seals a run's follow-up batch once its window closed, with the run's queued jobs "
                    "GitHub lists, and starts its provisions",
                    list_seal_and_start,
                    starting,
                    retry=FOLLOW_UP,
                ),
                "start": Step(
                    "starts the provisions of a follow-up batch its gather could not",
                    start,
                    starting,
                    retry=FOLLOW_UP,
                ),
            },
        )

    def rerun_from(self, function: lambda_.Function) -> None:
        """A function that notes a job an interruption failed on its run attempt's ledger item, and re-runs
        the run when the attempt completed first (steps.reruns, the release's give back): those items by
        key, read and updated, nothing else."""
        function.add_environment(f"{ENV_PREFIX}IDEMPOTENCY_TABLE_NAME", self.idempotency_table.table_name)
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
                resources=[self.idempotency_table.table_arn],
            )
        )

    def _remember(self, function: lambda_.Function, *, counts_jobs: bool = False) -> None:
        """Powertools idempotency and the demand ledger: single items by key, nothing else; `counts_jobs`
        also reads which of many jobs are counted already (the dispatcher, the follow-up's gather)."""
        actions = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"]
        if counts_jobs:
            actions.append("dynamodb:BatchGetItem")
        function.add_to_role_policy(
            iam.PolicyStatement(actions=actions, resources=[self.idempotency_table.table_arn])
        )

    def _api(self) -> apigw.RestApi:
        self.access_logs = logs.LogGroup(
            self, "AccessLogs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY
        )
        api = apigw.RestApi(
            self,
            "Api",
            description="runner-pool: GitHub App webhook deliveries",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # Access and execution logs need the account's API Gateway logging role; kept on teardown,
            # because it is the account's setting, which other APIs may rely on.
            cloud_watch_role=True,
            deploy_options=apigw.StageOptions(
                stage_name="v1",
                throttling_rate_limit=THROTTLE_RATE_PER_SECOND,
                throttling_burst_limit=THROTTLE_BURST,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=False,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=False,
                ),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                tracing_enabled=True,
                metrics_enabled=True,
            ),
        )
        # Headers only: the body is not looked at before the webhook has checked its signature
        # (DESIGN.md 10), so a forged body gets 401 from the webhook, never a 400 from here.
        validator = api.add_request_validator(
            "Delivery",
            request_validator_name="github-delivery",
            validate_request_parameters=True,
            validate_request_body=False,
        )
        api.root.add_resource(WEBHOOK_PATH).add_method(
            "POST",
            apigw.LambdaIntegration(self.webhook),
            request_validator=validator,
            request_parameters={f"method.request.header.{header}": True for header in REQUIRED_HEADERS},
        )
        api.add_gateway_response(
            "NotADelivery",
            type=apigw.ResponseType.BAD_REQUEST_PARAMETERS,
            templates={
                "application/json": '{"message": "not a GitHub webhook delivery: '
                + " and ".join(REQUIRED_HEADERS)
                + ' are required"}'
            },
        )
        self._acknowledge(api)
        return api

    def _acknowledge(self, api: apigw.RestApi) -> None:
        github_cannot_sign_in = (
            "GitHub delivers webhooks unauthenticated by AWS's means (no IAM signature, no Cognito token); "
            "each delivery is authenticated by its HMAC-SHA256 X-Hub-Signature-256, which the webhook "
            "checks with the App's webhook secret before it reads anything else."
        )
        Validations.of(api).acknowledge(
            Acknowledgment(id="AwsSolutions-APIG4", reason=github_cannot_sign_in),
            Acknowledgment(id="AwsSolutions-COG4", reason=github_cannot_sign_in),
            Acknowledgment(
                id="AwsSolutions-APIG2",
                reason=(
                    "Only GitHub's delivery headers are validated by API Gateway: validating the body would "
                    "parse it before the webhook has checked its signature, and answer a forged delivery "
                    "with 400 where the contract (DESIGN.md 10) says 401."
                ),
            ),
            Acknowledgment(
                id="AwsSolutions-APIG3",
                reason=(
                    "No WAF: the stage's throttling caps what a flood can cost, every request without a "
                    "valid signature is refused by the webhook in milliseconds, and a web ACL would add a "
                    "monthly charge to protect one endpoint whose callers are GitHub's hook servers."
                ),
            ),
        )
        Validations.of(self).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AmazonAPIGatewayPushToCloudWatchLogs]",
                reason=(
                    "The account-wide role API Gateway writes access and execution logs with; AWS's managed "
                    "policy is the documented one for it, and it grants only CloudWatch Logs writes."
                ),
            )
        )
