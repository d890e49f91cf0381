"""Random transitions, retries, clock moves and claim races against moto, judged by DESIGN.md section 4.

The machine keeps a model of each instance (state, run key, threshold, claim token) and predicts every
outcome from the section 4 table: APPLIED when the transition's condition holds (expected state,
expected run key, threshold still ahead), REPLAYED when the record already is what the call would
have made it and is still valid (a retry finding its own effect), LOST otherwise. After every step
it checks the raw table against the model and the records' invariants, and the adapter's index
reads (held_by, due) against the model.

Every rule is as likely as every other and most calls of most rules must lose, so one rule walks
an instance through its ordinary life and the others aim mostly at instances their transition can
start from; `--hypothesis-show-statistics` shows how often each outcome of each transition is met.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import partial
from typing import Any

import boto3
import pytest
from boto3.dynamodb.types import TypeDeserializer
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from emulator.aws import INSTANCE_ARNS
from emulator.harness.control_plane import NO_WAIT, REGION
from emulator.resources import create_state_table
from runner_pool.adapters import state_items as schema
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Epoch, ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.lifecycle import LIVE_STATES, InstanceState, Outcome
from runner_pool.domain.pickup import ClaimTerms
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import InstanceRecord, Signal, TransitionResult, UsageClass
from tests.conftest import TABLE_NAME
from tests.support import builders
from tests.support.racing import at_once
from tests.support.stateful import program_aws, programs

pytestmark = pytest.mark.slow

_deserializer = TypeDeserializer()
_BOOKKEEPING = {
    schema.PARTITION_KEY,
    schema.SORT_KEY,
    schema.SWEEP_SHARD_ATTRIBUTE,
    schema.STOPPED_PARTITION_ATTRIBUTE,
    schema.POOL_PARTITION_ATTRIBUTE,
    schema.IDLE_SINCE_ATTRIBUTE,
}

INSTANCE_IDS = tuple(builders.facts(number).instance_id for number in range(3))
RUN_KEYS = (builders.run_key(1, "/class=large"), builders.run_key(2, "/class=large"))
FACTS = {
    facts.instance_id: facts
    for facts in (
        # Instance 0 is spot, which is never stopped (an instant fleet's one-time request); the others
        # are on-demand, which the stopped tier takes (issue 16, item 2).
        builders.facts(number, usage_class=UsageClass.SPOT if number == 0 else UsageClass.ON_DEMAND)
        for number in range(3)
    )
}
STOPPED_FOR = st.sampled_from((1.0, 3600.0))
"""Seconds a stop lasts (pool.stopped_max_age_minutes); one short enough that clock moves reach it."""
ANYONE = "anyone"
"""Expire whoever holds the instance (no run key condition)."""
RETRY_WINDOW = 5
"""How many of the latest calls a retry may repeat."""
TO_IDLE = {InstanceState.CLAIMED: "unclaim", InstanceState.RUNNING: "release", InstanceState.CREATED: "admit"}
"""The transitions back to idle, by the state they start from."""

aims = st.tuples(st.sampled_from(("fitting", "fitting", "any")), st.integers(0, len(INSTANCE_IDS) - 1))
"""Which instance a transition is tried on: two times in three one in the state the transition starts
from (so random runs get deep into the lifecycle), otherwise any (so every transition also meets
instances it must lose on)."""
run_keys = st.sampled_from(RUN_KEYS)
maybe_run_keys = st.none() | run_keys
claim_workers = st.sampled_from(("worker-a", "worker-b"))
callers = st.sampled_from(("holder", "stranger"))
token_holders = st.sampled_from(("holder", "holder", "stranger", "nobody"))
"""Whose claim token a call presents: the record's own, another worker's, or none at all."""
"""Who makes a call that names a run: the run holding the instance, or another."""
max_runtimes = st.sampled_from((1, 360))
"""Minutes; one short enough that clock moves reach it."""
small_moves = st.sampled_from((0.5, 1.0, 7.0, 45.0))
"""Seconds; multiples of 0.5 keep every epoch exact in a float, so thresholds can be hit exactly."""


@dataclass(frozen=True)
class Modelled:
    """What section 4 says one instance's record holds."""

    state: InstanceState
    run_key: str | None
    threshold: Epoch | None
    claim_token: str | None = None

    def valid(self, now: Epoch) -> bool:
        return self.threshold is not None and self.threshold > now

    def holds(self, run_key: str | None) -> bool:
        return self.run_key == run_key


@functools.cache
def _client(role: str) -> Any:
    """One client per role for the whole module: creating clients, not calling moto, would dominate.

    moto intercepts through a botocore handler every session gets, so a client made once keeps
    talking to the moto of whichever example is running.
    """
    return boto3.session.Session().client("dynamodb", region_name=REGION)


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._aws = program_aws()
        self.client = _client("table")
        create_state_table(self.client, TABLE_NAME)
        self.clock = ManualClock()
        self.timeouts = StackConfig().timeouts
        self.table = self._state_table(self.client)
        self.racers = [self._state_table(_client("first racer")), self._state_table(_client("second racer"))]
        """Two more state tables, each with a client of its own, for the two sides of a race."""
        self.model: dict[str, Modelled] = {}
        self.last_applied: dict[str, tuple[str, ...]] = {}
        """The last call that changed each record, so a REPLAYED can be traced to its original."""
        self.races = 0
        self.recent: list[Callable[[], None]] = []
        """The last few calls made, each ready to be made again as a retry."""

    def teardown(self) -> None:
        self._aws.close()

    def _state_table(self, client: Any) -> StateTable:
        return StateTable(TABLE_NAME, self.timeouts, self.clock, client, NO_WAIT, arns=INSTANCE_ARNS)

    # --- the calls: each predicted from section 4, made, and checked --------------------------

    def _check(
        self,
        instance_id: str,
        call: tuple[str, ...],
        result: TransitionResult,
        *,
        applies: bool,
        replays: bool,
        after: Modelled | None,
    ) -> None:
        """Check a transition's outcome against the model's prediction and carry the model forward."""
        before = self.model.get(instance_id)
        expected = Outcome.APPLIED if applies else Outcome.REPLAYED if replays else Outcome.LOST
        assert result.outcome is expected, f"{call} on {before} at {self.clock.now()}: {result}"
        event(f"{call[0]}: {expected}")
        if expected is Outcome.APPLIED:
            assert after is not None
            self.model[instance_id] = after
            self.last_applied[instance_id] = call
            assert result.record is not None
            assert self._modelled(result.record) == after
        else:
            assert (None if result.record is None else self._modelled(result.record)) == before

    def _is_own_replay(self, instance_id: str, call: tuple[str, ...]) -> bool:
        """True when the last change to the record was this very call: finding it is a true replay."""
        return self.last_applied.get(instance_id) == call

    def _remember(self, call: Callable[[], None]) -> None:
        self.recent = [*self.recent[1 - RETRY_WINDOW :], call]

    @staticmethod
    def _modelled(record: InstanceRecord) -> Modelled:
        return Modelled(record.state, record.run_key, record.threshold, record.claim_token)

    def _create(self, instance_id: str, run_key: str | None) -> None:
        self._remember(lambda: self._create(instance_id, run_key))
        now, current = self.clock.now(), self.model.get(instance_id)
        call = ("create", str(run_key))
        result = self.table.create(FACTS[instance_id], run_key)
        self._check(
            instance_id,
            call,
            result,
            applies=current is None,
            replays=current is not None
            and current.state is InstanceState.CREATED
            and current.holds(run_key)
            and current.valid(now),
            after=Modelled(InstanceState.CREATED, run_key, now + self.timeouts.created_threshold_seconds),
        )
        if result.outcome is Outcome.REPLAYED:
            assert self._is_own_replay(instance_id, call)

    def _claim(self, instance_id: str, run_key: str, token: str, stopped: bool = False) -> None:
        """idle → claimed, or (`stopped`) stopped → claimed, with the start's time on top."""
        self._remember(lambda: self._claim(instance_id, run_key, token, stopped))
        now, current = self.clock.now(), self.model.get(instance_id)
        call = ("claim_stopped" if stopped else "claim", run_key, token)
        result = self.table.claim(instance_id, run_key, token, ClaimTerms(stopped=stopped))
        self._check(
            instance_id,
            call,
            result,
            applies=current is not None
            and current.state is (InstanceState.STOPPED if stopped else InstanceState.IDLE)
            and current.holds(None)
            and current.valid(now),
            replays=current is not None
            and current.state is InstanceState.CLAIMED
            and current.claim_token == token
            and current.valid(now),
            after=Modelled(InstanceState.CLAIMED, run_key, now + self._claimed_for(stopped), token),
        )
        if result.outcome is Outcome.REPLAYED:
            assert self._is_own_replay(instance_id, call)

    def _claimed_for(self, stopped: bool) -> float:
        extra = self.timeouts.start_registration_seconds if stopped else 0.0
        return self.timeouts.claimed_threshold_seconds + extra

    def _stop(self, instance_id: str) -> None:
        """idle → stopping: only an unheld, on-demand idle instance whose idle time is still ahead."""
        self._remember(lambda: self._stop(instance_id))
        now, current = self.clock.now(), self.model.get(instance_id)
        result = self.table.stop(instance_id)
        self._check(
            instance_id,
            ("stop",),
            result,
            applies=current is not None
            and current.state is InstanceState.IDLE
            and current.holds(None)
            and current.valid(now)
            and FACTS[instance_id].usage_class is UsageClass.ON_DEMAND,
            replays=current is not None and current.state is InstanceState.STOPPING and current.valid(now),
            after=Modelled(InstanceState.STOPPING, None, now + self.timeouts.stopping_seconds),
        )

    def _mark_stopped(self, instance_id: str, for_seconds: float) -> None:
        """stopping → stopped, until `for_seconds` from now."""
        self._remember(lambda: self._mark_stopped(instance_id, for_seconds))
        now, current = self.clock.now(), self.model.get(instance_id)
        result = self.table.mark_stopped(FACTS[instance_id], now + for_seconds)
        self._check(
            instance_id,
            ("mark_stopped",),
            result,
            applies=current is not None and current.state is InstanceState.STOPPING and current.valid(now),
            replays=current is not None and current.state is InstanceState.STOPPED and current.valid(now),
            after=Modelled(InstanceState.STOPPED, None, now + for_seconds),
        )

    def _activate(self, instance_id: str, run_key: str, max_runtime: int, token: str | None) -> None:
        self._remember(lambda: self._activate(instance_id, run_key, max_runtime, token))
        now, current = self.clock.now(), self.model.get(instance_id)
        call = ("activate", run_key)
        result = self.table.activate(instance_id, run_key, max_runtime, claim_token=token)
        self._check(
            instance_id,
            call,
            result,
            # A claimed instance only by its claim's holder; without a token only a created one.
            applies=current is not None
            and (
                (token is None and current.state is InstanceState.CREATED)
                or (
                    token is not None
                    and current.state is InstanceState.CLAIMED
                    and current.claim_token == token
                )
            )
            and current.holds(run_key)
            and current.valid(now),
            replays=current is not None
            and current.state is InstanceState.RUNNING
            and current.holds(run_key)
            and current.valid(now),
            after=Modelled(InstanceState.RUNNING, run_key, now + max_runtime * 60),
        )
        if result.outcome is Outcome.REPLAYED:
            assert self._is_own_replay(instance_id, call)

    def _to_idle(
        self, instance_id: str, from_state: InstanceState, run_key: str | None, token: str | None = None
    ) -> None:
        """unclaim (from claimed, by the claim's token), release (from running) or admit (from created)."""
        self._remember(lambda: self._to_idle(instance_id, from_state, run_key, token))
        now, current = self.clock.now(), self.model.get(instance_id)
        if from_state is InstanceState.CLAIMED:
            result = self.table.unclaim(instance_id, run_key, token)  # type: ignore[arg-type]
        elif from_state is InstanceState.RUNNING:
            result = self.table.release(instance_id, run_key)  # type: ignore[arg-type]
        else:
            result = self.table.admit(instance_id)
        self._check(
            instance_id,
            (TO_IDLE[from_state], str(run_key)),
            result,
            applies=current is not None
            and current.state is from_state
            and current.holds(run_key)
            and (from_state is not InstanceState.CLAIMED or current.claim_token == token)
            and current.valid(now),
            # An idle record keeps no trace of what made it idle, so any valid idle record is taken
            # as the replay of any of unclaim, release or admit (a design note of the report).
            replays=current is not None and current.state is InstanceState.IDLE and current.valid(now),
            after=Modelled(InstanceState.IDLE, None, now + self.timeouts.idle_seconds),
        )

    def _expire(self, instance_id: str, holder: str | None) -> None:
        """Expire for `holder` (a run key, or None for an unheld instance), or for ANYONE."""
        self._remember(lambda: self._expire(instance_id, holder))
        now, current = self.clock.now(), self.model.get(instance_id)
        if holder == ANYONE:
            result = self.table.expire(instance_id)
        else:
            result = self.table.expire(instance_id, holder)
        live = (
            current is not None
            and current.state in LIVE_STATES
            and (holder == ANYONE or current.holds(holder))
        )
        self._check(
            instance_id,
            ("expire", str(holder)),
            result,
            applies=live and current is not None and current.valid(now),
            # Its effect is a passed threshold: a record already past it is what expire would make it.
            replays=live and current is not None and not current.valid(now),
            after=None if current is None else replace(current, threshold=now),
        )

    def _mark_terminated(self, instance_id: str) -> None:
        self._remember(lambda: self._mark_terminated(instance_id))
        now, current = self.clock.now(), self.model.get(instance_id)
        call = ("mark_terminated",)
        result = self.table.mark_terminated(instance_id)
        self._check(
            instance_id,
            call,
            result,
            applies=current is not None and current.state in LIVE_STATES and not current.valid(now),
            replays=current is not None and current.state is InstanceState.TERMINATED,
            after=Modelled(InstanceState.TERMINATED, None, None),
        )
        if result.outcome is Outcome.APPLIED:
            assert result.record is not None
            assert result.record.expires_at == int(now) + self.timeouts.terminated_retention_days * 86_400
        if result.outcome is Outcome.REPLAYED:
            assert self._is_own_replay(instance_id, call)

    def _race(self, instance_id: str, first: str, second: str, stopped: bool = False) -> None:
        """Two claim workers, each on its own thread and client, claim the same instance at once (idle,
        or `stopped`: the two provisions that must never both start one stopped instance)."""
        now, current = self.clock.now(), self.model.get(instance_id)
        self.races += 1
        contenders = [(first, f"race-{self.races}-first"), (second, f"race-{self.races}-second")]
        start = threading.Barrier(2, timeout=30)
        results: list[TransitionResult | None] = [None, None]

        def contend(side: int) -> None:
            run_key, token = contenders[side]
            start.wait()
            results[side] = self.racers[side].claim(instance_id, run_key, token, ClaimTerms(stopped=stopped))

        at_once(partial(contend, 0), partial(contend, 1))
        outcomes = [result.outcome for result in results if result is not None]
        assert len(outcomes) == 2

        claimable = (
            current is not None
            and current.state is (InstanceState.STOPPED if stopped else InstanceState.IDLE)
            and current.holds(None)
            and current.valid(now)
        )
        expected = [Outcome.APPLIED, Outcome.LOST] if claimable else [Outcome.LOST, Outcome.LOST]
        assert sorted(outcomes) == sorted(expected), f"race on {current}: {results}"
        event(f"race{' for a stopped one' if stopped else ''}: {'one winner' if claimable else 'no winner'}")
        if claimable:
            (winner,) = (side for side in (0, 1) if outcomes[side] is Outcome.APPLIED)
            run_key, token = contenders[winner]
            self.model[instance_id] = Modelled(
                InstanceState.CLAIMED, run_key, now + self._claimed_for(stopped), token
            )
            self.last_applied[instance_id] = ("claim_stopped" if stopped else "claim", run_key, token)
            won = results[winner]
            assert won is not None
            assert won.record is not None
            assert self._modelled(won.record) == self.model[instance_id]

    # --- choosing what to call -----------------------------------------------------------------

    def _aim(self, aim: tuple[str, int], *states: InstanceState | None) -> str:
        """The instance `aim` points at; `states` are those the transition starts from (None: no record)."""
        kind, number = aim
        fitting = [
            instance_id
            for instance_id in INSTANCE_IDS
            if (None if instance_id not in self.model else self.model[instance_id].state) in states
        ]
        if kind == "fitting" and fitting:
            return fitting[number % len(fitting)]
        return INSTANCE_IDS[number]

    def _run_key_of(self, instance_id: str, caller: str) -> str | None:
        """The run key a caller brings: the holder's own, another run's, or (nobody) none."""
        current = self.model.get(instance_id)
        held = None if current is None else current.run_key
        if caller == "holder":
            return held
        if caller == "stranger":
            return next(run_key for run_key in RUN_KEYS if run_key != held)
        return None

    def _named_run_key_of(self, instance_id: str, caller: str) -> str:
        """As _run_key_of, for calls that must name some run: an unheld instance's 'holder' is run 1."""
        return self._run_key_of(instance_id, caller) or RUN_KEYS[0]

    def _named_token_of(self, instance_id: str, token_holder: str) -> str | None:
        """The claim token a call presents: the record's own ('holder'), another worker's, or none."""
        current = self.model.get(instance_id)
        if token_holder == "holder":
            return None if current is None else current.claim_token
        return "another-worker" if token_holder == "stranger" else None

    # --- the rules -----------------------------------------------------------------------------

    @initialize(
        starts=st.lists(
            st.sampled_from(("missing", "created for a run", "created for the pool", "idle", "stopped")),
            min_size=len(INSTANCE_IDS),
            max_size=len(INSTANCE_IDS),
        )
    )
    def record_the_instances(self, starts: list[str]) -> None:
        """Start every run with some instances already recorded, through the same checked calls."""
        for instance_id, start in zip(INSTANCE_IDS, starts, strict=True):
            if start == "created for a run":
                self._create(instance_id, RUN_KEYS[0])
            elif start != "missing":
                self._create(instance_id, None)
            if start in ("idle", "stopped"):
                self._to_idle(instance_id, InstanceState.CREATED, None)
            if start == "stopped":  # the spot instance stays idle: its stop is lost
                self._stop(instance_id)
                self._mark_stopped(instance_id, 3600.0)

    @rule(
        number=st.integers(0, len(INSTANCE_IDS) - 1),
        run_key=maybe_run_keys,
        worker=claim_workers,
        alternative=st.booleans(),
        max_runtime=max_runtimes,
    )
    def the_lifecycle_moves_on(
        self, number: int, run_key: str | None, worker: str, alternative: bool, max_runtime: int
    ) -> None:
        """One instance takes the next step of its ordinary life, as the control plane would take it.

        The other rules are all equally likely and most of their calls must lose, so without this
        one random runs would seldom get an instance as far as running and back to the pool.
        `alternative` picks the other way where there are two: a race for an idle instance instead
        of a lone claim, giving a claim back instead of activating it.
        """
        instance_id = INSTANCE_IDS[number]
        current = self.model.get(instance_id)
        if current is None:
            self._create(instance_id, run_key)
        elif current.state is InstanceState.TERMINATED:
            return
        elif not current.valid(self.clock.now()):
            self._mark_terminated(instance_id)
        elif current.state is InstanceState.CREATED and current.run_key is None:
            self._to_idle(instance_id, InstanceState.CREATED, None)
        elif current.state in (InstanceState.STOPPING, InstanceState.STOPPED) or (
            current.state is InstanceState.IDLE and run_key is None and worker == "worker-b"
        ):
            self._tier_moves_on(instance_id, current, run_key, worker, alternative)
        elif current.state is InstanceState.IDLE and alternative:
            self._race(instance_id, RUN_KEYS[0], RUN_KEYS[1])
        elif current.state is InstanceState.IDLE:
            run_key = run_key or RUN_KEYS[0]
            self._claim(instance_id, run_key, f"{run_key}#{worker}")
        elif current.state is InstanceState.CLAIMED and alternative:
            self._to_idle(instance_id, InstanceState.CLAIMED, current.run_key, current.claim_token)
        elif current.state is InstanceState.RUNNING:
            self._to_idle(instance_id, InstanceState.RUNNING, current.run_key)
        else:
            assert current.run_key is not None
            self._activate(instance_id, current.run_key, max_runtime, current.claim_token)

    def _tier_moves_on(
        self, instance_id: str, current: Modelled, run_key: str | None, worker: str, alternative: bool
    ) -> None:
        """The stopped tier's part of an ordinary life: an idle instance stopped (lost on the spot
        instance, which refresh never asks), marked stopped, then claimed, alone or in a race."""
        if current.state is InstanceState.IDLE:
            self._stop(instance_id)
        elif current.state is InstanceState.STOPPING:
            self._mark_stopped(instance_id, 3600.0)
        elif alternative:
            self._race(instance_id, RUN_KEYS[0], RUN_KEYS[1], stopped=True)
        else:
            self._claim(instance_id, run_key or RUN_KEYS[0], f"{run_key}#{worker}", stopped=True)

    @precondition(lambda self: bool(self.recent))
    @rule(back=st.integers(0, RETRY_WINDOW - 1))
    def a_call_is_retried(self, back: int) -> None:
        """A Lambda or Step Functions retry: one of the last few calls is made again, exactly as it was."""
        self.recent[-1 - back % len(self.recent)]()

    @rule(aim=aims, run_key=maybe_run_keys)
    def create(self, aim: tuple[str, int], run_key: str | None) -> None:
        self._create(self._aim(aim, None), run_key)

    @rule(aim=aims, run_key=run_keys, worker=claim_workers)
    def claim(self, aim: tuple[str, int], run_key: str, worker: str) -> None:
        self._claim(self._aim(aim, InstanceState.IDLE), run_key, f"{run_key}#{worker}")

    @rule(aim=aims)
    def stop(self, aim: tuple[str, int]) -> None:
        self._stop(self._aim(aim, InstanceState.IDLE))

    @rule(aim=aims, for_seconds=STOPPED_FOR)
    def mark_stopped(self, aim: tuple[str, int], for_seconds: float) -> None:
        self._mark_stopped(self._aim(aim, InstanceState.STOPPING), for_seconds)

    @rule(aim=aims, run_key=run_keys, worker=claim_workers)
    def claim_a_stopped_one(self, aim: tuple[str, int], run_key: str, worker: str) -> None:
        # A token of its own: each claim attempt carries one (ProvisionPlan.claim_token(slot, attempt)),
        # so a worker's hot claim and its later claim of a stopped one never share a token. (Sharing one,
        # the stopped claim would meet the hot claim as its own replay, which no real call can do.)
        token = f"{run_key}#{worker}#stopped"
        self._claim(self._aim(aim, InstanceState.STOPPED), run_key, token, stopped=True)

    @rule(aim=aims, first=run_keys, second=run_keys)
    def race_to_start_a_stopped_one(self, aim: tuple[str, int], first: str, second: str) -> None:
        self._race(self._aim(aim, InstanceState.STOPPED), first, second, stopped=True)

    @rule(aim=aims, caller=callers, token_holder=token_holders, max_runtime=max_runtimes)
    def activate(self, aim: tuple[str, int], caller: str, token_holder: str, max_runtime: int) -> None:
        instance_id = self._aim(aim, InstanceState.CREATED, InstanceState.CLAIMED)
        run_key = self._named_run_key_of(instance_id, caller)
        self._activate(instance_id, run_key, max_runtime, self._named_token_of(instance_id, token_holder))

    @rule(aim=aims, caller=callers, token_holder=token_holders)
    def unclaim(self, aim: tuple[str, int], caller: str, token_holder: str) -> None:
        instance_id = self._aim(aim, InstanceState.CLAIMED)
        run_key = self._named_run_key_of(instance_id, caller)
        token = self._named_token_of(instance_id, token_holder) or "no-token"
        self._to_idle(instance_id, InstanceState.CLAIMED, run_key, token)

    @rule(aim=aims, caller=callers)
    def release(self, aim: tuple[str, int], caller: str) -> None:
        instance_id = self._aim(aim, InstanceState.RUNNING)
        self._to_idle(instance_id, InstanceState.RUNNING, self._named_run_key_of(instance_id, caller))

    @rule(aim=aims)
    def admit(self, aim: tuple[str, int]) -> None:
        self._to_idle(self._aim(aim, InstanceState.CREATED), InstanceState.CREATED, None)

    @rule(aim=aims)
    def expire_whoever_holds_it(self, aim: tuple[str, int]) -> None:
        self._expire(self._aim(aim, *LIVE_STATES), ANYONE)

    @rule(aim=aims, caller=st.sampled_from(("holder", "stranger", "nobody")))
    def expire_for_a_holder(self, aim: tuple[str, int], caller: str) -> None:
        instance_id = self._aim(aim, *LIVE_STATES)
        self._expire(instance_id, self._run_key_of(instance_id, caller))

    @rule(aim=aims)
    def mark_terminated(self, aim: tuple[str, int]) -> None:
        self._mark_terminated(self._aim(aim, *LIVE_STATES))

    @rule(aim=aims, first=run_keys, second=run_keys)
    def race_to_claim(self, aim: tuple[str, int], first: str, second: str) -> None:
        self._race(self._aim(aim, InstanceState.IDLE), first, second)

    # --- the agent and the clock -------------------------------------------------------------

    @rule(instance_id=st.sampled_from(INSTANCE_IDS), run_key=maybe_run_keys)
    def agent_reports(self, instance_id: str, run_key: str | None) -> None:
        self.table.write_heartbeat(instance_id)
        self.table.write_signal(instance_id, Signal.UD_REG_OK, run_key)

    @rule(seconds=small_moves)
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def _future_thresholds(self) -> list[Epoch]:
        now = self.clock.now()
        return sorted(
            {m.threshold for m in self.model.values() if m.threshold is not None and m.threshold > now}
        )

    @precondition(lambda self: bool(self._future_thresholds()))
    @rule(pick=st.integers(min_value=0), beyond=st.sampled_from((0.0, 0.5)))
    def time_reaches_a_threshold(self, pick: int, beyond: float) -> None:
        """Move to a record's threshold exactly (where it counts as passed) or just beyond it."""
        thresholds = self._future_thresholds()
        threshold = thresholds[pick % len(thresholds)]
        self.clock.advance(threshold - self.clock.now() + beyond)
        assert self.clock.now() == threshold + beyond

    # --- after every step --------------------------------------------------------------------

    @invariant()
    def the_table_holds_only_what_section_4_allows(self) -> None:
        """Read the raw table (a Scan, in the test only) so nothing the adapter filters out is missed."""
        state_items = self.client.scan(
            TableName=TABLE_NAME,
            ConsistentRead=True,
            FilterExpression=f"{schema.SORT_KEY} = :state",
            ExpressionAttributeValues={":state": {"S": schema.STATE_ITEM}},
        )["Items"]
        records = {record.instance_id: record for record in map(_record, state_items)}
        for record in records.values():
            assert record.invariant_violations() == [], record
        assert {instance_id: self._modelled(r) for instance_id, r in records.items()} == self.model
        for item in state_items:
            live = item["state"]["S"] in LIVE_STATES
            shard = item.get(schema.SWEEP_SHARD_ATTRIBUTE, {}).get("S")
            instance_id = item["instance_id"]["S"]
            assert item[schema.PARTITION_KEY]["S"] == INSTANCE_ARNS.arn(instance_id), item
            assert shard == (schema.sweep_shard(instance_id) if live else None), item
            stopped = item["state"]["S"] == InstanceState.STOPPED.value
            partition = item.get(schema.STOPPED_PARTITION_ATTRIBUTE, {}).get("S")
            assert partition == (PoolPartition.of(FACTS[instance_id]).name if stopped else None), item
            # In by-idle exactly while idle, under the partition every record carries from its creation
            assert item[schema.POOL_PARTITION_ATTRIBUTE]["S"] == PoolPartition.of(FACTS[instance_id]).name
            idle = item["state"]["S"] == InstanceState.IDLE.value
            assert (schema.IDLE_SINCE_ATTRIBUTE in item) == idle, item

    @invariant()
    def stopped_finds_exactly_the_claimable_stopped_records(self) -> None:
        now = self.clock.now()
        partitions = {PoolPartition.of(facts) for facts in FACTS.values()}
        found = {record.instance_id for p in partitions for record in self.table.stopped(p)}
        assert found == {
            instance_id
            for instance_id, m in self.model.items()
            if m.state is InstanceState.STOPPED and m.valid(now)
        }

    @invariant()
    def holds_idle_says_whether_a_partition_has_an_idle_record(self) -> None:
        for partition in {PoolPartition.of(facts) for facts in FACTS.values()}:
            idle = any(
                m.state is InstanceState.IDLE and PoolPartition.of(FACTS[instance_id]) == partition
                for instance_id, m in self.model.items()
            )
            assert self.table.holds_idle(partition) == idle, partition

    @invariant()
    def held_by_finds_exactly_the_holders(self) -> None:
        for run_key in RUN_KEYS:
            held = {record.instance_id for record in self.table.held_by(run_key)}
            assert held == {instance_id for instance_id, m in self.model.items() if m.run_key == run_key}

    @invariant()
    def due_is_exactly_the_live_records_past_their_threshold(self) -> None:
        now = self.clock.now()
        due = {record.instance_id for record in self.table.due()}
        assert due == {
            instance_id
            for instance_id, m in self.model.items()
            if m.state in LIVE_STATES and not m.valid(now)
        }


def _record(item: dict[str, Any]) -> InstanceRecord:
    plain = {
        name: _deserializer.deserialize(value) for name, value in item.items() if name not in _BOOKKEEPING
    }
    return InstanceRecord.model_validate(
        {name: float(value) if isinstance(value, Decimal) else value for name, value in plain.items()}
    )


# 8 programs of 60 steps: the stateful machine is where a broken transition shows first, so it keeps the
# most steps per program and gives up examples instead (make test's 10 minutes).
LifecycleMachine.TestCase.settings = programs(8, steps=60)
TestLifecycle = LifecycleMachine.TestCase
