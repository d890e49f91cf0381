"""The agent's log shipping (agent/log_shipping.py): lines reach their streams in batches, CloudWatch Logs
out of reach costs lines (counted, said in the journal) and never time, and the runner's diagnostic files
are read as one hand-over's lines."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import pytest

from agent.log import agent_log
from agent.log_shipping import MAX_DIAG_BYTES, LogShipper, diag_events
from emulator.aws import REGION
from emulator.iam_stack import checked_template
from emulator.stack import JOB_LOG_GROUP_OUTPUT
from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import ServiceUnreachableError
from runner_pool.domain.job_logs import LogEvent
from runner_pool.domain.records import Signal
from tests.agent.conftest import AgentFactory, ControlPlane, eventually, jit_config

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.12's; only mypy reads this annotation

INSTANCE = "i-0123456789abcdef0"
RUN = "pool=901/class=large"


class Streams:
    """CloudWatch Logs as the shipper sees it: every batch put, or every put failing with `failure`."""

    def __init__(self, failure: Exception | None = None, hold: threading.Event | None = None) -> None:
        self.failure = failure
        self.hold = hold
        self.puts: list[tuple[str, list[LogEvent]]] = []

    def put(self, stream: str, batch: list[LogEvent]) -> int:
        if self.hold is not None:
            self.hold.wait()
        if self.failure is not None:
            raise self.failure
        self.puts.append((stream, batch))
        return 0

    def messages(self, stream: str) -> list[str]:
        return [event.message for name, batch in self.puts if name == stream for event in batch]


class ShipperOptions(TypedDict, total=False):
    """LogShipper's keyword settings a test may change; the rest keep the agent's defaults."""

    max_pending: int


def shipper(streams: Streams, **options: Unpack[ShipperOptions]) -> LogShipper:
    running = LogShipper(streams, INSTANCE, agent_log(instance_id=INSTANCE), period_seconds=60, **options)
    running.start()
    return running


def test_the_agents_lines_reach_its_stream_when_flushed_each_carrying_its_hand_over() -> None:
    # Given an agent's log shipping to its instance's streams, a line of no hand-over and one of a hand-over
    streams = Streams()
    running = shipper(streams)
    log = agent_log(instance_id=INSTANCE).shipping_to(running.agent_line)
    log.info("agent started")
    log.bind(run_key="pool=1", runner_id=41).info("starting the runner")
    # When the agent flushes (a release does, before its scrub)
    assert running.flush(5.0)
    running.close(1.0)
    # Then both went to `<instance>/agent`, as JSON lines, the second with its run key and runner
    lines = [json.loads(m) for m in streams.messages(f"{INSTANCE}/agent")]
    assert [line["message"] for line in lines] == ["agent started", "starting the runner"]
    assert (lines[1]["run_key"], lines[1]["runner_id"]) == ("pool=1", 41)
    assert running.dropped == 0


def test_cloudwatch_out_of_reach_drops_lines_with_a_count_and_says_so_in_the_journal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given CloudWatch Logs that never answers (the product's retries spent)
    running = shipper(Streams(failure=ServiceUnreachableError("logs: PutLogEvents never answered")))
    log = agent_log(instance_id=INSTANCE).shipping_to(running.agent_line)
    # When the agent logs and flushes
    with caplog.at_level(logging.INFO, logger="runner_pool.agent"):
        log.info("workspace clean")
        assert running.flush(5.0)
    running.close(1.0)
    # Then the line is dropped and counted, and the journal (not the log group) says so
    assert running.dropped == 1
    warnings = [r for r in caplog.records if r.getMessage().startswith("could not ship log lines")]
    assert len(warnings) == 1
    assert getattr(warnings[0], "fields", {})["dropped"] == 1


def test_a_flush_gives_up_in_its_time_when_cloudwatch_hangs_and_logging_never_waits() -> None:
    # Given a PutLogEvents call that hangs
    hold = threading.Event()
    running = shipper(Streams(hold=hold))
    log = agent_log(instance_id=INSTANCE).shipping_to(running.agent_line)
    log.info("run key released; cleaning up")
    # When a release flushes for at most 0.2 s, then goes on logging
    started = time.monotonic()
    assert not running.flush(0.2)
    for n in range(1000):
        log.info("still going", n=n)
    # Then neither the flush nor the lines waited on the hung call
    assert time.monotonic() - started < 2.0
    hold.set()
    running.close(5.0)


def test_lines_past_the_pending_bound_are_dropped_and_counted() -> None:
    # Given a shipper holding at most 10 lines while CloudWatch is slow
    hold = threading.Event()
    streams = Streams(hold=hold)
    running = shipper(streams, max_pending=10)
    log = agent_log(instance_id=INSTANCE).shipping_to(running.agent_line)
    # When 25 lines are written before any is sent
    for n in range(25):
        log.info("line", n=n)
    # Then 15 are dropped and counted, and the 10 kept are sent once CloudWatch answers
    assert running.dropped == 15
    hold.set()
    assert running.flush(5.0)
    running.close(1.0)
    assert [json.loads(m)["n"] for m in streams.messages(f"{INSTANCE}/agent")] == list(range(10))


def test_the_runners_diagnostic_files_are_read_as_the_hand_overs_lines(tmp_path: Path) -> None:
    # Given a runner's `_diag` with a listener's and a worker's log (one line a stack trace's), and a link
    # a job planted to a file it should not read
    diag = tmp_path / "_diag"
    diag.mkdir()
    (diag / "Runner_20261129-132220-utc.log").write_text(
        "[2026-11-29 13:22:21Z INFO Listener] Listening for Jobs\n"
        "[2026-11-29 13:22:23Z ERR  Listener] boom\n   at Runner.Listener.Main()\n"
    )
    (diag / "Worker_20261129-132222-utc.log").write_text("[2026-11-29 13:22:22Z INFO Worker] Job build\n")
    secret = tmp_path / "secret"
    secret.write_text("[2026-11-29 13:22:22Z INFO X] the instance's secret\n")
    (diag / "Worker_20261129-999999-utc.log").symlink_to(secret)
    identity = {"run_key": "pool=1", "runner_id": 41}
    # When they are read for the hand-over
    events, unread = diag_events(diag, identity, now=1_790_000_000.0)
    lines = [json.loads(event.message) for event in events]
    # Then each line is an event of its own time (a trace line takes its line's), with the hand-over's
    # identity and its file, and nothing is read through the link
    assert [(line["file"], line["message"]) for line in lines] == [
        ("Runner_20261129-132220-utc.log", "[2026-11-29 13:22:21Z INFO Listener] Listening for Jobs"),
        ("Runner_20261129-132220-utc.log", "[2026-11-29 13:22:23Z ERR  Listener] boom"),
        ("Runner_20261129-132220-utc.log", "   at Runner.Listener.Main()"),
        ("Worker_20261129-132222-utc.log", "[2026-11-29 13:22:22Z INFO Worker] Job build"),
    ]
    assert all((line["run_key"], line["runner_id"]) == ("pool=1", 41) for line in lines)
    assert events[2].timestamp_ms == events[1].timestamp_ms
    assert lines[0]["level"] == "INFO"
    assert unread == 0


def test_no_more_of_the_diagnostic_files_is_read_than_the_bound(tmp_path: Path) -> None:
    # Given a job that filled `_diag` with more than the agent reads
    diag = tmp_path / "_diag"
    diag.mkdir()
    (diag / "Runner_1.log").write_bytes(b"x" * 100 + b"\n" + b"y" * MAX_DIAG_BYTES)
    # When it is read
    events, unread = diag_events(diag, {}, now=1_790_000_000.0)
    # Then the bound is read and the rest counted as unread
    assert unread == 101
    assert sum(len(json.loads(e.message)["message"]) for e in events) <= MAX_DIAG_BYTES


# --- the real agent, its calls checked against the synthesized instance role --------------------------


def job_log_group() -> str:
    """The stack's job log group, named by its logical id as the IAM check resolves it (emulator/stack.py)."""
    group = str(checked_template()["Outputs"][JOB_LOG_GROUP_OUTPUT]["Value"]["Ref"])
    aws_clients.client("logs", region_name=REGION).create_log_group(logGroupName=group)
    return group


def handed_over(control_plane: ControlPlane, agents: AgentFactory, group: str, runner_id: int) -> Path:
    """An agent shipping to `group` serving RUN on runner `runner_id`; its runner's `_diag` holds a line."""
    control_plane.launch_for_pool()
    running = agents.start(log_group_name=group, log_ship_period_seconds=0.1, log_flush_seconds=2)
    control_plane.claim(RUN, config=None)
    assert control_plane.records.record_runner(control_plane.instance_id, RUN, runner_id).succeeded
    control_plane.credentials.store(
        control_plane.instance_id,
        control_plane.identity.arn,
        RUN,
        jit_config(job_seconds=0.05),
        runner_id=runner_id,
    )
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.activate(RUN)
    diag = running.settings.runner_dir / "_diag"
    diag.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    (diag / "Worker_20261129-000000-utc.log").write_text(f"[{stamp}Z INFO Worker] Running job: build\n")
    return diag


def test_a_release_ships_the_runners_lines_before_the_scrub_and_leaves_none_on_disk(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an agent serving a job on runner 77, whose runner wrote a diagnostic line
    group = job_log_group()
    diag = handed_over(control_plane, agents, group, runner_id=77)
    # When the job ends and the control plane releases the instance
    control_plane.release(RUN)
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)
    # Then `_diag` is empty for the next job
    assert list(diag.iterdir()) == []
    # And the runner's line and the agent's scrub report reached the instance's streams, with the hand-over
    logs = aws_clients.client("logs", region_name=REGION)

    def shipped() -> dict[str, list[dict[str, object]]] | None:
        events = logs.filter_log_events(logGroupName=group)["events"]
        found: dict[str, list[dict[str, object]]] = {}
        for event in events:
            found.setdefault(event["logStreamName"], []).append(json.loads(event["message"]))
        agent = found.get(f"{control_plane.instance_id}/agent", [])
        return found if any(line["message"] == "workspace clean" for line in agent) else None

    found = eventually(shipped, what="the scrub's report in the agent's stream")
    (runner_line,) = found[f"{control_plane.instance_id}/runner"]
    assert "Running job: build" in str(runner_line["message"])
    assert (runner_line["run_key"], runner_line["runner_id"]) == (RUN, 77)
    clean = next(
        line for line in found[f"{control_plane.instance_id}/agent"] if line["message"] == "workspace clean"
    )
    assert (clean["run_key"], clean["runner_id"]) == (RUN, 77)


def test_cloudwatch_refusing_every_call_costs_the_release_nothing_but_its_lines(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an agent serving a job, whose log group is then deleted (every put refused from then on)
    group = job_log_group()
    diag = handed_over(control_plane, agents, group, runner_id=78)
    aws_clients.client("logs", region_name=REGION).delete_log_group(logGroupName=group)
    # When the control plane releases the instance
    started = time.monotonic()
    control_plane.release(RUN)
    # Then the scrub runs and the receipt comes, within the release's bound on waiting for the lines
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)
    assert time.monotonic() - started < 10
    assert list(diag.iterdir()) == []
