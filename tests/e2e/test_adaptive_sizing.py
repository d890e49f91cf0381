"""Adaptive sizing on the whole system (`pool.sizing: adaptive`): a burst of jobs grows a class's hot pool at
the next refresh, and the pool shrinks back once arrivals stop.

The real stack on local AWS with its horizon compressed to one minute: the dispatcher notes each job's
arrival, creation each launch's time to ready, and refresh (every 2 s) sizes the class by the rule, with
no schedule (its floor 0). The class's watch is begun a horizon back, as a stack deployed a horizon ago has
it, rather than waited out. The scenario ends with the accounting check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.fake_github import JobSpec
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from runner_pool.adapters.class_history import HISTORY_PREFIX, WATCH
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY
from runner_pool.domain.lifecycle import InstanceState
from tests.e2e.conftest import FAST_INSTANCES, FAST_TIMERS, accounted, eventually

pytestmark = pytest.mark.slow

LABEL = "pool=${{ github.run_id }}/class=large"
BURST = 5
HORIZON_SECONDS = 60.0
IDLE_SECONDS = COMPRESSED_TIMEOUTS["idle_seconds"]


@pytest.fixture
def adaptive(tmp_path: Path) -> Iterator[World]:
    config = compressed_config(
        timeouts={**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8},
        pool={"sizing": "adaptive", "sizing_horizon_minutes": 1},
    )
    with world(
        tmp_path, config=config, instance_settings=FAST_INSTANCES, timers=FAST_TIMERS, lost_runner_seconds=4.0
    ) as running:
        yield running


def hot_pool(system: World) -> int:
    """Idle `large` instances held for no run, and not yet due."""
    now = time.time()
    return sum(
        1
        for record in system.records.live()
        if record.resource_class == "large"
        and record.state is InstanceState.IDLE
        and record.run_key is None
        and not record.threshold_passed(now)
    )


def watched_since_a_horizon_ago(system: World) -> None:
    """The class's watch begun a horizon (and a second) ago, as refresh notes it on its first read of a class
    (runner_pool/adapters/class_history.py), so the rule reads the class as watched long enough; then a
    refresh that began after it has run."""
    system.aws.client("dynamodb").put_item(
        TableName=system.stack.plane.settings.table_name,
        Item={
            PARTITION_KEY: {"S": f"{HISTORY_PREFIX}large#{WATCH}"},
            SORT_KEY: {"S": WATCH},
            "since": {"N": repr(time.time() - HORIZON_SECONDS - 1.0)},
        },
    )
    refreshes = system.stack.meter.invocations().get("refresh", 0)
    eventually(
        lambda: system.stack.meter.invocations().get("refresh", 0) >= refreshes + 2,
        "a refresh that read the class as watched for a horizon",
        30.0,
    )


def test_a_burst_grows_the_hot_pool_at_the_next_refresh_and_it_shrinks_back_when_arrivals_stop(
    adaptive: World,
) -> None:
    # Given the class watched by refresh for a horizon, with no pool (no schedule, no arrivals yet)
    watched_since_a_horizon_ago(adaptive)
    assert hot_pool(adaptive) == 0

    # When a burst of jobs is queued, each long enough to hold its instance while refresh looks
    burst_at = time.time()
    adaptive.start_run("matrix", *(JobSpec(f"build-{n}", LABEL, seconds=20.0) for n in range(BURST)))

    # Then, their launches measured, refresh launches a hot pool for the burst the rule sees recurring. How
    # many are ready at once depends on how long a boot takes against the one-minute horizon (under the whole
    # suite the burst's arrivals leave the horizon before five are ready); the rule's number itself is
    # checked against pool_size in tests/integration/test_refresh_sizing.py
    eventually(lambda: hot_pool(adaptive) >= 1, "a hot pool", 240.0)

    # And once no job has arrived for a horizon and a lead (launch and refresh period), it is taken back:
    # every idle instance ended well before its idle time would have ended it
    # (a lead's launch is its p95, which a loaded machine stretches: up to IDLE_SECONDS is given)
    eventually(
        lambda: hot_pool(adaptive) == 0, "the hot pool taken back", IDLE_SECONDS - (time.time() - burst_at)
    )
    assert time.time() - burst_at < IDLE_SECONDS
    eventually(
        lambda: not any(e["status"] == "RUNNING" for e in adaptive.stack.executions()), "executions to end"
    )
    eventually(lambda: adaptive.accounting().holds, "the accounting to hold", 60.0)
    accounted(adaptive)
