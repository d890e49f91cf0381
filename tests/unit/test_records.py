"""Record models: the lifecycle's invariants, pool messages, heartbeats, signals and the clock."""

from __future__ import annotations

import pytest

from runner_pool.domain.clock import ManualClock
from runner_pool.domain.lifecycle import InstanceState, Outcome
from runner_pool.domain.records import (
    MAX_REASON_CHARS,
    Heartbeat,
    InstanceRecord,
    PoolMessage,
    Signal,
    WorkerSignal,
)
from tests.support import builders

NOW = 1_800_000_000.0


def record(**overrides: object) -> InstanceRecord:
    fields: dict[str, object] = {
        **builders.facts().model_dump(),
        "state": InstanceState.IDLE,
        "threshold": NOW + 600,
        "created_at": NOW,
        "updated_at": NOW,
    }
    fields.update(overrides)
    return InstanceRecord.model_validate(fields)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"state": InstanceState.RUNNING}, "running without a run key"),
        ({"state": InstanceState.CLAIMED, "run_key": "pool=1"}, "claimed without a claim token"),
        ({"run_key": "pool=1"}, "idle still holding run key 'pool=1'"),
        ({"claim_token": "t"}, "idle still carrying claim token 't'"),
        ({"state": InstanceState.TERMINATED, "threshold": None}, "terminated without a TTL"),
        ({"threshold": None}, "idle without a threshold"),
    ],
)
def test_records_the_lifecycle_forbids_are_named(overrides: dict[str, object], problem: str) -> None:
    assert problem in record(**overrides).invariant_violations()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"state": InstanceState.CREATED},
        {"state": InstanceState.CREATED, "run_key": "pool=1"},
        {"state": InstanceState.CLAIMED, "run_key": "pool=1", "claim_token": "t"},
        {"state": InstanceState.RUNNING, "run_key": "pool=1"},
        {"state": InstanceState.TERMINATED, "threshold": None, "expires_at": 1},
    ],
)
def test_records_the_lifecycle_allows_have_no_violations(overrides: dict[str, object]) -> None:
    assert record(**overrides).invariant_violations() == []


def test_threshold_passes_at_the_threshold_itself() -> None:
    assert not record(threshold=NOW + 1).threshold_passed(NOW)
    assert record(threshold=NOW).threshold_passed(NOW)


def test_pool_message_carries_the_idle_records_facts_and_threshold() -> None:
    # Given an idle record / When pooled / Then the message round-trips through its body unchanged
    message = PoolMessage.for_idle(record())
    assert message.threshold == NOW + 600
    assert message.instance_id == builders.facts().instance_id
    assert PoolMessage.from_body(message.to_body()) == message


def test_only_idle_instances_are_pooled() -> None:
    with pytest.raises(ValueError, match="only an idle instance is pooled"):
        PoolMessage.for_idle(record(state=InstanceState.RUNNING, run_key="pool=1"))


def test_heartbeat_is_fresh_within_the_healthy_window() -> None:
    beat = Heartbeat(instance_id="i-1", beat_at=NOW)
    assert beat.is_fresh(NOW + 15, healthy_window_seconds=15)
    assert not beat.is_fresh(NOW + 15.001, healthy_window_seconds=15)


def test_signal_confirms_only_its_own_run() -> None:
    signal = WorkerSignal(instance_id="i-1", signal=Signal.UD_REG_OK, run_key="pool=1", at=NOW)
    assert signal.confirms(Signal.UD_REG_OK, "pool=1")
    assert not signal.confirms(Signal.UD_REG_OK, "pool=2")
    assert not signal.confirms(Signal.UD_REMOVE_REG_OK, "pool=1")


def test_lost_is_the_only_unsuccessful_outcome() -> None:
    assert [o for o in Outcome if not o.succeeded] == [Outcome.LOST]


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(start=NOW)
    assert clock.advance(2.5) == NOW + 2.5
    with pytest.raises(ValueError, match="never moves backwards"):
        clock.advance(-1)


def test_an_agents_failure_reason_is_bounded_before_it_reaches_a_state_machine() -> None:
    # Given an agent that reports a runner's whole output as its reason (issue 12, item 3: unbounded
    # reasons inside the Map's output could pass Step Functions' 256 KiB)
    signal = WorkerSignal(
        instance_id="i-00000000000000001", signal=Signal.UD_REG_FAILED, at=1.0, reason="x" * 300_000
    )
    # Then what it carries is cut to MAX_REASON_CHARS, marked as cut
    assert signal.reason is not None
    assert len(signal.reason) == MAX_REASON_CHARS
    assert signal.reason.endswith("…")
