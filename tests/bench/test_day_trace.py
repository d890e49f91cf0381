"""The day-trace model's arithmetic (bench/day_trace.py), on a boot model fixed to exact seconds."""

from __future__ import annotations

from datetime import datetime, time
from zoneinfo import ZoneInfo

import pytest

from bench.day_trace import (
    DAY,
    TIME_ZONE,
    DaySimulation,
    Job,
    Policy,
    ec2_billed_seconds,
    policies,
    stopped_tier_config,
    working_day,
    working_hours_minimum,
)
from emulator.boot_model import BootModel, Path
from runner_pool.domain.config import ReuseMode, ReuseSettings, StackConfig
from runner_pool.domain.timeouts import Timeouts
from runner_pool.domain.warm_schedule import WarmMinimum

FIXED = BootModel().fixed(
    control_plane=2, launch=10, os_boot=5, install=60, baked_start=3, start=6, resume=3, registration=4
)
COLD_INSTALL_SECONDS = 2 + 10 + 5 + 60 + 4
COLD_BAKED_SECONDS = 2 + 10 + 5 + 3 + 4
STOPPED_SECONDS = 2 + 6 + 3 + 4
HOT_SECONDS = 2 + 4


def at(hour: int, minute: int = 0) -> float:
    return datetime.combine(DAY, time(hour, minute), ZoneInfo(TIME_ZONE)).timestamp()


def by_name(name: str) -> Policy:
    return next(policy for policy in policies() if policy.name == name)


def test_without_a_pool_every_job_waits_a_whole_cold_boot() -> None:
    # Given the no-pool policies (every instance serves one job) and a day of jobs
    jobs = working_day(runs=30, seed=3)
    for name, cold in (("no_pool_install", COLD_INSTALL_SECONDS), ("no_pool_baked", COLD_BAKED_SECONDS)):
        # When the day is simulated
        outcome = DaySimulation(by_name(name), FIXED, seed=1).run(jobs)
        # Then no job is warm or stopped, one launch per job, and each waits exactly the cold path
        assert outcome.jobs(Path.HOT) == outcome.jobs(Path.STOPPED) == 0
        assert outcome.launches == outcome.cold_jobs() == len(jobs)
        assert outcome.ready_seconds == [pytest.approx(cold)] * len(jobs)


def test_a_hot_pool_larger_than_the_peak_leaves_no_cold_job_after_the_first() -> None:
    # Given a minimum of 40 idle instances all day, an idle time and a max age longer than the day
    config = StackConfig(
        warm_pool_minimum={"large": WarmMinimum(hot=40)},
        timeouts=Timeouts(idle_seconds=86_400),
        reuse=ReuseSettings(max_age_minutes=2_000),
    )
    policy = Policy("big", config, baked=True)
    # And a job at midnight, before the pool has booted, then 30 more over the day, 4 at a time
    jobs = [Job(0, at(0), 60.0)] + [Job(n, at(8 + n // 4, 7 * (n % 4)), 600.0) for n in range(1, 31)]
    # When the day is simulated
    outcome = DaySimulation(policy, FIXED, seed=1).run(jobs)
    # Then only the first job is cold; every later one takes an idle instance in the hot path's time
    assert outcome.paths[0] is Path.COLD_BAKED
    assert outcome.paths[1:] == [Path.HOT] * 30
    assert outcome.ready_seconds[1:] == [pytest.approx(HOT_SECONDS)] * 30


def test_a_pool_at_its_minimum_is_relaunched_every_idle_time_as_refresh_does_today() -> None:
    # Given the product's refresh: an idle instance whose idle time passes is terminated as due, and the
    # minimum counts only idle instances whose idle time has not passed (domain/refresh.py _keep_warm)
    policy = Policy("two", StackConfig(warm_pool_minimum={"large": working_hours_minimum(2)}), baked=False)
    # And one job before the window opens, so the pool serves nothing all day
    outcome = DaySimulation(policy, FIXED, seed=1).run([Job(0, at(7), 60.0)])
    # Then each pool instance lives one cycle: launched at a tick, admitted at the next after its 75 s
    # boot (120 s), due 600 s later (720 s); from 08:00 to 18:00 that is 50 cycles of 2, plus the job's
    assert outcome.launches == 1 + 50 * 2
    # And every one of those is billed: 60 s minimum or more each
    assert outcome.billed_seconds >= 101 * 60


def test_a_stopped_instance_serves_a_job_in_the_stopped_path_time_and_pays_only_its_volume_while_stopped() -> (
    None
):
    # Given the hot+stopped policy with no hot minimum and one stopped instance in working hours
    config = stopped_tier_config(working_hours_minimum(0, stopped=1), stopped_maximum=1)
    policy = Policy("stopped", config, baked=True)
    # And a job at 09:00, long after the stopped instance was prepared at 08:00
    outcome = DaySimulation(policy, FIXED, seed=1).run([Job(0, at(9), 300.0)])
    # Then the job is served from the stopped instance, in StartInstances + resume + registration
    assert outcome.paths == [Path.STOPPED]
    assert outcome.ready_seconds == [pytest.approx(STOPPED_SECONDS)]
    # And EC2 billed only its running periods: the preparation (boot, admitted at the next tick) and the
    # job's (start to release, then idle until refresh stops it again), never the hour it was stopped
    assert outcome.billed_seconds < 3600


@pytest.mark.parametrize(
    ("mode", "second"), [(ReuseMode.REUSE, Path.HOT), (ReuseMode.SINGLE_USE, Path.COLD_BAKED)]
)
def test_a_jobs_instance_serves_the_next_job_only_when_the_jobs_reuse(mode: ReuseMode, second: Path) -> None:
    # Given a pristine minimum of 1 in working hours, and the stack in `mode`
    config = StackConfig(
        reuse=ReuseSettings(mode=mode), warm_pool_minimum={"large": working_hours_minimum(0, pristine=1)}
    )
    policy = Policy(mode.value, config, baked=True)
    # And a trusted job at 09:00 that ends at 09:01:06, then one at 09:01:30, before refresh's next tick
    jobs = [Job(0, at(9), 60.0), Job(1, at(9, 1) + 30, 60.0)]
    # When the day is simulated
    outcome = DaySimulation(policy, FIXED, seed=1).run(jobs)
    # Then the first takes the pristine instance; the second takes it again when the jobs reuse, and
    # launches when they are single use (the product's `single_use`, `Taker.may_take`, `retire_reason`)
    assert outcome.paths == [Path.HOT, second]


def test_the_single_use_policy_serves_warm_from_pristine_instances_only() -> None:
    # Given the single-use policy (a pristine minimum of 6 in working hours) and a day of jobs
    jobs = working_day(runs=60, seed=4)
    # When the day is simulated
    outcome = DaySimulation(by_name("single_use_baked"), FIXED, seed=1).run(jobs)
    # Then some jobs are warm, and every instance served one job at most: one launch per cold job, plus
    # one pristine instance for each warm one (and those that ran out their idle time unused)
    assert outcome.jobs(Path.HOT) > 0
    assert outcome.launches >= outcome.cold_jobs() + outcome.jobs(Path.HOT)


def test_ec2_bills_a_minute_at_least_each_time_an_instance_starts() -> None:
    # Given EC2's per-second billing with a 60 s minimum per start (EC2 API Reference, StopInstances)
    # Then a short running period bills a minute, a longer one its seconds
    assert ec2_billed_seconds(5) == 60
    assert ec2_billed_seconds(61.5) == 61.5


def test_the_trace_is_a_working_day_with_matrices_and_the_same_for_a_seed() -> None:
    # Given a day of 400 runs
    jobs = working_day(runs=400, seed=5)
    # Then most jobs are queued in working hours, some runs are matrices of 8 or more, and a seed repeats
    working = sum(1 for job in jobs if at(8) <= job.queued_at < at(18))
    assert working / len(jobs) > 0.8
    sizes = {run: sum(1 for job in jobs if job.run == run) for run in {job.run for job in jobs}}
    assert max(sizes.values()) >= 8
    assert working_day(runs=400, seed=5) == jobs
