"""Step Functions' quotas against the largest provision the dispatcher starts: history events and the
largest state payload of a provision execution of PROVISION_LIMIT runners, measured on the real ASL in
moto's interpreter (emulator/step_functions_quotas.py counts them), against AWS's 25,000 events and
256 KiB. Cold creations on a manual clock: the happy path of every slot, plus the batch's validation."""

from __future__ import annotations

from bench.results import BenchTable
from emulator.harness.provision_world import output, provision_world
from emulator.step_functions_quotas import HISTORY_LIMIT_EVENTS, PAYLOAD_LIMIT_BYTES, install
from runner_pool.domain.executions import PROVISION_LIMIT

WORST_SLOT_EVENTS = 220
"""A slot that polls its claim for the whole claim registration and claims once more (demand.py)."""


SMALL = {"batches": (3, 8)}
"""`make test`'s size (tests/integration/test_quota_bench.py): two small provisions."""


def run(batches: tuple[int, ...] = (10, PROVISION_LIMIT)) -> BenchTable:
    watch = install()
    measured: list[tuple[int, int, int]] = []
    with provision_world() as world:
        for number, runners in enumerate(batches):
            watch.reset_largest()
            result = output(world.provision(f"pool={7000 + number}", runners))
            if len(result["cold"]) != runners:
                raise AssertionError(f"{runners} runners asked, {len(result['cold'])} created: {result}")
            measured.append((runners, watch.largest_history_events, watch.largest_payload_bytes))
        breaches = watch.take_violations()
    table = BenchTable(
        "Step Functions quotas: a provision of cold runners, real ASL in moto's interpreter",
        ("runners", "history events", "largest state payload (bytes)"),
    )
    for runners, events, payload in measured:
        table.row(runners, events, payload)
    (small, small_events, small_payload), (large, large_events, large_payload) = measured[0], measured[-1]
    per_slot_events = (large_events - small_events) / max(1, large - small)
    per_slot_bytes = (large_payload - small_payload) / max(1, large - small)
    worst = large_events + large * (WORST_SLOT_EVENTS - per_slot_events)
    table.figure("quotas_largest_batch_runners_count", large)
    table.figure("quotas_largest_batch_history_events_count", large_events)
    table.figure("quotas_largest_batch_payload_bytes", large_payload)
    table.figure("quotas_history_events_per_runner_count", round(per_slot_events, 1))
    table.figure("quotas_payload_bytes_per_runner_count", round(per_slot_bytes, 1))
    table.figure("quotas_worst_case_history_events_count", round(worst))
    table.note(
        f"per runner: {per_slot_events:.1f} events and {per_slot_bytes:.0f} bytes; at {large} runners (the "
        f"dispatcher's cap) the worst case, every slot polling its claim for the whole registration, "
        f"comes to about {worst:,.0f} events of AWS's {HISTORY_LIMIT_EVENTS:,}; the largest payload is "
        f"{large_payload:,} of {PAYLOAD_LIMIT_BYTES:,} bytes"
    )
    if breaches:
        table.note("QUOTA BREACHED: " + "; ".join(breaches))
    return table
