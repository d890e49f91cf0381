"""`python -m agent`: the runner-pool agent as systemd runs it on each instance."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import boto3
from botocore.config import Config
from pydantic import ValidationError

from agent import log as agent_log
from agent.imds import Imds, MetadataUnavailableError
from agent.settings import AgentSettings
from agent.wiring import build_agent

CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 2},
    connect_timeout=3,
    read_timeout=10,
)
"""Short timeouts: a hung request must not hold the loop; the agent's own backoff does the retrying."""


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
        dynamodb=session.client("dynamodb", config=CLIENT_CONFIG),
        kms=session.client("kms", config=CLIENT_CONFIG),
        ec2=session.client("ec2", config=CLIENT_CONFIG),
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
