"""Issue 13, fix 5: a claim step that dies part-way through its hand-over and is retried never breaks the
runner it handed over. The runner is noted on the record before its config is stored."""

from __future__ import annotations

from typing import Any

import pytest

from emulator.harness.control_plane import LocalControlPlane
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.provision import ClaimWorker
from runner_pool.domain.trust import TrustLevel
from runner_pool.handlers.provision import provision_of
from runner_pool.steps.provision import Provision

RUN = "pool=4242"


def worker(steps: Provision) -> ClaimWorker:
    request = ProvisionRequest(trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key=RUN, count=1)
    return ClaimWorker(plan=steps.begin(request, "provision-handover"), slot=0)


def test_a_retry_after_the_config_was_stored_leaves_the_started_runner_alone(
    local: LocalControlPlane,
) -> None:
    # Given a claim step that stored the runner config and died before it could answer
    (idle,) = local.pooled()
    steps = provision_of(local.plane)
    first = steps.claim(worker(steps))
    assert first.claimed
    record = local.record(idle.instance_id)
    runners_before = dict(local.github.state.runners)
    # When Step Functions retries the step with the same input
    retried = steps.claim(worker(steps))
    # Then it resumes its own claim: no second registration, the runner the agent may have started
    # from the stored config is still registered (GitHub would have answered 409 to the same name,
    # and the old adapter deleted it), and the record still names it
    assert retried.instance_id == idle.instance_id
    assert dict(local.github.state.runners) == runners_before
    assert local.record(idle.instance_id).runner_id == record.runner_id
    stored = local.plane.credentials.stored_runner(
        idle.instance_id, local.plane.instance_arn(idle.instance_id)
    )
    assert stored == (RUN, record.runner_id)


def test_a_retry_after_the_runner_was_noted_but_before_its_config_registers_anew(
    local: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim step that died after noting the runner, before storing its config
    (idle,) = local.pooled()
    steps = provision_of(local.plane)
    credentials = local.plane.credentials

    def dies(*_args: Any, **_kwargs: Any) -> str:
        raise RuntimeError("the Lambda was cut short")

    monkeypatch.setattr(credentials, "store", dies)
    with pytest.raises(RuntimeError):
        steps.claim(worker(steps))
    monkeypatch.undo()
    # (the instance went back to the pool, the registration nobody can start stays behind on GitHub)
    abandoned = {r.runner_id for r in local.github.state.runners.values()}
    # When the step is retried
    retried = steps.claim(worker(steps))
    # Then it hands over a config for a runner that is registered and noted on the record
    assert retried.claimed
    record = local.record(idle.instance_id)
    assert record.runner_id in local.github.state.runners
    stored = credentials.stored_runner(idle.instance_id, local.plane.instance_arn(idle.instance_id))
    assert stored == (RUN, record.runner_id)
    # And the registration no agent could start was replaced, not left beside it
    assert abandoned
    assert record.runner_id not in abandoned
    assert len(local.github.state.runners) == 1
