"""What EC2's notices mean for a record (domain/interruptions.py), for every notice and every record."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.ec2_events import interruption_warning, rebalance_recommendation, state_change
from runner_pool.domain.interruptions import RESPONSES, Ec2Event, Notice, Response, respond
from runner_pool.domain.lifecycle import HELD_STATES, LIVE_STATES, UNHELD_STATES, InstanceState
from runner_pool.domain.records import InstanceRecord
from tests.support import builders

INSTANCE = "i-0123456789abcdef0"
WARNINGS = (Notice.INTERRUPTION, Notice.REBALANCE)
EC2_STATES = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")


def record(state: InstanceState, run_key: str | None = None) -> InstanceRecord:
    return InstanceRecord(
        **builders.facts(int(INSTANCE.removeprefix("i-"), 16), instance_type="m7i.large").model_dump(),
        state=state,
        run_key=run_key,
        threshold=None if state is InstanceState.TERMINATED else 2_000_000_000.0,
        claim_token="token" if state is InstanceState.CLAIMED else None,
        created_at=1_800_000_000.0,
        updated_at=1_800_000_000.0,
        expires_at=1_900_000_000 if state is InstanceState.TERMINATED else None,
    )


def event(notice: Notice, ec2_state: str = "terminated") -> Ec2Event:
    built: dict[str, Any] = {
        Notice.INTERRUPTION: interruption_warning(INSTANCE, 0),
        Notice.REBALANCE: rebalance_recommendation(INSTANCE, 0),
        Notice.STATE_CHANGE: state_change(INSTANCE, 0, ec2_state),
    }[notice]
    return Ec2Event.model_validate(built)


records = st.one_of(
    st.none(),
    st.sampled_from(sorted(UNHELD_STATES | {InstanceState.TERMINATED})).map(record),
    st.sampled_from(sorted(HELD_STATES)).map(lambda state: record(state, "pool=1")),
    st.booleans().map(lambda held: record(InstanceState.CREATED, "pool=1" if held else None)),
)


def test_every_warning_has_a_row_for_every_live_state() -> None:
    # Given the table / Then each warning covers each live state
    assert {(n, s) for n in WARNINGS for s in LIVE_STATES} == set(RESPONSES)


@given(st.sampled_from(list(Notice)), st.sampled_from(EC2_STATES), records)
def test_only_a_held_instance_is_marked_and_only_a_live_record_written(
    notice: Notice, ec2_state: str, found: InstanceRecord | None
) -> None:
    # Given any notice and any record (or none) / When it is judged
    row = respond(event(notice, ec2_state), found)
    # Then a record that is none of ours or terminated is left alone
    if found is None or found.state is InstanceState.TERMINATED:
        assert row.response is Response.NOTHING
    # And only the interruption warning of an instance a run holds marks it; a running job is never
    # expired by a warning
    if row.response in (Response.MARK_INTERRUPTED, Response.DISCARD):
        assert found is not None
        assert found.run_key is not None
        assert notice is Notice.INTERRUPTION
    if found is not None and found.state is InstanceState.RUNNING and notice in WARNINGS:
        assert row.response is not Response.EXPIRE


@pytest.mark.parametrize("notice", WARNINGS)
@pytest.mark.parametrize("state", sorted(UNHELD_STATES))
def test_an_instance_waiting_for_a_run_leaves_the_pool_on_either_warning(
    notice: Notice, state: InstanceState
) -> None:
    # Given an idle, stopping or stopped instance / When EC2 warns of it / Then it is expired
    assert respond(event(notice), record(state)).response is Response.EXPIRE


def test_an_instance_launched_for_the_pool_leaves_it_before_it_is_admitted() -> None:
    # Given an instance created for the pool (no run key) / When EC2 recommends rebalancing it
    row = respond(event(Notice.REBALANCE), record(InstanceState.CREATED))
    # Then it leaves the pool, said as such
    assert row.response is Response.EXPIRE
    assert "leaves the pool" in row.why


@pytest.mark.parametrize(
    ("ec2_state", "expected"), [("stopped", Response.NOTHING), ("terminated", Response.EXPIRE)]
)
def test_a_stopped_tier_instance_is_expired_only_when_it_goes_away(
    ec2_state: str, expected: Response
) -> None:
    # Given an instance of the stopped tier / When EC2 says it stopped, or terminated
    row = respond(event(Notice.STATE_CHANGE, ec2_state), record(InstanceState.STOPPED))
    # Then the stop was ours, the termination was not
    assert row.response is expected


def test_a_launch_or_start_says_nothing_new() -> None:
    # Given an idle instance / When EC2 says it is running / Then nothing is done
    assert (
        respond(event(Notice.STATE_CHANGE, "running"), record(InstanceState.IDLE)).response
        is Response.NOTHING
    )


def test_an_event_naming_no_instance_id_is_refused() -> None:
    # Given an event whose instance id is not one EC2 makes / When it is read / Then it fails validation
    bad = {**interruption_warning(INSTANCE, 0), "detail": {"instance-id": "not-an-instance"}}
    with pytest.raises(ValueError, match="instance-id"):
        Ec2Event.model_validate(bad)
