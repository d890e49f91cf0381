"""`make bench`: every benchmark (or those named) at full size, 3 times each; min and median kept.

`python -m bench --small [names]` runs each once at the size `make test` runs it (tests/bench), and
writes nothing: small figures must never overwrite the full ones in bench/results.json.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from bench.results import RESULTS_PATH, BenchTable, merge_results, repeated

BENCHMARKS = (
    "pickup",
    "agent",
    "provision",
    "webhook",
    "emulator",
    "emulator_single_use",
    "burst",
    "burst_1000",
    "burst_at_concurrency_10",
    "quotas",
    "lambda_runtime",
    "day_trace",
    "instant",
)
"""Modules of this package with `run(**size) -> BenchTable` and a `SMALL` size; later issues add theirs."""

REPEATS = 3
"""A benchmark on a shared 2-core machine varies from run to run: the median of 3 resists one bad run,
and the min is the figure least disturbed by the machine."""


def run_bench(name: str, small: bool = False) -> BenchTable:
    """One run of benchmark `name`, at its full size or at `make test`'s."""
    module: Any = importlib.import_module(f"bench.{name}")
    table: BenchTable = module.run(**(module.SMALL if small else {}))
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="name", help=f"any of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--small", action="store_true", help="once each at make test's size; writes nothing")
    parser.add_argument("--repeat", type=int, default=REPEATS, help=f"runs of each (default {REPEATS})")
    arguments = parser.parse_args(argv)
    unknown = sorted(set(arguments.names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; the benchmarks are: {', '.join(BENCHMARKS)}")
        return 2
    for name in arguments.names or BENCHMARKS:
        if arguments.small:
            print(run_bench(name, small=True).render(), end="\n\n", flush=True)
            continue
        runs = []
        for number in range(1, arguments.repeat + 1):
            print(f"[{name}: run {number} of {arguments.repeat}]", flush=True)
            runs.append(run_bench(name))
        summary, figures = repeated(runs)
        print(runs[-1].render(), end="\n\n")
        print(summary.render(), end="\n\n", flush=True)
        merge_results(figures)
    if not arguments.small:
        print(f"figures merged into {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
