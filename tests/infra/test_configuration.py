"""Where the stack's configuration comes from, and the settings a deployment cannot do without."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_dynamodb as dynamodb

from infra.app import (
    CONFIG_CONTEXT_KEY,
    CONFIG_FILE_CONTEXT_KEY,
    PROJECT_ROOT,
    build_app,
    pool_settings,
    project_context,
)
from infra.constructs.functions import ControlPlaneFunctions
from runner_pool.domain.config import ConfigError, WorkflowType, load_config, load_deployable_config
from tests.infra.synthesis import DEPLOYABLE, stub_layer


def _problems(settings: dict[str, Any], loader: Any = load_config) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        loader(settings)
    return failed.value.problems


def test_cdk_json_holds_an_example_that_deploys_as_far_as_synth() -> None:
    # Given the settings a fresh clone has in cdk.json / When they are loaded for a deployment
    config = load_deployable_config(project_context()[CONFIG_CONTEXT_KEY])

    # Then they are complete: a GitHub App, a scope and a network
    assert config.deploy_problems() == []


def test_synth_without_the_github_app_or_network_names_each_missing_setting(tmp_path: Path) -> None:
    # Given cdk context that leaves the App and the network unset
    context = {**project_context(), CONFIG_CONTEXT_KEY: {}}

    # When the app is built / Then it fails naming every setting to fill in, with its fix
    with pytest.raises(ConfigError) as failed:
        build_app(context, outdir=str(tmp_path))
    assert [problem.split(":")[0] for problem in failed.value.problems] == [
        "github.app_id",
        "github.installation_id",
        "github.scope",
        "network.vpc_id",
        "network.subnet_ids",
    ]
    assert all("is required to deploy; fix: set" in problem for problem in failed.value.problems)


def test_a_config_file_named_in_context_replaces_the_cdk_json_settings(tmp_path: Path) -> None:
    # Given a config file and context naming it
    path = tmp_path / "pool.json"
    path.write_text(json.dumps({**DEPLOYABLE, "refresh_rate_minutes": 5}))
    app = App(context={CONFIG_CONTEXT_KEY: {"refresh_rate_minutes": 2}, CONFIG_FILE_CONTEXT_KEY: str(path)})

    # When the settings are read / Then they are the file's
    assert pool_settings(app) == {**DEPLOYABLE, "refresh_rate_minutes": 5}


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "cannot be read"), ("{not json", "is not JSON"), ("[1, 2]", "not a mapping of settings")],
)
def test_a_config_file_that_is_missing_or_not_an_object_fails_naming_it(
    content: str | None, expected: str, tmp_path: Path
) -> None:
    # Given context naming a file that is missing, not JSON, or not an object
    path = tmp_path / "pool.json"
    if content is not None:
        path.write_text(content)
    app = App(context={CONFIG_FILE_CONTEXT_KEY: str(path)})

    # When the settings are read / Then the error names the context key, the file and the problem
    with pytest.raises(ConfigError, match=rf"{CONFIG_FILE_CONTEXT_KEY} \({path}\): .*{expected}"):
        pool_settings(app)


def test_express_workflows_are_refused_when_provision_could_outlast_five_minutes() -> None:
    # Given Express with a fleet validation so long that provision would pass Express's 300 s limit
    settings = {"workflow_type": "EXPRESS", "timeouts": {"fleet_validation_seconds": 240}}

    # When loaded / Then the workflow type is named, with the waits that do not fit and the fix
    (problem,) = _problems(settings)
    assert problem.startswith(
        "workflow_type: an EXPRESS execution stops after 300 s, but provision waits 270 s"
    )
    assert "timeouts.claim_registration_seconds + timeouts.fleet_validation_seconds" in problem
    assert problem.endswith("fix: use STANDARD, or shorten those waits to at most 240 s in all")


def test_express_workflows_are_refused_when_release_could_outlast_five_minutes() -> None:
    # Given Express with a release receipt timeout beyond what an Express execution may take
    (problem,) = _problems({"workflow_type": "EXPRESS", "timeouts": {"release_receipt_seconds": 250}})

    # Then release's setting is the one named
    assert "release waits 250 s (timeouts.release_receipt_seconds)" in problem


def test_express_workflows_fit_with_the_design_defaults() -> None:
    # Given the design's timeouts / Then Express is accepted
    assert load_config({"workflow_type": "EXPRESS"}).workflow_type is WorkflowType.EXPRESS


@pytest.mark.parametrize(
    ("network", "expected"),
    [
        ({"vpc_id": "vpc-12"}, "network.vpc_id: string should match pattern"),
        ({"subnet_ids": ["subnet-0abc0abc", "sn-1"]}, "network.subnet_ids: 'sn-1' is not a subnet id"),
        ({"subnet_ids": ["subnet-0abc0abc", "subnet-0abc0abc"]}, "network.subnet_ids: names a subnet twice"),
    ],
)
def test_a_bad_network_is_named(network: dict[str, Any], expected: str) -> None:
    # Given a malformed VPC id, subnet id, or a subnet listed twice / Then the setting is named
    (problem,) = _problems({"network": network})
    assert problem.startswith(expected)


def test_an_alarm_address_must_be_an_address() -> None:
    # Given an e-mail setting without an @ / Then it is named
    (problem,) = _problems({"alarms": {"email": "oncall"}})
    assert problem.startswith("alarms.email:")


def test_the_app_manifest_asks_for_organisation_runners_and_no_repository_administration() -> None:
    # Given the GitHub App manifest the README creates the App from (an organisation's: runner groups)
    manifest = json.loads((PROJECT_ROOT / "github-app-manifest.json").read_text())

    # Then it may manage the organisation's self-hosted runners and groups, read workflow runs and re-run
    # their failed jobs, and nothing of any repository's administration
    assert manifest["default_permissions"] == {
        "actions": "write",
        "organization_self_hosted_runners": "write",
    }
    # And it subscribes to the two events the webhook serves
    assert sorted(manifest["default_events"]) == ["workflow_job", "workflow_run"]
    assert manifest["public"] is False


def test_the_personal_account_manifest_differs_only_in_repository_administration() -> None:
    # Given the manifest the README gives a personal account's installation (repository registration)
    manifest = json.loads((PROJECT_ROOT / "github-app-manifest.personal-account.json").read_text())

    # Then it may register runners at repositories, read and re-run workflow runs, no organisation permission
    assert manifest["default_permissions"] == {"actions": "write", "administration": "write"}
    # And it is the organisation's manifest in every other respect
    organisation = json.loads((PROJECT_ROOT / "github-app-manifest.json").read_text())
    assert {k: v for k, v in manifest.items() if k != "default_permissions"} == {
        k: v for k, v in organisation.items() if k != "default_permissions"
    }


def test_settings_too_large_for_a_lambda_environment_fail_synth(tmp_path: Path) -> None:
    # Given settings whose JSON would crowd Lambda's 4 KB environment (a long pre-runner script)
    config = load_config({"instances": {"pre_runner_script": "echo warm-up\n" * 200}})
    stack = Stack(App(), "Bare")
    table = dynamodb.Table(
        stack, "Table", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING)
    )

    # When the functions' helper is built / Then synth fails saying how large the settings are
    with pytest.raises(ConfigError, match=r"the settings take \d+ bytes as JSON, more than the 2048"):
        ControlPlaneFunctions(
            stack, "Functions", config=config, layer=stub_layer(tmp_path / "out"), table=table
        )
