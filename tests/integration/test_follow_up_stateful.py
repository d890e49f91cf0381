"""Random arrivals, seals, leader deaths and late deliveries against the follow-up window on moto.

The machine plays the demand queue and the follow-up state machine around the real dispatcher, the real
follow-up steps and the real ledger: each arrival is one dispatch of new jobs of one run key; a dispatch
may find the follow-up machine down (its leader then gathers the follow-up itself) or die as it starts
the machine (its messages come again once their visibility timeout passes); a follow-up machine's gather
step runs when the machine chooses; any message may be delivered again, late. Every write of the
follow-up item is watched: applied, it moved the item from a state its transition starts from to the
state the transition leads to (domain.follow_up.TRANSITIONS); a sealed follow-up took no job but by
being taken over. No job is ever in two provisions, and once everything settles (leases passed,
unacknowledged messages delivered again, every follow-up machine run to its end) every job was started.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from emulator.harness.control_plane import NO_WAIT, REGION
from emulator.resources import create_idempotency_table
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.adapters.follow_up_batches import STATE_ATTRIBUTE, TRANSITION_CONDITIONS
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.demand import LEASE_MARGIN_SECONDS, DemandMessage, JobQueued
from runner_pool.domain.executions import FollowUpRequest, ProvisionRequest, ReleaseRequest
from runner_pool.domain.follow_up import (
    BURST_QUIET_SECONDS,
    TRANSITIONS,
    FollowUpState,
    FollowUpTransition,
)
from runner_pool.steps.dispatcher import Dispatcher
from runner_pool.steps.follow_up import FollowUpNotStartedError, FollowUpSteps
from tests.support.builders import demand_starts, pause_on
from tests.support.stateful import program_aws, programs

pytestmark = pytest.mark.slow

TABLE = "runner-pool-idempotency"
REPOSITORY = "octo-org/octo-repo"
RUN_ID = 4242
RUN_KEY = f"pool={RUN_ID}/class=large"
LEASE_SECONDS = 30.0
VISIBILITY_SECONDS = LEASE_SECONDS + LEASE_MARGIN_SECONDS + 1
"""Past every lease a dispatch holds: a message it did not acknowledge comes again after this."""
WRITTEN_BY = {
    (condition, TRANSITIONS[transition].target.value): transition
    for transition, condition in TRANSITION_CONDITIONS.items()
}
"""Which transition a write of the follow-up item is, by its condition and the state it writes."""


class LeaderDiedError(BaseException):
    """The dispatch's Lambda ended as it started the follow-up machine: nothing of it runs on."""


@dataclass
class Watched:
    """One write of the follow-up item: which transition, whether it applied, the item before and after."""

    transition: FollowUpTransition
    applied: bool
    before: dict[str, Any]
    after: dict[str, Any]


@dataclass
class WatchingClient:
    """The ledger's DynamoDB client, reading the follow-up item around each of its transitions' writes
    (one dispatch at a time here, so what it reads is what the write found and left)."""

    client: Any
    watched: list[Watched] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def update_item(self, **write: Any) -> Any:
        target = write.get("ExpressionAttributeValues", {}).get(":to", {}).get("S")
        transition = WRITTEN_BY.get((write.get("ConditionExpression", ""), target))
        if transition is None:
            return self.client.update_item(**write)
        before = self._item(write)
        try:
            response = self.client.update_item(**write)
        except self.client.exceptions.ConditionalCheckFailedException:
            self.watched.append(Watched(transition, False, before, self._item(write)))
            raise
        self.watched.append(Watched(transition, True, before, self._item(write)))
        return response

    def _item(self, write: dict[str, Any]) -> dict[str, Any]:
        found = self.client.get_item(TableName=write["TableName"], Key=write["Key"], ConsistentRead=True)
        return dict(found.get("Item", {}))


@dataclass
class Machines:
    """Starts executions as Step Functions would: a provision or follow-up by name once."""

    provisions: dict[str, ProvisionRequest] = field(default_factory=dict)
    follow_ups: dict[str, FollowUpRequest] = field(default_factory=dict)
    """Follow-up machines running (not yet gathered), by execution name."""
    to_start: dict[str, tuple[FollowUpRequest, Any]] = field(default_factory=dict)
    """Follow-up machines whose gather step sealed but did not start: their start step comes next."""
    down: bool = False
    """The follow-up machine does not start: its leader gathers the follow-up itself."""
    kill: bool = False
    """The next leader dies as it starts the follow-up machine."""

    def provision(self, request: ProvisionRequest) -> bool:
        fresh = request.execution_name not in self.provisions
        self.provisions.setdefault(request.execution_name, request)
        return fresh

    def release(self, request: ReleaseRequest) -> bool:
        return True

    def follow_up(self, request: FollowUpRequest) -> bool:
        if self.kill:
            self.kill = False
            raise LeaderDiedError(request.holder)
        if self.down:
            raise RuntimeError("the follow-up state machine did not start")
        self.follow_ups.setdefault(request.execution_name, request)
        return True


class FollowUpWindow(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._aws = program_aws()
        client = boto3.session.Session().client("dynamodb", region_name=REGION)
        create_idempotency_table(client, TABLE)
        self.client = WatchingClient(client)
        self.clock = ManualClock()
        self.machines = Machines()
        ledger = DynamoDbLedger(TABLE, self.clock, self.client, NO_WAIT)  # type: ignore[arg-type]
        starts = demand_starts(ledger, self.machines, self.clock, pause_on(self.clock))
        self.dispatcher = Dispatcher(starts)
        self.steps = FollowUpSteps(starts)
        self.job_ids = itertools.count(1)
        self.holders = itertools.count(1)
        self.demanded: set[int] = set()
        self.unacknowledged: list[tuple[float, list[tuple[str, DemandMessage]]]] = []
        """Batches SQS delivers again, each once its visibility timeout passed."""
        self.delivered: list[tuple[str, DemandMessage]] = []
        self.checked = 0

    def teardown(self) -> None:
        """Once everything settled, every job demanded was started, exactly once."""
        try:
            self.settle()
            started = {job_id for request in self.machines.provisions.values() for job_id in request.job_ids}
            assert started == self.demanded, sorted(self.demanded - started)
        finally:
            self._aws.close()

    # --- what happens --------------------------------------------------------------------------

    def _dispatch(self, batch: list[tuple[str, DemandMessage]]) -> None:
        holder = f"dispatch-{next(self.holders)}"
        visible_again = self.clock.now() + VISIBILITY_SECONDS
        try:
            report = self.dispatcher.dispatch(batch, holder, LEASE_SECONDS)
        except LeaderDiedError:
            self.unacknowledged.append((visible_again, batch))
            return
        failed = [
            (message_id, message) for message_id, message in batch if message_id in report.failed_message_ids
        ]
        if failed:
            self.unacknowledged.append((visible_again, failed))

    @rule(jobs=st.integers(1, 3), machine=st.sampled_from(("up", "up", "up", "down", "leader dies")))
    def arrive(self, jobs: int, machine: str) -> None:
        """A batch of new jobs of the run key reaches a dispatcher."""
        batch: list[tuple[str, DemandMessage]] = []
        for _ in range(jobs):
            job_id = next(self.job_ids)
            self.demanded.add(job_id)
            message = JobQueued(
                repository=REPOSITORY, run_key=RUN_KEY, run_id=RUN_ID, run_attempt=1, job_id=job_id
            )
            batch.append((f"message-{job_id}", message))
        self.delivered += batch
        self.machines.down = machine == "down"
        self.machines.kill = machine == "leader dies"
        self._dispatch(batch)
        self.machines.down = self.machines.kill = False

    @rule(seconds=st.sampled_from((0.1, 0.3, 1.0, 3.0, BURST_QUIET_SECONDS + 1, VISIBILITY_SECONDS)))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self.machines.follow_ups) or bool(self.machines.to_start))
    @rule(pick=st.integers(0, 100))
    def follow_up_machine_steps(self, pick: int) -> None:
        """One follow-up machine runs its next step: gather (seal once its window closed), or start."""
        self._machine_step(pick)

    @precondition(lambda self: any(at <= self.clock.now() for at, _ in self.unacknowledged))
    @rule()
    def delivered_again(self) -> None:
        """SQS delivers a batch that was not acknowledged once its visibility timeout passed."""
        due = [entry for entry in self.unacknowledged if entry[0] <= self.clock.now()]
        self.unacknowledged.remove(due[0])
        self._dispatch(due[0][1])

    @precondition(lambda self: bool(self.delivered))
    @rule(pick=st.integers(0, 1000))
    def delivered_late(self, pick: int) -> None:
        """A message acknowledged (or not) long ago comes again: SQS and GitHub both repeat."""
        self._dispatch([self.delivered[pick % len(self.delivered)]])

    def _machine_step(self, pick: int) -> None:
        if self.machines.to_start:
            name = sorted(self.machines.to_start)[pick % len(self.machines.to_start)]
            request, follow_up = self.machines.to_start[name]
            try:
                self.steps.start(request, follow_up, LEASE_SECONDS)
            except FollowUpNotStartedError:
                return  # Step Functions tries the step again
            del self.machines.to_start[name]
            return
        name = sorted(self.machines.follow_ups)[pick % len(self.machines.follow_ups)]
        gathering = self.steps.gather(self.machines.follow_ups[name], LEASE_SECONDS)
        if not gathering.gathered:
            self.machines.follow_ups[name] = gathering.request
            self.clock.advance(gathering.wait_seconds)  # its Wait state
            return
        del self.machines.follow_ups[name]
        if gathering.follow_up is not None:
            self.machines.to_start[name] = (gathering.request, gathering.follow_up)

    # --- what must hold ------------------------------------------------------------------------

    @invariant()
    def no_job_is_started_twice(self) -> None:
        started = [job_id for request in self.machines.provisions.values() for job_id in request.job_ids]
        assert len(started) == len(set(started)), sorted(started)
        assert set(started) <= self.demanded

    @invariant()
    def every_write_follows_the_transition_table(self) -> None:
        for watched in self.client.watched[self.checked :]:
            move = TRANSITIONS[watched.transition]
            before, after = _state(watched.before), _state(watched.after)
            if not watched.applied:
                assert watched.after == watched.before, watched.transition
                continue
            assert before in move.sources, (watched.transition, before)
            assert after is move.target, (watched.transition, after)
            if before in {FollowUpState.SEALED, FollowUpState.STARTED} and watched.transition in {
                FollowUpTransition.MARK_STARTED,
                FollowUpTransition.TAKE_OVER,
            }:
                # A sealed follow-up never reopens: only a take-over adds (its own) jobs, none leave
                assert _jobs(watched.before) <= _jobs(watched.after), watched.transition
                if watched.transition is FollowUpTransition.MARK_STARTED:
                    assert _jobs(watched.before) == _jobs(watched.after)
        self.checked = len(self.client.watched)

    def settle(self) -> None:
        """Everything a running stack would still do: leases pass, SQS delivers what was not
        acknowledged, every follow-up machine runs to its end."""
        for _ in range(200):
            if not (self.unacknowledged or self.machines.follow_ups or self.machines.to_start):
                return
            if self.machines.follow_ups or self.machines.to_start:
                self._machine_step(0)
            else:
                self.clock.advance(VISIBILITY_SECONDS)
                self.delivered_again()
            self.no_job_is_started_twice()
            self.every_write_follows_the_transition_table()
        raise AssertionError("the demand did not settle")


def _state(item: dict[str, Any]) -> FollowUpState | None:
    if not item:
        return None
    return FollowUpState(item[STATE_ATTRIBUTE]["S"])


def _jobs(item: dict[str, Any]) -> set[int]:
    return {int(job_id) for job_id in item.get("jobs", {}).get("NS", [])}


# 12 programs of 30 steps: each program drives the window through arrivals, seals, leader deaths and late
# deliveries on moto; more examples cost make test's time and have found nothing the first dozen did not.
FollowUpWindow.TestCase.settings = programs(12, steps=30)
TestFollowUpWindow = FollowUpWindow.TestCase
