"""The follow-up batch's states (domain/follow_up.py): the transition table, what demand does with the
follow-up it finds, and the ledger's one conditional write per transition (adapters/demand_ledger.py)."""

from __future__ import annotations

import re

import pytest

from runner_pool.adapters.follow_up_batches import TRANSITION_CONDITIONS, legacy_state
from runner_pool.domain.follow_up import (
    TAKES_JOBS,
    TRANSITIONS,
    FollowUpState,
    FollowUpTransition,
    next_move,
)

NOW = 1_000.0


@pytest.mark.parametrize("transition", list(FollowUpTransition))
def test_each_transition_is_written_on_exactly_the_states_it_starts_from(
    transition: FollowUpTransition,
) -> None:
    # Given the condition of the transition's write
    condition = TRANSITION_CONDITIONS[transition]
    # When the states it names are read from it (no item at all: attribute_not_exists on the key)
    named: set[FollowUpState | None] = {FollowUpState(s) for s in re.findall(r":state_(\w+)", condition)}
    if "attribute_not_exists(#id)" in condition:
        named.add(None)
    # Then they are the sources of the transition table, no more, no fewer
    assert named == TRANSITIONS[transition].sources


def test_every_transition_has_one_write() -> None:
    # Given the transition table and the ledger's conditions
    # Then each transition has one condition, and each condition one transition
    assert set(TRANSITION_CONDITIONS) == set(TRANSITIONS) == set(FollowUpTransition)


def test_a_sealed_follow_up_never_takes_jobs_again_but_through_the_next_follow_up() -> None:
    # Given the moves that start from a sealed or started follow-up
    from_closed = {
        transition
        for transition, move in TRANSITIONS.items()
        if move.sources & {FollowUpState.SEALED, FollowUpState.STARTED} and move.target in TAKES_JOBS
    }
    # Then only opening a follow-up afresh (a first, or the next of the burst) leads back to taking jobs
    assert from_closed == {FollowUpTransition.OPEN, FollowUpTransition.LEAD_NEXT}
    # And joining never starts from a closed follow-up
    assert not TRANSITIONS[FollowUpTransition.JOIN].sources - TAKES_JOBS


@pytest.mark.parametrize(
    ("state", "closes_at", "lease_until", "move"),
    [
        (FollowUpState.OPEN, NOW + 1, None, FollowUpTransition.JOIN),
        (FollowUpState.OPEN, NOW, None, FollowUpTransition.JOIN),
        (FollowUpState.OPEN, NOW - 1, None, FollowUpTransition.LEAD_NEXT),
        (FollowUpState.LED, NOW + 1, NOW + 60, FollowUpTransition.JOIN),
        (FollowUpState.LED, NOW - 1, NOW + 60, FollowUpTransition.JOIN),
        (FollowUpState.LED, NOW - 1, NOW - 1, FollowUpTransition.TAKE_OVER),
        (FollowUpState.SEALED, NOW - 1, NOW + 60, None),
        (FollowUpState.SEALED, NOW - 1, NOW - 1, FollowUpTransition.TAKE_OVER),
        (FollowUpState.STARTED, NOW - 1, NOW + 60, FollowUpTransition.LEAD_NEXT),
    ],
)
def test_demand_of_the_same_burst_moves_the_follow_up_it_finds(
    state: FollowUpState, closes_at: float, lease_until: float | None, move: FollowUpTransition | None
) -> None:
    # Given a follow-up found in `state` by demand that is not a first
    # When that demand decides what to do
    decided = next_move(state, now=NOW, closes_at=closes_at, lease_until=lease_until)
    # Then it joins an open window, opens the next when it is over, takes over from a dead leader, or
    # waits (None) for one being started; and the move starts from the state found
    assert decided == move
    assert decided is None or state in TRANSITIONS[decided].sources


@pytest.mark.parametrize(
    ("attributes", "state"),
    [
        ({"opened_at"}, FollowUpState.OPEN),
        ({"opened_at", "leader", "lease_until"}, FollowUpState.LED),
        ({"opened_at", "leader", "sealed"}, FollowUpState.SEALED),
        ({"opened_at", "leader", "sealed", "started"}, FollowUpState.STARTED),
        ({"opened_at", "leader", "started"}, FollowUpState.STARTED),
    ],
)
def test_an_item_written_before_states_were_stored_is_read_by_its_attributes(
    attributes: set[str], state: FollowUpState
) -> None:
    # Given a follow-up item of a running stack, written without a state
    item = {name: {"N": "1"} for name in attributes}
    # Then its state is what its attributes meant
    assert legacy_state(item) is state
