"""A class's warm minimum (`warm_pool_minimum`): constant, or by windows of a weekly local-time schedule."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, model_validator

from runner_pool.domain.clock import Epoch
from runner_pool.domain.settings import SettingError, Settings


class Weekday(StrEnum):
    """A day of the week as a schedule names it; in `datetime.weekday()` order, Monday first."""

    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


MINUTES_PER_DAY = 24 * 60
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY
_CLOCK_TIME = re.compile(r"(?P<hour>[01]\d|2[0-3]):(?P<minute>[0-5]\d)")


def _minute_of_day(text: str, *, end: bool) -> int | None:
    """`HH:MM` as minutes after midnight; an end may also be `24:00`. None if it is neither."""
    if end and text == "24:00":
        return MINUTES_PER_DAY
    match = _CLOCK_TIME.fullmatch(text)
    return None if match is None else int(match["hour"]) * 60 + int(match["minute"])


class WarmWindow(Settings):
    """A weekly window of local time in which a class keeps its own warm minimum.

    It opens at `start` on each of its `days` and closes at `end`; an `end` at or before `start`
    closes on the next day (`22:00` to `06:00` on fri runs into Saturday morning). Local time is the
    schedule's time zone's wall clock, so a window keeps its hours across a daylight-saving change.
    """

    days: tuple[Weekday, ...] = tuple(Weekday)
    start: str
    """Local time of day the window opens, `HH:MM`."""
    end: str
    """Local time of day it closes, `HH:MM` or `24:00`; the window does not include it."""
    hot: int = Field(ge=0)
    """Idle (running) instances to keep while the window is open."""
    stopped: int = Field(0, ge=0)
    """Stopped instances to keep while the window is open (the stopped tier, README "The stopped tier")."""
    pristine: int = Field(0, ge=0)
    """Of the idle instances, how many at least are pristine while the window is open (WarmMinimum)."""
    pristine_stopped: int = Field(0, ge=0)
    """Of the stopped tier, how many at least are pristine while the window is open (WarmMinimum)."""
    instant: int = Field(0, ge=0)
    """Instant-tier runners waiting registered while the window is open (WarmMinimum)."""

    @model_validator(mode="after")
    def _times_are_times(self) -> Self:
        for setting in ("start", "end"):
            if _minute_of_day(getattr(self, setting), end=setting == "end") is None:
                raise SettingError(
                    setting,
                    f"{getattr(self, setting)!r} is not a time of day",
                    "write HH:MM on a 24-hour clock, 00:00 to 23:59 (an end may be 24:00)",
                )
        if self.start_minute == self.end_minute:
            raise SettingError(
                "end",
                f"equals start ({self.start}), so the window would be empty or never close",
                "for a whole day write start 00:00 and end 24:00",
            )
        if not self.days or len(set(self.days)) != len(self.days):
            raise SettingError(
                "days", "is empty or names a day twice", 'list each day once, e.g. ["mon", "tue"]'
            )
        return self

    @property
    def start_minute(self) -> int:
        return _minute_of_day(self.start, end=False) or 0

    @property
    def end_minute(self) -> int:
        return _minute_of_day(self.end, end=True) or 0

    def spans(self) -> list[tuple[int, int]]:
        """The minutes of the week it is open, one `[from, to)` per day; `to` passes the week's end
        for a Sunday window that closes on Monday."""
        length = (self.end_minute - self.start_minute) % MINUTES_PER_DAY or MINUTES_PER_DAY
        starts = [list(Weekday).index(day) * MINUTES_PER_DAY + self.start_minute for day in self.days]
        return [(start, start + length) for start in sorted(starts)]

    def is_open(self, minute_of_week: int) -> bool:
        return any(
            start <= minute < end
            for start, end in self.spans()
            for minute in (minute_of_week, minute_of_week + MINUTES_PER_WEEK)
        )


class WarmMinimum(Settings):
    """A class's warm minimum: `hot` idle instances and `stopped` stopped ones, or other numbers in each
    window of a schedule.

    A plain number in the config (`{"large": 2}`) is this with `hot` 2, no stopped ones and no windows.

    `pristine` and `pristine_stopped` are floors among those: of the idle instances, at least `pristine`
    have never served a job, and of the stopped tier at least `pristine_stopped`. A pristine instance
    counts toward `hot` (or `stopped`) too, so refresh keeps max(`hot`, `pristine`) idle instances of
    which `pristine` never served; `{"hot": 4, "pristine": 2}` is four idle, two of them pristine, and
    `{"pristine": 2}` alone two idle, both pristine. Single-use jobs (README, "Security model") take only
    pristine instances, and look in the pool only when their class keeps a pristine minimum at some hour
    (`keeps_pristine`): without one, they go straight to a launch, as fast as before. Jobs that reuse
    take a used instance of their own repository and level first, so the pristine ones are left for
    single-use jobs while there is another.
    """

    hot: int = Field(0, ge=0)
    """Idle instances to keep when no window is open (all the time, without windows)."""
    stopped: int = Field(0, ge=0)
    """Stopped instances to keep when no window is open: launched for the stopped tier, and stopped as
    soon as they are ready."""
    pristine: int = Field(0, ge=0)
    """Of the idle instances, how many at least are pristine when no window is open."""
    pristine_stopped: int = Field(0, ge=0)
    """Of the stopped tier, how many at least are pristine when no window is open."""
    instant: int = Field(0, ge=0)
    """The instant tier when no window is open: pristine instances, besides the idle ones above, whose
    runner waits registered with the class's generic label (domain/labels.py `instant_label`), so GitHub
    gives a job that asks for it to one of them with no step of ours in between. Each serves one job and
    is terminated (domain/instant.py)."""
    time_zone: str = "UTC"
    """The IANA time zone the windows' days and times are in, e.g. `Europe/Berlin`."""
    windows: tuple[WarmWindow, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _a_number_is_a_constant_minimum(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise SettingError("", f"is {value}", "set 0 or more idle instances")
            return {"hot": value}
        if not isinstance(value, Mapping | WarmMinimum):
            raise SettingError(
                "",
                f"is {value!r}",
                'write a number of idle instances, or a schedule such as {"time_zone": "Europe/Berlin", '
                '"windows": [{"days": ["mon"], "start": "08:00", "end": "18:00", "hot": 2}]}',
            )
        return value

    @model_validator(mode="after")
    def _schedule_is_coherent(self) -> Self:
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise SettingError(
                "time_zone",
                f"{self.time_zone!r} is not an IANA time zone",
                "use a name from the tz database, e.g. Europe/Berlin, America/New_York or UTC",
            ) from None
        for later, window in enumerate(self.windows):
            for earlier in range(later):
                overlap = _first_overlap(self.windows[earlier], window)
                if overlap is not None:
                    day = list(Weekday)[overlap // MINUTES_PER_DAY % 7].value
                    raise SettingError(
                        f"windows.{later}",
                        f"{window.start}-{window.end} overlaps windows.{earlier} "
                        f"({self.windows[earlier].start}-{self.windows[earlier].end}) on {day}, "
                        "so the minimum in force there would be ambiguous",
                        "let one window end where the next starts (an end equal to a start does not overlap)",
                    )
        return self

    def in_force(self, now: Epoch) -> int:
        """The hot minimum at `now`: the open window's, else `hot`."""
        return self._open_at(now).hot

    def stopped_in_force(self, now: Epoch) -> int:
        """The stopped minimum at `now`: the open window's, else `stopped`."""
        return self._open_at(now).stopped

    def pristine_in_force(self, now: Epoch) -> int:
        """The pristine floor among idle instances at `now`: the open window's, else `pristine`."""
        return self._open_at(now).pristine

    def pristine_stopped_in_force(self, now: Epoch) -> int:
        """The pristine floor among the stopped tier at `now`: the open window's, else `pristine_stopped`."""
        return self._open_at(now).pristine_stopped

    def instant_in_force(self, now: Epoch) -> int:
        """The instant tier's size at `now`: the open window's, else `instant`."""
        return self._open_at(now).instant

    def keeps_instant(self) -> bool:
        """Whether it keeps an instant tier at any hour."""
        settings: list[WarmMinimum | WarmWindow] = [self, *self.windows]
        return any(setting.instant for setting in settings)

    def keeps_pristine(self) -> bool:
        """Whether it keeps a pristine instance, hot or stopped, at any hour."""
        settings: list[WarmMinimum | WarmWindow] = [self, *self.windows]
        return any(setting.pristine or setting.pristine_stopped for setting in settings)

    def most_stopped(self) -> tuple[str, int]:
        """The largest stopped minimum it ever keeps (`stopped`, or a larger `pristine_stopped`, which
        lives in the same tier), and its setting's path under the class."""
        return max(
            [(name, getattr(self, name)) for name in ("stopped", "pristine_stopped")]
            + [
                (f"windows.{index}.{name}", getattr(window, name))
                for index, window in enumerate(self.windows)
                for name in ("stopped", "pristine_stopped")
            ],
            key=lambda item: item[1],
        )

    def _open_at(self, now: Epoch) -> WarmMinimum | WarmWindow:
        """The window open at `now`, else the schedule itself (its `hot` and `stopped` outside them)."""
        if not self.windows:
            return self
        local = datetime.fromtimestamp(now, ZoneInfo(self.time_zone))
        minute = local.weekday() * MINUTES_PER_DAY + local.hour * 60 + local.minute
        return next((window for window in self.windows if window.is_open(minute)), self)


def _first_overlap(first: WarmWindow, second: WarmWindow) -> int | None:
    """The first minute of the week both windows are open, or None; the week wraps (Sunday into Monday)."""
    for a_start, a_end in first.spans():
        for b_start, b_end in second.spans():
            for shift in (-MINUTES_PER_WEEK, 0, MINUTES_PER_WEEK):
                if max(a_start, b_start + shift) < min(a_end, b_end + shift):
                    return max(a_start, b_start + shift)
    return None
