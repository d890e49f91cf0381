"""Reading a class's recorded arrivals and boot times into the sizing rule's input
(domain/class_history.py `demand_of`), and which idle instances adaptive sizing takes back
(domain/refresh.py `surplus_idle`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.class_history import MEASURED, ClassRecord, Entry, demand_of
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import Arch, InstanceRecord, UsageClass
from runner_pool.domain.refresh import surplus_idle

NOW = 1_800_000_000.0
REFRESH_SECONDS = 60.0


def record(
    arrivals: list[Entry] | None = None,
    launches: list[Entry] | None = None,
    starts: list[Entry] | None = None,
) -> ClassRecord:
    return ClassRecord(
        arrivals=arrivals or [],
        launches=[Entry("i-launch", 40.0)] if launches is None else launches,
        starts=starts or [],
        watched_since=NOW - 7200,
    )


def test_no_launch_measured_is_no_demand_so_the_schedule_stands() -> None:
    # Given a class with arrivals but no launch measured yet
    history = record([Entry("1", NOW - 10)], launches=[])
    # Then the rule gets no demand (and keeps its floor, the schedule)
    assert demand_of(history, REFRESH_SECONDS) is None


def test_a_job_noted_twice_arrives_once_at_its_earliest() -> None:
    # Given job 7 noted by a dispatch and again by its retry a few seconds later, and job 8 once
    history = record([Entry("7", NOW - 30), Entry("8", NOW - 20), Entry("7", NOW - 25)])
    # When read
    demand = demand_of(history, REFRESH_SECONDS)
    # Then each job is one arrival, at its first noting, in order
    assert demand is not None
    assert list(demand.arrivals) == [NOW - 30, NOW - 20]
    assert demand.watched_since == NOW - 7200
    assert demand.refresh_seconds == REFRESH_SECONDS


def test_boot_times_are_the_p95_of_the_latest_measured() -> None:
    # Given 100 launches, newest first: the latest MEASURED took 10..59 s, the older ones 500 s
    launches = [Entry(f"i-{n}", 10.0 + n) for n in range(MEASURED)]
    launches += [Entry(f"i-old-{n}", 500.0) for n in range(MEASURED)]
    # When read
    demand = demand_of(record(launches=launches), REFRESH_SECONDS)
    # Then the launch time is the p95 (nearest rank) of the latest 50 only: the 48th of 10..59
    assert demand is not None
    assert demand.launch_seconds == 10.0 + 47


def test_an_instance_measured_twice_is_one_sample() -> None:
    # Given one slow launch noted 60 times (a retried step), among 60 fast ones
    launches = [Entry("i-slow", 300.0)] * 60 + [Entry(f"i-{n}", 30.0) for n in range(60)]
    # When read
    demand = demand_of(record(launches=launches), REFRESH_SECONDS)
    # Then it is one sample of the latest MEASURED, not all of them: the p95 is a fast one's
    assert demand is not None
    assert demand.launch_seconds == 30.0


def test_a_start_is_taken_as_slow_as_a_launch_until_one_is_measured() -> None:
    unmeasured = demand_of(record(), REFRESH_SECONDS)
    measured = demand_of(record(starts=[Entry("i-start", 12.0)]), REFRESH_SECONDS)
    assert unmeasured is not None
    assert unmeasured.start_seconds == 40.0
    assert measured is not None
    assert measured.start_seconds == 12.0


def idle(number: int, *, pristine: bool, threshold: float) -> InstanceRecord:
    return InstanceRecord(
        instance_id=f"i-{number:04d}",
        resource_class="large",
        instance_type="c7i.large",
        usage_class=UsageClass.ON_DEMAND,
        arch=Arch.X64,
        cpu=2,
        memory_mib=4096,
        state=InstanceState.IDLE,
        threshold=threshold,
        jobs_served=0 if pristine else 1,
        created_at=NOW - 600,
        updated_at=NOW - 60,
    )


def test_the_surplus_taken_back_is_used_instances_first_soonest_ending_first() -> None:
    # Given two pristine and three used idle instances, and a rule that holds two
    pool = [
        idle(1, pristine=True, threshold=NOW + 10),
        idle(2, pristine=False, threshold=NOW + 300),
        idle(3, pristine=False, threshold=NOW + 20),
        idle(4, pristine=True, threshold=NOW + 30),
        idle(5, pristine=False, threshold=NOW + 200),
    ]
    # When the surplus is chosen / Then it is the three used ones, the soonest ending first
    assert [r.instance_id for r in surplus_idle(pool, 2, 0)] == ["i-0003", "i-0005", "i-0002"]
    # And with a rule of one, a pristine one goes too, unless the pristine minimum keeps both
    assert [r.instance_id for r in surplus_idle(pool, 1, 0)][-1] == "i-0001"
    assert len(surplus_idle(pool, 1, 2)) == 3


@given(
    st.lists(st.tuples(st.booleans(), st.integers(1, 600)), max_size=12),
    st.integers(0, 14),
    st.integers(0, 6),
)
def test_the_surplus_never_goes_below_the_rule_nor_the_pristine_minimum(
    shape: list[tuple[bool, int]], hot: int, pristine_minimum: int
) -> None:
    pool = [idle(n, pristine=p, threshold=NOW + t) for n, (p, t) in enumerate(shape)]
    chosen = surplus_idle(pool, hot, pristine_minimum)
    kept = [r for r in pool if r not in chosen]
    assert len(chosen) <= max(0, len(pool) - hot)
    assert sum(r.pristine for r in kept) >= min(pristine_minimum, sum(r.pristine for r in pool))
    # Every used instance goes before any pristine one
    assert not (any(r.pristine for r in chosen) and any(not r.pristine for r in kept))


def test_the_reuse_rate_is_the_share_of_arrivals_a_used_instance_served_each_counted_once() -> None:
    # Given four jobs, two of them served by instances that had served before (one noted twice)
    arrivals = [Entry(str(n), NOW - 100 + n) for n in range(4)]
    reuses = [Entry("i-1#2", NOW - 90), Entry("i-2#5", NOW - 80), Entry("i-1#2", NOW - 85)]
    history = ClassRecord(arrivals, [Entry("i-launch", 40.0)], [], NOW - 7200, reuses)
    # When read / Then half of the jobs' instances came back to the pool
    demand = demand_of(history, REFRESH_SECONDS)
    assert demand is not None
    assert demand.reuse_rate == 0.5
    # And more reuses than arrivals (jobs that arrived before the window) count as every job's
    crowded = ClassRecord(arrivals[:1], [Entry("i-launch", 40.0)], [], NOW - 7200, reuses)
    assert demand_of(crowded, REFRESH_SECONDS).reuse_rate == 1.0  # type: ignore[union-attr]
    # And no arrivals, no rate
    idle = ClassRecord([], [Entry("i-launch", 40.0)], [], NOW - 7200, reuses)
    assert demand_of(idle, REFRESH_SECONDS).reuse_rate == 0.0  # type: ignore[union-attr]
