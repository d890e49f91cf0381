"""Local AWS: moto's server on a free loopback port, clients pointed at it, and a count of the calls made."""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from emulator.atomic_dynamodb import atomic_items

REGION = "us-east-1"


@dataclass
class CallCounter:
    """Counts the API calls clients make, per service and operation (not botocore's own retries)."""

    calls: Counter[str] = field(default_factory=Counter)

    def watch(self, client: Any) -> Any:
        client.meta.events.register("before-call.*.*", self._count)
        return client

    def _count(self, model: Any, **_: Any) -> None:
        self.calls[f"{model.service_model.service_name}:{model.name}"] += 1

    def total(self, service: str | None = None) -> int:
        return sum(n for name, n in self.calls.items() if service is None or name.startswith(f"{service}:"))

    def by_operation(self, service: str) -> str:
        ops = sorted(
            (name.split(":", 1)[1], n) for name, n in self.calls.items() if name.startswith(f"{service}:")
        )
        return ", ".join(f"{op} {n}" for op, n in ops)


@dataclass(frozen=True)
class LocalAws:
    endpoint: str

    def child_environment(self, settings: Mapping[str, str], settings_prefix: str) -> dict[str, str]:
        """The environment for a child process (e.g. the real agent) that must reach this AWS only.

        This process's own AWS_* and `settings_prefix` variables are left out, so nothing of the
        machine's real AWS or of another run leaks in; `settings` are given the prefix.
        """
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", settings_prefix))}
        return {
            **inherited,
            **{settings_prefix + name: value for name, value in settings.items()},
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, service: str, counter: CallCounter | None = None) -> Any:
        client = boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",  # noqa: S106
        )
        return client if counter is None else counter.watch(client)


@contextmanager
def local_aws() -> Iterator[LocalAws]:
    """moto's server in this process, on a free port of 127.0.0.1, with DynamoDB's item atomicity."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    port = _free_port()
    os.environ["MOTO_PORT"] = str(port)  # moto builds queue URLs and the like from it
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    with atomic_items():
        server.start()
        try:
            yield LocalAws(f"http://127.0.0.1:{port}")
        finally:
            server.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
