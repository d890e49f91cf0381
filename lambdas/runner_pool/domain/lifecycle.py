"""The instance lifecycle of DESIGN.md section 4: states, and what a transition attempt can come to."""

from __future__ import annotations

from enum import StrEnum


class InstanceState(StrEnum):
    CREATED = "created"
    CLAIMED = "claimed"
    RUNNING = "running"
    IDLE = "idle"
    STOPPING = "stopping"
    """Chosen for the stopped tier: EC2 StopInstances asked, not yet seen stopped."""
    STOPPED = "stopped"
    """EC2 reports it stopped: it pays for its EBS volumes only, and waits to be started for a run."""
    TERMINATED = "terminated"


LIVE_STATES = frozenset(
    {
        InstanceState.CREATED,
        InstanceState.CLAIMED,
        InstanceState.RUNNING,
        InstanceState.IDLE,
        InstanceState.STOPPING,
        InstanceState.STOPPED,
    }
)
"""States of an instance that exists (or is about to) in EC2; everything but terminated."""

UNHELD_STATES = frozenset({InstanceState.IDLE, InstanceState.STOPPING, InstanceState.STOPPED})
"""States in which a record must carry no run key: the instance waits for a run, hot or stopped."""

HELD_STATES = frozenset({InstanceState.CLAIMED, InstanceState.RUNNING})
"""States in which a record must carry a run key."""


class Outcome(StrEnum):
    """What became of one conditional write.

    APPLIED: this call changed the record.
    REPLAYED: the record already is what this call would have made it (a retried Lambda or step);
        callers treat it exactly like APPLIED.
    LOST: another writer got there first, or the condition no longer holds; a normal outcome.
    """

    APPLIED = "applied"
    REPLAYED = "replayed"
    LOST = "lost"

    @property
    def succeeded(self) -> bool:
        return self is not Outcome.LOST
