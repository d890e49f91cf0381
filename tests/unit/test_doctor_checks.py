"""domain/doctor.py's CHECKS: the README's table is theirs, and each verdict follows from the row's stakes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runner_pool.domain.config import StackConfig
from runner_pool.domain.doctor import (
    CHECKS,
    AppGrant,
    AppManifest,
    DeployedStack,
    EbsDefault,
    HookConfig,
    Installation,
    LambdaQuota,
    LaunchImage,
    Readings,
    RunnerPolicy,
    SecretState,
    Unread,
    Verdict,
    examine,
    exit_code,
    table,
)
from runner_pool.domain.records import Arch

README = Path(__file__).resolve().parents[2] / "README.md"
URL = "https://example.execute-api.us-east-1.amazonaws.com/prod/webhook"
NEEDS = {"actions": "read", "administration": "write"}


def healthy() -> Readings:
    config = StackConfig.model_validate({"github": {"app_id": "1", "installation_id": 2, "scope": "org"}})
    return Readings(
        stack=DeployedStack(config, URL),
        manifest=AppManifest(NEEDS, frozenset({"workflow_job", "workflow_run"})),
        app=AppGrant({**NEEDS, "metadata": "read"}, frozenset({"workflow_job", "workflow_run", "push"})),
        installation=Installation("org", True, {"actions": "write", "administration": "admin"}),
        runner_policy=RunnerPolicy.ALL,
        runner_groups=(1,),
        hook=HookConfig(URL, "json", True),
        secrets={"key": SecretState.PRESENT, "webhook": SecretState.PRESENT},
        ebs=EbsDefault(True, "alias/aws/ebs", aws_managed=True),
        lambda_quota=LambdaQuota(1000, 1000),
        map_concurrency=40,
        service_roles={"AWSServiceRoleForEC2Fleet": True, "AWSServiceRoleForEC2Spot": True},
        images=[LaunchImage(Arch.X64, "lt-1", "resolve:ssm:/p", "ami-1", "available")],
    )


def verdicts(readings: Readings) -> dict[str, Verdict]:
    return {finding.check: finding.verdict for finding in examine(readings)}


def test_the_readmes_table_is_the_checks_table() -> None:
    # Given the checks' rows; When the README is read; Then its table is theirs, row for row
    assert "\n".join(table()) in README.read_text()


def test_each_check_has_its_own_name() -> None:
    names = [check.name for check in CHECKS]
    assert len(set(names)) == len(names)


def test_higher_levels_and_more_events_than_asked_are_healthy() -> None:
    # Given an App and installation granting more than the manifest asks (write for read, admin for write)
    # When judged; Then every check passes and the doctor exits 0
    findings = examine(healthy())
    assert {f.verdict for f in findings} == {Verdict.OK}
    assert exit_code(findings) == 0


def test_a_check_that_stops_nothing_only_warns() -> None:
    # Given the service-linked roles missing, which the first CreateFleet makes
    readings = dataclasses.replace(healthy(), service_roles={"AWSServiceRoleForEC2Fleet": False})

    # When judged; Then it warns and the doctor still exits 0
    assert verdicts(readings)["service-linked roles"] is Verdict.WARN
    assert exit_code(examine(readings)) == 0


def test_a_policy_the_app_may_not_read_warns_but_one_github_refused_otherwise_fails() -> None:
    # Given the runner policy unread for want of a permission, and unread because GitHub refused the App
    forbidden = dataclasses.replace(healthy(), runner_policy=Unread("403", forbidden=True))
    refused = dataclasses.replace(healthy(), runner_policy=Unread("401 Bad credentials"))

    # When judged; Then the first is a warning, the second stops jobs
    assert verdicts(forbidden)["repository runners"] is Verdict.WARN
    assert verdicts(refused)["repository runners"] is Verdict.FAIL


def test_an_unbounded_map_outruns_any_quota() -> None:
    # Given a provision Map deployed without MaxConcurrency (0: unbounded) in an account of 1000
    readings = dataclasses.replace(healthy(), map_concurrency=0)

    # When judged; Then no quota is enough, and the doctor says so
    assert verdicts(readings)["lambda concurrency"] is Verdict.FAIL
