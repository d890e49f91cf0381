"""Local AWS failing as AWS does, on a seeded fraction of the control plane's calls: busy, failed, or
answered and then lost.

AWS answers any call with a throttle or a 500, and a 500 or a timeout may come after the call took effect
("the request might have succeeded": DynamoDB's error handling, Programming.Errors in its developer
guide; SQS and KMS likewise). The product's clients retry each as botocore's standard mode does
(runner_pool.adapters.aws_clients), so a fault here meets the very retries the product has in
production. Only calls made from a Lambda environment (botocore names `exec-env/AWS_Lambda_*` in its
User-Agent when AWS_EXECUTION_ENV is set, as Lambda sets it) are faulted: the agents' and the
harness's own reads stay exact, so a scenario's checks are of the control plane alone.

Services whose every call is safe to fault here are the ones the control plane's records, queues and
secrets live in; EC2 and Step Functions are left exact (their idempotency tokens are not modelled by
local AWS, so a lost answer there would be the emulator's fault, not the product's).
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

FAULTED_SERVICES = ("DynamoDB_20120810", "AmazonSQS", "TrentService", "secretsmanager")
"""The `X-Amz-Target` prefixes of the services faulted: DynamoDB, SQS (its JSON protocol), KMS, Secrets
Manager."""


class Fault(StrEnum):
    BUSY = "busy"
    """Refused before it took effect: a throttle."""
    FAILED = "failed"
    """Refused before it took effect: a 500."""
    LOST = "lost"
    """Took effect; its answer lost to a 500."""


_ANSWERS = {
    # JSON protocols' error shape: `__type` (smithy awsJson1_0 "Operation error serialization").
    Fault.BUSY: (400, "ThrottlingException"),
    Fault.FAILED: (500, "InternalServerError"),
    Fault.LOST: (500, "InternalServerError"),
}


@dataclass
class AwsFaults:
    """`fraction` of the faulted calls fail, each kind equally often, from `seed`."""

    fraction: float = 0.0
    seed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    """Fault kind and operation → how many calls it met."""
    _random: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)  # noqa: S311 - a reproducible plan, not a secret

    def wrap(self, app: Wsgi) -> Wsgi:
        def faulted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
            fault = self._fault(target, str(environ.get("HTTP_USER_AGENT", "")))
            if fault is None:
                return app(environ, start_response)
            if fault is Fault.LOST:
                answered = app(environ, lambda *_args, **_kwargs: None)
                for _ in answered:  # the call runs to its end: it took effect
                    pass
            status, code = _ANSWERS[fault]
            body = json.dumps({"__type": code, "message": f"{fault} by the emulator's fault plan"}).encode()
            start_response(
                f"{status} {'Bad Request' if status == 400 else 'Internal Server Error'}",
                [("Content-Type", "application/x-amz-json-1.0"), ("Content-Length", str(len(body)))],
            )
            return [body]

        return faulted

    def _fault(self, target: str, user_agent: str) -> Fault | None:
        if self.fraction <= 0 or "exec-env/AWS_Lambda" not in user_agent:
            return None
        if not target.startswith(FAULTED_SERVICES):
            return None
        with self._lock:
            if self._random.random() >= self.fraction:
                return None
            fault = self._random.choice(list(Fault))
            self.counts[f"{fault}:{target.rsplit('.', 1)[-1]}"] += 1
        return fault

    def total(self, fault: Fault | None = None) -> int:
        return sum(n for name, n in self.counts.items() if fault is None or name.startswith(f"{fault}:"))
