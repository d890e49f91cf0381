"""The runner credential hand-off of DESIGN.md section 5: a JIT runner config only its instance can decrypt.

The control plane stores the config as one more item of the instance (`pk` = its instance ARN, as
for all its items, `sk` = `runner-config`), encrypted with KMS under the encryption context
{"instance-arn": <instance ARN>}. The instance role may read only items whose key, and decrypt only
under a context, equal to `${ec2:SourceInstanceARN}` of the caller, so an instance can read the
ciphertext of no other instance, and could not decrypt it if it did. One ARN is both the key and
the context, so they cannot disagree. The agent reads the item with a consistent read and decrypts
it under its own ARN; woken by a notice, it reads the item and its record in one consistent
BatchGetItem (`read_with_record`), which the instance role allows under the same condition as GetItem.

KMS encrypts at most 4 KiB at a time and a JIT config is close to that, so the config is cut into
chunks, each encrypted under the same context. The run key the config is for is kept beside it,
and an id of its own: an agent never starts a runner from a config meant for an earlier run, nor
twice from the same config (an instance back in the pool may be claimed again by the same run, and
until the new config is stored the old one, for the same run key, is still there).
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, attempt
from runner_pool.adapters.backoff import Backoff
from runner_pool.adapters.instance_arns import names_instance
from runner_pool.adapters.state_items import (
    PARTITION_KEY,
    SORT_KEY,
    STATE_ITEM,
    TTL_ATTRIBUTE,
    read_together,
    readable_record,
)
from runner_pool.domain.clock import Clock
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.runner_configs import CredentialsUnreadableError, RunnerConfig, StoredConfig
from runner_pool.domain.timeouts import Timeouts

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

RUNNER_CONFIG_ITEM = "runner-config"
ENCRYPTION_CONTEXT_KEY = "instance-arn"
CONFIG_RUN_KEY_ATTRIBUTE = "config_run_key"
"""Not `run_key`: the runner-config item must never enter the state table's by-run-key index."""
CIPHERTEXT_ATTRIBUTE = "ciphertext"
CONFIG_ID_ATTRIBUTE = "config_id"
RUNNER_ID_ATTRIBUTE = "runner_id"
KMS_MAX_PLAINTEXT_BYTES = 4096

_UNREADABLE_CODES = frozenset(
    {
        "InvalidCiphertextException",
        "IncorrectKeyException",
        "AccessDeniedException",
        "DisabledException",
        "KMSInvalidStateException",
        "NotFoundException",
    }
)


class RunnerCredentials:
    """Stores (control plane) and loads (agent) the encrypted JIT runner config of one instance."""

    def __init__(
        self,
        table_name: str,
        timeouts: Timeouts,
        clock: Clock,
        *,
        key_id: str | None = None,
        dynamodb: DynamoDBClient | None = None,
        kms: Any = None,
        backoff: Backoff | None = None,
    ) -> None:
        """`backoff` paces the retries of `read_with_record`'s unprocessed keys (botocore retries calls)."""
        self._table = table_name
        self._timeouts = timeouts
        self._clock = clock
        self._key_id = key_id
        self._dynamodb: DynamoDBClient = dynamodb or aws_clients.client("dynamodb")
        self._kms: Any = kms or aws_clients.client("kms")
        self._backoff = backoff or Backoff()

    def store(
        self, instance_id: str, arn: str, run_key: str, jit_config: str, runner_id: int | None = None
    ) -> str:
        """Encrypt `jit_config` for the instance `arn` names and keep it as that instance's item.

        Each store replaces the instance's previous config and gets an id of its own, returned.
        """
        if self._key_id is None:
            raise ValueError("storing a runner config needs the KMS key id of the runner credentials key")
        _check_arn(instance_id, arn)
        plaintext = jit_config.encode()
        chunks = [
            plaintext[start : start + KMS_MAX_PLAINTEXT_BYTES]
            for start in range(0, max(len(plaintext), 1), KMS_MAX_PLAINTEXT_BYTES)
        ]
        context = {ENCRYPTION_CONTEXT_KEY: arn}
        ciphertexts = [self._encrypt(chunk, context) for chunk in chunks]
        now = self._clock.now()
        config_id = uuid.uuid4().hex
        item: dict[str, Any] = {
            PARTITION_KEY: {"S": arn},
            SORT_KEY: {"S": RUNNER_CONFIG_ITEM},
            CONFIG_ID_ATTRIBUTE: {"S": config_id},
            CONFIG_RUN_KEY_ATTRIBUTE: {"S": run_key},
            CIPHERTEXT_ATTRIBUTE: {"L": [{"B": blob} for blob in ciphertexts]},
            "stored_at": {"N": repr(now)},
            TTL_ATTRIBUTE: {"N": str(self._expiry(now))},
        }
        if runner_id is not None:
            item[RUNNER_ID_ATTRIBUTE] = {"N": str(runner_id)}
        self._dynamodb.put_item(TableName=self._table, Item=item)
        return config_id

    def stored_runner(self, instance_id: str, arn: str) -> tuple[str, int | None] | None:
        """(run key, runner id) of the config stored for the instance, without decrypting it; None if none."""
        _check_arn(instance_id, arn)
        response = self._dynamodb.get_item(
            TableName=self._table,
            Key={PARTITION_KEY: {"S": arn}, SORT_KEY: {"S": RUNNER_CONFIG_ITEM}},
            ConsistentRead=True,
            ProjectionExpression=f"{CONFIG_RUN_KEY_ATTRIBUTE}, {RUNNER_ID_ATTRIBUTE}",
        )
        item = response.get("Item")
        if item is None or CONFIG_RUN_KEY_ATTRIBUTE not in item:
            return None
        runner = item.get(RUNNER_ID_ATTRIBUTE, {}).get("N")
        return item[CONFIG_RUN_KEY_ATTRIBUTE]["S"], None if runner is None else int(runner)

    def load(self, instance_id: str, arn: str, run_key: str) -> RunnerConfig | None:
        """The config stored for `run_key`, decrypted under `arn`; None while none is stored for that run.

        Raises CredentialsUnreadableError when the config is there but KMS will not decrypt it under `arn`,
        and ServiceBusyError when DynamoDB or KMS kept throttling.
        """
        stored = self.stored(instance_id, arn)
        if stored is None or stored.run_key != run_key:
            return None
        return self.decrypt(stored, arn)

    def stored(self, instance_id: str, arn: str) -> StoredConfig | None:
        """The config stored for the instance, whatever its run, read consistently and not decrypted."""
        _check_arn(instance_id, arn)
        response = self._dynamodb.get_item(
            TableName=self._table,
            Key={PARTITION_KEY: {"S": arn}, SORT_KEY: {"S": RUNNER_CONFIG_ITEM}},
            ConsistentRead=True,
        )
        return _stored_config(response.get("Item"))

    def read_with_record(
        self, instance_id: str, arn: str
    ) -> tuple[InstanceRecord | None, StoredConfig | None]:
        """The instance's record and the config stored for it, in one consistent BatchGetItem of exactly
        those two items, where `StateTable.get` and `stored` would make two calls: what an agent woken by
        a notice of its hand-over reads. Not a transaction, but each item is read consistently: a config
        stored before the notice was sent (the control plane sends it only then) is found.
        """
        _check_arn(instance_id, arn)
        keys = [
            {PARTITION_KEY: {"S": arn}, SORT_KEY: {"S": kind}} for kind in (STATE_ITEM, RUNNER_CONFIG_ITEM)
        ]
        items = read_together(self._dynamodb, self._table, keys, self._backoff)
        state, config = items.get(STATE_ITEM), items.get(RUNNER_CONFIG_ITEM)
        return (None if state is None else readable_record(state)), _stored_config(config)

    def decrypt(self, stored: StoredConfig, arn: str) -> RunnerConfig:
        """The stored config in plain text, decrypted under `arn`.

        Raises CredentialsUnreadableError when KMS will not decrypt it under `arn`, and ServiceBusyError
        when KMS kept throttling.
        """
        return RunnerConfig(
            config_id=stored.config_id,
            run_key=stored.run_key,
            jit_config=b"".join(self._decrypt(blob, arn) for blob in stored.ciphertexts).decode(),
            runner_id=stored.runner_id,
            stored_at=stored.stored_at,
        )

    def _encrypt(self, chunk: bytes, context: dict[str, str]) -> bytes:
        blob: bytes = self._kms.encrypt(KeyId=self._key_id, Plaintext=chunk, EncryptionContext=context)[
            "CiphertextBlob"
        ]
        return blob

    def _decrypt(self, blob: bytes, arn: str) -> bytes:
        request: dict[str, Any] = {
            "CiphertextBlob": blob,
            "EncryptionContext": {ENCRYPTION_CONTEXT_KEY: arn},
        }
        if self._key_id is not None:
            request["KeyId"] = self._key_id
        decrypted = attempt(lambda: self._kms.decrypt(**request), _UNREADABLE_CODES)
        if isinstance(decrypted, Refusal):
            raise CredentialsUnreadableError(
                f"KMS refused to decrypt the runner config under {arn}: {decrypted.code}"
            ) from decrypted.error
        plaintext: bytes = decrypted["Plaintext"]
        return plaintext

    def _expiry(self, now: float) -> int:
        """A config is of use only while the record it was handed out with can still register."""
        lifetime = max(self._timeouts.created_threshold_seconds, self._timeouts.claimed_threshold_seconds)
        return math.ceil(now + lifetime)


def _stored_config(item: Any) -> StoredConfig | None:
    if item is None or CONFIG_RUN_KEY_ATTRIBUTE not in item:
        return None
    runner = item.get(RUNNER_ID_ATTRIBUTE, {}).get("N")
    return StoredConfig(
        config_id=item[CONFIG_ID_ATTRIBUTE]["S"],
        run_key=item[CONFIG_RUN_KEY_ATTRIBUTE]["S"],
        runner_id=None if runner is None else int(runner),
        stored_at=float(item["stored_at"]["N"]) if "stored_at" in item else None,
        ciphertexts=tuple(entry["B"] for entry in item[CIPHERTEXT_ATTRIBUTE]["L"]),
    )


def _check_arn(instance_id: str, arn: str) -> None:
    """The ARN is the item's key and the decryption's context: one of another instance is a bug."""
    if not names_instance(arn, instance_id):
        raise ValueError(f"{arn!r} is not the ARN of instance {instance_id}")
