"""API Gateway on localhost: a REST API's Lambda proxy integration in front of one of our handlers.

Each HTTP request becomes the proxy event API Gateway (REST, v1 payload) hands the function, and
the function's answer (statusCode, headers, body) becomes the HTTP response. As API Gateway does,
a body over the payload limit is refused with 413 before the function runs, and a function that
raises is answered with 502. API Gateway invokes the function for each request as it comes, so
requests run concurrently when the function runs in execution environments of its own
(emulator/lambda_runtime.py: one invocation per environment); a handler called in this process
(`one_at_a_time=True`) runs one invocation at a time, as in one warm environment, since our handlers
keep per-invocation state in module globals (Powertools' resolver and logger), as Lambda allows.

The stage's throttle is enforced as API Gateway does, with the token bucket its docs describe ("API
Gateway throttles requests to your API using the token bucket algorithm, where a token counts for a
request", and past the rate and burst "Clients may receive 429 Too Many Requests error responses":
API Gateway Developer Guide, "Throttle requests to your REST APIs for better throughput",
api-gateway-request-throttling.html). A throttled request never reaches the function, and gets the
THROTTLED gateway response's default, 429 `{"message":"Too Many Requests"}` ("Gateway response types
for API Gateway", supported-gateway-response-types.html). The bucket's figures are the stage's as the
synthesized template sets them (`StackTemplate.method_throttle`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from emulator.aws import ACCOUNT
from emulator.listening import LoopbackHandler, LoopbackServer
from emulator.step_functions import LambdaContext, function_arn

Handler = Callable[[dict[str, Any], Any], Any]
PAYLOAD_LIMIT_BYTES = 10 * 1024 * 1024
"""API Gateway's request payload limit."""
STAGE = "prod"
THROTTLED = 429


class TokenBucket:
    """API Gateway's throttle: it starts full with `burst` tokens, gains `rate_per_second` of them a second
    up to `burst`, and each request takes one; a request that finds none is throttled."""

    def __init__(
        self, burst: int, rate_per_second: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.rate_per_second = rate_per_second
        self._clock = clock
        self._tokens = float(burst)
        self._filled_at = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """One token for one request: False (throttle it) when the bucket is empty."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._filled_at) * self.rate_per_second)
            self._filled_at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


class ProxyEndpoint(LoopbackServer):
    """`with ProxyEndpoint(handler, "/webhook", "webhook") as api:` serves POST `api.url` on 127.0.0.1."""

    def __init__(
        self,
        handler: Handler,
        resource: str,
        function_name: str,
        *,
        one_at_a_time: bool = True,
        throttle: TokenBucket | None = None,
    ) -> None:
        super().__init__(_HttpHandler, name="api-gateway", poll_seconds=0.05)
        self.handler = handler
        self.resource = resource
        self.function_name = function_name
        self.throttle = throttle
        """The stage's throttle for this method; None: none (a test's endpoint, not the stack's)."""
        self.invocations = 0
        self.throttled = 0
        """Requests answered 429 by the throttle, the function never invoked."""
        self._one_at_a_time = one_at_a_time
        self._invoking = threading.Lock()
        self._state = threading.Condition()
        self._in_flight = 0
        self._closed = False

    @property
    def url(self) -> str:
        return f"{self.origin}{self.resource}"

    def stop(self) -> None:
        super().stop()
        with self._state:
            self._closed = True  # requests already accepted get API Gateway's answer, not the function's
            self._state.wait_for(lambda: self._in_flight == 0)

    def answer(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> dict[str, Any]:
        """The function's proxy answer to one request (or API Gateway's own, when it refuses or fails)."""
        path = urlsplit(target).path
        if path != self.resource:
            return _gateway_answer(403, "Missing Authentication Token")
        if self.throttle is not None and not self.throttle.take():
            with self._state:
                self.throttled += 1
            return _gateway_answer(THROTTLED, "Too Many Requests")
        if len(body) > PAYLOAD_LIMIT_BYTES:
            return _gateway_answer(413, "Request Too Long")
        event = proxy_event(method, target, headers, body, self.resource)
        with self._state:
            if self._closed:
                return _gateway_answer(503, "Service Unavailable")
            self.invocations += 1
            self._in_flight += 1
        context = LambdaContext(
            function_name=self.function_name,
            aws_request_id=str(uuid.uuid4()),
            invoked_function_arn=function_arn(self.function_name),
        )
        try:
            with self._invoking if self._one_at_a_time else contextlib.nullcontext():
                answer: dict[str, Any] = self.handler(event, context)
        except Exception:  # API Gateway answers a failed integration so, whatever the failure
            return _gateway_answer(502, "Internal server error")
        finally:
            with self._state:
                self._in_flight -= 1
                self._state.notify_all()
        return answer


def proxy_event(
    method: str, target: str, headers: list[tuple[str, str]], body: bytes, resource: str
) -> dict[str, Any]:
    """The REST API's Lambda proxy event (payload format 1.0) for one request."""
    parts = urlsplit(target)
    query = parse_qs(parts.query)
    multi_headers: dict[str, list[str]] = {}
    for name, value in headers:
        multi_headers.setdefault(name, []).append(value)
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode(), True
    now = time.time()
    return {
        "resource": resource,
        "path": parts.path,
        "httpMethod": method,
        "headers": {name: values[-1] for name, values in multi_headers.items()},
        "multiValueHeaders": multi_headers,
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "resourceId": "local1",
            "resourcePath": resource,
            "httpMethod": method,
            "extendedRequestId": uuid.uuid4().hex[:16],
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "path": f"/{STAGE}{parts.path}",
            "accountId": ACCOUNT,
            "protocol": "HTTP/1.1",
            "stage": STAGE,
            "domainPrefix": "local",
            "requestTimeEpoch": int(now * 1000),
            "requestId": str(uuid.uuid4()),
            "identity": {"sourceIp": "127.0.0.1", "userAgent": multi_headers.get("User-Agent", [""])[-1]},
            "domainName": "127.0.0.1",
            "apiId": "local",
        },
        "body": text if body else None,
        "isBase64Encoded": encoded,
    }


def _gateway_answer(status: int, message: str) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps({"message": message}),
    }


class _HttpHandler(LoopbackHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyEndpoint

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        answer = self.server.answer(self.command, self.path, list(self.headers.items()), self.body())
        raw = answer.get("body") or ""
        payload = base64.b64decode(raw) if answer.get("isBase64Encoded") else str(raw).encode()
        # API Gateway merges the two; a name in multiValueHeaders wins.
        merged = {name: [value] for name, value in (answer.get("headers") or {}).items()}
        merged.update(answer.get("multiValueHeaders") or {})
        headers = [(name, str(value)) for name, values in merged.items() for value in values]
        self.reply(int(answer.get("statusCode", 200)), headers, payload)
