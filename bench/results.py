"""Benchmark figures: a readable table for people, and bench/results.json for comparing runs over time.

Every figure has one key in results.json, and the key ends with its unit (`_seconds`, `_count`,
`_ratio`, ...), so a reader never has to guess what a number measures. Benchmarks of different
issues share the file: writing merges a benchmark's keys into it and leaves every other key alone.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

RESULTS_PATH = Path(__file__).with_name("results.json")
UNITS = (
    "seconds",
    "milliseconds",
    "count",
    "ratio",
    "percent",
    "bytes",
    "per_second",
    "found",
    "dollars_per_month",
    "per_run",
)
"""`found` is an outcome, 1 or 0: whether what the figure names was found (e.g.
`pickup_match_behind_10000_misfits_found`); `dollars_per_month` a cost at list prices (e.g.
`agent_idle_dynamodb_dollars_per_month`); `per_run` a count for each workflow run, the worst run's
(e.g. `burst_1000_jobs_executions_per_run`)."""


@dataclass
class BenchTable:
    """One benchmark's outcome: rows to print and figures to keep."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {self.title!r} has {len(self.columns)} cells, got {len(cells)}")
        self.rows.append(tuple(str(cell) for cell in cells))

    def figure(self, key: str, value: float) -> float:
        """Keep a figure under `key`, whose name must end with its unit; returns the value."""
        if not key.endswith(tuple(f"_{unit}" for unit in UNITS)):
            raise ValueError(f"figure {key!r} does not end with its unit; use one of: {', '.join(UNITS)}")
        self.figures[key] = value
        return value

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self) -> str:
        widths = [max(len(line[i]) for line in [self.columns, *self.rows]) for i in range(len(self.columns))]

        def line(cells: tuple[str, ...]) -> str:
            first, *rest = cells
            return "  ".join(
                [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))]
            )

        rule = "-" * len(line(self.columns))
        return "\n".join(
            [self.title, rule, line(self.columns), rule, *(line(r) for r in self.rows), rule, *self.notes]
        )


def merge_results(figures: Mapping[str, float], path: Path = RESULTS_PATH) -> dict[str, float]:
    """Write `figures` into the results file, keeping every key they do not name; returns the whole file."""
    merged: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    merged.update(figures)
    # Written beside the file and renamed over it, so an interrupted run never leaves half a file.
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        json.dump(dict(sorted(merged.items())), handle, indent=2)
        handle.write("\n")
    os.chmod(handle.name, 0o644)  # a temporary file is private; the results file is not
    os.replace(handle.name, path)
    return merged


def repeated(runs: list[BenchTable]) -> tuple[BenchTable, dict[str, float]]:
    """Runs of one benchmark in one table of min / median / max per figure, and the figures to keep:
    the median under each figure's own key, the min under the key with `min_` in front (the unit stays
    last). A figure some run did not produce is kept from the runs that did."""
    first = runs[0]
    summary = BenchTable(f"{first.title}: {len(runs)} runs", ("figure", "min", "median", "max", "runs"))
    kept: dict[str, float] = {}
    keys = list(dict.fromkeys(key for table in runs for key in table.figures))
    for key in keys:
        values = [table.figures[key] for table in runs if key in table.figures]
        median = statistics.median(values)
        kept[key] = median
        kept[f"min_{key}"] = min(values)
        summary.row(key, _figure(min(values)), _figure(median), _figure(max(values)), len(values))
    return summary, kept


def _figure(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)
