"""The agent's steady-state cost: CPU time, DynamoDB and SQS requests per minute and their dollars per
month, idle and while a job runs; how fast a notice gets a claim heard; and the scrub's time per release.

The agent runs as on an instance, in a process of its own with the design's default periods
(heartbeat 30 s, record watch 15 s) and its notice queue (a 20 s long poll; runner_pool.domain.notices),
against a moto server in this process; a fake runner (the tests' one) stands in for the GitHub runner
and runs a long job. The child process reports its own CPU time (every thread of the agent; the
runner, a separate process, is not counted) and counts its AWS calls; the figures are the differences
between two reports taken a measuring window apart. The claim is handed over as the claim step does
it (config stored, then a notice), and timed from the notice to the runner's UD_REG_OK.

The scrub is measured apart, in this process, as the residue test runs it (emulator/instance_root.py):
a throwaway instance root, a real runner account (useradd), a job that plants every kind of residue
it can, then the real scrub, timed, for each release; the runner directory is a synthetic one of
RUNNER_MEGABYTES (the scrub hashes all of it), docker the in-memory daemon (its commands' own time
is not in the figure).
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.settings import ENV_PREFIX
from bench.emulator import DYNAMODB_PER_READ, DYNAMODB_PER_WRITE, SQS_PER_REQUEST
from bench.results import BenchTable
from emulator.aws import ACCOUNT, INSTANCE_ARNS, REGION, CallCounter, LocalAws, local_aws
from emulator.instances import instance_facts
from emulator.resources import create_state_table
from runner_pool.adapters import aws_clients
from runner_pool.adapters.notice_queues import NoticeQueues
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain import notices
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Signal
from runner_pool.prices import HOURS_PER_MONTH

WINDOW_SECONDS = 90.0
"""Three heartbeats, six record reads and four or five long polls at the default periods."""
MINUTES_PER_MONTH = HOURS_PER_MONTH * 60
AGENT_BATCH_ITEMS = 2
"""The items of the agent's one batch read, woken by a notice: its record and its runner config."""
TARGET_IDLE_DYNAMODB_DOLLARS_PER_MONTH = 0.13
"""Issue 15: at least 5x below the $0.65 of the agent that read its record every second."""
TABLE = "bench-agent-state"
RUN_KEY = "pool=1/class=large"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
FAKE_RUNNER = PROJECT_ROOT / "tests" / "agent" / "fake_runner.py"
MOTO_IMAGE_ID = "ami-12c6146b"


@dataclass(frozen=True)
class Snapshot:
    cpu_seconds: float
    wall_seconds: float
    calls: dict[str, int]


@dataclass(frozen=True)
class Window:
    """What the agent spent between two snapshots, per minute."""

    cpu_ms_per_minute: float
    cpu_percent: float
    dynamodb_per_minute: float
    sqs_per_minute: float
    by_operation: dict[str, float]

    @classmethod
    def between(cls, start: Snapshot, end: Snapshot) -> Window:
        minutes = (end.wall_seconds - start.wall_seconds) / 60
        cpu = end.cpu_seconds - start.cpu_seconds
        calls = {name: (n - start.calls.get(name, 0)) / minutes for name, n in end.calls.items()}
        dynamodb = sum(n for name, n in calls.items() if name.startswith("dynamodb:"))
        sqs = sum(n for name, n in calls.items() if name.startswith("sqs:"))
        return cls(cpu * 1000 / minutes, cpu / (minutes * 60) * 100, dynamodb, sqs, calls)

    @property
    def dynamodb_dollars_per_month(self) -> float:
        """At on-demand list prices: a consistent GetItem of an item under 4 KB is one read request unit,
        a PutItem under 1 KB one write request unit (DynamoDB Developer Guide, "Read/write capacity mode");
        a BatchGetItem is billed per item it reads, and the agent's names two (its record, its config)."""
        gets = sum(n for name, n in self.by_operation.items() if name.startswith("dynamodb:Get"))
        batches = self.by_operation.get("dynamodb:BatchGetItem", 0.0)
        writes = self.dynamodb_per_minute - gets - batches
        reads = gets + AGENT_BATCH_ITEMS * batches
        return (reads * DYNAMODB_PER_READ + writes * DYNAMODB_PER_WRITE) * MINUTES_PER_MONTH

    @property
    def sqs_dollars_per_month(self) -> float:
        """Every SQS request is billed, an empty long poll too (Amazon SQS pricing)."""
        return self.sqs_per_minute * SQS_PER_REQUEST * MINUTES_PER_MONTH

    def operations(self) -> str:
        return ", ".join(f"{name} {n:.0f}" for name, n in sorted(self.by_operation.items()) if n)


SCRUB_RELEASES = 10
RUNNER_MEGABYTES = 128
"""A runner directory of this size, in 1 MiB files, stands in for the real release's (hashed each scrub)."""


SMALL = {"scrub_releases": 2, "runner_megabytes": 4, "window_seconds": 3.0}
"""`make test`'s size (tests/bench): the same measurements, short windows and a small runner."""


def run(
    scrub_releases: int = SCRUB_RELEASES,
    runner_megabytes: int = RUNNER_MEGABYTES,
    window_seconds: float = WINDOW_SECONDS,
) -> BenchTable:
    with local_aws() as aws, tempfile.TemporaryDirectory() as scratch:
        table = _measure(aws, Path(scratch), window_seconds)
    scrub = measure_scrub(scrub_releases, runner_megabytes)
    scrub.add_to(table)
    return table


@dataclass(frozen=True)
class ScrubTimes:
    releases: int
    runner_megabytes: int
    seconds: list[float]
    check_before_start_seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def add_to(self, table: BenchTable) -> None:
        table.note(
            f"scrub per release ({self.releases} releases, each after the residue test's job; runner "
            f"directory {self.runner_megabytes} MiB, hashed): median {self.median * 1000:.0f} ms, "
            f"max {max(self.seconds) * 1000:.0f} ms; the stat check before each start: median "
            f"{statistics.median(self.check_before_start_seconds) * 1000:.1f} ms"
        )
        table.figure("agent_scrub_per_release_median_seconds", round(self.median, 3))
        table.figure("agent_scrub_per_release_max_seconds", round(max(self.seconds), 3))
        table.figure(
            "agent_check_before_start_median_milliseconds",
            round(statistics.median(self.check_before_start_seconds) * 1000, 2),
        )


def measure_scrub(releases: int, runner_megabytes: int) -> ScrubTimes:
    """The real scrub after each of `releases` jobs that plant every kind of residue; each comes out clean."""
    from agent.scrub import build_scrub  # noqa: PLC0415
    from emulator.fake_docker import FakeDocker  # noqa: PLC0415 - a throwaway instance on this kernel
    from emulator.instance_root import RESIDUE_JOB, instance_root, plant_in_docker, run_job  # noqa: PLC0415

    blob = os.urandom(1 << 20)
    with instance_root(
        runner_files={f"externals/blob-{n:04}": blob for n in range(runner_megabytes)}
    ) as instance:
        docker = FakeDocker()
        scrub = build_scrub(instance.agent_settings(), docker=lambda: docker)
        scrub.keep_images([docker.pull("ubuntu:24.04")])
        seconds, checks = [], []
        for _ in range(releases):
            scrub.runner.check_before_start()
            run_job(instance, RESIDUE_JOB)
            plant_in_docker(docker)
            report = scrub.run(session_id=None)
            if not report.clean:
                raise RuntimeError(
                    f"the scrub left something; the figures would mean nothing: {report.reason()}"
                )
            seconds.append(report.seconds)
            started = time.perf_counter()
            scrub.runner.check_before_start()
            checks.append(time.perf_counter() - started)
    return ScrubTimes(releases, runner_megabytes, seconds, checks)


def _measure(aws: LocalAws, scratch: Path, window_seconds: float) -> BenchTable:
    dynamodb, kms, ec2 = aws.client("dynamodb"), aws.client("kms"), aws.client("ec2")
    prefix = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{notices.queue_name_prefix('bench')}"
    queues = NoticeQueues(
        prefix, aws.client("sqs"), stack_tag=("runner-pool:stack", "bench"), arns=INSTANCE_ARNS
    )
    create_state_table(dynamodb, TABLE)
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    instance_id = ec2.run_instances(ImageId=MOTO_IMAGE_ID, MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    arn = INSTANCE_ARNS.arn(instance_id)
    timeouts = StackConfig().timeouts
    records = StateTable(TABLE, timeouts, SystemClock(), dynamodb, arns=INSTANCE_ARNS)
    credentials = RunnerCredentials(TABLE, timeouts, SystemClock(), key_id=key_id, dynamodb=dynamodb, kms=kms)
    records.create(instance_facts(instance_id=instance_id), run_key=None)
    records.admit(instance_id)
    assert queues.open([instance_id]) == []

    child = _AgentProcess.start(aws, scratch, instance_id, key_id, prefix)
    try:
        _await(lambda: _confirms(records, instance_id, Signal.UD_OK, None), "UD_OK")
        time.sleep(1.0)
        idle = child.measure(window_seconds)

        token = uuid.uuid4().hex
        records.claim(instance_id, RUN_KEY, token)
        credentials.store(
            instance_id,
            arn,
            RUN_KEY,
            _jit_config({"id": token, "mode": "job", "job_seconds": 3 * window_seconds}),
        )
        noticed_at = time.monotonic()
        assert queues.notify(instance_id) is None
        _await(lambda: _confirms(records, instance_id, Signal.UD_REG_OK, RUN_KEY), "UD_REG_OK")
        registration_seconds = time.monotonic() - noticed_at
        records.activate(instance_id, RUN_KEY, max_runtime_minutes=60, claim_token=token)
        time.sleep(0.5)
        busy = child.measure(window_seconds)

        records.release(instance_id, RUN_KEY)
        assert queues.notify(instance_id) is None
        _await(lambda: _confirms(records, instance_id, Signal.UD_REMOVE_REG_OK, RUN_KEY), "UD_REMOVE_REG_OK")
    finally:
        child.stop()
    return _table(idle, busy, registration_seconds, window_seconds)


class _AgentProcess:
    """The agent in a child process, answering `measure` requests over its stdin and stdout."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process

    @classmethod
    def start(
        cls, aws: LocalAws, scratch: Path, instance_id: str, key_id: str, notice_prefix: str
    ) -> _AgentProcess:
        runner_dir = scratch / "actions-runner"
        runner_dir.mkdir()
        run_sh = runner_dir / "run.sh"
        run_sh.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_RUNNER}" "$@"\n')
        run_sh.chmod(0o755)
        settings = {
            "TABLE_NAME": TABLE,
            "CREDENTIALS_KEY_ID": key_id,
            "RUNNER_DIR": str(runner_dir),
            "STATE_FILE": str(scratch / "agent-state.json"),
            "NOTICE_QUEUE_URL_PREFIX": notice_prefix,
        }
        env = aws.child_environment(settings, ENV_PREFIX)
        process = subprocess.Popen(  # noqa: S603 - this very module, as the child
            [sys.executable, "-m", "bench.agent", "--child", instance_id],
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return cls(process)

    def measure(self, seconds: float) -> Window:
        start = self._snapshot()
        time.sleep(seconds)
        return Window.between(start, self._snapshot())

    def stop(self) -> None:
        if self._process.poll() is None:
            self._ask("stop")
            self._process.wait(30)

    def _snapshot(self) -> Snapshot:
        return Snapshot(**json.loads(self._ask("snapshot")))

    def _ask(self, command: str) -> str:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._process.stdout.readline()


def _child(instance_id: str) -> None:
    """The child: the real agent, assembled as `python -m agent` assembles it, with its calls counted."""
    import boto3  # noqa: PLC0415 - only the child talks to AWS itself

    from agent import log as agent_log  # noqa: PLC0415
    from agent.imds import InstanceIdentity  # noqa: PLC0415
    from agent.settings import AgentSettings  # noqa: PLC0415
    from agent.wiring import build_agent  # noqa: PLC0415

    counter = CallCounter()
    session = boto3.session.Session(region_name=REGION)
    settings = AgentSettings(_env_file=None)
    with open(os.devnull, "w") as journal:  # the agent's lines are formatted and written, as for the journal
        agent = build_agent(
            settings,
            InstanceIdentity(instance_id, REGION, ACCOUNT),
            dynamodb=counter.watch(aws_clients.client("dynamodb", session)),
            kms=counter.watch(aws_clients.client("kms", session)),
            ec2=counter.watch(aws_clients.client("ec2", session)),
            sqs=counter.watch(aws_clients.long_poll_client("sqs", settings.notice_wait_seconds, session)),
            log=agent_log.configure(journal),
        )
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        for command in sys.stdin:
            if command.strip() == "stop":
                break
            snapshot = {
                "cpu_seconds": time.process_time(),
                "wall_seconds": time.monotonic(),
                "calls": dict(counter.calls),
            }
            print(json.dumps(snapshot), flush=True)
        stop.set()
        thread.join(30)


def _jit_config(fake_runner: dict[str, object]) -> str:
    """A config shaped as GitHub's generate-jitconfig returns it (base64 JSON of the runner's settings
    files, each base64 JSON); its `.runner` tells the fake runner what to do."""
    files = {
        ".runner": {"agentId": 1, "agentName": "bench", "ephemeral": True, "fakeRunner": fake_runner},
        ".credentials": {"scheme": "OAuthAccessToken", "data": {"token": "bench"}},
    }
    encoded = {name: base64.b64encode(json.dumps(body).encode()).decode() for name, body in files.items()}
    return base64.b64encode(json.dumps(encoded).encode()).decode()


def _confirms(records: StateTable, instance_id: str, signal: Signal, run_key: str | None) -> bool:
    current = records.read_signal(instance_id)
    return current is not None and current.confirms(signal, run_key)


def _await(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    # A bound, not a wait: the agent answers in a second; a loaded shared machine can take far longer.
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the agent did not get to {what} within {timeout:g} s; the figures would mean nothing"
            )
        time.sleep(0.05)


def _table(idle: Window, busy: Window, registration_seconds: float, window_seconds: float) -> BenchTable:
    table = BenchTable(
        title=(
            "agent: steady-state cost (heartbeat 30 s, watch 15 s, notices by 20 s long poll; "
            "fake runner, moto server)"
        ),
        columns=("", "idle", "running a job"),
    )
    table.row("CPU time (ms per minute)", f"{idle.cpu_ms_per_minute:.0f}", f"{busy.cpu_ms_per_minute:.0f}")
    table.row("CPU (% of one core)", f"{idle.cpu_percent:.2f}", f"{busy.cpu_percent:.2f}")
    table.row(
        "DynamoDB requests per minute", f"{idle.dynamodb_per_minute:.1f}", f"{busy.dynamodb_per_minute:.1f}"
    )
    table.row("SQS requests per minute", f"{idle.sqs_per_minute:.1f}", f"{busy.sqs_per_minute:.1f}")
    table.row(
        "DynamoDB, USD per month",
        f"{idle.dynamodb_dollars_per_month:.3f}",
        f"{busy.dynamodb_dollars_per_month:.3f}",
    )
    table.row("SQS, USD per month", f"{idle.sqs_dollars_per_month:.3f}", f"{busy.sqs_dollars_per_month:.3f}")
    table.note(f"idle, calls per minute: {idle.operations()}")
    table.note(f"running a job, calls per minute: {busy.operations()}")
    table.note(f"notice to UD_REG_OK (fake runner listens at once): {registration_seconds:.2f} s")
    table.note(
        f"each window {window_seconds:g} s; the periods alone predict GetItem 4 + PutItem 2 + ReceiveMessage "
        "3 per minute. Before notices (heartbeat 5 s, watch 1 s): GetItem 60 + PutItem 12, $0.65 a month"
    )
    idle_dollars = idle.dynamodb_dollars_per_month
    table.note(
        f"target: idle DynamoDB <= ${TARGET_IDLE_DYNAMODB_DOLLARS_PER_MONTH} a month: "
        + ("met" if idle_dollars <= TARGET_IDLE_DYNAMODB_DOLLARS_PER_MONTH else "NOT met")
        + f" (with SQS: ${idle_dollars + idle.sqs_dollars_per_month:.3f})"
    )
    table.figure("agent_idle_dynamodb_dollars_per_month", round(idle_dollars, 4))
    table.figure("agent_idle_sqs_dollars_per_month", round(idle.sqs_dollars_per_month, 4))
    table.figure("agent_idle_sqs_requests_per_minute_count", round(idle.sqs_per_minute, 1))
    table.figure("agent_idle_cpu_per_minute_milliseconds", round(idle.cpu_ms_per_minute, 1))
    table.figure("agent_idle_cpu_percent", round(idle.cpu_percent, 3))
    table.figure("agent_idle_dynamodb_requests_per_minute_count", round(idle.dynamodb_per_minute, 1))
    table.figure("agent_job_cpu_per_minute_milliseconds", round(busy.cpu_ms_per_minute, 1))
    table.figure("agent_job_cpu_percent", round(busy.cpu_percent, 3))
    table.figure("agent_job_dynamodb_requests_per_minute_count", round(busy.dynamodb_per_minute, 1))
    table.figure("agent_notice_to_registered_seconds", round(registration_seconds, 3))
    return table


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _child(sys.argv[2])
