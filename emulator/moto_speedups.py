"""Work moto repeats on every request that AWS never does, done once or directly, with the same answers.

The emulator's control plane, agents and local AWS share one interpreter, so its one core bounds how
many jobs a world serves a second: a 100-job burst held the GIL for 0.78 s a job, and four
places of moto held a third of that (py-spy --gil):

- **Every request** lists its response class's methods anew (`inspect.getmembers`, 3 % of the
  samples) to see whether the action is one; a class's methods do not change while the server runs.

- **DynamoDB's item answers** go through moto's generic response serializer, which walks the
  operation's output shape member by member (about 1.5 ms for one small item, 13 % of the samples).
  moto has already turned the answer into the wire's plain data (`dynamo_to_dict`): attribute
  values `{type: value}`, binary values as bytes. For the item operations the answer is written as
  JSON directly (the output shape's top-level members only, as the serializer keeps), binary values in
  base64 as the serializer writes them (DynamoDB API reference,
  "AttributeValue": "B — An attribute of type Binary ... base64-encoded"). Table operations (whose
  answers carry timestamps the serializer formats) keep the serializer.
  tests/integration/test_moto_speedups.py checks the direct answer against the serializer's for every
  attribute type and item operation.
- **Step Functions' Lambda tasks** build a new boto3 client for every invocation (9.5 %: botocore
  loads and compiles the Lambda service model each time). Its arguments are the same for every call
  of a region (moto passes fixed keys, and the server's port), and boto3 clients are thread-safe
  (boto3 docs, "Multithreading or multiprocessing with clients"), so one client per region serves all.
- **Step Functions' JSONPath** builds a new PLY parser (reading its tables) for every path it
  evaluates (5.4 %). A parsed path is an expression tree that `find` and `update_or_create` read and
  never change, so each path text is parsed once.

- **DynamoDB's index queries** list the whole table sorted by its key (`Table.all_items`) before they
  filter it, every time, under the lock that makes item operations atomic (emulator/atomic_dynamodb.py):
  the sort compares moto's `DynamoType`s, each comparison converting both values anew. In the pickup bench's
  1,000-job burst that sort held the GIL in 67 of 676 samples (py-spy --gil, 20 s, 25 min in), every
  other DynamoDB call waiting for the lock meanwhile; sorted as below, 14 of 630 (12 min in). The same
  order is had by sorting on each key's converted value, converted once per item (`DynamoType.__lt__`
  and `__eq__` compare exactly those values; a key attribute has one type).

- **SQS reads its clock through datetime arithmetic** (`unix_time`: `utcnow()` minus the epoch, about
  6 us a reading) several times for every message in a queue on each look (each message's `visible`
  and `delayed`), and checks the retention period of each message it hands out by building every
  attribute of the queue, three of which (the approximate counts) look at every message again: a
  receive from a queue of n messages costs n² clock readings. Real SQS does neither. The clock is read
  with `time.time()`, the same clock (`datetime.now(UTC)` reads it), and the retention check reads the
  retention period alone. In the 300-job rate-limited burst the two held the GIL in 391 of 4,135
  samples (py-spy --gil); bench/pickup.py measured 110 s of moto per pickup on stock moto
  for a queue of 10,000.

- **EC2 finds one resource's tags by listing every tag of the region** (`TaggedEC2Resource.get_tags`
  asks `describe_tags` for a resource-id filter, which matches a pattern against each tagged resource
  anew), once per instance for each `tag:` filter of DescribeInstances and again to write each
  instance's tags: a DescribeInstances of n instances costs n² pattern matches, and moto keeps
  terminated instances and their tags. In the 300-job burst it held the GIL in 3.3 % of the samples
  (py-spy --gil), growing with the square of the instances launched. The tags of a resource
  are read from the tag backend's map by its id, in moto's order and form (an id has no pattern
  characters; an id that had would take moto's way).

- **mock_aws drops boto3's default session on every start** (so each test's first `boto3.client`
  makes a new one), and a new session loads and parses botocore's endpoint rules and each service's
  model again: about 0.15 CPU-s a test, for the tests' own clients, moto's Step Functions Lambda
  client and the product's `boto3.client` fallbacks. While moto runs, the default session is one
  for the process. What a session holds is read from botocore's data files, which do not change; the
  region and endpoint a client gets are still read when it is made, and credentials come from the
  environment the tests fix (tests/conftest.py) or are given to the client.

- **botocore builds each client's class anew**: a method, an operation model and a docstring object
  for every operation of the service (ec2 has 700), about 1.5 ms a client of the tests' and the
  harnesses' dozen a test. While moto runs, a session's clients of one service and API version share
  the class built for the first: its methods only name their operation and call the instance's
  `_make_api_call`, and what a client holds of its own (its service model, endpoint, config, event
  handlers) is its instance's. The one hook on the class, `creating-client-class`, is registered by
  boto3 and botocore when a session is made, and classes are kept per session (botocore's
  `ClientCreator._create_client_class`, botocore as locked).

- **KMS makes an RSA key pair for every key it creates**, symmetric ones included (moto's
  `generate_private_key` gives any spec it does not know as asymmetric a 2048-bit RSA key; 60 ms of CPU
  each, for the runner-credentials key of every local stack and the default EBS key of every account
  that creates a volume). A symmetric key (SYMMETRIC_DEFAULT, HMAC_*) has no key pair in AWS: moto
  uses the pair only for Sign, Verify and GetPublicKey, which AWS refuses for a symmetric key
  (KMS API reference, "Sign": "The KeyUsage type of the KMS key must be SIGN_VERIFY"). So symmetric
  keys share one pair per spec; each key keeps its own id and its own key material (what Encrypt and
  Decrypt use). An asymmetric key still gets a pair of its own, as in AWS.

Each target is listed in emulator/moto_internals.py, whose test fails when moto changes it.
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from typing import Any
from unittest import mock

import boto3
import botocore.client
from moto.core.utils import unix_time

from emulator.moto_internals import patch_point, resolve

ITEM_OPERATIONS = frozenset(
    {
        "GetItem",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "Query",
        "Scan",
        "BatchGetItem",
        "TransactGetItems",
    }
)
"""Operations whose answers hold items, counts, keys and consumed capacity: no timestamp, no shape
member the serializer would drop (the test proves it per operation). moto answers BatchWriteItem and
TransactWriteItems without the serializer already."""

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
"""DynamoDB's protocol (awsJson1_0), the content type moto's serializer answers with."""

KEPT_PATHS = 4096
"""JSONPath texts kept parsed: a state machine has a few dozen; tests deploy a handful."""

_METHOD_NAMES = "moto.core.responses:method_names_from_class"
_DYNAMO_RESULT = "moto.dynamodb.responses:DynamoResult.execute_result"
_LAMBDA_CLIENT = (
    "moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils:boto_client_for"
)
_JSON_PATH = "moto.stepfunctions.parser.asl.utils.json_path:parse"
_RESULT_PATH = "moto.stepfunctions.parser.asl.component.common.path.result_path:parse"
_ALL_ITEMS = "moto.dynamodb.models.table:Table.all_items"
_SQS_CLOCK = "moto.sqs.models:unix_time"
_SQS_CLOCK_MILLIS = "moto.sqs.models:unix_time_millis"
_SQS_RETENTION = "moto.sqs.models:SQSBackend.is_message_valid_based_on_retention_period"
_KMS_KEY_PAIR = "moto.kms.models:generate_private_key"
_KMS_KEY_SPECS = "moto.kms.utils:KeySpec"
_EC2_TAGS = "moto.ec2.models.core:TaggedEC2Resource.get_tags"
_EC2_RESOURCE_TYPES = "moto.ec2.utils:EC2_PREFIX_TO_RESOURCE"
_EC2_PREFIX = "moto.ec2.utils:get_prefix"
PATTERN_CHARACTERS = frozenset("*?[\\")
"""What makes moto's resource-id filter (fnmatch) a pattern rather than the id itself."""


@contextmanager
def speedups() -> Iterator[None]:
    """All of them, while moto runs: local AWS's server (emulator/aws.py) or a test's `mock_aws`."""
    with ExitStack() as stack:
        stack.enter_context(_direct(_METHOD_NAMES, _listed_once))
        stack.enter_context(_direct(_DYNAMO_RESULT, _item_answers_written_directly))
        stack.enter_context(_direct(_LAMBDA_CLIENT, _one_client_per_region))
        stack.enter_context(_direct(_JSON_PATH, _parsed_once))
        stack.enter_context(_direct(_RESULT_PATH, _parsed_once))
        stack.enter_context(_direct(_ALL_ITEMS, _sorted_on_converted_keys))
        stack.enter_context(_direct(_SQS_CLOCK, lambda _: _clock_seconds))
        stack.enter_context(_direct(_SQS_CLOCK_MILLIS, lambda _: _clock_millis))
        stack.enter_context(_direct(_SQS_RETENTION, lambda _: _still_retained))
        stack.enter_context(_direct(_EC2_TAGS, _tags_read_by_id))
        stack.enter_context(_direct(_KMS_KEY_PAIR, _one_pair_per_symmetric_spec))
        stack.enter_context(mock.patch.object(boto3, "DEFAULT_SESSION", _process_session()))
        creator = botocore.client.ClientCreator
        stack.enter_context(
            mock.patch.object(
                creator,
                "_create_client_class",
                _one_class_per_service(creator._create_client_class),  # type: ignore[attr-defined]
            )
        )
        yield


@contextmanager
def _direct(path: str, make: Callable[[Any], Any]) -> Iterator[None]:
    owner, name = patch_point(path)
    with mock.patch.object(owner, name, make(getattr(owner, name))):
        yield


def _listed_once(method_names: Callable[[type], list[str]]) -> Callable[[type], list[str]]:
    return functools.lru_cache(maxsize=None)(method_names)


def _item_answers_written_directly(serialize: Callable[..., Any]) -> Callable[..., Any]:
    def execute_result(result: Any, context: Any) -> Any:
        if context.operation_model.name not in ITEM_OPERATIONS:
            return serialize(result, context)
        # Only the output shape's members, as the serializer writes (moto adds e.g. DeleteItem's legacy
        # ConsumedCapacityUnits); below them an answer is attribute values, written whole.
        members = context.operation_model.output_shape.members
        answer = {key: value for key, value in result.result.items() if key in members}
        body = json.dumps(answer, default=_binary_in_base64)
        return 200, {"Content-Type": JSON_CONTENT_TYPE}, body

    return execute_result


def _binary_in_base64(value: Any) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} in a DynamoDB item answer; the serializer should write it")


def _one_client_per_region(make_client: Callable[..., Any]) -> Callable[..., Any]:
    """Kept for this local AWS only (its server's port is in each client's endpoint)."""
    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        key = (region, service)
        with lock:
            client = clients.get(key)
            if client is None:
                client = clients[key] = make_client(region=region, service=service)
        return client

    return boto_client_for


def _parsed_once(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return functools.lru_cache(maxsize=KEPT_PATHS)(parse)


def _sorted_on_converted_keys(_all_items: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
    def all_items(table: Any) -> list[Any]:
        items: list[Any] = []
        for hash_set in table.items.values():
            if table.range_key_attr:
                items.extend(hash_set.values())
            else:
                items.append(hash_set)
        return sorted(items, key=_converted_key)

    return all_items


def _converted_key(item: Any) -> Any:
    """moto's sort key for an item, `(hash_key, range_key)` or `hash_key`, as the values it compares."""
    if item.range_key:
        return (item.hash_key.cast_value, item.range_key.cast_value)
    return item.hash_key.cast_value


def _clock_seconds(dt: datetime | None = None) -> float:
    """moto's `unix_time`: seconds since the epoch of `dt`, or of now."""
    return time.time() if dt is None else unix_time(dt)


def _clock_millis(dt: datetime | None = None) -> float:
    return _clock_seconds(dt) * 1000.0


def _still_retained(backend: Any, queue_name: str, message: Any) -> bool:
    """moto's retention check (retained while the retention period since it was sent has not passed),
    reading the queue's retention period alone."""
    retention_seconds = int(backend.get_queue(queue_name).message_retention_period)
    return bool(retention_seconds + message.sent_timestamp / 1000 > _clock_seconds())


Tags = list[dict[str, str]]


def _tags_read_by_id(get_tags: Callable[[Any], Tags]) -> Callable[[Any], Tags]:
    resource_types: dict[str, str] = resolve(_EC2_RESOURCE_TYPES)
    prefix_of: Callable[[str], str] = resolve(_EC2_PREFIX)

    def tags_of(resource: Any) -> Tags:
        """moto's `describe_tags(filters={"resource-id": [id]})`: the resource's tags, in the order they
        were first set, each with its id and resource type."""
        resource_id = resource.id
        if not resource_id or PATTERN_CHARACTERS & set(resource_id):
            return get_tags(resource)
        tags = resource.ec2_backend.tags.get(resource_id)
        if not tags:
            return []
        resource_type = resource_types.get(prefix_of(resource_id), "")
        return [
            {"resource_id": resource_id, "key": key, "value": value, "resource_type": resource_type}
            for key, value in list(tags.items())
        ]

    return tags_of


@functools.cache
def _process_session() -> boto3.session.Session:
    return boto3.session.Session()


_CLIENT_CLASSES: weakref.WeakKeyDictionary[Any, dict[tuple[str, str | None], type]] = (
    weakref.WeakKeyDictionary()
)
"""Per session (its event emitter), the client class of each service and API version: kept across
mocks, as the sessions are (the harnesses' and `_process_session`)."""
_CLIENT_CLASSES_LOCK = threading.Lock()


def _one_class_per_service(create_class: Callable[..., type]) -> Callable[..., type]:
    def create_client_class(creator: Any, service_name: str, service_model: Any) -> type:
        # The creator's emitter is its session's: the same for every client of the session.
        key = (service_name, service_model.api_version)
        with _CLIENT_CLASSES_LOCK:
            made = _CLIENT_CLASSES.setdefault(creator._event_emitter, {})
            if key not in made:
                made[key] = create_class(creator, service_name, service_model)
            return made[key]

    return create_client_class


_SHARED_KEY_PAIRS: dict[str, Any] = {}
"""Per symmetric key spec, the key pair moto made for the first key of that spec in this process."""
_SHARED_KEY_PAIRS_LOCK = threading.Lock()


def _one_pair_per_symmetric_spec(generate: Callable[[str], Any]) -> Callable[[str], Any]:
    key_specs = resolve(_KMS_KEY_SPECS)
    symmetric = {key_specs.SYMMETRIC_DEFAULT.value, *key_specs.hmac_key_specs()}

    def generate_private_key(key_spec: str) -> Any:
        if key_spec not in symmetric:
            return generate(key_spec)
        with _SHARED_KEY_PAIRS_LOCK:
            pair = _SHARED_KEY_PAIRS.get(key_spec)
            if pair is None:
                pair = _SHARED_KEY_PAIRS[key_spec] = generate(key_spec)
        return pair

    return generate_private_key
