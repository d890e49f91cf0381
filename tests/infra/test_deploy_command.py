"""The deploy path a user runs: the README's CDK CLI on this app, and uv's builds whatever the caller's environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.app import PROJECT_ROOT
from infra.uv import build_environment, run_uv

CDK_CLI = "aws-cdk@2"
"""The CLI the README pins: npm's `latest` is a 3.x that rejects current cloud assemblies."""

LOCKED_REQUIREMENTS = [
    "export",
    "--frozen",
    "--no-default-groups",
    "--no-emit-project",
    "--no-header",
    "--quiet",
]


def test_the_readme_deploys_with_the_cli_these_tests_run() -> None:
    # Given the README's deploy guide / Then its commands are the CLI the next test runs
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert f"npx {CDK_CLI} deploy" in readme
    assert f"npx {CDK_CLI} bootstrap" in readme


@pytest.mark.parametrize(
    "forcing", [{"FORCE_COLOR": "0"}, {"FORCE_COLOR": "1"}, {"CLICOLOR_FORCE": "1"}, {"UV_FORCE_COLOR": "1"}]
)
def test_a_build_asks_uv_for_no_colour_whatever_the_caller_forces(forcing: dict[str, str]) -> None:
    # Given a caller that forces colour (the CDK CLI sets FORCE_COLOR=0: its presence forces it)
    environment = build_environment({"PATH": "/usr/bin", "HOME": "/root", **forcing})

    # Then the build's environment forces none, and asks for no colour and no user config
    assert not set(forcing) & set(environment)
    assert environment["NO_COLOR"] == "1"
    assert environment["UV_NO_CONFIG"] == "1"
    assert environment["PATH"] == "/usr/bin"


def test_the_locked_requirements_carry_no_escape_codes_under_a_forced_colour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the environment the CDK CLI gives the app
    monkeypatch.setenv("FORCE_COLOR", "0")

    # When the layer's requirements are read from uv.lock by the real uv
    result = run_uv(LOCKED_REQUIREMENTS, PROJECT_ROOT)

    # Then they are plain requirement lines, as `uv pip install --requirement` reads them
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert "pydantic==" in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npx") is None, reason="the CDK CLI needs Node.js's npx (README: deploy)")
def test_the_cdk_cli_synthesises_the_app_as_a_user_runs_it(tmp_path: Path) -> None:
    # Given the CLI the README pins, run as a user runs it (it gives the app its own environment)
    environment = {name: value for name, value in os.environ.items() if not name.startswith("CDK_")}
    environment.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

    # When it synthesises the app from cdk.json
    result = subprocess.run(  # noqa: S603 - the README's command
        ["npx", "--yes", CDK_CLI, "synth", "--quiet", "--output", str(tmp_path)],  # noqa: S607
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )

    # Then it passes and writes the stack's template
    assert result.returncode == 0, result.stderr[-4000:]
    template = json.loads((tmp_path / "RunnerPool.template.json").read_text())
    assert template["Resources"]
