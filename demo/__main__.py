"""`make demo`, `python -m demo [--chart PATH]`: plays `scenario.DEMO` on the emulated world and reports.

Several workflows arrive over a minute, some with matrices: the first ones find the pool empty and
cold-start instances, the later ones get the instances the first ones gave back. One instance
crashes mid-job and one `queued` webhook never arrives (refresh asks GitHub to deliver it again).
At the end it prints, per job, how long it waited for a runner and whose time that was, the
warm-hit ratio, the AWS calls and state transitions per job, the accounting check, the `runner-pool
job` story of the crashed job and of the lost-webhook job, `runner-pool cost` for its repositories, and
writes the timeline chart. It ends with `runner-pool doctor` against its own stack (emulator/doctor.py):
the deploy guide's check of the App, the organisation's runner policy and the account, all clear.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from demo import scenario
from demo.cost import print_cost
from demo.report import holds, print_report, summary_lines, totals
from demo.stories import print_job_stories
from demo.timeline_chart import write_chart
from emulator import doctor
from emulator.world import world

CHART = Path("demo-timeline.html")


def run(argv: list[str]) -> bool:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--chart", type=Path, default=CHART, help=f"where to write the chart ({CHART})")
    chart = parser.parse_args(argv).chart
    began = time.time()
    steps = scenario.DEMO
    runs = sum(1 for step in steps if isinstance(step, scenario.Arrive))
    jobs = sum(spec.matrix for step in steps if isinstance(step, scenario.Arrive) for spec in step.jobs)
    print(f"starting local AWS, the fake GitHub and the stack; then {jobs} jobs of {runs} workflow runs")
    with tempfile.TemporaryDirectory(prefix="runner-pool-demo-") as scratch, world(Path(scratch)) as system:
        print(f"up in {time.time() - began:.0f} s; playing the scenario (about a minute)", flush=True)
        played = scenario.play(system, steps)
        found = totals(system)
        print_report(system, played, found)
        print_job_stories(system, steps, played)
        priced = print_cost(system)
        print("\nrunner-pool doctor, against the demo's stack:")
        doctor.as_after_first_fleet(system)
        healthy = doctor.examine(system, sys.stdout) == 0
    events = system.events()
    write_chart(chart, events, "runner-pool: the demo's timeline", summary_lines(found))
    verdict = holds(found, played, jobs) and healthy and priced
    print(f"timeline chart: {chart.resolve()}")
    print(f"demo {'passed' if verdict else 'FAILED'} in {time.time() - began:.0f} s")
    return verdict


if __name__ == "__main__":
    sys.exit(0 if run(sys.argv[1:]) else 1)
