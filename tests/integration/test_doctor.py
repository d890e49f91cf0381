"""`runner-pool doctor` on moto and the fake GitHub: each way a deployment stops (or slows) jobs, its line.

The clinic is a deployment as the doctor reads one (the two secrets, the launch templates, the provision
state machine, the account's roles and quotas; the App, its installation and webhook on the fake GitHub),
healthy until a test breaks one thing in it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from emulator.doctor import LocalAccount, add_service_linked_roles, clients
from emulator.fake_github import FakeGitHub
from emulator.fake_github.state import APP_PERMISSIONS
from emulator.harness.control_plane import REGION
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey, generate_app_key
from emulator.resources import create_launch_templates
from runner_pool.checkup import Target, doctor
from runner_pool.cli import main
from runner_pool.domain.config import StackConfig
from runner_pool.domain.doctor_readings import DeployedStack
from runner_pool.domain.records import Arch
from runner_pool.domain.runner_scope import OrganizationScope, Registration
from tests.integration.conftest import app_github

WEBHOOK_URL = "https://abc123.execute-api.us-east-1.amazonaws.com/prod/webhook"
PROVISION_ASL = Path(__file__).parents[2] / "infra" / "statemachines" / "provision.asl.json"
ROLE_ARN = "arn:aws:iam::123456789012:role/provision"


@dataclass
class Clinic:
    github: FakeGitHub
    config: StackConfig
    templates: dict[Arch, str]
    provision_arn: str
    account: LocalAccount = field(default_factory=LocalAccount)

    def client(self, service: str) -> Any:
        return boto3.client(service, region_name=REGION)  # type: ignore[call-overload]  # boto3-stubs take only literal names

    def examine(self, config: StackConfig | None = None) -> tuple[int, dict[str, str]]:
        """The doctor's exit code and its lines by check name (`verdict  found; fix: ...`)."""
        out = io.StringIO()
        target = Target(DeployedStack(config or self.config, WEBHOOK_URL), self.provision_arn, self.templates)
        code = doctor(target, clients(self.client, self.account), out)
        lines = out.getvalue().splitlines()
        return code, {_check_of(line): line for line in lines[:-1]} | {"summary": lines[-1]}


def _check_of(line: str) -> str:
    """The check's name: the second column, up to the two spaces before what was found."""
    return line[6:].split("  ", 1)[0].strip()


@pytest.fixture
def clinic(aws: None, app_key: AppKey) -> Iterator[Clinic]:
    with FakeGitHub(APP_ID, app_key.public_pem) as github:
        github.state.add_installation(
            INSTALLATION_ID, OWNER, {**APP_PERMISSIONS, "organization_administration": "read"}
        )
        github.webhooks.point_at(WEBHOOK_URL, "webhook-secret")
        config = StackConfig.model_validate({"github": app_github(api_url=github.url)})
        secrets = boto3.client("secretsmanager", region_name=REGION)
        secrets.create_secret(Name=config.github.private_key_secret_name, SecretString=app_key.private_pem)
        secrets.create_secret(Name=config.github.webhook_secret_name, SecretString="webhook-secret")
        add_service_linked_roles(boto3.client("iam", region_name=REGION))
        machine = boto3.client("stepfunctions", region_name=REGION).create_state_machine(
            name="provision", definition=PROVISION_ASL.read_text(), roleArn=ROLE_ARN
        )
        templates = create_launch_templates(boto3.client("ec2", region_name=REGION), "clinic")
        yield Clinic(github, config, templates, machine["stateMachineArn"])


def test_a_healthy_deployment_is_all_clear(clinic: Clinic) -> None:
    # Given a deployment with nothing wrong
    # When the doctor examines it
    code, lines = clinic.examine()

    # Then every check is ok, one line each, and it exits 0
    assert code == 0, lines
    assert all(line.startswith("ok") for name, line in lines.items() if name != "summary"), lines
    assert len(lines) == 13
    assert lines["summary"] == "all clear: nothing stops jobs (0 warning(s))"


def test_an_organisation_on_runner_groups_is_all_clear_once_a_group_is_made(clinic: Clinic) -> None:
    # Given the stack on the whole organisation, registering in runner groups (its default), the App with
    # no repository administration at all
    del clinic.github.state.installations[INSTALLATION_ID].permissions["administration"]
    del clinic.github.state.app_permissions["administration"]
    config = _organisation(clinic)

    # When the doctor examines it before any job, and after the first job made its repository's group
    before, first = clinic.examine(config)
    clinic.github.state.add_runner_group(OWNER, 9, "runner-pool-repository-1")
    after, then = clinic.examine(config)

    # Then it warns that no group is made yet (a plan may refuse them), and after the first is all clear
    assert before == 0, first
    assert first["runner group"].startswith("warn"), first
    assert "without runner groups beyond Default" in first["runner group"]
    assert after == 0, then
    assert then["registration"].startswith("ok"), then
    assert "organization_self_hosted_runners: write" in then["registration"]
    assert then["repository runners"].startswith("ok  "), then
    assert then["summary"] == "all clear: nothing stops jobs (0 warning(s))", then


@dataclass(frozen=True)
class Way:
    """One way a deployment goes wrong: what breaks it, the check that sees it, its verdict and words."""

    breaks: Callable[[Clinic], StackConfig | None]
    check: str
    verdict: str
    says: str
    fix: str


def _app_permission(c: Clinic) -> None:
    c.github.state.app_permissions["administration"] = "read"


def _app_event(c: Clinic) -> None:
    c.github.state.app_events.remove("workflow_job")


def _not_accepted(c: Clinic) -> None:
    # Accepted before the App asked to re-run runs: reading them only.
    c.github.state.installations[INSTALLATION_ID].permissions["actions"] = "read"


def _policy(value: str) -> Callable[[Clinic], None]:
    def breaks(c: Clinic) -> None:
        c.github.state.runner_policies[OWNER] = value

    return breaks


def _policy_unreadable(c: Clinic) -> None:
    del c.github.state.installations[INSTALLATION_ID].permissions["organization_administration"]


def _runner_group(c: Clinic) -> StackConfig:
    c.github.state.add_runner_group(OWNER, 5)
    github = c.config.github.model_copy(update={"runner_group_id": 5})
    return c.config.model_copy(update={"github": github})


def _organisation(c: Clinic, **github: object) -> StackConfig:
    """The clinic's stack on the whole organisation (registered in runner groups unless `github` says)."""
    settings = c.config.github.model_copy(update={"scope": OrganizationScope(org=OWNER), **github})
    return c.config.model_copy(update={"github": settings})


def _no_organisation_runners(c: Clinic) -> StackConfig:
    del c.github.state.installations[INSTALLATION_ID].permissions["organization_self_hosted_runners"]
    return _organisation(c)


def _personal_account(c: Clinic) -> StackConfig:
    c.github.state.installations[INSTALLATION_ID].organization = False
    return _organisation(c)


def _no_administration(c: Clinic) -> None:
    del c.github.state.installations[INSTALLATION_ID].permissions["administration"]


def _organisation_at_repositories(c: Clinic) -> StackConfig:
    return _organisation(c, registration=Registration.REPOSITORY)


def _hook_url(c: Clinic) -> None:
    c.github.webhooks.url = "https://old.example/webhook"


def _hook_form(c: Clinic) -> None:
    c.github.state.hook_content_type = "form"


def _hook_secret(c: Clinic) -> None:
    c.github.webhooks.secret = ""


def _private_key_missing(c: Clinic) -> None:
    c.client("secretsmanager").delete_secret(
        SecretId=c.config.github.private_key_secret_name, ForceDeleteWithoutRecovery=True
    )


def _webhook_secret_empty(c: Clinic) -> None:
    c.client("secretsmanager").put_secret_value(
        SecretId=c.config.github.webhook_secret_name, SecretString=" "
    )


def _customer_key(c: Clinic) -> None:
    c.account.ebs_default_key_id = c.client("kms").create_key()["KeyMetadata"]["Arn"]
    c.client("ec2").enable_ebs_encryption_by_default()


def _low_quota(c: Clinic) -> None:
    c.account.lambda_concurrency = 10


def _lower_quota(c: Clinic) -> None:
    c.account.lambda_concurrency = 5


def _no_roles(c: Clinic) -> None:
    iam = c.client("iam")
    for name in ("AWSServiceRoleForEC2Fleet", "AWSServiceRoleForEC2Spot"):
        iam.delete_role(RoleName=name)


def _missing_parameter(c: Clinic) -> None:
    ec2 = c.client("ec2")
    version = ec2.create_launch_template_version(
        LaunchTemplateId=c.templates[Arch.ARM64],
        SourceVersion="1",
        LaunchTemplateData={"ImageId": "resolve:ssm:/imagebuilder/runner-pool/clinic/arm64"},
    )["LaunchTemplateVersion"]["VersionNumber"]
    ec2.modify_launch_template(LaunchTemplateId=c.templates[Arch.ARM64], DefaultVersion=str(version))


def _deregistered(c: Clinic) -> None:
    ec2 = c.client("ec2")
    (version,) = ec2.describe_launch_template_versions(
        LaunchTemplateId=c.templates[Arch.X64], Versions=["$Default"]
    )["LaunchTemplateVersions"]
    ec2.deregister_image(ImageId=version["LaunchTemplateData"]["ImageId"])


WAYS = {
    "app lacks a permission": Way(
        _app_permission,
        "app permissions",
        "FAIL",
        "the App lacks administration: write",
        "grant administration",
    ),
    "app not subscribed": Way(
        _app_event, "app events", "FAIL", "not subscribed to workflow_job", "subscribe to workflow_job"
    ),
    "installation has not accepted": Way(
        _not_accepted, "installation", "FAIL", "has not accepted actions: write", "reviews and accepts"
    ),
    "runner groups without the organisation permission": Way(
        _no_organisation_runners,
        "registration",
        "FAIL",
        "github.registration runner-group (the default for the scope octo-org) needs "
        "organization_self_hosted_runners: write",
        "or set github.registration: repository",
    ),
    "runner groups on a personal account": Way(
        _personal_account, "registration", "FAIL", "is a personal account", "set github.scope to octo-org/"
    ),
    "repository registration without administration": Way(
        _no_administration,
        "registration",
        "FAIL",
        "needs administration: write",
        "give the App administration",
    ),
    "an organisation registering at repositories": Way(
        _organisation_at_repositories,
        "registration",
        "warn",
        "administration: write on octo-org's repositories",
        "leave github.registration out",
    ),
    "organisation forbids repository runners": Way(
        _policy("none"), "repository runners", "FAIL", "allows no repository", "settings/actions/runners"
    ),
    "organisation allows selected repositories": Way(
        _policy("selected"),
        "repository runners",
        "warn",
        "selected repositories only",
        "add the repositories",
    ),
    "organisation policy unreadable": Way(
        _policy_unreadable,
        "repository runners",
        "warn",
        "could not read",
        "Organization administration: read",
    ),
    "runner group not the repository's": Way(
        _runner_group, "runner group", "FAIL", "only the Default group", "set github.runner_group_id to 1"
    ),
    "webhook elsewhere": Way(_hook_url, "webhook", "FAIL", "https://old.example/webhook", WEBHOOK_URL),
    "webhook form-encoded": Way(_hook_form, "webhook", "FAIL", "content type form", "application/json"),
    "webhook unsigned": Way(_hook_secret, "webhook", "FAIL", "no secret", "Webhook secret"),
    "private key missing": Way(
        _private_key_missing, "secrets", "FAIL", "github-app-private-key is missing", "put-secret-value"
    ),
    "webhook secret empty": Way(
        _webhook_secret_empty, "secrets", "FAIL", "github-webhook-secret is empty", "put-secret-value"
    ),
    "customer managed EBS key": Way(
        _customer_key,
        "ebs encryption",
        "FAIL",
        "customer managed key",
        "set instances.ebs_kms_key_arn to arn:",
    ),
    "lambda quota of 10": Way(
        _low_quota, "lambda concurrency", "warn", "10 unreserved of 10", "L-B99A9384) of at least 40"
    ),
    "lambda quota below 10": Way(
        _lower_quota,
        "lambda concurrency",
        "FAIL",
        "throttled past their retries",
        "L-B99A9384) of at least 40",
    ),
    "service-linked roles missing": Way(
        _no_roles, "service-linked roles", "warn", "AWSServiceRoleForEC2Fleet", "ec2fleet.amazonaws.com"
    ),
    "image parameter missing": Way(
        _missing_parameter, "runner image", "FAIL", "the parameter does not exist", "instances.ami_parameters"
    ),
    "image deregistered": Way(_deregistered, "runner image", "FAIL", "x64", "RunnerImagePipelineArns"),
}


@pytest.mark.parametrize("way", WAYS.values(), ids=WAYS.keys())
def test_each_way_a_deployment_goes_wrong_is_one_line_with_its_fix(clinic: Clinic, way: Way) -> None:
    # Given a deployment broken in one way
    config = way.breaks(clinic)

    # When the doctor examines it
    code, lines = clinic.examine(config)

    # Then that check's line says what is wrong and how to fix it, and the doctor exits 1 when it stops jobs
    line = lines[way.check]
    assert line.startswith(way.verdict), lines
    found, _, fix = line.partition("; fix: ")
    assert way.says in found, line
    assert way.fix in fix, line
    assert code == (1 if way.verdict == "FAIL" else 0), lines


def test_a_customer_managed_ebs_key_named_in_the_config_passes(clinic: Clinic) -> None:
    # Given an account encrypting by default with a customer managed key, and the stack configured with it
    _customer_key(clinic)
    configured = clinic.config.model_copy(
        update={
            "instances": clinic.config.instances.model_copy(
                update={"ebs_kms_key_arn": clinic.account.ebs_default_key_id}
            )
        }
    )

    # When the doctor examines the deployment
    code, lines = clinic.examine(configured)

    # Then the EBS check passes, naming the configured key, and nothing stops jobs
    assert lines["ebs encryption"].startswith("ok"), lines
    assert f"instances.ebs_kms_key_arn {clinic.account.ebs_default_key_id}" in lines["ebs encryption"]
    assert code == 0, lines


def test_a_user_accounts_installation_has_no_organisation_policy(clinic: Clinic) -> None:
    # Given the App installed on a user's account, not an organisation
    clinic.github.state.installations[INSTALLATION_ID].organization = False

    # When the doctor examines the deployment
    code, lines = clinic.examine()

    # Then there is no runner policy to read, and nothing is wrong
    assert lines["repository runners"].startswith("ok"), lines
    assert "is not an organisation" in lines["repository runners"]
    assert code == 0


def test_the_cli_finds_the_deployment_through_its_stack(clinic: Clinic) -> None:
    # Given a stack whose outputs and function environment name the deployment, as the real stack's do
    trust = {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    role = clinic.client("iam").create_role(
        RoleName="refresh",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [trust]}),
    )
    environment = {
        "RUNNER_POOL_CONFIG": clinic.config.model_dump_json(exclude_defaults=True),
        "RUNNER_POOL_LAUNCH_TEMPLATES": json.dumps({a.value: t for a, t in clinic.templates.items()}),
    }
    template = {
        "Resources": {
            "Refresh": {
                "Type": "AWS::Lambda::Function",
                "Properties": {
                    "Runtime": "python3.12",
                    "Role": role["Role"]["Arn"],
                    "Handler": "index.handler",
                    "Code": {"ZipFile": "def handler(event, context): pass"},
                    "Environment": {"Variables": environment},
                },
            }
        },
        "Outputs": {
            "WebhookUrl": {"Value": WEBHOOK_URL},
            "ProvisionStateMachineArn": {"Value": clinic.provision_arn},
        },
    }
    clinic.client("cloudformation").create_stack(StackName="RunnerPool", TemplateBody=json.dumps(template))
    out = io.StringIO()

    # When the operator runs `runner-pool doctor`
    local = clients(clinic.client, clinic.account)
    code = main(["doctor"], clients=lambda service, _region: local(service), out=out)

    # Then it reads the deployment it names and prints the all-clear
    assert code == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("all clear"), out.getvalue()


def test_the_cli_says_when_there_is_no_such_stack(clinic: Clinic, capsys: pytest.CaptureFixture[str]) -> None:
    # Given no stack of that name
    local = clients(clinic.client, clinic.account)

    # When the operator runs the doctor on it
    code = main(["--stack", "Elsewhere", "doctor"], clients=lambda service, _region: local(service))

    # Then it says which stack it could not find, and exits 1 without a traceback
    assert code == 1
    assert "stack 'Elsewhere'" in capsys.readouterr().err


def test_with_two_apps_each_app_is_checked_and_one_whose_installation_is_gone_fails(clinic: Clinic) -> None:
    # Given a stack of two Apps on the repository, the second installed and then uninstalled
    second = generate_app_key()
    clinic.github.state.add_app(APP_ID + 1, second.public_pem)
    secrets = boto3.client("secretsmanager", region_name=REGION)
    secrets.create_secret(Name="second-app-key", SecretString=second.private_pem)
    secrets.create_secret(Name="second-app-webhook", SecretString="webhook-secret")
    first = clinic.config.github
    config = StackConfig.model_validate(
        {
            "github": {
                "apps": [
                    {
                        "app_id": first.app_id,
                        "installation_id": first.installation_id,
                        "private_key_secret_name": first.private_key_secret_name,
                        "webhook_secret_name": first.webhook_secret_name,
                    },
                    {
                        "app_id": str(APP_ID + 1),
                        "installation_id": INSTALLATION_ID + 1,
                        "private_key_secret_name": "second-app-key",
                        "webhook_secret_name": "second-app-webhook",
                    },
                ],
                "scope": f"{OWNER}/{REPO}",
                "api_url": clinic.github.url,
            }
        }
    )
    # When the doctor examines it
    code, lines = clinic.examine(config)
    # Then the first App's checks pass, the second's installation fails, and the account is checked once
    assert code == 1, lines
    assert lines[f"installation (App {APP_ID})"].startswith("ok"), lines
    assert lines[f"installation (App {APP_ID + 1})"].startswith("FAIL"), lines
    assert f"installation {INSTALLATION_ID + 1}" in lines[f"installation (App {APP_ID + 1})"]
    assert sum(1 for name in lines if name.startswith("runner image")) == 1
