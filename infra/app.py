"""Builds the CDK app: the stack configured from cdk.json's "runner-pool" context (or a config file named
by the "runner-pool-config" context), checked by cdk-nag."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from infra.dependency_layer import DependencyLayer, dependency_layer
from infra.stack import RunnerPoolStack
from runner_pool.domain.config import ConfigError, load_deployable_config

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_CONTEXT_KEY = "runner-pool"
CONFIG_FILE_CONTEXT_KEY = "runner-pool-config"
"""`-c runner-pool-config=path.json`: settings from that file instead of cdk.json's "runner-pool"."""
STACK_ID = "RunnerPool"


def project_context() -> dict[str, Any]:
    """The context in cdk.json: the pool configuration and the CDK feature flags."""
    context: dict[str, Any] = json.loads((PROJECT_ROOT / "cdk.json").read_text())["context"]
    return context


def build_app(
    context: Mapping[str, Any] | None = None,
    outdir: str | None = None,
    layer: DependencyLayer | None = None,
) -> App:
    """The app with its one stack; cdk-nag's AwsSolutions findings fail `app.synth()`.

    `context` defaults to cdk.json's, so `python app.py` synthesises what `cdk synth` does; context
    the CDK CLI passes in (`--context`, cdk.context.json) still takes precedence. A bad or incomplete
    pool configuration raises ConfigError before anything is built. `layer` is the Lambdas'
    dependency layer, built (or taken from its cache) when not given.
    """
    app = App(context=dict(project_context() if context is None else context), outdir=outdir)
    config = load_deployable_config(pool_settings(app))
    RunnerPoolStack(app, STACK_ID, config=config, layer=layer or dependency_layer())
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


def pool_settings(app: App) -> Mapping[str, Any] | None:
    """The operator's settings: the config file's when one is named, else the "runner-pool" context."""
    path = app.node.try_get_context(CONFIG_FILE_CONTEXT_KEY)
    if path:
        source = f"{CONFIG_FILE_CONTEXT_KEY} ({path})"
        try:
            settings = json.loads(Path(path).read_text())
        except OSError as error:
            raise ConfigError(
                [f"{source}: cannot be read ({error.strerror}); fix: name an existing file"]
            ) from None
        except json.JSONDecodeError as error:
            raise ConfigError([f"{source}: is not JSON ({error}); fix: write one JSON object"]) from None
    else:
        source = CONFIG_CONTEXT_KEY
        settings = app.node.try_get_context(CONFIG_CONTEXT_KEY)
    if settings is not None and not isinstance(settings, Mapping):
        raise ConfigError([f"{source}: is {settings!r}, not a mapping of settings; fix: write a JSON object"])
    return settings
