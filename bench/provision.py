"""Provision's cost per runner, from executions of the real ASL in moto's interpreter with the real handlers.

For a warm claim (the pool has the instance) and a cold create (it has none): Step Functions state
transitions and Lambda invocations per provisioned runner, and, for a warm claim whose agent
answers at once, the control plane's own time from StartExecution to the instance running. Waits
are real here (the claim check's first Wait is 1 s, Step Functions' shortest); scripted agents
answer within ~20 ms. moto's interpreter and in-process Lambdas stand in for AWS: on AWS each
state adds a few tens of milliseconds of service latency that this does not show.
"""

from __future__ import annotations

import os
import statistics
import time

from bench.results import BenchTable
from tests.support.provision_world import ProvisionWorld, output, provision_world

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # the handlers' EMF lines would drown the table

ROUNDS = 5
BATCH = 4


def _warm_round(world: ProvisionWorld, round_number: int) -> tuple[float, int, int] | None:
    """One all-warm batch's figures; None when a worker found the pool empty and a runner was created
    (concurrent workers can see a moment with every message in another worker's hands)."""
    for n in range(BATCH):
        world.warm(round_number * 100 + n + 1)
    calls_before = len(world.invocations.calls)
    started = time.perf_counter()
    execution = world.provision(f"pool={1000 + round_number}", BATCH)
    elapsed = time.perf_counter() - started
    result = output(execution)
    if len(result["warm"]) != BATCH:
        return None
    return elapsed, execution.state_transitions, len(world.invocations.calls) - calls_before


def _cold_round(world: ProvisionWorld, round_number: int) -> tuple[float, int, int]:
    calls_before = len(world.invocations.calls)
    started = time.perf_counter()
    execution = world.provision(f"pool={2000 + round_number}", BATCH)
    elapsed = time.perf_counter() - started
    result = output(execution)
    if len(result["cold"]) != BATCH:
        raise AssertionError(f"cold round {round_number} was not all created: {result}")
    return elapsed, execution.state_transitions, len(world.invocations.calls) - calls_before


def _single_warm(world: ProvisionWorld, rounds: int) -> list[float]:
    times = []
    for n in range(rounds):
        world.warm(900 + n)
        started = time.perf_counter()
        output(world.provision(f"pool={3000 + n}", 1))
        times.append(time.perf_counter() - started)
    return times


SMALL = {"rounds": 1}
"""`make test`'s size (tests/bench): one execution of each kind."""


def run(rounds: int = ROUNDS) -> BenchTable:
    table = BenchTable(
        f"provision: per runner, batches of {BATCH} ({rounds} executions each), real ASL, moto interpreter",
        ("path", "transitions/runner", "lambda calls/runner", "execution s (median)"),
    )
    with provision_world(real_time=True) as world:
        tried = [_warm_round(world, n) for n in range(rounds * 2)]
        warm = [figures for figures in tried if figures is not None][:rounds]
        cold = [_cold_round(world, n) for n in range(rounds)]
        single = _single_warm(world, rounds)
    for name, kept in (("warm claim", warm), ("cold create", cold)):
        transitions = statistics.median(r[1] for r in kept) / BATCH
        invocations = statistics.median(r[2] for r in kept) / BATCH
        seconds = statistics.median(r[0] for r in kept)
        table.row(name, f"{transitions:.1f}", f"{invocations:.1f}", f"{seconds:.2f}")
        key = name.split()[0]
        table.figure(f"provision_{key}_transitions_per_runner_count", transitions)
        table.figure(f"provision_{key}_lambda_invocations_per_runner_count", invocations)
    median = statistics.median(single)
    table.figure("provision_warm_control_plane_median_seconds", median)
    table.note(
        f"warm control-plane time, one runner, agent answering at once: median {median:.2f} s "
        f"(min {min(single):.2f}, max {max(single):.2f}); target < 2 s"
    )
    mixed = sum(1 for figures in tried if figures is None)
    table.note(
        f"warm batches where a worker found the pool empty and created instead: {mixed} of {len(tried)}"
    )
    table.figure("provision_warm_batches_partly_cold_count", mixed)
    table.note("cold create includes the fleet-validation Wait (5 s poll); an instance's boot is not counted")
    return table
