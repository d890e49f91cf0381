"""Warm minimums on a schedule (issue 16, item 3): which minimum is in force when, and which schedules
synth refuses. Local times are the tz database's (Python's zoneinfo, here from the `tzdata` package);
the daylight-saving dates are the EU's (last Sunday of March and of October, at 01:00 UTC) and the
US's (second Sunday of March, at 02:00 local)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner_pool.domain.clock import Epoch, ManualClock
from runner_pool.domain.config import ConfigError, load_config
from runner_pool.domain.warm_schedule import WarmMinimum, Weekday

BERLIN = "Europe/Berlin"
WORKDAYS = ["mon", "tue", "wed", "thu", "fri"]
OFFICE_HOURS = {
    "time_zone": BERLIN,
    "hot": 1,
    "windows": [{"days": WORKDAYS, "start": "08:00", "end": "18:00", "hot": 4}],
}


def at(local: str, zone: str = BERLIN) -> Epoch:
    """The instant a wall clock in `zone` shows `local` (ISO, e.g. 2026-11-23T08:00; the first of two)."""
    return datetime.fromisoformat(local).replace(tzinfo=ZoneInfo(zone)).timestamp()


def minimum(settings: Any) -> WarmMinimum:
    return load_config({"warm_pool_minimum": {"large": settings}}).warm_pool_minimum["large"]


def problem(settings: Any) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config({"warm_pool_minimum": {"large": settings}})
    (only,) = raised.value.problems
    return only


# --- what is in force when ------------------------------------------------------------------------


def test_a_plain_number_is_in_force_at_every_hour_of_the_week() -> None:
    # Given the setting as it was before schedules: a number per class
    config = load_config({"warm_pool_minimum": {"large": 2}})
    clock = ManualClock(at("2026-11-23T00:00"))
    # When refresh asks, hour after hour through a week / Then it is always that number
    for _ in range(7 * 24):
        assert config.warm_minimum("large", clock.advance(3600)) == 2
    # And a class the setting leaves out keeps none
    assert config.warm_minimum("xlarge", clock.now()) == 0


def test_a_window_is_in_force_from_its_start_up_to_but_not_at_its_end() -> None:
    # Given office hours in Berlin on workdays, one instance outside them
    office = minimum(OFFICE_HOURS)
    # When the clock crosses Monday's edges (2026-11-23 is a Monday, CET) / Then the window's minimum holds inside
    clock = ManualClock(at("2026-11-23T07:59:59"))
    assert office.in_force(clock.now()) == 1
    assert office.in_force(clock.advance(1)) == 4  # 08:00:00
    assert office.in_force(clock.advance(10 * 3600 - 1)) == 4  # 17:59:59
    assert office.in_force(clock.advance(1)) == 1  # 18:00:00
    # And the weekend is outside it
    assert office.in_force(at("2026-11-28T10:00")) == 1


def test_a_window_keeps_its_local_hours_across_a_daylight_saving_change() -> None:
    # Given office hours in Berlin, and the Mondays before and after summer time begins (2026-03-29)
    office = minimum(OFFICE_HOURS)
    before, after = (
        datetime(2026, 3, 23, 7, tzinfo=ZoneInfo("UTC")),
        datetime(2026, 3, 30, 6, tzinfo=ZoneInfo("UTC")),
    )
    # When the clock reaches 08:00 Berlin time on each: 07:00 UTC in winter, 06:00 UTC in summer
    # Then the window opens at 08:00 local both times, not at the same UTC hour
    assert office.in_force(before.timestamp() - 1) == 1
    assert office.in_force(before.timestamp()) == 4
    assert office.in_force(after.timestamp() - 1) == 1
    assert office.in_force(after.timestamp()) == 4


def test_a_window_that_starts_in_the_skipped_hour_opens_when_the_clock_jumps() -> None:
    # Given a Sunday window 02:30-04:00 in Berlin, and the night summer time begins (02:00 CET -> 03:00 CEST)
    night = minimum(
        {"time_zone": BERLIN, "windows": [{"days": ["sun"], "start": "02:30", "end": "04:00", "hot": 3}]}
    )
    clock = ManualClock(datetime(2026, 3, 29, 0, 59, 59, tzinfo=ZoneInfo("UTC")).timestamp())  # 01:59:59 CET
    # When the clock passes the jump / Then the window is closed before it and open right after (03:00 CEST)
    assert night.in_force(clock.now()) == 0
    assert night.in_force(clock.advance(1)) == 3
    # And it closes at 04:00 CEST, an hour of real time later
    assert night.in_force(clock.advance(3600 - 1)) == 3
    assert night.in_force(clock.advance(1)) == 0


def test_a_window_in_the_repeated_hour_is_open_both_times_the_wall_clock_shows_it() -> None:
    # Given a Sunday window 02:30-03:00 in Berlin, and the night summer time ends (03:00 CEST -> 02:00 CET)
    night = minimum(
        {"time_zone": BERLIN, "windows": [{"days": ["sun"], "start": "02:30", "end": "03:00", "hot": 3}]}
    )
    first = datetime(2026, 10, 25, 0, 30, tzinfo=ZoneInfo("UTC")).timestamp()  # 02:30 CEST
    # When the clock goes through both 02:30s / Then the window is open in each half hour, closed between
    assert [night.in_force(first + minutes * 60) for minutes in (-1, 0, 29, 30, 59, 60, 89, 90)] == [
        0, 3, 3, 0, 0, 3, 3, 0,
    ]  # fmt: skip


def test_a_time_zone_with_its_own_daylight_saving_dates() -> None:
    # Given office hours in New York, on the Monday after the US change (2026-03-08) and before the EU's
    office = minimum({**OFFICE_HOURS, "time_zone": "America/New_York"})
    # When it is 08:00 in New York (12:00 UTC, EDT) / Then the window is open; at 07:59 it is not
    opens = datetime(2026, 3, 9, 12, tzinfo=ZoneInfo("UTC")).timestamp()
    assert (office.in_force(opens - 1), office.in_force(opens)) == (1, 4)


def test_a_window_that_spans_midnight_closes_the_next_morning() -> None:
    # Given a Friday night window, 22:00 to 06:00
    night = minimum(
        {"time_zone": BERLIN, "windows": [{"days": ["fri"], "start": "22:00", "end": "06:00", "hot": 2}]}
    )
    # When the clock runs from Friday evening to Saturday morning (2026-11-27 is a Friday)
    clock = ManualClock(at("2026-11-27T21:59:59"))
    # Then it opens at 22:00 on Friday and closes at 06:00 on Saturday
    assert night.in_force(clock.now()) == 0
    assert night.in_force(clock.advance(1)) == 2
    assert night.in_force(clock.advance(8 * 3600 - 1)) == 2  # Saturday 05:59:59
    assert night.in_force(clock.advance(1)) == 0
    # And it does not open on Saturday night
    assert night.in_force(at("2026-11-28T23:00")) == 0


def test_a_sunday_night_window_runs_into_monday_across_the_week_boundary() -> None:
    # Given a Sunday window 23:00 to 02:00
    night = minimum({"windows": [{"days": ["sun"], "start": "23:00", "end": "02:00", "hot": 5}]})
    # When it is Monday 01:59 UTC, then 02:00 (2026-11-30 is a Monday) / Then it is open, then closed
    assert night.in_force(at("2026-11-30T01:59", "UTC")) == 5
    assert night.in_force(at("2026-11-30T02:00", "UTC")) == 0


def test_windows_that_meet_hand_over_at_the_minute() -> None:
    # Given a day window and an evening window that starts where it ends, and a whole-day Saturday
    day = {"days": WORKDAYS, "start": "08:00", "end": "18:00", "hot": 4}
    evening = {"days": WORKDAYS, "start": "18:00", "end": "22:00", "hot": 2}
    saturday = {"days": ["sat"], "start": "00:00", "end": "24:00", "hot": 1}
    schedule = minimum({"time_zone": BERLIN, "windows": [day, evening, saturday]})
    # When the clock crosses 18:00 and a whole Saturday / Then each window's minimum holds in turn
    assert [
        schedule.in_force(at(t)) for t in ("2026-11-23T17:59", "2026-11-23T18:00", "2026-11-23T22:00")
    ] == [4, 2, 0]
    assert [
        schedule.in_force(at(t)) for t in ("2026-11-28T00:00", "2026-11-28T23:59", "2026-11-29T00:00")
    ] == [1, 1, 0]


def test_a_schedule_survives_the_trip_to_the_lambdas_environment() -> None:
    # Given a config with a number and a schedule, dumped as the stack hands it to its Lambdas
    config = load_config({"warm_pool_minimum": {"large": OFFICE_HOURS, "xlarge": 3}})
    # When it is read back / Then it is the same config
    assert load_config(config.model_dump(mode="json", exclude_defaults=True)) == config


# --- what synth refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"time_zone": "Europe/Berln", "windows": []},
            "warm_pool_minimum.large.time_zone: 'Europe/Berln' is not an IANA time zone; fix: use a name",
        ),
        (
            {"time_zone": "/etc/localtime"},
            "warm_pool_minimum.large.time_zone: '/etc/localtime' is not an IANA time zone",
        ),
        (
            {"windows": [{"start": "25:00", "end": "18:00", "hot": 1}]},
            "warm_pool_minimum.large.windows.0.start: '25:00' is not a time of day; fix: write HH:MM",
        ),
        (
            {"windows": [{"start": "8:00", "end": "18:00", "hot": 1}]},
            "warm_pool_minimum.large.windows.0.start: '8:00' is not a time of day",
        ),
        (
            {"windows": [{"start": "24:00", "end": "06:00", "hot": 1}]},
            "warm_pool_minimum.large.windows.0.start: '24:00' is not a time of day",
        ),
        (
            {"windows": [{"start": "08:00", "end": "08:00", "hot": 1}]},
            "warm_pool_minimum.large.windows.0.end: equals start (08:00)",
        ),
        (
            {"windows": [{"days": ["mon", "mon"], "start": "08:00", "end": "18:00", "hot": 1}]},
            "warm_pool_minimum.large.windows.0.days: is empty or names a day twice",
        ),
        (
            {"windows": [{"days": ["monday"], "start": "08:00", "end": "18:00", "hot": 1}]},
            "warm_pool_minimum.large.windows.0.days.0: input should be 'mon', 'tue'",
        ),
        (
            {"windows": [{"start": "08:00", "end": "18:00", "hot": -1}]},
            "warm_pool_minimum.large.windows.0.hot: input should be greater than or equal to 0",
        ),
        (
            {"windows": [{"start": "08:00", "end": "18:00"}]},
            "warm_pool_minimum.large.windows.0.hot: field required",
        ),
        (
            {"windows": [{"start": "08:00", "end": "18:00", "hot": 1, "stoped": 1}]},
            "warm_pool_minimum.large.windows.0.stoped: extra inputs are not permitted",
        ),
        (
            {
                "windows": [
                    {"days": WORKDAYS, "start": "08:00", "end": "18:00", "hot": 4},
                    {"days": ["fri"], "start": "17:00", "end": "20:00", "hot": 2},
                ]
            },
            "warm_pool_minimum.large.windows.1: 17:00-20:00 overlaps windows.0 (08:00-18:00) on fri",
        ),
        (
            {
                "windows": [
                    {"days": ["fri"], "start": "22:00", "end": "06:00", "hot": 2},
                    {"days": ["sat"], "start": "05:00", "end": "09:00", "hot": 1},
                ]
            },
            "warm_pool_minimum.large.windows.1: 05:00-09:00 overlaps windows.0 (22:00-06:00) on sat",
        ),
        (
            {
                "windows": [
                    {"days": ["mon"], "start": "01:00", "end": "03:00", "hot": 1},
                    {"days": ["sun"], "start": "23:00", "end": "02:00", "hot": 2},
                ]
            },
            "warm_pool_minimum.large.windows.1: 23:00-02:00 overlaps windows.0 (01:00-03:00) on mon",
        ),
        (-1, "warm_pool_minimum.large: is -1; fix: set 0 or more idle instances"),
        ("two", "warm_pool_minimum.large: is 'two'; fix: write a number of idle instances, or a schedule"),
    ],
)
def test_a_bad_schedule_is_named_with_its_fix(settings: Any, expected: str) -> None:
    # Given one bad warm minimum / When loaded / Then the message names the setting and says what to do
    found = problem(settings)
    assert expected.lower() in found.lower(), found
    assert "; fix: " in found


# --- the overlap rule, checked minute by minute ---------------------------------------------------

CLOCK_TIMES = st.builds(lambda h, m: f"{h:02}:{m:02}", st.integers(0, 23), st.sampled_from([0, 30]))
WINDOWS = st.builds(
    lambda days, start, end: {
        "days": sorted(days, key=list(Weekday).index),
        "start": start,
        "end": end,
        "hot": 1,
    },
    st.sets(st.sampled_from([day.value for day in Weekday]), min_size=1, max_size=3),
    CLOCK_TIMES,
    CLOCK_TIMES,
).filter(lambda window: window["start"] != window["end"])


def open_by_the_wall_clock(window: dict[str, Any], day: int, minute: int) -> bool:
    """An oracle written apart from the model: open on a listed day from start, and, when it closes at
    or before it opens, on the day after a listed day until end."""
    start, end = (int(window[k][:2]) * 60 + int(window[k][3:]) for k in ("start", "end"))
    days = [list(Weekday).index(Weekday(d)) for d in window["days"]]
    if start < end:
        return day in days and start <= minute < end
    return (day in days and minute >= start) or ((day - 1) % 7 in days and minute < end)


@settings(max_examples=80, deadline=None)
@given(WINDOWS, WINDOWS)
def test_two_windows_are_refused_exactly_when_some_half_hour_of_the_week_has_both_open(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    # Given two windows, each valid alone (on the half hour, so half hours are enough to look at)
    # When every half hour of the week is looked at by the oracle
    both_open = any(
        open_by_the_wall_clock(first, day, minute) and open_by_the_wall_clock(second, day, minute)
        for day in range(7)
        for minute in range(0, 24 * 60, 30)
    )
    # Then synth refuses the pair exactly when both are open at one of them
    try:
        load_config({"warm_pool_minimum": {"large": {"windows": [first, second]}}})
        refused = False
    except ConfigError:
        refused = True
    assert refused == both_open


@settings(max_examples=40, deadline=None)
@given(WINDOWS, st.integers(0, 7 * 24 * 2 - 1))
def test_a_window_is_in_force_exactly_when_the_wall_clock_says_it_is_open(
    window: dict[str, Any], half_hours: int
) -> None:
    # Given a window in Berlin and a half hour of a winter week (2026-11-23 is a Monday)
    schedule = minimum({"time_zone": BERLIN, "windows": [window]})
    day, minute = divmod(half_hours * 30, 24 * 60)
    # When refresh asks at that local time / Then the window's minimum holds exactly when the oracle says open
    local = at(f"2026-11-{23 + day}T{minute // 60:02}:{minute % 60:02}")
    assert (schedule.in_force(local) == 1) == open_by_the_wall_clock(window, day, minute)


# --- the stopped minimum beside the hot one ----------------------------------------------------------

TIER = {"defaults": {"usage": "on-demand"}, "pool": {"stopped_maximum": 3}}


def test_a_plain_number_keeps_no_stopped_minimum() -> None:
    # Given a class's minimum as a number, in a stack with a stopped tier
    config = load_config({**TIER, "warm_pool_minimum": {"large": 2}})
    # When refresh asks / Then the number is hot only
    assert config.stopped_minimum("large", at("2026-11-23T10:00")) == 0
    assert config.warm_minimum("large", at("2026-11-23T10:00")) == 2


def test_a_stopped_minimum_is_in_force_by_the_same_windows_as_the_hot_one() -> None:
    # Given a schedule keeping 1 stopped outside its window, and 3 stopped (2 hot) within it
    window = {"days": WORKDAYS, "start": "08:00", "end": "18:00", "hot": 2, "stopped": 3}
    schedule = {"time_zone": BERLIN, "hot": 0, "stopped": 1, "windows": [window]}
    config = load_config({**TIER, "warm_pool_minimum": {"large": schedule}})
    # When refresh asks within and outside the window / Then each minimum is its own number there
    inside, outside = at("2026-11-23T09:00"), at("2026-11-23T19:00")
    assert (config.warm_minimum("large", inside), config.stopped_minimum("large", inside)) == (2, 3)
    assert (config.warm_minimum("large", outside), config.stopped_minimum("large", outside)) == (0, 1)
    # And a window that names no stopped minimum keeps none
    assert minimum(OFFICE_HOURS).stopped_in_force(inside) == 0


def stopped_problem(settings: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(settings)
    (only,) = raised.value.problems
    return only


def test_a_stopped_minimum_above_the_tiers_maximum_is_refused_with_its_fix() -> None:
    # Given a window that keeps more stopped than pool.stopped_maximum allows
    window = {"start": "08:00", "end": "18:00", "hot": 1, "stopped": 4}
    settings = {**TIER, "warm_pool_minimum": {"large": {"windows": [window]}}}
    # When the config is loaded / Then synth refuses it, naming the setting and the fix
    assert stopped_problem(settings) == (
        "warm_pool_minimum.large.windows.0.stopped: is 4, above pool.stopped_maximum (3), so refresh would "
        "launch instances the tier has no room to keep; fix: raise pool.stopped_maximum to at least 4, "
        "or keep fewer stopped"
    )


def test_a_stopped_minimum_with_no_tier_is_refused() -> None:
    # Given a stopped minimum in a stack that keeps no stopped tier (the default maximum, 0)
    settings = {"defaults": {"usage": "on-demand"}, "warm_pool_minimum": {"large": {"stopped": 1}}}
    # When the config is loaded / Then it is refused at the class's own setting
    assert stopped_problem(settings).startswith(
        "warm_pool_minimum.large.stopped: is 1, above pool.stopped_maximum (0)"
    )


def test_a_stopped_minimum_whose_pool_instances_would_be_spot_is_refused() -> None:
    # Given a stopped minimum in a stack whose label defaults (which a class's pool instances take) are spot
    settings = {"pool": {"stopped_maximum": 3}, "warm_pool_minimum": {"large": {"stopped": 2}}}
    # When the config is loaded / Then it is refused: the tier is on-demand only
    assert stopped_problem(settings) == (
        "warm_pool_minimum.large.stopped: is 2, but defaults.usage is spot: a Spot Instance of an instant "
        "fleet cannot be stopped, and the class's pool instances and default jobs are spot; fix: set "
        'defaults.usage to "on-demand", or keep no stopped minimum'
    )
