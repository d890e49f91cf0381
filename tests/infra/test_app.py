"""The app as a whole: cdk-nag's verdict, its acknowledgements, and how a bad configuration fails synth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import Validations
from aws_cdk import aws_sqs as sqs
from cdk_nag import AwsSolutionsChecks

from infra.app import CONFIG_CONTEXT_KEY, PROJECT_ROOT
from infra.constructs.instances import ANY_INSTANCE_FINDING
from tests.infra.synthesis import Synthesis, app_with, stack_of

ACKNOWLEDGED = Validations.ACKNOWLEDGED_RULES_METADATA_KEY


def test_cdk_nag_finds_nothing_unacknowledged(synthesis: Synthesis) -> None:
    # Given the synthesised app / When AwsSolutions checks its whole tree
    report = AwsSolutionsChecks().validate_scope(synthesis.app)

    # Then there is no finding left
    findings = [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations]
    assert findings == []


def test_every_acknowledgement_is_expected_and_explained(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When the rules acknowledged anywhere in its tree are collected
    reasons = {
        (construct.node.path, rule.split("::", 1)[-1]): reason
        for construct in synthesis.stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type == ACKNOWLEDGED
        for rule, reason in entry.data.items()
    }

    # Then only the reviewed ones are there, each with a reason a reviewer can weigh
    assert set(reasons) == {
        ("RunnerPool/PoolQueues", "AwsSolutions-SQS3"),
        ("RunnerPool/Instances/Role", f"AwsSolutions-IAM5[Resource::{ANY_INSTANCE_FINDING}]"),
    }
    assert all(len(reason.split()) >= 15 for reason in reasons.values())


def test_a_finding_fails_synthesis(tmp_path: Path) -> None:
    # Given the app with a queue that breaks AwsSolutions rules (no SSL-only policy, no DLQ)
    app = app_with({"resource_classes": {"large": {"cpu": 2, "memory_mib": 4096}}}, tmp_path)
    sqs.Queue(stack_of(app), "Unguarded")

    # When it is synthesised / Then synthesis fails
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()

    # And the report names the findings on that queue
    report = json.loads((tmp_path / "validation-report.json").read_text())
    flagged = {
        violation["ruleName"]
        for plugin in report["pluginReports"]
        for violation in plugin["violations"]
        if any(
            c["constructPath"].startswith("RunnerPool/Unguarded/") for c in violation["violatingConstructs"]
        )
    }
    assert {"AwsSolutions-SQS3", "AwsSolutions-SQS4"} <= flagged


def test_a_bad_configuration_fails_synth_with_a_message_naming_the_setting(tmp_path: Path) -> None:
    # Given cdk context whose xlarge class has more vCPUs than large but less memory
    settings = {
        "resource_classes": {
            "large": {"cpu": 2, "memory_mib": 4096},
            "xlarge": {"cpu": 4, "memory_mib": 2048},
        }
    }
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({CONFIG_CONTEXT_KEY: settings}),
        "CDK_OUTDIR": str(tmp_path),
    }

    # When app.py runs, as the CDK CLI and `make synth` run it
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False
    )

    # Then synth fails with the setting and its fix, not a stack trace
    assert result.returncode != 0
    assert "resource_classes.xlarge.memory_mib" in result.stderr
    assert "fix: give xlarge more than 4096 MiB" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "manifest.json").exists()
