"""`runner-pool logs <job URL or run URL>`: the lines the job's instance shipped of its hand-over, the
agent's and the runner's, in time order, as text or, with `--json`, as one JSON document.

The job's story (runner_pool/job_command.py) says which instance ran it, on which runner, and from when to
when; the lines are read from the stack's log group of job logs (its `JobLogGroupName` output) with
FilterLogEvents over that instance's two streams between those times, and only those of the job's
hand-over are kept (domain/job_logs.py: each line carries its runner's id), so a reused instance's other
jobs are left out. Without GitHub's view of the job (no App key readable) the runner is not known, and
every line of the instance between the story's times is printed, which the header says.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

from runner_pool.adapters.job_logs import JobLogReader
from runner_pool.domain.clock import Clock
from runner_pool.domain.job_logs import HandOverWindow, JobLine, lines_of, window_of
from runner_pool.domain.job_story import Story, parse_job_url
from runner_pool.job_command import LOG_GROUP_OUTPUT, JobTarget, clock_time, told

IDENTITY = ("time", "level", "message", "instance_id", "run_key", "runner_id", "file")
"""A line's fields the text form shows in its columns or its header, not again after its message."""
_DIAG_PREFIX = re.compile(r"^\[[^\]]*\] ")


def logs(
    target: JobTarget, url: str, clients: Callable[[str], Any], clock: Clock, out: TextIO, *, as_json: bool
) -> int:
    """Print the hand-over lines of the job `url` names, or of every job of the run it names; 1 when the
    stack has no log group of job logs or a run's jobs cannot be listed, 2 for a URL that names neither."""
    if target.log_group is None:
        print(
            f"runner-pool: the stack has no {LOG_GROUP_OUTPUT} output: deploy this version to ship job logs",
            file=sys.stderr,
        )
        return 1
    stories = told(target, url, clients, clock)
    if isinstance(stories, int):
        return stories
    reader = JobLogReader(target.log_group, clients("logs"))
    read = [(story, window_of(story, clock.now())) for story in stories]
    found = [
        (story, window, [] if window is None else lines_of(window, reader.events(window)))
        for story, window in read
    ]
    if as_json:
        documents = [_document(story, window, lines) for story, window, lines in found]
        one = parse_job_url(url).job_id is not None
        print(json.dumps(documents[0] if one else documents, indent=2), file=out)
        return 0
    for story, window, lines in found:
        for line in render(story, window, lines):
            print(line, file=out)
    return 0


def render(story: Story, window: HandOverWindow | None, lines: list[JobLine]) -> list[str]:
    ref = story.ref
    head = f"job {ref.job_id} of run {ref.run_id} in {ref.repository}"
    if window is None:
        return [f"{head}: no instance ran it yet, so no lines"]
    runner = (
        f"runner {window.runner_id}"
        if window.runner_id is not None
        else "runner not known (GitHub not asked): every line of the instance"
    )
    printed = [
        f"{head} on {window.instance_id}, {runner}, {clock_time(window.start)} to {clock_time(window.end)}"
    ]
    for line in lines:
        fields = line.fields
        message = str(fields.get("message", ""))
        if line.source.value == "runner":
            message = f"{fields.get('file', '')}: {_DIAG_PREFIX.sub('', message)}"
        extra = " ".join(f"{key}={value}" for key, value in fields.items() if key not in IDENTITY)
        level = str(fields.get("level") or "")
        printed.append(
            f"  {clock_time(line.at)}  {line.source.value:<6}  {level:<7} {message}  {extra}".rstrip()
        )
    if not lines:
        printed.append("  no lines in the log group for this hand-over")
    return printed


def _document(story: Story, window: HandOverWindow | None, lines: list[JobLine]) -> dict[str, Any]:
    return {
        "ref": {"repository": story.ref.repository, "run_id": story.ref.run_id, "job_id": story.ref.job_id},
        "instance_id": story.instance_id,
        "runner_id": story.runner_id,
        "start": None if window is None else window.start,
        "end": None if window is None else window.end,
        "lines": [{"at": line.at, "source": line.source.value, **line.fields} for line in lines],
    }
