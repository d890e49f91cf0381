"""The follow-up batches of the demand ledger over DynamoDB: one item per (repository, run key), moved
through domain.follow_up's states by one conditional write per transition.

    batch#<sha256 of repository, run key>
                                    the run key's follow-up batch (domain.follow_up): state (its
                                    FollowUpState), repository, run_key, opened_at, closes_at,
                                    limit_at; once a dispatch joins, leader and lease_until, joined_at
                                    (its first join) and joins (how many dispatches joined), jobs and
                                    public_jobs (number sets); started: when its provisions started

Each transition is one write conditioned on the states it starts from (TRANSITION_CONDITIONS). The items
live in the ledger's table (adapters.demand_ledger) and expire after BATCH_RETENTION_SECONDS.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.ledger_items import EXPIRY_ATTRIBUTE, KEY_ATTRIBUTE, number
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.follow_up import (
    TRANSITIONS,
    Arrival,
    BatchRole,
    BatchTurn,
    FollowUp,
    FollowUpState,
    FollowUpTransition,
    Sealing,
    WindowSpan,
    follow_up_closes_at,
    next_follow_up_closes_at,
    next_move,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

BATCH_RETENTION_SECONDS = 24 * 3600
"""A follow-up window is over in seconds; its item is kept a day, for an operator to look at."""
TURN_ATTEMPTS = 3
"""Each lost race of take_turn moves the item on (opened, joined, sealed); after three, dispatch apart."""

STATE_ATTRIBUTE = "state"
"""The follow-up batch's FollowUpState, on its item."""
_LEGACY_MARKERS = ("leader", "sealed", "started")
"""The attributes whose presence told a follow-up's state before its state was stored (legacy_state)."""

TRANSITION_CONDITIONS: Mapping[FollowUpTransition, str] = {
    FollowUpTransition.OPEN: (
        "attribute_not_exists(#id) OR (#state = :state_started AND started <= :quiet) "
        "OR (#state = :state_open AND closes_at <= :quiet)"
    ),
    FollowUpTransition.LEAD_NEXT: (
        "opened_at = :opened AND (#state = :state_started OR (#state = :state_open AND closes_at < :now))"
    ),
    FollowUpTransition.JOIN: (
        "(#state = :state_open AND closes_at >= :now) OR (#state = :state_led AND lease_until >= :now)"
    ),
    FollowUpTransition.TAKE_OVER: "(#state = :state_led OR #state = :state_sealed) AND lease_until < :now",
    FollowUpTransition.SEAL: "#state = :state_led AND leader = :me AND closes_at <= :now",
    FollowUpTransition.SEAL_STARTED: "#state = :state_led AND leader = :me AND closes_at <= :now",
    FollowUpTransition.MARK_STARTED: "#state = :state_sealed AND leader = :me",
}
"""The condition of each follow-up transition's one write: the states TRANSITIONS lets it start from
(`:state_<state>`; `attribute_not_exists(#id)` for none), and the times that make it due:
    OPEN          no follow-up is pending, and the last one started (or its window closed unjoined) long
                  enough ago that this demand is not the same burst (`:quiet`)
    LEAD_NEXT     the window seen (by when it opened) is over: its follow-up started, or nobody joined it
    JOIN          the window is open, or its live leader has not sealed it yet
    TAKE_OVER     its leader's lease passed before the follow-up started
    SEAL(_STARTED) its leader closes it once its window closed
    MARK_STARTED  its leader started it"""


def legacy_state(item: Mapping[str, Any]) -> FollowUpState:
    """The state of a follow-up item written before states were stored, by the attributes it has: the
    only place a state is inferred (items of a running stack outlive the change by a day)."""
    if "started" in item:
        return FollowUpState.STARTED
    if "sealed" in item:
        return FollowUpState.SEALED
    if "leader" in item:
        return FollowUpState.LED
    return FollowUpState.OPEN


def _state(item: Mapping[str, Any]) -> FollowUpState:
    stored = item.get(STATE_ATTRIBUTE, {}).get("S")
    return legacy_state(item) if stored is None else FollowUpState(stored)


class FollowUpBatches:
    """The follow-up batch items of the ledger's table (the DemandLedger port's take_turn, seal and
    follow_up_started)."""

    def __init__(self, table_name: str, clock: Clock, client: DynamoDBClient) -> None:
        self._table = table_name
        self._clock = clock
        self._client = client

    def take_turn(self, repository: str, run_key: str, *, arrival: Arrival, span: WindowSpan) -> BatchTurn:
        key = {KEY_ATTRIBUTE: {"S": _batch(repository, run_key)}}
        for _ in range(TURN_ATTEMPTS):
            now = self._clock.now()
            window = _Window(
                now, now + span.window_seconds, now + span.limit_seconds, now - span.quiet_seconds
            )
            current = self._open(key, repository, run_key, window)
            if current is None:
                return BatchTurn(BatchRole.FIRST, closes_at=window.closes_at)
            move = next_move(
                _state(current),
                now=now,
                closes_at=_epoch(current, "closes_at"),
                lease_until=_epoch(current, "lease_until") if "lease_until" in current else None,
            )
            if move is None:
                return BatchTurn(BatchRole.WAITING)  # its leader is starting it right now
            if move is FollowUpTransition.LEAD_NEXT:
                # The same burst goes on: these jobs open the next follow-up, and this dispatch leads it.
                paced = next_follow_up_closes_at(
                    now,
                    last_closed_at=_epoch(current, "closes_at"),
                    limit_at=window.limit_at,
                    window_seconds=span.window_seconds,
                )
                next_window = _Window(now, paced, window.limit_at, window.quiet_before)
                turn = self._lead_next(key, current, next_window, arrival)
            elif move is FollowUpTransition.TAKE_OVER:
                turn = self._take_over(key, arrival, now)
            else:
                closes_at = follow_up_closes_at(
                    now,
                    closes_at=_epoch(current, "closes_at"),
                    limit_at=_epoch(current, "limit_at"),
                    joined_at=_epoch(current, "joined_at") if "joined_at" in current else None,
                    joined=int(current.get("joins", {}).get("N", "0")),
                    window_seconds=span.window_seconds,
                    opened_at=_epoch(current, "opened_at"),
                )
                turn = self._join(key, arrival, now, closes_at)
            if turn is not None:
                return turn
        return BatchTurn(BatchRole.WAITING)

    def _open(
        self, key: dict[str, Any], repository: str, run_key: str, window: _Window
    ) -> dict[str, Any] | None:
        """OPEN: a new follow-up window when none is pending and the last burst is quiet; None when
        opened, else the item as it is."""
        written = self._transition(
            FollowUpTransition.OPEN,
            Key=key,
            UpdateExpression=(
                "SET #state = :to, repository = :repository, run_key = :run_key, opened_at = :now, "
                "closes_at = :closes, limit_at = :limit, #expiry = :expiry "
                "REMOVE leader, lease_until, joined_at, joins, sealed, started, jobs, public_jobs"
            ),
            ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
            ExpressionAttributeValues={
                ":repository": {"S": repository},
                ":run_key": {"S": run_key},
                ":now": {"N": number(window.now)},
                ":closes": {"N": number(window.closes_at)},
                ":limit": {"N": number(window.limit_at)},
                ":quiet": {"N": number(window.quiet_before)},
                ":expiry": {"N": str(int(window.now + BATCH_RETENTION_SECONDS))},
            },
        )
        return None if written.applied else written.item

    def _lead_next(
        self, key: dict[str, Any], seen: dict[str, Any], window: _Window, jobs: Arrival
    ) -> BatchTurn | None:
        """LEAD_NEXT: the next follow-up of a burst that goes on, with these jobs in it and their holder
        leading it; None when the item moved on since it was `seen`."""
        values: dict[str, Any] = {
            **_arrival_values(jobs),
            ":opened": seen.get("opened_at", {"N": "0"}),
            ":now": {"N": number(window.now)},
            ":closes": {"N": number(window.closes_at)},
            ":limit": {"N": number(window.limit_at)},
        }
        update = (
            "SET #state = :to, opened_at = :now, joined_at = :now, joins = :one, closes_at = :closes, "
            "limit_at = :limit, jobs = :jobs, leader = :me, lease_until = :lease"
        )
        if jobs.public_ids:
            update += ", public_jobs = :public REMOVE sealed, started"
        else:
            update += " REMOVE sealed, started, public_jobs"
        written = self._transition(
            FollowUpTransition.LEAD_NEXT,
            Key=key,
            UpdateExpression=update,
            ExpressionAttributeValues=values,
        )
        return BatchTurn(BatchRole.LEADER, window.closes_at) if written.applied else None

    def _join(self, key: dict[str, Any], jobs: Arrival, now: Epoch, closes_at: Epoch) -> BatchTurn | None:
        """JOIN: the jobs added to the open follow-up, whose window each join keeps open a little longer
        (`closes_at`, follow_up_closes_at); the first to join leads it. None when the item moved on."""
        values = {**_arrival_values(jobs), ":now": {"N": number(now)}, ":closes": {"N": number(closes_at)}}
        written = self._transition(
            FollowUpTransition.JOIN,
            Key=key,
            UpdateExpression=(
                f"{_additions(jobs)} SET #state = :to, leader = if_not_exists(leader, :me), "
                "lease_until = if_not_exists(lease_until, :lease), "
                "joined_at = if_not_exists(joined_at, :now), closes_at = :closes"
            ),
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
        )
        if not written.applied:
            return None
        leads = written.item.get("leader", {}).get("S") == jobs.holder
        return BatchTurn(BatchRole.LEADER if leads else BatchRole.JOINED, _epoch(written.item, "closes_at"))

    def _take_over(self, key: dict[str, Any], jobs: Arrival, now: Epoch) -> BatchTurn | None:
        """TAKE_OVER: the jobs added to a follow-up whose leader's lease passed, sealed, with their holder
        leading it (it starts now); None when the item moved on."""
        written = self._transition(
            FollowUpTransition.TAKE_OVER,
            Key=key,
            UpdateExpression=f"{_additions(jobs)} SET #state = :to, leader = :me, lease_until = :lease",
            ExpressionAttributeValues={**_arrival_values(jobs), ":now": {"N": number(now)}},
            ReturnValues="ALL_NEW",
        )
        if not written.applied:
            return None
        return BatchTurn(BatchRole.TAKEN_OVER, _epoch(written.item, "closes_at"), _follow_up(written.item))

    def seal(self, repository: str, run_key: str, holder: str, *, started: bool = False) -> Sealing:
        now = self._clock.now()
        values: dict[str, Any] = {":me": {"S": holder}, ":now": {"N": number(now)}}
        transition = FollowUpTransition.SEAL_STARTED if started else FollowUpTransition.SEAL
        written = self._transition(
            transition,
            Key={KEY_ATTRIBUTE: {"S": _batch(repository, run_key)}},
            UpdateExpression="SET #state = :to" + (", started = :now" if started else ""),
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
        )
        if written.applied:
            return Sealing(follow_up=_follow_up(written.item))
        current, state = written.item, _state(written.item)
        leads = current.get("leader", {}).get("S") == holder
        if leads and (state is FollowUpState.SEALED or (started and state is FollowUpState.STARTED)):
            # Sealed by our own write, whose answer was lost (with `started`, unless the item has
            # moved on to the next follow-up since: then its jobs are reconciliation's to find).
            return Sealing(follow_up=_follow_up(current))
        ours = leads and state is not FollowUpState.STARTED
        return Sealing(closes_at=_epoch(current, "closes_at") if ours else None)

    def follow_up_started(self, repository: str, run_key: str, holder: str) -> None:
        self._transition(
            FollowUpTransition.MARK_STARTED,
            Key={KEY_ATTRIBUTE: {"S": _batch(repository, run_key)}},
            UpdateExpression="SET #state = :to, started = :now",
            ExpressionAttributeValues={":now": {"N": number(self._clock.now())}, ":me": {"S": holder}},
        )

    def _transition(self, transition: FollowUpTransition, **update: Any) -> _Written:
        """One follow-up transition: one conditional write of TRANSITION_CONDITIONS[transition] that
        sets the state TRANSITIONS names. Not applied: the item as it was (once brought to a stored state,
        should it be an item written before states were, and tried again)."""
        condition = TRANSITION_CONDITIONS[transition]
        names = {"#state": STATE_ATTRIBUTE, **update.pop("ExpressionAttributeNames", {})}
        if "#id" in condition:
            names["#id"] = KEY_ATTRIBUTE
        named = set(re.findall(r":\w+", condition))
        values = {
            **update.pop("ExpressionAttributeValues"),
            ":to": {"S": TRANSITIONS[transition].target},
            **{f":state_{state}": {"S": state} for state in FollowUpState if f":state_{state}" in named},
        }
        write = {
            "TableName": self._table,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            **update,
        }
        written = self._write(write)
        if not written.applied and written.item and STATE_ATTRIBUTE not in written.item:
            self._store_state(write["Key"], written.item)
            written = self._write(write)
        return written

    def _write(self, write: dict[str, Any]) -> _Written:
        response = conditional_write(lambda: self._client.update_item(**write))
        if isinstance(response, Refusal):
            return _Written(applied=False, item=dict(response.item))
        return _Written(applied=True, item=response.get("Attributes", {}))

    def _store_state(self, key: dict[str, Any], item: dict[str, Any]) -> None:
        """Store the state of an item written before states were (legacy_state), unless it changed since
        it was read."""
        unchanged = ["attribute_not_exists(#state)"] + [
            f"attribute_exists({name})" if name in item else f"attribute_not_exists({name})"
            for name in _LEGACY_MARKERS
        ]
        values = {":state": {"S": legacy_state(item)}}
        if "opened_at" in item:
            unchanged.append("opened_at = :opened")
            values[":opened"] = item["opened_at"]
        conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression="SET #state = :state",
                ConditionExpression=" AND ".join(unchanged),
                ExpressionAttributeNames={"#state": STATE_ATTRIBUTE},
                ExpressionAttributeValues=values,
            )
        )


@dataclass(frozen=True)
class _Written:
    """What a transition's write found: applied (the item after), or not (the item as it was)."""

    applied: bool
    item: dict[str, Any]


def _additions(arrival: Arrival) -> str:
    """The ADD clause that puts an arrival's jobs in the follow-up and counts its join."""
    return "ADD jobs :jobs, joins :one" + (", public_jobs :public" if arrival.public_ids else "")


def _arrival_values(arrival: Arrival) -> dict[str, Any]:
    values: dict[str, Any] = {
        ":one": {"N": "1"},
        ":jobs": {"NS": [str(job_id) for job_id in arrival.job_ids]},
        ":me": {"S": arrival.holder},
        ":lease": {"N": number(arrival.lease_until)},
    }
    if arrival.public_ids:
        values[":public"] = {"NS": [str(job_id) for job_id in arrival.public_ids]}
    return values


@dataclass(frozen=True)
class _Window:
    """A take_turn's times: now, when a window opened now closes and reaches its limit, and before when
    the run key's last burst must have ended for this demand to be a first."""

    now: Epoch
    closes_at: Epoch
    limit_at: Epoch
    quiet_before: Epoch

    @classmethod
    def opened(cls, now: Epoch, span: WindowSpan) -> _Window:
        return cls(now, now + span.window_seconds, now + span.limit_seconds, now - span.quiet_seconds)


def _batch(repository: str, run_key: str) -> str:
    # Hashed: a run key with many labels can outgrow a partition key (2048 bytes); the item keeps both.
    return "batch#" + hashlib.sha256(f"{repository}\n{run_key}".encode()).hexdigest()


def _epoch(item: Any, name: str) -> Epoch:
    return float(item.get(name, {}).get("N", "0"))


def _follow_up(item: Any) -> FollowUp:
    return FollowUp(
        frozenset(int(job_id) for job_id in item.get("jobs", {}).get("NS", [])),
        frozenset(int(job_id) for job_id in item.get("public_jobs", {}).get("NS", [])),
    )
