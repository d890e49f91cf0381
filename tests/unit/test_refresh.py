"""Refresh's rules that need no run of it: schedule slots, its report, and the markers that share its work."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from emulator.harness.control_plane import stack_config
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.refresh import (
    REFUSAL_BACKOFF_SECONDS,
    RefreshReport,
    in_turn,
    pool_shortfall,
    refresh_tick,
    refusal_stands,
)

SLOT_SECONDS = 300
CONFIG = stack_config(refresh_rate_minutes=SLOT_SECONDS // 60)


@given(st.integers(min_value=0, max_value=10**7), st.floats(min_value=0, max_value=SLOT_SECONDS - 0.001))
def test_times_in_one_schedule_slot_share_its_tick(slot: int, into: float) -> None:
    # Given the start of a schedule slot, and a time within it
    start = float(slot * SLOT_SECONDS)
    # When both are turned into ticks / Then they are the same, and the next slot's is one more
    assert refresh_tick(start + into, CONFIG) == refresh_tick(start, CONFIG)
    assert refresh_tick(start + SLOT_SECONDS, CONFIG) == refresh_tick(start, CONFIG) + 1


def test_the_report_counts_by_state_and_class_as_plain_json() -> None:
    # Given a report with counts by state and by class
    report = RefreshReport()
    report.terminated["idle"] += 2
    report.launched["large"] += 1
    # When it is turned into JSON / Then each count is kept as it was
    as_json = report.as_json()
    assert (as_json["terminated"], as_json["launched"]) == ({"idle": 2}, {"large": 1})


def test_a_marker_never_set_reads_as_none(state_table: StateTable) -> None:
    # Given a table without the marker / When it is read / Then it is None
    assert state_table.read_marker("refresh-redelivery") is None


def test_the_first_to_move_a_marker_wins_and_the_second_loses(state_table: StateTable) -> None:
    # Given two refreshes that both read the marker unset
    # When both move it on from there
    first = state_table.move_marker("refresh-warm-pool", 7, expected=None)
    second = state_table.move_marker("refresh-warm-pool", 7, expected=None)
    # Then only the first moved it
    assert (first, second) == (True, False)
    assert state_table.read_marker("refresh-warm-pool") == 7


def test_a_marker_moves_only_from_the_value_expected(state_table: StateTable) -> None:
    # Given a marker at 10
    state_table.move_marker("refresh-redelivery", 10, expected=None)
    # When one run moves it from a stale 5, and another from 10
    stale = state_table.move_marker("refresh-redelivery", 12, expected=5)
    current = state_table.move_marker("refresh-redelivery", 11, expected=10)
    # Then only the move from the current value applies
    assert (stale, current) == (False, True)
    assert state_table.read_marker("refresh-redelivery") == 11


@given(
    st.lists(st.integers(), min_size=1, max_size=20, unique=True), st.integers(min_value=0, max_value=1000)
)
def test_jobs_in_turn_are_every_job_once_begun_at_the_turn(jobs: list[int], turn: int) -> None:
    # Given jobs in their order, and a turn / When they are put in turn
    ordered = in_turn(jobs, turn)
    # Then each job is there once, the turn's first, and the order otherwise kept (cyclically)
    assert sorted(ordered) == sorted(jobs)
    assert ordered[0] == jobs[turn % len(jobs)]
    assert all(jobs.index(b) == (jobs.index(a) + 1) % len(jobs) for a, b in itertools.pairwise(ordered))


def test_a_refusal_stands_for_the_back_off_and_no_longer() -> None:
    # Given a refusal at time 1000 / Then it stands until the back-off has passed, and not from then on
    assert refusal_stands(1000.0, 1000.0 + REFUSAL_BACKOFF_SECONDS - 1)
    assert not refusal_stands(1000.0, 1000.0 + REFUSAL_BACKOFF_SECONDS)


def test_the_pool_shortfall_is_the_larger_of_the_idle_and_the_pristine_one() -> None:
    # Given a minimum of 4 idle, 3 of them pristine, and 4 idle of which 1 pristine, 1 booting
    # When the shortfall is computed / Then it is the pristine one: 3 - 1 - 1
    assert pool_shortfall(4, 3, idle=4, idle_pristine=1, booting=1) == 1
    # And with 1 idle, the idle one: 4 - 1 - 1
    assert pool_shortfall(4, 3, idle=1, idle_pristine=1, booting=1) == 2
    # And none falls short: 0, never less
    assert pool_shortfall(2, 1, idle=5, idle_pristine=3, booting=2) == 0
