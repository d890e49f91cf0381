"""The stack on local AWS, from the synthesized template: one builder for the tests, the emulator and the
benchmarks.

How it goes, step by step:

1. The template. `synthesized_template()` (emulator/template.py) is what `cdk synth` makes of app.py,
   cached once for the repository. `StackTemplate` reads from it what a harness deploys: each of our
   Lambda functions (handler string, environment as CDK wrote it, role, timeout, memory) and each state
   machine (its definition, which is the ASL file as deployed, and the function each `${...}`
   placeholder names, from its DefinitionSubstitutions). No rule of ours turns a placeholder into a
   handler here: the template says which function it is, and the function says its handler.
2. The resources. `LocalStack` creates on local AWS (moto in-process under `mock_aws`, or moto's
   server) the parts a harness needs: `create_state_table`, `create_instance_resources` (pool queues,
   runner credentials key, network, launch templates, the App's private key), `create_ingress_resources`
   (idempotency table, demand queue, webhook secret) and `create_state_machine(machine)` (a local Lambda
   function for each of its tasks, and the machine with its placeholders filled with their ARNs). Each
   part notes what it gives the functions in `given` (ControlPlaneSettings fields).
3. The binding. What the local stack gives is matched with every function's environment in the
   template (emulator/iam_stack.py `Bindings`), which binds each logical id to its local name and fails
   when a local value does not have the template's shape or is a variable CDK gives no function. Then
   `function(name)` is a `FunctionSpec`: the function's variables exactly as the template lists them,
   with the local values. A variable CDK does not give a function is missing here too.
4. Running. `with stack.running(clients=...):` attaches the IAM check (every call a function makes is
   checked against its role in the template), installs a ControlPlane with everything the local stack
   gives for the harness's own use (`stack.plane`), and starts a `Runtime` that invokes functions by
   name (`stack.invoke`, `stack.handler`). The default, `InProcess`, calls the handler in this process
   as the function: under its role for the IAM check, with a ControlPlane of its own built from its
   FunctionSpec's environment as its Lambda builds one at cold start, and with the clients, clock,
   GitHub App and pause of the harness's plane, so call counting, fault injection and the simulated
   CreateFleet reach every function. Another runtime (functions run from the built artifacts in
   subprocesses) plugs in with `running(runtime=lambda stack: TheRuntime(..., stack.functions()))`.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_settings import EnvSettingsSource

from emulator import iam_check
from emulator.aws import ACCOUNT, REGION
from emulator.iam_stack import BindingError, Bindings, StackIam, checked_template
from emulator.resources import (
    create_demand_queue,
    create_idempotency_table,
    create_launch_templates,
    create_network,
    create_pool_queues,
    create_state_table,
)
from emulator.step_functions import (
    AccountConcurrency,
    Handler,
    LambdaContext,
    LocalStateMachines,
    function_arn,
    substitute,
)
from emulator.template import STACK_ID
from runner_pool.adapters.backoff import Backoff
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.domain import notices
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.pool_partitions import queue_name_prefix
from runner_pool.environment import ENV_PREFIX, ControlPlaneSettings
from runner_pool.wiring import ClientFactory, ControlPlane, invoked_with, use_control_plane

ACCOUNT_THROTTLE = (5000, 10000.0)
"""A stage method with no throttle of its own has the account's Regional one: 10,000 requests a second,
a burst of 5,000 (API Gateway quotas, limits.html, "Throttle quota per account, per Region")."""
JOB_LOG_GROUP_OUTPUT = "JobLogGroupName"
HANDLERS = "runner_pool.handlers."
"""The package of our handlers: a function whose handler is elsewhere (CDK's own) is not ours to run."""


# --- what the template says -------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function of the stack, as a runtime needs it to run the function."""

    name: str
    """The local function's name: `<module>-<function>` (`provision-begin`), or the module's alone when it
    has one function (`webhook`, `dispatcher`, `refresh`)."""
    logical_id: str
    handler: str
    """As the template gives it: `runner_pool.handlers.<module>.<function>`."""
    environment: Mapping[str, str]
    """The function's variables exactly as the template lists them, with the local stack's values."""
    role: str
    """The logical id of its execution role in the template."""
    timeout_seconds: int
    memory_mb: int


@dataclass(frozen=True)
class StateMachineSpec:
    logical_id: str
    machine: str
    """The machine by its ASL file's and handler module's name: `provision`."""
    name: str
    """Its local name: the one the template fixes (the provision steps' roles name their own machine's
    ARN by it), else `machine`."""
    definition: str
    """The definition as the template deploys it, `${...}` placeholders unfilled."""
    functions: Mapping[str, str]
    """Each placeholder → the name of the function it stands for."""


class StackTemplate:
    """Our functions and state machines, as the template declares them."""

    def __init__(self, template: Mapping[str, Any]) -> None:
        self.template = template
        self.resources: Mapping[str, Any] = template["Resources"]
        ours = {
            logical: resource
            for logical, resource in self.resources.items()
            if resource["Type"] == "AWS::Lambda::Function"
            and resource["Properties"].get("Handler", "").startswith(HANDLERS)
        }
        handlers = {logical: resource["Properties"]["Handler"] for logical, resource in ours.items()}
        modules = Counter(_module(handler) for handler in handlers.values())
        self._logical_ids = {
            _local_name(handler, single=modules[_module(handler)] == 1): logical
            for logical, handler in handlers.items()
        }

    def function_names(self) -> list[str]:
        return sorted(self._logical_ids)

    def properties(self, name: str) -> Mapping[str, Any]:
        if name not in self._logical_ids:
            raise LookupError(f"the synthesized template has no function {name!r}")
        properties: Mapping[str, Any] = self.resources[self._logical_ids[name]]["Properties"]
        return properties

    def logical_id(self, name: str) -> str:
        self.properties(name)
        return str(self._logical_ids[name])

    def environment(self, name: str) -> Mapping[str, Any]:
        """The function's environment as the template gives it: literals and intrinsic functions."""
        variables: Mapping[str, Any] = self.properties(name).get("Environment", {}).get("Variables", {})
        return variables

    def name_of(self, logical_id: str) -> str:
        return next(name for name, logical in self._logical_ids.items() if logical == logical_id)

    def variables(self) -> set[str]:
        """Every variable the template gives any of our functions."""
        return {variable for name in self._logical_ids for variable in self.environment(name)}

    def variable_naming(self, logical_id: str) -> str:
        """The variable whose value is `logical_id`'s Ref (a state machine's ARN, a queue's URL)."""
        for name in self._logical_ids:
            for variable, expression in self.environment(name).items():
                if expression == {"Ref": logical_id}:
                    return variable
        raise LookupError(f"no function of the template is told {logical_id}")

    def event_source(self, name: str) -> tuple[int, float]:
        """(BatchSize, MaximumBatchingWindowInSeconds) of the SQS event source mapping that invokes the
        function `name`, with Lambda's defaults for what the template leaves out (10 and 0 s,
        services-sqs-parameters.html)."""
        logical_id = self.logical_id(name)
        for resource in self.resources.values():
            properties = resource["Properties"]
            if resource["Type"] == "AWS::Lambda::EventSourceMapping" and properties.get("FunctionName") == {
                "Ref": logical_id
            }:
                return int(properties.get("BatchSize", 10)), float(
                    properties.get("MaximumBatchingWindowInSeconds", 0)
                )
        raise LookupError(f"the synthesized template maps no event source to {name!r}")

    def rule_retries(self, name: str) -> int:
        """The MaximumRetryAttempts of the EventBridge rules' targets that invoke the function `name` (the
        fewest, where several do), or EventBridge's default of 185 (AWS::Events::Rule RetryPolicy)."""
        arn = {"Fn::GetAtt": [self.logical_id(name), "Arn"]}
        retries = [
            int(target.get("RetryPolicy", {}).get("MaximumRetryAttempts", 185))
            for resource in self.resources.values()
            if resource["Type"] == "AWS::Events::Rule"
            for target in resource["Properties"].get("Targets", [])
            if target["Arn"] == arn
        ]
        if not retries:
            raise LookupError(f"the synthesized template has no rule that invokes {name!r}")
        return min(retries)

    def method_throttle(self, name: str) -> tuple[int, float]:
        """(ThrottlingBurstLimit, ThrottlingRateLimit) that the stage of the REST API whose method proxies
        to the function `name` applies to that method: its own MethodSettings entry, else the stage's
        `/*` `*` one, else the account's Regional limits. (CloudFormation's AWS::ApiGateway::Stage
        MethodSetting: "/resource/subresource must be encoded as /~1resource~1subresource", and "/*"
        with "*" sets every resource and method.)"""
        method_id, method = self._proxy_method(self.logical_id(name))
        path = self._resource_path(method["ResourceId"])
        wanted = ("/" + path.replace("/", "~1"), method["HttpMethod"])
        for resource in self.resources.values():
            properties = resource["Properties"]
            if resource["Type"] != "AWS::ApiGateway::Stage" or properties["RestApiId"] != method["RestApiId"]:
                continue
            settings = {(s["ResourcePath"], s["HttpMethod"]): s for s in properties.get("MethodSettings", [])}
            found = settings.get(wanted) or settings.get(("/*", "*"))
            if found is None:
                return ACCOUNT_THROTTLE
            return int(found["ThrottlingBurstLimit"]), float(found["ThrottlingRateLimit"])
        raise LookupError(f"the synthesized template deploys {method_id}'s API to no stage")

    def _proxy_method(self, function_logical_id: str) -> tuple[str, Mapping[str, Any]]:
        for logical, resource in self.resources.items():
            if resource["Type"] == "AWS::ApiGateway::Method" and {
                "Fn::GetAtt": [function_logical_id, "Arn"]
            } in _parts(resource["Properties"].get("Integration", {}).get("Uri")):
                return logical, resource["Properties"]
        raise LookupError(f"no method of the synthesized template proxies to {function_logical_id}")

    def _resource_path(self, resource_id: Mapping[str, Any]) -> str:
        """`/webhook` for a method's ResourceId: a Ref to an AWS::ApiGateway::Resource, up its parents to
        the API's root (a GetAtt of RootResourceId)."""
        if "Ref" not in resource_id:
            return "/"
        properties = self.resources[resource_id["Ref"]]["Properties"]
        parent = self._resource_path(properties["ParentId"])
        return f"{parent.rstrip('/')}/{properties['PathPart']}"

    def state_machine(self, machine: str) -> StateMachineSpec:
        """The state machine whose tasks are the handlers of `runner_pool.handlers.<machine>`."""
        for logical, resource in self.resources.items():
            if resource["Type"] != "AWS::StepFunctions::StateMachine":
                continue
            properties = resource["Properties"]
            functions = {
                placeholder: self.name_of(target["Fn::GetAtt"][0])
                for placeholder, target in properties.get("DefinitionSubstitutions", {}).items()
                if isinstance(target, Mapping) and "Fn::GetAtt" in target
            }
            modules = {_module(self.properties(name)["Handler"]) for name in functions.values()}
            if modules != {machine}:
                continue
            definition = properties["DefinitionString"]
            if not isinstance(definition, str):
                raise ValueError(f"{logical}'s definition is not a literal: {definition!r}")
            return StateMachineSpec(
                logical, machine, properties.get("StateMachineName", machine), definition, functions
            )
        raise LookupError(f"the synthesized template has no state machine of {HANDLERS}{machine}")


def _parts(expression: Any) -> list[Any]:
    """The parts of an `Fn::Join` (an integration's URI), or the expression itself."""
    if isinstance(expression, Mapping) and "Fn::Join" in expression:
        parts: list[Any] = expression["Fn::Join"][1]
        return parts
    return [expression]


def _module(handler: str) -> str:
    return handler.removeprefix(HANDLERS).rsplit(".", 1)[0]


TOKEN_HANDLER = f"{HANDLERS}github_token.github_token"
"""The token function's handler (infra/constructs/github_tokens.py): the one function of its module."""


def _local_name(handler: str, *, single: bool) -> str:
    module, function = handler.removeprefix(HANDLERS).rsplit(".", 1)
    return module if single else f"{module}-{function}"


# --- the stack on local AWS -------------------------------------------------------------------------


class Runtime(Protocol):
    """How the local stack's functions are run: invoked by name, as Lambda's Invoke does."""

    def invoke(self, name: str, event: Any, context: Any) -> Any: ...


RuntimeFactory = Callable[["LocalStack"], AbstractContextManager[Runtime]]


@dataclass(frozen=True)
class DeployedMachine:
    spec: StateMachineSpec
    arn: str
    machines: LocalStateMachines
    """What runs executions of it to the end (and starts or waits for them)."""


def template_overrides(config: StackConfig) -> str:
    """What of `config` the template must be synthesised with, beyond cdk.json's (JSON; empty for none):
    several Apps (the template grants each App's secrets), classes with Session Manager (the template has
    their launch templates and role)."""
    overrides: dict[str, Any] = {}
    apps = config.github.every_app
    if len(apps) > 1:
        overrides["github"] = {"apps": [app.model_dump() for app in apps], "scope": str(config.github.scope)}
    if config.session_classes:
        overrides["resource_classes"] = config.model_dump(mode="json")["resource_classes"]
    return json.dumps(overrides, sort_keys=True) if overrides else ""


class LocalStack:
    """The synthesized stack's resources on local AWS, bound to the template, and its functions run."""

    def __init__(
        self,
        config: StackConfig,
        clients: ClientFactory,
        *,
        stack_name: str,
        template: Mapping[str, Any] | None = None,
    ) -> None:
        """`clients` are the harness's own, for creating the resources: neither counted nor checked."""
        self.config = config
        self.stack_name = stack_name
        if template is None:
            template = checked_template(template_overrides(config))
        self.template = StackTemplate(template)
        self._clients = clients
        self.given: dict[str, Any] = {
            "table_name": f"{stack_name}-state",
            "stack_name": stack_name,
            "config": config,
            "account_id": ACCOUNT,
            # The token function is invoked by its local name, as the template names it to the others.
            "github_token_function_name": _local_name(TOKEN_HANDLER, single=True),
        }
        self.bindings = Bindings("aws", REGION, ACCOUNT, self.template.resources)
        self.machines: dict[str, DeployedMachine] = {}
        self._state_machines: LocalStateMachines | None = None
        self._running: _Running | None = None
        self._specs: dict[str, FunctionSpec] = {}
        self._bind()

    # --- resources, by part

    def create_state_table(self) -> None:
        create_state_table(self._clients("dynamodb"), self.given["table_name"])

    def create_instance_resources(self, *private_key_pems: str) -> None:
        """What instances are launched and handed runners with: pool queues, the runner credentials key,
        a network, a launch template per architecture (and per architecture for the classes with Session
        Manager, when some have it), and each GitHub App's private key (in the order of the config's Apps)."""
        ec2 = self._clients("ec2")
        github = self.config.github
        names = [app.private_key_secret_name for app in github.every_app] or [github.private_key_secret_name]
        for name, private_key_pem in zip(names, private_key_pems, strict=True):
            self._clients("secretsmanager").create_secret(Name=name, SecretString=private_key_pem)
        self.give(
            # Named as the template names them (it fixes the stack's name in them, as in the state
            # machines' names): the functions' URL prefix is the template's.
            pool_queue_url_prefix=create_pool_queues(
                self._clients("sqs"), queue_name_prefix(STACK_ID), self.config.resource_classes
            ),
            # Opened per instance by the functions themselves (domain/notices.py): only the prefix here.
            notice_queue_url_prefix=f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/"
            + notices.queue_name_prefix(STACK_ID),
            credentials_key_id=self._clients("kms").create_key()["KeyMetadata"]["KeyId"],
            subnet_ids=create_network(ec2),
            launch_templates=create_launch_templates(ec2, self.stack_name),
        )
        if self.config.session_classes:
            # The template's second set, whose profile carries the SSM agent's permissions.
            self.give(session_launch_templates=create_launch_templates(ec2, f"{self.stack_name}-session"))

    def create_job_log_group(self) -> str:
        """The log group of job logs as the template declares it (the one its `JobLogGroupName` output
        names), with its retention; named by its logical id, as IAM's check resolves a resource no
        function is told of (emulator/iam_stack.py). Returns its name, which the instances' agents are
        given as the user data gives it."""
        logical = self.template.template["Outputs"][JOB_LOG_GROUP_OUTPUT]["Value"]["Ref"]
        properties = self.template.resources[logical]["Properties"]
        logs = self._clients("logs")
        logs.create_log_group(logGroupName=logical)
        logs.put_retention_policy(logGroupName=logical, retentionInDays=properties["RetentionInDays"])
        return str(logical)

    def create_ingress_resources(self, *webhook_secrets: str) -> None:
        """What webhooks arrive through: each App's webhook secret (in the order of the config's Apps),
        the idempotency table, the demand queue."""
        table = f"{self.stack_name}-idempotency"
        for name, secret in zip(self.config.github.webhook_secret_names, webhook_secrets, strict=True):
            self._clients("secretsmanager").create_secret(Name=name, SecretString=secret)
        create_idempotency_table(self._clients("dynamodb"), table)
        self.give(
            idempotency_table_name=table,
            demand_queue_url=create_demand_queue(self._clients("sqs"), self.stack_name),
        )

    def create_state_machine(self, machine: str) -> DeployedMachine:
        """The machine as the template defines it, each placeholder filled with the ARN of a local Lambda
        function for the function the template names there."""
        if machine in self.machines:
            return self.machines[machine]
        spec = self.template.state_machine(machine)
        if self._state_machines is None:
            self._state_machines = LocalStateMachines(
                self._clients("stepfunctions"), self._clients("lambda"), self._clients("iam")
            )
        arns = self._state_machines.create_functions(sorted(set(spec.functions.values())))
        definition = substitute(
            spec.definition,
            {placeholder: arns[name] for placeholder, name in spec.functions.items()},
            spec.logical_id,
        )
        arn = self._state_machines.create(spec.name, definition, self.config.workflow_type.value)
        self.machines[machine] = DeployedMachine(spec, arn, self._state_machines)
        self.give(**{_field(self.template.variable_naming(spec.logical_id)): arn})
        return self.machines[machine]

    def give(self, **fields: Any) -> None:
        """The functions are given these settings too (ControlPlaneSettings fields)."""
        self.given.update(fields)
        self._specs.clear()
        self._bind()

    # --- what the functions are given

    @property
    def settings(self) -> ControlPlaneSettings:
        """Every setting the local stack gives, whichever function it is given to."""
        return ControlPlaneSettings(**self.given)

    def environment(self) -> dict[str, str]:
        """The variables the local stack gives, as a function's environment carries them (JSON where
        structured)."""
        return settings_environment(self.settings.model_dump(mode="json", include=set(self.given)))

    def _bind(self) -> None:
        local = self.environment()
        unknown = sorted(set(local) - self.template.variables())
        if unknown:
            raise BindingError(f"the local stack gives {', '.join(unknown)}, which CDK gives no function")
        for name in self.template.function_names():
            self.bindings.bind_environment(self.template.environment(name), local)

    def function(self, name: str) -> FunctionSpec:
        """The function `name` as the template declares it, with the local stack's values: a variable the
        local stack has no value for (a resource it did not create) is left out, as a handler then finds."""
        if name not in self._specs:
            self._specs[name] = self._function(name)
        return self._specs[name]

    def _function(self, name: str) -> FunctionSpec:
        properties = self.template.properties(name)
        local = self.environment()
        environment = {}
        for variable, expression in self.template.environment(name).items():
            if variable in local:
                environment[variable] = local[variable]
            elif not variable.startswith(ENV_PREFIX):
                # Powertools' settings: the same everywhere. Ours come from the local stack, whose config
                # and resources are not the ones cdk.json's example synthesised.
                environment[variable] = str(expression)
        return FunctionSpec(
            name=name,
            logical_id=self.template.logical_id(name),
            handler=properties["Handler"],
            environment=environment,
            role=properties["Role"]["Fn::GetAtt"][0],
            timeout_seconds=int(properties.get("Timeout", 3)),
            memory_mb=int(properties.get("MemorySize", 128)),
        )

    def functions(self) -> dict[str, FunctionSpec]:
        return {name: self.function(name) for name in self.template.function_names()}

    def missing(self, name: str) -> list[str]:
        """The variables the template gives `name` that the local stack has no value for."""
        return sorted(set(self.template.environment(name)) - set(self.function(name).environment))

    # --- running

    @contextmanager
    def running(
        self,
        *,
        clients: ClientFactory,
        clock: Clock | None = None,
        backoff: Backoff | None = None,
        github: GitHubApp | None = None,
        pause: Callable[[float], object] = time.sleep,
        runtime: RuntimeFactory | None = None,
    ) -> Iterator[LocalStack]:
        """Until the block ends: the IAM check attached, `plane` installed for every handler of this process,
        and the functions invoked by `runtime` (in this process by default). `clients` are the functions'
        (one per service, shared by all: a fault injected on one reaches every function) and are checked.
        A denied call fails the block at its end."""
        check = iam_check.attach_policy_check(StackIam(self.template.template, self.bindings))
        made: dict[str, Any] = {}
        lock = threading.Lock()

        def checked(service: str) -> Any:
            with lock:
                if service not in made:
                    made[service] = check.on_client(clients(service))
                return made[service]

        def plane_of(settings: ControlPlaneSettings) -> ControlPlane:
            return ControlPlane(
                settings,
                clock=clock,
                clients=checked,
                backoff=backoff,
                github=github,
                pause=iam_check.as_world(pause),
            )

        self._running = _Running(check, plane_of, plane_of(self.settings))
        use_control_plane(self._running.plane)
        try:
            with (runtime or InProcess)(self) as self._running.runtime:
                yield self
            check.assert_allowed()
        finally:
            use_control_plane(None)
            iam_check.detach_policy_check(check)
            self._running = None

    def _require_running(self) -> _Running:
        if self._running is None:
            raise RuntimeError("the local stack is not running: use it inside `with stack.running(...)`")
        return self._running

    @property
    def plane(self) -> ControlPlane:
        """The harness's own ControlPlane, on every setting the local stack gives (installed for handlers
        called outside an invocation)."""
        return self._require_running().plane

    @property
    def policy_check(self) -> iam_check.PolicyCheck:
        """Every AWS call of the functions, checked against the synthesized IAM policies."""
        return self._require_running().check

    @property
    def runtime(self) -> Runtime:
        runtime = self._require_running().runtime
        if runtime is None:
            raise RuntimeError("the local stack's runtime has not started")
        return runtime

    def invoke(self, name: str, event: Any, context: Any | None = None) -> Any:
        """Invoke the function `name` with `event`, as Lambda's Invoke does (a context made up when none)."""
        return self.runtime.invoke(name, event, context or lambda_context(name))

    def handler(self, name: str) -> Handler:
        """The function `name` as a Lambda handler, for whatever invokes it (moto, an event source)."""

        def invoked(event: Any, context: Any) -> Any:
            return self.invoke(name, event, context)

        return invoked

    def routes(self, machine: str) -> dict[str, Handler]:
        """Each of the machine's local Lambda functions → its handler, for `lambdas_in_process`."""
        return {name: self.handler(name) for name in set(self.machines[machine].spec.functions.values())}

    def plane_for(self, settings: ControlPlaneSettings) -> ControlPlane:
        """A ControlPlane on `settings`, sharing the running stack's clients, clock, GitHub App and pause."""
        return self._require_running().plane_of(settings)


@dataclass
class _Running:
    check: iam_check.PolicyCheck
    plane_of: Callable[[ControlPlaneSettings], ControlPlane]
    plane: ControlPlane
    runtime: Runtime | None = None


class InProcess:
    """Each function's handler called in this process, as the function: under its role for the IAM check,
    with a ControlPlane built from its own environment (once, as at a cold start; again if the local
    stack has since given it more, e.g. a state machine deployed later)."""

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack
        self._planes: dict[str, tuple[Mapping[str, str], ControlPlane]] = {}
        self._replaced: dict[str, Handler] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self._planes.clear()

    def invoke(self, name: str, event: Any, context: Any) -> Any:
        spec = self._stack.function(name)
        handler = self._replaced.get(name) or handler_function(spec.handler)
        check = self._stack.policy_check
        with check.acting_as(check.iam.function(spec.handler)), invoked_with(self._plane(spec)):
            return handler(event, context)

    @contextmanager
    def replacing(self, handlers: Mapping[str, Handler]) -> Iterator[None]:
        """Functions by name run these handlers instead, as themselves, until the block ends."""
        with self._lock:
            self._replaced.update(handlers)
        try:
            yield
        finally:
            with self._lock:
                for name in handlers:
                    self._replaced.pop(name, None)

    def _plane(self, spec: FunctionSpec) -> ControlPlane:
        with self._lock:
            known = self._planes.get(spec.name)
            if known is None or known[0] != spec.environment:
                plane = self._stack.plane_for(settings_of(spec.environment))
                self._planes[spec.name] = known = (spec.environment, plane)
            return known[1]


def handler_function(handler: str) -> Handler:
    """The callable a Python handler string names: `<module path>.<function>`, as the Lambda Python runtime
    reads it (https://docs.aws.amazon.com/lambda/latest/dg/python-handler.html, "handler naming")."""
    module, _, function = handler.rpartition(".")
    found: Handler = getattr(importlib.import_module(module), function)
    return found


def lambda_context(name: str) -> LambdaContext:
    return LambdaContext(name, f"local-{time.monotonic_ns()}", function_arn(name))


# --- settings <-> environment -------------------------------------------------------------------------


def settings_environment(fields: Mapping[str, Any]) -> dict[str, str]:
    """The environment settings fields (as JSON values) stand for: `RUNNER_POOL_<FIELD>`, structured
    values as JSON, as the CDK constructs write them."""
    return {
        f"{ENV_PREFIX}{name.upper()}": value if isinstance(value, str) else json.dumps(value)
        for name, value in fields.items()
        if value is not None
    }


def settings_of(environment: Mapping[str, str]) -> ControlPlaneSettings:
    """The settings a function's handler reads from `environment` at cold start, read from the mapping the
    way pydantic-settings reads os.environ (structured fields decoded from JSON), without touching it."""
    values = _GivenEnvironment(environment)()
    return ControlPlaneSettings.model_validate(values)


class _GivenEnvironment(EnvSettingsSource):
    """pydantic-settings' own reading of the environment, of a mapping instead of os.environ (which other
    threads' functions share)."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        self._given = {name.lower(): value for name, value in environment.items()}
        super().__init__(ControlPlaneSettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._given


def _field(variable: str) -> str:
    return variable.removeprefix(ENV_PREFIX).lower()


class _WithinConcurrency:
    def __init__(self, runtime: Runtime, quota: AccountConcurrency) -> None:
        self._runtime = runtime
        self._quota = quota

    def invoke(self, name: str, event: Any, context: Any) -> Any:
        with self._quota.invocation():
            return self._runtime.invoke(name, event, context)


def within_concurrency(quota: AccountConcurrency, runtime: RuntimeFactory | None = None) -> RuntimeFactory:
    """`runtime` (in this process by default) behind the account's concurrency `quota`: every invocation,
    from a state machine, the API, a queue or the schedule, counts against it and is throttled past it
    (emulator/lambda_runtime.py's `concurrency` is the same quota on the artifact runtime alone)."""

    @contextmanager
    def running(stack: LocalStack) -> Iterator[Runtime]:
        with (runtime or InProcess)(stack) as inner:
            yield _WithinConcurrency(inner, quota)

    return running
