"""`make bench quotas`, small: the figures PROVISION_LIMIT's sizing, and a release part's, rest on still hold."""

from __future__ import annotations

from typing import Any, cast

import pytest

from bench import quotas
from bench.results import BenchTable
from emulator.step_functions_quotas import HISTORY_LIMIT_EVENTS, PAYLOAD_LIMIT_BYTES
from runner_pool.domain.executions import PROVISION_LIMIT
from runner_pool.domain.release import (
    HISTORY_BUDGET_EVENTS,
    RECEIPT_CHECK_EVENTS,
    RELEASE_EXECUTION_EVENTS,
    RELEASE_INSTANCE_EVENTS,
)


@pytest.fixture(scope="module")
def table() -> BenchTable:
    # SMALL is run's keyword arguments, as bench/__main__.py passes them; bench types it only as a dict
    return quotas.run(**cast(dict[str, Any], quotas.SMALL))


def test_the_largest_provision_stays_within_half_of_each_step_functions_quota(table: BenchTable) -> None:
    # Given provisions of 3 and 8 cold runners, measured on the real ASL
    figures = table.figures
    # Then no quota was breached, and a runner costs what executions.PROVISION_LIMIT's arithmetic assumes
    assert not any("QUOTA BREACHED" in note for note in table.notes), table.notes
    per_runner = figures["quotas_history_events_per_runner_count"]
    assert per_runner <= 20, per_runner
    # And at the cap, even with every slot on its worst path, the history is within half the quota
    worst = figures["quotas_largest_batch_history_events_count"] + PROVISION_LIMIT * quotas.WORST_SLOT_EVENTS
    assert worst <= HISTORY_LIMIT_EVENTS / 2, worst
    assert PROVISION_LIMIT * figures["quotas_payload_bytes_per_runner_count"] <= PAYLOAD_LIMIT_BYTES / 2


def test_a_run_release_is_split_into_parts_each_within_half_the_history_quota_on_its_worst_path(
    table: BenchTable,
) -> None:
    # Given a cancelled run of 30 held instances released, every part to its end, on the real ASL
    figures = table.figures
    # Then it was given back in parts, and no quota was breached
    assert not any("QUOTA BREACHED" in note for note in table.notes), table.notes
    assert figures["quotas_release_parts_count"] == 2
    assert figures["quotas_largest_release_history_events_count"] <= HISTORY_LIMIT_EVENTS / 2
    # And an execution, an instance and a receipt check cost no more than release_part_size assumes ...
    assert figures["quotas_release_execution_history_events_count"] <= RELEASE_EXECUTION_EVENTS
    assert figures["quotas_release_history_events_per_receipt_check_count"] <= RECEIPT_CHECK_EVENTS
    per_instance = figures["quotas_release_history_events_per_instance_count"]
    assert per_instance <= RELEASE_INSTANCE_EVENTS + RECEIPT_CHECK_EVENTS, per_instance
    # ... so a part whose every agent is silent stays within half the quota
    assert figures["quotas_release_worst_case_history_events_count"] <= HISTORY_BUDGET_EVENTS
