"""Fixtures: the CDK app synthesised once per session (jsii makes each synthesis cost seconds)."""

from __future__ import annotations

import os

import pytest

# jsii reads this when its Node process starts, on the first import of aws_cdk below; the Makefile
# sets it too, but not when pytest is run directly.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from tests.infra.synthesis import CUSTOM_SETTINGS, Synthesis, synthesize


@pytest.fixture(scope="session")
def synthesis(tmp_path_factory: pytest.TempPathFactory) -> Synthesis:
    """The stack exactly as cdk.json configures it."""
    return synthesize(None, tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture(scope="session")
def custom_synthesis(tmp_path_factory: pytest.TempPathFactory) -> Synthesis:
    """The stack with an operator's own classes, idle time, workflow type and alarm address (its template
    only: assets are not staged)."""
    return synthesize(CUSTOM_SETTINGS, tmp_path_factory.mktemp("cdk.out-custom"), stage_assets=False)
