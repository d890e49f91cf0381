"""The day-trace model's arithmetic (bench/day_trace.py), on a boot model fixed to exact seconds."""

from __future__ import annotations

import math
from datetime import datetime, time
from zoneinfo import ZoneInfo

import pytest

from bench.day_trace import (
    ADVISOR_HAZARD,
    DAY,
    INSTANT_START_SECONDS,
    REPORTED_HAZARD,
    SCHEDULED_DELAY_SECONDS,
    STORM_JOBS,
    TARGET_WAIT_SECONDS,
    TIME_ZONE,
    DaySimulation,
    Job,
    Policy,
    p95_reach,
    policies,
    spot_day,
    stopped_tier_config,
    storm_day,
    working_day,
    working_hours_minimum,
)
from emulator.boot_model import BootModel, Path
from runner_pool.domain.config import ReuseMode, ReuseSettings, StackConfig
from runner_pool.domain.cost import ec2_billed_seconds
from runner_pool.domain.records import UsageClass
from runner_pool.domain.reruns import Verdict
from runner_pool.domain.timeouts import Timeouts
from runner_pool.domain.warm_schedule import WarmMinimum

SEGMENTS = {
    "control_plane": 2, "launch": 10, "os_boot": 5, "install": 60, "baked_start": 3, "resume": 3, "registration": 4
}  # fmt: skip
"""Every segment fixed but the start, which the tests of the p95's reach vary."""
FIXED = BootModel().fixed(**SEGMENTS, start=6)
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


INSTANT_COLD_SECONDS = 2 + 10 + 5 + 3 + 4 + INSTANT_START_SECONDS
"""An instant job with no runner waiting: the provision its `queued` asked for, a baked launch, the
runner's registration, then GitHub's assignment and the runner's pickup."""


def instant_policy(size: int) -> Policy:
    config = StackConfig(warm_pool_minimum={"large": working_hours_minimum(0, instant=size)})
    return Policy("instant", config, baked=True, instant=True)


def test_an_instant_tier_starts_as_many_jobs_as_it_holds_at_once_and_the_rest_on_new_runners() -> None:
    # Given a tier of 2 in working hours, and a matrix of 3 jobs queued at 09:00, long after it filled
    jobs = [Job(0, at(9), 600.0) for _ in range(3)]
    # When the day is simulated
    outcome = DaySimulation(instant_policy(2), FIXED, seed=1).run(jobs)
    # Then two start on the waiting runners in GitHub's assignment and the runner's pickup, with nothing
    # of ours in between, and the third waits for the first runner launched for the jobs' `queued`
    assert outcome.paths == [Path.HOT, Path.HOT, Path.COLD_BAKED]
    assert outcome.ready_seconds == pytest.approx([INSTANT_START_SECONDS] * 2 + [INSTANT_COLD_SECONDS])
    # And each instance serves one job: the 2 refresh filled the tier with at 08:00 and one launch per
    # queued job; the two left over wait as the tier, which refresh leaves at its size until their
    # records are due (the label's max runtime, 360 min, from 09:00) and refills in the window once more
    assert outcome.launches == 2 + 3 + 2


def test_after_its_window_the_instant_tier_lives_on_in_each_jobs_replacement_as_the_product_does() -> None:
    # Given a tier of 2 from 08:00 to 18:00: refresh fills it at 08:00; each waiting runner's record is
    # due after the label's max runtime (360 min), when refresh ends it and, inside the window, refills
    # the tier (at 14:00); after 18:00 refresh skips the class, but each job's `queued` still asks for a
    # runner (steps/dispatcher.py), which then waits for the next job
    jobs = [Job(0, at(19), 60.0), Job(1, at(21), 60.0)]
    # When the day is simulated
    outcome = DaySimulation(instant_policy(2), FIXED, seed=1).run(jobs)
    # Then the job at 19:00 finds a runner of the 14:00 refill, and the one at 21:00 (after those were
    # due, at 20:00) the runner launched for the first
    assert outcome.paths == [Path.HOT, Path.HOT]
    assert outcome.ready_seconds == pytest.approx([INSTANT_START_SECONDS] * 2)
    assert outcome.launches == 2 + 2 + 1 + 1


def test_instant_jobs_pay_a_launching_provision_each_in_the_control_plane() -> None:
    # Given a day on the instant tier and the per-job control plane prices
    jobs = working_day(runs=30, seed=3)
    outcome = DaySimulation(instant_policy(2), FIXED, seed=1).run(jobs)
    # Then every job, warm or not, pays the cold price: its `queued` launched a runner
    prices = {"warm": 1.0, "cold": 5.0}
    assert outcome.control_plane_dollars(prices) == pytest.approx(len(jobs) * 5.0 / 1e6)


def adaptive() -> Policy:
    return by_name("adaptive")


def test_the_adaptive_policy_holds_its_floor_until_it_has_watched_an_hour_then_meets_the_target() -> None:
    # Given jobs every 30 s from 01:00 to 04:00, each a minute long, and the adaptive policy (floor 0)
    jobs = [Job(n, at(1) + 30 * n, 60.0) for n in range(360)]
    # When the day is simulated
    outcome = DaySimulation(adaptive(), FIXED, seed=1).run(jobs)
    # Then the first job launches: the stack has watched no hour of demand, so the schedule (0) holds
    assert outcome.paths[0] is Path.COLD_BAKED
    # And once it has, nearly every job waits no longer than the target: here a start (13 s to ready)
    # is within it, so the rule holds the stock stopped, and the instances the jobs release serve too
    later = [
        ready for job, ready in zip(jobs, outcome.ready_seconds, strict=True) if job.queued_at >= at(2, 30)
    ]
    assert sum(1 for ready in later if ready <= TARGET_WAIT_SECONDS + 1e-6) / len(later) >= 0.95
    assert outcome.jobs(Path.STOPPED) > 0


def test_the_adaptive_policy_lets_its_pool_go_once_the_demand_has_left_the_rules_horizon() -> None:
    # Given the same steady jobs, then nothing for the rest of the day
    jobs = [Job(n, at(1) + 30 * n, 60.0) for n in range(360)]
    outcome = DaySimulation(adaptive(), FIXED, seed=1).run(jobs)
    # Then the instances were billed for the jobs and less than four instance-hours more (boots, the
    # stock held, an hour of the rule's memory), though 20 hours of the day are left after the last job:
    # what the rule no longer wants is stopped or ended, not kept running
    busy = sum(job.duration for job in jobs)
    assert busy < outcome.billed_seconds < busy + 4 * 3600
    # And the stopped tier is taken back too: one volume kept stopped to midnight would add 20 hours
    assert outcome.volume_seconds < busy + 24 * 3600


def test_the_storm_trace_has_hourly_schedules_day_and_night_and_one_large_matrix() -> None:
    jobs = storm_day(pushes=200, seed=5)
    # Every hour, day and night, scheduled runs start within the first minutes
    for hour in range(24):
        assert any(at(hour) <= job.queued_at < at(hour) + SCHEDULED_DELAY_SECONDS for job in jobs)
    # One run queues STORM_JOBS jobs at once
    sizes: dict[int, int] = {}
    for job in jobs:
        sizes[job.run] = sizes.get(job.run, 0) + 1
    assert max(sizes.values()) == STORM_JOBS
    # The night is otherwise quiet: outside working hours, few jobs besides the schedules
    night = [
        job
        for job in jobs
        if job.queued_at < at(6) and job.queued_at - at(job_hour(job)) > SCHEDULED_DELAY_SECONDS
    ]
    assert len(night) < 0.05 * len(jobs)
    assert storm_day(pushes=200, seed=5) == jobs


def job_hour(job: Job) -> int:
    return datetime.fromtimestamp(job.queued_at, ZoneInfo(TIME_ZONE)).hour


def test_at_the_reported_rate_every_interrupted_job_is_re_run_once_on_on_demand_and_none_is_lost() -> None:
    # Given make test's day of jobs on spot, EC2 interrupting at the rate a user reported
    jobs = working_day(runs=40, seed=16)
    # When the day is served with the product's re-runs on
    outcome = spot_day(jobs, FIXED, seed=1, hazard=REPORTED_HAZARD)
    # Then jobs were interrupted, each run attempt with one was re-run, and every interrupted job was
    # served by its re-run (on-demand: not interrupted again)
    assert outcome.interrupted > 0
    assert outcome.rerun == outcome.interrupted
    assert outcome.lost == 0
    assert set(outcome.verdicts) == {Verdict.RERUN}
    assert outcome.attempts == len(jobs) + outcome.rerun
    assert outcome.on_demand_seconds > 0


def test_with_re_runs_off_every_interrupted_job_is_lost() -> None:
    # Given the same day and rate, with fleet.rerun_interrupted_jobs off
    jobs = working_day(runs=40, seed=16)
    outcome = spot_day(jobs, FIXED, seed=1, hazard=REPORTED_HAZARD, rerun=False)
    # Then each interrupted job stays failed, and nothing ran on-demand
    assert outcome.interrupted > 0
    assert outcome.lost == outcome.interrupted
    assert outcome.rerun == 0
    assert set(outcome.verdicts) == {Verdict.OFF}
    assert outcome.on_demand_seconds == 0


def test_spot_with_re_runs_costs_less_per_job_than_on_demand_at_either_rate() -> None:
    # Given the day's jobs all on-demand, and on spot at the advisor's and the reported rate
    jobs = working_day(runs=40, seed=16)
    per_job = {"warm": 500.0, "cold": 600.0}
    on_demand = spot_day(jobs, FIXED, seed=1, hazard=0.0, usage=UsageClass.ON_DEMAND)
    for hazard in (ADVISOR_HAZARD, REPORTED_HAZARD):
        spot = spot_day(jobs, FIXED, seed=1, hazard=hazard)
        # Then spot, its re-runs on on-demand included, costs less per job of the trace
        assert spot.lost == 0
        assert spot.dollars(per_job, 30) < on_demand.dollars(per_job, 30)
    assert on_demand.interrupted == on_demand.spot_seconds == 0


def test_a_run_larger_than_the_ceilings_can_serve_in_time_puts_the_p95_out_of_reach() -> None:
    # Given the storm trace, whose one run of STORM_JOBS jobs comes at once
    jobs = storm_day(pushes=20, seed=3)
    # When its reach is read against a boot model whose stopped path (9 s and the start) is 2 s slower than
    # the target
    slow = p95_reach(jobs, BootModel().fixed(**SEGMENTS, start=8), draws=100)
    # Then 5% of the jobs may wait longer, no start or launch is in time, and the rest of the run must be
    assert slow.slower_allowed == len(jobs) - math.ceil(0.95 * len(jobs))
    assert (slow.stopped_in_time, slow.cold_in_time) == (0.0, 0.0)
    assert slow.largest_run == STORM_JOBS
    assert slow.at_once == STORM_JOBS - slow.slower_allowed
    # And with it 1 s faster than the target, every stopped draw is in time
    assert p95_reach(jobs, BootModel().fixed(**SEGMENTS, start=5), draws=100).stopped_in_time == 1.0
