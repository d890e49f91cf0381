"""AWS answering busy, or losing an answer, on the wire: beneath botocore's retries, as AWS itself would.

A fault injected above the wire (a Stubber, a `before-call` hook, a proxy raising ClientError) skips
botocore's retry handler, so it tests a retry layer the product no longer has. These hooks answer at
`before-send` (the request never reaches moto, as a throttled one never takes effect) or turn an
applied answer into a 500 before botocore decides whether to retry it (`needs-retry`), so every
attempt botocore makes is counted and seen.

The error bodies are each protocol's documented error shape: JSON's `__type`
(https://smithy.io/2.0/aws/protocols/aws-json-1_0-protocol.html#operation-error-serialization),
EC2's `Response/Errors/Error` (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.retries.standard import ExponentialBackoff


class RawBody(io.BytesIO):
    """The raw body botocore reads an AWSResponse from."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.read()


def error_response(client: Any, code: str, status: int, message: str = "injected by the test") -> AWSResponse:
    """An HTTP answer carrying AWS error `code`, in the wire format of `client`'s service."""
    protocol = client.meta.service_model.protocol
    if protocol == "json":
        body = json.dumps({"__type": code, "message": message}).encode()
        headers = {"x-amzn-RequestId": "test", "Content-Type": "application/x-amz-json-1.0"}
    elif protocol == "ec2":
        body = (
            f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            "<RequestID>test</RequestID></Response>"
        ).encode()
        headers = {"Content-Type": "text/xml"}
    else:
        raise NotImplementedError(f"no error shape for the {protocol} protocol yet")
    return AWSResponse("https://aws.test/", status, HTTPHeaders.from_dict(headers), RawBody(body))


@dataclass
class BusyAnswers:
    """How many times the operation was sent (every attempt botocore made), and how many were refused."""

    sent: int = 0
    refused: int = 0


def answer_busy(
    client: Any,
    operation: str,
    times: int,
    code: str = "ThrottlingException",
    status: int = 400,
    *,
    when: Callable[[bytes], bool] | None = None,
) -> BusyAnswers:
    """The next `times` attempts of `operation` (e.g. "UpdateItem") are answered `code`, untouched by moto;
    with `when`, only attempts whose request body it accepts (e.g. a read of one item)."""
    answers = BusyAnswers()
    service = client.meta.service_model.service_id.hyphenize()

    def answer(request: Any, **_: Any) -> AWSResponse | None:
        if when is not None and not when(bytes(request.body or b"")):
            return None
        answers.sent += 1
        if answers.refused >= times:
            return None
        answers.refused += 1
        # botocore emits before-send to every handler, moto's in-process one too (it then ignores
        # moto's answer): aimed nowhere, the refused request cannot take effect there.
        request.url = "https://refused.invalid/"
        return error_response(client, code, status)

    client.meta.events.register_first(f"before-send.{service}.{operation}", answer)
    return answers


@dataclass
class LostAnswers:
    sent: int = 0
    lost: int = 0


def lose_answers(client: Any, operation: str, times: int = 1) -> LostAnswers:
    """The next `times` attempts of `operation` take effect, and their answer is lost to a 500.

    DynamoDB answers a 500 or a timeout without saying whether the write was applied ("the request
    might have succeeded":
    https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Programming.Errors.html#Programming.Errors.MessagesAndCodes),
    and botocore retries it: a conditional write then meets its own write and fails its condition.
    """
    answers = LostAnswers()
    service = client.meta.service_model.service_id.hyphenize()

    def lose(response: Any, **_: Any) -> None:
        answers.sent += 1
        if answers.lost >= times or response is None:
            return
        http, parsed = response
        answers.lost += 1
        http.status_code = 500
        metadata = parsed.get("ResponseMetadata", {})
        parsed.clear()
        parsed.update(
            Error={"Code": "InternalServerError", "Message": "answer lost by the test"},
            ResponseMetadata={**metadata, "HTTPStatusCode": 500},
        )

    # More specific than botocore's own `needs-retry.<service>` handler, so this runs before it decides.
    client.meta.events.register(f"needs-retry.{service}.{operation}", lose)
    return answers


@dataclass
class RetryDelays:
    """botocore's computed delays (seconds) before each retry, in order; tests do not wait them out."""

    delays: list[float] = field(default_factory=list)


def record_retry_delays(monkeypatch: pytest.MonkeyPatch) -> RetryDelays:
    """botocore computes every retry's delay as deployed, this records it, and the retry follows at once."""
    recorded = RetryDelays()
    compute = ExponentialBackoff.delay_amount

    def delay_amount(self: ExponentialBackoff, context: Any) -> float:
        recorded.delays.append(compute(self, context))
        return 0.0

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", delay_amount)
    return recorded
