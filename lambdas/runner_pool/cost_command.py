"""`runner-pool cost [--since 7d] [--by repository|class|day] [--json]`: what the stack's jobs cost.

It reads the cost items of each UTC day the window touches (adapters/cost_ledger.py: one Query a day)
and prices them with the product's own function (domain/cost.py `report`): per group, the jobs served,
EC2, the gp3 root volumes and the control plane, each job's share, and the idle (pool) share apart. An
item counts when it ended within the window: a hand-over when its release ended it, an instance's
idle share when the instance ended, so an instance still alive adds its idle time later.
"""

from __future__ import annotations

import re
from typing import Any

from runner_pool.domain.clock import Epoch
from runner_pool.domain.cost import IDLE, Charges, CostReport, Grouping, report, utc_day
from runner_pool.domain.ports import CostLedger
from runner_pool.prices import PRICES_AS_OF, list_prices

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([dh])$")
YARDSTICK = f"list prices ({PRICES_AS_OF}; spot at a published ratio of on-demand): a yardstick, not a bill"


def window_seconds(text: str) -> float:
    """`7d` or `12h` as seconds; a ValueError names what is wrong."""
    found = _SPAN.match(text.strip())
    if found is None:
        raise ValueError(f"--since {text!r}: give a number of days or hours, e.g. 7d or 12h")
    return float(found.group(1)) * (86_400 if found.group(2) == "d" else 3_600)


def days_between(since: Epoch, now: Epoch) -> list[str]:
    """Every UTC day from `since`'s to `now`'s, in order."""
    days: list[str] = []
    at = since
    while at <= now:
        day = utc_day(at)
        if not days or days[-1] != day:
            days.append(day)
        at += 86_400
    if utc_day(now) not in days:
        days.append(utc_day(now))
    return days


def read_report(ledger: CostLedger, now: Epoch, since_seconds: float, by: Grouping) -> CostReport:
    """The items ended within `since_seconds` before `now`, priced per group."""
    since = now - since_seconds
    hand_overs, lives = [], []
    for day in days_between(since, now):
        found_hand_overs, found_lives = ledger.day(day)
        hand_overs += [item for item in found_hand_overs if item.ended_at >= since]
        lives += [item for item in found_lives if item.ended_at >= since]
    return report(hand_overs, lives, list_prices(), by)


HEADER = ["group", "jobs", "ec2_usd", "ebs_usd", "control_plane_usd", "total_usd", "usd_per_job"]


def rows(found: CostReport) -> list[list[str]]:
    """One row per group, the idle share's (per class or day, or one), and the total."""
    lines = [_row(name, charges) for name, charges in found.groups.items()]
    if found.idle_by_group:
        lines += [_row(f"{IDLE} {name}", charges) for name, charges in found.idle_by_group.items()]
    else:
        lines.append(_row(IDLE, found.idle))
    return [*lines, _row("total", found.total)]


def notes(found: CostReport) -> list[str]:
    """Each job's share with and without the idle share, and what could not be priced."""
    said = []
    jobs = found.jobs
    if jobs.jobs:
        said.append(
            f"{jobs.jobs} job(s): ${jobs.total_usd / jobs.jobs:.5f} a job; with the idle share "
            f"${found.total.total_usd / jobs.jobs:.5f} a job"
        )
    if found.total.unpriced_seconds:
        said.append(f"+? {found.total.unpriced_seconds:.0f} s on types the price list lacks, not priced")
    return said


def as_document(found: CostReport, since: str, by: str) -> dict[str, Any]:
    return {
        "since": since,
        "by": by,
        "prices": YARDSTICK,
        "groups": {name: _charges(charges) for name, charges in found.groups.items()},
        "idle": _charges(found.idle),
        "idle_by_group": {name: _charges(charges) for name, charges in found.idle_by_group.items()},
        "total": _charges(found.total),
    }


def _charges(charges: Charges) -> dict[str, Any]:
    return {
        "jobs": charges.jobs,
        "ec2_usd": round(charges.ec2_usd, 6),
        "ebs_usd": round(charges.ebs_usd, 6),
        "control_plane_usd": round(charges.control_plane_usd, 6),
        "total_usd": round(charges.total_usd, 6),
        "usd_per_job": round(charges.total_usd / charges.jobs, 6) if charges.jobs else None,
        "unpriced_seconds": round(charges.unpriced_seconds, 1),
    }


def _row(name: str, charges: Charges) -> list[str]:
    per_job = f"{charges.total_usd / charges.jobs:.5f}" if charges.jobs else "-"
    return [
        name,
        str(charges.jobs) if charges.jobs else "-",
        f"{charges.ec2_usd:.5f}",
        f"{charges.ebs_usd:.5f}",
        f"{charges.control_plane_usd:.5f}",
        f"{charges.total_usd:.5f}",
        per_job,
    ]
