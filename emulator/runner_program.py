"""The emulator's GitHub runner: what `run.sh` starts on a simulated instance, set up by the JIT config.

Like the real runner started with a JIT config it connects to GitHub (here the fake, at the
config's `ServerUrl`, with the token in its `.credentials`), prints that it is listening, takes one
job, runs it (the job is a sleep of the length GitHub hands over), reports the result and exits.
It speaks the fake's small runner protocol (emulator/fake_github/runner_protocol.py), renewing
its job while it runs, so a runner that dies mid-job is noticed by GitHub as lost. Ctrl-C (the
agent's stop) disconnects and exits. Standard library only: it starts once per job, and fast.

As the real runner does, it writes diagnostic logs under its directory's `_diag`: the listener's
`Runner_<time>-utc.log` and the job's worker's `Worker_<time>-utc.log`, each line
`[<UTC time>Z <level> <component>] <text>` (actions/runner's `HostTraceListener` format), which the agent
ships before its scrub empties the directory (agent/log_shipping.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

VERSION = "2.328.0"
STARTED = f"{datetime.now(UTC):%Y%m%d-%H%M%S}"
POLL_SECONDS = 0.2
"""How often an idle runner asks for its job."""
RENEW_SECONDS = 1.0
"""How often a busy runner tells GitHub it is still working; well inside GitHub's lost-runner time."""
PID_FILE = "runner.pid"
"""Written in the runner directory, so the emulator can kill the runner with its instance."""
UNREACHABLE_ATTEMPTS = 20


class RegistrationGoneError(RuntimeError):
    """GitHub no longer knows this runner (removed, or its job given away)."""


class FakeGitHubClient:
    def __init__(self, server_url: str, token: str) -> None:
        self._base = server_url.rstrip("/")
        self._token = token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - the fake GitHub's URL from the JIT config
            f"{self._base}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        for attempt in range(UNREACHABLE_ATTEMPTS):
            try:
                with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                    raw = response.read()
                    return int(response.status), json.loads(raw) if raw else None
            except urllib.error.HTTPError as refused:
                if refused.code == 401:
                    raise RegistrationGoneError(path) from None
                return int(refused.code), None
            except (urllib.error.URLError, OSError):
                if attempt == UNREACHABLE_ATTEMPTS - 1:
                    raise
                time.sleep(POLL_SECONDS)
        raise AssertionError("unreachable: the loop returns or raises")


DIAG = Path("_diag")


def say(line: str) -> None:
    print(line, flush=True)
    diag("Runner", "Listener", line)


def diag(kind: str, component: str, line: str) -> None:
    """One line of the `kind` (Runner or Worker) diagnostic log this process started."""
    DIAG.mkdir(exist_ok=True)
    with (DIAG / f"{kind}_{STARTED}-utc.log").open("a") as log:
        log.write(f"[{datetime.now(UTC):%Y-%m-%d %H:%M:%S}Z INFO {component}] {line}\n")


def stamp() -> str:
    return f"{datetime.now(UTC):%Y-%m-%d %H:%M:%SZ}"


def runner_files(directory: Path) -> dict[str, Any]:
    """The settings files the agent wrote into the runner directory from the JIT config, as the real
    listener loads them when started without `--jitconfig` (actions/runner Runner.cs, `LoadSettings`)."""
    return {name: json.loads((directory / name).read_text()) for name in (".runner", ".credentials")}


def serve_one_job(github: FakeGitHubClient) -> int:
    status, _ = github.call("POST", "/_runner/session")
    if status != 201:
        say(f"An error occurred: could not create a session ({status})")
        return 1
    say(f"Current runner version: '{VERSION}'")
    say(f"{stamp()}: Listening for Jobs")
    while True:
        status, job = github.call("GET", "/_runner/job")
        # An offered job is the runner's once it picks it up; one offered elsewhere meanwhile is not.
        if status == 200 and github.call("POST", f"/_runner/jobs/{job['job_id']}/acquire")[0] == 204:
            break
        time.sleep(POLL_SECONDS)
    say(f"{stamp()}: Running job: {job['name']}")
    diag("Worker", "Worker", f"Job {job['name']} (job id {job['job_id']}) received; running it")
    finish_at = time.monotonic() + float(job["seconds"])
    while (left := finish_at - time.monotonic()) > 0:
        time.sleep(min(left, RENEW_SECONDS))
        if github.call("POST", f"/_runner/jobs/{job['job_id']}/renew")[0] == 410:
            say(f"{stamp()}: Job {job['name']} was cancelled")
            return 0
    conclusion = job.get("conclusion", "success")
    diag("Worker", "Worker", f"Job {job['name']} completed with result: {conclusion}")
    github.call("POST", f"/_runner/jobs/{job['job_id']}/result", {"conclusion": conclusion})
    say(f"{stamp()}: Job {job['name']} completed with result: {conclusion.title()}")
    return 0


def main() -> int:
    files = runner_files(Path.cwd())
    Path(PID_FILE).write_text(str(os.getpid()))
    github = FakeGitHubClient(files[".runner"]["ServerUrl"], files[".credentials"]["Data"]["token"])
    say("√ Connected to GitHub")
    try:
        return serve_one_job(github)
    except RegistrationGoneError:
        say("An error occurred: Runner registration has been deleted from the server")
        return 1
    except KeyboardInterrupt:
        with contextlib.suppress(RegistrationGoneError, OSError):
            github.call("DELETE", "/_runner/session")
        say("Exiting...")
        return 0


if __name__ == "__main__":
    sys.exit(main())
