"""Builders for records and messages: one place that knows what a plausible instance looks like."""

from __future__ import annotations

from typing import Any

from runner_pool.domain.records import Arch, InstanceFacts, PoolMessage, UsageClass


def facts(number: int = 1, **overrides: Any) -> InstanceFacts:
    fields: dict[str, Any] = {
        "instance_id": f"i-{number:017x}",
        "resource_class": "large",
        "instance_type": "c7i.large",
        "usage_class": UsageClass.SPOT,
        "arch": Arch.X64,
        "cpu": 2,
        "memory_mib": 4096,
    }
    fields.update(overrides)
    return InstanceFacts.model_validate(fields)


def pool_message(number: int = 1, threshold: float = 1_800_000_600.0, **overrides: Any) -> PoolMessage:
    fields: dict[str, Any] = facts(number).model_dump()
    fields["threshold"] = threshold
    fields.update(overrides)
    return PoolMessage.model_validate(fields)


def run_key(run_id: int = 1, spec: str = "") -> str:
    return f"pool={run_id}{spec}"
