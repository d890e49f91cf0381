"""The runner starts from the files `run.sh --jitconfig` would write, with self-update disabled.

What the runner reads, where, and why the agent and not the API disables updates, is in
agent/jit_config.py (actions/runner at 258d6c857db3: Runner.cs, CommandSettings.cs, ConfigurationStore.cs,
MessageListener.cs). `as_the_runner_reads` models how the listener loads `.runner`; the fake runner
(tests/agent/fake_runner.py) refuses any argument and any `ACTIONS_RUNNER_INPUT_*` variable, so a runner
that listens was given its files and nothing else."""

from __future__ import annotations

import base64
import json
import stat
from typing import Any

import pytest

from agent.jit_config import DISABLE_UPDATE, SETTINGS_FILE, JitConfigError, runner_files, without_self_update
from runner_pool.domain.records import Signal
from tests.agent.conftest import AgentFactory, ControlPlane, config_file, idle_agent, jit_config, pooled_agent
from tests.support import builders

RUN = builders.run_key(1)

GITHUB_SETTINGS: dict[str, Any] = {
    "AgentId": 4107,
    "AgentName": "i-0a1b2c3d4e5f60718-4f2a",
    "PoolId": 1,
    "PoolName": "Default",
    "ServerUrl": "https://pipelinesghubeus2.actions.githubusercontent.com/Hx2vQ/",
    "GitHubUrl": "https://github.com/octo-org/octo-repo",
    "WorkFolder": "_work",
    "Ephemeral": True,
    "UseV2Flow": True,
    "ServerUrlV2": "https://broker.actions.githubusercontent.com/",
}
"""A JIT runner's `.runner`, every member named as RunnerSettings names it (ConfigurationStore.cs:17-60)."""
GITHUB_CREDENTIALS: dict[str, Any] = {
    "Scheme": "OAuth",
    "Data": {
        "clientId": "5f6e",
        "authorizationUrl": "https://pipelinesghubeus2.actions.githubusercontent.com/",
    },
}
GITHUB_RSA_PARAMETERS: dict[str, Any] = {"d": "ZA==", "dp": "ZHA=", "exponent": "AQAB", "modulus": "bW9k"}


def github_config(settings: dict[str, Any]) -> tuple[str, dict[str, bytes]]:
    """A config encoded as GitHub's generate-jitconfig answers it, and the files `run.sh --jitconfig` would write
    from it: each key of the decoded map names a file, its base64-decoded value is the file's bytes
    (Runner.cs:239-253)."""
    written = {
        SETTINGS_FILE: json.dumps(settings, indent=2).encode(),
        ".credentials": json.dumps(GITHUB_CREDENTIALS, indent=2).encode(),
        ".credentials_rsaparams": json.dumps(GITHUB_RSA_PARAMETERS).encode(),
    }
    encoded = {name: base64.b64encode(content).decode() for name, content in written.items()}
    return base64.b64encode(json.dumps(encoded).encode()).decode(), written


def as_the_runner_reads(settings_file: bytes) -> dict[str, Any]:
    """`.runner` as the listener loads it into RunnerSettings (ConfigurationStore.cs:280-297): Newtonsoft.Json
    matches each name to a member ignoring case, so a name says nothing its other spellings do not, and of
    two spellings of one member the later is the one set last. Members are keyed in lower case here."""
    return {name.lower(): value for name, value in json.loads(settings_file).items()}


def encoded(files: dict[str, object]) -> str:
    return base64.b64encode(
        json.dumps(
            {name: base64.b64encode(json.dumps(content).encode()).decode() for name, content in files.items()}
        ).encode()
    ).decode()


def test_disable_update_is_set_in_runner_settings_and_everything_else_is_kept() -> None:
    # Given a JIT config as GitHub returns it, its .runner saying nothing of updates
    settings = {"agentId": 12, "agentName": "i-0abc-1", "poolId": 1, "ephemeral": True, "workFolder": "_work"}
    credentials = {"scheme": "OAuthAccessToken", "data": {"token": "secret"}}
    original = encoded(
        {SETTINGS_FILE: settings, ".credentials": credentials, ".credentials_rsaparams": {"d": "x"}}
    )

    # When the agent prepares it for the runner
    prepared = without_self_update(original)

    # Then .runner asks for no updates and keeps every other setting; the other files are byte for byte the same
    assert config_file(prepared) == {**settings, DISABLE_UPDATE: True}
    before, after = json.loads(base64.b64decode(original)), json.loads(base64.b64decode(prepared))
    assert {name: after[name] for name in after if name != SETTINGS_FILE} == {
        name: before[name] for name in before if name != SETTINGS_FILE
    }


@pytest.mark.parametrize("spelling", ["DisableUpdate", "disableUpdate", "disableupdate"])
def test_an_existing_disable_update_of_any_spelling_is_replaced_not_doubled(spelling: str) -> None:
    # Given a .runner that already says updates are allowed (Newtonsoft.Json matches names ignoring case)
    original = encoded({SETTINGS_FILE: {"agentId": 1, spelling: False}})

    # When the agent prepares it / Then one key remains, and it disables updates
    prepared = config_file(without_self_update(original))
    assert [key for key in prepared if key.lower() == "disableupdate"] == [DISABLE_UPDATE]
    assert prepared[DISABLE_UPDATE] is True


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ("not base64!", "not base64-encoded JSON"),
        (base64.b64encode(b"[1, 2]").decode(), "has no .runner file"),
        (encoded({".credentials": {}}), "has no .runner file"),
        (base64.b64encode(json.dumps({SETTINGS_FILE: "%%%"}).encode()).decode(), ".runner is not base64"),
        (encoded({SETTINGS_FILE: [1]}), ".runner is not a JSON object"),
    ],
)
def test_a_config_the_runner_could_not_load_is_refused_with_its_reason(config: str, reason: str) -> None:
    # Given a config that is not a JIT config / When the agent prepares it / Then it says what is wrong
    with pytest.raises(JitConfigError, match=reason):
        without_self_update(config)


@pytest.mark.parametrize(
    "spell",
    [str, lambda name: name[0].lower() + name[1:]],
    ids=["as-RunnerSettings-names-members", "as-the-runner-writes-them"],
)
def test_the_files_carry_what_jitconfig_would_write_with_updates_off(spell: Any) -> None:
    # Given a config in GitHub's encoded format, its .runner spelt one way or the other and silent on updates
    config, from_jitconfig = github_config({spell(name): value for name, value in GITHUB_SETTINGS.items()})

    # When the agent makes the runner's files of it
    files = runner_files(config)

    # Then they are the files --jitconfig writes, the credentials byte for byte
    assert files.keys() == from_jitconfig.keys()
    assert {name: files[name] for name in files if name != SETTINGS_FILE} == {
        name: from_jitconfig[name] for name in from_jitconfig if name != SETTINGS_FILE
    }
    # And .runner, read as the runner reads it, holds every setting GitHub's does, and updates off
    assert as_the_runner_reads(files[SETTINGS_FILE]) == {
        **as_the_runner_reads(from_jitconfig[SETTINGS_FILE]),
        "disableupdate": True,
    }


def test_the_runner_starts_ephemeral_with_updates_off_from_the_files_it_would_write_itself(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an idle instance whose agent runs, and a config in GitHub's encoded format (plus the fake
    # runner's own member, which Newtonsoft.Json, like the real runner, would ignore)
    running = idle_agent(control_plane, agents)
    fake = {"id": "github-shaped", "mode": "job", "idle_seconds": 5}
    config, from_jitconfig = github_config({**GITHUB_SETTINGS, "fakeRunner": fake})

    # When a run claims the instance with it
    control_plane.claim(RUN, config)

    # Then the runner listens, started with no argument and no ACTIONS_RUNNER_INPUT_* variable (the fake
    # refuses both), from that config
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    assert running.runner_starts == ["github-shaped"]
    # And the runner directory holds the files --jitconfig writes, the runner account's alone
    directory = running.settings.runner_dir
    for name, content in from_jitconfig.items():
        assert stat.S_IMODE((directory / name).lstat().st_mode) == 0o600
        if name != SETTINGS_FILE:
            assert (directory / name).read_bytes() == content
    # And the runner reads in .runner an ephemeral runner of GitHub's settings and work folder, updates off
    settings = as_the_runner_reads((directory / SETTINGS_FILE).read_bytes())
    assert settings == {**as_the_runner_reads(from_jitconfig[SETTINGS_FILE]), "disableupdate": True}
    assert (settings["ephemeral"], settings["workfolder"]) == (True, "_work")


def test_no_variable_the_runner_takes_as_an_argument_reaches_it(
    control_plane: ControlPlane, agents: AgentFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent whose environment names another JIT config, and run-once, where the runner looks for
    # its arguments (in any case)
    monkeypatch.setenv("ACTIONS_RUNNER_INPUT_JITCONFIG", jit_config(mode="refuse"))
    monkeypatch.setenv("actions_runner_input_once", "true")
    running = idle_agent(control_plane, agents)

    # When a run claims it with its config
    config = jit_config(idle_seconds=5)
    control_plane.claim(RUN, config)

    # Then the runner listens (the fake refuses any such variable), started from the run's config alone
    control_plane.await_runner(running, RUN, config)


def test_a_config_that_is_no_jit_config_signals_ud_reg_failed_and_starts_nothing(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an idle instance whose agent runs
    running = pooled_agent(control_plane, agents)

    # When a run claims it with a config that is no JIT config
    control_plane.claim(RUN, "not a jit config")

    # Then the agent signals UD_REG_FAILED saying why, and never starts the runner
    failed = control_plane.await_reason(Signal.UD_REG_FAILED, RUN)
    assert "not base64-encoded JSON" in failed
    assert running.runner_starts == []
