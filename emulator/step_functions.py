"""Step Functions on one machine: moto's interpreter executes our real ASL files, and every Lambda task
it invokes is routed to our real handler in this process.

moto runs Lambda code only in Docker; its Docker-less backend just echoes. `lambdas_in_process`
swaps that backend's `invoke` for a table of our handlers, and reports a raised exception the way
Lambda does (the `X-Amz-Function-Error` header and an errorType/errorMessage payload), so the
state machine's Retry and Catch see it as they would on AWS. `without_waiting` zeroes the Wait
states and Retry back-offs for tests; the emulator keeps them real.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

from botocore.exceptions import ClientError
from moto.awslambda.exceptions import LambdaClientError

from emulator import asl_parse_cache, step_functions_quotas
from emulator.moto_internals import patch_point

step_functions_quotas.install()  # AWS's payload and history quotas, on whatever executes our ASL here
asl_parse_cache.install()  # each definition parsed once, not at every execution

Handler = Callable[[dict[str, Any], Any], Any]
"""A Lambda handler: (event, context) -> JSON-serialisable result."""

MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
"""The `mock_aws(config=...)` under which moto executes state machines and keeps Lambda in-process."""

_ACCOUNT = "123456789012"
STOP_PATIENCE_SECONDS = 30.0
"""How long a stop waits for a just-started execution's thread to be stoppable (a loaded machine's worst)."""
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z][A-Za-z0-9]*)\}")
_LAMBDA_INVOKE = "moto.awslambda_simple.models:LambdaSimpleBackend.invoke"
_ASL = "moto.stepfunctions.parser.asl.component"
_WAIT = f"{_ASL}.state.wait.wait_function.wait_function:WaitFunction._wait_interval"
_RETRY_CLOCK = f"{_ASL}.common.retry.retrier_decl:time"


@dataclass(frozen=True)
class LambdaContext:
    """What a handler's context offers on AWS, as far as our handlers and Powertools read it."""

    function_name: str
    aws_request_id: str
    invoked_function_arn: str
    memory_limit_in_mb: int = 256

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@dataclass
class Invocations:
    """Every invocation routed so far, by function name, in order; for tests and benchmarks."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def of(self, function_name: str) -> list[dict[str, Any]]:
        return [event for name, event in self.calls if name == function_name]


class ThrottledError(Exception):
    """Lambda's answer to an invocation beyond the account's concurrency: HTTP 429
    `TooManyRequestsException`, with nothing run (Lambda Developer Guide, "Understanding Lambda function
    scaling": "If your function is already at its concurrency limit [...] the request is throttled";
    lambda-concurrency.html). Step Functions names it `Lambda.TooManyRequestsException`."""

    error_code = "TooManyRequestsException"


class AccountConcurrency:
    """The account's concurrent executions quota, shared by every function (none reserved): an invocation
    that finds `limit` in flight is refused with ThrottledError at once, as Lambda refuses it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        """Invocations running (or waiting for an environment): what the quota counts."""
        self.throttled = 0
        """Invocations refused."""
        self._lock = threading.Lock()

    @contextmanager
    def invocation(self) -> Iterator[None]:
        with self._lock:
            if self.in_flight >= self.limit:
                self.throttled += 1
                raise ThrottledError(f"Rate Exceeded. (the account's concurrency of {self.limit} is in use)")
            self.in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1


class _TooManyRequestsError(LambdaClientError):
    code = 429

    def __init__(self, message: str) -> None:
        super().__init__(ThrottledError.error_code, message)


@contextmanager
def lambdas_in_process(handlers: Mapping[str, Handler]) -> Iterator[Invocations]:
    """While inside, invoking the moto Lambda function `name` calls `handlers[name]` in this process."""
    invocations = Invocations()

    def invoke(
        _backend: Any,
        function_name: str,
        _qualifier: str | None,
        body: Any,
        _headers: Any,
        response_headers: dict[str, str],
    ) -> bytes:
        name = function_name.rsplit(":", 1)[-1]
        event = json.loads(body) if body else {}
        invocations.calls.append((name, event))
        context = LambdaContext(
            function_name=name,
            aws_request_id=f"local-{len(invocations.calls)}",
            invoked_function_arn=function_arn(name),
        )
        try:
            return json.dumps(handlers[name](event, context)).encode()
        except ThrottledError as refused:  # Lambda's own 429: the Invoke call fails, nothing ran
            raise _TooManyRequestsError(str(refused)) from None
        except Exception as exc:  # every failure is reported to the state machine, as Lambda does
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps({"errorType": type(exc).__name__, "errorMessage": str(exc)}).encode()

    with mock.patch.object(*patch_point(_LAMBDA_INVOKE), invoke):
        yield invocations


@contextmanager
def without_waiting(on_wait: Callable[[int], None] | None = None) -> Iterator[None]:
    """Wait states and Retry back-offs take no time: tests prove the paths, not the waiting.

    `on_wait(seconds)` is called in place of each Wait state's wait, e.g. to move a test's clock on
    by as much and let simulated agents act meanwhile.
    """
    no_sleep = SimpleNamespace(sleep=lambda _seconds: None)

    def wait(_self: Any, env: Any, wait_seconds: int) -> None:  # moto passes `env` by name
        if on_wait is not None:
            on_wait(wait_seconds)

    with (
        mock.patch.object(*patch_point(_WAIT), wait),
        mock.patch.object(*patch_point(_RETRY_CLOCK), no_sleep),
    ):
        yield


def stop_running_executions(stepfunctions: Any) -> int:
    """Stop every execution still running, of every state machine; returns how many. A world or test
    ends with this: moto runs each execution in a thread of this process, and one left running would
    invoke, by name, the functions of whatever is deployed here next (its Map workers discarding
    instances that world never had)."""
    stopped = 0
    for machines in stepfunctions.get_paginator("list_state_machines").paginate():
        for machine in machines["stateMachines"]:
            pages = stepfunctions.get_paginator("list_executions").paginate(
                stateMachineArn=machine["stateMachineArn"]
            )
            running = (e for page in pages for e in page["executions"] if e["status"] == "RUNNING")
            stopped += sum(_stop(stepfunctions, e["executionArn"]) for e in running)
    return stopped


def _stop(stepfunctions: Any, execution_arn: str) -> bool:
    """Stop one execution; False when it ended meanwhile (or is Express: StopExecution is Standard's only).

    moto starts an execution's thread before that thread has built the environment a stop acts on, and a
    stop in between raises AttributeError inside moto (`ExecutionWorker.stop`, emulator/moto_internals.py).
    AWS stops an execution at any point after StartExecution answered (Step Functions API Reference,
    API_StopExecution.html: "Stops an execution"; its errors are ExecutionDoesNotExist, InvalidArn and
    ValidationException, none for an execution not yet under way), so this waits for the thread to get
    there, as briefly as it takes.
    """
    deadline = time.monotonic() + STOP_PATIENCE_SECONDS
    while True:
        try:
            stepfunctions.stop_execution(executionArn=execution_arn)
        except ClientError:
            return False
        except AttributeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        return True


def function_arn(name: str, region: str = "us-east-1") -> str:
    return f"arn:aws:lambda:{region}:{_ACCOUNT}:function:{name}"


def render_asl(path: Path, substitutions: Mapping[str, str]) -> str:
    """An ASL file with its ${Name} placeholders filled (see `substitute`)."""
    return substitute(path.read_text(), substitutions, path.name)


def substitute(definition: str, substitutions: Mapping[str, str], source: str) -> str:
    """A definition with its ${Name} placeholders filled, as CloudFormation's DefinitionSubstitutions do.

    Only ${Name} is a placeholder: ASL's own paths ($.x, $$.Map.Item.Value) are left alone.
    """

    def fill(placeholder: re.Match[str]) -> str:
        name = placeholder.group(1)
        if name not in substitutions:
            raise KeyError(f"{source} needs a substitution for ${{{name}}}")
        return substitutions[name]

    return _PLACEHOLDER.sub(fill, definition)


@dataclass(frozen=True)
class Execution:
    status: str
    output: Any
    events: list[dict[str, Any]]

    @property
    def state_transitions(self) -> int:
        """States entered: what Step Functions Standard bills as state transitions."""
        return sum(1 for event in self.events if event["type"].endswith("StateEntered"))


class LocalStateMachines:
    """Deploys state machines and their Lambda functions into moto, and runs executions to the end."""

    def __init__(self, stepfunctions: Any, lambda_client: Any, iam: Any) -> None:
        self._sfn = stepfunctions
        self._lambda = lambda_client
        self._role = iam.create_role(RoleName="runner-pool-local", AssumeRolePolicyDocument="{}")["Role"][
            "Arn"
        ]

    def create_functions(self, names: list[str]) -> dict[str, str]:
        """A moto Lambda function per name (their code never runs: invocations are routed); name → ARN."""
        package = io.BytesIO()
        with zipfile.ZipFile(package, "w") as archive:
            archive.writestr("routed.py", "def handler(event, context):\n    raise NotImplementedError\n")
        return {
            name: self._lambda.create_function(
                FunctionName=name,
                Runtime="python3.12",
                Role=self._role,
                Handler="routed.handler",
                Code={"ZipFile": package.getvalue()},
            )["FunctionArn"]
            for name in names
        }

    def create(self, name: str, definition: str, workflow_type: str = "STANDARD") -> str:
        return str(
            self._sfn.create_state_machine(
                name=name, definition=definition, roleArn=self._role, type=workflow_type
            )["stateMachineArn"]
        )

    def run(
        self, machine_arn: str, payload: Any, name: str | None = None, timeout_seconds: float = 30
    ) -> Execution:
        """Start an execution and wait for it to finish (moto runs it on a thread of its own)."""
        return self.wait(self.start(machine_arn, payload, name), timeout_seconds)

    def start(self, machine_arn: str, payload: Any, name: str | None = None) -> str:
        """Start an execution; one without a name gets a unique one (moto names each such one "None")."""
        return str(
            self._sfn.start_execution(
                stateMachineArn=machine_arn, input=json.dumps(payload), name=name or uuid.uuid4().hex
            )["executionArn"]
        )

    def wait(self, execution_arn: str, timeout_seconds: float = 30) -> Execution:
        deadline = time.monotonic() + timeout_seconds
        while (described := self._sfn.describe_execution(executionArn=execution_arn))["status"] == "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution {execution_arn} still running after {timeout_seconds} s")
            time.sleep(0.01)
        events = [
            event
            for page in self._sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
            for event in page["events"]
        ]
        output = json.loads(described["output"]) if described.get("output") else None
        return Execution(described["status"], output, events)
