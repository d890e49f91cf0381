"""Step Functions' quotas against the largest executions the control plane starts, measured on the real ASL
in moto's interpreter (emulator/step_functions_quotas.py counts them), against AWS's 25,000 events and
256 KiB: a provision execution of PROVISION_LIMIT runners (cold creations on a manual clock: the happy
path of every slot, plus the batch's validation), and the release of a cancelled run whose every job's
runner is still waiting (every instance held, none with a job done), split into parts
(domain.release.release_part_size)."""

from __future__ import annotations

from bench.results import BenchTable
from emulator.harness.control_plane import LocalControlPlane, LocalStateMachine, local_control_plane
from emulator.harness.provision_world import output, provision_world
from emulator.harness.release_world import ReleaseAgents, run_release
from emulator.step_functions import Execution
from emulator.step_functions_quotas import HISTORY_LIMIT_EVENTS, PAYLOAD_LIMIT_BYTES, install
from runner_pool.domain.executions import PROVISION_LIMIT, ReleaseRequest
from runner_pool.domain.release import receipt_checks, release_part_size

WORST_SLOT_EVENTS = 220
"""A slot that polls its claim for the whole claim registration and claims once more (demand.py)."""


SMALL = {"batches": (3, 8), "release_instances": 30}
"""`make test`'s size (tests/integration/test_quota_bench.py): two small provisions, and a run's release of
two parts."""

RELEASED_RUN = "pool=8000"


def run(batches: tuple[int, ...] = (10, PROVISION_LIMIT), release_instances: int = 256) -> BenchTable:
    table = _provisions(batches)
    _release(table, release_instances)
    return table


def _provisions(batches: tuple[int, ...]) -> BenchTable:
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


def _release(table: BenchTable, instances: int) -> None:
    """A cancelled run holding `instances` instances released, every part to its end. Then what that rests on:
    the release of a run holding nothing (an execution's own events), of one instance whose agent answers (an
    instance's), and of one whose agent never does (a receipt check's)."""
    watch = install()
    with local_control_plane(pause=lambda _seconds: None) as local:
        timeouts = local.config.timeouts
        release = local.deploy("release")
        agents = ReleaseAgents(local)
        for record in local.running(RELEASED_RUN, count=instances):
            agents.serve(record.instance_id, RELEASED_RUN)
        request = ReleaseRequest(run_key=RELEASED_RUN, cause="run-8000-attempt-1")
        released = run_release(
            release, request.model_dump(mode="json"), on_wait=agents.on_wait, timeout_seconds=600
        )
        failed = [e.status for e in released.executions if e.status != "SUCCEEDED"]
        given_back = sum(len(e.output.get("released", [])) for e in released.executions)
        if failed or given_back != instances:
            raise AssertionError(
                f"{instances} held, {given_back} given back; executions not succeeded: {failed}"
            )
        largest = max(len(execution.events) for execution in released.executions)
        empty = _released(local, release, 0, ReleaseAgents(local))
        answered = _released(local, release, 1, ReleaseAgents(local))
        silent = _released(local, release, 1, ReleaseAgents(local, answer=None))
    breaches = watch.take_violations()
    part_size = release_part_size(timeouts)
    own = len(empty.events)
    per_instance = len(answered.events) - own
    per_check = (len(silent.events) - len(answered.events)) / max(1, _checks(silent) - _checks(answered))
    worst = own + part_size * (per_instance + (receipt_checks(timeouts) - _checks(answered)) * per_check)
    table.row(f"release of {instances} held ({len(released.parts)} parts of <= {part_size})", largest, "")
    table.figure("quotas_largest_release_history_events_count", largest)
    table.figure("quotas_release_parts_count", len(released.parts))
    table.figure("quotas_release_part_instances_count", part_size)
    table.figure("quotas_release_execution_history_events_count", own)
    table.figure("quotas_release_history_events_per_instance_count", per_instance)
    table.figure("quotas_release_history_events_per_receipt_check_count", round(per_check, 1))
    table.figure("quotas_release_worst_case_history_events_count", round(worst))
    table.note(
        f"a cancelled run of {instances} held instances is released in {len(released.parts)} parts; the "
        f"largest execution's history is {largest:,} events of AWS's {HISTORY_LIMIT_EVENTS:,}. A part's "
        f"worst case, every agent silent so each instance is checked {receipt_checks(timeouts)} times "
        f"({per_check:.0f} events a check, {per_instance} an instance with one check, {own} the "
        f"execution's own), is about {worst:,.0f}"
    )
    if breaches:
        table.note("QUOTA BREACHED: " + "; ".join(breaches))


def _released(
    local: LocalControlPlane, release: LocalStateMachine, count: int, agents: ReleaseAgents
) -> Execution:
    """The release of a run of its own holding `count` instances, their agents answering as `agents` do."""
    run_key = f"pool={8001 + len(local.table.live())}"
    for record in local.running(run_key, count=count) if count else []:
        agents.serve(record.instance_id, run_key)
    request = ReleaseRequest(run_key=run_key, cause=f"run-{run_key}")
    return run_release(release, request.model_dump(mode="json"), on_wait=agents.on_wait).execution


def _checks(execution: Execution) -> int:
    """How many times the execution looked for a receipt."""
    return sum(
        1
        for event in execution.events
        if event["type"] == "TaskStateEntered" and event["stateEnteredEventDetails"]["name"] == "CheckReceipt"
    )
