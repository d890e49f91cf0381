"""`python -m agent` as systemd runs it: settings from the environment, identity from IMDSv2, AWS at an endpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from agent.imds import InstanceIdentity
from agent.settings import ENV_PREFIX
from emulator.aws import ACCOUNT, REGION, LocalAws, local_aws
from emulator.resources import create_state_table
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Signal
from tests.agent.conftest import MOTO_IMAGE_ID, eventually, jit_config, serve_imds
from tests.support import builders

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TABLE = "runner-pool-state"
RUN = builders.run_key(3, "/class=large")

pytestmark = pytest.mark.slow


@pytest.fixture
def aws_server() -> Iterator[LocalAws]:
    with local_aws() as aws:
        yield aws


class Lines:
    """Collects a process's output lines from a thread, so the test can read them while it runs."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def json(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]


def test_the_agent_process_boots_registers_and_stops_on_sigterm(
    aws_server: LocalAws, runner_dir: Path, tmp_path: Path
) -> None:
    # Given the AWS of a stack (on moto's server), an instance, and its metadata service
    dynamodb = aws_server.client("dynamodb")
    create_state_table(dynamodb, TABLE)
    kms = aws_server.client("kms")
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    instance_id = aws_server.client("ec2").run_instances(ImageId=MOTO_IMAGE_ID, MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    identity = InstanceIdentity(instance_id, REGION, ACCOUNT)
    timeouts = StackConfig().timeouts
    records = StateTable(TABLE, timeouts, SystemClock(), dynamodb, arns=identity.arns)
    credentials = RunnerCredentials(TABLE, timeouts, SystemClock(), key_id=key_id, dynamodb=dynamodb, kms=kms)
    records.create(builders.facts(instance_id=instance_id), None)
    records.admit(instance_id)

    with serve_imds(identity) as imds:
        # When systemd starts `python -m agent` with the settings the user data writes
        settings = {
            "TABLE_NAME": TABLE,
            "CREDENTIALS_KEY_ID": key_id,
            "IMDS_ENDPOINT": imds.endpoint,
            "HEARTBEAT_PERIOD_SECONDS": "0.2",
            "WATCH_PERIOD_SECONDS": "0.05",
            "RUNNER_DIR": str(runner_dir),
            "STATE_FILE": str(tmp_path / "agent-state.json"),
        }
        env = aws_server.child_environment(settings, ENV_PREFIX)
        process = subprocess.Popen(
            [sys.executable, "-m", "agent"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = Lines(process.stdout)  # type: ignore[arg-type]
        try:
            # Then it boots (UD_OK) and beats
            eventually(
                lambda: (s := records.read_signal(instance_id)) and s.signal is Signal.UD_OK,
                timeout=20,
                what="UD_OK from the agent process",
            )
            eventually(lambda: records.read_heartbeat(instance_id), what="a heartbeat")

            # And a claim with a stored config gets UD_REG_OK for the run
            records.claim(instance_id, RUN, uuid.uuid4().hex)
            credentials.store(instance_id, identity.arn, RUN, jit_config(idle_seconds=10))
            eventually(
                lambda: (s := records.read_signal(instance_id)) and s.confirms(Signal.UD_REG_OK, RUN),
                what="UD_REG_OK from the agent process",
            )
        finally:
            # And SIGTERM (systemctl stop) ends it cleanly
            process.send_signal(signal.SIGTERM)
            exit_code = process.wait(10)

    assert exit_code == 0
    logged = output.json()
    assert all(line["instance_id"] == instance_id for line in logged)
    assert any(
        line.get("run_key") == RUN and line["message"] == "runner listening for jobs" for line in logged
    )
    assert logged[-1]["message"] == "agent stopped"
