"""The runtime inside one local Lambda execution environment: what Lambda's runtime interface client is.

emulator/lambda_runtime.py starts it as `python -S -I lambda_bootstrap.py '<sys.path as JSON>'` with the
function's environment, so it may use only the standard library and what the function's code asset and
layers hold (botocore is in our layer): nothing of the emulator, nothing of the dev virtualenv.

Init (the cold start): put the code asset and the layers' `python/` on `sys.path`, hook every botocore
client the function will make, import the `_HANDLER`, and report `ready` (with the modules it loaded from
the layers and from the code asset) or the init error. Then serve invocations one at a time, as JSON
lines: `{"invoke": ...}` on stdin; `{"result": ...}` or `{"error": ...}` back. File descriptor 1 is the
channel back, so the process's own stdout (Powertools' metrics print there) is pointed at stderr, which is
the function's log.

Environments after the first are forked from a fork server (`--fork-server`, see `fork_server`), which
has imported what emulator/lambda_runtime.py tells it: every layer module a first environment loaded,
and of the code asset only the modules whose import cannot depend on a function's environment
(lambda_runtime.py `PRELOADED_CODE`, the domain). A child imports its handler's module itself, under its
own environment, so an import error there is still its own `Runtime.ImportModuleError`. The fork server
also holds botocore's data files (service models, endpoints) that environments have parsed, each parsed
once: a child's botocore loader takes a file from there instead of parsing it again (`_DataFiles`), and
everything a client resolves from the environment (credentials, region, endpoint URL, user agent) it
still resolves in the child, from its own variables, when it creates the client. What the fork server
holds is frozen (`gc.freeze`) before each fork, so a child's garbage collections never walk it.

Every AWS call the function makes is first reported to the parent (`{"call": {service, operation,
params}}`), which answers before it is sent: `{"proceed": true}` (send it), `{"error": <AWS error
response>}` (answered as AWS would, e.g. AccessDenied from the IAM check) or `{"response": <parsed
response>}` (the parent answered it, e.g. the simulated EC2 CreateFleet). botocore's `before-call` event
is where a handler may return a response instead of sending the request.

Error shapes follow the Python runtime interface client (aws/aws-lambda-python-runtime-interface-client,
awslambdaric/bootstrap.py): an exception is `{"errorMessage": str(e), "errorType": type(e).__name__,
"stackTrace": [...]}`; a handler module that does not import is `Runtime.ImportModuleError` with
"Unable to import module '<module>': <error>", a missing function `Runtime.HandlerNotFound`.
"""

from __future__ import annotations

import base64
import contextlib
import faulthandler
import gc
import importlib
import io
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

_CODE: list[str] = []
"""The code asset's directory, first on sys.path."""
_LAYERS: list[str] = []
"""The layers' `python/` directories on sys.path (after the code asset)."""
_PARAMS = "runner_pool_call"
"""Where a call's parameters wait, in botocore's request context, between the two events."""


class _Channel:
    """JSON lines to and from the parent; one exchange at a time (a handler's threads share it).

    One thread reads what the parent sends and hands each message to whoever it is for: a reply to the
    thread whose call waits for it (one at a time: `ask` holds the lock), anything else to the loop that
    serves invocations. A thread a handler left behind may make its call after the invocation ended (on
    AWS the environment is frozen then: "Background processes or callbacks that were initiated by your
    Lambda function and did not complete when the function ended resume if Lambda reuses the execution
    environment", Lambda Developer Guide, lambda-runtime-environment.html): its call waits for the parent
    to read it in the next invocation, and the next invocation's message still reaches the loop. Two
    threads reading the input themselves took each other's lines: the next invocation went to the
    left-behind thread, its reply to the loop."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)  # whatever the function prints goes to its log, never into the channel
        self._lock = threading.Lock()
        self._replies: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._invocations: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._route, args=(sys.stdin,), name="channel", daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            self._write(message)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._write(message)
            answer = self._replies.get()
            if answer is None:
                raise EOFError("the runtime closed the channel before it answered the call")
            return answer

    def receive(self) -> dict[str, Any] | None:
        """The next message for the invocation loop; None once the parent closed the channel."""
        return self._invocations.get()

    def _route(self, lines: Any) -> None:
        for line in lines:
            message = json.loads(line)
            if "reply" in message:
                self._replies.put(message["reply"])
            else:
                self._invocations.put(message)
        self._replies.put(None)
        self._invocations.put(None)

    def _write(self, message: dict[str, Any]) -> None:
        parsed = _DATA_FILES.parsed_here()
        if parsed:  # with whatever message comes next, so the parent can have the fork server parse them
            message = {**message, "parsed": parsed}
        self._out.write(json.dumps(message, default=_jsonable) + "\n")
        self._out.flush()


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": base64.b64encode(bytes(value)).decode()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


class _FaultError(Exception):
    def __init__(self, error_type: str, message: str, stack: list[str] | None = None) -> None:
        super().__init__(message)
        self.payload = {"errorType": error_type, "errorMessage": message, "stackTrace": stack or []}


def _within(path: str, directories: list[str]) -> bool:
    return any(path.startswith(os.path.join(directory, "")) for directory in directories)


class _DataFiles:
    """botocore's data files (service models, endpoints, retry rules: JSON in the layer), by path.

    In the fork server, `warm` parses the files environments reported; a child inherits them and its
    botocore loader takes each once instead of parsing it again (a second loader of the child parses its
    own, so no two loaders share a parsed file, as in botocore itself). A file is only data from the
    layer: which file a loader reads (its search path, `AWS_DATA_PATH`) and everything a client resolves
    from the environment are still the child's. In every environment, the files it parsed itself are
    reported to the parent with its next message (`parsed`)."""

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}
        self._parsed_here: list[str] = []
        self._lock = threading.Lock()

    def install(self) -> None:
        """Every botocore loader of this process reads data files through here."""
        from botocore.loaders import JSONFileLoader  # noqa: PLC0415 - from the layer, once sys.path holds it

        load_file = JSONFileLoader.load_file

        def load(loader: Any, file_path: str) -> Any:
            with self._lock:
                held = self._held.pop(file_path, None)
            if held is not None:
                return held
            data = load_file(loader, file_path)
            if data is not None and _within(file_path, _LAYERS):
                with self._lock:
                    self._parsed_here.append(file_path)
            return data

        load.__wrapped__ = load_file  # type: ignore[attr-defined]
        JSONFileLoader.load_file = load  # type: ignore[method-assign,assignment]

    def warm(self, paths: list[str]) -> None:
        """Parse the layer's files among `paths` not yet held (in the fork server, before it forks)."""
        from botocore.loaders import JSONFileLoader  # noqa: PLC0415

        load_file = getattr(JSONFileLoader.load_file, "__wrapped__", JSONFileLoader.load_file)
        loader = JSONFileLoader()
        for path in paths:
            if path in self._held or not _within(path, _LAYERS):
                continue
            data = load_file(loader, path)
            if data is not None:
                self._held[path] = data

    def parsed_here(self) -> list[str]:
        """The files parsed in this process since the last call."""
        with self._lock:
            parsed, self._parsed_here = self._parsed_here, []
        return parsed


_DATA_FILES = _DataFiles()


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "errorType": type(exc).__name__,
        "errorMessage": str(exc),
        "stackTrace": traceback.format_list(traceback.extract_tb(exc.__traceback__)),
    }


def _load(handler: str) -> Any:
    module_name, _, function_name = handler.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _FaultError(
            "Runtime.ImportModuleError", f"Unable to import module '{module_name}': {exc}"
        ) from None
    except SyntaxError as exc:
        raise _FaultError(
            "Runtime.UserCodeSyntaxError", f"Syntax error in module '{module_name}': {exc}"
        ) from None
    try:
        return getattr(module, function_name)
    except AttributeError:
        raise _FaultError(
            "Runtime.HandlerNotFound", f"Handler '{function_name}' missing on module '{module_name}'"
        ) from None


def _revived(response: dict[str, Any]) -> dict[str, Any]:
    """A parsed response the parent answered, with its streamed member (Lambda Invoke's `Payload`, sent as
    `{"__bytes__": base64}`) a stream again, as botocore hands a streaming body to its caller."""
    from botocore.response import StreamingBody  # noqa: PLC0415 - from the layer

    revived = dict(response)
    for member, value in response.items():
        if isinstance(value, dict) and set(value) == {"__bytes__"}:
            data = base64.b64decode(value["__bytes__"])
            revived[member] = StreamingBody(io.BytesIO(data), len(data))
    return revived


def _hook_botocore(channel: _Channel) -> None:
    """Every client any session makes reports each call to the parent and obeys its answer."""
    import botocore.session  # noqa: PLC0415 - from the layer, once sys.path holds it
    from botocore.awsrequest import AWSResponse  # noqa: PLC0415
    from botocore.compat import HTTPHeaders  # noqa: PLC0415

    def note(params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        # The caller's parameters, before botocore's own handlers reshape them for the wire.
        context[_PARAMS] = {
            "service": model.service_model.service_name,
            "operation": model.name,
            "params": json.loads(json.dumps(params, default=_jsonable)),
        }

    def ask(model: Any, context: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]] | None:
        call = context.pop(_PARAMS, None)
        if call is None:
            return None
        answer = channel.ask({"call": call})
        if "error" in answer:
            status = int(answer["error"].get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
            return AWSResponse("https://lambda-runtime.local/", status, HTTPHeaders(), None), answer["error"]
        if "response" in answer:
            return AWSResponse("https://lambda-runtime.local/", 200, HTTPHeaders(), None), _revived(
                answer["response"]
            )
        return None

    create_client = botocore.session.Session.create_client

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = create_client(self, *args, **kwargs)
        client.meta.events.register("provide-client-params", note)
        client.meta.events.register_first("before-call", ask)  # type: ignore[arg-type]
        return client

    botocore.session.Session.create_client = hooked  # type: ignore[method-assign]
    _DATA_FILES.install()


class _Context:
    """The context the Python runtime passes a handler (Lambda Developer Guide, python-context.html)."""

    def __init__(self, fields: dict[str, Any], deadline: float) -> None:
        self.function_name: str = fields["function_name"]
        self.function_version: str = os.environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.invoked_function_arn: str = fields["invoked_function_arn"]
        self.memory_limit_in_mb: int = int(os.environ["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"])
        self.aws_request_id: str = fields["aws_request_id"]
        self.log_group_name: str = os.environ.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name: str = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME", "")
        self.identity = None
        self.client_context = None
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _invoke(handler: Any, event: Any, context: _Context) -> dict[str, Any]:
    try:
        result = handler(event, context)
    except Exception as exc:
        return {"error": _error(exc)}
    try:
        return {"result": json.loads(json.dumps(result))}
    except (TypeError, ValueError) as exc:  # awslambdaric: a result JSON cannot hold
        return {"error": _FaultError("Runtime.MarshalError", f"Unable to marshal response: {exc}").payload}


def main(sys_path: list[str] | None) -> int:
    """One environment: init, then invocations until the parent closes the channel."""
    # Every thread's stack to the log on SIGUSR1: what a diagnosis of a stuck invocation shows
    # (lambda_runtime.py `LambdaRuntime.stacks`). Lambda has no such signal; nothing of ours sends it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    channel = _Channel()
    if sys_path is not None:
        sys.path[:0] = sys_path
        _CODE[:], _LAYERS[:] = sys_path[:1], sys_path[1:]
    try:
        try:
            _hook_botocore(channel)
        except ImportError as exc:
            raise _FaultError(
                "Runtime.ImportModuleError", f"Unable to import module 'botocore': {exc}"
            ) from None
        handler = _load(os.environ["_HANDLER"])
    except _FaultError as fault:
        channel.send({"init_error": fault.payload})
        return 1
    except Exception as exc:  # the module's own code failed at import: Lambda reports it as is
        channel.send({"init_error": _error(exc)})
        return 1
    files = {name: str(getattr(module, "__file__", None) or "") for name, module in list(sys.modules.items())}
    loaded = {
        "layers": sorted(name for name, file in files.items() if _within(file, _LAYERS)),
        "code": sorted(name for name, file in files.items() if _within(file, _CODE)),
    }
    channel.send({"ready": True, "loaded": loaded})
    while (message := channel.receive()) is not None:
        invoke = message["invoke"]
        # Lambda sets the trace header per invocation (configuration-envvars.html, `_X_AMZN_TRACE_ID`).
        os.environ["_X_AMZN_TRACE_ID"] = invoke["trace_id"]
        context = _Context(invoke["context"], time.monotonic() + invoke["remaining_ms"] / 1000)
        channel.send(_invoke(handler, invoke["event"], context))
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def fork_server(sys_path: list[str], preload: list[str]) -> int:
    """Imports `preload` (the layers' modules a first environment loaded, and of the code asset's only
    those whose import cannot depend on the function's environment: lambda_runtime.py `PRELOADED_CODE`),
    then forks an environment for each request on the socket that is its stdin: the request is the
    function's environment and the botocore data files to parse first (`warm`, see `_DataFiles`), with
    its three pipes attached (SCM_RIGHTS); the answer, the child's pid. The rest of the code asset (the
    handler's module and what it imports beyond the preload) a child imports itself, after the fork,
    under its own environment."""
    sys.path[:0] = sys_path
    _CODE[:], _LAYERS[:] = sys_path[:1], sys_path[1:]
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 - the environment's own import will report it, with Lambda's error
            continue
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; the parent kills
    control = socket.socket(fileno=0)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
        if not message:
            return 0
        request = json.loads(message)
        with contextlib.suppress(Exception):  # not warmed, a child parses what it needs itself
            _DATA_FILES.warm(request["warm"])
        # What this process holds (modules, parsed data files) goes to the collector's permanent
        # generation, which a child's collections skip: they neither spend time on it nor touch, and so
        # copy, its pages (the gc module's documentation: gc.freeze() "right before fork()").
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["environment"])
            code = 1
            try:
                code = main(None)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        control.sendall(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--fork-server":
        sys.exit(fork_server(json.loads(sys.argv[2]), json.loads(sys.argv[3])))
    sys.exit(main(json.loads(sys.argv[1])))
