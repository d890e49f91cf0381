"""domain/doctor.py's CHECKS: the README's table is theirs, and each verdict follows from the row's stakes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runner_pool.domain.config import StackConfig
from runner_pool.domain.doctor import CHECKS, Verdict, examine, exit_code, table
from runner_pool.domain.doctor_readings import (
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
)
from runner_pool.domain.records import Arch

README = Path(__file__).resolve().parents[2] / "README.md"
URL = "https://example.execute-api.us-east-1.amazonaws.com/prod/webhook"
NEEDS = {"actions": "read", "organization_self_hosted_runners": "write"}


def healthy(**github: object) -> Readings:
    """An organisation's stack registering in runner groups (its default), one group of ours made."""
    settings = {"app_id": "1", "installation_id": 2, "scope": "org", **github}
    config = StackConfig.model_validate({"github": settings})
    return Readings(
        stack=DeployedStack(config, URL),
        manifest=AppManifest(NEEDS, frozenset({"workflow_job", "workflow_run"})),
        app=AppGrant({**NEEDS, "metadata": "read"}, frozenset({"workflow_job", "workflow_run", "push"})),
        installation=Installation(
            "org", True, {"actions": "write", "organization_self_hosted_runners": "admin"}
        ),
        runner_policy=None,
        runner_groups=(1, 7),
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
    # Given repository registration, the runner policy unread for want of a permission, and unread because
    # GitHub refused the App
    at_repositories = healthy(registration="repository")
    forbidden = dataclasses.replace(at_repositories, runner_policy=Unread("403", forbidden=True))
    refused = dataclasses.replace(at_repositories, runner_policy=Unread("401 Bad credentials"))

    # When judged; Then the first is a warning, the second stops jobs
    assert verdicts(forbidden)["repository runners"] is Verdict.WARN
    assert verdicts(refused)["repository runners"] is Verdict.FAIL


def test_an_unbounded_map_outruns_any_quota() -> None:
    # Given a provision Map deployed without MaxConcurrency (0: unbounded) in an account of 1000
    readings = dataclasses.replace(healthy(), map_concurrency=0)

    # When judged; Then no quota is enough, and the doctor says so
    assert verdicts(readings)["lambda concurrency"] is Verdict.FAIL


def finding(readings: Readings, check: str) -> str:
    return next(f.line() for f in examine(readings) if f.check == check)


def test_runner_groups_without_the_organisation_permission_say_so_and_stop_jobs() -> None:
    # Given an organisation's stack on its default registration, whose installation has only repository
    # administration
    readings = dataclasses.replace(
        healthy(), installation=Installation("org", True, {"actions": "read", "administration": "write"})
    )

    # When judged / Then the registration check fails, naming the permission runner groups need
    assert verdicts(readings)["registration"] is Verdict.FAIL
    line = finding(readings, "registration")
    assert "github.registration runner-group (the default for the scope org)" in line
    assert "needs organization_self_hosted_runners: write" in line
    assert "every registration is refused" in line
    assert "or set github.registration: repository" in line


def test_repository_registration_without_administration_says_so() -> None:
    # Given a personal account's stack (one repository) whose installation has no administration
    readings = dataclasses.replace(
        healthy(scope="octocat/hello"), installation=Installation("octocat", False, {"actions": "read"})
    )

    # When judged / Then the registration check fails, naming administration: write
    assert verdicts(readings)["registration"] is Verdict.FAIL
    assert "needs administration: write" in finding(readings, "registration")


def test_runner_groups_on_a_personal_account_are_refused_with_the_way_out() -> None:
    # Given a scope written as an organisation's, but the installation is on a user (target_type User)
    readings = dataclasses.replace(
        healthy(scope="octocat"),
        installation=Installation("octocat", False, {"organization_self_hosted_runners": "write"}),
        runner_groups=None,
    )

    # When judged / Then it fails: a personal account has no runner groups; the fix is the repository
    assert verdicts(readings)["registration"] is Verdict.FAIL
    line = finding(readings, "registration")
    assert "octocat is a personal account" in line
    assert "set github.scope to octocat/<repository>" in line


def test_an_organisation_registering_at_repositories_warns_of_the_privilege() -> None:
    # Given an organisation that chose repository registration, with repository administration
    readings = dataclasses.replace(
        healthy(registration="repository"),
        manifest=AppManifest({"actions": "read", "administration": "write"}, frozenset()),
        app=AppGrant(
            {"actions": "read", "administration": "write"}, frozenset({"workflow_job", "workflow_run"})
        ),
        installation=Installation("org", True, {"actions": "read", "administration": "write"}),
        runner_policy=RunnerPolicy.ALL,
    )

    # When judged / Then it warns (jobs are served), saying what administration reaches
    assert verdicts(readings)["registration"] is Verdict.WARN
    assert "leave github.registration out" in finding(readings, "registration")
    assert exit_code(examine(readings)) == 0


def test_a_personal_accounts_repository_registration_is_healthy() -> None:
    # Given one repository of a personal account, its installation with administration: write
    readings = dataclasses.replace(
        healthy(scope="octocat/hello"),
        manifest=AppManifest({"actions": "read", "administration": "write"}, frozenset()),
        installation=Installation("octocat", False, {"actions": "read", "administration": "write"}),
        runner_groups=None,
    )

    # When judged / Then registration, its policy and its group pass
    judged = verdicts(readings)
    assert (judged["registration"], judged["repository runners"], judged["runner group"]) == (Verdict.OK,) * 3


def test_an_organisation_with_only_the_default_group_warns_that_a_plan_may_refuse_groups() -> None:
    # Given an organisation registering in runner groups with none made yet
    readings = dataclasses.replace(healthy(), runner_groups=(1,))

    # When judged / Then it warns: the first job makes one, unless the plan has no groups beyond Default
    assert verdicts(readings)["runner group"] is Verdict.WARN
    line = finding(readings, "runner group")
    assert "without runner groups beyond Default" in line
    assert "set github.registration: repository" in line
