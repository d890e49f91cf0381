"""When an instance handed a runner config counts as ready, still coming, or failed (DESIGN.md 6.1 and 6.4)."""

from __future__ import annotations

import pytest

from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import Readiness, readiness
from runner_pool.domain.records import Heartbeat, InstanceRecord, Signal, WorkerSignal
from runner_pool.domain.timeouts import Timeouts
from tests.support.builders import facts

RUN = "pool=7"
TOKEN = "exec#0#0"
T0 = 1_000.0
TIMEOUTS = Timeouts()
ID = facts(1).instance_id


def record(state: InstanceState = InstanceState.CLAIMED, **fields: object) -> InstanceRecord:
    values: dict[str, object] = {
        "state": state,
        "run_key": RUN,
        "threshold": T0 + 300,
        "claim_token": TOKEN if state is InstanceState.CLAIMED else None,
        "created_at": T0 - 100,
        "updated_at": T0,
        **fields,
    }
    return InstanceRecord(**facts(1).model_dump(), **values)


def beat(at: float) -> Heartbeat:
    return Heartbeat(instance_id=ID, beat_at=at)


def signal(kind: Signal, at: float, run_key: str | None = RUN) -> WorkerSignal:
    return WorkerSignal(instance_id=ID, signal=kind, run_key=run_key, at=at, reason="why")


def judge(
    current: InstanceRecord | None,
    heartbeat: Heartbeat | None,
    latest: WorkerSignal | None,
    now: float = T0 + 2,
    token: str | None = TOKEN,
    *,
    starting: bool = False,
) -> Readiness:
    verdict, _reason = readiness(
        current,
        heartbeat,
        latest,
        run_key=RUN,
        claim_token=token,
        handed_over_at=T0,
        deadline=T0 + 20,
        now=now,
        timeouts=TIMEOUTS,
        starting=starting,
    )
    return verdict


def test_a_fresh_heartbeat_and_a_registration_after_the_hand_off_is_ready() -> None:
    # Given a beat a second ago and UD_REG_OK for the run written after the hand-off / Then ready
    assert judge(record(), beat(T0 + 1), signal(Signal.UD_REG_OK, T0 + 1)) is Readiness.READY


def test_a_registration_from_an_earlier_hand_off_of_the_same_run_does_not_count() -> None:
    # Given UD_REG_OK for the same run key but from before this hand-off / Then still waiting
    assert judge(record(), beat(T0 + 1), signal(Signal.UD_REG_OK, T0 - 50)) is Readiness.WAITING


def test_a_registration_for_another_run_does_not_count() -> None:
    assert judge(record(), beat(T0 + 1), signal(Signal.UD_REG_OK, T0 + 1, "pool=8")) is Readiness.WAITING


def test_a_claimed_instance_with_a_stale_heartbeat_fails_at_once() -> None:
    # Given a vetted idle instance whose last beat is older than the healthy window / Then failed
    stale = beat(T0 - TIMEOUTS.healthy_window_seconds - 1)
    assert judge(record(), stale, None) is Readiness.FAILED


def test_a_created_instance_without_a_heartbeat_is_still_booting() -> None:
    created = record(InstanceState.CREATED)
    assert judge(created, None, None, token=None) is Readiness.WAITING


def test_a_created_instance_whose_heartbeat_stopped_has_failed() -> None:
    created = record(InstanceState.CREATED)
    stale = beat(T0 - TIMEOUTS.healthy_window_seconds)
    assert judge(created, stale, None, now=T0 + 5, token=None) is Readiness.FAILED


@pytest.mark.parametrize("kind", [Signal.UD_REG_FAILED, Signal.UD_FAILED])
def test_a_failure_signal_fails_the_instance(kind: Signal) -> None:
    assert judge(record(), beat(T0 + 1), signal(kind, T0 + 1)) is Readiness.FAILED


def test_the_deadline_ends_the_wait() -> None:
    assert judge(record(), beat(T0 + 20), None, now=T0 + 20) is Readiness.FAILED


@pytest.mark.parametrize(
    "current",
    [
        None,
        record(claim_token="exec#1#0"),
        record(threshold=T0 + 1),
    ],
    ids=["gone", "another worker's claim", "claim expired"],
)
def test_an_instance_no_longer_held_by_this_hand_off_has_failed(current: InstanceRecord | None) -> None:
    assert judge(current, beat(T0 + 1), signal(Signal.UD_REG_OK, T0 + 1)) is Readiness.FAILED


IDLE_AGAIN = record(InstanceState.IDLE, run_key=None, claim_token=None)


@pytest.mark.parametrize("kind", [Signal.UD_REG_OK, Signal.UD_REMOVE_REG_OK])
@pytest.mark.parametrize("token", [TOKEN, None], ids=["claimed", "created"])
def test_an_instance_released_after_its_runner_registered_is_ready_for_finish_to_count_lost(
    kind: Signal, token: str | None
) -> None:
    # Given a runner that registered after the hand-off, and a short job's release that made the instance
    # idle before this look / Then ready: Finish's activate loses it, so it is counted lost, not unserved
    assert judge(IDLE_AGAIN, beat(T0 + 1), signal(kind, T0 + 1), token=token) is Readiness.READY


@pytest.mark.parametrize(
    "latest",
    [None, signal(Signal.UD_REG_OK, T0 - 50), signal(Signal.UD_REG_OK, T0 + 1, "pool=8")],
    ids=["no signal", "an earlier hand-off's", "another run's"],
)
def test_an_instance_idle_again_without_registering_after_the_hand_off_has_failed(
    latest: WorkerSignal | None,
) -> None:
    assert judge(IDLE_AGAIN, beat(T0 + 1), latest) is Readiness.FAILED


# --- a claim of the stopped tier, started (issue 16, item 2) -----------------------------------------


def judge_started(heartbeat: Heartbeat | None, latest: WorkerSignal | None, now: float = T0 + 2) -> Readiness:
    return judge(record(), heartbeat, latest, now, starting=True)


def test_a_started_instance_whose_last_beat_is_from_before_its_stop_is_still_booting() -> None:
    # Given a started instance whose only heartbeat was written before its stop, long ago
    # When it is checked before the deadline / Then it is waiting, not failed: its OS is booting
    assert judge_started(beat(T0 - 3_600), None) is Readiness.WAITING


def test_a_started_instance_is_not_ready_on_a_beat_from_before_its_start_however_recent() -> None:
    # Given a beat written just before the start (within the healthy window) and a registration for the run
    # When it is checked / Then it is not ready: only a beat written after the start shows the agent is up
    assert judge_started(beat(T0 - 1), signal(Signal.UD_REG_OK, T0 + 1)) is Readiness.WAITING


def test_a_started_instance_beating_again_and_registered_is_ready() -> None:
    assert judge_started(beat(T0 + 1), signal(Signal.UD_REG_OK, T0 + 1)) is Readiness.READY


def test_a_started_instance_whose_new_heartbeat_went_stale_has_failed() -> None:
    # Given an agent that beat once after the start, then nothing for longer than the healthy window
    now = T0 + 1 + TIMEOUTS.healthy_window_seconds + 1
    assert judge_started(beat(T0 + 1), None, now=now) is Readiness.FAILED


def test_a_started_instance_that_never_registers_fails_at_the_deadline() -> None:
    assert judge_started(None, None, now=T0 + 20) is Readiness.FAILED
