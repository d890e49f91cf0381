"""The grants issue 13's calls need, read from the synthesised template: redrives start the provision
machine from its own steps, refresh starts provisions and releases and reads the runs' recent demand."""

from __future__ import annotations

from typing import Any

from tests.infra.synthesis import Synthesis
from tests.infra.test_permissions import actions, statements


def starts(synthesis: Synthesis, handler: str) -> list[Any]:
    return [s["Resource"] for s in statements(synthesis, handler) if "states:StartExecution" in actions(s)]


def test_finish_and_dump_may_start_their_own_machine_and_the_release_machine_and_nothing_else(
    synthesis: Synthesis,
) -> None:
    # Given the provision machine, named so its own steps can name its ARN without a cycle
    stack = synthesis.stack
    machine = synthesis.resources[synthesis.logical_id(stack.provision.state_machine)]
    name = machine["Properties"]["StateMachineName"]
    release = synthesis.logical_id(stack.release.state_machine)
    for handler in ("provision.finish", "provision.dump"):
        # Then each may start executions of that machine (a redrive), spelled out by name, and of the
        # release machine (a run that finished meanwhile: its hand-offs are ended by a release)
        (resources,) = starts(synthesis, handler)
        (own,) = [r for r in resources if "Fn::Join" in r]
        joined = "".join(part for part in own["Fn::Join"][1] if isinstance(part, str))
        assert joined.endswith(f":stateMachine:{name}"), handler
        assert [r for r in resources if "Fn::Join" not in r] == [{"Ref": release}], handler
    # And no other provision step may start anything
    for handler in ("provision.begin", "provision.claim", "provision.create", "provision.check_fleet"):
        assert starts(synthesis, handler) == [], handler


def test_refresh_may_start_provisions_and_releases(synthesis: Synthesis) -> None:
    stack = synthesis.stack
    machines = {
        synthesis.logical_id(stack.provision.state_machine),
        synthesis.logical_id(stack.release.state_machine),
    }
    (resources,) = starts(synthesis, "refresh.refresh")
    assert {r["Ref"] for r in resources} == machines
    environment = next(
        r["Properties"]["Environment"]["Variables"]
        for r in synthesis.resources.values()
        if r["Type"] == "AWS::Lambda::Function" and r["Properties"]["Handler"].endswith("refresh.refresh")
    )
    assert {"RUNNER_POOL_PROVISION_STATE_MACHINE_ARN", "RUNNER_POOL_RELEASE_STATE_MACHINE_ARN"} <= set(
        environment
    )
