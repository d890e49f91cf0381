"""Fixtures for the agent: a moto instance, the credentials key, a fake runner, and the agent in a thread.

The agent under test is the real one (`agent.wiring.build_agent`) with its own DynamoDB client, so a
test can throttle the agent's calls without touching the control plane's. The control plane's side
is played through the same adapters the Lambdas use: the state table's transitions and the runner
credentials store.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse, HTTPHeaders

from agent.docker import Docker
from agent.imds import InstanceIdentity
from agent.log import agent_log
from agent.loop import Agent
from agent.settings import AgentSettings
from agent.wiring import build_agent
from emulator.aws import ACCOUNT
from emulator.harness.control_plane import NO_WAIT, REGION
from emulator.iam_check import PolicyCheck, save_usage
from emulator.iam_stack import StackIam, checked_template
from runner_pool.adapters import aws_clients
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Signal, WorkerSignal
from tests.conftest import TABLE_NAME
from tests.support import builders, waiting

FAKE_RUNNER = Path(__file__).with_name("fake_runner.py")
MOTO_IMAGE_ID = "ami-12c6146b"
"""One of the images moto knows without being asked (describing them costs a second)."""
WAIT_SECONDS = 10.0
"""Real but tiny pauses: the agent's retries are exercised as they run, in milliseconds."""


def jit_config(mode: str = "job", **behaviour: Any) -> str:
    """A config shaped as GitHub's generate-jitconfig returns it (base64 JSON of the runner's settings
    files, each base64 JSON), whose `.runner` also tells the fake runner how to behave; `id` tells one
    start of the runner from another."""
    files = {
        ".runner": {
            "agentId": 7,
            "agentName": "fake-runner",
            "ephemeral": True,
            "fakeRunner": {"id": uuid.uuid4().hex, "mode": mode, **behaviour},
        },
        ".credentials": {"scheme": "OAuthAccessToken", "data": {"token": "fake"}},
    }
    return _b64_json({name: _b64_json(content) for name, content in files.items()})


def config_file(config: str, name: str = ".runner") -> dict[str, Any]:
    """One settings file of a JIT config, decoded."""
    decoded: dict[str, Any] = json.loads(base64.b64decode(json.loads(base64.b64decode(config))[name]))
    return decoded


def config_id(config: str) -> str:
    """The `id` of a config jit_config made."""
    return str(config_file(config)["fakeRunner"]["id"])


def _b64_json(value: Any) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def eventually(check: Callable[[], Any], timeout: float = WAIT_SECONDS, what: str = "condition") -> Any:
    """tests/support/waiting.py's, with an agent test's time to wait."""
    return waiting.eventually(check, what, timeout)


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone: it has ended and only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@pytest.fixture
def kms_key(aws: None) -> str:
    key_id: str = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["KeyId"]
    return key_id


@pytest.fixture
def instance_id() -> str:
    """An instance id no EC2 knows; tests that end the instance launch a real one in moto instead."""
    return "i-0a1b2c3d4e5f60718"


def launch_instance() -> str:
    """An instance in moto's EC2 (a few hundred milliseconds each: moto builds its EC2 for each test)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    launched: str = ec2.run_instances(ImageId=MOTO_IMAGE_ID, MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    return launched


def instance_state(instance_id: str) -> str:
    ec2 = boto3.client("ec2", region_name=REGION)
    instances = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"]
    state: str = instances[0]["State"]["Name"]
    return state


@pytest.fixture
def identity(instance_id: str) -> InstanceIdentity:
    return InstanceIdentity(instance_id=instance_id, region=REGION, account_id=ACCOUNT)


@pytest.fixture
def runner_dir(tmp_path: Path) -> Path:
    """A runner directory whose run.sh starts the fake runner, as the real run.sh starts the listener."""
    directory = tmp_path / "actions-runner"
    directory.mkdir()
    script = directory / "run.sh"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_RUNNER}" "$@"\n')
    script.chmod(0o755)
    return directory


@dataclass
class ControlPlane:
    """The control plane's side of the protocol, through the adapters the Lambdas use."""

    records: StateTable
    credentials: RunnerCredentials
    identity: InstanceIdentity
    claim_token: str | None = None

    @property
    def instance_id(self) -> str:
        return self.identity.instance_id

    def launch_for_pool(self) -> None:
        facts = builders.facts(instance_id=self.instance_id)
        assert self.records.create(facts, run_key=None).succeeded
        assert self.records.admit(self.instance_id).succeeded

    def claim(self, run_key: str, config: str | None) -> None:
        self.claim_token = uuid.uuid4().hex
        assert self.records.claim(self.instance_id, run_key, claim_token=self.claim_token).succeeded
        if config is not None:
            self.hand_over(run_key, config)

    def hand_over(self, run_key: str, config: str) -> None:
        self.credentials.store(self.instance_id, self.identity.arn, run_key, config)

    def activate(self, run_key: str) -> None:
        activated = self.records.activate(
            self.instance_id, run_key, max_runtime_minutes=60, claim_token=self.claim_token
        )
        assert activated.succeeded

    def release(self, run_key: str) -> None:
        assert self.records.release(self.instance_id, run_key).succeeded

    def released_after_its_job(self, run_key: str) -> None:
        """The run's job went to work on the instance, then the run released it; the agent's receipt
        (UD_REMOVE_REG_OK) awaited."""
        self.activate(run_key)
        self.release(run_key)
        self.await_signal(Signal.UD_REMOVE_REG_OK, run_key)

    def signal(self) -> WorkerSignal | None:
        return self.records.read_signal(self.instance_id)

    def latest_signal(self) -> Signal | None:
        """What the agent's signal item says now; None before its first."""
        current = self.signal()
        return current.signal if current is not None else None

    def await_signal(
        self, signal: Signal, run_key: str | None, timeout: float = WAIT_SECONDS
    ) -> WorkerSignal:
        def confirmed() -> WorkerSignal | None:
            current = self.signal()
            return current if current is not None and current.confirms(signal, run_key) else None

        found: WorkerSignal = eventually(confirmed, timeout=timeout, what=f"{signal.value} for {run_key!r}")
        return found

    def await_reason(self, signal: Signal, run_key: str | None, timeout: float = WAIT_SECONDS) -> str:
        """The reason the agent gave with `signal` for `run_key` (a signal of a failure always gives one)."""
        reason = self.await_signal(signal, run_key, timeout).reason
        assert reason is not None
        return reason

    def await_runner(
        self, running: RunningAgent, run_key: str, config: str, timeout: float = WAIT_SECONDS
    ) -> None:
        """The agent signals UD_REG_OK for `run_key` once its runner listens, and it started the runner
        once, with exactly `config`: the one the control plane stored, never another."""
        self.await_signal(Signal.UD_REG_OK, run_key, timeout)
        assert running.runner_starts == [config_id(config)]


@pytest.fixture
def control_plane(
    dynamodb: Any,
    kms_key: str,
    clock: ManualClock,
    config: StackConfig,
    *,
    identity: InstanceIdentity,
) -> ControlPlane:
    records = StateTable(TABLE_NAME, config.timeouts, clock, dynamodb, NO_WAIT, arns=identity.arns)
    credentials = RunnerCredentials(
        TABLE_NAME,
        config.timeouts,
        clock,
        key_id=kms_key,
        dynamodb=dynamodb,
        kms=boto3.client("kms", region_name=REGION),
    )
    return ControlPlane(records, credentials, identity)


def throttling_response(
    code: str = "ThrottlingException", status: int = 400
) -> tuple[AWSResponse, dict[str, Any]]:
    """What a botocore before-call hook returns to answer a call with an AWS error, as the service would."""
    http = AWSResponse("https://dynamodb.us-east-1.amazonaws.com/", status, HTTPHeaders(), None)
    parsed = {
        "Error": {"Code": code, "Message": "Rate exceeded"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return http, parsed


@dataclass
class RunningAgent:
    """The agent in a thread of the test process, and what the test can see of it."""

    agent: Agent
    settings: AgentSettings
    dynamodb: Any
    ec2: Any
    sqs: Any
    powered_off: list[float]
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    looks: int = 0
    """How many looks at its record (`Agent.step`) the agent has finished, each with what followed from it."""
    listens: int = 0
    """How many long polls of its notice queue the agent has finished, heard or not."""

    def __post_init__(self) -> None:
        self.sqs.meta.events.register("after-call.sqs.ReceiveMessage", self._listened)
        look = self.agent.step

        def counted(*, noticed: bool = False) -> float:
            try:
                return look(noticed=noticed)
            finally:
                self.looks += 1

        self.agent.step = counted  # type: ignore[method-assign]

    def looked_again(self, times: int = 2) -> None:
        """Wait until the agent has finished `times` more looks from now, or ended its instance (it looks no
        more). The second look began after the first ended, so whatever the record says by now, the agent
        has seen and acted on."""
        seen = self.looks
        eventually(
            lambda: self.looks >= seen + times or self.agent.terminated,
            what=f"{times} more looks of the agent at its record",
        )

    def _listened(self, **_: Any) -> None:
        self.listens += 1

    def listened_again(self, times: int = 2) -> None:
        """Wait until the agent has finished `times` more long polls of its notice queue from now: the
        second began after now, so one whole poll has passed in which anything sent by now was heard."""
        seen = self.listens
        eventually(
            lambda: self.listens >= seen + times, what=f"{times} more long polls of the agent's notices"
        )

    def start(self) -> RunningAgent:
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), name="agent", daemon=True)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(WAIT_SECONDS)
            assert not self.thread.is_alive(), "the agent did not stop"

    @property
    def runner_starts(self) -> list[str]:
        """The `id` of each config the fake runner was started with, in order."""
        starts = self.settings.runner_dir / "starts.log"
        return starts.read_text().split() if starts.exists() else []


@dataclass
class AgentFactory:
    """Builds agents for one test; every agent it started is stopped when the test ends."""

    identity: InstanceIdentity
    runner_dir: Path
    clock: ManualClock
    kms_key: str
    tmp_path: Path
    started: list[RunningAgent] = field(default_factory=list)
    policy_check: PolicyCheck | None = None
    """Every call of the agents, checked against the synthesized instance role (emulator/iam_check.py)."""

    def settings(self, **overrides: Any) -> AgentSettings:
        values: dict[str, Any] = {
            "table_name": TABLE_NAME,
            "credentials_key_id": self.kms_key,
            "heartbeat_period_seconds": 0.1,
            "watch_period_seconds": 0.05,
            "watch_backoff_cap_seconds": 0.1,
            "termination_grace_seconds": 60,
            "orphan_grace_seconds": 600,
            "runner_dir": self.runner_dir,
            "listening_timeout_seconds": 5,
            "stop_timeout_seconds": 2,
            "state_file": self.tmp_path / "agent-state.json",
            **overrides,
        }
        return AgentSettings(_env_file=None, **values)

    def start(self, docker: Docker | None = None, **overrides: Any) -> RunningAgent:
        running = self.build(docker, **overrides).start()
        self.started.append(running)
        return running

    def build(self, docker: Docker | None = None, **overrides: Any) -> RunningAgent:
        """The agent with `overrides` of its settings; docker, if given, is the daemon it scrubs."""
        settings = self.settings(**overrides)
        # Built as `python -m agent` builds them: the product's retry policy (aws_clients).
        dynamodb = aws_clients.client("dynamodb", region_name=REGION)
        ec2 = aws_clients.client("ec2", region_name=REGION)
        kms = aws_clients.client("kms", region_name=REGION)
        sqs = aws_clients.long_poll_client("sqs", settings.notice_wait_seconds, region_name=REGION)
        logs = aws_clients.client("logs", region_name=REGION)
        self.check_as_instance(settings, dynamodb, ec2, kms, sqs, logs)
        powered_off: list[float] = []
        agent = build_agent(
            settings,
            self.identity,
            dynamodb=dynamodb,
            kms=kms,
            ec2=ec2,
            sqs=sqs,
            logs=logs,
            log=agent_log(),
            clock=self.clock,
            poweroff=lambda: powered_off.append(self.clock.now()),
            docker=(lambda: docker) if docker is not None else None,
        )
        return RunningAgent(agent, settings, dynamodb, ec2, sqs, powered_off)

    def check_as_instance(self, settings: AgentSettings, *clients: Any) -> None:
        """The agent's clients checked as this instance (one place, to move onto the harness's hook)."""
        if self.policy_check is None:
            environment = {"RUNNER_POOL_TABLE_NAME": settings.table_name}
            if settings.credentials_key_id:
                environment["RUNNER_POOL_CREDENTIALS_KEY_ID"] = settings.credentials_key_id
            self.policy_check = PolicyCheck(
                StackIam.bound(checked_template(), environment, region=REGION, account=ACCOUNT)
            )
        for client in clients:
            self.policy_check.on_client(client, self.policy_check.iam.instance(self.identity.instance_id))


@pytest.fixture
def agents(
    identity: InstanceIdentity, runner_dir: Path, clock: ManualClock, kms_key: str, tmp_path: Path
) -> Iterator[AgentFactory]:
    factory = AgentFactory(identity, runner_dir, clock, kms_key, tmp_path)
    yield factory
    for running in factory.started:
        running.halt()
    if factory.policy_check is not None:
        save_usage(factory.policy_check)
        factory.policy_check.assert_allowed()
    leftover = runner_dir / "leftover.pid"
    if leftover.exists() and process_alive(pid := int(leftover.read_text())):
        os.kill(pid, 9)


class FakeImds(ThreadingHTTPServer):
    """The instance metadata service as IMDSv2-only answers it: no session token, no metadata."""

    token = "imds-session-token"

    def __init__(self, identity: InstanceIdentity) -> None:
        super().__init__(("127.0.0.1", 0), _ImdsHandler)
        self.identity = identity
        self.requests: list[tuple[str, str, bool]] = []

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class _ImdsHandler(BaseHTTPRequestHandler):
    server: FakeImds

    def do_PUT(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.server.requests.append(("PUT", self.path, ttl is not None))
        if self.path != "/latest/api/token" or ttl is None:
            self._answer(400, "")
            return
        self._answer(200, self.server.token)

    def do_GET(self) -> None:
        authorised = self.headers.get("X-aws-ec2-metadata-token") == self.server.token
        self.server.requests.append(("GET", self.path, authorised))
        if not authorised:
            self._answer(401, "")
            return
        identity = self.server.identity
        answers = {
            "/latest/dynamic/instance-identity/document": json.dumps(
                {
                    "instanceId": identity.instance_id,
                    "region": identity.region,
                    "accountId": identity.account_id,
                }
            ),
            "/latest/meta-data/services/partition": identity.partition,
        }
        body = answers.get(self.path)
        self._answer(200 if body is not None else 404, body or "")

    def _answer(self, status: int, body: str) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: Any) -> None:
        """Quiet: the tests read the server's `requests` instead."""


@contextmanager
def serve_imds(identity: InstanceIdentity) -> Iterator[FakeImds]:
    server = FakeImds(identity)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake_imds() -> Iterator[FakeImds]:
    with serve_imds(InstanceIdentity("i-0123456789abcdef0", "eu-west-1", ACCOUNT, "aws")) as server:
        yield server


def pooled_agent(
    control_plane: ControlPlane, agents: AgentFactory, docker: Docker | None = None, **settings: Any
) -> RunningAgent:
    """An instance launched for the pool, its agent started with `settings` (its first look may be to come)."""
    control_plane.launch_for_pool()
    return agents.start(docker, **settings)


def idle_agent(
    control_plane: ControlPlane, agents: AgentFactory, docker: Docker | None = None, **settings: Any
) -> RunningAgent:
    """An instance launched for the pool, its agent started and reporting it ready (UD_OK, no run)."""
    running = pooled_agent(control_plane, agents, docker, **settings)
    control_plane.await_signal(Signal.UD_OK, None)
    return running
