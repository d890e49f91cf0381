"""The events EC2 sends EventBridge about an instance, as the EC2 User Guide's examples shape them.

- "Spot Instance interruption notices" (spot-instance-termination-notices.html): `detail-type` `EC2 Spot
  Instance Interruption Warning`, `detail` {`instance-id`, `instance-action`}, two minutes before EC2 acts;
- "EC2 instance rebalance recommendations" (rebalance-recommendations.html): `EC2 Instance Rebalance
  Recommendation`, `detail` {`instance-id`};
- "State change events for Amazon EC2 instances" (monitoring-instance-state-changes.html): `EC2 Instance
  State-change Notification`, `detail` {`instance-id`, `state`}.

Each carries the instance's ARN in `resources` and the envelope fields every EventBridge event has.
`SpotReclaim` plays EC2 taking a spot instance back: the warning now, and at the end of the notice the
instance terminated (moto's TerminateInstances) with the state changes that follow.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from emulator.aws import ACCOUNT, REGION
from runner_pool.domain.interruptions import EC2_SOURCE, Notice

NOTICE_SECONDS = 120
"""A Spot Instance interruption notice is "a warning that is issued two minutes before Amazon EC2 stops or
terminates your Spot Instance" (spot-instance-termination-notices.html)."""

Deliver = Callable[[dict[str, Any]], Any]
"""Where an event goes: the rules' target (the interruptions function, invoked as EventBridge invokes it)."""


def ec2_event(notice: Notice, instance_id: str, at: float, **detail: str) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": notice.value,
        "source": EC2_SOURCE,
        "account": ACCOUNT,
        "time": datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, **detail},
    }


def interruption_warning(instance_id: str, at: float, action: str = "terminate") -> dict[str, Any]:
    return ec2_event(Notice.INTERRUPTION, instance_id, at, **{"instance-action": action})


def rebalance_recommendation(instance_id: str, at: float) -> dict[str, Any]:
    return ec2_event(Notice.REBALANCE, instance_id, at)


def state_change(instance_id: str, at: float, state: str) -> dict[str, Any]:
    return ec2_event(Notice.STATE_CHANGE, instance_id, at, state=state)


class SpotReclaim:
    """EC2 taking spot instances back: `warn` sends the warning (with a rebalance recommendation first, as
    EC2 may), `end` terminates the instance and sends its state changes. `ec2` is the world's EC2 client."""

    def __init__(self, ec2: Any, deliver: Deliver) -> None:
        self._ec2 = ec2
        self._deliver = deliver

    def warn(self, instance_id: str, at: float, *, rebalance_first: bool = False) -> None:
        if rebalance_first:
            self._deliver(rebalance_recommendation(instance_id, at))
        self._deliver(interruption_warning(instance_id, at))

    def end(self, instance_id: str, at: float) -> None:
        self._ec2.terminate_instances(InstanceIds=[instance_id])
        for state in ("shutting-down", "terminated"):
            self._deliver(state_change(instance_id, at, state))
