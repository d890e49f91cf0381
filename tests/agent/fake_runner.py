"""Stands in for the GitHub runner's run.sh in the agent's tests.

Called as `run.sh` in the runner directory, like the real one, and like the real one
(actions/runner src/Runner.Listener/Runner.cs, `LoadSettings`) it reads its settings from the files
the agent wrote there from the JIT config. It refuses any argument, and any `ACTIONS_RUNNER_INPUT_*`
variable, which the real listener takes as an argument (src/Runner.Listener/CommandSettings.cs:110-140 at
258d6c857db3): the agent's runner has its files to go by and nothing else. The tests' configs carry in `.runner` how the fake behaves
and an `id`, so the fake also proves which config the control plane stored reached it. Modes:

    job     say it is listening, run one job (files in _work, a leftover process), exit 0
    refuse  fail the way a runner with a bad config does, before listening; exit 1
    hang    say nothing more, until stopped
    vanish  say it is listening, then exit before any job comes (a runner that dies waiting)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    arguments = sys.argv[1:] + [
        name for name in os.environ if name.upper().startswith("ACTIONS_RUNNER_INPUT_")
    ]
    if arguments:
        say(f"An error occurred: unexpected arguments {arguments}")
        return 1
    here = Path.cwd()
    config = json.loads((here / ".runner").read_text())["fakeRunner"]
    with (here / "starts.log").open("a") as starts:
        starts.write(config["id"] + "\n")
    say("√ Connected to GitHub")
    if config["mode"] == "refuse":
        say("An error occurred: Runner registration has been deleted from the server")
        return 1
    if config["mode"] == "hang":
        time.sleep(60)  # the runner's silence is the behaviour: the agent's listening timeout ends it
        return 0
    say("Current runner version: '2.328.0'")
    say(f"{datetime.now(UTC):%Y-%m-%d %H:%M:%SZ}: Listening for Jobs")
    if config["mode"] == "vanish":
        time.sleep(config.get("idle_seconds", 0.05))  # the stand-in's time listening, as a test asks
        return 1
    time.sleep(config.get("idle_seconds", 0.05))  # the stand-in's time listening, as a test asks
    say(f"{datetime.now(UTC):%Y-%m-%d %H:%M:%SZ}: Running job: build")
    workspace = here / "_work" / "repository"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "build.log").write_text("built\n")
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    (here / "leftover.pid").write_text(str(leftover.pid))
    time.sleep(config.get("job_seconds", 0.05))  # the stand-in's job, as long as a test asks
    say(f"{datetime.now(UTC):%Y-%m-%d %H:%M:%SZ}: Job build completed with result: Succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
