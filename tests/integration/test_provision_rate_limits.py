"""The provision state machine under GitHub's secondary rate limits and outages (the real ASL in moto's
interpreter, the real handlers, the fake GitHub's limits): a burst slows down, it never fails."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from emulator.harness.control_plane import stack_config
from emulator.harness.provision_world import ProvisionWorld, output, provision_world
from runner_pool.adapters.fleet import Fleet
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import PickupManager
from runner_pool.steps.hand_over import HAND_OVERS_AT_ONCE
from runner_pool.steps.provision import Provision
from tests.integration.conftest import app_github
from tests.support.waiting import eventually

RUN = "pool=4242"
JIT_ROUTE = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"


def test_claims_wait_out_a_rate_limit_and_every_warm_runner_is_served(world: ProvisionWorld) -> None:
    # Given three warm instances, and GitHub allowing two registrations in its (compressed) minute:
    # its waits stay within the agents' healthy window, which simulated time jumps by whole waits
    warm = sorted(world.warm(n).instance_id for n in (1, 2, 3))
    world.github.limits.enabled = True
    world.github.limits.points_per_window = 10
    world.github.limits.window_seconds = 10
    # When a run asks for three runners
    result = output(world.provision(RUN, 3))
    # Then GitHub's rate limit was hit, waited out, and all three warm instances serve the run
    assert world.github.limits.refused[JIT_ROUTE] >= 1
    assert sorted(result["warm"]) == warm
    assert result["cold"] == []
    assert world.ec2.calls["CreateFleet"] == 0
    # And no instance was thrown away on the way (each given back while its worker waited)
    assert all(world.plane.state_table.get(i).state is InstanceState.RUNNING for i in warm)


def test_a_rate_limit_part_way_through_creation_loses_no_instance_and_fails_nothing(
    world: ProvisionWorld,
) -> None:
    # Given an empty pool, and GitHub allowing two registrations a minute
    world.github.limits.enabled = True
    world.github.limits.points_per_window = 10
    # When a run asks for three runners (all three launched at once)
    execution = world.provision(RUN, 3)
    # Then the execution succeeded: the third config was handed over after GitHub's wait
    result = output(execution)
    assert len(result["cold"]) == 3
    assert world.ec2.calls["CreateFleet"] == 1
    assert world.github.limits.refused[JIT_ROUTE] >= 1
    # And it waited in Step Functions (a Wait state), not in a Lambda
    waits = [e for e in execution.events if e["type"] == "WaitStateEntered"]
    assert waits


def test_registrations_are_paced_by_the_shared_budget_before_github_has_to_refuse() -> None:
    # Given GitHub allowing two registrations a minute, and a budget of one a minute, one at a time
    paced = stack_config(github=app_github(registrations_per_minute=1, registration_burst=1))
    with provision_world(paced) as world:
        warm = [world.warm(n).instance_id for n in (1, 2)]
        world.github.limits.enabled = True
        world.github.limits.points_per_window = 10
        # When a run asks for two runners
        execution = world.provision(RUN, 2)
        # Then both were served, a minute apart, and GitHub never had to refuse one
        assert sorted(output(execution)["warm"]) == sorted(warm)
        assert world.github.limits.refused[JIT_ROUTE] == 0
        assert any(e["type"] == "WaitStateEntered" for e in execution.events)
        accounting = world.accounting()
        assert accounting.holds, accounting.problems


def test_a_claim_keeps_trying_while_github_is_down_and_gives_no_instance_away(world: ProvisionWorld) -> None:
    # Given one warm instance, and GitHub down for the next 20 seconds
    warm = world.warm(1).instance_id
    world.github.limits.outage(world.clock.now(), world.clock.now() + 20)
    # When a run asks for one runner
    result = output(world.provision(RUN, 1))
    # Then the claim waited GitHub's outage out and the warm instance serves the run
    assert result["warm"] == [warm]
    assert world.github.limits.outage_refused >= 1


def test_creation_hands_configs_over_side_by_side_not_one_after_another(
    world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an empty pool, and GitHub's JIT endpoint answering only once three calls are in flight at
    # once (one after another, the first would wait for the others until it gave up)
    meeting = threading.Barrier(3, timeout=30)
    in_flight = Counter[str]()
    lock = threading.Lock()
    register = world.plane.github.jit_config

    def jit_config(*args: Any, **kwargs: Any) -> Any:
        with lock:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            meeting.wait()
            return register(*args, **kwargs)
        finally:
            with lock:
                in_flight["now"] -= 1

    monkeypatch.setattr(world.plane.github, "jit_config", jit_config)
    # When a run asks for six runners (launched at once)
    result = output(world.provision(RUN, 6))
    # Then all six were handed over by Create, several at a time and never more than its bound
    assert len(result["cold"]) == 6
    assert world.ec2.calls["CreateFleet"] == 1
    assert 3 <= in_flight["most"] <= HAND_OVERS_AT_ONCE


def test_creation_asks_for_the_installation_token_while_ec2_launches(
    world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an empty pool, a fresh environment (no installation token held), and EC2's CreateFleet and
    # GitHub's token request that each answer only once the other is under way (one after the other,
    # the first would wait for the second until it gave up)
    meeting = threading.Barrier(2, timeout=30)
    authenticate = world.plane.github.authenticate
    launch = Fleet.launch_with_fallback
    requests: list[str] = []

    def token_request() -> None:
        requests.append("asked")
        if len(requests) > 1:  # Begin asks first, while it reads the pool: that one goes through
            meeting.wait()
        authenticate()

    def create_fleet(self: Fleet, *args: Any, **kwargs: Any) -> Any:
        meeting.wait()
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(world.plane.github, "authenticate", token_request)
    monkeypatch.setattr(Fleet, "launch_with_fallback", create_fleet)
    # When a run asks for two runners
    result = output(world.provision(RUN, 2))
    # Then both were launched and handed over: the token was asked for while EC2 launched
    assert len(result["cold"]) == 2
    assert len(requests) == 2
    assert not meeting.broken


def test_begin_returns_only_once_the_token_it_asked_for_ahead_has_come(
    world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an empty pool, a fresh environment (no installation token held), and GitHub answering the
    # token request only once Begin has looked at the pool
    story: list[str] = []
    looked, release = threading.Event(), threading.Event()
    authenticate = world.plane.github.authenticate
    pickup = PickupManager.pickup
    begin = Provision.begin

    def token_request() -> None:
        release.wait(timeout=30)
        authenticate()
        story.append("token")

    def look(self: PickupManager, *args: Any, **kwargs: Any) -> Any:
        try:
            return pickup(self, *args, **kwargs)
        finally:
            looked.set()

    def begun(self: Provision, *args: Any, **kwargs: Any) -> Any:
        try:
            return begin(self, *args, **kwargs)
        finally:
            story.append("returned")

    monkeypatch.setattr(world.plane.github, "authenticate", token_request)
    monkeypatch.setattr(PickupManager, "pickup", look)
    monkeypatch.setattr(Provision, "begin", begun)
    with ThreadPoolExecutor(1) as running:
        provisioned = running.submit(world.provision, RUN, 1)
        # When the request ends after Begin looked at the (empty) pool
        eventually(looked.is_set, "Begin to look at the pool")
        release.set()
        result = output(provisioned.result(timeout=120))
    # Then Begin returned only after the token came (Lambda freezes what is left running when a handler
    # returns), and the run was served
    assert story[:2] == ["token", "returned"]
    assert len(result["cold"]) == 1
