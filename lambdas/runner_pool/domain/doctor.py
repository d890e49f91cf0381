"""`runner-pool doctor`'s checks of a deployment: what each reads, what it stops when wrong, its fix.

Each check is one row of CHECKS (like domain/labels.py's LABEL_KEYS): its name, what it reads (GitHub's
and AWS's answers, the stack's outputs and config), what a failure stops, and the judge
(domain/doctor_judges.py) that turns the Readings (domain/doctor_readings.py) into one Finding, a line
with the fix. A check whose failure stops jobs FAILs (the doctor exits non-zero); the others warn. The
readings are gathered by the adapters (adapters/github_readings.py, adapters/account_readings.py);
nothing here reads anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from runner_pool.domain.doctor_judges import (
    Judged,
    app_events,
    app_permissions,
    ebs,
    images,
    installation,
    lambda_concurrency,
    registration,
    runner_group,
    runner_policy,
    secrets,
    service_linked_roles,
    webhook,
)
from runner_pool.domain.doctor_readings import Readings


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: Verdict
    found: str
    fix: str = ""

    def line(self, width: int = 0) -> str:
        fix = f"; fix: {self.fix}" if self.fix and self.verdict is not Verdict.OK else ""
        return f"{self.verdict.value:<4}  {self.check:<{width}}  {self.found}{fix}"


@dataclass(frozen=True)
class Check:
    """One row: the check's name, what must hold, what it reads, what a failure stops ("" when nothing: it
    warns)."""

    name: str
    holds: str
    reads: str
    stops: str
    judge: Callable[[Readings], Judged] = field(repr=False)

    def run(self, readings: Readings) -> Finding:
        judged = self.judge(readings)
        if judged.ok:
            verdict = Verdict.OK
        elif self.stops and not judged.warn_only:
            verdict = Verdict.FAIL
        else:
            verdict = Verdict.WARN
        return Finding(self.name, verdict, judged.found, judged.fix)


CHECKS: tuple[Check, ...] = (
    Check(
        "app permissions",
        "the App has every permission its manifest asks for (github-app-manifest.json, or "
        "github-app-manifest.personal-account.json for repository registration)",
        "`GET /app` (App JWT)",
        "every registration",
        app_permissions,
    ),
    Check(
        "app events",
        "the App is subscribed to every event the manifest names",
        "`GET /app` (App JWT)",
        "every job's webhook",
        app_events,
    ),
    Check(
        "installation",
        "the installation's owner accepted those permissions",
        "`GET /app/installations/{id}` (App JWT)",
        "every registration",
        installation,
    ),
    Check(
        "registration",
        "the installation's account has what `github.registration` uses (runner groups: an organisation) and "
        "accepted the permission it needs (`organization_self_hosted_runners: write` for runner groups, "
        "`administration: write` for repositories; an organisation registering at repositories warns)",
        "the config; `GET /app/installations/{id}` (App JWT): `target_type`, `permissions`",
        "every registration",
        registration,
    ),
    Check(
        "repository runners",
        "with repository registration, the organisation lets repositories create repository-level runners "
        "(`selected` warns)",
        "`GET /orgs/{org}/actions/permissions/self-hosted-runners`",
        "every registration",
        runner_policy,
    ),
    Check(
        "runner group",
        "runner groups: the organisation has one of runner-pool's beside Default (none yet warns); "
        "repository registration: `github.runner_group_id` is the Default group (1), the only one a "
        "repository has",
        "the config; `GET /orgs/{org}/actions/runner-groups`",
        "every registration",
        runner_group,
    ),
    Check(
        "webhook",
        "the App's webhook URL is the stack's `WebhookUrl`, content type `json`, a secret set",
        "`GET /app/hook/config` (App JWT); the stack's outputs",
        "every job's webhook",
        webhook,
    ),
    Check(
        "secrets",
        "the App's private key and the webhook secret exist and are not empty",
        "`secretsmanager:GetSecretValue`",
        "every job",
        secrets,
    ),
    Check(
        "ebs encryption",
        "`instances.ebs_kms_key_arn` is set, or the account's default EBS key is AWS managed",
        "`ec2:GetEbsEncryptionByDefault`, `ec2:GetEbsDefaultKmsKeyId`, `kms:DescribeKey`",
        "every launch",
        ebs,
    ),
    Check(
        "lambda concurrency",
        "unreserved Lambda concurrency covers the provision Map's `MaxConcurrency` "
        "(from 10 up to it warns: throttled claims are retried)",
        "`lambda:GetAccountSettings`; the deployed provision state machine",
        "larger provisions",
        lambda_concurrency,
    ),
    Check(
        "service-linked roles",
        "`AWSServiceRoleForEC2Fleet` and `AWSServiceRoleForEC2Spot` exist (the first CreateFleet makes them)",
        "`iam:GetRole`",
        "",
        service_linked_roles,
    ),
    Check(
        "runner image",
        "each launch template's image (through its `resolve:ssm:` parameter) exists and is available",
        "`ec2:DescribeLaunchTemplateVersions`, `ssm:GetParameter`, `ec2:DescribeImages`",
        "every launch",
        images,
    ),
)


def table() -> list[str]:
    """CHECKS as the README's Markdown table (tests/unit/test_doctor_checks.py holds the README to it)."""
    rows = [f"| {c.name} | {c.holds} | {c.reads} | {c.stops or 'nothing: it warns'} |" for c in CHECKS]
    return ["| check | what must hold | reads | a failure stops |", "|---|---|---|---|", *rows]


def examine(readings: Readings) -> list[Finding]:
    """Every check's finding, in CHECKS' order."""
    return [check.run(readings) for check in CHECKS]


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when anything would stop jobs, else 0 (warnings do not)."""
    return 1 if any(f.verdict is Verdict.FAIL for f in findings) else 0


def summary(findings: Sequence[Finding]) -> str:
    failed = sum(1 for f in findings if f.verdict is Verdict.FAIL)
    warned = sum(1 for f in findings if f.verdict is Verdict.WARN)
    if failed:
        return (
            f"{failed} problem(s) stop jobs, {warned} warning(s): fix the FAIL lines and run the doctor again"
        )
    return f"all clear: nothing stops jobs ({warned} warning(s))"


def report(findings: Sequence[Finding]) -> list[str]:
    """The doctor's lines: one per check, then the summary."""
    width = max(len(f.check) for f in findings)
    return [*(f.line(width) for f in findings), summary(findings)]
