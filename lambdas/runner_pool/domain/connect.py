"""`runner-pool connect`: which instance a job URL, a run URL or an instance id names, and whether an operator
may open a Session Manager session on it (runner_pool/connect_command.py does the reading and the starting).

A session is refused, with the reason, when the instance is gone or stopped, or when its class does not let
Session Manager in (`resource_classes.<class>.ssm`, off by default: its instances' role gives the SSM agent
nothing, so a session could not start anyway, and saying why beats Systems Manager's TargetNotConnected).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from runner_pool.domain.config import StackConfig
from runner_pool.domain.job_story import JobRef, Story
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord

INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
NOT_RUNNING = {
    InstanceState.STOPPING: "is being stopped for the stopped tier",
    InstanceState.STOPPED: "is stopped (the stopped tier): it runs again only when a job claims it",
    InstanceState.TERMINATED: "is gone: terminated",
}


class ConnectRefusedError(LookupError):
    """No session for what the operator named; the message says why, and what to name instead."""


def is_instance_id(target: str) -> bool:
    return INSTANCE_ID.fullmatch(target.strip()) is not None


def served_by(ref: JobRef, stories: Sequence[Story]) -> str:
    """The instance the job of `ref` ran on, or the one instance every job of its run ran on; refused when
    none is known or, for a run, when its jobs ran on several (each is listed, to be named by its id)."""
    named = [(story.ref.job_id, story.instance_id) for story in stories if story.instance_id is not None]
    instances = sorted({instance for _, instance in named})
    if len(instances) == 1:
        return instances[0]
    if not instances:
        what = f"job {ref.job_id}" if ref.job_id is not None else f"no job of run {ref.run_id}"
        waiting = next((story.waiting for story in stories if story.waiting), None)
        why = f": {waiting}" if waiting else " (no runner of the job is named by GitHub or by a release)"
        return _refuse(f"{what} ran on no instance the stack knows{why}")
    listed = "\n".join(f"  job {job_id}: {instance}" for job_id, instance in named)
    return _refuse(
        f"the jobs of run {ref.run_id} ran on {len(instances)} instances; name one:\n{listed}\n"
        "  (runner-pool connect <instance id>, or the job's URL)"
    )


def refusal(instance_id: str, record: InstanceRecord | None, config: StackConfig | None) -> str | None:
    """Why no session may be opened on the instance; None when one may."""
    if record is None:
        return f"{instance_id} is gone: the stack has no record of it (terminated, or past its record's TTL)"
    state = NOT_RUNNING.get(record.state)
    if state is not None:
        return f"{instance_id} {state}"
    name = record.resource_class
    if config is None:
        return f"whether class {name} lets Session Manager in is not known: the stack config is not readable"
    resource_class = config.resource_classes.get(name)
    if resource_class is None:
        return f"class {name} of {instance_id} is no longer defined in the stack config"
    if not resource_class.ssm:
        return (
            f"class {name} has SSM off: its instances' role lets no Session Manager session in (set "
            f"resource_classes.{name}.ssm to true and deploy; instances launched since then can be reached)"
        )
    return None


def session_command(instance_id: str, region: str) -> list[str]:
    """The AWS CLI's Session Manager session (it needs the session-manager-plugin)."""
    return ["aws", "ssm", "start-session", "--target", instance_id, "--region", region]


def _refuse(reason: str) -> str:
    raise ConnectRefusedError(reason)
