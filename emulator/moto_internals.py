"""Every moto internal the emulator, the benchmarks and the tests patch or rely on, in one list.

moto's public surface is `mock_aws`, its server (`ThreadedMotoServer`) and its configuration
(https://docs.getmoto.org/en/latest/docs/configuration/index.html); what is listed here is not, and
may change in any release. pyproject.toml pins moto to the minor version the list was recorded with,
and tests/integration/test_moto_internals.py checks each entry against the installed moto: still there,
with the signature recorded, and the source we rely on unchanged (a digest of it). Patches take
their targets from here (`patch_point`), so a patch cannot reach an internal the test does not check.

After an upgrade of moto the test names each internal whose source changed: re-read it against
what `relied_on` says, adjust its user (`by`) if needed, then record the new figures that
`python -m emulator.moto_internals` prints.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

MOTO_VERSION = "5.2.5"
"""The moto the digests and signatures below were recorded with."""


@dataclass(frozen=True)
class Internal:
    path: str
    """What we touch: "module:attribute.path" (a module global, a class, a method)."""
    by: str
    """Who touches it."""
    relied_on: str
    """What of it our code relies on: what to re-read when it changes."""
    digest: str
    """sha256 of the source of `read` (or of `path`), first 16 hex digits, at MOTO_VERSION."""
    signature: str | None = None
    """`path`'s signature at MOTO_VERSION, where we replace or call it."""
    read: str | None = None
    """The source our reliance is on, when it is not `path`'s own (e.g. the module that reads a global)."""

    def resolve(self) -> Any:
        return resolve(self.path)

    def current_digest(self) -> str:
        return hashlib.sha256(source_of(self.read or self.path).encode()).hexdigest()[:16]

    def current_signature(self) -> str | None:
        return parameters_of(self.path) if self.signature is not None else None


def resolve(path: str) -> Any:
    module_name, _, attributes = path.partition(":")
    found: Any = importlib.import_module(module_name)
    for attribute in attributes.split(".") if attributes else ():
        found = getattr(found, attribute)
    return found


def source_of(path: str) -> str:
    """The source of `path` as moto's file has it (read from the file: a patch in place does not hide it)."""
    module_name, _, attributes = path.partition(":")
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    if not attributes:
        return source
    definition = _definition(ast.parse(source), attributes.split("."))
    if definition is not None:
        return ast.get_source_segment(source, definition) or ""
    return inspect.getsource(inspect.unwrap(resolve(path)))  # defined elsewhere, e.g. an imported function


def parameters_of(path: str) -> str:
    """The parameters' names of the function at `path`: "(self, env, value)"."""
    module_name, _, attributes = path.partition(":")
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    definition = _definition(tree, attributes.split("."))
    if isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef):
        a = definition.args
        names = [x.arg for x in (*a.posonlyargs, *a.args)]
        names += [f"*{a.vararg.arg}"] if a.vararg else (["*"] if a.kwonlyargs else [])
        names += [x.arg for x in a.kwonlyargs] + ([f"**{a.kwarg.arg}"] if a.kwarg else [])
        return f"({', '.join(names)})"
    return (
        "("
        + ", ".join(
            str(p).split(":")[0].split("=")[0] for p in inspect.signature(resolve(path)).parameters.values()
        )
        + ")"
    )


def _definition(tree: ast.Module, names: list[str]) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    found: ast.AST | None = None
    for name in names:
        found = next(
            (
                node
                for node in scope
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == name
            ),
            None,
        )
        if found is None:
            return None
        scope = found.body
    return found


def patch_point(path: str) -> tuple[Any, str]:
    """(owner, attribute name) of a listed internal, for `mock.patch.object` or `setattr`."""
    if path not in _BY_PATH:
        raise KeyError(f"{path} is not in emulator/moto_internals.py: list it, so its test checks it")
    owner, _, name = path.rpartition(".")
    if ":" not in owner:  # a module global: "module:name"
        owner, _, name = path.partition(":")
    return resolve(owner), name


_DYNAMODB = "moto.dynamodb.models:DynamoDBBackend"
_SFN = "moto.stepfunctions.parser.asl"
_ATOMIC = "emulator/atomic_dynamodb.py"
_QUOTAS = "emulator/step_functions_quotas.py"
_ITEM_OPERATION = (
    "every item read or write of a request goes through it, once; wrapped whole under one lock, its "
    "answer copied under it"
)

INTERNALS: tuple[Internal, ...] = (
    # DynamoDB's item atomicity: each item operation of the backend runs alone.
    Internal(f"{_DYNAMODB}.put_item", _ATOMIC, _ITEM_OPERATION, "7efe9807b019969a"),
    Internal(f"{_DYNAMODB}.get_item", _ATOMIC, _ITEM_OPERATION, "88d651150e51b2d6"),
    Internal(f"{_DYNAMODB}.update_item", _ATOMIC, _ITEM_OPERATION, "d8e4e02a421005da"),
    Internal(f"{_DYNAMODB}.delete_item", _ATOMIC, _ITEM_OPERATION, "f1160c7db9568612"),
    Internal(f"{_DYNAMODB}.query", _ATOMIC, _ITEM_OPERATION, "11708cf9cf09bd0a"),
    Internal(f"{_DYNAMODB}.scan", _ATOMIC, _ITEM_OPERATION, "82cad0bc41e030c0"),
    Internal(f"{_DYNAMODB}.batch_get_item", _ATOMIC, _ITEM_OPERATION, "499593dac7ac64c2"),
    Internal(f"{_DYNAMODB}.batch_write_item", _ATOMIC, _ITEM_OPERATION, "d07b7ec03a887e1f"),
    Internal(f"{_DYNAMODB}.transact_get_items", _ATOMIC, _ITEM_OPERATION, "565cdb1e37d0e22c"),
    Internal(f"{_DYNAMODB}.transact_write_items", _ATOMIC, _ITEM_OPERATION, "c3c395e934006404"),
    # Lambda tasks of our state machines routed to our handlers in this process.
    Internal(
        "moto.awslambda_simple.models:LambdaSimpleBackend.invoke",
        "emulator/step_functions.py",
        "replaced: called with (function_name, qualifier, body, headers, response_headers); returns the "
        "payload as bytes",
        "bd8b3406d9998341",
        signature="(self, function_name, qualifier, body, headers, response_headers)",
    ),
    Internal(
        "moto.awslambda.responses:LambdaResponse.invoke",
        "emulator/step_functions.py",
        "hands the backend's invoke a response_headers dict and answers with it, so the "
        "x-amz-function-error our invoke sets reaches Step Functions' Retry and Catch",
        "dfa159d0a8466400",
    ),
    Internal(
        "moto.sqs.models:SQSBackend.list_queues",
        "emulator/sqs_queue_list.py",
        "replaced: called with (queue_name_prefix); returns the Queue objects of `self.queues` (a dict "
        "by name) whose name starts with the prefix",
        "6b0c542cd965769d",
        signature="(self, queue_name_prefix)",
    ),
    Internal(
        "moto.awslambda.exceptions:LambdaClientError",
        "emulator/step_functions.py",
        "subclassed with code 429: raised from our invoke, moto's responses answer Lambda's "
        "TooManyRequestsException for an account concurrency the emulator caps",
        "0de3323bd3c97168",
    ),
    # Waits and back-offs that take no time in the tests.
    Internal(
        f"{_SFN}.component.state.wait.wait_function.wait_function:WaitFunction._wait_interval",
        "emulator/step_functions.py",
        "replaced: every Wait state waits through it, called with env= and wait_seconds= by name",
        "778fc7df842c2206",
        signature="(self, env, wait_seconds)",
    ),
    Internal(
        f"{_SFN}.component.common.retry.retrier_decl:time",
        "emulator/step_functions.py",
        "replaced: a Retry's back-off is the module global time's sleep(interval_seconds)",
        "c816d4644fe2c182",
        read=f"{_SFN}.component.common.retry.retrier_decl:RetrierDecl._eval_body",
    ),
    # Step Functions' quotas measured on the interpreter.
    Internal(
        f"{_SFN}.component.state.state:CommonStateField._eval_state_input",
        _QUOTAS,
        "wrapped: a state's input is env.states.get_input() when it is called",
        "27756c6a0c96c768",
        signature="(self, env)",
    ),
    Internal(
        f"{_SFN}.component.state.state:CommonStateField._eval_state_output",
        _QUOTAS,
        "wrapped: a state's output is env.states.get_input() once it returns",
        "e8cad47414e56c8d",
        signature="(self, env)",
    ),
    Internal(
        f"{_SFN}.component.state.state:CommonStateField._verify_size_quota",
        _QUOTAS,
        "wrapped: moto's own size check of a state's value, (env, value)",
        "a9f3fdb17ed31a56",
        signature="(self, env, value)",
    ),
    Internal(
        f"{_SFN}.component.state.exec.state_task.state_task_lambda:StateTaskLambda._verify_size_quota",
        _QUOTAS,
        "wrapped: moto's size check of a Lambda task's result, (env, value)",
        "6fd35cbe1e14caf0",
        signature="(self, env, value)",
    ),
    Internal(
        f"{_SFN}.component.state.exec.state_task.service.state_task_service:StateTaskService._verify_size_quota",
        _QUOTAS,
        "wrapped: moto's size check of a service task's result, (env, value)",
        "79a377cb672c56e2",
        signature="(self, env, value)",
    ),
    Internal(
        f"{_SFN}.eval.event.event_manager:EventManager.add_event",
        _QUOTAS,
        "wrapped: every history event is added through it, and appended to self._history_event_list",
        "26e450d7bdaaa595",
        signature="(self, context, event_type, event_details, timestamp, update_source_event_id)",
    ),
    Internal(
        f"{_SFN}.utils.encoding:to_json_str",
        _QUOTAS,
        "called: a value as the JSON string Step Functions measures",
        "4b1d40e1707982a3",
        signature="(obj, separators)",
    ),
    # Local AWS: the server's configuration and its reset between runs.
    Internal(
        "moto.core.config:default_user_config",
        "emulator/aws.py",
        "mutated while the server runs: the process-wide dict Step Functions and Lambda read per request",
        "e94e671c391b0f59",
        read="moto.core.config",
    ),
    Internal(
        "moto.moto_api._internal.models:moto_api_backend",
        "emulator/aws.py",
        "reset() empties every backend of the process, so the next local AWS starts empty",
        "69b216da81df94e5",
        read="moto.moto_api._internal.models:MotoAPIBackend.reset",
    ),
    # Local AWS: the server's dispatcher, which finds the backend for each request.
    Internal(
        "moto.moto_server.werkzeug_app:DomainDispatcherApplication.get_backend_for_host",
        "emulator/aws.py",
        "wrapped with a cache per host: called under the dispatcher's lock with the host inferred for "
        "a request; its answer depends on the host and on what moto ships alone",
        "686676e229858e5d",
        signature="(self, host)",
    ),
    # Local AWS: work moto repeats per request, done once or directly (emulator/moto_speedups.py).
    Internal(
        "moto.core.responses:method_names_from_class",
        "emulator/moto_speedups.py",
        "replaced by a cache: call_action asks it, per request, for the names of the response class's "
        "functions (clazz) -> list[str], and only tests membership",
        "ce5f71add322c22a",
        signature="(clazz)",
        read="moto.core.responses:BaseResponse.call_action",
    ),
    Internal(
        "moto.dynamodb.responses:DynamoResult.execute_result",
        "emulator/moto_speedups.py",
        "replaced for item operations: (self, context) -> (status, headers, body); self.result is "
        "dynamo_to_dict's plain data, binary values as bytes; context.operation_model.name the operation",
        "ba49df8839c1c886",
        signature="(self, context)",
        read="moto.core.responses:ActionResult.execute_result",
    ),
    Internal(
        "moto.dynamodb.models.utilities:dynamo_to_dict",
        "emulator/moto_speedups.py",
        "read: turns an answer into plain data, {type: value} per attribute, B and BS as raw bytes",
        "658c88f9c8493716",
    ),
    Internal(
        "moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils:boto_client_for",
        "emulator/moto_speedups.py",
        "replaced: called with region=, service=, state_credentials= by name; the client it makes depends "
        "on region and service alone (fixed keys, the server's endpoint)",
        "2c53599692cbcdda",
        signature="(region, service, state_credentials)",
        read="moto.stepfunctions.parser.asl.utils.boto_client:boto_client_for",
    ),
    Internal(
        "moto.stepfunctions.parser.asl.utils.json_path:parse",
        "emulator/moto_speedups.py",
        "replaced by a cache: extract_json parses its path through this module global, then only finds",
        "0d79f1ca93a4d5f2",
        read="moto.stepfunctions.parser.asl.utils.json_path:extract_json",
    ),
    Internal(
        "moto.stepfunctions.parser.asl.component.common.path.result_path:parse",
        "emulator/moto_speedups.py",
        "replaced by a cache: ResultPath parses its path through this module global, then update_or_create",
        "63888dfe47fa6569",
        read="moto.stepfunctions.parser.asl.component.common.path.result_path:ResultPath._eval_body",
    ),
    Internal(
        "moto.dynamodb.models.table:Table.all_items",
        "emulator/moto_speedups.py",
        "replaced by the same list sorted on converted keys: (self) -> list[Item], every item of "
        "self.items (a dict of items per hash key when range_key_attr), sorted on (hash_key, range_key)",
        "98389d15573959bc",
        signature="(self)",
    ),
    # Simulated instances: which instances EC2 has, in which state, read from local AWS's EC2 backend.
    Internal(
        "moto.ec2.models:ec2_backends",
        "emulator/simulated_instances.py",
        "read: [account][region] is the EC2 backend the server answers from; its `reservations` dict's "
        "values each hold `instances`, a list, as all_reservations reads them",
        "29ef7fdff1f1a207",
        read="moto.ec2.models.instances:InstanceBackend.all_reservations",
    ),
    Internal(
        "moto.ec2.models.instances:Instance.state",
        "emulator/simulated_instances.py",
        "read: an instance's `id`, and `state`, the name of its state (pending, running, terminated...)",
        "e2e0be8664d28508",
    ),
    Internal(
        "moto.ec2.models.tags:TagBackend.create_tags",
        "emulator/simulated_instances.py",
        "read: the backend's `tags` maps a resource id to its tags, {key: value}",
        "6e8b61b098731a51",
    ),
    # KMS: the key a ciphertext was made with, read from the ciphertext.
    Internal(
        "moto.kms.utils:_serialize_ciphertext_blob",
        "emulator/iam_calls.py",
        "a ciphertext starts with the key id's 36 bytes (MOTO_KEY_ID_BYTES)",
        "87873a74e251a487",
    ),
    # CloudFormation: which resource types moto creates.
    Internal(
        "moto.cloudformation.parsing:resource_class_from_type",
        "tests/infra/test_deploy_on_moto.py",
        "called: None for a resource type moto's CloudFormation does not create",
        "f0eb48efe828dd49",
        signature="(resource_type)",
    ),
    # Step Functions: each ASL definition parsed once per process (emulator/asl_parse_cache.py).
    Internal(
        "moto.stepfunctions.parser.asl.parse.asl_parser:AmazonStateLanguageParser.parse",
        "emulator/asl_parse_cache.py",
        "replaced: parse(definition) -> (program, tree); the program is Preprocessor().visit(tree), "
        "which only reads the tree; raises on a bad definition; called at creation and each execution",
        "a247b919a584eae9",
        signature="(definition)",
    ),
    Internal(
        "moto.stepfunctions.parser.asl.parse.preprocessor:Preprocessor",
        "emulator/asl_parse_cache.py",
        "visit(tree) builds fresh evaluation components and assigns nothing to the tree's nodes",
        "03c8a0e3b3cf0716",
        read="moto.stepfunctions.parser.asl.parse.preprocessor",
    ),
    # Local EC2's images: the file named by MOTO_AMIS_PATH instead of ~1,300 defaults.
    Internal(
        "moto.utilities.utils:load_resource",
        "emulator/moto_amis.py",
        "called: the JSON list of ec2/resources/amis.json and latest_amis/<region>.json, as moto loads them",
        "f9307723af29dcff",
        signature="(resource)",
    ),
    Internal(
        "moto.ec2.models.amis:AmiBackend._load_amis",
        "emulator/moto_amis.py",
        "with MOTO_AMIS_PATH set, an EC2 backend loads that file's images and no region's latest_amis",
        "4adae04303990d2c",
    ),
    # SQS's cheap clock and retention check (local AWS's speedups).
    Internal(
        "moto.sqs.models:unix_time",
        "emulator/moto_speedups.py",
        "replaced: SQS reads its clock in seconds through this module global, unix_time(dt)",
        "c04224ad14c39581",
        signature="(dt)",
        read="moto.sqs.models",
    ),
    Internal(
        "moto.sqs.models:unix_time_millis",
        "emulator/moto_speedups.py",
        "replaced: SQS reads its clock in ms through this module global, unix_time_millis(dt)",
        "c04224ad14c39581",
        signature="(dt)",
        read="moto.sqs.models",
    ),
    Internal(
        "moto.sqs.models:Message",
        "emulator/moto_speedups.py",
        "read: a message's sent_timestamp is when it was sent, in milliseconds since the epoch",
        "e2ea9b18dc7ba5da",
        read="moto.sqs.models:Message.__init__",
    ),
    Internal(
        "moto.sqs.models:SQSBackend.is_message_valid_based_on_retention_period",
        "emulator/moto_speedups.py",
        "replaced: (queue_name, message), compares the queue's retention with sent_timestamp",
        "828b4ee1efb0bfbd",
        signature="(self, queue_name, message)",
    ),
    # SQS: a released message wakes a waiting long poll, as on AWS (emulator/sqs_long_polls.py).
    Internal(
        "moto.sqs.models:SQSBackend.change_message_visibility",
        "emulator/sqs_long_polls.py and emulator/atomic_sqs.py",
        "wrapped: (queue_name, receipt_handle, visibility_timeout) makes the message visible at once for "
        "0; ChangeMessageVisibilityBatch calls it per entry; it changes the queue's pending messages",
        "e711863815589ec2",
        signature="(self, queue_name, receipt_handle, visibility_timeout)",
    ),
    Internal(
        "moto.sqs.models:SQSBackend.receive_message",
        "emulator/sqs_long_polls.py and emulator/atomic_sqs.py",
        "wrapped: (queue_name, count, wait_seconds_timeout, visibility_timeout, ...); a long poll scans the "
        "queue's visible messages, then waits on the queue's `_messages_lock` (a Condition over an RLock, "
        "`Queue.wait_for_messages`) and scans again when woken, until its wait has passed; it marks what "
        "it takes pending and received with no lock of its own",
        "b1c796a9301aaf27",
        signature="(self, queue_name, count, wait_seconds_timeout, visibility_timeout, "
        "message_attribute_names)",
    ),
    Internal(
        "moto.sqs.models:SQSBackend.delete_message",
        "emulator/atomic_sqs.py",
        "wrapped: (queue_name, receipt_handle); Queue.delete_message rebuilds `_messages` from a copy and "
        "drops the message from the pending ones; DeleteMessageBatch calls it per entry",
        "636fb315c91ee9f1",
        signature="(self, queue_name, receipt_handle)",
        read="moto.sqs.models:Queue.delete_message",
    ),
    Internal(
        "moto.sqs.models:Message.mark_received",
        "tests/integration/test_atomic_sqs.py",
        "wrapped: (visibility_timeout=None), called by a receive for each message it takes, after it "
        "noted the message pending and before the message is invisible",
        "745606df72420440",
        signature="(self, visibility_timeout)",
    ),
    Internal(
        "moto.sqs.models:Message.visible",
        "tests/integration/test_atomic_sqs.py",
        "wrapped: a property, read by `Queue.messages` to list the visible messages and again by a receive's "
        "scan for each listed message before it takes it",
        "de0d3512ec1a913c",
    ),
    Internal(
        "moto.sqs.models:SQSBackend.delete_message_batch",
        "emulator/atomic_sqs.py",
        "read: calls self.delete_message for each entry",
        "e6d2c613716f4dc0",
    ),
    Internal(
        "moto.sqs.models:Queue.wait_for_messages",
        "tests/integration/test_sqs_long_polls.py",
        "wrapped: (timeout), called by a receive that found nothing, to wait on the queue's condition",
        "3688327c2e2e29f0",
        signature="(self, timeout)",
    ),
    Internal(
        "moto.sqs.models:SQSBackend.change_message_visibility_batch",
        "emulator/sqs_long_polls.py",
        "read: calls self.change_message_visibility for each entry",
        "52a125d83f69627d",
    ),
    # EC2's tags of one resource, read by its id (local AWS's speedups).
    Internal(
        "moto.ec2.models.core:TaggedEC2Resource.get_tags",
        "emulator/moto_speedups.py",
        "replaced: (self) -> describe_tags(filters={'resource-id': [self.id]}) when self.id, else []",
        "b553f9d0294b3388",
        signature="(self)",
    ),
    Internal(
        "moto.ec2.models.tags:TagBackend.describe_tags",
        "emulator/moto_speedups.py",
        "read: a resource-id filter is fnmatch.translate(id) matched against each key of self.tags (a "
        "dict of resource id to {key: value}); each tag as {resource_id, key, value, resource_type}, "
        "resource_type EC2_PREFIX_TO_RESOURCE.get(get_prefix(id), ''), in self.tags' order",
        "637f58e6a83efa35",
    ),
    Internal(
        "moto.ec2.utils:get_prefix",
        "emulator/moto_speedups.py",
        "called: (resource_id) -> its prefix, the key of EC2_PREFIX_TO_RESOURCE",
        "1e9055eb6d65f241",
        signature="(resource_id)",
    ),
    # KMS's key pairs, one per symmetric key spec (local AWS's speedups).
    Internal(
        "moto.kms.models:generate_private_key",
        "emulator/moto_speedups.py",
        "replaced: Key.__init__ calls (self.key_spec) through this module global and keeps the pair as "
        "private_key, which only sign, verify and get_public_key use; key_material is made apart",
        "2c54b9dd1b425415",
        signature="(key_spec)",
        read="moto.kms.models:Key.__init__",
    ),
    Internal(
        "moto.kms.models:kms_backends",
        "tests/integration/test_moto_speedups.py",
        "read: [account][region].keys by id, each Key's private_key and key_material",
        "2c54b9dd1b425415",
        read="moto.kms.models:Key.__init__",
    ),
    Internal(
        "moto.kms.utils:KeySpec",
        "emulator/moto_speedups.py",
        "read: SYMMETRIC_DEFAULT and hmac_key_specs() are the symmetric specs",
        "f2e690e537238c5e",
    ),
    Internal(
        "moto.stepfunctions.parser.backend.execution_worker:ExecutionWorker.stop",
        "emulator/step_functions.py",
        "read: acts on `self.env`, which the execution's own thread sets once it has parsed the definition; "
        "a stop before that raises AttributeError, which stop_running_executions waits out",
        "4c3ac97f1223e850",
        signature="(self, stop_date, error, cause)",
        read="moto.stepfunctions.parser.backend.execution_worker:ExecutionWorker",
    ),
    Internal(
        "moto.stepfunctions.parser.backend.execution_worker:ExecutionWorker._get_evaluation_environment",
        "tests/integration/test_step_functions_harness.py",
        "replaced: called on the execution's own thread, after StartExecution answered and before `self.env` "
        "is set, so holding it holds an execution in the window a stop must wait out",
        "91bf5728f01b4edc",
        signature="(self)",
        read="moto.stepfunctions.parser.backend.execution_worker:ExecutionWorker._execution_logic",
    ),
    Internal(
        "moto.sqs.models:sqs_backends",
        "tests/integration/test_moto_speedups.py",
        "read: [account][region] is the SQS backend the server answers from; its `queues` dict by name, "
        "each queue's `_messages` list of Message with `body` and `sent_timestamp`",
        "8446f762e9f146e7",
        read="moto.sqs.models:Queue.messages",
    ),
)
_BY_PATH = {internal.path: internal for internal in INTERNALS}


def _record() -> None:
    """Print each internal's figures as installed, to record after re-reading a changed one."""
    import moto  # noqa: PLC0415

    print(f"moto {moto.__version__}")
    for internal in INTERNALS:
        print(internal.path, internal.current_digest(), internal.current_signature())


if __name__ == "__main__":
    _record()
