"""The emulator's HTTP servers on the loopback (the fake GitHub, API Gateway, instance metadata), and how
many connections its servers (those and local AWS) hold before they accept them.

Each server accepts in one thread, and that thread shares this process's interpreter with every agent,
runner watcher and state machine thread of a large burst: it may not run for a second or more. Past a
listening socket's backlog, Linux drops a connection's SYN ("if the underlying protocol supports
retransmission, the request may be ignored so that a later reattempt at connection succeeds", listen(2)),
and the client's connect times out: botocore's after 2 s (runner_pool/adapters/aws_clients.py), failing
a call AWS's endpoints would have taken (the ConnectTimeoutErrors of the loaded 1,000-job bursts).
socketserver listens with a backlog of 5, werkzeug (moto's server) with 128.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

LISTEN_BACKLOG = 1024
"""Connections queued for accepting; Linux caps it at net.core.somaxconn (4096 since 5.4)."""


class Served:
    """What serves between `start` and `stop`; `with` starts and stops it."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class LoopbackServer(Served, ThreadingHTTPServer):
    """Serves `handler` on a free port of 127.0.0.1, from a thread of its own between `start` and `stop`."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str, poll_seconds: float) -> None:
        """`poll_seconds`: how often the serving thread looks for a stop request (`stop` waits up to it)."""
        super().__init__(("127.0.0.1", 0), handler)
        self._serving = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": poll_seconds}, name=name, daemon=True
        )

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> None:
        self._serving.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._serving.join()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that hangs up mid-answer (a stopped runner, a timed-out call) is its business."""


class LoopbackHandler(BaseHTTPRequestHandler):
    """A request of a LoopbackServer: read its body, send one answer, log nothing."""

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status: int, headers: Iterable[tuple[str, str]], payload: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request otherwise."""
