"""Ending this instance: EC2 TerminateInstances on its own id, and powering off when that is refused.

The launch template sets the instance-initiated shutdown behaviour to terminate, so a poweroff
from inside ends the instance for good even when the EC2 API cannot be reached or refuses.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from agent.log import EventLog
from runner_pool.adapters.backoff import Backoff, ServiceBusyError

POWEROFF_COMMAND = ("systemctl", "poweroff")


def power_off() -> None:
    subprocess.run(POWEROFF_COMMAND, check=False)  # noqa: S603 - a fixed command


class SelfTermination:
    def __init__(
        self,
        instance_id: str,
        ec2: Any,
        log: EventLog,
        backoff: Backoff | None = None,
        poweroff: Callable[[], None] = power_off,
    ) -> None:
        self._instance_id = instance_id
        self._ec2 = ec2
        self._log = log
        self._backoff = backoff or Backoff()
        self._poweroff = poweroff

    def terminate(self, reason: str) -> None:
        self._log.warning("terminating this instance", reason=reason)
        try:
            self._backoff.call(lambda: self._ec2.terminate_instances(InstanceIds=[self._instance_id]))
        except (ClientError, BotoCoreError, ServiceBusyError) as exc:
            self._log.error("TerminateInstances failed; powering off instead", error=str(exc))
            try:
                self._poweroff()
            except OSError as failure:
                self._log.error("poweroff failed", error=str(failure))
            return
        self._log.info("TerminateInstances accepted")
