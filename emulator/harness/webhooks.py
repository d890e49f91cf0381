"""Builders for GitHub deliveries: the real payloads of tests/fixtures/github-webhooks/, re-labelled with our
label where a test needs one, signed and wrapped as API Gateway (REST, Lambda proxy) events; and
`ingress_world()`, the webhook's and the dispatcher's AWS on moto (the local stack of emulator/stack.py,
its ingress part and state machines that record executions without running them), with both handlers.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import itertools
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError
from moto import mock_aws

from emulator.aws import behaving_as_aws
from emulator.harness.control_plane import NO_WAIT, REGION
from emulator.stack import LocalStack
from emulator.step_functions import LambdaContext, function_arn
from runner_pool.adapters import aws_clients
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.wiring import ControlPlane

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "github-webhooks"
WEBHOOK_SECRET = "it's a secret to everybody"
REPOSITORY = "Codertocat/Hello-World"
"""The repository of the workflow_job fixtures."""
STACK_NAME = "runner-pool"
IDEMPOTENCY_TABLE = f"{STACK_NAME}-idempotency"
_numbers = itertools.count(1)


# --- payloads ---------------------------------------------------------------------------------------


def fixture_names() -> list[str]:
    return sorted(path.name for path in FIXTURES.glob("*.payload.json"))


@cache
def _fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def fixture(name: str) -> dict[str, Any]:
    """A fresh copy of one real payload."""
    payload: dict[str, Any] = json.loads(_fixture_text(name))
    return payload


def event_of(name: str) -> str:
    """The X-GitHub-Event of a fixture: its file name up to the first dot."""
    return name.split(".", 1)[0]


def queued_job(
    label: str, *, job_id: int | None = None, run_id: int = 4242, attempt: int = 1
) -> dict[str, Any]:
    """The real `workflow_job queued` payload, asking for `label` in run `run_id`."""
    payload = fixture("workflow_job.queued.payload.json")
    job = payload["workflow_job"]
    job.update(id=job_id or next(_numbers), run_id=run_id, run_attempt=attempt, labels=[label])
    return payload


def completed_job(
    label: str,
    *,
    runner_name: str | None,
    job_id: int | None = None,
    run_id: int = 4242,
    failed: bool = False,
) -> dict[str, Any]:
    """The real `workflow_job completed` payload for `label`, of GitHub's failed example with `failed`;
    runner_name None: it never got a runner."""
    example = "failure" if failed else "success"
    payload = fixture(f"workflow_job.completed.{example}.with-organization.payload.json")
    job = payload["workflow_job"]
    job.update(id=job_id or next(_numbers), run_id=run_id, labels=[label], runner_name=runner_name)
    if runner_name is None:
        job.update(runner_id=None, runner_group_id=None, runner_group_name=None, conclusion="cancelled")
    return payload


def with_deployment(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` (a `workflow_job` one) as GitHub sends it for a job with an environment: with the real
    `deployment` of the `queued` example that has one."""
    payload["deployment"] = fixture("workflow_job.queued.with-deployment.payload.json")["deployment"]
    return payload


def requested_run(
    run_id: int = 4242,
    attempt: int = 1,
    *,
    event: str = "push",
    actor: str = "octocat",
    triggering_actor: str | None = None,
    head_repository: str | None = None,
) -> dict[str, Any]:
    """The real `workflow_run requested` payload for run `run_id`, triggered by `event` and `actor`; its
    head repository its own unless said."""
    payload = fixture("workflow_run.requested.payload.json")
    run = payload["workflow_run"]
    run.update(id=run_id, run_attempt=attempt, event=event)
    run["actor"]["login"] = actor
    run["triggering_actor"]["login"] = triggering_actor or actor
    run["head_repository"]["full_name"] = head_repository or payload["repository"]["full_name"]
    return payload


def completed_run(run_id: int = 4242, attempt: int = 1) -> dict[str, Any]:
    payload = fixture("workflow_run.completed.payload.json")
    payload["workflow_run"].update(id=run_id, run_attempt=attempt)
    return payload


def with_value(payload: Mapping[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A copy of `payload` with the value at `path` replaced (or, for value DELETE, removed)."""
    changed = copy.deepcopy(dict(payload))
    parent: Any = changed
    for step in path[:-1]:
        parent = parent[step]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return changed


DELETE = object()


# --- requests ---------------------------------------------------------------------------------------


def signature(body: bytes, secret: str = WEBHOOK_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def encoded(payload: Mapping[str, Any] | bytes) -> bytes:
    return payload if isinstance(payload, bytes) else json.dumps(payload).encode()


def github_headers(
    body: bytes, event: str, delivery: str | None = None, secret: str = WEBHOOK_SECRET
) -> dict[str, str]:
    """The headers GitHub sends with a delivery, signed with `secret`."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/3c4b6fc",
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Event": event,
        "X-GitHub-Hook-ID": "292430182",
        "X-GitHub-Hook-Installation-Target-ID": "79929171",
        "X-GitHub-Hook-Installation-Target-Type": "integration",
        "X-Hub-Signature-256": signature(body, secret),
    }


def api_request(
    body: bytes | str | None,
    headers: Mapping[str, str],
    *,
    base64_encoded: bool = False,
    path: str = "/webhook",
) -> dict[str, Any]:
    """An API Gateway REST (Lambda proxy) event for a POST of `body` with exactly `headers`.

    Without base64, bytes that are not UTF-8 arrive as API Gateway passes a text body it cannot
    decode: with replacement characters (so their signature no longer matches).
    """
    text: str | None
    if isinstance(body, bytes):
        text = base64.b64encode(body).decode() if base64_encoded else body.decode("utf-8", "replace")
    else:
        text = body
    return {
        "resource": path,
        "path": path,
        "httpMethod": "POST",
        "headers": dict(headers),
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": "POST",
            "path": f"/prod{path}",
            "stage": "prod",
            "requestId": str(uuid.uuid4()),
            "identity": {"sourceIp": "140.82.115.10", "userAgent": headers.get("User-Agent", "")},
        },
        "body": text,
        "isBase64Encoded": base64_encoded,
    }


def delivery(
    payload: Mapping[str, Any] | bytes,
    event: str,
    *,
    delivery_id: str | None = None,
    secret: str = WEBHOOK_SECRET,
) -> dict[str, Any]:
    """A correctly signed delivery of `payload` as GitHub sends it."""
    body = encoded(payload)
    return api_request(body, github_headers(body, event, delivery_id, secret))


# --- the ingress on moto -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    message: str


@dataclass
class IngressWorld:
    """The webhook's and the dispatcher's AWS on moto, and ways to drive both handlers."""

    stack: LocalStack
    clock: ManualClock
    sqs: Any
    dynamodb: Any
    secrets: Any
    stepfunctions: Any
    queue_url: str
    provision_arn: str
    release_arn: str
    follow_up_arn: str
    calls: list[str] = field(default_factory=list)
    """Every AWS operation the handlers made, as `service:Operation` (the world's own clients are apart)."""
    _invocations: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _gathered: set[str] = field(default_factory=set)
    started_follow_ups: int = 0
    """Follow-ups whose start step ran (their gather step sealed them but did not start them)."""

    @property
    def plane(self) -> ControlPlane:
        return self.stack.plane

    def deliver(self, request: Mapping[str, Any]) -> Answer:
        response = self.stack.invoke("webhook", dict(request), self.context("webhook"))
        return Answer(response["statusCode"], json.loads(response["body"])["message"])

    def context(self, function: str) -> LambdaContext:
        number = next(self._invocations)
        return LambdaContext(function, f"{function}-{number}", function_arn(function))

    def take_queued(self) -> list[dict[str, Any]]:
        """Every message on the demand queue, received (and hidden) as SQS records of a Lambda event."""
        records: list[dict[str, Any]] = []
        while batch := self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get(
            "Messages"
        ):
            records.extend(sqs_record(message) for message in batch)
        return records

    def queued_bodies(self) -> list[dict[str, Any]]:
        return [json.loads(record["body"]) for record in self.take_queued()]

    def dispatch(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Run the dispatcher on one batch; its partial batch response (Lambda never sends an empty batch)."""
        if not records:
            return {"batchItemFailures": []}
        return dict(self.stack.invoke("dispatcher", {"Records": records}, self.context("dispatcher")))

    def executions(self, machine_arn: str) -> list[dict[str, Any]]:
        """Every execution of a machine, oldest first, with its input parsed."""
        listed = self.stepfunctions.list_executions(stateMachineArn=machine_arn)["executions"]
        described = [self.stepfunctions.describe_execution(executionArn=e["executionArn"]) for e in listed]
        return sorted(
            (
                {"name": d["name"], "input": json.loads(d["input"]), "started": d["startDate"]}
                for d in described
            ),
            key=lambda execution: execution["started"],
        )

    def provisions(self) -> list[dict[str, Any]]:
        return [execution["input"] for execution in self.executions(self.provision_arn)]

    def releases(self) -> list[dict[str, Any]]:
        return [execution["input"] for execution in self.executions(self.release_arn)]

    def follow_ups(self) -> list[dict[str, Any]]:
        return [execution["input"] for execution in self.executions(self.follow_up_arn)]

    def gather_follow_ups(self) -> int:
        """Run what each follow-up execution not yet run runs (moto records executions here, it does not
        run them): its gather step, the clock moved by each Wait state, until gathered, then its start
        step with the jobs gathered if it did not start them. How many executions ran."""
        named = {spec.handler.rsplit(".", 1)[-1]: name for name, spec in self.stack.functions().items()}
        gather, start = named["gather"], named["start"]
        ran = 0
        for execution in self.executions(self.follow_up_arn):
            if execution["name"] in self._gathered:
                continue
            self._gathered.add(execution["name"])
            request, ran = execution["input"], ran + 1
            while not (step := self.stack.invoke(gather, {"request": request}, self.context(gather)))[
                "gathered"
            ]:
                self.clock.advance(step["wait_seconds"])
                request = step["request"]
            if step["follow_up"] is not None:
                self.started_follow_ups += 1
                self.stack.invoke(
                    start, {"request": request, "follow_up": step["follow_up"]}, self.context(start)
                )
        return ran

    def queue_depth(self) -> int:
        """Messages on the demand queue, visible or being handled."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def stored_items(self) -> int:
        return int(self.dynamodb.scan(TableName=IDEMPOTENCY_TABLE, Select="COUNT")["Count"])

    def fail_next(
        self,
        service: str,
        operation: str,
        code: str,
        times: int = 1,
        when: Callable[[dict[str, Any]], bool] = lambda _params: True,
    ) -> None:
        """The handlers' next `times` calls of `service:operation` (whose parameters `when` picks) fail with `code`."""
        remaining = [times]

        def fail(params: dict[str, Any], **_: Any) -> None:
            if remaining[0] > 0 and when(params):
                remaining[0] -= 1
                raise ClientError({"Error": {"Code": code, "Message": "injected by the test"}}, operation)

        # provide-client-params hands the call's own parameters, before they are serialised
        self.plane.client(service).meta.events.register(f"provide-client-params.{service}.{operation}", fail)

    def writes(self) -> list[str]:
        """The AWS operations the handlers made so far that change something."""
        reads = ("Get", "Describe", "List", "Query", "Scan")
        return [call for call in self.calls if not call.split(":", 1)[1].startswith(reads)]


def sqs_record(message: Mapping[str, Any]) -> dict[str, Any]:
    """An SQS message as the Lambda event source hands it to a function."""
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {},
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{REGION}:123456789012:runner-pool-demand",
        "awsRegion": REGION,
    }


@cache
def _session() -> boto3.session.Session:
    """One session for every world: a fresh one re-reads botocore's service models (about 0.5 s a test)."""
    return boto3.session.Session(region_name=REGION)


@contextmanager
def ingress_world(
    config: StackConfig | None = None, webhook_secrets: Sequence[str] = (WEBHOOK_SECRET,)
) -> Iterator[IngressWorld]:
    """moto with the webhook secrets (one per App), the idempotency table, the demand queue and our three
    state machines (which record executions: moto's mock does not run them), and both handlers running as
    themselves."""
    config = config or StackConfig()
    with mock_aws(), behaving_as_aws():
        services = ("sqs", "dynamodb", "secretsmanager", "stepfunctions")
        session = _session()
        ours = {service: aws_clients.client(service, session) for service in (*services, "lambda", "iam")}
        theirs = {service: aws_clients.client(service, session) for service in services}
        calls: list[str] = []

        def record(model: Any, **_: Any) -> None:
            calls.append(f"{model.service_model.service_name}:{model.name}")

        for client in theirs.values():
            client.meta.events.register("before-call.*.*", record)
        stack = LocalStack(config, ours.__getitem__, stack_name=STACK_NAME)
        stack.create_ingress_resources(*webhook_secrets)
        stack.create_state_table()  # the dispatcher notes each job's arrival there (the class history)
        provision, release, follow_up = (
            stack.create_state_machine(machine) for machine in ("provision", "release", "follow_up")
        )
        clock = ManualClock()
        # A follow-up batch's leader waits for its window by letting the clock move (ControlPlane.pause).
        with stack.running(clients=theirs.__getitem__, clock=clock, backoff=NO_WAIT, pause=clock.advance):
            yield IngressWorld(
                stack=stack,
                clock=clock,
                sqs=ours["sqs"],
                dynamodb=ours["dynamodb"],
                secrets=ours["secretsmanager"],
                stepfunctions=ours["stepfunctions"],
                queue_url=stack.settings.require("demand_queue_url", "the tests"),
                provision_arn=provision.arn,
                release_arn=release.arn,
                follow_up_arn=follow_up.arn,
                calls=calls,
            )
