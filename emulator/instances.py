"""Simulated instances: plausible facts for an instance of a given shape, and putting one in the pool."""

from __future__ import annotations

from typing import Any

from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.pickup import PoolQueue
from runner_pool.domain.records import Arch, InstanceFacts, PoolMessage, UsageClass


def instance_facts(number: int = 1, **shape: Any) -> InstanceFacts:
    """Instance number `number`: a spot c7i.large (class large) unless `shape` says otherwise."""
    fields: dict[str, Any] = {
        "instance_id": f"i-{number:017x}",
        "resource_class": "large",
        "instance_type": "c7i.large",
        "usage_class": UsageClass.SPOT,
        "arch": Arch.X64,
        "cpu": 2,
        "memory_mib": 4096,
        **shape,
    }
    return InstanceFacts.model_validate(fields)


def put_in_pool(table: StateTable, queues: PoolQueue, facts: InstanceFacts) -> PoolMessage:
    """What a warm-pool launch ends in: recorded, admitted to idle, and offered in its class's queue."""
    table.create(facts, run_key=None)
    admitted = table.admit(facts.instance_id).record
    if admitted is None:
        raise RuntimeError(f"{facts.instance_id} could not be admitted to the pool")
    message = PoolMessage.for_idle(admitted)
    queues.offer(message)
    return message
