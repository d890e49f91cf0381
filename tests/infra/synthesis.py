"""Synthesising the CDK app for tests: as cdk.json configures it, or with other pool settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import App
from aws_cdk.assertions import Template

from infra.app import CONFIG_CONTEXT_KEY, STACK_ID, build_app, project_context
from infra.stack import RunnerPoolStack
from runner_pool.domain.config import StackConfig, load_config

CUSTOM_SETTINGS: dict[str, Any] = {
    "resource_classes": {
        "small": {"cpu": 1, "memory_mib": 2048},
        "build-farm": {"cpu": 48, "memory_mib": 96 * 1024},
    },
    "defaults": {"resource_class": "small"},
    "timeouts": {"idle_seconds": 3600},
}
"""An operator's own class list and idle time, unlike the design's defaults in every respect."""


@dataclass(frozen=True)
class Synthesis:
    config: StackConfig
    app: App
    stack: RunnerPoolStack
    template: Template


def app_with(settings: Mapping[str, Any] | None, outdir: Path) -> App:
    """The app as cdk.json configures it, with the "runner-pool" settings replaced when given."""
    context = project_context()
    if settings is not None:
        context[CONFIG_CONTEXT_KEY] = dict(settings)
    return build_app(context, outdir=str(outdir))


def stack_of(app: App) -> RunnerPoolStack:
    stack = app.node.find_child(STACK_ID)
    assert isinstance(stack, RunnerPoolStack)
    return stack


def synthesize(settings: Mapping[str, Any] | None, outdir: Path) -> Synthesis:
    """Synthesise with cdk-nag, as `make synth` does; any unacknowledged finding raises here."""
    app = app_with(settings, outdir)
    app.synth()
    stack = stack_of(app)
    config = load_config(project_context()[CONFIG_CONTEXT_KEY] if settings is None else settings)
    return Synthesis(config=config, app=app, stack=stack, template=Template.from_stack(stack))
