"""The accounting check every scenario ends with: EC2's instances of the stack and the state table agree.

Two sides of one invariant (DESIGN.md: no instance is ever lost or leaked):

- every EC2 instance carrying the stack tag that is not terminated or shutting down has a live
  record (an instance without one is an orphan: paid for, and invisible to the pool);
- every live record has an EC2 instance in a state its own state allows: pending or running, but for
  the stopped tier's (a stopped record's instance is stopped; a stopping one's is anywhere between
  running and stopped, EC2's stop taking its while). A record without one is lost: the pool would hand
  out, or wait for, an instance that is not there, and a stopped instance that no stopped record names
  is one no request would ever start.

Records come from `StateTable.live()` (the threshold index) and instances from DescribeInstances
with the tag filter and, for records EC2 did not list under the tag, an instance-id filter, so
nothing is scanned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Epoch
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.environment import STACK_TAG_KEY

NOT_ENDED_STATES = ("pending", "running", "stopping", "stopped")
"""EC2 states of an instance that still exists (terminated and shutting-down ones are on their way out)."""
SERVING_STATES = frozenset({"pending", "running"})
"""EC2 states a live record's instance may be in, but for the stopped tier's."""
TIER_STATES = {
    InstanceState.STOPPING: frozenset({"running", "stopping", "stopped"}),
    InstanceState.STOPPED: frozenset({"stopped"}),
}
"""EC2 states a stopping or stopped record's instance may be in (EC2 User Guide, "Stop and start Amazon
EC2 instances": running → stopping → stopped)."""
FILTER_BATCH = 100
"""Instance ids per `instance-id` filter (EC2 caps the values of one filter)."""


@dataclass(frozen=True)
class Accounting:
    """The check's verdict: `problems` (one readable line each; none when it holds) and the tally."""

    problems: tuple[str, ...]
    by_state: Mapping[InstanceState, int]
    instances: int
    """EC2 instances of the stack that are not terminated or shutting down."""

    @property
    def holds(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        tally = (
            ", ".join(f"{state.value} {count}" for state, count in sorted(self.by_state.items())) or "none"
        )
        verdict = "holds" if self.holds else f"fails ({len(self.problems)} problems)"
        return f"accounting {verdict}: {self.instances} EC2 instances, live records: {tally}"


def account(
    ec2_client: Any, state_table: StateTable, stack_name: str, now: Epoch | None = None
) -> Accounting:
    """Checks the invariant for the stack whose instances carry `STACK_TAG_KEY` = `stack_name`.

    With `now`, an expired record (threshold passed) whose instance is already terminated or
    shutting down is in order: it awaits refresh, which marks it terminated (DESIGN.md section 4).
    """
    records = {record.instance_id: record for record in state_table.live()}
    tagged = {
        instance["InstanceId"]: instance
        for instance in _instances(
            ec2_client,
            [
                {"Name": f"tag:{STACK_TAG_KEY}", "Values": [stack_name]},
                {"Name": "instance-state-name", "Values": list(NOT_ENDED_STATES)},
            ],
        )
    }
    untagged = sorted(records.keys() - tagged.keys())
    others = {
        instance["InstanceId"]: instance
        for chunk in _chunks(untagged, FILTER_BATCH)
        for instance in _instances(ec2_client, [{"Name": "instance-id", "Values": chunk}])
    }
    problems = [
        f"orphan: EC2 instance {instance_id} ({_describe(instance)}) carries {STACK_TAG_KEY}={stack_name} "
        "but has no live record"
        for instance_id, instance in sorted(tagged.items())
        if instance_id not in records
    ]
    problems.extend(
        problem
        for instance_id, record in sorted(records.items())
        if (
            problem := _record_problem(
                record, tagged.get(instance_id) or others.get(instance_id), stack_name, now
            )
        )
    )
    return Accounting(
        problems=tuple(problems),
        by_state=dict(Counter(record.state for record in records.values())),
        instances=len(tagged),
    )


def _record_problem(
    record: InstanceRecord, instance: Mapping[str, Any] | None, stack_name: str, now: Epoch | None
) -> str:
    held = f" for {record.run_key!r}" if record.run_key else ""
    where = f"record of {record.instance_id} ({record.state.value}{held})"
    state = "unknown to EC2" if instance is None else instance["State"]["Name"]
    allowed = TIER_STATES.get(record.state, SERVING_STATES)
    if now is not None and record.threshold_passed(now) and state not in allowed | SERVING_STATES:
        return ""  # expired and terminated: refresh's mark_terminated is all that is left
    if instance is None:
        return f"lost: {where} has no EC2 instance"
    if state not in allowed:
        return f"lost: {where} has an EC2 instance that is {state}"
    tags = {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}
    if tags.get(STACK_TAG_KEY) != stack_name:
        return f"untagged: {where} has an EC2 instance without {STACK_TAG_KEY}={stack_name}"
    return ""


def _describe(instance: Mapping[str, Any]) -> str:
    return f"{instance['State']['Name']}, {instance.get('InstanceType', 'unknown type')}"


def _instances(ec2_client: Any, filters: list[dict[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for page in ec2_client.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            yield from reservation.get("Instances", [])


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
