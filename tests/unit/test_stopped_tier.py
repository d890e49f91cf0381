"""Which idle instances refresh stops, for how long, and which stopped ones a request may start (issue 16,
item 2; domain/stopped_tier.py)."""

from __future__ import annotations

from typing import Any

import pytest

from runner_pool.domain.config import StackConfig
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import Taker
from runner_pool.domain.records import InstanceRecord, Signal, UsageClass, WorkerSignal
from runner_pool.domain.stopped_tier import (
    awaiting_stop,
    clean_to_stop,
    fits,
    in_order_of_use,
    launched_for_tier,
    stopped_shortfall,
    stopped_until,
    surplus_stopped,
    to_stop,
)
from runner_pool.domain.trust import TrustLevel
from tests.support.builders import facts

NOW = 1_800_000_000.0
CONFIG = StackConfig.model_validate({"pool": {"stopped_maximum": 2}})
LEAD = CONFIG.refresh_rate_minutes * 60.0


def record(number: int, state: InstanceState = InstanceState.IDLE, **fields: Any) -> InstanceRecord:
    shape = {
        key: fields.pop(key) for key in ("usage_class", "resource_class", "instance_type") if key in fields
    }
    values: dict[str, Any] = {
        "state": state,
        "threshold": NOW + 30,
        "created_at": NOW - 600,
        "updated_at": NOW,
        **fields,
    }
    base = facts(number, usage_class=shape.pop("usage_class", UsageClass.ON_DEMAND), **shape)
    return InstanceRecord(**base.model_dump(), **values)


def ids(records: list[InstanceRecord]) -> list[str]:
    return [r.instance_id for r in records]


def test_idle_on_demand_instances_ending_before_the_next_run_are_stopped_soonest_first() -> None:
    # Given three idle on-demand instances ending within the lead, and room for two
    later, sooner, soonest = (
        record(1, threshold=NOW + 50),
        record(2, threshold=NOW + 20),
        record(3, threshold=NOW + 5),
    )
    # When refresh chooses / Then the two that end first, in that order
    assert ids(to_stop([later, sooner, soonest], CONFIG, NOW)) == ids([soonest, sooner])


def test_instances_already_in_the_tier_take_its_room() -> None:
    stopped = record(1, InstanceState.STOPPED, threshold=NOW + 3600)
    stopping = record(2, InstanceState.STOPPING, threshold=NOW + 600)
    assert to_stop([stopped, stopping, record(3)], CONFIG, NOW) == []


def test_a_tier_member_past_its_time_leaves_room() -> None:
    ended = record(1, InstanceState.STOPPED, threshold=NOW - 1)
    assert ids(to_stop([ended, record(2), record(3)], CONFIG, NOW)) == ids([record(2), record(3)])


def test_each_class_has_its_own_room() -> None:
    larges = [record(n) for n in (1, 2, 3)]
    xlarge = record(4, resource_class="xlarge")
    assert ids(to_stop([*larges, xlarge], CONFIG, NOW)) == ids([*larges[:2], xlarge])


def test_spot_held_expired_and_not_yet_ending_instances_are_never_chosen() -> None:
    spot = record(1, usage_class=UsageClass.SPOT)
    held = record(2, InstanceState.RUNNING, run_key="pool=1")
    expired = record(3, threshold=NOW)
    not_yet = record(4, threshold=NOW + LEAD + 1)
    assert to_stop([spot, held, expired, not_yet], CONFIG, NOW) == []


def test_no_tier_stops_nothing() -> None:
    assert to_stop([record(1)], StackConfig(), NOW) == []


def test_an_agent_not_known_clean_gives_its_room_to_the_next() -> None:
    # Given three candidates of which the first's agent has not given its receipt
    dirty, first_clean, second_clean = record(1, threshold=NOW + 1), record(2), record(3)
    chosen = to_stop(
        [dirty, first_clean, second_clean], CONFIG, NOW, clean=lambda r: r.instance_id != dirty.instance_id
    )
    assert ids(chosen) == ids([first_clean, second_clean])


def test_clean_to_stop_needs_ud_ok_or_a_scrub_receipt() -> None:
    def said(signal: Signal) -> WorkerSignal:
        return WorkerSignal(instance_id=facts(1).instance_id, signal=signal, at=NOW)

    assert clean_to_stop(said(Signal.UD_OK))
    assert clean_to_stop(said(Signal.UD_REMOVE_REG_OK))
    assert not clean_to_stop(said(Signal.UD_REG_OK))
    assert not clean_to_stop(said(Signal.UD_REMOVE_REG_FAILED))
    assert not clean_to_stop(None)


def test_a_stop_lasts_its_max_age_but_never_past_the_instances_reuse_age() -> None:
    young = record(1, created_at=NOW)
    old = record(2, created_at=NOW - CONFIG.reuse.max_age_minutes * 60 + 100)
    assert stopped_until(young, CONFIG, NOW) == min(
        NOW + CONFIG.pool.stopped_max_age_minutes * 60, NOW + CONFIG.reuse.max_age_minutes * 60
    )
    assert stopped_until(old, CONFIG, NOW) == NOW + 100


def test_an_instance_whose_stop_would_end_before_the_next_run_is_not_stopped() -> None:
    nearly_too_old = record(1, created_at=NOW - CONFIG.reuse.max_age_minutes * 60 + LEAD / 2)
    assert to_stop([nearly_too_old], CONFIG, NOW) == []


def test_a_stopped_instance_fits_a_request_by_the_hot_pools_rule() -> None:
    spec = CONFIG.spec_for("pool=1/usage=on-demand/types=c7*")
    stopped = record(1, InstanceState.STOPPED, threshold=NOW + 3600, instance_type="c7i.large")
    other_type = record(2, InstanceState.STOPPED, threshold=NOW + 3600, instance_type="m6i.large")
    ended = record(3, InstanceState.STOPPED, threshold=NOW, instance_type="c7i.large")
    trusted = Taker("octo/repo", trust=TrustLevel.TRUSTED)
    assert fits(stopped, spec, NOW, trusted, CONFIG)
    assert not fits(other_type, spec, NOW, trusted, CONFIG)
    assert not fits(ended, spec, NOW, trusted, CONFIG)
    served = {"repository": "octo/repo", "jobs_served": 1, "trust": TrustLevel.TRUSTED}
    assert fits(stopped.model_copy(update=served), spec, NOW, trusted, CONFIG)
    served_elsewhere = stopped.model_copy(update=served | {"repository": "octo/other"})
    assert not fits(served_elsewhere, spec, NOW, trusted, CONFIG)


@pytest.mark.parametrize(
    ("served", "taker", "fit"),
    [
        (TrustLevel.TRUSTED, Taker("octo/repo", trust=TrustLevel.UNTRUSTED), False),
        (TrustLevel.UNTRUSTED, Taker("octo/repo", trust=TrustLevel.UNTRUSTED), True),
        (TrustLevel.TRUSTED, Taker("octo/repo", trust=TrustLevel.TRUSTED, single_use=True), False),
        (TrustLevel.TRUSTED, Taker("octo/repo", trust=TrustLevel.PRIVILEGED), False),
        (None, Taker("octo/repo", trust=TrustLevel.PRIVILEGED), True),
    ],
    ids=["across-levels", "same-level", "single-use", "privileged", "pristine-to-privileged"],
)
def test_a_stopped_instance_fits_only_jobs_that_may_follow_who_it_served(
    served: TrustLevel | None, taker: Taker, fit: bool
) -> None:
    # Given a stopped instance that served a job of `served` in octo/repo (None: it never served)
    spec = CONFIG.spec_for("pool=1/usage=on-demand")
    stopped = record(1, InstanceState.STOPPED, threshold=NOW + 3600)
    if served is not None:
        stopped = stopped.model_copy(update={"repository": "octo/repo", "jobs_served": 1, "trust": served})
    # When a request of `taker`'s jobs looks at it / Then it fits only when they may follow its last job
    assert fits(stopped, spec, NOW, taker, CONFIG) is fit


def test_a_request_tries_used_stopped_instances_before_pristine_ones() -> None:
    # Given a pristine and a used stopped instance, in the index's order
    pristine = record(1, InstanceState.STOPPED, threshold=NOW + 3600)
    used = record(2, InstanceState.STOPPED, threshold=NOW + 3600, jobs_served=3, trust=TrustLevel.TRUSTED)
    # When ordered for a request / Then the used one comes first: the pristine one is kept for single use
    assert ids(in_order_of_use([pristine, used])) == [used.instance_id, pristine.instance_id]


# --- the stopped minimum: what refresh launches for it -------------------------------------------------

MINIMUM = StackConfig.model_validate(
    {
        "defaults": {"usage": "on-demand"},
        "pool": {"stopped_maximum": 3},
        "warm_pool_minimum": {"large": {"hot": 1, "stopped": 3}},
    }
)


def for_tier(number: int, state: InstanceState = InstanceState.CREATED, **fields: Any) -> InstanceRecord:
    return record(number, state, for_stopped_tier=True, threshold=NOW + 600, **fields)


def test_the_shortfall_is_the_minimum_less_the_tier_and_those_launched_for_it() -> None:
    # Given one stopped, one stopping past its time (due), one booting for the tier and one hot idle
    stopped = record(1, InstanceState.STOPPED, threshold=NOW + 3600)
    due = record(2, InstanceState.STOPPING, threshold=NOW - 1)
    booting = for_tier(3)
    hot = record(4, threshold=NOW + 600)
    # When refresh decides / Then it launches one more for the tier; the hot and the due one do not count
    assert stopped_shortfall([stopped, due, booting, hot], MINIMUM, NOW) == {"large": 1}


def test_one_launched_for_the_tier_and_admitted_counts_until_it_has_served() -> None:
    # Given three launched for the tier, admitted and waiting for their stop
    waiting = [for_tier(n, InstanceState.IDLE) for n in (1, 2, 3)]
    # When refresh decides / Then the minimum is met
    assert stopped_shortfall(waiting, MINIMUM, NOW) == {}
    assert all(awaiting_stop(r, NOW) for r in waiting)
    # And one that served a job (its mark stays; it is hot now) counts no more
    served = waiting[0].model_copy(update={"jobs_served": 1})
    assert stopped_shortfall([served, *waiting[1:]], MINIMUM, NOW) == {"large": 1}
    assert not launched_for_tier(served, NOW)


def test_a_pristine_stopped_floor_launches_what_the_tier_lacks_of_pristine_ones() -> None:
    # Given a tier of three (one pristine minimum of two among them) holding three used stopped instances
    config = StackConfig.model_validate(
        {
            "defaults": {"usage": "on-demand"},
            "pool": {"stopped_maximum": 5},
            "warm_pool_minimum": {"large": {"stopped": 3, "pristine_stopped": 2}},
        }
    )
    used = [record(n, InstanceState.STOPPED, threshold=NOW + 3600, jobs_served=1) for n in (1, 2, 3)]
    # When refresh decides / Then it launches two for the tier: the stopped minimum is met, the floor not
    assert stopped_shortfall(used, config, NOW) == {"large": 2}
    # And one booting for the tier counts toward the floor (what is launched for it is pristine)
    assert stopped_shortfall([*used, for_tier(4)], config, NOW) == {"large": 1}


def test_no_stopped_minimum_launches_nothing() -> None:
    # Given a stack with a tier but no stopped minimum, and an empty pool
    # When refresh decides / Then nothing is launched for it
    assert stopped_shortfall([], CONFIG, NOW) == {}
    assert stopped_shortfall([], StackConfig(), NOW) == {}


def test_those_launched_for_the_tier_take_its_room_from_idle_stops() -> None:
    # Given a tier of two, one instance booting for it and one stopped, and an idle instance ending now
    booting, stopped = for_tier(1), record(2, InstanceState.STOPPED, threshold=NOW + 3600)
    # When refresh chooses whom to stop / Then the ending one has no room: it is terminated as due
    assert to_stop([booting, stopped, record(3)], CONFIG, NOW) == []


def test_under_adaptive_sizing_the_tiers_room_is_the_rules_number() -> None:
    # Given three idle instances ending within the lead, a maximum of 2, and the rule wanting one stopped
    ending = [record(1, threshold=NOW + 5), record(2, threshold=NOW + 10), record(3, threshold=NOW + 15)]
    # Then one is stopped, the soonest; and with the rule wanting none, none is
    assert ids(to_stop(ending, CONFIG, NOW, tier={"large": 1})) == ids(ending[:1])
    assert to_stop(ending, CONFIG, NOW, tier={"large": 0}) == []


def test_stopped_instances_beyond_the_rules_number_are_taken_back_oldest_launched_first() -> None:
    # Given three stopped instances (one held by a claim starting it) and one stopping, and the rule wanting two
    until = {"threshold": NOW + 3600}
    oldest = record(1, InstanceState.STOPPED, created_at=NOW - 900, **until)
    older = record(2, InstanceState.STOPPED, created_at=NOW - 800, **until)
    held = record(3, InstanceState.STOPPED, created_at=NOW - 1000, run_key="pool=9", **until)
    stopping = record(4, InstanceState.STOPPING, created_at=NOW - 2000, **until)
    tier = [held, older, stopping, oldest]
    # Then the two beyond it are the oldest unheld stopped ones: a stopping one counts, but is not chosen
    assert ids(surplus_stopped(tier, {"large": 2}, NOW)) == ids([oldest, older])
    # And with the rule wanting all four, none is
    assert surplus_stopped(tier, {"large": 4}, NOW) == []
