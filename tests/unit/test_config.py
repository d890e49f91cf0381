"""The stack configuration: the defaults of DESIGN.md section 9, and bad settings named with their fix."""

from __future__ import annotations

from typing import Any

import pytest

from runner_pool.domain.config import ConfigError, StackConfig, load_config
from runner_pool.domain.records import Arch, UsageClass
from runner_pool.domain.runner_scope import Registration


def test_defaults_are_the_designs() -> None:
    # Given no settings at all / When loaded / Then every default of DESIGN.md section 9 holds
    config = load_config()
    t = config.timeouts
    # A slow heartbeat now that notices carry the claims (issue 15, item 4).
    assert (t.heartbeat_period_seconds, t.healthy_window_seconds) == (30, 90)
    assert t.claim_registration_seconds == 30
    assert (t.fleet_validation_seconds, t.fleet_validation_poll_seconds) == (180, 5)
    assert t.release_receipt_seconds == 120
    assert (t.created_threshold_seconds, t.claimed_threshold_seconds) == (600, 300)
    assert t.idle_seconds == 600
    assert config.defaults.max_runtime_minutes == 360
    assert config.warm_minimum("large", 0) == 0
    # Except the requeue delay: 0, not 1 s, so concurrent requests see each other's misfits at once
    assert (config.pickup.same_instance_tolerance, config.pickup.requeue_delay_seconds) == (5, 0)
    assert config.refresh_rate_minutes == 1
    assert {name: (c.cpu, c.memory_mib) for name, c in config.resource_classes.items()} == {
        "large": (2, 4096),
        "xlarge": (4, 8192),
        "2xlarge": (8, 16384),
        "4xlarge": (16, 32768),
        "8xlarge": (32, 65536),
    }
    assert (config.defaults.usage, config.defaults.arch) == (UsageClass.SPOT, Arch.X64)


def test_settings_override_defaults() -> None:
    config = load_config(
        {
            "resource_classes": {
                "small": {"cpu": 1, "memory_mib": 2048},
                "big": {"cpu": 8, "memory_mib": 32768},
            },
            "defaults": {"resource_class": "small", "usage": "on-demand"},
            "warm_pool_minimum": {"small": 3},
            "timeouts": {"idle_seconds": 1800},
        }
    )
    assert config.spec_for("pool=1").resource_class == "small"
    assert config.spec_for("pool=1").usage is UsageClass.ON_DEMAND
    assert config.warm_minimum("small", 0) == 3
    assert config.timeouts.idle_seconds == 1800


def _problems(settings: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        load_config(settings)
    assert str(failed.value).startswith("invalid runner-pool configuration:")
    return failed.value.problems


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {
                "resource_classes": {
                    "large": {"cpu": 2, "memory_mib": 4096},
                    "xlarge": {"cpu": 4, "memory_mib": 4096},
                }
            },
            "resource_classes.xlarge.memory_mib: 4096 MiB does not rise with cpu: class large has fewer vCPUs (2) "
            "but 4096 MiB; fix: give xlarge more than 4096 MiB, or fewer vCPUs than large",
        ),
        (
            {"resource_classes": {"a": {"cpu": 2, "memory_mib": 4096}, "b": {"cpu": 2, "memory_mib": 8192}}},
            "resource_classes.b.cpu: equals the cpu of class a (2); fix: give each class its own vCPU count",
        ),
        (
            {"resource_classes": {}},
            "resource_classes: is empty; fix: define at least one class, e.g. large",
        ),
        (
            {
                "resource_classes": {"Large": {"cpu": 2, "memory_mib": 4096}},
                "defaults": {"resource_class": "Large"},
            },
            "resource_classes.Large: is not usable in a label; fix: name classes with lowercase letters, digits and '-'",
        ),
        (
            {"timeouts": {"claimed_threshold_seconds": -5}},
            "timeouts.claimed_threshold_seconds: input should be greater than 0 (got -5); fix: set a number above 0",
        ),
        (
            {"timeouts": {"healthy_window_seconds": 30}},
            "timeouts.healthy_window_seconds: 30 s is not longer than heartbeat_period_seconds (30 s)",
        ),
        (
            # Issue 12, defect 7: before, 190 s was accepted and a warm runner was expired before Finish.
            {"timeouts": {"claimed_threshold_seconds": 190}},
            "timeouts.claimed_threshold_seconds: 190 s is shorter than a provision can take: "
            "claim_registration_seconds + fleet_validation_seconds + 30 s for Finish = 240 s, so an instance "
            "would expire before Finish sets it running; fix: make it at least 240 s, or shorten those waits",
        ),
        (
            {"timeouts": {"fleet_validation_seconds": 600, "claimed_threshold_seconds": 900}},
            "timeouts.created_threshold_seconds: 600 s is shorter than a provision can take: "
            "claim_registration_seconds + fleet_validation_seconds + 30 s for Finish = 660 s, so an instance "
            "would expire before Finish sets it running; fix: make it at least 660 s, or shorten those waits",
        ),
        (
            {"timeouts": {"idle_seconds": 100}},
            "timeouts.idle_seconds: 100 s is not longer than release_receipt_seconds (120 s), so a released "
            "instance's idle time would run out while its release still waits for the agent's receipt; "
            "fix: make it longer than release_receipt_seconds",
        ),
        (
            {"timeouts": {"fleet_validation_poll_seconds": 200}},
            "timeouts.fleet_validation_poll_seconds: polls no more often than the validation timeout",
        ),
        (
            {"defaults": {"resource_class": "huge"}},
            "defaults.resource_class: 'huge' is not a defined class; fix: use one of: large, xlarge",
        ),
        (
            {"warm_pool_minimum": {"huge": 2}},
            "warm_pool_minimum.huge: names no defined class; fix: use one of: large",
        ),
        (
            {"warm_pool_minimum": {"large": -1}},
            "warm_pool_minimum.large: is -1; fix: set 0 or more idle instances",
        ),
        (
            {"pickup": {"requeue_delay_seconds": 901}},
            "pickup.requeue_delay_seconds: input should be less than or equal to 900 (got 901); "
            "fix: set a number of at most 900",
        ),
        (
            {"timeout": {"idle_seconds": 60}},
            "timeout: extra inputs are not permitted (got {'idle_seconds': 60}); fix: remove it or check its spelling",
        ),
        (
            {"defaults": {"usage": "cheap"}},
            "defaults.usage: input should be 'spot' or 'on-demand' (got 'cheap')",
        ),
        (
            # An alias cannot name a key in an IAM policy's Resource, so the grants need the key's ARN.
            {"instances": {"ebs_kms_key_arn": "arn:aws:kms:us-east-1:123456789012:alias/ebs"}},
            "instances.ebs_kms_key_arn: string should match pattern '^arn:aws[a-z-]*:kms:",
        ),
        (
            {"refresh_rate_minutes": "often"},
            "refresh_rate_minutes: input should be a valid integer",
        ),
        (
            {"reuse": {"mode": "once"}},
            "reuse.mode: input should be 'reuse' or 'single-use' (got 'once')",
        ),
        (
            {"reuse": {"mode_by_class": {"huge": "single-use"}}},
            "reuse.mode_by_class.huge: names no defined class; fix: use one of: large",
        ),
        (
            {"reuse": {"mode_by_class": {"large": "sometimes"}}},
            "reuse.mode_by_class.large: input should be 'reuse' or 'single-use' (got 'sometimes')",
        ),
        (
            {"pool": {"stopped_maximum": 1}, "warm_pool_minimum": {"large": {"pristine_stopped": 2}}},
            "warm_pool_minimum.large.pristine_stopped: is 2, above pool.stopped_maximum (1)",
        ),
        (
            {"warm_pool_minimum": {"large": {"pristine": -1}}},
            "warm_pool_minimum.large.pristine: input should be greater than or equal to 0 (got -1)",
        ),
    ],
)
def test_bad_setting_is_named_with_its_fix(settings: dict[str, Any], expected: str) -> None:
    # Given one bad setting / When loaded / Then the message names the setting and says what to do
    problems = _problems(settings)
    assert len(problems) == 1
    assert expected in problems[0]
    assert "; fix: " in problems[0]


def test_every_independent_problem_is_reported_at_once() -> None:
    # Given two unrelated bad settings / When loaded / Then both are listed, so one fix cycle suffices
    problems = _problems({"timeouts": {"idle_seconds": 0}, "pickup": {"same_instance_tolerance": 0}})
    assert [p.split(":")[0] for p in problems] == ["timeouts.idle_seconds", "pickup.same_instance_tolerance"]


def test_config_is_immutable() -> None:
    config = StackConfig()
    with pytest.raises(ValueError, match="frozen"):
        config.refresh_rate_minutes = 5  # type: ignore[misc]


def test_the_default_runner_release_is_checked_by_its_known_checksums() -> None:
    # Given no instances settings / Then every arch's runner archive has a checksum to be checked by
    instances = load_config().instances
    assert all(instances.runner_checksum(arch) is not None for arch in Arch)


def test_a_runner_version_without_checksums_is_refused_naming_the_arch_and_where_to_find_them() -> None:
    # Given a runner release the code knows no checksums of, with only arm64's configured
    settings = {"instances": {"runner_version": "2.999.1", "runner_checksums": {"arm64": "ab" * 32}}}

    # When loaded / Then the config is refused, naming the arch left unchecked and the release page
    with pytest.raises(ConfigError) as refused:
        load_config(settings)
    (problem,) = refused.value.problems
    assert problem.startswith("instances.runner_checksums: has no SHA-256 for runner 2.999.1 on x64")
    assert "https://github.com/actions/runner/releases/tag/v2.999.1" in problem


def test_a_configured_checksum_wins_over_the_known_one() -> None:
    # Given the default release with an x64 checksum of the operator's (a mirror's rebuilt archive)
    instances = load_config({"instances": {"runner_checksums": {"x64": "cd" * 32}}}).instances

    # Then x64 is checked by it, arm64 still by the release's
    assert instances.runner_checksum(Arch.X64) == "cd" * 32
    assert (
        instances.runner_checksum(Arch.ARM64)
        == "b801b9809c4d9301932bccadf57ca13533073b2aa9fa9b8e625a8db905b5d8eb"
    )


@pytest.mark.parametrize(
    ("reuse", "resource_class", "single_use"),
    [
        ({}, "large", False),
        ({"mode": "single-use"}, "large", True),
        ({"mode": "single-use", "mode_by_class": {"large": "reuse"}}, "large", False),
        ({"mode_by_class": {"xlarge": "single-use"}}, "xlarge", True),
        ({"mode_by_class": {"xlarge": "single-use"}}, "large", False),
    ],
    ids=["default", "stack", "class-over-stack", "class", "other-class"],
)
def test_a_class_is_single_use_by_its_own_mode_else_the_stacks(
    reuse: dict[str, Any], resource_class: str, single_use: bool
) -> None:
    # Given reuse modes for the stack and per class / When a class is asked about / Then its own decides
    config = load_config({"reuse": reuse})
    assert config.reuse.single_use_class(resource_class) is single_use


def test_a_pristine_minimum_is_a_floor_kept_by_schedule_like_the_warm_minimum() -> None:
    # Given a class keeping 4 idle (2 pristine) outside its window, and 1 pristine stopped in it
    config = load_config(
        {
            "defaults": {"usage": "on-demand"},
            "pool": {"stopped_maximum": 2},
            "warm_pool_minimum": {
                "large": {
                    "hot": 4,
                    "pristine": 2,
                    "windows": [
                        {"days": ["mon"], "start": "00:00", "end": "24:00", "hot": 0, "pristine_stopped": 1}
                    ],
                }
            },
        }
    )
    monday, tuesday = 1_799_625_600.0, 1_799_712_000.0  # 2027-01-11 and -12, 00:00 UTC
    # When asked at each time / Then the window's numbers hold in it, the class's outside it
    assert (config.pristine_minimum("large", tuesday), config.pristine_stopped_minimum("large", tuesday)) == (
        2,
        0,
    )
    assert (config.pristine_minimum("large", monday), config.pristine_stopped_minimum("large", monday)) == (
        0,
        1,
    )
    assert config.keeps_pristine("large")
    assert not config.keeps_pristine("xlarge")


@pytest.mark.parametrize(
    ("scope", "expected"),
    [("octo-org", Registration.RUNNER_GROUP), ("octocat/hello", Registration.REPOSITORY)],
)
def test_the_registration_follows_the_scope_unless_set(scope: str, expected: Registration) -> None:
    # Given a scope and no registration / Then an organisation registers in runner groups, one repository
    # (a personal account's, which has no runner groups) at the repository
    github = load_config({"github": {"scope": scope}}).github
    assert github.registration is None
    assert github.effective_registration is expected


def test_an_organisation_may_choose_repository_registration() -> None:
    # Given an organisation scope that sets repository registration / Then that is what it uses
    github = load_config({"github": {"scope": "octo-org", "registration": "repository"}}).github
    assert github.effective_registration is Registration.REPOSITORY


def test_runner_groups_for_one_repositorys_scope_are_refused() -> None:
    # Given runner-group registration on a repository's scope / Then the setting is named: groups are an
    # organisation's
    (problem,) = _problems({"github": {"scope": "octocat/hello", "registration": "runner-group"}})
    assert problem.startswith("github.registration: runner groups are an organisation's")


# --- several GitHub Apps ----------------------------------------------------------------------------


def _app(n: int) -> dict[str, Any]:
    return {
        "app_id": str(100 + n),
        "installation_id": 200 + n,
        "private_key_secret_name": f"runner-pool/app-{n}-key",
        "webhook_secret_name": f"runner-pool/app-{n}-webhook",
    }


def test_the_single_app_settings_are_the_one_app() -> None:
    # Given an existing user's single-App settings
    config = load_config({"github": {"app_id": "123", "installation_id": 45, "scope": "my-org"}})
    # When the stack asks for its Apps
    apps = config.github.every_app
    # Then it is that App, with the default secret names, and the config still deploys as it did
    assert [(app.app_id, app.installation_id) for app in apps] == [("123", 45)]
    assert apps[0].private_key_secret_name == "runner-pool/github-app-private-key"
    assert config.github.webhook_secret_names == ("runner-pool/github-webhook-secret",)
    assert "github.app_id" not in " ".join(config.deploy_problems())


def test_a_list_of_apps_is_every_app_and_needs_no_single_app_id() -> None:
    # Given two Apps listed
    config = load_config({"github": {"apps": [_app(1), _app(2)], "scope": "my-org"}})
    # Then both are the stack's, in order, each with its webhook secret, and nothing is missing to deploy
    assert [app.app_id for app in config.github.every_app] == ["101", "102"]
    assert config.github.webhook_secret_names == ("runner-pool/app-1-webhook", "runner-pool/app-2-webhook")
    assert not [p for p in config.deploy_problems() if p.startswith("github.")]


@pytest.mark.parametrize(
    ("github", "expected"),
    [
        ({"apps": [_app(1)], "app_id": "9"}, "github.apps: is set together with app_id"),
        ({"apps": [_app(1), {**_app(2), "app_id": "101"}]}, "github.apps: lists app_id '101' twice"),
        (
            {"apps": [_app(1), {**_app(2), "webhook_secret_name": "runner-pool/app-1-webhook"}]},
            "lists webhook_secret_name 'runner-pool/app-1-webhook' twice",
        ),
        ({"apps": [{"app_id": "1", "installation_id": 2}]}, "github.apps.0.private_key_secret_name"),
    ],
)
def test_a_list_of_apps_that_cannot_work_is_refused_with_its_fix(
    github: dict[str, Any], expected: str
) -> None:
    # Given Apps listed with a single App's id too, an App twice, or an App without its secrets
    # When the config is loaded
    with pytest.raises(ConfigError) as refused:
        load_config({"github": github})
    # Then the message names the setting
    assert expected in str(refused.value)
