"""How a state table transition is written: one conditional UpdateItem of the record, whose refusal
is told apart as a replay of the caller's own write or a race lost to another."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import (
    IDLE_SINCE_ATTRIBUTE,
    NOT_QUARANTINED,
    RUN_KEY_ATTRIBUTE,
    STATE_ITEM,
    THRESHOLD_ATTRIBUTE,
    attribute_value,
    readable_record,
)
from runner_pool.adapters.state_reads import StateReads
from runner_pool.domain.clock import Epoch
from runner_pool.domain.lifecycle import InstanceState, Outcome
from runner_pool.domain.records import InstanceRecord


@dataclass(frozen=True)
class TransitionResult:
    """The outcome of one transition and the record as it stands afterwards (None if there is none)."""

    outcome: Outcome
    record: InstanceRecord | None

    @property
    def succeeded(self) -> bool:
        return self.outcome.succeeded


class StateWrites(StateReads):
    def _to_idle(
        self,
        instance_id: str,
        from_state: InstanceState,
        run_key: str | None,
        claim_token: str | None = None,
        *,
        runner_id: int | None = None,
    ) -> TransitionResult:
        now = self._clock.now()
        return self._transition(
            instance_id,
            now,
            expect_states=(from_state,),
            expect_run_key=run_key,
            expect_claim_token=claim_token,
            expect_runner_id=runner_id,
            new_state=InstanceState.IDLE,
            threshold_in=self._timeouts.idle_seconds,
            remove_fields=(RUN_KEY_ATTRIBUTE, "claim_token"),
            is_replay=lambda r: (
                r.state is InstanceState.IDLE
                and r.run_key is None
                and not r.threshold_passed(now)
                and runner_id in (None, r.runner_id)
            ),
        )

    def _transition(
        self,
        instance_id: str,
        now: Epoch,
        *,
        expect_states: tuple[InstanceState, ...],
        expect_run_key: str | object | None,
        expect_claim_token: str | None = None,
        expect_runner_id: int | None = None,
        new_state: InstanceState | None,
        threshold_in: float,
        is_replay: Callable[[InstanceRecord], bool],
        set_fields: Mapping[str, Any] | None = None,
        remove_fields: tuple[str, ...] = (),
        extra_conditions: list[str] | None = None,
        extra_values: Mapping[str, Any] | None = None,
        count_job: bool = False,
        may_be_quarantined: bool = False,
        threshold_ahead: bool = True,
    ) -> TransitionResult:
        """One conditional UpdateItem: expected state, expected run key, threshold still ahead, and (but
        for expiry and quarantine) not quarantined.

        `is_replay` judges, at the same `now`, the record found when the condition fails. A replay
        is reported as success, so (but for expire) it must find the record still valid: once the
        threshold has passed, the call's effect has been overtaken and the instance is on its way out.
        """
        names = {"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE}
        values: dict[str, Any] = {
            ":now": attribute_value(now),
            ":threshold": attribute_value(now + threshold_in),
            **state_values(expect_states),
        }
        assignments = ["#threshold = :threshold", "updated_at = :now"]
        if new_state is not None:
            values[":new_state"] = attribute_value(new_state.value)
            assignments.append("#state = :new_state")
            # In by-idle exactly while idle: a state's every write passes here or names it itself.
            if new_state is InstanceState.IDLE:
                assignments.append(f"{IDLE_SINCE_ATTRIBUTE} = :now")
            else:
                remove_fields = (*remove_fields, IDLE_SINCE_ATTRIBUTE)
        for index, (name, value) in enumerate((set_fields or {}).items()):
            values[f":set{index}"] = attribute_value(value)
            assignments.append(f"{name} = :set{index}")
        if count_job:
            values |= {":zero": attribute_value(0), ":one": attribute_value(1)}
            assignments.append("jobs_served = if_not_exists(jobs_served, :zero) + :one")
        values |= dict(extra_values or {})
        conditions = [f"#state IN ({', '.join(state_placeholders(expect_states))})"]
        if threshold_ahead:
            conditions.append("#threshold > :now")
        if expect_run_key is None:
            conditions.append(f"attribute_not_exists({RUN_KEY_ATTRIBUTE})")
        elif isinstance(expect_run_key, str):
            values[":expected_run_key"] = attribute_value(expect_run_key)
            conditions.append(f"{RUN_KEY_ATTRIBUTE} = :expected_run_key")
        if expect_claim_token is not None:
            values[":expected_claim_token"] = attribute_value(expect_claim_token)
            conditions.append("claim_token = :expected_claim_token")
        if expect_runner_id is not None:
            values[":expected_runner_id"] = attribute_value(expect_runner_id)
            conditions.append("runner_id = :expected_runner_id")
        conditions += extra_conditions or []
        update = "SET " + ", ".join(assignments)
        if remove_fields:
            update += " REMOVE " + ", ".join(remove_fields)
        return self._write(
            instance_id,
            update=update,
            condition=" AND ".join(conditions),
            names=names,
            values=values,
            may_be_quarantined=may_be_quarantined,
            is_replay=is_replay,
        )

    def _write(
        self,
        instance_id: str,
        *,
        update: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any],
        is_replay: Callable[[InstanceRecord], bool],
        may_be_quarantined: bool = False,
    ) -> TransitionResult:
        """One conditional UpdateItem of the record. Without `may_be_quarantined`, a quarantined record
        fails the condition and is never taken for a replay. A record that does not parse, before or
        after, is no record: the write is LOST, with none."""
        if not may_be_quarantined:
            condition = f"{condition} AND {NOT_QUARANTINED}"
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=self._instance_key(instance_id, STATE_ITEM),
                UpdateExpression=update,
                ConditionExpression=f"attribute_exists(pk) AND {condition}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if isinstance(answer, Refusal):
            current = record_found(answer)
            if (
                current is not None
                and (may_be_quarantined or current.quarantined_at is None)
                and is_replay(current)
            ):
                return TransitionResult(Outcome.REPLAYED, current)
            return TransitionResult(Outcome.LOST, current)
        applied = readable_record(answer["Attributes"])
        return TransitionResult(Outcome.LOST if applied is None else Outcome.APPLIED, applied)


def record_found(refusal: Refusal) -> InstanceRecord | None:
    """The record a failed condition found (None if none, or none that parses)."""
    return readable_record(refusal.item) if refusal.item else None


def state_placeholders(states: tuple[InstanceState, ...] | frozenset[InstanceState]) -> list[str]:
    return [f":state_{state.value}" for state in sorted(states)]


def state_values(states: tuple[InstanceState, ...] | frozenset[InstanceState]) -> dict[str, Any]:
    return {f":state_{state.value}": attribute_value(state.value) for state in states}
