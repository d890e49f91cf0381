"""What the steps ask of the state table and of EC2: one port a step, naming only the calls it makes.

The adapters (`adapters/state_table.py`'s StateTable, `adapters/fleet.py`'s Fleet) satisfy these
structurally and `wiring.py` builds them; a step sees only its port, so a test can hand it a fake of a
few methods, and what a step may do to the table is read from its port. Each write returns the
TransitionResult of one conditional write (domain/lifecycle.py's Outcome, and the record after it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runner_pool.domain.capacity_waits import CapacityWait, CheckRun, Conclusion, Shortfall
from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import FleetSettings
from runner_pool.domain.cost import HandOverCost, InstanceLife
from runner_pool.domain.fleet import Ec2State, LaunchOutcome, LaunchRequest, Start, Termination
from runner_pool.domain.pickup import PLAIN_CLAIM, ClaimTerms
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import (
    InstanceFacts,
    InstanceRecord,
    InstanceView,
    TransitionResult,
    WorkerSignal,
)
from runner_pool.domain.runners import RunJob
from runner_pool.domain.spot_breaker import Noted
from runner_pool.domain.trust import TrustLevel


class RecordReads(Protocol):
    def get(self, instance_id: str) -> InstanceRecord | None: ...


class RecordExpiry(Protocol):
    def expire(self, instance_id: str, run_key: str | object | None = ...) -> TransitionResult:
        """any live → expired, for refresh to terminate; with `run_key` (a str, or None for an unheld
        instance), only while the record holds exactly that run key."""
        ...


class Terminations(Protocol):
    def terminate(self, instance_ids: Sequence[str]) -> dict[str, Termination]: ...


class InterruptionRecords(RecordReads, RecordExpiry, Protocol):
    """Hearing EC2's notices (steps/interruptions.py)."""

    def mark_interrupted(self, instance_id: str, run_key: str) -> TransitionResult: ...


class SpotBreakerNotes(Protocol):
    """Counting a spot interruption for its class's circuit breaker (steps/interruptions.py)."""

    def note(self, resource_class: str, instance_id: str) -> Noted: ...


class InstantTierRecords(RecordExpiry, Protocol):
    """Keeping a class's instant tier at its size (steps/instant_tier.py)."""

    def held_by(self, run_key: str) -> list[InstanceRecord]: ...


class HeldRecords(RecordExpiry, Protocol):
    """Letting go of the instances a provision holds (steps/held_instances.py)."""


class ReleaseRecords(RecordReads, RecordExpiry, Protocol):
    """The release machine's steps (steps/release.py)."""

    def held_by(self, run_key: str) -> list[InstanceRecord]: ...

    def observe(self, instance_id: str) -> InstanceView: ...

    def read_signal(self, instance_id: str) -> WorkerSignal | None: ...

    def mark_run_finished(self, run_key: str) -> None: ...

    def job_started(
        self, instance_id: str, run_key: str, runner_id: int, repository: str, max_runtime_minutes: int
    ) -> TransitionResult: ...

    def quarantine(self, instance_id: str, runner_id: int) -> TransitionResult: ...

    def release_served(self, instance_id: str, run_key: str, runner_id: int) -> TransitionResult: ...

    def release(self, instance_id: str, run_key: str, runner_id: int | None = None) -> TransitionResult: ...


class ClaimRecords(RecordReads, Protocol):
    """The provision's claim workers (steps/claim_workers.py)."""

    def held_by(self, run_key: str) -> list[InstanceRecord]: ...

    def observe(self, instance_id: str) -> InstanceView: ...

    def stopped(self, partition: PoolPartition, now: Epoch | None = None) -> list[InstanceRecord]: ...

    def claim(
        self,
        instance_id: str,
        run_key: str,
        claim_token: str,
        terms: ClaimTerms = PLAIN_CLAIM,
    ) -> TransitionResult: ...


class ClaimStarts(Protocol):
    """EC2 as the claim workers reach it: starting a stopped instance claimed for a run."""

    def start(self, instance_id: str) -> Start: ...

    def states(self, instance_ids: Sequence[str]) -> dict[str, Ec2State]: ...


class CreationRecords(Protocol):
    """The provision's Create and CheckFleet (steps/creation.py)."""

    def create(
        self,
        facts: InstanceFacts,
        run_key: str | None,
        *,
        repository: str | None = None,
        repository_id: int | None = None,
        single_use: bool = False,
        for_stopped_tier: bool = False,
        trust: TrustLevel | None = None,
    ) -> TransitionResult: ...

    def observe_many(self, instance_ids: Sequence[str]) -> dict[str, InstanceView]: ...


class Launches(Protocol):
    """EC2 as Create reaches it."""

    def launch_with_fallback(self, request: LaunchRequest, settings: FleetSettings) -> LaunchOutcome: ...


class HandOverRecords(RecordReads, RecordExpiry, Protocol):
    """Handing a held instance its runner, or giving back its claim (steps/hand_over.py)."""

    def record_runner(self, instance_id: str, run_key: str, runner_id: int) -> TransitionResult: ...

    def unclaim(self, instance_id: str, run_key: str, claim_token: str) -> TransitionResult: ...


class ProvisionRecords(ClaimRecords, CreationRecords, HeldRecords, HandOverRecords, Protocol):
    """The provision machine's steps together (steps/provision.py and its parts): Begin's claims, Finish's
    activations and Dump's look at what the run holds."""

    def run_finished(self, run_key: str) -> bool: ...

    def activate(
        self, instance_id: str, run_key: str, max_runtime_minutes: int, claim_token: str | None = None
    ) -> TransitionResult: ...


class ProvisionFleet(ClaimStarts, Launches, Terminations, Protocol):
    """EC2 as the provision's steps reach it; Dump finds what an execution launched by its launch tag."""

    def tagged_instances(
        self, tag_key: str, tag_value: str, launched_before: Epoch | None = None
    ) -> list[str]: ...


class ReconcileRecords(RecordReads, RecordExpiry, Protocol):
    """Refresh's reconcile against GitHub (steps/reconcile.py): its markers, and the runs' records."""

    def live(self) -> list[InstanceRecord]: ...

    def held_by(self, run_key: str) -> list[InstanceRecord]: ...

    def read_signal(self, instance_id: str) -> WorkerSignal | None: ...

    def run_finished(self, run_key: str) -> bool: ...

    def read_marker(self, name: str) -> float | None: ...

    def move_marker(self, name: str, value: float, *, expected: float | None) -> bool: ...


class CapacityWaitRecords(Protocol):
    """Jobs waiting for capacity, as provision's Finish and refresh keep them (steps/capacity_waits.py)."""

    def note(self, shortfall: Shortfall) -> CapacityWait: ...

    def get(self, repository: str, run_key: str) -> CapacityWait | None: ...

    def end(self, repository: str, run_key: str) -> CapacityWait | None: ...

    def mark_check_run(self, repository: str, run_key: str, check_run: CheckRun) -> None: ...


class CheckRuns(Protocol):
    """The check run that tells a waiting job's author why, on the head commit its jobs name
    (steps/capacity_waits.py)."""

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]: ...

    def create_check_run(
        self, repository: str, *, head_sha: str, name: str, title: str, summary: str
    ) -> CheckRun: ...

    def complete_check_run(
        self, repository: str, check_run: CheckRun, *, conclusion: Conclusion, title: str, summary: str
    ) -> None: ...


class CostLedger(Protocol):
    """The cost items (adapters/cost_ledger.py): written once each, read a UTC day at a time."""

    def hand_over_ended(self, cost: HandOverCost) -> bool: ...

    def instance_ended(self, life: InstanceLife) -> bool: ...

    def day(self, day: str) -> tuple[list[HandOverCost], list[InstanceLife]]: ...
