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
from unittest import mock

from moto.core.config import default_user_config
from moto.moto_api._internal.models import moto_api_backend
from moto.server import ThreadedMotoServer
from werkzeug.serving import BaseWSGIServer

from emulator.atomic_dynamodb import atomic_items
from emulator.atomic_sqs import atomic_queues
from emulator.aws_faults import AwsFaults
from emulator.listening import LISTEN_BACKLOG
from emulator.moto_internals import patch_point
from emulator.moto_speedups import speedups
from emulator.sqs_long_polls import released_messages_wake_long_polls
from emulator.sqs_queue_list import queues_listed_from_a_snapshot
from emulator.step_functions import MOTO_CONFIG
from runner_pool.adapters import aws_clients
from runner_pool.adapters.instance_arns import InstanceArns

REGION = "us-east-1"
ACCOUNT = "123456789012"
"""The account moto answers as."""
INSTANCE_ARNS = InstanceArns("aws", REGION, ACCOUNT)
"""What keys an instance's items on local AWS; given to each state table, since a table left to ask
STS itself would ask with a client aimed at the real AWS, not at this one."""


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

    def long_poll_client(self, service: str, wait_seconds: float, connections: int = 10) -> Any:
        """`client`, for long polls of up to `wait_seconds`, `connections` of them at once at most."""
        return aws_clients.long_poll_client(
            service,
            wait_seconds,
            connections=connections,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",  # noqa: S106
        )

    def client(self, service: str, counter: CallCounter | None = None) -> Any:
        # Built as the product builds its clients (its retry policy, its ServiceBusyError), aimed here.
        client = aws_clients.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",  # noqa: S106
        )
        return client if counter is None else counter.watch(client)


@contextmanager
def behaving_as_aws() -> Iterator[None]:
    """moto made to behave as AWS where our code meets a difference (DynamoDB's item atomicity,
    emulator/atomic_dynamodb.py; an SQS receive taking its messages alone, emulator/atomic_sqs.py;
    a released SQS message waking a waiting long poll,
    emulator/sqs_long_polls.py; ListQueues beside CreateQueue, emulator/sqs_queue_list.py), and without
    the work moto repeats per request (emulator/moto_speedups.py): for every moto the emulator and the
    tests run, server or `mock_aws`."""
    with (
        atomic_items(),
        atomic_queues(),
        released_messages_wake_long_polls(),
        queues_listed_from_a_snapshot(),
        speedups(),
    ):
        yield


@contextmanager
def local_aws(*, state_machines: bool = False, faults: AwsFaults | None = None) -> Iterator[LocalAws]:
    """moto's server in this process, on a free port of 127.0.0.1, behaving as AWS (`behaving_as_aws`).

    `state_machines=True`: Step Functions executes state machines, and Lambda stays in this process
    (with `emulator.step_functions.lambdas_in_process` routing invocations to our handlers). `faults`:
    a seeded fraction of the Lambdas' calls fails as AWS's do (emulator/aws_faults.py).
    """
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    port = _free_port()
    os.environ["MOTO_PORT"] = str(port)  # moto builds queue URLs and the like from it
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    with (
        behaving_as_aws(),
        _backends_found_once(),
        _moto_config(MOTO_CONFIG if state_machines else {}),
    ):
        with mock.patch.object(BaseWSGIServer, "request_queue_size", LISTEN_BACKLOG):
            server.start()  # returns once the server listens
        if faults is not None:
            # moto's server keeps its WSGI server private; its app is werkzeug's BaseWSGIServer.app.
            wsgi = server._server
            if wsgi is None:
                raise RuntimeError("moto's server started without its WSGI server")
            wsgi.app = faults.wrap(wsgi.app)
        try:
            yield LocalAws(f"http://127.0.0.1:{port}")
        finally:
            server.stop()
            # moto's backends are this process's, not the server's: the next local AWS starts empty.
            moto_api_backend.reset()


_BACKEND_FOR_HOST = "moto.moto_server.werkzeug_app:DomainDispatcherApplication.get_backend_for_host"


@contextmanager
def _backends_found_once() -> Iterator[None]:
    """moto's server finds the backend of every request anew, under its dispatcher's one lock: it lists
    moto's package directory (a stat for each of its ~200 services) and tries every service's URL
    patterns, which was a tenth of a 300-instance burst's samples, every request of every thread queued
    behind it. Which backend a host names does not change while the server runs: found once per host."""
    owner, name = patch_point(_BACKEND_FOR_HOST)
    find = getattr(owner, name)
    found: dict[str | None, Any] = {}

    def backend_for_host(dispatcher: Any, host: str | None) -> Any:
        # Called under the dispatcher's lock (DomainDispatcherApplication.get_application).
        if host not in found:
            found[host] = find(dispatcher, host)
        return found[host]

    with mock.patch.object(owner, name, backend_for_host):
        yield


@contextmanager
def _moto_config(settings: Mapping[str, Mapping[str, Any]]) -> Iterator[None]:
    """moto's server reads its configuration from the process-wide default (mock_aws(config=...) is
    for in-process mocks), so set it there while the server runs."""
    config: dict[str, dict[str, Any]] = default_user_config  # type: ignore[assignment]
    saved = {service: dict(config.get(service, {})) for service in settings}
    for service, values in settings.items():
        config.setdefault(service, {}).update(values)
    try:
        yield
    finally:
        config.update(saved)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
