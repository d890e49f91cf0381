"""The events EC2 sends EventBridge about an instance, as the EC2 User Guide's examples shape them.

- "Spot Instance interruption notices" (spot-instance-termination-notices.html): `detail-type` `EC2 Spot
  Instance Interruption Warning`, `detail` {`instance-id`, `instance-action`}, two minutes before EC2 acts;
- "EC2 instance rebalance recommendations" (rebalance-recommendations.html): `EC2 Instance Rebalance
  Recommendation`, `detail` {`instance-id`};
- "State change events for Amazon EC2 instances" (monitoring-instance-state-changes.html): `EC2 Instance
  State-change Notification`, `detail` {`instance-id`, `state`}.

Each carries the instance's ARN in `resources` and the envelope fields every EventBridge event has.
`SpotReclaim` plays EC2 taking a spot instance back: the warning now, to EventBridge and in the instance's
metadata (emulator/imds.py), and at the end of the notice the instance terminated (moto's
TerminateInstances) with the state changes that follow.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from emulator.aws import ACCOUNT, REGION
from emulator.imds import INSTANCE_ACTION_PATH, REBALANCE_PATH, InstanceMetadata
from runner_pool.domain.interruptions import EC2_SOURCE, Notice

NOTICE_SECONDS = 120
"""A Spot Instance interruption notice is "a warning that is issued two minutes before Amazon EC2 stops or
terminates your Spot Instance" (spot-instance-termination-notices.html)."""

Deliver = Callable[[dict[str, Any]], Any]
"""Where an event goes: the rules' target (the interruptions function, invoked as EventBridge invokes it)."""


def utc(at: float) -> str:
    """EC2's way of writing a time in events and metadata: `yyyy-mm-ddThh:mm:ssZ`."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ec2_event(notice: Notice, instance_id: str, at: float, **detail: str) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": notice.value,
        "source": EC2_SOURCE,
        "account": ACCOUNT,
        "time": utc(at),
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
    """EC2 taking spot instances back. `warn` gives the warning (with a rebalance recommendation first, as
    EC2 may), `end` terminates the instance and sends its state changes, and `interrupt` does both, the end
    `notice_seconds` after the warning, on a timer, as EC2 does. `ec2` is the world's EC2 client; `metadata`,
    when given, the instances' metadata service, where each notice is posted as well. `close` cancels the
    ends still to come."""

    def __init__(
        self,
        ec2: Any,
        deliver: Deliver,
        metadata: InstanceMetadata | None = None,
        notice_seconds: float = NOTICE_SECONDS,
    ) -> None:
        self._ec2 = ec2
        self._deliver = deliver
        self._metadata = metadata
        self.notice_seconds = notice_seconds
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()

    def recommend_rebalance(self, instance_id: str, at: float) -> None:
        if self._metadata is not None:
            self._metadata.notify(instance_id, REBALANCE_PATH, {"noticeTime": utc(at)})
        self._deliver(rebalance_recommendation(instance_id, at))

    def warn(
        self,
        instance_id: str,
        at: float,
        *,
        rebalance_first: bool = False,
        notice_seconds: float | None = None,
    ) -> None:
        if rebalance_first:
            self.recommend_rebalance(instance_id, at)
        if self._metadata is not None:
            ends_at = at + (self.notice_seconds if notice_seconds is None else notice_seconds)
            self._metadata.notify(
                instance_id, INSTANCE_ACTION_PATH, {"action": "terminate", "time": utc(ends_at)}
            )
        self._deliver(interruption_warning(instance_id, at))

    def end(self, instance_id: str, at: float) -> None:
        self._ec2.terminate_instances(InstanceIds=[instance_id])
        for state in ("shutting-down", "terminated"):
            self._deliver(state_change(instance_id, at, state))

    def interrupt(
        self, instance_id: str, *, rebalance_first: bool = False, notice_seconds: float | None = None
    ) -> None:
        """The warning now, and the instance terminated at the end of the notice (real time)."""
        seconds = self.notice_seconds if notice_seconds is None else notice_seconds
        self.warn(instance_id, time.time(), rebalance_first=rebalance_first, notice_seconds=seconds)
        timer = threading.Timer(seconds, lambda: self.end(instance_id, time.time()))
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()

    def close(self) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
