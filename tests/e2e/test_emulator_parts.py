"""The emulator's stand-ins for AWS's own plumbing and GitHub's webhook sender, each on its own."""

from __future__ import annotations

import json
import select
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import pytest
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from githubkit.webhooks import verify

from emulator.api_gateway import PAYLOAD_LIMIT_BYTES, ProxyEndpoint, TokenBucket
from emulator.aws import local_aws
from emulator.event_sources import STANDARD_QUEUE_POLLERS, QueueEventSource
from emulator.fake_github import FakeGitHub, JobSpec
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, AppKey
from emulator.moto_internals import patch_point
from tests.e2e.conftest import LABEL, REPOSITORY, WAIT_SECONDS, eventually

SECRET = "it's a secret to everybody"


class Receiver(ThreadingHTTPServer):
    """An endpoint that keeps what GitHub posts to it."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Keep)
        self.received: list[tuple[dict[str, str], bytes]] = []
        """(headers with lowercased names, body) of each request."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/webhook"


class _Keep(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read()


def test_github_signs_each_webhook_with_the_secret_as_github_does(
    app_key: AppKey, receiver: Receiver
) -> None:
    # Given a fake GitHub whose App webhook points at an endpoint
    with FakeGitHub(APP_ID, app_key.public_pem) as github:
        github.state.add_installation(INSTALLATION_ID, OWNER)
        github.webhooks.point_at(receiver.url, SECRET)

        # When a run starts
        github.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
        assert github.webhooks.flush()

    # Then each delivery names its event and carries a signature githubkit verifies with the secret
    # (in either order: GitHub promises none between a run's and its jobs' deliveries)
    events = [(headers["x-github-event"], json.loads(body)["action"]) for headers, body in receiver.received]
    assert sorted(events) == [("workflow_job", "queued"), ("workflow_run", "requested")]
    for headers, body in receiver.received:
        assert verify(SECRET, body, headers["x-hub-signature-256"])
        assert headers["x-github-delivery"]


def test_api_gateway_hands_the_function_a_rest_proxy_event_and_returns_its_answer() -> None:
    # Given a function behind the local API Gateway that echoes what it was given
    def echo(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        request = APIGatewayProxyEvent(event)
        seen = {"path": request.path, "event": request.headers.get("X-GitHub-Event"), "body": request.body}
        return {"statusCode": 202, "headers": {"Content-Type": "application/json"}, "body": json.dumps(seen)}

    with ProxyEndpoint(echo, "/webhook", "echo") as api:
        # When a request is posted
        status, body = post(api.url, b'{"zen": "ok"}', {"X-GitHub-Event": "ping"})

    # Then the function read it through Powertools' model, and its answer came back as the response
    assert status == 202
    assert json.loads(body) == {"path": "/webhook", "event": "ping", "body": '{"zen": "ok"}'}


def test_api_gateway_refuses_an_oversized_request_before_the_function_runs() -> None:
    # Given a function behind the local API Gateway
    calls: list[dict[str, Any]] = []

    def function(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        calls.append(event)
        return {"statusCode": 200}

    with ProxyEndpoint(function, "/webhook", "f") as api:
        # When a body over API Gateway's limit is posted
        status, _ = post(api.url, b"x" * (PAYLOAD_LIMIT_BYTES + 1))

    # Then API Gateway answers 413 itself
    assert status == 413
    assert calls == []


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_api_gateway_invokes_per_request_unless_the_function_runs_in_this_process(
    one_at_a_time: bool,
) -> None:
    # Given a function that holds each invocation until a second one has begun (or 2 s have passed):
    # API Gateway invokes the function for each request as it arrives (Lambda Developer Guide,
    # "Understanding Lambda function scaling": concurrent requests get concurrent environments)
    began = threading.Barrier(2)
    overlapped: list[bool] = []

    def function(_event: dict[str, Any], _context: Any) -> dict[str, Any]:
        try:
            began.wait(timeout=2)
            overlapped.append(True)
        except threading.BrokenBarrierError:
            overlapped.append(False)
        return {"statusCode": 200}

    with ProxyEndpoint(function, "/webhook", "f", one_at_a_time=one_at_a_time) as api:
        # When two requests arrive together
        posts = [threading.Thread(target=post, args=(api.url, b"{}")) for _ in range(2)]
        for thread in posts:
            thread.start()
        for thread in posts:
            thread.join()

    # Then they ran at once, unless the function runs in this process (one warm environment's globals)
    assert overlapped == ([False, False] if one_at_a_time else [True, True])


def test_the_queue_event_source_deletes_handled_messages_and_leaves_failed_ones() -> None:
    # Given a queue of three messages and a function that reports the second as failed
    with local_aws() as aws:
        sqs = aws.client("sqs")
        url = sqs.create_queue(QueueName="demand", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
        for number in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=str(number))
        batches: list[list[str]] = []

        def dispatch(event: dict[str, Any], _context: Any) -> dict[str, Any]:
            batches.append([record["body"] for record in event["Records"]])
            failed = [r["messageId"] for r in event["Records"] if r["body"] == "1"]
            return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failed]}

        def handed_over() -> list[str]:
            return sorted(body for batch in list(batches) for body in batch)

        # When the event source runs with a batching window
        with QueueEventSource(dispatch, "dispatcher", sqs=sqs, queue_url=url, window_seconds=0.5):
            eventually(lambda: handed_over() == ["0", "1", "2"], "all three handed over")

        # Then each was handed over once (in one batch or several: five pollers may split them,
        # services-sqs-scaling.html), and only the failed one is still in the queue
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert handed_over() == ["0", "1", "2"]
    assert int(attributes["ApproximateNumberOfMessagesNotVisible"]) == 1
    assert int(attributes["ApproximateNumberOfMessages"]) == 0


def test_the_queue_event_source_runs_five_batches_at_once_as_lambda_does_for_a_standard_queue() -> None:
    # Given a standard queue with more messages than one batch, and a function that holds each batch
    # until five are in hand ("Lambda starts processing five batches at a time with five concurrent
    # invocations", services-sqs-scaling.html)
    with local_aws() as aws:
        sqs = aws.client("sqs")
        url = sqs.create_queue(QueueName="demand", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
        five_at_once = threading.Barrier(STANDARD_QUEUE_POLLERS, timeout=20)
        met: list[bool] = []

        def dispatch(event: dict[str, Any], _context: Any) -> dict[str, Any]:
            try:
                five_at_once.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
            return {"batchItemFailures": []}

        # When it runs, with batches of one message and no window, and five messages arrive
        with QueueEventSource(dispatch, "dispatcher", sqs=sqs, queue_url=url, batch_size=1) as source:
            for number in range(STANDARD_QUEUE_POLLERS):
                sqs.send_message(QueueUrl=url, MessageBody=str(number))
            eventually(lambda: len(met) == STANDARD_QUEUE_POLLERS, "five invocations")

    # Then five invocations were under way at the same time
    assert source.concurrency == STANDARD_QUEUE_POLLERS
    assert met == [True] * STANDARD_QUEUE_POLLERS


FIFO_VISIBILITY_SECONDS = 10
"""Far longer than a batch is held (0.2 s), so no batch comes back while it is in flight; short enough that
a receive whose answer was lost (a read timed out and retried, which SQS allows: the messages it took
come back after their visibility timeout, the group's next ones behind them) delays the scenario
rather than failing it."""


def test_the_queue_event_source_never_hands_out_two_batches_of_one_fifo_group_at_once() -> None:
    # Given a FIFO queue with two message groups of four messages each
    with local_aws() as aws:
        sqs = aws.client("sqs")
        url = sqs.create_queue(
            QueueName="demand.fifo",
            Attributes={
                "FifoQueue": "true",
                "ContentBasedDeduplication": "true",
                "VisibilityTimeout": str(FIFO_VISIBILITY_SECONDS),
            },
        )["QueueUrl"]
        for number in range(8):
            sqs.send_message(QueueUrl=url, MessageBody=str(number), MessageGroupId=f"run-{number % 2}")
        lock = threading.Lock()
        in_flight: dict[str, int] = {}
        most: dict[str, int] = {}
        order: dict[str, list[str]] = {}

        def dispatch(event: dict[str, Any], _context: Any) -> dict[str, Any]:
            groups = {record["attributes"]["MessageGroupId"] for record in event["Records"]}
            with lock:
                for group in groups:
                    in_flight[group] = in_flight.get(group, 0) + 1
                    most[group] = max(most.get(group, 0), in_flight[group])
                for record in event["Records"]:
                    order.setdefault(record["attributes"]["MessageGroupId"], []).append(record["body"])
            threading.Event().wait(0.2)  # long enough for the other pollers to ask for more
            with lock:
                for group in groups:
                    in_flight[group] -= 1
            return {"batchItemFailures": []}

        # When the event source reads it with five pollers and batches of one (given time for one lost
        # answer's messages to come back; a message handed over twice shows in the order, not as a wait)
        with QueueEventSource(dispatch, "dispatcher", sqs=sqs, queue_url=url, batch_size=1):
            eventually(
                lambda: sum(map(len, order.values())) >= 8,
                "every message",
                WAIT_SECONDS + FIFO_VISIBILITY_SECONDS,
                explain=lambda: f"handed over so far: {order}",
            )

    # Then each group was handled one batch at a time, in the order it was sent ("Amazon SQS ensures
    # that messages in the same group are delivered to Lambda in order", services-sqs-scaling.html)
    assert most == {"run-0": 1, "run-1": 1}
    assert order == {"run-0": ["0", "2", "4", "6"], "run-1": ["1", "3", "5", "7"]}


@pytest.mark.parametrize(
    ("queue", "batch_size", "window_seconds", "refusal"),
    [
        ("demand.fifo", 10, 1.0, "Batching window is not supported for FIFO queues"),
        ("demand.fifo", 11, 0.0, "a FIFO queue's batch size is at most 10"),
        ("demand", 100, 0.0, "needs a batching window of at least 1 s"),
    ],
)
def test_the_queue_event_source_refuses_a_mapping_lambda_refuses(
    queue: str, batch_size: int, window_seconds: float, refusal: str
) -> None:
    # Given a mapping CreateEventSourceMapping refuses (services-sqs-parameters.html) / Then so does the emulator
    url = f"http://localhost/123456789012/{queue}"
    with pytest.raises(ValueError, match=refusal):
        QueueEventSource(
            lambda _event, _context: None,
            "dispatcher",
            sqs=None,
            queue_url=url,
            batch_size=batch_size,
            window_seconds=window_seconds,
        )


def test_local_aws_finds_each_services_backend_once_and_still_routes_every_request() -> None:
    # Given moto's server dispatcher, whose lookup of a host's backend is counted here
    owner, name = patch_point(
        "moto.moto_server.werkzeug_app:DomainDispatcherApplication.get_backend_for_host"
    )
    lookups: Counter[str | None] = Counter()
    find = getattr(owner, name)

    def counted(dispatcher: Any, host: str | None) -> Any:
        lookups[host] += 1
        return find(dispatcher, host)

    with mock.patch.object(owner, name, counted), local_aws() as aws:
        # When clients of three services make several requests each
        sqs, dynamodb, ec2 = aws.client("sqs"), aws.client("dynamodb"), aws.client("ec2")
        for n in range(3):
            sqs.create_queue(QueueName=f"routed-{n}")
            dynamodb.list_tables()
            ec2.describe_vpcs()
        # Then every request reached its own service (another backend would have refused it)
        assert len(sqs.list_queues()["QueueUrls"]) == 3
        # And each host's backend was looked up once, not once a request
        assert lookups
        assert set(lookups.values()) == {1}, lookups


def test_api_gateway_throttles_with_429_before_the_function_runs_and_refills_at_the_rate() -> None:
    # Given a function behind the local API Gateway whose stage throttle is a bucket of 2 at 1 a second,
    # on a clock the test moves
    now = [0.0]
    calls: list[dict[str, Any]] = []

    def function(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        calls.append(event)
        return {"statusCode": 200}

    throttle = TokenBucket(burst=2, rate_per_second=1, clock=lambda: now[0])
    with ProxyEndpoint(function, "/webhook", "f", throttle=throttle) as api:
        # When 3 requests come at once
        first = [post(api.url, b"{}") for _ in range(3)]
        # ... and one more a second later
        now[0] += 1
        later = post(api.url, b"{}")

    # Then the third got API Gateway's THROTTLED answer and never reached the function
    assert [status for status, _ in first] == [200, 200, 429]
    assert json.loads(first[2][1]) == {"message": "Too Many Requests"}
    assert api.throttled == 1
    # And the refill let the later one through
    assert later[0] == 200
    assert len(calls) == 3


@contextmanager
def serving(server: str, app_key: AppKey) -> Iterator[str]:
    """The URL of one of the emulator's servers, running."""
    if server == "local AWS":
        with local_aws() as aws:
            yield aws.endpoint
    elif server == "fake GitHub":
        with FakeGitHub(APP_ID, app_key.public_pem) as github:
            yield github.url
    else:
        with ProxyEndpoint(lambda _event, _context: {"statusCode": 200}, "/webhook", "f") as api:
            yield api.url


@pytest.mark.parametrize("server", ["local AWS", "fake GitHub", "API Gateway"])
def test_a_server_of_the_emulator_holds_a_burst_of_connections_it_has_not_accepted_yet(
    server: str, app_key: AppKey
) -> None:
    # Given one of the emulator's servers whose accepting thread does not run for a while (a loaded
    # burst starves it)
    def not_accepting(_server: Any) -> None:
        time.sleep(0.01)  # an accepting thread that is starved is the behaviour under test

    connections: list[socket.socket] = []
    with (
        serving(server, app_key) as url,
        mock.patch.object(socketserver.BaseServer, "_handle_request_noblock", not_accepting),
    ):
        port = urlsplit(url).port
        assert port is not None
        # When more clients connect than werkzeug's backlog (128) or socketserver's (5) would hold
        for _ in range(300):
            connection = socket.socket()
            connection.setblocking(False)
            connection.connect_ex(("127.0.0.1", port))
            connections.append(connection)
        # Then every connection completes its handshake (the kernel holds it for the server to accept);
        # past the backlog, SYNs are dropped and a client's connect times out (emulator/listening.py)
        _, writable, _ = select.select([], connections, [], 1.0)
        assert len(writable) == len(connections)
    for connection in connections:
        connection.close()
