"""Sending webhook events as the App's webhook does: signed, to one URL, each attempt recorded as a delivery.

GitHub POSTs each event with `X-GitHub-Event`, a `X-GitHub-Delivery` GUID that names the event
across redeliveries, and `X-Hub-Signature-256` (HMAC-SHA256 of the body with the webhook secret).
It never retries a failed delivery on its own: the attempt is listed by the App's hook deliveries
API, and whoever wants it asks for a redelivery.

Events go out from a few sender threads, so a slow receiver does not hold up the runner or the test
that caused them. Only the events of one job (queued, in progress, completed), and those of one run,
go out in the order they happened: GitHub promises no order between deliveries (none is documented;
each can take "a few minutes" and may be throttled, docs.github.com/en/webhooks/testing-and-
troubleshooting-webhooks/troubleshooting-webhooks), so a run's completion may overtake its last job's,
and a matrix's queued jobs arrive side by side (community discussion #211830, "Handling Duplicate and
Out-of-Order GitHub Webhook Events"). A test can tell
the sender to drop the next matching events: they are recorded as failed attempts that never
reached the receiver, as when the endpoint could not be reached.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulator.fake_github.state import FakeDelivery, GitHubState

HOOK_ID = 109948940
USER_AGENT = "GitHub-Hookshot/f1f2b3c"
DELIVERY_TIMEOUT_SECONDS = 10.0
"""GitHub gives the receiver 10 s, then records the delivery as failed."""
SENDER_THREADS = 4
REDELIVERY_WAIT_SECONDS = 1.0
"""How long a redelivery request waits for its attempt before answering 202 anyway."""
UNREACHABLE = 0
"""The status code GitHub records when it could not reach the endpoint at all."""


def signature(secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` header of `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class DropRule:
    """Drop the next `count` events of `event` (and `action`, if given) for which `where` holds."""

    event: str
    action: str | None
    count: int
    where: Callable[[dict[str, Any]], bool] | None = None

    def takes(self, event: str, action: str | None, payload: dict[str, Any]) -> bool:
        if self.count <= 0 or event != self.event or (self.action is not None and action != self.action):
            return False
        return self.where is None or self.where(payload)


@dataclass
class _Pending:
    delivery: FakeDelivery
    order_key: str
    redelivery: bool = False
    attempted: threading.Event = field(default_factory=threading.Event)


@dataclass
class Webhooks:
    """The App's webhook: where events go, and the threads that send them."""

    state: GitHubState
    app_id: int
    url: str | None = None
    secret: str = field(default="", repr=False)
    drops: list[DropRule] = field(default_factory=list)
    _pending: list[_Pending] = field(default_factory=list, repr=False)
    _in_flight: set[str] = field(default_factory=set, repr=False)
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _senders: list[threading.Thread] = field(default_factory=list, repr=False)
    _stopping: bool = False

    def point_at(self, url: str, secret: str) -> None:
        """Deliver every event from now on to `url`, signed with `secret`."""
        self.url, self.secret = url, secret
        self.state.webhook_receiver = self._post

    def disconnect(self) -> None:
        """The endpoint is gone: every attempt from now on fails to connect, and is recorded so."""
        self.url = None
        self.state.webhook_receiver = self._post

    def drop_next(
        self,
        event: str,
        action: str | None = None,
        *,
        count: int = 1,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> DropRule:
        rule = DropRule(event, action, count, where)
        with self._changed:
            self.drops.append(rule)
        return rule

    def send(
        self,
        event: str,
        action: str | None,
        payload: dict[str, Any],
        *,
        order_key: str,
        installation_id: int | None = None,
        repository_id: int | None = None,
    ) -> None:
        """Send one event: from a sender thread when they run, else at once in this thread."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        delivery = FakeDelivery(
            delivery_id=0,
            guid=str(uuid.uuid4()),
            event=event,
            action=action,
            status_code=UNREACHABLE,
            delivered_at=self.state.clock.now(),
            installation_id=installation_id,
            repository_id=repository_id,
            payload=body,
        )
        with self._changed:
            dropped = next((rule for rule in self.drops if rule.takes(event, action, payload)), None)
            if dropped is not None:
                dropped.count -= 1
            elif self._senders:
                self._pending.append(_Pending(delivery, order_key))
                self._changed.notify_all()
                return
        if dropped is not None:
            self.state.add_delivery(
                event,
                action,
                UNREACHABLE,
                guid=delivery.guid,
                installation_id=installation_id,
                repository_id=repository_id,
                payload=body,
            )
        else:
            self.state.attempt(delivery)

    def redeliver(self, delivery_id: int, wait_seconds: float = REDELIVERY_WAIT_SECONDS) -> None:
        """A new attempt at a delivery's event, as GitHub makes it shortly after accepting the request:
        from a sender thread, waited for up to `wait_seconds`; at once when no sender runs."""
        if not self._senders:
            self.state.redeliver(delivery_id)
            return
        with self._changed:
            original = self.state.deliveries[delivery_id]
            self.state.redelivery_requests.append(delivery_id)
            pending = _Pending(original, f"redelivery-{delivery_id}", redelivery=True)
            self._pending.append(pending)
            self._changed.notify_all()
        pending.attempted.wait(wait_seconds)

    def flush(self, timeout_seconds: float = 10.0) -> bool:
        """Wait until every event sent so far has been attempted; False if that took too long."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._in_flight, timeout_seconds)

    # --- sender threads

    def start(self, threads: int = SENDER_THREADS) -> None:
        self._stopping = False
        self._senders = [
            threading.Thread(target=self._send_pending, name=f"webhook-sender-{n}", daemon=True)
            for n in range(threads)
        ]
        for sender in self._senders:
            sender.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for sender in self._senders:
            sender.join()
        self._senders = []

    def _send_pending(self) -> None:
        while (pending := self._next()) is not None:
            try:
                self.state.attempt(pending.delivery, redelivery=pending.redelivery)
            finally:
                pending.attempted.set()
                with self._changed:
                    self._in_flight.discard(pending.order_key)
                    self._changed.notify_all()

    def _next(self) -> _Pending | None:
        """The oldest pending event whose job or run has no event in flight; None once stopping."""
        with self._changed:
            while True:
                if self._stopping:
                    return None
                for index, pending in enumerate(self._pending):
                    if pending.order_key not in self._in_flight:
                        del self._pending[index]
                        self._in_flight.add(pending.order_key)
                        return pending
                self._changed.wait()

    # --- the HTTP attempt

    def _post(self, delivery: FakeDelivery) -> int:
        if self.url is None:
            return UNREACHABLE
        request = urllib.request.Request(  # noqa: S310 - the configured webhook URL, http on localhost
            self.url,
            data=delivery.payload,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "X-GitHub-Event": delivery.event,
                "X-GitHub-Delivery": delivery.guid,
                "X-GitHub-Hook-ID": str(HOOK_ID),
                "X-GitHub-Hook-Installation-Target-Type": "integration",
                "X-GitHub-Hook-Installation-Target-ID": str(self.app_id),
                "X-Hub-Signature-256": signature(self.secret, delivery.payload),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=DELIVERY_TIMEOUT_SECONDS) as response:  # noqa: S310
                return int(response.status)
        except urllib.error.HTTPError as refused:
            return int(refused.code)
        except (urllib.error.URLError, OSError):
            return UNREACHABLE
