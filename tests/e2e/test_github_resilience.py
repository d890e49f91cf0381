"""End to end: GitHub's rate limits waited out (in a burst that also shows one CreateFleet per
provision and never two jobs on one instance at once), a GitHub outage outlived, a short job's warm
instance kept. The whole stack on local AWS, the fake GitHub with its documented limits, our agents.
Every scenario ends with the accounting check (each instance of the stack has a live record, and
each live record an instance)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import burst_1000 as bench_burst_1000
from bench import burst_at_concurrency_10 as bench_burst_at_quota
from demo.burst import queued_spans, rate_limited_world
from emulator.event_sources import STANDARD_QUEUE_POLLERS
from emulator.fake_github import Conclusion, JobSpec, JobStatus
from emulator.simulated_instances import InstanceSettings
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from infra.constructs.ingress import THROTTLE_BURST, THROTTLE_RATE_PER_SECOND
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from tests.e2e.conftest import (
    FAST_INSTANCES,
    FAST_TIMERS,
    LABEL,
    SWEEP_LOOK_SECONDS,
    accounted,
    completed,
    eventually,
    provisions_bound,
    settled,
)
from tests.support.serving import assert_one_job_at_a_time

pytestmark = pytest.mark.slow

BURST_JOBS = bench_burst_1000.SMALL["jobs"]
BURST_RUNS = bench_burst_1000.SMALL["runs"]
"""bench/burst_1000.py's small size: enough runs of a matrix to meet GitHub's limit and wait it out."""


@pytest.fixture
def limited_system(tmp_path: Path) -> Iterator[World]:
    with rate_limited_world(tmp_path) as running:
        yield running


def test_a_burst_at_a_lambda_concurrency_quota_of_10_is_throttled_and_fails_no_execution() -> None:
    # Given a new account's Lambda concurrency quota of 10, shared by every function, and one run of 30
    # jobs (30 claims asked for at once: three times the quota; bench/burst_at_concurrency_10.py's small run)
    size = bench_burst_at_quota.SMALL
    # When the burst is served
    table = bench_burst_at_quota.run(**size)
    key = f"burst_{size['jobs']}_at_concurrency_{bench_burst_at_quota.CONCURRENCY}"
    # Then Lambda throttled invocations, the state machines retried them, and every job was served with
    # no failed execution
    assert table.figures[f"{key}_throttled_invocations_count"] > 0
    assert table.figures[f"{key}_jobs_served_count"] == size["jobs"]
    assert table.figures[f"{key}_failed_executions_count"] == 0


def test_a_burst_against_githubs_rate_limit_serves_every_job_and_fails_no_execution(
    limited_system: World,
) -> None:
    # Given the webhook behind the stage throttle the stack sets, and the dispatcher read by Lambda's
    # five pollers
    throttle = limited_system.stack.webhook.throttle
    assert throttle is not None
    assert (throttle.burst, throttle.rate_per_second) == (THROTTLE_BURST, THROTTLE_RATE_PER_SECOND)
    assert limited_system.stack.dispatcher.concurrency == STANDARD_QUEUE_POLLERS
    # When BURST_JOBS jobs are queued at once, in BURST_RUNS runs of a matrix, against GitHub's rate limit
    # (GitHub's minute compressed, as every time here: demo/burst.py) and a registration budget above it,
    # as the burst benchmark queues them (this is its small run in make test)
    table = bench_burst_1000.run(jobs=BURST_JOBS, runs=BURST_RUNS, system=limited_system)
    figures = table.figures
    print("\n" + table.render())
    # Then every job ran to success on a runner of ours
    key = f"burst_{BURST_JOBS}_jobs"
    assert figures[f"{key}_served_ratio"] == 1.0
    # And GitHub's limit was met (it refused registrations) and waited out: no execution failed
    assert figures[f"burst_{BURST_JOBS}_jit_refused_count"] > 0
    assert figures[f"{key}_failed_executions_count"] == 0
    assert figures[f"burst_{BURST_JOBS}_jit_calls_per_job_ratio"] >= 1.0
    # And no run cost the dispatcher more than two provisions, unless its deliveries came so far apart
    # on this busy machine that follow-up windows closed between them (redrives are apart)
    bound = max(provisions_bound(span) for span in queued_spans(limited_system).values())
    assert figures[f"{key}_executions_per_run"] <= bound
    # And no provision made more than one CreateFleet, though some launched (the first runs are cold;
    # later runs reuse what the earlier ones gave back)
    provisions = [e for e in limited_system.stack.executions() if e["machine"] == "provision"]
    launches = limited_system.stack.ec2.launches
    assert all(launches[execution["name"]] <= 1 for execution in provisions), launches
    assert sum(launches[execution["name"]] for execution in provisions) > 0
    # And no instance ever ran two jobs at once
    assert_one_job_at_a_time(limited_system.github.state.jobs.values())
    settled(limited_system, timeout=300)
    accounted(limited_system)


@pytest.fixture
def system_with_short_patience(tmp_path: Path) -> Iterator[World]:
    """Registration waits of 10 s (claims, then creation's hand-overs), so a GitHub outage of 30 s
    outlasts one provision and its redrive has to serve the jobs."""
    config = compressed_config(
        timeouts={**COMPRESSED_TIMEOUTS, "fleet_validation_seconds": 10, "release_receipt_seconds": 8}
    )
    with world(tmp_path, config=config, instance_settings=FAST_INSTANCES, timers=FAST_TIMERS) as running:
        yield running


def test_jobs_of_a_provision_that_failed_while_github_was_down_are_served_after_it_recovers(
    system_with_short_patience: World,
) -> None:
    system = system_with_short_patience
    # Given GitHub's API down for the next 30 seconds (webhooks still arrive)
    now = system.github.state.clock.now()
    system.github.limits.outage(now, now + 30)
    # When a run of two jobs is queued
    run = system.start_run("outage", JobSpec("build", LABEL, matrix=2, seconds=0.5))
    # Then both jobs are served once GitHub is back
    completed(system, run, timeout=180)
    jobs = [system.github.state.jobs[j] for j in run.job_ids]
    assert all(job.conclusion is Conclusion.SUCCESS for job in jobs)
    assert all(job.started_at is not None and job.started_at >= now + 30 for job in jobs)
    # And it took a second provision, asked for by the first, which ended short
    provisions = [e for e in system.stack.executions() if e["machine"] == "provision"]
    assert len(provisions) >= 2
    assert system.github.limits.outage_refused > 0
    settled(system, timeout=90)
    accounted(system)


@pytest.fixture
def system_with_a_warm_instance(tmp_path: Path) -> Iterator[World]:
    """One warm instance, and new instances slow to boot: a mixed batch's warm job ends before Finish."""
    config = compressed_config(
        timeouts={**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8}, warm_pool_minimum={"large": 1}
    )
    instances = InstanceSettings(
        boot_delay_seconds=4.0, heartbeat_period_seconds=1.0, watch_period_seconds=0.2
    )
    with world(tmp_path, config=config, instance_settings=instances, timers=FAST_TIMERS) as running:
        yield running


def test_a_short_job_on_a_warm_runner_leaves_its_instance_pooled(system_with_a_warm_instance: World) -> None:
    system = system_with_a_warm_instance

    def pool() -> list[str]:
        return [r.instance_id for r in system.records.live() if r.state is InstanceState.IDLE]

    # Given one warm instance in the pool
    (warm,) = eventually(pool, "the warm instance", 60, every=SWEEP_LOOK_SECONDS)
    # When a run of two very short jobs is queued: the first is dispatched at once and runs warm; the
    # second, in the follow-up provision, runs on whatever is free then (the same instance if it was
    # already back in the pool, else a cold one)
    run = system.start_run("short", JobSpec("quick", LABEL, matrix=2, seconds=0.1))
    completed(system, run, timeout=90)
    jobs = [system.github.state.jobs[j] for j in run.job_ids]
    on_warm = [job for job in jobs if instance_of_runner(job.runner_name) == warm]
    assert on_warm
    # Then the warm instance's job ended while provisions were still at work or soon after (a short
    # job may end before its provision's Finish: tests/integration/test_release_short_jobs.py covers that
    # order exactly, which the dispatcher no longer makes certain end to end)
    assert all(job.completed_at is not None for job in on_warm)
    # ... and its instance went back to the pool instead of being expired
    settled(system, timeout=60)
    record = system.records.get(warm)
    assert record is not None
    assert record.state is InstanceState.IDLE
    assert not record.threshold_passed(time.time())
    assert warm in system.instances.booted()
    assert all(job.status is JobStatus.COMPLETED for job in jobs)
    accounted(system)
