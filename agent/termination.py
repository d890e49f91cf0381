"""Ending this instance: EC2 TerminateInstances on its own id, and powering off when that is refused.

The launch template sets the instance-initiated shutdown behaviour to terminate, so a poweroff
from inside ends the instance for good even when the EC2 API cannot be reached or refuses.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from agent.aws_errors import AWS_FAILURES, fault_of
from agent.log import EventLog

POWEROFF_COMMAND = ("systemctl", "poweroff")


def power_off() -> None:
    subprocess.run(POWEROFF_COMMAND, check=False)  # noqa: S603 - a fixed command


class SelfTermination:
    def __init__(
        self,
        instance_id: str,
        ec2: Any,
        log: EventLog,
        poweroff: Callable[[], None] = power_off,
    ) -> None:
        self._instance_id = instance_id
        self._ec2 = ec2
        self._log = log
        self._poweroff = poweroff

    def terminate(self, reason: str) -> None:
        self._log.warning("terminating this instance", reason=reason)
        try:
            self._ec2.terminate_instances(InstanceIds=[self._instance_id])
        except AWS_FAILURES as exc:
            # Whatever the fault (EC2 busy through botocore's attempts, the call refused, EC2 not
            # reached), powering off ends the instance just as well.
            self._log.error(
                "TerminateInstances failed; powering off instead", fault=fault_of(exc), error=str(exc)
            )
            try:
                self._poweroff()
            except OSError as failure:
                self._log.error("poweroff failed", error=str(failure))
            return
        self._log.info("TerminateInstances accepted")
