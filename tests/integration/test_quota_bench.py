"""`make bench quotas`, small: the figures PROVISION_LIMIT's sizing rests on still hold."""

from __future__ import annotations

from bench import quotas
from emulator.step_functions_quotas import HISTORY_LIMIT_EVENTS, PAYLOAD_LIMIT_BYTES
from runner_pool.domain.executions import PROVISION_LIMIT


def test_the_largest_provision_stays_within_half_of_each_step_functions_quota() -> None:
    # Given provisions of 3 and 8 cold runners, measured on the real ASL
    table = quotas.run(**quotas.SMALL)
    figures = table.figures
    # Then no quota was breached, and a runner costs what executions.PROVISION_LIMIT's arithmetic assumes
    assert not any("QUOTA BREACHED" in note for note in table.notes), table.notes
    per_runner = figures["quotas_history_events_per_runner_count"]
    assert per_runner <= 20, per_runner
    # And at the cap, even with every slot on its worst path, the history is within half the quota
    worst = figures["quotas_largest_batch_history_events_count"] + PROVISION_LIMIT * quotas.WORST_SLOT_EVENTS
    assert worst <= HISTORY_LIMIT_EVENTS / 2, worst
    assert PROVISION_LIMIT * figures["quotas_payload_bytes_per_runner_count"] <= PAYLOAD_LIMIT_BYTES / 2
