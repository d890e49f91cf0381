"""What EC2's word about one of our instances means for its record: leave the pool, or mark a job interrupted.

EC2 tells EventBridge three things about an instance, each an event whose `detail` names the instance:

- `EC2 Spot Instance Interruption Warning`: EC2 stops, hibernates or terminates the spot instance two
  minutes from now; `detail.instance-id` and `detail.instance-action` (`hibernate`, `stop` or `terminate`)
  (EC2 User Guide, "Spot Instance interruption notices",
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
- `EC2 Instance Rebalance Recommendation`: the spot instance is at elevated risk of interruption, a signal
  that can come sooner than the warning or with it; `detail.instance-id` (EC2 User Guide, "EC2 instance
  rebalance recommendations", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html).
- `EC2 Instance State-change Notification`: the instance entered `detail.state` (`pending`, `running`,
  `stopping`, `stopped`, `shutting-down` or `terminated`); `detail.instance-id` (EC2 User Guide, "State
  change events for Amazon EC2 instances",
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html).

What each means is `RESPONSES`, one row per (notice, state of the record). An instance that waits for a
run (idle, on its way to the stopped tier, stopped, or launched for the pool) leaves the pool at once: its
record is expired, so its pool message is stale, pickup drops it, and refresh terminates the instance and
launches a replacement when the warm minimum asks for one. One a provision holds (claimed, or created for
its run) is expired while the provision still holds it: its claim worker's next check finds it failed,
discards it and serves the slot with the next candidate, as for any candidate that fails a check. Warned of
an interruption, it is marked interrupted first: GitHub may have given a job to its runner already. One that
runs a job is marked interrupted and left to run: the job may finish within the notice, and its release
then retires the instance. A rebalance recommendation is only a risk: it never stops a job, it keeps an
instance from being handed one.

EventBridge cannot match an EC2 event by the instance's tags (the events carry none), so the rules hear every
instance of the account and region; an instance with no record of ours is none of ours, and is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import INSTANCE_ID_PATTERN, InstanceRecord


class Notice(StrEnum):
    """What EC2 said, by the event's `detail-type`."""

    INTERRUPTION = "EC2 Spot Instance Interruption Warning"
    REBALANCE = "EC2 Instance Rebalance Recommendation"
    STATE_CHANGE = "EC2 Instance State-change Notification"


EC2_SOURCE = "aws.ec2"
"""The `source` of every event EC2 sends (the three example events of the pages cited above)."""
GONE = frozenset({"shutting-down", "terminated"})
"""EC2 states of an instance on its way out, whoever asked (a spot interruption, an operator, EC2 itself)."""
STOPPING = frozenset({"stopping", "stopped"})
"""EC2 states of an instance being stopped or stopped: ours only when its record says the stopped tier."""


class _Detail(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID_PATTERN)
    instance_action: str | None = Field(None, alias="instance-action")
    """The interruption warning's `hibernate`, `stop` or `terminate`: all three end the instance's job."""
    state: str | None = None
    """The state-change notification's new EC2 state."""


class Ec2Event(BaseModel):
    """One EventBridge event EC2 sent about an instance, as the rules of infra/constructs/interruptions.py
    deliver it; only the fields read here (the envelope's `detail-type` and `detail`)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    notice: Notice = Field(alias="detail-type")
    detail: _Detail

    @property
    def instance_id(self) -> str:
        return self.detail.instance_id


class Response(StrEnum):
    EXPIRE = "expire"
    """The record is expired while it holds what it held: refresh terminates (and replaces) the instance;
    a provision that holds it discards it."""
    MARK_INTERRUPTED = "mark-interrupted"
    """The job goes on; the record says EC2 is interrupting it."""
    DISCARD = "discard"
    """Marked interrupted (its runner may have been given a job already), then expired while the provision
    still holds it."""
    NOTHING = "nothing"


@dataclass(frozen=True)
class Row:
    response: Response
    why: str


_WAITING = (InstanceState.IDLE, InstanceState.STOPPING, InstanceState.STOPPED)
_HELD = (InstanceState.CLAIMED, InstanceState.CREATED)
_LEAVES = "it waits for a run, and EC2 may take it any moment: it leaves the pool"
_DISCARDED = "a provision holds it, and EC2 may take it any moment: the provision serves the slot elsewhere"

RESPONSES: dict[tuple[Notice, InstanceState], Row] = {
    **{(Notice.INTERRUPTION, s): Row(Response.EXPIRE, _LEAVES) for s in _WAITING},
    **{(Notice.REBALANCE, s): Row(Response.EXPIRE, _LEAVES) for s in _WAITING},
    **{(Notice.INTERRUPTION, s): Row(Response.DISCARD, _DISCARDED) for s in _HELD},
    **{(Notice.REBALANCE, s): Row(Response.EXPIRE, _DISCARDED) for s in _HELD},
    (Notice.INTERRUPTION, InstanceState.RUNNING): Row(
        Response.MARK_INTERRUPTED, "it runs a job, which EC2 ends within two minutes unless it ends first"
    ),
    (Notice.REBALANCE, InstanceState.RUNNING): Row(
        Response.NOTHING, "it runs a job: a rebalance recommendation is a risk, not an interruption"
    ),
}
"""What a warning means for a live record, by its state; a terminated record, or none, needs nothing. A
created record without a run key (launched for the pool) counts as waiting: `respond` says so."""


def respond(event: Ec2Event, record: InstanceRecord | None) -> Row:
    """What to do with `record` (None: no record of ours) on hearing `event`."""
    if record is None:
        return Row(Response.NOTHING, "no record: not an instance of this stack")
    if record.state is InstanceState.TERMINATED:
        return Row(Response.NOTHING, "its record is terminated already")
    if event.notice is Notice.STATE_CHANGE:
        return _state_change(event.detail.state, record)
    if record.state is InstanceState.CREATED and record.run_key is None:
        return Row(Response.EXPIRE, _LEAVES)
    return RESPONSES[(event.notice, record.state)]


def _state_change(state: str | None, record: InstanceRecord) -> Row:
    if state in GONE:
        return Row(Response.EXPIRE, f"EC2 says it is {state}: refresh marks its record terminated now")
    if state in STOPPING and record.state not in (InstanceState.STOPPING, InstanceState.STOPPED):
        return Row(Response.EXPIRE, f"EC2 says it is {state}, which no step of ours asked for")
    return Row(Response.NOTHING, f"EC2 says it is {state}, as its record expects")
