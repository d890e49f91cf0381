"""`python -m agent`: the runner-pool agent as systemd runs it on each instance."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import boto3
from pydantic import ValidationError

from agent import log as agent_log
from agent.imds import Imds, MetadataUnavailableError
from agent.settings import AgentSettings
from agent.wiring import build_agent
from runner_pool.adapters import aws_clients


def main() -> int:
    log = agent_log.configure()
    try:
        settings = AgentSettings()
    except ValidationError as exc:
        log.error("invalid agent settings", error=str(exc))
        return 2
    try:
        identity = Imds(settings.imds_endpoint).wait_for_identity()
    except MetadataUnavailableError as exc:
        log.error("the instance metadata service did not answer", error=str(exc))
        return 3
    session = boto3.session.Session(region_name=settings.region or identity.region)
    agent = build_agent(
        settings,
        identity,
        # The product's one retry policy (aws_clients); after its attempts, the agent's loop tries again.
        dynamodb=aws_clients.client("dynamodb", session),
        kms=aws_clients.client("kms", session),
        ec2=aws_clients.client("ec2", session),
        sqs=aws_clients.long_poll_client("sqs", settings.notice_wait_seconds, session),
        logs=aws_clients.client("logs", session),
        log=log,
    )
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    agent.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
