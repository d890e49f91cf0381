"""The provision state machine's world: the local control plane (emulator/harness/control_plane.py) with
the real provision ASL deployed in moto, and scripted agents on the instances.

Time is a ManualClock that moves only where the machine waits (its Wait states, and a step's in-line
pauses), by as much as each waits, and after each move the scripted agents act: the polling loops
see the world change as they would on AWS, with no test ever sleeping.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from emulator.accounting import Accounting
from emulator.background import in_background
from emulator.harness.control_plane import (
    STACK_NAME,
    LocalControlPlane,
    LocalStateMachine,
    local_control_plane,
    pool_queue_urls,
)
from emulator.harness.github_app import OWNER, REPO
from emulator.harness.scripted_agents import ScriptedAgents
from emulator.instances import instance_facts, put_in_pool
from emulator.step_functions import Execution, Invocations, lambdas_in_process, without_waiting
from runner_pool.domain.clock import ManualClock, SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.records import Arch, InstanceFacts, PoolMessage
from runner_pool.domain.trust import TrustLevel

REPOSITORY = f"{OWNER}/{REPO}"


@dataclass
class ProvisionWorld:
    local: LocalControlPlane
    agents: ScriptedAgents
    machine: LocalStateMachine
    invocations: Invocations

    @property
    def plane(self) -> Any:
        return self.local.plane

    @property
    def clock(self) -> Any:
        return self.local.clock

    @property
    def ec2(self) -> Any:
        return self.local.ec2

    @property
    def github(self) -> Any:
        return self.local.github

    def warm(self, number: int, **shape: Any) -> PoolMessage:
        """A vetted idle instance in the pool: launched in EC2, recorded, admitted, offered, beating."""
        facts = self.launch(number, **shape)
        message = put_in_pool(self.plane.state_table, self.plane.pool_queues, facts)
        self.plane.state_table.write_heartbeat(facts.instance_id)
        return message

    def launch(self, number: int, **shape: Any) -> InstanceFacts:
        """A real (moto) EC2 instance with the stack's tag, and facts that name it."""
        template = self.plane.settings.launch_templates[Arch.X64]
        reservation = self.ec2.run_instances(
            LaunchTemplate={"LaunchTemplateId": template},
            MinCount=1,
            MaxCount=1,
            InstanceType=shape.get("instance_type", "c7i.large"),
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": "runner-pool:stack", "Value": STACK_NAME}]}
            ],
        )
        instance_id = reservation["Instances"][0]["InstanceId"]
        return instance_facts(number, instance_id=instance_id, **shape)

    def provision(self, run_key: str, count: int, name: str | None = None) -> Execution:
        request = trusted_provision(run_key, count)
        return self.machine.machines.run(
            self.machine.arn, request.model_dump(mode="json"), name or request.execution_name, 60
        )

    def provision_concurrently(
        self, demands: list[tuple[str, int]], timeout_seconds: float = 60
    ) -> list[Execution]:
        """Start one execution per (run key, count) at once, then wait for all of them."""
        started = []
        for run_key, count in demands:
            request = trusted_provision(run_key, count)
            payload = request.model_dump(mode="json")
            started.append(self.machine.machines.start(self.machine.arn, payload, request.execution_name))
        return [self.machine.machines.wait(arn, timeout_seconds=timeout_seconds) for arn in started]

    def accounting(self) -> Accounting:
        return self.local.accounting()

    def pool_messages(self, resource_class: str = "large") -> list[PoolMessage]:
        """What the class's pool queues hold (at most ten of each, received and made visible again at once)."""
        messages: list[PoolMessage] = []
        for url in pool_queue_urls(self.plane.settings, resource_class):
            bodies = self.local.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
            messages += [PoolMessage.from_body(m["Body"]) for m in bodies.get("Messages", [])]
        return messages


def trusted_provision(run_key: str, count: int) -> ProvisionRequest:
    """A provision of `count` runners for a trusted run of the world's repository."""
    return ProvisionRequest(trust=TrustLevel.TRUSTED, repository=REPOSITORY, run_key=run_key, count=count)


@contextmanager
def provision_world(
    config: StackConfig | None = None, *, real_time: bool = False, with_release: bool = False
) -> Iterator[ProvisionWorld]:
    """The world on a ManualClock moved where the machine waits; or (`real_time`, for benchmarks) on
    the system clock with real waits, the scripted agents acting every few milliseconds meanwhile.
    `with_release`: the release machine is deployed too (a provision that finds its run finished
    starts one)."""
    clock: Any = SystemClock() if real_time else ManualClock()
    acting: list[ScriptedAgents] = []

    def time_passes(seconds: float) -> None:
        clock.advance(seconds)
        for agents in acting:
            agents.act()

    pause = time.sleep if real_time else time_passes
    with local_control_plane(config, clock, pause=pause) as local, ExitStack() as stack:
        plane = local.plane
        beat_every = plane.config.timeouts.heartbeat_period_seconds if real_time else 0.0
        agents = ScriptedAgents(plane.state_table, plane.credentials, plane.instance_arn, clock, beat_every)
        acting.append(agents)
        machine = local.deploy("provision")
        routed = dict(machine.routed)
        if with_release:
            routed |= local.deploy("release").routed
        if real_time:
            stack.enter_context(agents_acting(agents))
        else:
            stack.enter_context(without_waiting(on_wait=time_passes))
        invocations = stack.enter_context(lambdas_in_process(routed))
        yield ProvisionWorld(local, agents, machine, invocations)


@contextmanager
def agents_acting(agents: ScriptedAgents, every_seconds: float = 0.02) -> Iterator[None]:
    def act(stop: threading.Event) -> None:
        while not stop.wait(every_seconds):
            agents.act()

    with in_background(act, name="scripted-agents"):
        yield


def output(execution: Execution) -> dict[str, Any]:
    if execution.status != "SUCCEEDED":
        raise AssertionError(
            f"execution {execution.status}: {json.dumps(execution.events[-3:], default=str)}"
        )
    return dict(execution.output)
