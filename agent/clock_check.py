"""The instance's clock, checked at boot against the time chrony keeps from Amazon Time Sync.

Every time the agent writes (its heartbeat's `beat_at`, its signals' `at`) is its instance's clock, and
the control plane judges it against its own. So before it says it is ready the agent asks chrony how far
the system clock may be from true time, and refuses the instance (UD_FAILED, with the figures) when it
is not synchronised within `clock_sync_wait_seconds` or may be further off than
`clock_error_bound_seconds` (agent/settings.py says why that bound).

Where the time comes from: "Amazon Linux AMIs ... configure your instance to use the NTP IPv4 endpoint by
default" (169.254.169.123), and on other distributions one installs chrony and adds `server
169.254.169.123 prefer iburst minpoll 4 maxpoll 4` (EC2 User Guide, "Set the time reference on your EC2
instance to use the local Amazon Time Sync Service"), as the user data does on Ubuntu.

What chrony says: `chronyc -c tracking` prints the tracking report as one line of comma-separated values
in the order of the text report (chrony's client.c, process_cmd_tracking): reference id, reference name,
stratum, reference time, system time, last offset, RMS offset, frequency, residual frequency, skew, root
delay, root dispersion, update interval, leap status. "System time" is the offset between chrony's NTP
clock and the system clock, positive when the system clock is slow; and "an absolute bound on the
computer's clock accuracy ... is given by: clock_error <= |system_time_offset| + root_dispersion + (0.5 *
root_delay)" (chronyc(1), tracking).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.log import EventLog

UNSYNCHRONISED = "Not synchronised"
LOCAL_REFERENCE_ID = "7F7F0101"
"""chrony's reference id when it serves its own local clock (`local` directive): no outside time."""
_FIELDS = 14
_COMMAND_TIMEOUT_SECONDS = 10.0
_POLL_SECONDS = 1.0


class ClockUnreadableError(RuntimeError):
    """chronyc did not answer with a tracking report."""


@dataclass(frozen=True)
class Tracking:
    source: str
    """The reference chrony is synchronised to, by name or address (169.254.169.123 for Amazon Time Sync)."""
    synchronised: bool
    system_offset_seconds: float
    """Positive when the system clock is slow of chrony's NTP clock."""
    root_delay_seconds: float
    root_dispersion_seconds: float

    @property
    def error_bound_seconds(self) -> float:
        """How far the system clock may be from true time, by chronyc(1)'s formula."""
        return abs(self.system_offset_seconds) + self.root_dispersion_seconds + self.root_delay_seconds / 2


def parse_tracking(line: str) -> Tracking:
    fields = line.strip().split(",")
    if len(fields) != _FIELDS:
        raise ClockUnreadableError(f"chronyc tracking answered {line.strip()!r}, not {_FIELDS} fields")
    reference_id, source, leap = fields[0], fields[1], fields[13]
    try:
        offset, root_delay, root_dispersion = float(fields[4]), float(fields[10]), float(fields[11])
    except ValueError as exc:
        raise ClockUnreadableError(f"chronyc tracking answered {line.strip()!r}: {exc}") from None
    synchronised = leap != UNSYNCHRONISED and reference_id not in ("00000000", LOCAL_REFERENCE_ID)
    return Tracking(source, synchronised, offset, root_delay, root_dispersion)


def read_tracking(chronyc: Path) -> Tracking:
    try:
        result = subprocess.run(  # noqa: S603 - chrony's own client, named by the user data
            [str(chronyc), "-c", "tracking"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClockUnreadableError(f"{chronyc} could not be run: {exc}") from None
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip()
        raise ClockUnreadableError(f"{chronyc} -c tracking exited with code {result.returncode}: {said}")
    return parse_tracking(result.stdout)


def clock_failure(
    chronyc: Path,
    bound_seconds: float,
    wait_seconds: float,
    log: EventLog,
    *,
    pause: Callable[[float], bool],
    poll_seconds: float = _POLL_SECONDS,
) -> str | None:
    """None once chrony says the system clock is synchronised and within `bound_seconds` of true time;
    else, after `wait_seconds` (chrony steps a clock it finds far off at its first updates, so a boot may
    begin off and end well), why not. `pause` waits and returns True when the agent is stopping."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            tracking: Tracking | None = read_tracking(chronyc)
            problem = None
        except ClockUnreadableError as exc:
            tracking, problem = None, f"the clock could not be checked: {exc}"
        if tracking is not None:
            if not tracking.synchronised:
                problem = f"the clock is not synchronised (chrony's reference: {tracking.source or 'none'})"
            elif tracking.error_bound_seconds > bound_seconds:
                direction = "slow" if tracking.system_offset_seconds > 0 else "fast"
                problem = (
                    f"the clock may be {tracking.error_bound_seconds:.3f} s off true time ({direction} of "
                    f"{tracking.source} by {abs(tracking.system_offset_seconds):.3f} s), more than the "
                    f"{bound_seconds:g} s a heartbeat may be off"
                )
            else:
                log.info(
                    "clock checked",
                    source=tracking.source,
                    error_bound_seconds=tracking.error_bound_seconds,
                )
                return None
        if time.monotonic() + poll_seconds > deadline or pause(poll_seconds):
            return f"{problem} after {wait_seconds:g} s"
