"""`runner-pool connect <job URL | run URL | instance id> [--print]`: a Session Manager shell on a job's
instance, when its class lets Session Manager in (domain/connect.py says which instance, and when not).

The job's instance is found as its story finds it (runner_pool/job_command.py: GitHub's runner name, else
the release that gave the instance back), its record and class in the stack's records and config. The
session itself is the AWS CLI's (`aws ssm start-session`), which needs AWS's session-manager-plugin: without
it, or with `--print`, the command is printed for the operator to run.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TextIO

from runner_pool.domain.clock import Clock
from runner_pool.domain.connect import (
    ConnectRefusedError,
    is_instance_id,
    refusal,
    served_by,
    session_command,
)
from runner_pool.domain.job_story import parse_job_url
from runner_pool.job_command import JobTarget, state_table, stories_of

PLUGIN = "session-manager-plugin"
PLUGIN_DOCS = "https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-install-plugin.html"


def connect(
    target: JobTarget,
    named: str,
    clients: Callable[[str], Any],
    clock: Clock,
    out: TextIO,
    *,
    print_only: bool,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[[list[str]], int] = lambda command: subprocess.run(command, check=False).returncode,  # noqa: S603
) -> int:
    """Start (or print) the session on the instance `named` names: 0 printed, the session's own code when
    started; 2 for what names no instance, 1 for a refusal, each with its reason on stderr."""
    try:
        instance_id = _instance_named(target, named, clients, clock)
    except ValueError as error:
        print(f"runner-pool: {error}", file=sys.stderr)
        return 2
    except ConnectRefusedError as error:
        print(f"runner-pool: no session: {error}", file=sys.stderr)
        return 1
    refused = refusal(instance_id, state_table(target, clients, clock).get(instance_id), target.config)
    if refused is not None:
        print(f"runner-pool: no session: {refused}", file=sys.stderr)
        return 1
    command = session_command(instance_id, clients("dynamodb").meta.region_name)
    missing = [tool for tool in ("aws", PLUGIN) if which(tool) is None]
    if print_only or missing:
        if missing and not print_only:
            print(
                f"runner-pool: {' and '.join(missing)} not installed ({PLUGIN_DOCS}); run:", file=sys.stderr
            )
        print(shlex.join(command), file=out)
        return 0
    return run(command)


def _instance_named(target: JobTarget, named: str, clients: Callable[[str], Any], clock: Clock) -> str:
    if is_instance_id(named):
        return named.strip()
    try:
        ref = parse_job_url(named)
    except ValueError:
        raise ValueError(
            f"{named!r} is neither an instance id (i-...) nor a job or run URL "
            "(https://github.com/OWNER/REPO/actions/runs/RUN[/job/JOB])"
        ) from None
    stories, unread = stories_of(target, ref, clients, clock)
    if stories is None:
        raise ConnectRefusedError(
            f"the jobs of run {ref.run_id} are listed by GitHub only: {unread}; name a job or an instance"
        )
    return served_by(ref, stories)
