"""The instances' notice queues over SQS (domain/notices.py): open, notify, list, close.

Every method turns SQS's errors into outcomes, because a notice is a shortcut, never the truth: a
queue that cannot be opened or notified leaves its agent reading its record at its watch period.

Opening many queues at once (a fleet of a few hundred) runs the CreateQueue calls side by side, so a
large creation does not spend its Lambda's time one queue after another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import ServiceBusyError
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.side_by_side import side_by_side
from runner_pool.domain import notices
from runner_pool.domain.notices import NoticeFailure

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

_Item = TypeVar("_Item")

LIST_PAGE = 1000
"""ListQueues' largest page (Amazon SQS API Reference, ListQueues: MaxResults, 1 to 1,000)."""
GONE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
"""How SQS says a queue does not exist: the query protocol's code, and the JSON protocol's."""


class NoticeQueues:
    def __init__(
        self,
        url_prefix: str,
        client: SQSClient | None = None,
        *,
        stack_tag: tuple[str, str],
        arns: InstanceArns,
    ) -> None:
        """`url_prefix`: every notice queue's URL up to the instance id (notices.queue_name_prefix);
        `stack_tag`: the stack's tag, which every queue carries beside its instance's ARN (`arns`)."""
        self._url_prefix = url_prefix
        self._name_prefix = url_prefix.rsplit("/", 1)[-1]
        self._client: SQSClient = client or aws_clients.client("sqs")
        self._stack_tag = stack_tag
        self._arns = arns

    def url(self, instance_id: str) -> str:
        return notices.queue_name(self._url_prefix, instance_id)

    def open(self, instance_ids: Iterable[str]) -> list[NoticeFailure]:
        """Open (create, or find already made) the notice queue of each instance, tagged with its ARN.

        CreateQueue answers an existing queue's URL when the attributes are the same (Amazon SQS API
        Reference, CreateQueue), so opening twice is harmless; the tags need sqs:TagQueue as well as
        sqs:CreateQueue ("To be able to tag a queue on creation, you must have the sqs:CreateQueue and
        sqs:TagQueue permissions", same page).
        """
        key, value = self._stack_tag

        def open_one(instance_id: str) -> NoticeFailure | None:
            try:
                self._client.create_queue(
                    QueueName=notices.queue_name(self._name_prefix, instance_id),
                    Attributes={
                        "MessageRetentionPeriod": str(notices.RETENTION_SECONDS),
                        "SqsManagedSseEnabled": "true",
                    },
                    tags={key: value, notices.INSTANCE_TAG_KEY: self._arns.arn(instance_id)},
                )
            except (ClientError, BotoCoreError, ServiceBusyError, aws_clients.ServiceUnreachableError) as exc:
                return NoticeFailure(instance_id, _reason(exc))
            return None

        return _failures(open_one, instance_ids)

    def notify(self, instance_id: str) -> NoticeFailure | None:
        """Tell the instance's agent to read its record now; None when SQS took the notice."""
        try:
            self._client.send_message(QueueUrl=self.url(instance_id), MessageBody=notices.NOTICE)
        except (ClientError, BotoCoreError, ServiceBusyError, aws_clients.ServiceUnreachableError) as exc:
            return NoticeFailure(instance_id, _reason(exc))
        return None

    def instance_ids(self) -> list[str]:
        """The instances that have a notice queue now (ListQueues by the stack's name prefix)."""
        found: list[str] = []
        token: str | None = None
        while True:
            page = self._client.list_queues(
                QueueNamePrefix=self._name_prefix,
                MaxResults=LIST_PAGE,
                **({"NextToken": token} if token else {}),
            )
            found.extend(
                instance_id
                for url in page.get("QueueUrls", [])
                if (instance_id := notices.instance_of(url, self._name_prefix)) is not None
            )
            token = page.get("NextToken")
            if not token:
                return found

    def close(self, instance_ids: Iterable[str]) -> list[NoticeFailure]:
        """Delete the notice queues of these instances; one already gone counts as closed."""

        def close_one(instance_id: str) -> NoticeFailure | None:
            try:
                self._client.delete_queue(QueueUrl=self.url(instance_id))
            except ClientError as exc:
                if aws_clients.error_code(exc) in GONE_CODES:
                    return None
                return NoticeFailure(instance_id, _reason(exc))
            except (BotoCoreError, ServiceBusyError, aws_clients.ServiceUnreachableError) as exc:
                return NoticeFailure(instance_id, _reason(exc))
            return None

        return _failures(close_one, instance_ids)


def _failures(call: Callable[[_Item], NoticeFailure | None], items: Iterable[_Item]) -> list[NoticeFailure]:
    return [failure for failure in side_by_side(call, items) if failure is not None]


def _reason(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return f"{aws_clients.error_code(exc)}: {exc}"
    return repr(exc)
