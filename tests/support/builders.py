"""Builders for records and messages; instance facts are the emulator's, so tests, demo and bench agree."""

from __future__ import annotations

from typing import Any

from emulator.instances import instance_facts
from runner_pool.domain.records import PoolMessage

facts = instance_facts


def pool_message(number: int = 1, threshold: float = 1_800_000_600.0, **overrides: Any) -> PoolMessage:
    fields: dict[str, Any] = facts(number).model_dump()
    fields["threshold"] = threshold
    fields.update(overrides)
    return PoolMessage.model_validate(fields)


def run_key(run_id: int = 1, spec: str = "") -> str:
    return f"pool={run_id}{spec}"
