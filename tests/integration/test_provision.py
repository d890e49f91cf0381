"""The provision state machine: the real ASL in moto's interpreter, the real handlers, moto AWS, a fake GitHub.

After every scenario the accounting must hold: every instance with the stack's tag has a live record
and every live record an instance, so nothing was lost or leaked on any path.
"""

from __future__ import annotations

import json
from typing import Any

from emulator.harness.control_plane import client
from emulator.harness.provision_world import ProvisionWorld, output, provision_world
from emulator.harness.scripted_agents import Script
from emulator.step_functions import LambdaContext
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import REDRIVE_LIMIT
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.release import ReleaseItem, ReleaseStatus
from runner_pool.domain.trust import TrustLevel
from runner_pool.handlers import provision
from tests.support.waiting import eventually

RUN = "pool=4242"


def states(world: ProvisionWorld, instance_ids: list[str]) -> list[InstanceState]:
    records = [world.plane.state_table.get(instance_id) for instance_id in instance_ids]
    return [record.state for record in records if record is not None]


def live_records(world: ProvisionWorld, instance_ids: list[str]) -> list[InstanceRecord]:
    records = [world.plane.state_table.get(instance_id) for instance_id in instance_ids]
    return [record for record in records if record is not None]


def executions_once_settled(
    world: ProvisionWorld, timeout_seconds: float = 60, machine: str = "provision"
) -> list[dict[str, Any]]:
    """Every execution of the machine (also those its steps started: redrives), oldest first, each
    described with its input, once none is running any more."""
    stepfunctions = client("stepfunctions")
    arn = world.machine.arn if machine == "provision" else world.local.stack.machines[machine].arn

    def listed() -> list[dict[str, Any]]:
        executions: list[dict[str, Any]] = stepfunctions.list_executions(stateMachineArn=arn)["executions"]
        return executions

    eventually(
        lambda: all(e["status"] != "RUNNING" for e in listed()),
        f"every {machine} execution to end",
        timeout_seconds,
    )
    described = [stepfunctions.describe_execution(executionArn=e["executionArn"]) for e in listed()]
    return sorted(described, key=lambda e: e["startDate"])


def ec2_state(world: ProvisionWorld, instance_id: str) -> str:
    reservations = world.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def test_a_pool_with_enough_warm_instances_serves_every_runner_without_a_launch(
    world: ProvisionWorld,
) -> None:
    # Given three warm instances in the pool
    warm = [world.warm(n).instance_id for n in (1, 2, 3)]
    # When a run asks for three runners
    result = output(world.provision(RUN, 3))
    # Then all three were claimed, registered and set running for the run; nothing was launched
    assert sorted(result["warm"]) == sorted(warm)
    assert result["cold"] == []
    assert states(world, warm) == [InstanceState.RUNNING] * 3
    assert world.ec2.calls["CreateFleet"] == 0
    # And each instance's agent started its runner from a config it could decrypt
    assert sorted(instance for instance, _, _ in world.agents.registrations) == sorted(warm)


def test_a_pool_with_fewer_warm_instances_claims_them_and_creates_the_rest(world: ProvisionWorld) -> None:
    # Given one warm instance
    warm = world.warm(1).instance_id
    # When a run asks for three runners
    result = output(world.provision(RUN, 3))
    # Then the warm one was claimed and two were created with one CreateFleet, all running
    assert result["warm"] == [warm]
    assert len(result["cold"]) == 2
    assert world.ec2.calls["CreateFleet"] == 1
    assert states(world, [warm, *result["cold"]]) == [InstanceState.RUNNING] * 3


def test_an_empty_pool_creates_every_runner(world: ProvisionWorld) -> None:
    # Given an empty pool / When a run asks for two runners
    result = output(world.provision(RUN, 2))
    # Then both were created by one CreateFleet, registered and set running
    assert result["warm"] == []
    assert len(result["cold"]) == 2
    assert world.ec2.calls["CreateFleet"] == 1
    assert states(world, result["cold"]) == [InstanceState.RUNNING] * 2
    assert result["expired"] == []


def test_an_empty_pool_goes_straight_to_creation_without_a_claim_worker(world: ProvisionWorld) -> None:
    # Given an empty pool and no stopped tier / When a run asks for three runners
    result = output(world.provision(RUN, 3))
    # Then Begin's one look was the only one: no Claim invocation per slot before the launch
    assert len(result["cold"]) == 3
    assert world.invocations.of("provision-claim") == []
    assert len(world.invocations.of("provision-create")) == 1


def test_a_pool_with_one_instance_for_two_slots_still_runs_the_workers(world: ProvisionWorld) -> None:
    # Given one warm instance / When a run asks for two runners
    warm = world.warm(1).instance_id
    result = output(world.provision(RUN, 2))
    # Then a worker hands the claimed one over and checks it, and the other slot is created
    assert result["warm"] == [warm]
    assert len(result["cold"]) == 1
    assert len(world.invocations.of("provision-claim")) == 2


def test_a_candidate_with_a_stale_heartbeat_is_discarded_and_the_next_one_used(world: ProvisionWorld) -> None:
    # Given two warm instances, one of whose agents died after it was pooled
    dead = world.warm(1).instance_id
    alive = world.warm(2).instance_id
    world.agents.script(dead, Script.SILENT)
    world.clock.advance(world.plane.config.timeouts.healthy_window_seconds + 1)
    world.agents.act()
    # When a run asks for one runner
    result = output(world.provision(RUN, 1))
    # Then the live one serves it and the dead one was expired and terminated, not pooled again
    assert result["warm"] == [alive]
    dead_record = world.plane.state_table.get(dead)
    assert dead_record is not None
    assert dead_record.threshold_passed(world.clock.now())
    assert ec2_state(world, dead) in ("shutting-down", "terminated")


def test_a_candidate_that_never_registers_is_discarded_at_the_deadline(world: ProvisionWorld) -> None:
    # Given a warm instance whose agent beats but never starts its runner
    stuck = world.warm(1).instance_id
    world.agents.script(stuck, Script.NEVER_REGISTERS)
    # When a run asks for one runner
    result = output(world.provision(RUN, 1))
    # Then after the claim registration timeout it was discarded, and a new instance serves the run
    assert result["warm"] == []
    assert len(result["cold"]) == 1
    assert ec2_state(world, stuck) in ("shutting-down", "terminated")


def test_a_runner_that_fails_to_start_is_discarded_at_once(world: ProvisionWorld) -> None:
    # Given a warm instance whose runner fails to start, and a healthy one
    failing = world.warm(1).instance_id
    world.agents.script(failing, Script.FAILS_REGISTRATION)
    healthy = world.warm(2).instance_id
    # When a run asks for one runner
    result = output(world.provision(RUN, 1))
    # Then the failing one was discarded and the healthy one serves the run, warm
    assert result["warm"] == [healthy]
    assert ec2_state(world, failing) in ("shutting-down", "terminated")


def test_two_executions_racing_for_the_same_warm_instances_each_get_different_ones(
    world: ProvisionWorld,
) -> None:
    # Given two warm instances
    warm = {world.warm(n).instance_id for n in (1, 2)}
    # When two executions for two runners each run at the same time
    first, second = world.provision_concurrently([(RUN, 2), ("pool=4243", 2)])
    # Then every warm instance ended in exactly one of them, and the rest were created
    served = [output(first), output(second)]
    warm_hits = [i for result in served for i in result["warm"]]
    assert sorted(warm_hits) == sorted(warm)
    everything = warm_hits + [i for result in served for i in result["cold"]]
    assert len(everything) == len(set(everything)) == 4


def test_a_partial_spot_launch_is_completed_on_demand(world: ProvisionWorld) -> None:
    # Given EC2 has room for one more spot instance only
    world.ec2.set_capacity("spot", 1)
    # When a run asks for three spot runners
    result = output(world.provision(RUN, 3))
    # Then one was launched as spot, the remainder by the one on-demand fallback, all running
    assert len(result["cold"]) == 3
    assert world.ec2.calls["CreateFleet"] == 2
    usages = sorted(str(record.usage_class) for record in live_records(world, result["cold"]))
    assert usages == ["on-demand", "on-demand", "spot"]


def test_a_launch_short_of_capacity_reports_the_shortfall(world: ProvisionWorld) -> None:
    # Given EC2 has room for one instance in all
    world.ec2.set_capacity("spot", 1)
    world.ec2.set_capacity("on-demand", 0)
    # When a run asks for three runners
    result = output(world.provision(RUN, 3))
    # Then the one launched serves the run, and nothing is held for the other two
    assert len(result["cold"]) == 1
    assert result["warm"] == []
    assert result["expired"] == []


def test_an_unhandled_error_keeps_a_registered_runner_and_asks_again_for_the_rest(
    world: ProvisionWorld,
) -> None:
    # Given one warm instance, and EC2 refusing every CreateFleet
    warm = world.warm(1).instance_id
    world.ec2.fail_next(1000, "UnauthorizedOperation")
    # When a run asks for two runners (one must be created)
    execution = world.provision(RUN, 2)
    # Then the execution failed, but the warm instance, whose runner registered for the run, was
    # set running to serve one of its jobs (issue 13: dump never throws away a registered runner)
    assert execution.status == "FAILED"
    assert states(world, [warm]) == [InstanceState.RUNNING]
    assert ec2_state(world, warm) == "running"
    # And the one runner still missing was asked for again, a bounded number of times, each failing
    finished = executions_once_settled(world)
    redriven = sorted(json.loads(e["input"])["redrives"] for e in finished[1:])
    assert redriven == list(range(1, REDRIVE_LIMIT + 1))
    # (one runner each; two if a Dump retried under load no longer tells the instance it set running
    # from one of another execution: Step Functions Standard refuses that second start by its name,
    # moto does not)
    assert all(1 <= json.loads(e["input"])["count"] <= 2 for e in finished[1:])
    assert {e["status"] for e in finished} == {"FAILED"}


def snapshot(world: ProvisionWorld) -> tuple[object, ...]:
    """Everything a step can change: records, EC2 instances, pool messages, GitHub runners."""
    records = sorted(
        (r.instance_id, r.state, r.run_key, r.threshold, r.claim_token, r.runner_id)
        for r in world.plane.state_table.live()
    )
    instances = sorted(
        (i["InstanceId"], i["State"]["Name"])
        for page in world.ec2.describe_instances()["Reservations"]
        for i in page["Instances"]
    )
    queued = sorted(m.instance_id for m in world.pool_messages())
    return (records, instances, queued, world.ec2.launched, len(world.github.state.runners))


def test_every_step_run_twice_with_the_same_input_changes_nothing_more(world: ProvisionWorld) -> None:
    # Given one warm instance and a request for two runners, stepped through by hand
    world.warm(1)
    context = LambdaContext(
        "provision", "replayed", "arn:aws:lambda:us-east-1:123456789012:function:provision"
    )
    request = ProvisionRequest(trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key=RUN, count=2)

    def twice(step: str, event: dict[str, object]) -> dict[str, Any]:
        handler = getattr(provision, step)
        first = handler(event, context)
        before = snapshot(world)
        again = handler(event, context)
        # Then the second run changed nothing and answered the same
        assert snapshot(world) == before, step
        assert again == first, step
        return dict(first)

    # When each step runs twice with the same input
    plan = twice("begin", {"request": request.model_dump(mode="json"), "execution": "exec-1"})
    worker = twice("claim", {"plan": plan, "slot": 0})
    exhausted = twice("claim", {"plan": plan, "slot": 1})
    world.clock.advance(1)
    world.agents.act()
    ready = twice("check_claim", worker)
    workers = [
        {"slot": 0, "instance_id": ready["instance_id"], "claim_token": ready["claim_token"]},
        {"slot": 1, "instance_id": exhausted["instance_id"], "claim_token": None},
    ]
    creation = twice("create", {"plan": plan, "workers": workers})
    world.clock.advance(5)
    world.agents.act()
    checked = twice("check_fleet", {"plan": plan, "creation": creation})
    result = twice("finish", {"plan": plan, "workers": workers, "creation": checked})
    # And the run got its two runners
    assert len(result["warm"]) == 1
    assert len(result["cold"]) == 1


def test_a_run_that_finished_while_its_provision_was_under_way_hands_its_runners_to_a_release() -> None:
    with provision_world(with_release=True) as world:
        # Given one warm instance, and the run already finished (its release began) when provision ends
        warm = world.warm(1).instance_id
        world.plane.state_table.mark_run_finished(RUN)
        # When the provision for two runners runs
        result = output(world.provision(RUN, 2))
        # Then nothing was set running for the finished run, and nothing handed a runner was thrown away:
        # a short job may already have run on it (its completion delivered after the run's)
        assert (result["warm"], result["cold"], result["expired"]) == ([], [], [])
        assert ec2_state(world, warm) == "running"
        # But a release of the run was started, which ends both hand-offs like any others
        releases = executions_once_settled(world, machine="release")
        assert [json.loads(e["input"])["run_key"] for e in releases] == [RUN]
        assert json.loads(releases[0]["input"])["cause"].startswith("gave-up-provision-")
        released = json.loads(releases[0]["output"])["released"]
        assert len(released) == 2
        assert all(item["status"] != "salvaged" for item in released), released
        accounting = world.accounting()
        assert accounting.holds, accounting.problems


def test_a_created_instance_whose_short_job_ended_before_check_fleet_is_not_asked_for_again(
    world: ProvisionWorld,
) -> None:
    # Given an empty pool, and a provision for one runner stepped through by hand to its creation
    context = LambdaContext(
        "provision", "short-job", "arn:aws:lambda:us-east-1:123456789012:function:provision"
    )
    request = ProvisionRequest(trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key=RUN, count=1)
    plan = provision.begin({"request": request.model_dump(mode="json"), "execution": "exec-short"}, context)
    provision.claim({"plan": plan, "slot": 0}, context)
    workers = [{"slot": 0, "instance_id": None, "claim_token": None}]
    creation = provision.create({"plan": plan, "workers": workers}, context)
    (created,) = creation["launched"]
    # And its runner registered, took the run's job, and the job (a short one) ended: its release gave the
    # instance back before CheckFleet looked at it (under load, the look comes a second late)
    world.clock.advance(1)
    world.agents.act()
    runner = world.plane.state_table.get(created).runner_id
    item = ReleaseItem(instance_id=created, run_key=RUN, poll_seconds=1, runner_id=runner)
    assert world.local.release().give_back(item).status is ReleaseStatus.AWAITING_RECEIPT
    # When CheckFleet and Finish run
    checked = provision.check_fleet({"plan": plan, "creation": creation}, context)
    finishing = {"plan": plan, "workers": workers, "creation": checked, "machine": world.machine.arn}
    result = provision.finish(finishing, context)
    # Then the instance served the run: it is counted lost (moved on), not never ready, and no runner is
    # asked for again (a redriven provision would claim or launch an instance for a job that has already
    # run, and its pickup would hold the pool's misfits out of sight of every other request meanwhile)
    assert result["expired"] == []
    assert result["lost"] == [created]
    assert states(world, [created]) == [InstanceState.IDLE]
    assert executions_once_settled(world) == []


def short_warm_job(world: ProvisionWorld, execution: str) -> tuple[str, dict[str, Any], LambdaContext]:
    """A warm instance claimed and handed its runner config by Begin, whose runner registered and ran the
    run's one job, a short one: its release gave the instance back before the claim worker's check. The
    instance, the plan and the context of its steps."""
    warm = world.warm(1).instance_id
    context = LambdaContext(
        "provision", execution, "arn:aws:lambda:us-east-1:123456789012:function:provision"
    )
    request = ProvisionRequest(trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key=RUN, count=1)
    plan = provision.begin({"request": request.model_dump(mode="json"), "execution": execution}, context)
    assert plan["pre_claims"] == [warm]
    world.agents.act()
    runner = world.plane.state_table.get(warm).runner_id
    item = ReleaseItem(instance_id=warm, run_key=RUN, poll_seconds=1, runner_id=runner)
    assert world.local.release().give_back(item).status is ReleaseStatus.AWAITING_RECEIPT
    return warm, plan, context


def checked_and_finished(
    world: ProvisionWorld, plan: dict[str, Any], context: LambdaContext
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The claim worker's check of slot 0, then Finish: what each answered."""
    worker = provision.claim({"plan": plan, "slot": 0}, context)
    workers = [{"slot": 0, "instance_id": worker["instance_id"], "claim_token": worker["claim_token"]}]
    finishing = {"plan": plan, "workers": workers, "creation": {}, "machine": world.machine.arn}
    return worker, provision.finish(finishing, context)


def test_a_claimed_instance_whose_short_job_ended_before_its_check_is_not_asked_for_again(
    world: ProvisionWorld,
) -> None:
    # Given a warm instance claimed by Begin, whose short job ran and was released before the worker's check
    warm, plan, context = short_warm_job(world, "exec-warm")
    # When the claim worker checks it and Finish runs
    worker, result = checked_and_finished(world, plan, context)
    # Then the worker kept it (no other instance claimed or launched for the job that has run), Finish
    # counted it lost, and no runner is asked for again
    assert worker["readiness"] == "ready"
    assert (result["warm"], result["lost"], result["expired"]) == ([], [warm], [])
    assert world.ec2.calls["CreateFleet"] == 0
    assert executions_once_settled(world) == []


def test_a_short_jobs_warm_instance_released_before_a_finish_that_gives_up_is_counted_lost_not_expired(
    world: ProvisionWorld,
) -> None:
    # Given a warm instance claimed by Begin, whose short job ran and was released, and whose run finished,
    # all before Finish looked
    warm, plan, context = short_warm_job(world, "exec-run")
    world.plane.state_table.mark_run_finished(RUN)
    # When the worker checks it and Finish runs, and gives up on the finished run
    _, result = checked_and_finished(world, plan, context)
    # Then the instance, pooled by the job's release, is told as lost (it served the run), not as expired:
    # it was neither expired nor terminated
    assert (result["warm"], result["expired"], result["lost"]) == ([], [], [warm])
    assert states(world, [warm]) == [InstanceState.IDLE]
    assert ec2_state(world, warm) == "running"


def test_each_launch_served_notes_its_launch_to_ready_and_a_pristine_claim_no_reuse(
    world: ProvisionWorld,
) -> None:
    # Given one warm pristine instance / When a run asks for three runners
    warm = world.warm(1).instance_id
    result = output(world.provision(RUN, 3))
    # Then the class history holds each created instance's launch -> ready, and no reuse: the warm one
    # had never served
    record = world.plane.class_history.read("large", 0.0)
    assert sorted(entry.key for entry in record.launches) == sorted(result["cold"])
    assert all(entry.value >= 0 for entry in record.launches)
    assert record.reuses == []
    assert warm in result["warm"]
