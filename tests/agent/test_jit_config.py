"""The runner starts with self-update disabled: the agent sets DisableUpdate in the JIT config's `.runner`.

Where the runner reads it, and why the agent and not the API is the place, is in agent/jit_config.py
(actions/runner's Runner.cs, ConfigurationStore.cs and MessageListener.cs)."""

from __future__ import annotations

import base64
import json

import pytest

from agent.jit_config import DISABLE_UPDATE, SETTINGS_FILE, JitConfigError, without_self_update
from runner_pool.domain.records import Signal
from tests.agent.conftest import AgentFactory, ControlPlane, config_file, config_id, jit_config
from tests.support import builders

RUN = builders.run_key(1)


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


def test_the_runner_is_started_with_updates_disabled(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an idle instance whose agent runs
    control_plane.launch_for_pool()
    running = agents.start()
    control_plane.await_signal(Signal.UD_OK, None)

    # When a run claims it with a JIT config that says nothing of updates
    config = jit_config(idle_seconds=5)
    assert "disableupdate" not in {key.lower() for key in config_file(config)}
    control_plane.claim(RUN, config)
    control_plane.await_signal(Signal.UD_REG_OK, RUN)

    # Then the .runner the agent wrote for the runner from its config disables updates
    written = json.loads((running.settings.runner_dir / SETTINGS_FILE).read_text())
    assert written == {**config_file(config), DISABLE_UPDATE: True}


def test_no_variable_the_runner_takes_as_an_argument_reaches_it(
    control_plane: ControlPlane, agents: AgentFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent whose environment names another JIT config, and run-once, where the runner looks for
    # its arguments (in any case)
    monkeypatch.setenv("ACTIONS_RUNNER_INPUT_JITCONFIG", jit_config(mode="refuse"))
    monkeypatch.setenv("actions_runner_input_once", "true")
    control_plane.launch_for_pool()
    running = agents.start()
    control_plane.await_signal(Signal.UD_OK, None)

    # When a run claims it with its config
    config = jit_config(idle_seconds=5)
    control_plane.claim(RUN, config)

    # Then the runner listens (the fake refuses any such variable), started from the run's config alone
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    assert running.runner_starts == [config_id(config)]


def test_a_config_that_is_no_jit_config_signals_ud_reg_failed_and_starts_nothing(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an idle instance whose agent runs
    control_plane.launch_for_pool()
    running = agents.start()

    # When a run claims it with a config that is no JIT config
    control_plane.claim(RUN, "not a jit config")

    # Then the agent signals UD_REG_FAILED saying why, and never starts the runner
    failed = control_plane.await_signal(Signal.UD_REG_FAILED, RUN)
    assert failed.reason is not None
    assert "not base64-encoded JSON" in failed.reason
    assert running.runner_starts == []
