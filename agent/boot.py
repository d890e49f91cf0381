"""The operator's pre-runner script, run once when the instance boots, before any runner starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agent.log import EventLog

_REASON_LINES = 3


def run_pre_runner_script(script: Path | None, timeout_seconds: float, log: EventLog) -> str | None:
    """Run `script`, logging its output; None if it succeeded (or there is none), else why it failed."""
    if script is None:
        return None
    log.info("pre-runner script starting", script=str(script))
    try:
        result = subprocess.run(  # noqa: S603 - the operator's script, installed by the user data
            [str(script)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"the pre-runner script did not finish within {timeout_seconds:g} s"
    except OSError as exc:
        return f"the pre-runner script could not be run: {exc}"
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    for line in lines:
        log.info("pre-runner output", line=line)
    if result.returncode != 0:
        tail = " | ".join(lines[-_REASON_LINES:])
        return f"the pre-runner script exited with code {result.returncode}" + (f": {tail}" if tail else "")
    log.info("pre-runner script succeeded")
    return None
