"""Builds the CDK app: the stack configured from cdk.json's "runner-pool" context, checked by cdk-nag."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from infra.stack import RunnerPoolStack
from runner_pool.domain.config import ConfigError, load_config

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_CONTEXT_KEY = "runner-pool"
STACK_ID = "RunnerPool"


def project_context() -> dict[str, Any]:
    """The context in cdk.json: the pool configuration and the CDK feature flags."""
    context: dict[str, Any] = json.loads((PROJECT_ROOT / "cdk.json").read_text())["context"]
    return context


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> App:
    """The app with its one stack; cdk-nag's AwsSolutions findings fail `app.synth()`.

    `context` defaults to cdk.json's, so `python app.py` synthesises what `cdk synth` does; context
    the CDK CLI passes in (`--context`, cdk.context.json) still takes precedence. A bad pool
    configuration raises ConfigError before anything is built.
    """
    app = App(context=dict(project_context() if context is None else context), outdir=outdir)
    settings = app.node.try_get_context(CONFIG_CONTEXT_KEY)
    if settings is not None and not isinstance(settings, Mapping):
        problem = f"{CONFIG_CONTEXT_KEY}: is {settings!r}, not a mapping of settings"
        raise ConfigError([f"{problem}; fix: write it as a JSON object of settings"])
    RunnerPoolStack(app, STACK_ID, config=load_config(settings))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app
