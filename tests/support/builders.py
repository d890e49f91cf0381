"""Builders for records and messages; instance facts are the emulator's, so tests, demo and bench agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from emulator.harness.webhooks import REPOSITORY
from emulator.instances import instance_facts
from runner_pool.domain.clock import Clock, ManualClock
from runner_pool.domain.demand import DemandLedger, ExecutionStarter, InstanceRelease
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.records import PoolMessage
from runner_pool.domain.trust import TrustLevel
from runner_pool.steps.demand_starts import DemandStarts
from runner_pool.steps.run_trust import RunTrust

facts = instance_facts


def pool_message(number: int = 1, threshold: float = 1_800_000_600.0, **overrides: Any) -> PoolMessage:
    """An offer as release or refresh sends it: one that names no repository never served a job
    (pristine); one that does last served a trusted job, unless `overrides` say otherwise."""
    fields: dict[str, Any] = facts(number).model_dump()
    fields["threshold"] = threshold
    served = overrides.get("repository") is not None
    fields |= {"pristine": not served, "trust": TrustLevel.TRUSTED if served else None}
    fields.update(overrides)
    return PoolMessage.model_validate(fields)


def run_key(run_id: int = 1, spec: str = "") -> str:
    return f"pool={run_id}{spec}"


def release_of_runner_5(run_key: str, cause: str, **flags: Any) -> InstanceRelease:
    """What the webhook asks of the release for a job on runner 5, the one the webhook tests' payloads
    name (registered for instance i-0123456789abcdef0 at the fixtures' repository); `flags` are the
    request's own (quarantine, suspect, privileged, failed)."""
    return InstanceRelease(
        request=ReleaseRequest(
            run_key=run_key,
            instance_id="i-0123456789abcdef0",
            runner_id=5,
            cause=cause,
            repository=REPOSITORY,
            **flags,
        )
    )


def pause_on(clock: ManualClock) -> Callable[[float], None]:
    """A step's in-line pause that moves `clock` on by as much as it waits, instead of sleeping."""

    def pause(seconds: float) -> None:
        clock.advance(seconds)

    return pause


def demand_starts(
    ledger: DemandLedger, starter: ExecutionStarter, clock: Clock, pause: Callable[[float], None]
) -> DemandStarts:
    """What the dispatcher and the follow-up's steps start demand with, with runs' levels from their
    `requested` deliveries only, by the built-in table (GitHub is never asked)."""
    return DemandStarts(ledger, starter, clock, pause, RunTrust(ledger, clock))
