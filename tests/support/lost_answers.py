"""A DynamoDB client whose write takes effect but whose answer is lost, so the caller retries it.

DynamoDB answers a 500 (InternalServerError) or a timeout without saying whether the write was applied
("the request might have succeeded": https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Programming.Errors.html#Programming.Errors.MessagesAndCodes),
and the SDKs retry such answers on their own. A conditional write retried after its first attempt
applied then meets its own write and fails its condition: the product must read that as its own win.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError


class LosesFirstAnswer:
    """Proxies a client; the first `operation` call (e.g. "put_item") is applied, then answers a 500."""

    def __init__(self, client: Any, operation: str) -> None:
        self._client = client
        self._operation = operation
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)
        if name != self._operation:
            return call

        def applied_then_lost(**request: Any) -> Any:
            answer = call(**request)
            if self.lost == 0:
                self.lost += 1
                raise ClientError(
                    {"Error": {"Code": "InternalServerError", "Message": "answer lost"}},
                    "".join(part.title() for part in name.split("_")),
                )
            return answer

        return applied_then_lost
