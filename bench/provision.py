"""Provision's cost per runner, from executions of the real ASL in moto's interpreter with the real handlers.

For a warm claim (the pool has the instance) and a cold create (it has none): Step Functions state
transitions and Lambda invocations per provisioned runner, and, for a warm claim whose agent
answers at once, the control plane's own time from StartExecution to the instance running. Waits
are real here (the claim check's first Wait is 1 s, Step Functions' shortest); scripted agents
answer within ~20 ms. moto's interpreter and in-process Lambdas stand in for AWS: on AWS each
state adds a few tens of milliseconds of service latency that this does not show.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.results import BenchTable
from emulator.harness.provision_world import ProvisionWorld, output, provision_world
from emulator.world import lambdas_quiet
from runner_pool.domain.executions import PROVISION_LIMIT

ROUNDS = 5
BATCH = 4


def _warm_round(world: ProvisionWorld, round_number: int) -> tuple[float, int, int] | None:
    """One all-warm batch's figures; None when a worker found the pool empty and a runner was created
    (concurrent workers can see a moment with every message in another worker's hands)."""
    for n in range(BATCH):
        world.warm(round_number * 100 + n + 1)
    figures, result = _batch(world, f"pool={1000 + round_number}")
    return figures if len(result["warm"]) == BATCH else None


def _cold_round(world: ProvisionWorld, round_number: int) -> tuple[float, int, int]:
    figures, result = _batch(world, f"pool={2000 + round_number}")
    if len(result["cold"]) != BATCH:
        raise AssertionError(f"cold round {round_number} was not all created: {result}")
    return figures


def _batch(world: ProvisionWorld, run_key: str) -> tuple[tuple[float, int, int], dict[str, Any]]:
    """A batch of BATCH provisioned for `run_key`: its seconds, state transitions and Lambda invocations,
    and the provision's output."""
    calls_before = len(world.invocations.calls)
    started = time.perf_counter()
    execution = world.provision(run_key, BATCH)
    elapsed = time.perf_counter() - started
    figures = (elapsed, execution.state_transitions, len(world.invocations.calls) - calls_before)
    return figures, output(execution)


def _single_warm(world: ProvisionWorld, rounds: int) -> list[float]:
    times = []
    for n in range(rounds):
        world.warm(900 + n)
        started = time.perf_counter()
        output(world.provision(f"pool={3000 + n}", 1))
        times.append(time.perf_counter() - started)
    return times


def _full_pool(world: ProvisionWorld, size: int) -> tuple[int, int, float]:
    """(warm, cold) runners when the pool holds `size` fitting instances and executions of at most
    PROVISION_LIMIT runners ask for `size` at once, and the seconds until the last one ended.

    On the ManualClock: what is counted is whether the request's pickups find the pool's instances,
    and the executions race each other for real. On the system clock, moto's interpreter running 160
    claim workers in one process starves the scripted agents (a round over 200 instances took from 0.6 s
    to 94 s), so claimed instances missed the 30 s registration limit and were discarded: a failure of
    the harness, which the ManualClock's waits do not have."""
    for n in range(size):
        world.warm(10_000 + n)
    demands = []
    for start in range(0, size, PROVISION_LIMIT):
        demands.append((f"pool={4000 + start}", min(PROVISION_LIMIT, size - start)))
    started = time.perf_counter()
    results = [output(e) for e in world.provision_concurrently(demands, timeout_seconds=900)]
    elapsed = time.perf_counter() - started
    return sum(len(r["warm"]) for r in results), sum(len(r["cold"]) for r in results), elapsed


SMALL = {"rounds": 1, "full_pool": 20}
"""`make test`'s size (tests/bench): one execution of each kind, a full pool of 20."""

FULL_POOL = 200
"""Issue 15: a pool holding 200 fitting instances serves 200 runners asked for at once, none launched."""


def run(rounds: int = ROUNDS, full_pool: int = FULL_POOL) -> BenchTable:
    table = BenchTable(
        f"provision: per runner, batches of {BATCH} ({rounds} executions each), real ASL, moto interpreter",
        ("path", "transitions/runner", "lambda calls/runner", "execution s (median)"),
    )
    # The handlers' log and metric lines would drown the table: off while the benchmark runs, not after it
    with lambdas_quiet(), provision_world(real_time=True) as world:
        tried = [_warm_round(world, n) for n in range(rounds * 2)]
        warm = [figures for figures in tried if figures is not None][:rounds]
        cold = [_cold_round(world, n) for n in range(rounds)]
        single = _single_warm(world, rounds)
    with lambdas_quiet(), provision_world() as world:  # waits on the ManualClock: see _full_pool
        full_warm, full_cold, full_seconds = _full_pool(world, full_pool)
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
    table.figure(f"provision_warm_{full_pool}_cold_launches_count", full_cold)
    table.note(
        f"a pool of {full_pool} fitting instances, {full_pool} runners asked for at once in executions of "
        f"at most {PROVISION_LIMIT}: {full_warm} warm, {full_cold} cold, {full_seconds:.1f} s; target 0 cold"
    )
    table.note("cold create includes the fleet-validation Wait (5 s poll); an instance's boot is not counted")
    return table
