"""`make bench`: run every benchmark (or those named as arguments), print their tables, keep figures."""

from __future__ import annotations

import importlib
import sys

from bench.results import RESULTS_PATH, merge_results

BENCHMARKS = ("pickup", "agent", "provision", "webhook", "emulator", "burst", "quotas", "lambda_runtime")
"""Modules of this package with a `run() -> BenchTable`; later issues add theirs here."""


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; the benchmarks are: {', '.join(BENCHMARKS)}")
        return 2
    for name in names or BENCHMARKS:
        table = importlib.import_module(f"bench.{name}").run()
        print(table.render(), end="\n\n", flush=True)
        merge_results(table.figures)
    print(f"figures merged into {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
