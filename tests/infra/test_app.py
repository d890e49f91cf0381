"""The app as a whole: cdk-nag's verdict, its acknowledgements, and how a bad configuration fails synth."""

from __future__ import annotations

import json
import os
import re
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
FUNCTION = r"(Provision|Release)/Workflow/[A-Za-z]+|Refresh/Refresh|Interruptions/Hear|GitHubTokens/GithubToken|Ingress/(Webhook|Dispatcher|FollowUp/(Gather|Start))"
EXPIRING = r"Provision/Workflow/(Claim|Create|Discard|Dump|Finish)Role|Refresh/RefreshRole"
"""Roles that act on the stack's tagged instances: terminate (and, the claim, start; refresh, stop)."""
LAUNCHING = r"Provision/Workflow/CreateRole|Refresh/RefreshRole"
LAUNCHED = r"(fleet|instance|volume|network-interface|spot-instances-request|subnet|security-group)"
REVIEWED = {
    ("PoolQueues", r"AwsSolutions-SQS3"),
    ("Instances/Role", re.escape(f"AwsSolutions-IAM5[Resource::{ANY_INSTANCE_FINDING}]")),
    # X-Ray (every function, every state machine), EC2's Describe actions, SQS ListQueues, log delivery
    (
        rf"({FUNCTION})Role|((Provision|Release)/Workflow|Ingress/FollowUp)/StateMachine/Role",
        re.escape("AwsSolutions-IAM5[Resource::*]"),
    ),
    (FUNCTION, "AwsSolutions-L1"),
    # Notice queues exist only at run time, one per instance (runner_pool.domain.notices): Begin, the
    # claim and hand-over steps send to them, creation and refresh open them, the instance role receives from its
    # own (a tag condition)
    (
        r"Instances/Role|(Provision/Workflow/(Begin|Claim|Create|CheckFleet)|Release/Workflow/GiveBack|Refresh/Refresh)Role",
        re.escape("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:")
        + r"[A-Za-z0-9-]+-notice-\*\]",
    ),
    ("((Provision|Release)/Workflow|Ingress/FollowUp)/StateMachine", "AwsSolutions-SF1"),
    (EXPIRING, re.escape(f"AwsSolutions-IAM5[Resource::{ANY_INSTANCE_FINDING}]")),
    (
        LAUNCHING,
        re.escape("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:")
        + LAUNCHED
        + re.escape("/*]"),
    ),
    (LAUNCHING, re.escape("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>::image/*]")),
    (
        "Ingress",
        re.escape("AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/")
        + "AmazonAPIGatewayPushToCloudWatchLogs]",
    ),
    ("Ingress/Api", "AwsSolutions-(APIG2|APIG3|APIG4|COG4)"),
    # The runner image's build role: the SSM agent's managed core, AWSTOE's buckets, its own components'
    # build versions and its own build log groups; the lifecycle role: AWS's policy for it
    (
        "RunnerImage/BuildRole",
        re.escape(
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]"
        ),
    ),
    (
        "RunnerImage/BuildRole",
        re.escape("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::ec2imagebuilder*]"),
    ),
    (
        "RunnerImage/BuildRole",
        re.escape(
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:imagebuilder:<AWS::Region>:<AWS::AccountId>:"
        )
        + r"component/runnerpool-runner-(x64|arm64)/\*\]",
    ),
    (
        "RunnerImage/BuildRole",
        re.escape(
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
            "/aws/imagebuilder/runnerpool-runner-*"
        )
        + r"(:\*)?\]",
    ),
    (
        "RunnerImage/LifecycleRole",
        re.escape(
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
            "service-role/EC2ImageBuilderLifecycleExecutionPolicy]"
        ),
    ),
}
"""(construct path, rule) patterns of every acknowledgement a reviewer has read, with its reason in the code."""


def test_cdk_nag_finds_nothing_unacknowledged(synthesis: Synthesis) -> None:
    # Given the synthesised app / When AwsSolutions checks its whole tree
    report = AwsSolutionsChecks().validate_scope(synthesis.app)

    # Then there is no finding left
    findings = [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations]
    assert findings == []


def test_every_acknowledgement_is_expected_and_explained(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When the rules acknowledged anywhere in its tree are collected
    reasons = {
        (construct.node.path.removeprefix("RunnerPool/"), rule.split("::", 1)[-1]): reason
        for construct in synthesis.stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type == ACKNOWLEDGED
        for rule, reason in entry.data.items()
    }

    # Then each is one of the reviewed kinds, on the constructs that kind belongs to
    unexpected = {
        (path, rule)
        for path, rule in reasons
        if not any(re.fullmatch(where, path) and re.fullmatch(what, rule) for where, what in REVIEWED)
    }
    assert unexpected == set()
    # And every reviewed kind is still needed somewhere (a stale one would hide a new finding)
    unused = {
        (where, what)
        for where, what in REVIEWED
        if not any(re.fullmatch(where, path) and re.fullmatch(what, rule) for path, rule in reasons)
    }
    assert unused == set()
    # And each comes with a reason a reviewer can weigh
    assert all(len(reason.split()) >= 15 for reason in reasons.values())


def test_a_finding_fails_synthesis(tmp_path: Path) -> None:
    # Given the app with a queue that breaks AwsSolutions rules (no SSL-only policy, no DLQ)
    app = app_with(
        {"resource_classes": {"large": {"cpu": 2, "memory_mib": 4096}}}, tmp_path, stage_assets=False
    )
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
