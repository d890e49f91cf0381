"""When a run's follow-up window closes (domain/follow_up.py `follow_up_closes_at`): a quiet gap of the window
after the last join for a matrix delivered side by side, a few of the run's own gaps when its deliveries come
slower, never past the limit."""

from __future__ import annotations

import pytest

from runner_pool.domain.follow_up import (
    FOLLOW_UP_AGE_FACTOR,
    FOLLOW_UP_LIMIT_SECONDS,
    FOLLOW_UP_PACE_CAP_SECONDS,
    FOLLOW_UP_PACE_FACTOR,
    FOLLOW_UP_WINDOW_SECONDS,
    follow_up_closes_at,
    next_follow_up_closes_at,
)

OPENED = 1_000.0
LIMIT_AT = OPENED + FOLLOW_UP_LIMIT_SECONDS


def closes(
    now: float,
    joined_at: float | None,
    joined: int,
    closes_at: float = OPENED,
    opened_at: float | None = None,
) -> float:
    return follow_up_closes_at(
        now,
        closes_at=closes_at,
        limit_at=LIMIT_AT,
        joined_at=joined_at,
        joined=joined,
        window_seconds=FOLLOW_UP_WINDOW_SECONDS,
        opened_at=opened_at,
    )


def test_the_first_join_keeps_the_window_open_one_window() -> None:
    assert closes(OPENED + 0.2, joined_at=None, joined=0) == pytest.approx(
        OPENED + 0.2 + FOLLOW_UP_WINDOW_SECONDS
    )


def test_a_matrix_delivered_side_by_side_closes_one_window_after_its_last_join() -> None:
    # Three dispatches joined within 30 ms: their pace is far below the window
    assert closes(OPENED + 0.13, joined_at=OPENED + 0.1, joined=3) == pytest.approx(
        OPENED + 0.13 + FOLLOW_UP_WINDOW_SECONDS
    )


def test_jobs_that_come_at_a_slower_pace_keep_it_open_a_few_of_their_gaps() -> None:
    # Ten dispatches joined over 1.6 s since the first join: a mean gap of 0.16 s, past which 0.3 s closes
    # often
    now = OPENED + 0.1 + 1.6
    assert closes(now, joined_at=OPENED + 0.1, joined=10) == pytest.approx(now + FOLLOW_UP_PACE_FACTOR * 0.16)


def test_a_slow_pace_keeps_it_open_no_longer_than_the_cap() -> None:
    # Two dispatches joined over 2 s: four of their gaps would be 4 s, longer than a run's jobs should wait
    # for a straggler
    now = OPENED + 2.1
    assert closes(now, joined_at=OPENED + 0.1, joined=2) == pytest.approx(now + FOLLOW_UP_PACE_CAP_SECONDS)


def test_it_never_closes_past_its_limit() -> None:
    now = LIMIT_AT - 0.5
    assert closes(now, joined_at=OPENED + 0.1, joined=2) == pytest.approx(LIMIT_AT)


def test_a_quick_join_after_slow_ones_never_closes_it_sooner_than_it_was_to_close() -> None:
    was_to_close = OPENED + 3.0
    assert closes(OPENED + 1.0, joined_at=OPENED + 0.9, joined=20, closes_at=was_to_close) == was_to_close


def test_the_next_follow_up_of_a_burst_is_paced_by_the_gap_that_opened_it() -> None:
    # The last follow-up closed (a quiet gap of one window after its last job), and the run's next demand
    # comes 0.1 s later: its jobs come at least 0.4 s apart, so the new window stays open four of those
    last_closed_at = OPENED
    now = last_closed_at + 0.1
    gap = 0.1 + FOLLOW_UP_WINDOW_SECONDS
    assert next_follow_up_closes_at(
        now,
        last_closed_at=last_closed_at,
        limit_at=now + FOLLOW_UP_LIMIT_SECONDS,
        window_seconds=FOLLOW_UP_WINDOW_SECONDS,
    ) == pytest.approx(now + FOLLOW_UP_PACE_FACTOR * gap)


def test_the_next_follow_up_after_a_long_lull_stays_open_no_longer_than_the_cap() -> None:
    now = OPENED + 4.0
    assert next_follow_up_closes_at(
        now,
        last_closed_at=OPENED,
        limit_at=now + FOLLOW_UP_LIMIT_SECONDS,
        window_seconds=FOLLOW_UP_WINDOW_SECONDS,
    ) == pytest.approx(now + FOLLOW_UP_PACE_CAP_SECONDS)


def test_a_follow_up_open_for_seconds_waits_a_share_of_its_age_for_a_straggler() -> None:
    # Twenty dispatches joined since 0.1 s after it opened, the last 3.6 s after: four of their mean gaps
    # are 0.7 s, but the follow-up has been open 3.6 s, and its jobs come in clumps
    now = OPENED + 3.6
    assert closes(now, joined_at=OPENED + 0.1, joined=20, opened_at=OPENED) == pytest.approx(
        now + FOLLOW_UP_AGE_FACTOR * 3.6
    )


def test_a_matrix_joined_within_a_tenth_of_a_second_is_not_held_by_its_age() -> None:
    now = OPENED + 0.1
    assert closes(now, joined_at=OPENED + 0.05, joined=3, opened_at=OPENED) == pytest.approx(
        now + FOLLOW_UP_WINDOW_SECONDS
    )
