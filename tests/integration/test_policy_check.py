"""The IAM check itself: that it can fail (a grant removed fails a named scenario), what it binds, and that
the roles grant nothing the recorded calls do not use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.iam_policy import Request, evaluate
from emulator.iam_stack import WITHOUT_GRANT_VARIABLE, StackIam, without_grant
from emulator.template import synthesized_template
from runner_pool.adapters.state_items import FINISHED_RUN_PREFIX

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCENARIO = (
    "tests/integration/test_release.py::test_a_clean_release_pools_the_instance_with_its_idle_threshold"
)
REMOVED = "runner_pool.handlers.release.give_back=dynamodb:UpdateItem"


@pytest.mark.slow
def test_removing_one_grant_from_the_stack_fails_a_named_scenario_naming_the_missing_statement() -> None:
    # Given the synthesized template less release.give_back's UpdateItem (the running → idle transition)
    environment = {**os.environ, WITHOUT_GRANT_VARIABLE: REMOVED}
    # When the clean-release scenario runs against it
    result = subprocess.run(  # noqa: S603 - this interpreter, running pytest on one of our tests
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            SCENARIO,
        ],
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    # Then the scenario fails, and says which call was denied and which statement it lacks
    assert result.returncode == 1, result.stdout[-3000:]
    assert "runner_pool.handlers.release.give_back calls dynamodb:UpdateItem: denied" in result.stdout
    assert (
        "lacks: Allow dynamodb:UpdateItem on arn:aws:dynamodb:us-east-1:123456789012:table/runner-pool-test-state"
        in result.stdout
    )


def test_without_grant_refuses_a_grant_the_role_does_not_have() -> None:
    # Given a function whose role has no DeleteItem / Then removing it is refused, not silently a no-op
    with pytest.raises(LookupError, match="grants no dynamodb:DeleteItem"):
        without_grant(synthesized_template(), "runner_pool.handlers.release.plan", "dynamodb:DeleteItem")


def test_the_credentials_key_policy_delegates_to_iam_policies() -> None:
    # Given the synthesized key policy / Then it allows the account root, so the roles' IAM policies
    # decide who may use the key (KMS Developer Guide, key-policy-default.html); the check relies on it
    iam = StackIam.bound(synthesized_template(), {}, region="us-east-1", account="123456789012")
    (key_policy,) = [p for arn, p in iam.resource_policies().items() if ":kms:" in arn]
    assert {"AWS": "arn:aws:iam::123456789012:root"} in key_policy.principals
    assert [s.actions for s in key_policy.statements] == [("kms:*",)]


def test_release_plan_may_put_run_finished_marks_and_no_other_item() -> None:
    # Given release.plan's role as synthesized (defect 3: it had Query alone, so its PutItem was denied)
    iam = StackIam.bound(
        synthesized_template(),
        {"RUNNER_POOL_TABLE_NAME": "state"},
        region="us-east-1",
        account="123456789012",
    )
    plan = iam.function("runner_pool.handlers.release.plan")
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/state"
    # Then it may put a run's finished mark
    mark = Request("dynamodb:PutItem", table, {"dynamodb:LeadingKeys": (f"{FINISHED_RUN_PREFIX}pool=1",)})
    assert evaluate(plan.statements, mark).allowed
    # And no item of an instance
    record = Request(
        "dynamodb:PutItem",
        table,
        {"dynamodb:LeadingKeys": ("arn:aws:ec2:us-east-1:123456789012:instance/i-1",)},
    )
    assert not evaluate(plan.statements, record).allowed


def test_a_roles_statements_follow_what_the_local_stack_binds_after_they_were_first_read() -> None:
    # Given release.plan's role read once, before the local stack named its table
    iam = StackIam.bound(synthesized_template(), {}, region="us-east-1", account="123456789012")
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/state"
    mark = Request("dynamodb:PutItem", table, {"dynamodb:LeadingKeys": (f"{FINISHED_RUN_PREFIX}pool=1",)})
    before = iam.function("runner_pool.handlers.release.plan")
    assert not evaluate(before.statements, mark).allowed
    # When the local stack binds the table's name (as it does with what it is given later)
    for name in iam.handlers().values():
        variables = iam.resources[name]["Properties"].get("Environment", {}).get("Variables", {})
        iam.bindings.bind_environment(variables, {"RUNNER_POOL_TABLE_NAME": "state"})
    # Then the role, read again, is resolved against that name, not the first reading
    after = iam.function("runner_pool.handlers.release.plan")
    assert evaluate(after.statements, mark).allowed
    # And read once more, it is the same resolution, kept
    assert iam.function("runner_pool.handlers.release.plan").statements is after.statements
