"""How many connections the emulator's servers (local AWS, the fake GitHub, API Gateway) hold before
they accept them.

Each server accepts in one thread, and that thread shares this process's interpreter with every agent,
runner watcher and state machine thread of a large burst: it may not run for a second or more. Past a
listening socket's backlog, Linux drops a connection's SYN ("if the underlying protocol supports
retransmission, the request may be ignored so that a later reattempt at connection succeeds", listen(2)),
and the client's connect times out: botocore's after 2 s (runner_pool/adapters/aws_clients.py), failing
a call AWS's endpoints would have taken (the ConnectTimeoutErrors of the loaded 1,000-job bursts).
socketserver listens with a backlog of 5, werkzeug (moto's server) with 128.
"""

from __future__ import annotations

LISTEN_BACKLOG = 1024
"""Connections queued for accepting; Linux caps it at net.core.somaxconn (4096 since 5.4)."""
