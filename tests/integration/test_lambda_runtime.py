"""The local Lambda service (emulator/lambda_runtime.py): functions run from the deployed artifacts, in
persistent execution environments, with their AWS calls checked and answered as the emulator does.

One runtime per concern and module: a real handler's cold start is about a second. Real handlers run
from the stack's code asset and its layer built for this machine (`host_artifacts()`); probes, small
functions of this test's own, run from a code asset of theirs on the same layer.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator.aws import ACCOUNT, REGION, LocalAws, local_aws
from emulator.ec2_fleet import SimulatedEc2
from emulator.iam_check import PolicyCheck
from emulator.iam_stack import StackIam, without_grant
from emulator.lambda_runtime import (
    PRELOADED_CODE,
    Artifacts,
    FunctionError,
    FunctionSpec,
    LambdaRuntime,
    fork_server_preload,
    host_artifacts,
)
from emulator.resources import create_state_table
from emulator.step_functions import (
    LocalStateMachines,
    ThrottledError,
    lambdas_in_process,
    without_waiting,
)
from emulator.template import synthesized_template
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

TABLE = "runtime-test-state"
LOCAL = {
    "RUNNER_POOL_TABLE_NAME": TABLE,
    "RUNNER_POOL_STACK_NAME": "runtime-test",
    "RUNNER_POOL_ACCOUNT_ID": ACCOUNT,
}
"""What the local stack gives the variables the template fills from its resources."""
PLAN = "runner_pool.handlers.release.plan"

PROBES = '''
"""Probes: functions of the test's own, run in the same environments as the stack's."""
import json
import os
import sys
import threading
import time

import boto3
import botocore


def where(event, context):
    return {
        "sys_path": sys.path,
        "botocore": botocore.__file__,
        "site": "site" in sys.modules,
        "environment": dict(os.environ),
        "remaining_ms": context.get_remaining_time_in_millis(),
        "parent": os.getppid(),
    }


def together(event, context):
    """Returns once `count` invocations are in this one's directory at the same time: only concurrent
    environments can all return."""
    directory = event["directory"]
    open(os.path.join(directory, context.aws_request_id), "w").close()
    deadline = time.monotonic() + 20
    while len(os.listdir(directory)) < event["count"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the other invocations never ran alongside this one")
        time.sleep(0.01)  # a poll of the condition, bounded by the deadline: no event crosses processes
    return os.getpid()


def crash(event, context):
    os._exit(3)


def echo(event, context):
    if event.get("fail"):
        raise ValueError("asked to fail")
    return {"echoed": event}


def invoke_other(event, context):
    """Invokes `name` with `event` as a function does, and returns what Invoke answered."""
    answer = boto3.client("lambda").invoke(
        FunctionName=event["name"], InvocationType="RequestResponse", Payload=json.dumps(event["event"]).encode()
    )
    return {
        "status": answer["StatusCode"],
        "error": answer.get("FunctionError"),
        "payload": json.loads(answer["Payload"].read()),
    }


def block(event, context):
    if event["block"]:
        threading.Event().wait()
    return os.getpid()


def in_turn(event, context):
    """Waits until `until` exists (if given), then writes its `tag` as the next line of `log`."""
    while event.get("until") and not os.path.exists(event["until"]):
        time.sleep(0.01)  # a poll of the condition: the file is the other invocation's word
    with open(event["log"], "a") as log:
        log.write(event["tag"] + "\\n")
    return os.getpid()


def get_session_token(event, context):
    try:
        return boto3.client("sts").get_session_token()
    except botocore.exceptions.ClientError as refused:
        return refused.response["Error"]["Code"]


def create_fleet(event, context):
    try:
        return boto3.client("ec2").create_fleet(**event)
    except botocore.exceptions.ClientError as refused:
        return refused.response["Error"]["Code"]


def leave_behind(event, context):
    """With `answered`: leaves a thread behind that makes an AWS call as the invocation ends (once the
    runtime's bootstrap flushes its output after sending the result, and before it reads its next message)
    and writes what the call answered to `answered`. Returns its process id."""
    if "answered" in event:
        sts = boto3.client("sts")
        ended = threading.Event()

        def call_later():
            ended.wait()
            answer = sts.get_caller_identity()["Account"]
            with open(event["answered"], "w") as answered:
                answered.write(answer)

        caller = threading.Thread(target=call_later, daemon=True)
        caller.start()
        sys.stdout = _TellingOnFlush(sys.stdout, ended, caller)
    return os.getpid()


class _TellingOnFlush:
    """The bootstrap's stdout, whose next flush (the invocation has ended) lets `caller` make its call and
    returns once the call is on its way (the caller inside the bootstrap's channel)."""

    def __init__(self, real, ended, caller):
        self.real, self.ended, self.caller = real, ended, caller

    def __getattr__(self, name):
        return getattr(self.real, name)

    def flush(self):
        sys.stdout = self.real
        self.ended.set()
        deadline = time.monotonic() + 5
        while not self._calling() and time.monotonic() < deadline:
            time.sleep(0.001)  # a poll of the condition: the caller's stack
        return self.real.flush()

    def _calling(self):
        frame = sys._current_frames().get(self.caller.ident)
        while frame is not None:
            if frame.f_code.co_qualname == "_Channel.ask":
                return True
            frame = frame.f_back
        return False


def sts_client(event, context):
    """What an STS client made here resolved, and the botocore data files this environment parsed itself
    for it (the bootstrap, `__main__` here, counts them until its next message)."""
    made = boto3.client("sts")
    credentials = made._request_signer._credentials
    return {
        "region": made.meta.region_name,
        "endpoint": made.meta.endpoint_url,
        "credentials": [credentials.access_key, credentials.token],
        "app_id": made.meta.config.user_agent_appid,
        "parsed_here": list(sys.modules["__main__"]._DATA_FILES._parsed_here),
    }
'''

PRELOAD_READS = '''
import importlib, json, os, sys

sys_path, layers, code = json.loads(sys.argv[1])
sys.path[:0] = sys_path
for name in layers:
    try:
        importlib.import_module(name)
    except Exception:
        pass
reads = []


class Watched(dict):
    """os.environ, noting each variable read (os.getenv reads through it too)."""

    def __init__(self, real):
        self.real = real

    def __getitem__(self, key):
        reads.append(key)
        return self.real[key]

    def get(self, key, default=None):
        reads.append(key)
        return self.real.get(key, default)

    def __contains__(self, key):
        reads.append(key)
        return key in self.real

    def __iter__(self):
        reads.append("*")
        return iter(self.real)

    def keys(self):
        reads.append("*")
        return self.real.keys()

    def items(self):
        reads.append("*")
        return self.real.items()

    def copy(self):
        reads.append("*")
        return self.real.copy()

    def __len__(self):
        return len(self.real)


os.environ = Watched(os.environ)
found = {}
for name in [*code, "runner_pool.observability"]:
    importlib.import_module(name)
    found[name] = sorted(set(reads))
    reads.clear()
print(json.dumps(found))
'''
"""Imports the layer modules, then each code-asset module given and then observability, with os.environ
watched: prints the variables each import read."""


def function_spec(template: Mapping[str, Any], handler: str, name: str) -> FunctionSpec:
    """The function of the template whose handler is `handler`, its variables resolved to the local stack's."""
    (properties,) = [
        resource["Properties"]
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Lambda::Function" and resource["Properties"]["Handler"] == handler
    ]
    variables = properties.get("Environment", {}).get("Variables", {})
    return FunctionSpec(
        name=name,
        handler=handler,
        environment={
            key: value if isinstance(value, str) else LOCAL[key] for key, value in variables.items()
        },
        timeout_seconds=properties.get("Timeout", 3),
        memory_mb=properties.get("MemorySize", 128),
    )


def probe(handler: str, timeout_seconds: float = 30) -> FunctionSpec:
    return FunctionSpec(handler, f"probes.{handler}", {"PROBE": "yes"}, timeout_seconds, 128)


@pytest.fixture(scope="module")
def artifacts() -> Artifacts:
    return host_artifacts()


@pytest.fixture(scope="module")
def aws() -> Iterator[LocalAws]:
    # One local AWS for the module, state machines included: moto's backends are the process's, and a
    # second mock opened and closed here would reset them under this one (its table gone for later tests).
    with local_aws(state_machines=True) as aws:
        create_state_table(aws.client("dynamodb"), TABLE)
        yield aws


@pytest.fixture(scope="module")
def check() -> PolicyCheck:
    return PolicyCheck(StackIam.bound(synthesized_template(), LOCAL, region=REGION, account=ACCOUNT))


@pytest.fixture(scope="module")
def stack(artifacts: Artifacts, aws: LocalAws, check: PolicyCheck) -> Iterator[LambdaRuntime]:
    functions = {"plan": function_spec(synthesized_template(), PLAN, "plan")}
    with LambdaRuntime(artifacts, functions, endpoint=aws.endpoint, policy_check=check) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def probe_artifacts(artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    code = tmp_path_factory.mktemp("probe-asset")
    (code / "probes.py").write_text(textwrap.dedent(PROBES))
    # The shape of f478fe5's aws_xray_sdk: a module only the dev virtualenv has.
    (code / "needs_moto.py").write_text("import moto\n\n\ndef handler(event, context):\n    return 1\n")
    return Artifacts(code, artifacts.layers)


@pytest.fixture(scope="module")
def ec2(aws: LocalAws) -> SimulatedEc2:
    return SimulatedEc2(aws.client("ec2"))


@pytest.fixture(scope="module")
def probes(probe_artifacts: Artifacts, aws: LocalAws, ec2: SimulatedEc2) -> Iterator[LambdaRuntime]:
    functions = {
        "together": probe("together"),
        "create_fleet": probe("create_fleet"),
        "echo": probe("echo"),
        "invoke_other": probe("invoke_other"),
    }
    with LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint, ec2=ec2) as runtime:
        yield runtime


def test_a_real_handler_runs_from_the_artifacts_against_local_aws_and_returns_its_result(
    stack: LambdaRuntime, check: PolicyCheck
) -> None:
    # Given release's Plan as the template defines it, its environment resolved to the local stack
    checked_before = check.checked()

    # When a run-level release is planned
    planned = stack.invoke("plan", {"run_key": "pool=7/class=large", "cause": "run-7-attempt-1"})

    # Then its result comes back; its calls to local AWS were recorded and checked against its role
    assert planned["run_key"] == "pool=7/class=large"
    assert planned["instance_ids"] == []
    assert stack.calls["dynamodb:Query"] >= 1
    assert check.checked() > checked_before
    assert not check.denials(), [denial.explain() for denial in check.denials()]
    assert not stack.faults


def test_a_function_invokes_another_of_the_runtime_as_lambdas_invoke_answers(probes: LambdaRuntime) -> None:
    # Given two functions of one runtime
    # When one invokes the other synchronously, once with an event it answers and once with one it raises on
    answered = probes.invoke("invoke_other", {"name": "echo", "event": {"say": "hi"}})
    failed = probes.invoke("invoke_other", {"name": "echo", "event": {"fail": True}})

    # Then Invoke answered as Lambda's API does: the result as the payload; a raised error still a 200,
    # flagged Unhandled, with Lambda's errorType and errorMessage as the payload
    assert answered == {"status": 200, "error": None, "payload": {"echoed": {"say": "hi"}}}
    assert failed["status"] == 200
    assert failed["error"] == "Unhandled"
    assert failed["payload"]["errorType"] == "ValueError"
    assert failed["payload"]["errorMessage"] == "asked to fail"
    assert probes.calls["lambda:Invoke"] == 2


@pytest.mark.parametrize("started", ["anew", "forked"])
def test_an_environment_holds_the_code_asset_and_layers_alone_and_lambdas_variables(
    probe_artifacts: Artifacts, aws: LocalAws, started: str
) -> None:
    # Given a runtime whose environments start anew, or fork from the fork server once one environment
    # (this one's or an earlier runtime's) has cold-started
    functions = {name: replace(probe("where"), name=name) for name in ("first", "later")}
    fork_server = started == "forked"
    with LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint, fork_server=fork_server) as runtime:
        # When a probe reports what its interpreter sees
        seen = runtime.invoke("first", {})
        if started == "forked":
            seen = runtime.invoke("later", {})

    # Then it is this process's child, or the fork server's
    assert (seen["parent"] == os.getpid()) == (started == "anew")
    # And its path is the code asset, the layer and the standard library; botocore is the layer's
    stdlib = [p for p in seen["sys_path"] if p not in probe_artifacts.sys_path]
    assert seen["sys_path"][: len(probe_artifacts.sys_path)] == probe_artifacts.sys_path
    assert not [p for p in stdlib if "site-packages" in p], stdlib
    assert seen["botocore"].startswith(str(probe_artifacts.layers[0] / "python"))
    assert not seen["site"]
    # And its environment is its function's, Lambda's and local AWS's, nothing of this process's
    environment = seen["environment"]
    assert environment["PROBE"] == "yes"
    assert environment["AWS_LAMBDA_FUNCTION_NAME"] == ("first" if started == "anew" else "later")
    assert environment["_HANDLER"] == "probes.where"
    assert environment["AWS_ENDPOINT_URL"] == aws.endpoint
    assert environment["_X_AMZN_TRACE_ID"].startswith("Root=1-")
    assert "PYTEST_CURRENT_TEST" not in environment
    assert 0 < seen["remaining_ms"] <= 30_000


def of_the_code_asset(modules: list[str], artifacts: Artifacts) -> list[str]:
    """Those of `modules` that the function's code asset holds (the rest are the layers')."""
    packages = {entry.name for entry in artifacts.code.iterdir()}
    return [name for name in modules if name.split(".")[0] in packages]


def preloaded_after_a_first_environment(
    stack: LambdaRuntime, artifacts: Artifacts
) -> tuple[list[str], list[str]]:
    """Once a first environment of a real handler has cold-started: the fork server's preload, and those of
    its modules the function's code asset holds."""
    stack.invoke("plan", {"run_key": "pool=6/class=large", "cause": "run-6-attempt-1"})
    preload = fork_server_preload(artifacts)
    assert preload is not None
    return preload, of_the_code_asset(preload, artifacts)


def test_the_fork_server_preloads_of_the_code_asset_only_the_domain_modules_a_first_environment_loaded(
    stack: LambdaRuntime, artifacts: Artifacts
) -> None:
    # Given a first environment of a real handler (this runtime's or an earlier one's) has cold-started
    # When the fork server's preload is read
    preload, code = preloaded_after_a_first_environment(stack, artifacts)

    # Then of the code asset it holds only modules of PRELOADED_CODE, the domain's Plan imports among them
    assert PRELOADED_CODE == ("runner_pool.domain",)
    assert {"runner_pool.domain.executions", "runner_pool.domain.config"} <= set(code)
    assert [name for name in code if not name.startswith("runner_pool.domain.")] == ["runner_pool.domain"]
    # And none of what reads the function's environment at import, nor the handler's module, is there
    for name in ("runner_pool.handlers.release", "runner_pool.wiring", "runner_pool.observability"):
        assert name not in preload
    # And every layer module is still there
    assert {"boto3", "pydantic", "aws_lambda_powertools"} <= set(preload)


def test_importing_the_preloaded_code_reads_no_variable_of_the_functions_environment(
    stack: LambdaRuntime, artifacts: Artifacts
) -> None:
    # Given the fork server's preload once a first environment has loaded: the layer modules, and the
    # code asset's PRELOADED_CODE modules
    preload, code = preloaded_after_a_first_environment(stack, artifacts)
    layers = [name for name in preload if name not in code]

    # When each code module is imported after the layers, as the fork server does, with os.environ watched
    found = subprocess.run(  # noqa: S603 - this interpreter, as an environment runs
        [sys.executable, "-S", "-I", "-c", PRELOAD_READS, json.dumps([artifacts.sys_path, layers, code])],
        capture_output=True,
        text=True,
        check=True,
        cwd=artifacts.code,
        env={"PATH": os.environ.get("PATH", "")},
    )
    reads = json.loads(found.stdout)

    # Then no code module read a variable but pydantic's plugin switch (read as each model is built)
    assert {name: read for name, read in reads.items() if set(read) - {"PYDANTIC_DISABLE_PLUGINS"}} == {
        "runner_pool.observability": reads["runner_pool.observability"]
    }
    # And that switch picks among pydantic plugins, of which the layer has none: it cannot change a model
    plugins = [
        entry
        for layer in artifacts.layers
        for distribution in importlib.metadata.distributions(path=[str(layer / "python")])
        for entry in distribution.entry_points
        if entry.group == "pydantic"
    ]
    assert plugins == []
    # And the watch sees reads: observability's Powertools objects read theirs, why it is not preloaded
    assert "POWERTOOLS_SERVICE_NAME" in reads["runner_pool.observability"]


def test_a_forked_environment_takes_botocores_parsed_files_and_resolves_its_own_client_settings(
    probe_artifacts: Artifacts, aws: LocalAws
) -> None:
    # Given an environment that made an STS client (and reported the botocore files it parsed for it),
    # in a runtime of one region and endpoint, with its own session token and user agent app id
    first = replace(
        probe("sts_client"),
        name="first",
        environment={"AWS_SESSION_TOKEN": "first", "AWS_SDK_UA_APP_ID": "one"},
    )
    later = replace(
        first, name="later", environment={"AWS_SESSION_TOKEN": "later", "AWS_SDK_UA_APP_ID": "two"}
    )
    with LambdaRuntime(probe_artifacts, {"first": first}, endpoint=aws.endpoint) as runtime:
        made_first = runtime.invoke("first", {})

    # When an environment of another function, in a runtime of another region and endpoint, is forked
    # from the same fork server and makes an STS client
    elsewhere = "http://127.0.0.1:9"
    with LambdaRuntime(probe_artifacts, {"later": later}, endpoint=elsewhere, region="eu-west-1") as runtime:
        made_later = runtime.invoke("later", {})

    # Then it parsed none of botocore's files itself: the fork server had them parsed
    assert made_later["parsed_here"] == []
    # And its client has its own region, endpoint, credentials and user agent, the first its own
    assert made_later["region"] == "eu-west-1"
    assert made_later["endpoint"] == elsewhere
    assert made_later["credentials"] == ["local", "later"]
    assert made_later["app_id"] == "two"
    assert made_first["region"] == REGION
    assert made_first["endpoint"] == aws.endpoint
    assert made_first["credentials"] == ["local", "first"]
    assert made_first["app_id"] == "one"


def test_a_handler_error_comes_back_with_its_error_type_and_keeps_the_environment(
    stack: LambdaRuntime,
) -> None:
    # Given plan's environment, warm
    stack.invoke("plan", {"run_key": "pool=8", "cause": "run-8-attempt-1"})
    started = stack.environments("plan")

    # When it is invoked with an event its model refuses
    with pytest.raises(FunctionError) as failed:
        stack.invoke("plan", {"run_key": "", "cause": "run-8-attempt-1"})

    # Then the error is pydantic's, by the name Step Functions matches; the environment serves on
    assert type(failed.value).__name__ == "ValidationError"
    assert failed.value.payload["errorType"] == "ValidationError"
    assert "run_key" in failed.value.payload["errorMessage"]
    stack.invoke("plan", {"run_key": "pool=8", "cause": "run-8-attempt-1"})
    assert stack.environments("plan") == started


def test_concurrent_invocations_start_an_environment_each_and_later_ones_reuse_them(
    probes: LambdaRuntime, tmp_path: Path
) -> None:
    count = 3

    def round_of(directory: Path) -> set[int]:
        directory.mkdir()
        with ThreadPoolExecutor(max_workers=count) as pool:
            return set(
                pool.map(
                    lambda _: probes.invoke("together", {"directory": str(directory), "count": count}),
                    range(count),
                )
            )

    # When three invocations must all be running at once to return
    first = round_of(tmp_path / "first")

    # Then three environments served them
    assert len(first) == count
    assert probes.environments("together") == count

    # And three more, later, are served by the same environments: no cold start
    second = round_of(tmp_path / "second")
    assert second == first
    assert probes.environments("together") == count


def test_an_invocation_past_the_accounts_concurrency_is_throttled_and_runs_nothing(
    probe_artifacts: Artifacts, aws: LocalAws, tmp_path: Path
) -> None:
    # Given an account whose concurrency quota is 1, and one invocation in flight (held until `gate` exists)
    gate, log = tmp_path / "gate", tmp_path / "log"
    functions = {"in_turn": probe("in_turn"), "where": probe("where")}
    with (
        LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint, concurrency=1) as runtime,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        held = pool.submit(runtime.invoke, "in_turn", {"until": str(gate), "log": str(log), "tag": "held"})
        quota = runtime.concurrency
        assert quota is not None
        eventually(lambda: quota.in_flight == 1, "the first invocation in flight")

        # When another function is invoked / Then Lambda refuses it at once, whatever function it is
        with pytest.raises(ThrottledError, match="concurrency of 1"):
            runtime.invoke("where", {})
        assert quota.throttled == 1

        # And once the first has returned, the account's concurrency is free again
        gate.touch()
        held.result(timeout=30)
        assert runtime.invoke("where", {})["environment"]["PROBE"] == "yes"
        assert log.read_text() == "held\n"


def test_a_call_the_deployed_policy_lacks_is_denied_and_reported(artifacts: Artifacts, aws: LocalAws) -> None:
    # Given the template less Plan's PutItem (the run-finished mark a run-level release writes)
    template = without_grant(synthesized_template(), PLAN, "dynamodb:PutItem")
    check = PolicyCheck(StackIam.bound(template, LOCAL, region=REGION, account=ACCOUNT))
    functions = {"plan": function_spec(template, PLAN, "plan")}

    # When Plan runs a run-level release
    with (
        LambdaRuntime(artifacts, functions, endpoint=aws.endpoint, policy_check=check) as runtime,
        pytest.raises(FunctionError),
    ):
        runtime.invoke("plan", {"run_key": "pool=9", "cause": "run-9-attempt-1"})

    # Then the call was answered AccessDenied, and the check names the statement it lacks
    (denied,) = check.denials()
    assert denied.principal == PLAN
    assert denied.operation == "dynamodb:PutItem"
    assert f"lacks: Allow dynamodb:PutItem on arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}" in (
        denied.explain()
    )


def test_create_fleet_is_answered_by_the_simulated_ec2(probes: LambdaRuntime, ec2: SimulatedEc2) -> None:
    # Given a simulated EC2 that refuses its next CreateFleet (local EC2 would answer otherwise)
    ec2.fail_next(1, "RequestLimitExceeded")

    # When a function calls CreateFleet
    code = probes.invoke(
        "create_fleet",
        {
            "Type": "instant",
            "LaunchTemplateConfigs": [
                {"LaunchTemplateSpecification": {"LaunchTemplateId": "lt-0abc", "Version": "$Default"}}
            ],
            "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "spot"},
        },
    )

    # Then the simulator answered it
    assert code == "RequestLimitExceeded"
    assert ec2.calls["CreateFleet"] == 1
    assert probes.calls["ec2:CreateFleet"] == 1


@pytest.mark.parametrize("started", ["anew", "forked"])
def test_a_dependency_the_layer_lacks_fails_the_cold_start_as_lambda_reports_it(
    probe_artifacts: Artifacts, aws: LocalAws, started: str
) -> None:
    # Given a function whose module imports what only the dev virtualenv has, its environment started
    # anew or forked from the fork server (once another function's first environment has cold-started)
    functions = {
        "needs_moto": FunctionSpec("needs_moto", "needs_moto.handler", {}, 3, 128),
        "block": probe("block"),
    }
    with LambdaRuntime(
        probe_artifacts, functions, endpoint=aws.endpoint, fork_server=started == "forked"
    ) as runtime:
        runtime.invoke("block", {"block": False})

        # When it is invoked
        with pytest.raises(FunctionError) as failed:
            runtime.invoke("needs_moto", {})

        # Then the invocation fails as Lambda's Python runtime reports an init failure
        assert type(failed.value).__name__ == "Runtime.ImportModuleError"
        assert (
            failed.value.payload["errorMessage"]
            == "Unable to import module 'needs_moto': No module named 'moto'"
        )
        assert not [e for e in runtime.live() if e.spec.name == "needs_moto"]


@pytest.mark.parametrize("started", ["anew", "forked"])
def test_an_invocation_past_its_timeout_kills_the_environment_and_the_next_gets_a_new_one(
    probe_artifacts: Artifacts, aws: LocalAws, started: str
) -> None:
    # Given a warm environment of a function with a one-second timeout
    functions = {"block": probe("block", timeout_seconds=1), "other": replace(probe("block"), name="other")}
    with LambdaRuntime(
        probe_artifacts, functions, endpoint=aws.endpoint, fork_server=started == "forked"
    ) as runtime:
        runtime.invoke("other", {"block": False})  # the first environment: the fork server's preload
        first = runtime.invoke("block", {"block": False})

        # When an invocation runs past the timeout
        with pytest.raises(FunctionError) as failed:
            runtime.invoke("block", {"block": True})

        # Then it fails as Lambda reports a timeout, and the environment is gone
        assert type(failed.value).__name__ == "Sandbox.Timedout"
        assert "Task timed out after 1.00 seconds" in failed.value.payload["errorMessage"]
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)
        # And the next invocation is served by a new environment
        assert runtime.invoke("block", {"block": False}) != first
        assert runtime.environments("block") == 2


def test_closing_the_runtime_ends_every_environment(probe_artifacts: Artifacts, aws: LocalAws) -> None:
    # Given a runtime with a warm environment
    runtime = LambdaRuntime(probe_artifacts, {"block": probe("block")}, endpoint=aws.endpoint)
    pid = runtime.invoke("block", {"block": False})

    # When it is closed
    runtime.close()

    # Then its environments are gone, and it invokes nothing more
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        runtime.invoke("block", {"block": False})


def test_past_the_total_cap_the_least_recently_used_idle_environment_makes_room(
    probe_artifacts: Artifacts, aws: LocalAws
) -> None:
    # Given a runtime that may hold one environment in all, warm for one function
    functions = {name: replace(probe("block"), name=name) for name in ("first", "second")}
    with LambdaRuntime(
        probe_artifacts, functions, endpoint=aws.endpoint, max_total_environments=1
    ) as runtime:
        first = runtime.invoke("first", {"block": False})

        # When another function is invoked
        second = runtime.invoke("second", {"block": False})

        # Then the idle environment was shut down to make room for the new one
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)
        assert [environment.pid for environment in runtime.live()] == [second]


def test_invocations_waiting_for_a_function_s_environments_go_on_one_each_in_the_order_they_came(
    probe_artifacts: Artifacts, aws: LocalAws, tmp_path: Path
) -> None:
    # Given a function that may have one environment, busy with an invocation that holds it until told
    log, until = tmp_path / "log", tmp_path / "go"
    with (
        LambdaRuntime(
            probe_artifacts, {"in_turn": probe("in_turn")}, endpoint=aws.endpoint, max_environments=1
        ) as runtime,
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        invoked = [pool.submit(runtime.invoke, "in_turn", {"tag": "0", "log": str(log), "until": str(until)})]
        eventually(lambda: runtime.environments("in_turn") == 1, "the first invocation's environment")

        def waiting(count: int) -> Callable[[], bool]:
            return lambda: runtime.waiting() == count

        # When three more come one after another, each waiting its turn
        for tag in "123":
            invoked.append(pool.submit(runtime.invoke, "in_turn", {"tag": tag, "log": str(log)}))
            eventually(waiting(int(tag)), f"invocation {tag} waiting")
        until.touch()

        # Then each went on in the order it came, in the one environment
        pids = {future.result(timeout=60) for future in invoked}
        assert log.read_text().split() == ["0", "1", "2", "3"]
        assert len(pids) == 1
        assert runtime.environments("in_turn") == 1


def test_an_invocation_waiting_for_an_environment_fails_when_the_runtime_closes(
    probe_artifacts: Artifacts, aws: LocalAws, tmp_path: Path
) -> None:
    # Given a function's one environment held, and an invocation waiting for it
    runtime = LambdaRuntime(
        probe_artifacts, {"block": probe("block")}, endpoint=aws.endpoint, max_environments=1
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(runtime.invoke, "block", {"block": True})
        eventually(lambda: runtime.environments("block") == 1, "the environment held")
        waiting = pool.submit(runtime.invoke, "block", {"block": False})
        eventually(lambda: runtime.waiting() == 1, "an invocation waiting")

        # When the runtime closes
        runtime.close()

        # Then the waiting invocation is told so rather than left waiting
        with pytest.raises(RuntimeError, match="closed"):
            waiting.result(timeout=30)


def test_warming_starts_an_environment_per_function_before_any_invocation(
    probe_artifacts: Artifacts, aws: LocalAws
) -> None:
    # Given a runtime of two functions, one of which cannot import
    functions = {
        "block": probe("block"),
        "needs_moto": FunctionSpec("needs_moto", "needs_moto.handler", {}, 3, 128),
    }
    with LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint) as runtime:
        # When both are warmed / Then the one that cannot import fails there, as its invocation would
        with pytest.raises(FunctionError, match="No module named 'moto'"):
            runtime.warm()

        # And the other's environment is ready: its first invocation starts none
        assert runtime.environments("block") == 1
        runtime.invoke("block", {"block": False})
        assert runtime.environments("block") == 1


def test_a_call_the_service_cannot_answer_fails_the_call_and_is_reported(
    probe_artifacts: Artifacts, aws: LocalAws, check: PolicyCheck
) -> None:
    # Given a function checked against Plan's role, calling an operation the IAM check has no row for
    functions = {"get_session_token": probe("get_session_token")}
    with LambdaRuntime(
        probe_artifacts,
        functions,
        endpoint=aws.endpoint,
        policy_check=check,
        principal_of=lambda _spec: check.iam.function(PLAN),
    ) as runtime:
        # When it makes the call
        code = runtime.invoke("get_session_token", {})

        # Then the call fails instead of reaching local AWS unchecked, and the fault fails the test
        assert code == "EmulatorFault"
        with pytest.raises(AssertionError, match="sts:GetSessionToken: UnmappedCallError"):
            runtime.assert_no_faults()


def test_step_functions_catches_a_timeout_by_the_name_lambda_reports(
    probe_artifacts: Artifacts, aws: LocalAws
) -> None:
    # Given a state machine that retries a timed-out task once, then catches it, on moto's interpreter
    definition = {
        "StartAt": "Run",
        "States": {
            "Run": {
                "Type": "Task",
                "Resource": "${BlockArn}",
                "Retry": [{"ErrorEquals": ["Sandbox.Timedout"], "MaxAttempts": 1}],
                "Catch": [{"ErrorEquals": ["Sandbox.Timedout"], "Next": "TimedOut", "ResultPath": "$.error"}],
                "End": True,
            },
            "TimedOut": {"Type": "Pass", "End": True},
        },
    }
    functions = {"block": probe("block", timeout_seconds=1)}
    with (
        without_waiting(),
        LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint) as runtime,
        lambdas_in_process({"block": runtime.handler("block")}) as invocations,
    ):
        machines = LocalStateMachines(aws.client("stepfunctions"), aws.client("lambda"), aws.client("iam"))
        arn = machines.create_functions(["block"])["block"]
        machine = machines.create("timeouts", json.dumps(definition).replace("${BlockArn}", arn))

        # When its task runs past the function's timeout, twice
        execution = machines.run(machine, {"block": True})

    # Then the Retry and the Catch matched the error by Lambda's name for it
    assert execution.status == "SUCCEEDED"
    assert execution.output["error"]["Error"] == "Sandbox.Timedout"
    assert len(invocations.of("block")) == 2


def test_an_environment_that_exits_mid_invocation_fails_it_as_lambda_reports_it(
    probe_artifacts: Artifacts, aws: LocalAws
) -> None:
    # Given a function whose handler ends its process
    functions = {"crash": probe("crash")}
    with LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint, fork_server=False) as runtime:
        # When it is invoked twice
        for _ in range(2):
            with pytest.raises(FunctionError) as failed:
                runtime.invoke("crash", {})

            # Then each invocation fails as Lambda reports a runtime that exited
            assert type(failed.value).__name__ == "Runtime.ExitError"
            assert "Runtime exited with error: exit status 3" in failed.value.payload["errorMessage"]
        # And each had an environment of its own
        assert runtime.environments("crash") == 2


def test_a_call_a_thread_makes_as_its_invocation_ends_waits_for_the_next_invocation_and_never_takes_its_place(
    probe_artifacts: Artifacts, aws: LocalAws, tmp_path: Path
) -> None:
    # Given invocations that each leave a thread behind making an AWS call as the invocation ends
    functions = {"leave_behind": probe("leave_behind", timeout_seconds=10)}
    with LambdaRuntime(probe_artifacts, functions, endpoint=aws.endpoint) as runtime:
        first = runtime.invoke("leave_behind", {})
        for turn in range(5):
            answered = tmp_path / f"answered-{turn}"
            # When the next invocation comes while such a call waits (the environment frozen, on AWS)
            assert runtime.invoke("leave_behind", {"answered": str(answered)}) == first
            (environment,) = runtime.live()
            eventually(environment.pending, "the thread's call to reach the runtime")
            # Then it runs in the same environment and returns, and the waiting call is answered then
            # (background work left running "resume[s] if Lambda reuses the execution environment", Lambda
            # Developer Guide, lambda-runtime-environment.html), not mistaken for the invocation's own messages
            assert runtime.invoke("leave_behind", {}) == first
            eventually(answered.exists, "the thread's call to be answered")
            assert answered.read_text() == ACCOUNT


def test_an_invocation_in_flight_is_listed_and_its_stacks_can_be_dumped(
    probe_artifacts: Artifacts, aws: LocalAws
) -> None:
    # Given an invocation that blocks
    with (
        LambdaRuntime(
            probe_artifacts, {"block": probe("block", timeout_seconds=10)}, endpoint=aws.endpoint
        ) as runtime,
        ThreadPoolExecutor(1) as pool,
    ):
        blocked = pool.submit(runtime.invoke, "block", {"block": True})
        eventually(runtime.in_flight, "the invocation to be in flight")
        # When its environment's stacks are asked for
        (dump,) = runtime.stacks(older_than=0).values()
        # Then the invocation is listed, and the dump shows where its handler waits
        (running,) = runtime.in_flight()
        assert running.startswith("block for ")
        assert any("in block" in line for line in dump), dump
        # And the invocation still ends as it would have (here, at its timeout)
        with pytest.raises(FunctionError):
            blocked.result()


def test_starts_at_once_before_any_has_loaded_wait_for_the_first_and_fork(
    probe_artifacts: Artifacts, aws: LocalAws, tmp_path: Path
) -> None:
    # Given artifacts no environment of this process has started from yet, and four functions of them
    code = tmp_path / "asset"
    code.mkdir()
    (code / "probes.py").write_text(textwrap.dedent(PROBES))
    fresh = Artifacts(code, probe_artifacts.layers)
    names = ("one", "two", "three", "four")
    functions = {name: replace(probe("where"), name=name) for name in names}
    with LambdaRuntime(fresh, functions, endpoint=aws.endpoint) as runtime:
        # When all four start at once (warming, as a world does)
        runtime.warm()
        seen = [runtime.invoke(name, {}) for name in names]

    # Then one started anew, and the others, having waited for it, forked from the fork server it made
    assert sorted(s["parent"] == os.getpid() for s in seen) == [False, False, False, True]
    # And each is its own function's environment all the same
    assert sorted(s["environment"]["AWS_LAMBDA_FUNCTION_NAME"] for s in seen) == sorted(names)
