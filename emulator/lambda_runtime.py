"""A local Lambda service: each function runs from its deployed artifacts, in environments of its own.

An execution environment is a persistent worker process started the way the Lambda Python runtime
starts one: this interpreter with `-S -I` (no site-packages, no PYTHONPATH), `sys.path` = the function's
code asset + its layers' `python/` ("/opt/python" for a Python layer, Lambda Developer Guide,
packaging-layers.html#packaging-layers-paths), the working directory its code (LAMBDA_TASK_ROOT), and
an environment of the function's own variables plus those the runtime defines (configuration-envvars.html,
"Defined runtime environment variables"), its credentials and `AWS_ENDPOINT_URL` pointing at local AWS.
Inside, emulator/lambda_bootstrap.py imports the handler once (the cold start) and then serves
invocations over a pipe; the function's log is its stderr.

As on Lambda (Lambda Developer Guide, "Understand the Lambda execution environment lifecycle",
lambda-runtime-environment.html): an environment serves one invocation at a time; an invocation
when all of a function's environments are busy starts another (up to `max_environments`, past which
it waits for one); idle ones are reused. The Init phase may take 10 s, and is retried with the
function's timeout, so a cold start gets both. The function's timeout bounds each invocation: past
it the environment is killed and replaced, and the invocation fails with `Sandbox.Timedout`, "RequestId:
<id> Error: Task timed out after <timeout> seconds" ("If the Lambda function crashes or times out during
the Invoke phase, Lambda resets the execution environment"; the error type and message are Lambda's
answer as localstack/lambda-runtime-init, cmd/localstack/custom_interop.go, reproduces it, and the
name Step Functions' Retry and Catch match).

Cold starts: the first environment of the process's first runtime starts as above and imports
everything itself (a dependency the layer lacks fails there, `Runtime.ImportModuleError`, as on Lambda);
starts asked for meanwhile wait for its init, then fork.
It reports the modules it loaded; a fork server (`python -S -I` with the same path and runtime
variables, one per set of artifacts, shared by the process's runtimes, ended at exit) then imports
every one of them from the layers and, of the code asset's, those of `PRELOADED_CODE` (modules whose
import cannot depend on a function's environment), and every later environment is forked from it,
given its function's variables and pipes, and imports its handler's module (from the code asset) and
the rest of what that imports itself, under its own environment: 0.16 s for Plan's first invocation
(0.30 s when the fork server held only the layers' modules) against about 0.9 s anew (`make bench
lambda_runtime`). The fork server also parses the botocore data files (service models, endpoints) that
environments report they parsed, before it forks the next one, so a child's client takes them parsed;
what a client resolves from the environment (credentials, region, endpoint URL, user agent) the child
still resolves from its own (lambda_bootstrap.py `_DataFiles`). `fork_server=False` starts every
environment anew.

A failed invocation raises `FunctionError`, whose class is named after Lambda's `errorType`
(`ValueError`, `Runtime.ImportModuleError`, `Sandbox.Timedout`): a harness that reports `type(exc).__name__`
(emulator/step_functions.py `lambdas_in_process`) reports exactly what Lambda would, so Retry and Catch
on `Lambda.*` or a custom error name behave as on AWS.

Every AWS call a function makes comes to this process before it is sent: counted (`calls`), checked
against the function's role in the synthesized stack when a `PolicyCheck` is given (a denied call is
answered AccessDenied, as emulator/iam_check.py answers in-process clients), and EC2 CreateFleet is
answered by the simulated EC2 when one is given (emulator/ec2_fleet.py).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from botocore.exceptions import ClientError

from emulator.aws import ACCOUNT, REGION
from emulator.iam_check import PolicyCheck, denied_answer
from emulator.iam_stack import Principal
from emulator.step_functions import AccountConcurrency
from emulator.template import host_assembly

BOOTSTRAP = Path(__file__).resolve().with_name("lambda_bootstrap.py")
INIT_LIMIT_SECONDS = 10.0
"""Lambda's limit on the Init phase (lambda-runtime-environment.html, "Init phase")."""
UNRESERVED = ("PATH", "LANG", "TZ")
"""Variables Lambda sets that a function may set otherwise (configuration-envvars.html)."""
SHUTDOWN_SECONDS = 2.0
"""Lambda's cap on the Shutdown phase (lambda-runtime-environment.html, "Shutdown phase")."""
LOG_TAIL_LINES = 120
"""A stack dump of every thread of an environment (`LambdaRuntime.stacks`) is about this long."""
STACK_DUMP_SECONDS = 3.0
"""How long `LambdaRuntime.stacks` waits for the environments it asked to dump their stacks."""
PRELOADED_CODE = ("runner_pool.domain",)
"""The code asset's packages the fork server imports (with every layer module a first environment
loaded): those whose import cannot depend on the function's environment, so that a module imported
before the fork is the very module the function would build under its own variables. The domain: the
import contract "The domain is plain Python" (pyproject.toml) keeps it from the environment model,
observability (Powertools' Logger, Metrics and Tracer read their variables when made, at import) and
wiring, and none of its modules imports `os`; pydantic, building its models, reads only
`PYDANTIC_DISABLE_PLUGINS`, which picks among pydantic plugins and the layer has none
(tests/integration/test_lambda_runtime.py checks both). Everything else of the code asset (handlers,
wiring, steps, adapters, observability, environment) each environment imports itself."""


@dataclass(frozen=True)
class FunctionSpec:
    """One function of the stack: what Lambda would be told of it."""

    name: str
    handler: str
    """`module.function`, as the template's `Handler`."""
    environment: Mapping[str, str]
    """Its `Environment.Variables`, resolved to the local stack's values."""
    timeout_seconds: float = 3.0
    memory_mb: int = 128


@dataclass(frozen=True)
class Artifacts:
    """What `cdk deploy` uploads for a function: its code asset and its layers (each holding `python/`)."""

    code: Path
    layers: tuple[Path, ...]

    @property
    def sys_path(self) -> list[str]:
        return [str(self.code), *(str(layer / "python") for layer in self.layers)]

    @classmethod
    def from_assembly(cls, outdir: Path) -> Artifacts:
        """The Python functions' code asset and layers, as the assembly's asset manifest names them (every
        function of the stack shares them; one that does not is refused rather than guessed)."""
        (template_path,) = outdir.glob("*.template.json")
        (manifest_path,) = outdir.glob("*.assets.json")
        resources = json.loads(template_path.read_text())["Resources"]
        files = json.loads(manifest_path.read_text())["files"]

        def asset(code: Mapping[str, Any]) -> Path:
            source = files[str(code["S3Key"]).removesuffix(".zip")]["source"]
            if source["packaging"] != "zip":
                raise ValueError(f"asset {source['path']} is not a directory zipped by CDK")
            return outdir / str(source["path"])  # absolute when staging is disabled: then the source itself

        found = {
            cls(
                asset(resource["Properties"]["Code"]),
                tuple(
                    asset(resources[layer["Ref"]]["Properties"]["Content"])
                    for layer in resource["Properties"].get("Layers", [])
                ),
            )
            for resource in resources.values()
            if resource["Type"] == "AWS::Lambda::Function"
            and str(resource["Properties"].get("Runtime", "")).startswith("python")
        }
        if len(found) != 1:
            raise ValueError(f"expected one code asset and layer set for every function, found {found}")
        return found.pop()


@functools.cache
def host_artifacts() -> Artifacts:
    """The stack's artifacts, for this machine: from the one synthesis (emulator/template.py
    `host_assembly()`), whose code asset is `lambdas/` itself, holding only the runner_pool package
    CODE_EXCLUDES keeps (a file put beside it would be on the path here, not on Lambda)."""
    return Artifacts.from_assembly(host_assembly())


def error_class(error_type: str) -> type[FunctionError]:
    """The FunctionError subclass whose name is Lambda's `errorType` (botocore names its errors so too)."""
    with _CLASSES_LOCK:
        if error_type not in _CLASSES:
            _CLASSES[error_type] = type(error_type, (FunctionError,), {})
        return _CLASSES[error_type]


class FunctionError(Exception):
    """An invocation that failed; `payload` is what Lambda returns with `X-Amz-Function-Error: Unhandled`."""

    def __init__(self, payload: Mapping[str, Any]) -> None:
        super().__init__(payload.get("errorMessage", ""))
        self.payload = dict(payload)

    @property
    def error_type(self) -> str:
        return str(self.payload["errorType"])


_CLASSES: dict[str, type[FunctionError]] = {}
_CLASSES_LOCK = threading.Lock()


def preloaded(loaded: Mapping[str, Iterable[str]]) -> list[str]:
    """What the fork server imports, of the modules a first environment `loaded` (its ready message's):
    every one from the layers, and those of the code asset within `PRELOADED_CODE`."""
    code = [
        name
        for name in loaded.get("code", [])
        if any(name == package or name.startswith(f"{package}.") for package in PRELOADED_CODE)
    ]
    return [*loaded.get("layers", []), *code]


def fork_server_preload(artifacts: Artifacts) -> list[str] | None:
    """The modules the fork server of `artifacts` imports; None until a first environment has loaded."""
    with _SERVERS_LOCK:
        preload = _PRELOADS.get(artifacts)
        return None if preload is None else list(preload)


def _fail(error_type: str, message: str) -> FunctionError:
    return error_class(error_type)({"errorType": error_type, "errorMessage": message})


class _ExitedError(Exception):
    """The environment's process ended (or was killed) before it answered."""


class _Spawned:
    """An environment's process started on its own: a full cold start."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path) -> None:
        self._popen = subprocess.Popen(  # noqa: S603 - this interpreter, our bootstrap
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            text=True,
            encoding="utf-8",
        )
        stdin, stdout, stderr = self._popen.stdin, self._popen.stdout, self._popen.stderr
        if stdin is None or stdout is None or stderr is None:
            raise RuntimeError("an execution environment needs its three pipes")
        self.pid = self._popen.pid
        self.pipes: tuple[IO[str], IO[str], IO[str]] = (stdin, stdout, stderr)

    def running(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()
        self._popen.wait()

    def wait(self, timeout: float) -> bool:
        try:
            self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def status(self) -> str:
        return f"exit status {self._popen.wait()}"


class _Forked:
    """An environment's process forked by the fork server (its child, reaped there): only its pid is ours."""

    def __init__(self, pid: int, pipes: tuple[IO[str], IO[str], IO[str]]) -> None:
        self.pid = pid
        self.pipes = pipes

    def running(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.wait(SHUTDOWN_SECONDS)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def status(self) -> str:
        return "ended"


_Process = _Spawned | _Forked


class _ForkServer:
    """A process that has imported what the layers hold for our functions and the code asset's
    `PRELOADED_CODE`, holds the botocore data files environments parsed, and forks environments from
    itself: a cold start without that import and parse time (emulator/lambda_bootstrap.py `fork_server`)."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = subprocess.Popen(  # noqa: S603 - this interpreter, our bootstrap
            command, stdin=theirs.fileno(), stdout=subprocess.DEVNULL, env=env, cwd=cwd
        )
        theirs.close()
        self._socket = ours
        self._lock = threading.Lock()
        self._warmed: set[str] = set()

    def running(self) -> bool:
        return self._process.poll() is None

    def fork(self, env: dict[str, str], parsed: Iterable[str] = ()) -> _Forked:
        """An environment of `env`'s; the server first parses the botocore data files of `parsed` it has
        not parsed yet (those environments have parsed so far), so that this child takes them parsed."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            with self._lock:
                warm = sorted(set(parsed) - self._warmed)
                request = json.dumps({"environment": env, "warm": warm}).encode()
                socket.send_fds(self._socket, [request], [stdin_r, stdout_w, stderr_w])
                answer = self._socket.recv(4096)
                self._warmed.update(warm)
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        if not answer:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise RuntimeError("the fork server ended")
        pipes = (
            os.fdopen(stdin_w, "w", encoding="utf-8"),
            os.fdopen(stdout_r, "r", encoding="utf-8"),
            os.fdopen(stderr_r, "r", encoding="utf-8"),
        )
        return _Forked(int(json.loads(answer)["pid"]), pipes)

    def close(self) -> None:
        self._socket.close()
        try:
            self._process.wait(timeout=SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


_SERVERS: dict[Artifacts, _ForkServer] = {}
_PRELOADS: dict[Artifacts, list[str]] = {}
_FIRST_STARTS: dict[Artifacts, threading.Event] = {}
"""The first start of these artifacts, under way: set once its init ended, however it ended."""
_PARSED: dict[Artifacts, set[str]] = {}
"""botocore data files environments of these artifacts parsed, for their fork server to parse once."""
_SERVERS_LOCK = threading.Lock()


@atexit.register
def _close_fork_servers() -> None:
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()


class Environment:
    """One execution environment: a worker process, its channel, its log."""

    def __init__(self, spec: FunctionSpec, process: _Process) -> None:
        self.spec = spec
        self.process = process
        self.id = uuid.uuid4().hex[:8]
        self.invocations = 0
        self.ready = False
        """Initialised: the handler imported (the cold start done)."""
        self.last_used = time.monotonic()
        self.serving_since: float | None = None
        """When the invocation it serves began (monotonic); None while it is idle."""
        self.calls_answered = 0
        """AWS calls of its function answered (every invocation)."""
        self.last_call: str | None = None
        """The last of them, `service:Operation`."""
        self.log_tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._logger = logging.getLogger(f"emulator.lambda.{spec.name}")
        self._stdin, stdout, stderr = process.pipes
        threading.Thread(
            target=self._read, args=(stdout,), name=f"{spec.name}-{self.id}", daemon=True
        ).start()
        threading.Thread(
            target=self._log, args=(stderr,), name=f"{spec.name}-{self.id}-log", daemon=True
        ).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._stdin.write(json.dumps(message) + "\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError):
            raise _ExitedError from None

    def receive(self, deadline: float) -> dict[str, Any]:
        """The next message; TimeoutError past `deadline` (monotonic), _ExitedError once the process ended."""
        try:
            message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if message is None:
            raise _ExitedError
        return message

    def pending(self) -> int:
        """Messages it sent that no invocation has read yet (a call a thread made between invocations)."""
        return self._messages.qsize()

    def dumped(self) -> bool:
        """Whether its log's tail holds a stack dump (faulthandler's, at SIGUSR1; `stacks`)."""
        return any(line.startswith(("Current thread", "Thread 0x")) for line in list(self.log_tail))

    def kill(self) -> None:
        self.process.kill()
        with contextlib.suppress(BrokenPipeError, ValueError):
            self._stdin.close()

    def shut_down(self) -> None:
        """Shutdown: its input closed, so the bootstrap's loop ends (`wait` then reaps it)."""
        with contextlib.suppress(BrokenPipeError, ValueError):
            self._stdin.close()

    def wait(self, deadline: float) -> None:
        """Ended by `deadline`, killed past it (Lambda's Shutdown phase is capped at 2 s, then SIGKILL)."""
        if not self.process.wait(max(0.0, deadline - time.monotonic())):
            self.kill()

    def _read(self, channel: IO[str]) -> None:
        for line in channel:
            self._messages.put(json.loads(line))
        self._messages.put(None)

    def _log(self, log: IO[str]) -> None:
        for line in log:
            self.log_tail.append(line.rstrip("\n"))
            self._logger.info(line.rstrip("\n"))


PrincipalOf = Callable[[FunctionSpec], Principal]


@dataclass
class _Turn:
    """An invocation waiting for an environment, and what it was handed: an idle `environment`, or room
    to start one (`environment` None), having shut down `evicted` to make it; or `closed`."""

    spec: FunctionSpec
    granted: threading.Event = field(default_factory=threading.Event)
    environment: Environment | None = None
    evicted: Environment | None = None
    closed: bool = False


@dataclass
class _Pool:
    idle: list[Environment] = field(default_factory=list)
    busy: int = 0
    started: int = 0


class LambdaRuntime:
    """`with LambdaRuntime(artifacts, functions, endpoint=aws.endpoint) as lambdas: lambdas.invoke(...)`."""

    def __init__(
        self,
        artifacts: Artifacts,
        functions: Mapping[str, FunctionSpec],
        *,
        endpoint: str,
        policy_check: PolicyCheck | None = None,
        principal_of: PrincipalOf | None = None,
        ec2: Any = None,
        max_environments: int = 8,
        max_total_environments: int = 32,
        calls: Counter[str] | None = None,
        fork_server: bool = True,
        region: str = REGION,
        concurrency: int | None = None,
    ) -> None:
        """`endpoint`: local AWS (emulator/aws.py). `policy_check`: every call checked as the function's
        role (`principal_of`, by default the role of the function whose handler the template names so).
        `ec2`: what answers CreateFleet (a SimulatedEc2). `max_environments`: per function, past which an
        invocation waits for one; `max_total_environments`: in all, past which an idle environment of
        another function is shut down to make room (each holds about 80 MB). `fork_server`: after a
        first cold start in this process, environments are forked from a process that has imported the
        layer modules that first environment loaded and the code asset's `PRELOADED_CODE` (see the
        module's docstring); False: every one starts anew. `concurrency`: the account's concurrent
        executions quota, shared by every function (none reserved): an invocation that finds that many in
        flight is refused with `ThrottledError` at once, as Lambda refuses it; None: no quota."""
        misnamed = sorted(name for name, spec in functions.items() if spec.name != name)
        if misnamed:
            raise ValueError(f"functions must be keyed by their own names: {misnamed}")
        self.artifacts = artifacts
        self.functions = dict(functions)
        self.calls: Counter[str] = Counter() if calls is None else calls
        """Every AWS call the functions made, `service:Operation` (a CallCounter's `calls`, if given)."""
        self.faults: list[str] = []
        """Failures of this service itself while answering a function's call (never the function's)."""
        self._endpoint = endpoint
        self._region = region
        self._check = policy_check
        self._principal_of = principal_of or (
            (lambda spec: policy_check.iam.function(spec.handler)) if policy_check is not None else None
        )
        self._lookups = None if policy_check is None else policy_check.lookups(endpoint, region)
        self._ec2 = ec2
        self._max = max_environments
        self._max_total = max_total_environments
        self._fork = fork_server
        self._starting = 0
        self._pools: dict[str, _Pool] = {name: _Pool() for name in self.functions}
        self._all: list[Environment] = []
        self._waiting: list[_Turn] = []
        """Invocations waiting for an environment, in the order they came."""
        self._lock = threading.Lock()
        self._counting = threading.Lock()
        """Only for `calls` and `faults`: every AWS call a function makes counts, and must not wait on
        the invocations' turns."""
        self._closed = False
        self.concurrency = AccountConcurrency(concurrency) if concurrency is not None else None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            environments = list(self._all)
            self._all.clear()
            for pool in self._pools.values():
                pool.idle.clear()
            for turn in self._waiting:
                turn.closed = True
                turn.granted.set()
            self._waiting.clear()
        for environment in environments:
            environment.shut_down()
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        for environment in environments:
            environment.wait(deadline)

    # --- invoking

    def warm(self, names: Iterable[str] | None = None) -> None:
        """Start one environment for each of `names` (every function by default), all at once, and wait
        until each has imported its handler: what provisioned concurrency of 1 does (Lambda Developer
        Guide, provisioned-concurrency.html), so that cold starts happen here rather than inside a
        scenario's timings. An init failure is raised here, as its first invocation would raise it."""

        def start(name: str) -> None:
            spec = self.functions[name]
            environment = self._acquire(spec)
            healthy = False
            try:
                self._await_ready(environment, time.monotonic() + INIT_LIMIT_SECONDS + spec.timeout_seconds)
                healthy = True
            finally:
                self._release(spec, environment, healthy)

        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="lambda-warm") as pool:
            for started in [pool.submit(start, name) for name in names or list(self.functions)]:
                started.result()

    def handler(self, name: str) -> Callable[[dict[str, Any], Any], Any]:
        """The function as a Lambda handler `(event, context) -> result` that raises FunctionError: what
        emulator/step_functions.py `lambdas_in_process`, ProxyEndpoint and the event sources invoke."""
        if name not in self.functions:
            raise KeyError(f"no function {name!r} in this runtime")

        def invoke(event: dict[str, Any], context: Any = None) -> Any:
            return self.invoke(name, event, context)

        invoke.__name__ = name
        return invoke

    def invoke(self, name: str, event: Any, context: Any = None) -> Any:
        """Invoke `name` with `event` and wait for its result; a failed invocation raises FunctionError."""
        spec = self.functions[name]
        request_id = getattr(context, "aws_request_id", None) or str(uuid.uuid4())
        if self.concurrency is None:
            return self._invoke(spec, event, context, request_id)
        with self.concurrency.invocation():
            return self._invoke(spec, event, context, request_id)

    def _invoke(self, spec: FunctionSpec, event: Any, context: Any, request_id: str) -> Any:
        environment = self._acquire(spec)
        began = time.monotonic()
        deadline = began + spec.timeout_seconds
        healthy = False
        try:
            if not environment.ready:
                self._await_ready(environment, began + INIT_LIMIT_SECONDS + spec.timeout_seconds)
                deadline = time.monotonic() + spec.timeout_seconds
            environment.invocations += 1
            environment.serving_since = began
            environment.send(
                {
                    "invoke": {
                        "event": event,
                        "context": {
                            "function_name": spec.name,
                            "aws_request_id": request_id,
                            "invoked_function_arn": getattr(context, "invoked_function_arn", None)
                            or f"arn:aws:lambda:{self._region}:{ACCOUNT}:function:{spec.name}",
                        },
                        "remaining_ms": int(spec.timeout_seconds * 1000),
                        "trace_id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0",
                    }
                }
            )
            result = self._serve(spec, environment, deadline, request_id)
            healthy = True
            return result
        except _ExitedError:  # its input closed under a write: the process is gone
            raise self._exited(environment, request_id) from None
        except FunctionError as failed:
            healthy = not failed.error_type.startswith(("Runtime.", "Sandbox."))
            raise
        finally:
            environment.serving_since = None
            self._release(spec, environment, healthy)

    def _serve(self, spec: FunctionSpec, environment: Environment, deadline: float, request_id: str) -> Any:
        timed_out = f"RequestId: {request_id} Error: Task timed out after {spec.timeout_seconds:.2f} seconds"
        while True:
            message = self._receive(environment, deadline, request_id, timed_out)
            if "call" in message:
                environment.calls_answered += 1
                environment.last_call = f"{message['call']['service']}:{message['call']['operation']}"
                environment.send({"reply": self._answer(spec, message["call"])})
            elif "result" in message:
                return message["result"]
            else:
                raise error_class(message["error"]["errorType"])(message["error"])

    def _await_ready(self, environment: Environment, deadline: float) -> None:
        """The cold start: the handler imported, or the init error as the invocation's error."""
        limit = INIT_LIMIT_SECONDS + environment.spec.timeout_seconds
        timed_out = f"Init of {environment.spec.name} did not finish within {limit:.2f} seconds"
        try:
            message = self._receive(environment, deadline, "init", timed_out)
            if "init_error" in message:
                environment.kill()
                raise error_class(message["init_error"]["errorType"])(message["init_error"])
            environment.ready = True
            with _SERVERS_LOCK:
                _PRELOADS.setdefault(self.artifacts, preloaded(message.get("loaded", {})))
        finally:
            self._first_start_ended()

    def _first_start_ended(self) -> None:
        """The starts waiting for a first one go on: what it loaded is known now, or it failed."""
        with _SERVERS_LOCK:
            first = _FIRST_STARTS.pop(self.artifacts, None)
        if first is not None:
            first.set()

    def _receive(
        self, environment: Environment, deadline: float, request_id: str, timed_out: str
    ) -> dict[str, Any]:
        """The environment's next message; past `deadline` the environment is killed and the invocation
        fails as Lambda fails it (`Sandbox.Timedout`, `timed_out` its message); gone, `Runtime.ExitError`."""
        try:
            message = environment.receive(deadline)
        except TimeoutError:
            environment.kill()
            raise _fail("Sandbox.Timedout", timed_out) from None
        except _ExitedError:
            raise self._exited(environment, request_id) from None
        if "parsed" in message:
            with _SERVERS_LOCK:
                _PARSED.setdefault(self.artifacts, set()).update(message["parsed"])
        return message

    def _exited(self, environment: Environment, request_id: str) -> FunctionError:
        environment.process.wait(SHUTDOWN_SECONDS)
        tail = "\n".join(environment.log_tail)
        status = environment.process.status()
        return _fail(
            "Runtime.ExitError", f"RequestId: {request_id} Error: Runtime exited with error: {status}\n{tail}"
        )

    # --- environments

    def _acquire(self, spec: FunctionSpec) -> Environment:
        """An environment for one invocation of `spec`: an idle one, or one started in the room there is
        (an idle one of another function shut down to make it, if need be); else the invocation waits its
        turn. Turns are handed out first come, first served, each to the one waiter it lets go on: under
        a burst a hundred invocations wait, and waking all of them at every release made the lock they
        share the one thing the process did (the 1,000-job burst's stall)."""
        turn = _Turn(spec)
        with self._lock:
            if self._closed:
                raise RuntimeError("the Lambda runtime is closed")
            self._waiting.append(turn)
            self._hand_out()
        turn.granted.wait()
        if turn.closed:
            raise RuntimeError("the Lambda runtime is closed")
        if turn.evicted is not None:
            turn.evicted.kill()
        if turn.environment is not None:
            return turn.environment
        try:
            environment = self._start(spec)
        except BaseException:
            with self._lock:
                self._pools[spec.name].busy -= 1
                self._starting -= 1
                self._hand_out()
            raise
        with self._lock:
            self._starting -= 1
            closed = self._closed
            if not closed:
                self._all.append(environment)
        if closed:  # closed while it started: close() could not see it, so it ends here
            environment.kill()
            raise RuntimeError("the Lambda runtime is closed")
        return environment

    def _hand_out(self) -> None:
        """Let go every waiting invocation that can go on now, in the order they came (the lock held):
        with an idle environment of its function, or the room to start one, within `max_environments`
        of its function and `max_total_environments` in all."""
        for turn in list(self._waiting):
            pool = self._pools[turn.spec.name]
            if pool.idle:
                turn.environment = pool.idle.pop()
            elif pool.busy >= self._max:
                continue
            elif len(self._all) + self._starting < self._max_total:
                pool.started += 1
                self._starting += 1
            elif (evicted := self._evict()) is not None:
                turn.evicted = evicted
                pool.started += 1
                self._starting += 1
            else:
                continue
            pool.busy += 1
            self._waiting.remove(turn)
            turn.granted.set()

    def _evict(self) -> Environment | None:
        """The idle environment used least recently, of any function, taken out to make room (Lambda
        reclaims idle environments as it needs); None when every environment is busy. Its caller shuts it
        down, outside the lock."""
        idle = [
            (environment.last_used, name) for name, pool in self._pools.items() for environment in pool.idle
        ]
        if not idle:
            return None
        _, name = min(idle)
        pool = self._pools[name]
        oldest = min(pool.idle, key=lambda environment: environment.last_used)
        pool.idle.remove(oldest)
        self._all.remove(oldest)
        return oldest

    def _release(self, spec: FunctionSpec, environment: Environment, healthy: bool) -> None:
        """The invocation's environment back: idle for the next, or (unhealthy, or the runtime closed) shut
        down outside the lock, so that a slow kill never holds the runtime up."""
        with self._lock:
            pool = self._pools[spec.name]
            pool.busy -= 1
            kept = healthy and not self._closed and environment.process.running()
            if kept:
                environment.last_used = time.monotonic()
                pool.idle.append(environment)
            elif environment in self._all:
                self._all.remove(environment)
            self._hand_out()
        if not kept:
            environment.kill()

    def _start(self, spec: FunctionSpec) -> Environment:
        server = self._fork_server_after_first_start()
        if server is not None:
            with _SERVERS_LOCK:
                parsed = set(_PARSED.get(self.artifacts, ()))
            return Environment(spec, server.fork(self._environment(spec), parsed))
        command = [sys.executable, "-S", "-I", str(BOOTSTRAP), json.dumps(self.artifacts.sys_path)]
        try:
            return Environment(spec, _Spawned(command, self._environment(spec), self.artifacts.code))
        except BaseException:
            self._first_start_ended()
            raise

    def _fork_server_after_first_start(self) -> _ForkServer | None:
        """The fork server; before one exists, the first start of these artifacts goes ahead alone (it
        learns what the fork server imports) and every other start waits for its init, then forks. Eight
        cold starts at once, each importing everything on two cores, took seconds of CPU apiece; a start
        that waited forks in a fraction of one. If the first start fails or never reports, the others
        start as it did once its init limit has passed."""
        if not self._fork:
            return None
        with _SERVERS_LOCK:
            first = None if self.artifacts in _PRELOADS else _FIRST_STARTS.get(self.artifacts)
            if first is None and self.artifacts not in _PRELOADS:
                _FIRST_STARTS[self.artifacts] = threading.Event()
        if first is not None:
            first.wait(INIT_LIMIT_SECONDS)
        return self._fork_server()

    def _fork_server(self) -> _ForkServer | None:
        """The fork server of these artifacts, started once a first environment (of any runtime of this
        process) has said which modules it loaded; shared by every runtime of the process, since what it
        holds depends on no function's environment (`PRELOADED_CODE`), and a child's environment is its
        own."""
        if not self._fork:
            return None
        with _SERVERS_LOCK:
            preload = _PRELOADS.get(self.artifacts)
            if preload is None:
                return None
            server = _SERVERS.get(self.artifacts)
            if server is None or not server.running():
                command = [
                    sys.executable,
                    "-S",
                    "-I",
                    str(BOOTSTRAP),
                    "--fork-server",
                    json.dumps(self.artifacts.sys_path),
                    json.dumps(preload),
                ]
                server = _SERVERS[self.artifacts] = _ForkServer(
                    command, self._runtime_environment(), self.artifacts.code
                )
            return server

    def _environment(self, spec: FunctionSpec) -> dict[str, str]:
        """The function's variables, then the runtime's own (reserved: a function cannot set them)."""
        reserved = self._runtime_environment()
        unreserved = {name: reserved.pop(name) for name in UNRESERVED if name in reserved}
        return {
            **unreserved,
            **spec.environment,
            **reserved,
            "_HANDLER": spec.handler,
            "AWS_LAMBDA_FUNCTION_NAME": spec.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": f"local/[$LATEST]{uuid.uuid4().hex}",
        }

    def _runtime_environment(self) -> dict[str, str]:
        """What every function of this runtime is given alike."""
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "en_US.UTF-8",
            "TZ": ":UTC",
            "AWS_REGION": self._region,
            "AWS_DEFAULT_REGION": self._region,
            "AWS_EXECUTION_ENV": f"AWS_Lambda_python{version}",
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
            "LAMBDA_TASK_ROOT": str(self.artifacts.code),
            "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
            "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
            # The execution role's credentials, here local AWS's; and no shared config or credentials
            # file of this machine's (a Lambda has none).
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_ENDPOINT_URL": self._endpoint,
        }

    # --- the function's AWS calls

    def _answer(self, spec: FunctionSpec, call: Mapping[str, Any]) -> dict[str, Any]:
        service, operation = call["service"], call["operation"]
        params = _decoded(call["params"])
        with self._counting:
            self.calls[f"{service}:{operation}"] += 1
        try:
            if self._check is not None and self._principal_of is not None:
                checked = self._check.check(
                    self._principal_of(spec), service, operation, params, self._lookups
                )
                if not checked.allowed:
                    return {"error": denied_answer(service, checked)}
            if service == "lambda" and operation == "Invoke":
                return self._answer_invoke(params)
            if service == "ec2" and operation == "CreateFleet" and self._ec2 is not None:
                try:
                    return {"response": self._ec2.answer_create_fleet(**params)}
                except ClientError as refused:
                    return {"error": refused.response}
        except Exception as fault:  # the emulator's own failure: fail the call, and the test that made it
            logging.getLogger(__name__).exception("answering %s:%s for %s", service, operation, spec.name)
            with self._counting:
                self.faults.append(f"{spec.name} {service}:{operation}: {type(fault).__name__}: {fault}")
            return {
                "error": {
                    "Error": {"Code": "EmulatorFault", "Message": f"{type(fault).__name__}: {fault}"},
                    "ResponseMetadata": {"HTTPStatusCode": 500},
                }
            }
        return {"proceed": True}

    def _answer_invoke(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A function's synchronous Invoke of another of this runtime's functions, answered as the Lambda API
        Reference's Invoke answers it: `StatusCode` 200, the function's result as `Payload`; a function that
        raised is still a 200, flagged `FunctionError: Unhandled` with Lambda's `errorType` and
        `errorMessage` as the payload; an unknown function is ResourceNotFoundException (404). Only
        `RequestResponse` is served (the product invokes nothing asynchronously)."""
        name = str(params["FunctionName"]).rsplit(":function:", 1)[-1]
        if params.get("InvocationType", "RequestResponse") != "RequestResponse" or params.get("Qualifier"):
            raise NotImplementedError("only RequestResponse invocations of $LATEST are served")
        if name not in self.functions:
            return {
                "error": {
                    "Error": {"Code": "ResourceNotFoundException", "Message": f"Function not found: {name}"},
                    "ResponseMetadata": {"HTTPStatusCode": 404},
                }
            }
        raw = params.get("Payload") or b"{}"
        event = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        answer: dict[str, Any] = {"StatusCode": 200, "ExecutedVersion": "$LATEST"}
        try:
            result = self.invoke(name, event)
        except FunctionError as failed:
            answer["FunctionError"] = "Unhandled"
            result = failed.payload
        payload = json.dumps(result).encode()
        return {"response": {**answer, "Payload": {"__bytes__": base64.b64encode(payload).decode()}}}

    # --- looking at it

    def assert_no_faults(self) -> None:
        """Fail if this service itself failed to answer a function's call (an AWS call the IAM check has no
        row for, a simulator's crash): the function was answered `EmulatorFault`, never what AWS says."""
        with self._counting:
            faults = list(self.faults)
        if faults:
            raise AssertionError("the local Lambda service could not answer:\n" + "\n".join(faults))

    def environments(self, name: str) -> int:
        """How many environments `name` has started so far (cold starts)."""
        with self._lock:
            return self._pools[name].started

    def waiting(self) -> int:
        """How many invocations wait for an environment right now."""
        with self._lock:
            return len(self._waiting)

    def in_flight(self) -> list[str]:
        """Each invocation running now: its function, environment, how long, and its AWS calls so far
        (a whole-system wait that times out shows them, tests/e2e/conftest.py)."""
        now = time.monotonic()
        return [
            f"{environment.spec.name} for {now - since:.1f} s in {environment.id} (pid {environment.pid}),"
            f" {environment.calls_answered} calls, the last {environment.last_call},"
            f" {environment.pending()} unread"
            for environment in self.live()
            if (since := environment.serving_since) is not None
        ]

    def stacks(self, older_than: float) -> dict[str, list[str]]:
        """Every thread's stack in each environment serving an invocation for longer than `older_than`
        seconds, by `in_flight`'s name for it: the bootstrap dumps them to its log on SIGUSR1
        (faulthandler). For a diagnosis only: an environment that has not written them within
        STACK_DUMP_SECONDS is shown with whatever its log holds."""
        now = time.monotonic()
        stuck = [
            environment
            for environment in self.live()
            if environment.serving_since is not None and now - environment.serving_since > older_than
        ]
        for environment in stuck:
            with contextlib.suppress(ProcessLookupError):
                os.kill(environment.pid, signal.SIGUSR1)
        deadline = time.monotonic() + STACK_DUMP_SECONDS
        dumps = {}
        for environment in stuck:
            while not environment.dumped() and time.monotonic() < deadline:
                time.sleep(0.05)  # a poll of the condition: the dump comes through the log's reader thread
            time.sleep(0.1)  # the dump's header has come; the rest of it follows from the same write
            dumps[f"{environment.spec.name} {environment.id}"] = list(environment.log_tail)
        return dumps

    def live(self) -> Iterator[Environment]:
        with self._lock:
            return iter(list(self._all))


def _decoded(value: Any) -> Any:
    """A call's parameters as botocore took them: the bootstrap sends bytes as `{"__bytes__": base64}`."""
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {key: _decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value
