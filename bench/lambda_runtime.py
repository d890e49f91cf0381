"""The local Lambda service (emulator/lambda_runtime.py): a cold start, an invocation's round trip, and what
an execution environment holds in memory.

Against moto's server on localhost. The cold start is a real handler's first invocation (release's Plan:
the interpreter, the bootstrap, the handler's imports from the layer, and its one run). A warm Plan, two
DynamoDB calls, is timed in its environment and in this process (its module imported here, its
environment set here, the same local AWS), as the emulator ran it before. An empty invocation (a
handler that returns its event) is the round trip alone. RSS is an environment's resident memory once
warm (/proc/<pid>/status, VmRSS); PSS, for a forked one, splits the pages it shares with the fork server.
"""

from __future__ import annotations

import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.results import BenchTable
from emulator.aws import ACCOUNT, LocalAws, local_aws
from emulator.lambda_runtime import Artifacts, FunctionSpec, LambdaRuntime, host_artifacts
from emulator.resources import create_state_table
from emulator.step_functions import LambdaContext

TABLE = "bench-state"
COLD_STARTS = 3
INVOCATIONS = 200
PLAN = FunctionSpec(
    "plan",
    "runner_pool.handlers.release.plan",
    {
        "RUNNER_POOL_TABLE_NAME": TABLE,
        "RUNNER_POOL_ACCOUNT_ID": ACCOUNT,
        "POWERTOOLS_SERVICE_NAME": "runner-pool",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    },
    timeout_seconds=30,
    memory_mb=512,
)
EVENT = {"run_key": "pool=1/class=large", "cause": "run-1-attempt-1"}


SMALL = {"cold_starts": 1, "invocations": 10}
"""`make test`'s size (tests/bench): one cold start of each kind, few round trips."""


def run(cold_starts: int = COLD_STARTS, invocations: int = INVOCATIONS) -> BenchTable:
    table = BenchTable(
        "Local Lambda service: functions from the deployed artifacts in execution environments",
        ("measure", "median", "p99", "n"),
    )
    artifacts = host_artifacts()
    with local_aws() as aws, tempfile.TemporaryDirectory(prefix="bench-probe-") as scratch:
        create_state_table(aws.client("dynamodb"), TABLE)
        code = Path(scratch)
        (code / "bench_probe.py").write_text("def echo(event, context):\n    return event\n")
        probes = Artifacts(code, artifacts.layers)
        _cold_starts(artifacts, aws, table, cold_starts)
        _round_trips(artifacts, probes, aws, table, invocations)
    table.note(
        "In this process the handler shares the interpreter (and its lock) with moto's server; in its "
        "environment it does not, but each AWS call is reported to this process before it is sent."
    )
    return table


def _cold_starts(artifacts: Artifacts, aws: LocalAws, table: BenchTable, count: int) -> None:
    seconds, rss = [], []
    for _ in range(count):
        with LambdaRuntime(artifacts, {"plan": PLAN}, endpoint=aws.endpoint) as runtime:
            began = time.perf_counter()
            runtime.invoke("plan", EVENT)
            seconds.append(time.perf_counter() - began)
            rss += [_memory_bytes(environment.pid, "status", "VmRSS:") for environment in runtime.live()]
    forked, forked_pss = [], []
    names = [f"plan-{n}" for n in range(count)]
    functions = {name: replace(PLAN, name=name) for name in ("first", "server", *names)}
    with LambdaRuntime(artifacts, functions, endpoint=aws.endpoint) as runtime:
        runtime.invoke("first", EVENT)  # a cold start anew: what the fork server learns to preload
        runtime.invoke("server", EVENT)  # the fork server starts
        for name in names:
            began = time.perf_counter()
            runtime.invoke(name, EVENT)
            forked.append(time.perf_counter() - began)
        forked_pss += [
            _memory_bytes(e.pid, "smaps_rollup", "Pss:") for e in runtime.live() if e.spec.name in names
        ]
    table.row("cold start anew: Plan's first invocation (s)", *_stats(seconds, 3), len(seconds))
    table.row("cold start forked from the fork server (s)", *_stats(forked, 3), len(forked))
    table.row(
        "PSS of a forked Plan environment (MiB)", *_stats([b / 2**20 for b in forked_pss], 1), len(forked_pss)
    )
    table.figure("lambda_runtime_forked_cold_start_seconds", statistics.median(forked))
    table.figure("lambda_runtime_forked_environment_pss_bytes", statistics.median(forked_pss))
    table.row("RSS of a warm Plan environment (MiB)", *_stats([b / 2**20 for b in rss], 1), len(rss))
    table.figure("lambda_runtime_cold_start_seconds", statistics.median(seconds))
    table.figure("lambda_runtime_environment_rss_bytes", statistics.median(rss))


def _round_trips(
    artifacts: Artifacts, probes: Artifacts, aws: LocalAws, table: BenchTable, invocations: int
) -> None:
    echo = FunctionSpec("echo", "bench_probe.echo", {}, 30, 128)
    with LambdaRuntime(probes, {"echo": echo}, endpoint=aws.endpoint) as runtime:
        empty = _timed(lambda: runtime.invoke("echo", EVENT), invocations)
    with LambdaRuntime(artifacts, {"plan": PLAN}, endpoint=aws.endpoint) as runtime:
        warm = _timed(lambda: runtime.invoke("plan", EVENT), invocations)
    with _in_this_process(PLAN, aws) as plan:
        context = LambdaContext("plan", "bench", "arn:aws:lambda:us-east-1:123456789012:function:plan", 512)
        local = _timed(lambda: plan(EVENT, context), invocations)
    table.row("empty invocation, round trip (ms)", *_stats(empty, 2), len(empty))
    table.row("warm Plan (2 DynamoDB calls), environment (ms)", *_stats(warm, 2), len(warm))
    table.row("warm Plan, in this process (ms)", *_stats(local, 2), len(local))
    table.figure("lambda_runtime_empty_invocation_milliseconds", statistics.median(empty))
    table.figure("lambda_runtime_warm_plan_milliseconds", statistics.median(warm))
    table.figure("in_process_warm_plan_milliseconds", statistics.median(local))


def _timed(invoke: Callable[[], Any], invocations: int) -> list[float]:
    for _ in range(10):  # warm: the cold start and the first calls' connections
        invoke()
    durations = []
    for _ in range(invocations):
        began = time.perf_counter()
        invoke()
        durations.append((time.perf_counter() - began) * 1000)
    return durations


@contextmanager
def _in_this_process(spec: FunctionSpec, aws: LocalAws) -> Iterator[Callable[[Any, Any], Any]]:
    """The handler imported here, with its environment and local AWS's in this process's."""
    from runner_pool.wiring import use_control_plane  # noqa: PLC0415

    saved = dict(os.environ)
    os.environ.update(
        {
            **spec.environment,
            "AWS_ENDPOINT_URL": aws.endpoint,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    module, _, name = spec.handler.rpartition(".")
    use_control_plane(None)  # built from this environment on first use, as on a cold start
    try:
        yield getattr(importlib.import_module(module), name)
    finally:
        use_control_plane(None)
        os.environ.clear()
        os.environ.update(saved)


def _stats(values: list[float], digits: int) -> tuple[str, str]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(values):.{digits}f}", f"{p99:.{digits}f}"


def _memory_bytes(pid: int, table: str, key: str) -> int:
    """A figure in kB of /proc/<pid>/<table> (`status` VmRSS, `smaps_rollup` Pss: shared pages split)."""
    for line in Path(f"/proc/{pid}/{table}").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no {key} for process {pid}")
