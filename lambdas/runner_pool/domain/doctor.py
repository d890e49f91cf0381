"""`runner-pool doctor`'s checks of a deployment: what each reads, what it stops when wrong, its fix.

Each check is one row of CHECKS (like domain/labels.py's LABEL_KEYS): its name, what it reads (GitHub's
and AWS's answers, the stack's outputs and config), what a failure stops, and the judge that turns the
Readings into one Finding, a line with the fix. A check whose failure stops jobs FAILs (the doctor exits
non-zero); the others warn. The readings are gathered by the adapters (adapters/github_readings.py,
adapters/account_readings.py); nothing here reads anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Arch
from runner_pool.domain.runner_scope import REGISTRATION_PERMISSIONS, OrganizationScope, Registration
from runner_pool.domain.runners import DEFAULT_RUNNER_GROUP_ID

T = TypeVar("T")

SERVICE_LINKED_ROLES: Mapping[str, str] = MappingProxyType(
    {"AWSServiceRoleForEC2Fleet": "ec2fleet.amazonaws.com", "AWSServiceRoleForEC2Spot": "spot.amazonaws.com"}
)
"""The roles EC2 Fleet and Spot act through, by name, with the service that owns each (EC2 User Guide,
"EC2 Fleet prerequisites", "Service-linked role for EC2 Fleet"; the same pairs as
infra/constructs/permissions.py's SERVICE_LINKED_ROLES, which grants the stack their creation)."""
AWS_MANAGED_EBS_ALIAS = "alias/aws/ebs"
PERMISSION_LEVELS = ("read", "write", "admin")
"""A GitHub App permission's levels, each including the ones before it."""
LAMBDA_QUOTA_CODE = "L-B99A9384"
"""Service Quotas' code of Lambda's "Concurrent executions" quota."""
THROTTLED_QUOTA_FLOOR = 10
"""The lowest unreserved concurrency at which provisions are known to finish, throttled and retried
(a new account's quota; bench/results.json's burst_300_at_concurrency_10_failed_executions_count); above
it and below the provision Map's concurrency the doctor warns."""
EBS_KEY_POLICY_DOCS = "https://docs.aws.amazon.com/ebs/latest/userguide/ebs-encryption-requirements.html"
"""What the roles that launch and start instances need on a customer managed key of their volumes (granted
by infra/constructs/permissions.py's use_volume_key once instances.ebs_kms_key_arn names it)."""


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Unread:
    """A reading that could not be made: why (GitHub's or AWS's own words), and whether it was refused for
    want of a permission to read it (as opposed to a wrong credential or an outage)."""

    reason: str
    forbidden: bool = False


@dataclass(frozen=True)
class AppManifest:
    """What the App asks for: its manifest's `default_permissions` and `default_events`
    (github-app-manifest.json for runner groups, github-app-manifest.personal-account.json for repository
    registration)."""

    permissions: Mapping[str, str]
    events: frozenset[str]

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> AppManifest:
        return cls(
            dict(manifest.get("default_permissions", {})), frozenset(manifest.get("default_events", ()))
        )


@dataclass(frozen=True)
class AppGrant:
    """The App as GitHub has it (GET /app): its permissions and the events it is subscribed to."""

    permissions: Mapping[str, str]
    events: frozenset[str]


@dataclass(frozen=True)
class Installation:
    """One installation (GET /app/installations/{id}): whose, and what its owner accepted."""

    account: str
    organization: bool
    permissions: Mapping[str, str]


class RunnerPolicy(StrEnum):
    """An organisation's `enabled_repositories` for repository-level self-hosted runners (GET
    /orgs/{org}/actions/permissions/self-hosted-runners)."""

    ALL = "all"
    SELECTED = "selected"
    NONE = "none"


@dataclass(frozen=True)
class HookConfig:
    """The App's webhook (GET /app/hook/config): GitHub shows a set secret as `********`, never its value."""

    url: str | None
    content_type: str | None
    secret_set: bool


class SecretState(StrEnum):
    PRESENT = "present"
    EMPTY = "empty"
    MISSING = "missing"


@dataclass(frozen=True)
class EbsDefault:
    """The account's EBS encryption defaults in the stack's region."""

    encrypted_by_default: bool
    key_id: str
    """As EC2 answers it: `alias/aws/ebs` or a key ARN."""
    aws_managed: bool
    """Whether the key is AWS managed (KMS's KeyManager `AWS`), which EBS may use without any grant."""


@dataclass(frozen=True)
class LambdaQuota:
    concurrent: int
    """AccountLimit.ConcurrentExecutions."""
    unreserved: int
    """AccountLimit.UnreservedConcurrentExecutions: what functions without reserved concurrency share."""


@dataclass(frozen=True)
class LaunchImage:
    """What one launch template boots: its ImageId (an AMI id or `resolve:ssm:<parameter>`), the AMI that
    resolves to (None: the parameter is missing), and that AMI's state (None: no such image)."""

    arch: Arch
    template_id: str
    image_ref: str
    image_id: str | None
    state: str | None


@dataclass(frozen=True)
class DeployedStack:
    """What the deployment says of itself: its config (the functions' environment) and its outputs."""

    config: StackConfig
    webhook_url: str


@dataclass(frozen=True)
class Readings:
    """Everything the checks look at, each read once; a failed read is an Unread in its place."""

    stack: DeployedStack
    manifest: AppManifest
    app: AppGrant | Unread
    installation: Installation | Unread
    runner_policy: RunnerPolicy | Unread | None
    """None: the installation's account is not an organisation, which has no such policy."""
    runner_groups: tuple[int, ...] | Unread | None
    """The organisation's runner group ids; None when the account is not an organisation."""
    hook: HookConfig | Unread
    secrets: Mapping[str, SecretState | Unread]
    ebs: EbsDefault | Unread
    lambda_quota: LambdaQuota | Unread
    map_concurrency: int | Unread
    """The largest MaxConcurrency of the provision state machine's Map states, as deployed (0: unbounded)."""
    service_roles: Mapping[str, bool | Unread]
    images: Sequence[LaunchImage] | Unread


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
class _Judged:
    """A judge's answer before its row names it: whether the check passed, what was found, the fix."""

    ok: bool
    found: str
    fix: str = ""
    warn_only: bool = False
    """A problem that does not stop jobs even where the check's failures usually do."""


@dataclass(frozen=True)
class Check:
    """One row: the check's name, what must hold, what it reads, what a failure stops ("" when nothing: it
    warns)."""

    name: str
    holds: str
    reads: str
    stops: str
    judge: Callable[[Readings], _Judged] = field(repr=False)

    def run(self, readings: Readings) -> Finding:
        judged = self.judge(readings)
        if judged.ok:
            verdict = Verdict.OK
        elif self.stops and not judged.warn_only:
            verdict = Verdict.FAIL
        else:
            verdict = Verdict.WARN
        return Finding(self.name, verdict, judged.found, judged.fix)


# --- judges ---------------------------------------------------------------------------------------


def _level(value: str | None) -> int:
    return PERMISSION_LEVELS.index(value) + 1 if value in PERMISSION_LEVELS else 0


def _short_of(needed: Mapping[str, str], granted: Mapping[str, str]) -> list[str]:
    return [
        f"{name}: {level}"
        for name, level in sorted(needed.items())
        if _level(granted.get(name)) < _level(level)
    ]


def _unread(reading: Unread, what: str, fix: str) -> _Judged:
    return _Judged(False, f"could not read {what}: {reading.reason}", fix)


APP_CREDENTIALS_FIX = "check github.app_id and the private key secret (the App's settings, Private keys)"


def _app_permissions(r: Readings) -> _Judged:
    if isinstance(r.app, Unread):
        return _unread(r.app, "the App (GET /app)", APP_CREDENTIALS_FIX)
    short = _short_of(r.manifest.permissions, r.app.permissions)
    if short:
        return _Judged(
            False,
            f"the App lacks {', '.join(short)} (its manifest asks for them)",
            f"grant {', '.join(short)} in the App's settings, Permissions & events",
        )
    granted = ", ".join(f"{k}: {v}" for k, v in sorted(r.manifest.permissions.items()))
    return _Judged(True, f"the App has {granted}")


def _app_events(r: Readings) -> _Judged:
    if isinstance(r.app, Unread):
        return _unread(r.app, "the App (GET /app)", APP_CREDENTIALS_FIX)
    missing = sorted(r.manifest.events - r.app.events)
    if missing:
        return _Judged(
            False,
            f"the App is not subscribed to {', '.join(missing)}: no job reaches the stack",
            f"subscribe to {', '.join(missing)} in the App's settings, Permissions & events",
        )
    return _Judged(True, f"subscribed to {', '.join(sorted(r.manifest.events))}")


def _installation(r: Readings) -> _Judged:
    installation_id = r.stack.config.github.installation_id
    if isinstance(r.installation, Unread):
        return _unread(
            r.installation,
            f"installation {installation_id}",
            "check github.installation_id (the number in the installation's settings URL)",
        )
    short = _short_of(r.manifest.permissions, r.installation.permissions)
    if short:
        where = (
            f"https://github.com/organizations/{r.installation.account}/settings/installations/{installation_id}"
            if r.installation.organization
            else f"https://github.com/settings/installations/{installation_id}"
        )
        return _Judged(
            False,
            f"installation {installation_id} on {r.installation.account} has not accepted {', '.join(short)}",
            f"an owner of {r.installation.account} reviews and accepts the App's new permissions at {where}",
        )
    return _Judged(True, f"installation {installation_id} on {r.installation.account} accepted them")


def _runner_policy(r: Readings) -> _Judged:
    account = r.installation.account if isinstance(r.installation, Installation) else "the organisation"
    if r.stack.config.github.effective_registration is Registration.RUNNER_GROUP:
        return _Judged(True, f"not used: runners are registered in {account}'s runner groups")
    settings = f"https://github.com/organizations/{account}/settings/actions/runners"
    if isinstance(r.runner_policy, Unread):
        return _Judged(
            False,
            f"could not read {account}'s policy on repository-level runners: {r.runner_policy.reason}",
            f"look at {settings} (or grant the App Organization administration: read so the doctor can)",
            warn_only=r.runner_policy.forbidden,
        )
    if r.runner_policy is None:
        return _Judged(True, f"{account} is not an organisation: no policy limits repository runners")
    if r.runner_policy is RunnerPolicy.NONE:
        return _Judged(
            False,
            f"{account} allows no repository to create repository-level runners: every registration "
            "is refused",
            f"an owner allows them for all (or selected) repositories at {settings}",
        )
    if r.runner_policy is RunnerPolicy.SELECTED:
        return _Judged(
            False,
            f"{account} allows repository-level runners for selected repositories only: jobs of others are "
            "refused their runner",
            f"add the repositories that use the pool at {settings}",
            warn_only=True,
        )
    return _Judged(True, f"{account} allows repository-level runners for all repositories")


def _registration(r: Readings) -> _Judged:
    github = r.stack.config.github
    registration = github.effective_registration
    how = "set" if github.registration is not None else f"the default for the scope {github.scope}"
    said = f"github.registration {registration} ({how})"
    if isinstance(r.installation, Unread):
        return _unread(
            r.installation,
            f"installation {github.installation_id}",
            "check github.installation_id (the number in the installation's settings URL)",
        )
    account = r.installation.account
    if registration is Registration.RUNNER_GROUP and not r.installation.organization:
        return _Judged(
            False,
            f"{said}, but {account} is a personal account (its installation's target_type is User), "
            "which has no runner groups: every registration is refused",
            f"set github.scope to {account}/<repository> (registered at the repository, the only way on a "
            "personal account), give the App repository administration: write "
            "(github-app-manifest.personal-account.json) and deploy",
        )
    permission, level = REGISTRATION_PERMISSIONS[registration]
    by_group = isinstance(github.scope, OrganizationScope)
    if _level(r.installation.permissions.get(permission)) < _level(level):
        if registration is Registration.RUNNER_GROUP:
            instead = "; or set github.registration: repository, which needs administration: write instead"
        elif by_group:
            instead = "; or leave github.registration out to register in runner groups, which need less"
        else:
            instead = ""
        return _Judged(
            False,
            f"{said} needs {permission}: {level}, which installation {github.installation_id} on {account} "
            "has not got: every registration is refused",
            f"give the App {permission}: {level} in its settings, Permissions & events (its manifest asks "
            f"for it), and have an owner of {account} accept it{instead}",
        )
    if registration is Registration.REPOSITORY and by_group and r.installation.organization:
        return _Judged(
            False,
            f"{said}: every runner is registered at its job's repository, so the App holds administration: "
            f"write on {account}'s repositories, which reaches their settings, collaborators and deletion",
            "leave github.registration out to register in runner groups, with only "
            "organization_self_hosted_runners: write (github-app-manifest.json)",
            warn_only=True,
        )
    return _Judged(
        True, f"{said}: installation {github.installation_id} on {account} has {permission}: {level}"
    )


def _runner_group(r: Readings) -> _Judged:
    if r.stack.config.github.effective_registration is Registration.RUNNER_GROUP:
        return _own_runner_groups(r)
    group = r.stack.config.github.runner_group_id
    if group == DEFAULT_RUNNER_GROUP_ID:
        return _Judged(True, f"github.runner_group_id {group}: the Default group, the one a repository has")
    in_org = ""
    if isinstance(r.runner_groups, tuple) and group in r.runner_groups:
        in_org = f" (group {group} is an organisation's group, not a repository's)"
    return _Judged(
        False,
        f"github.runner_group_id {group}: runners are registered at each job's repository, which has only "
        f"the Default group ({DEFAULT_RUNNER_GROUP_ID}){in_org}; every registration fails",
        f"set github.runner_group_id to {DEFAULT_RUNNER_GROUP_ID} (or leave it out) and deploy",
    )


def _own_runner_groups(r: Readings) -> _Judged:
    account = r.installation.account if isinstance(r.installation, Installation) else "the organisation"
    if isinstance(r.runner_groups, Unread):
        return _unread(
            r.runner_groups,
            f"{account}'s runner groups",
            "give the App organization_self_hosted_runners: write, which registering in runner groups needs",
        )
    made = [group for group in r.runner_groups or () if group != DEFAULT_RUNNER_GROUP_ID]
    if made:
        return _Judged(True, f"{account} has {len(made)} runner group(s) beside Default")
    return _Judged(
        False,
        f"{account} has only the Default group so far; runner-pool makes one per repository at that "
        "repository's first job, and where GitHub refuses to (a plan or GitHub Enterprise Server release "
        "without runner groups beyond Default) every registration is refused in GitHub's words "
        "(RegistrationsRefused)",
        "run one job: if its provision reports refused, set github.registration: repository and give the "
        "App repository administration: write (github-app-manifest.personal-account.json)",
        warn_only=True,
    )


def _webhook(r: Readings) -> _Judged:
    if isinstance(r.hook, Unread):
        return _unread(r.hook, "the App's webhook (GET /app/hook/config)", APP_CREDENTIALS_FIX)
    wrong: list[str] = []
    fixes: list[str] = []
    if r.hook.url != r.stack.webhook_url:
        wrong.append(f"its URL is {r.hook.url or 'unset'}, not the stack's WebhookUrl")
        fixes.append(f"set the App's Webhook URL to {r.stack.webhook_url}")
    if r.hook.content_type != "json":
        wrong.append(f"content type {r.hook.content_type or 'unset'}, not json")
        fixes.append("set content type application/json")
    if not r.hook.secret_set:
        wrong.append("no secret: every delivery is refused unsigned")
        fixes.append(
            f"set the App's Webhook secret to the value of {r.stack.config.github.webhook_secret_name}"
        )
    if wrong:
        return _Judged(False, "the App's webhook: " + "; ".join(wrong), "; ".join(fixes))
    return _Judged(True, f"{r.hook.url}, json, secret set")


def _secrets(r: Readings) -> _Judged:
    bad = []
    for name, state in r.secrets.items():
        if isinstance(state, Unread):
            bad.append(f"{name} could not be read ({state.reason})")
        elif state is not SecretState.PRESENT:
            bad.append(f"{name} is {state.value}")
    if bad:
        return _Judged(
            False,
            "; ".join(bad),
            "put the App's private key (PEM) and the webhook secret into them: "
            "aws secretsmanager put-secret-value --secret-id <name> --secret-string file://<file>",
        )
    return _Judged(True, f"{' and '.join(r.secrets)} hold values")


def _ebs(r: Readings) -> _Judged:
    if isinstance(r.ebs, Unread):
        return _unread(
            r.ebs, "the account's EBS encryption defaults", "run the doctor with ec2:GetEbs* allowed"
        )
    default = "on" if r.ebs.encrypted_by_default else "off"
    configured = r.stack.config.instances.ebs_kms_key_arn
    if configured is not None:
        return _Judged(
            True,
            f"encryption by default {default}; root volumes use instances.ebs_kms_key_arn {configured}, "
            "granted to the roles that launch and start instances",
        )
    if r.ebs.aws_managed:
        return _Judged(
            True,
            f"encryption by default {default}; root volumes use {r.ebs.key_id}, AWS managed: no grant needed",
        )
    return _Judged(
        False,
        f"encryption by default {default}; root volumes (encrypted, no key named) use the customer managed "
        f"key {r.ebs.key_id}, on which no role of the stack has a grant: launches fail",
        f"set instances.ebs_kms_key_arn to {r.ebs.key_id} (its key ARN) and deploy, as {EBS_KEY_POLICY_DOCS} "
        "requires of the roles that launch and start instances",
    )


def _lambda_concurrency(r: Readings) -> _Judged:
    if isinstance(r.lambda_quota, Unread):
        return _unread(
            r.lambda_quota, "the Lambda quota", "run the doctor with lambda:GetAccountSettings allowed"
        )
    if isinstance(r.map_concurrency, Unread):
        return _unread(r.map_concurrency, "the provision state machine", "deploy the stack")
    quota, needed = r.lambda_quota, r.map_concurrency
    if needed == 0:
        return _Judged(
            False,
            f"the provision Map's concurrency is unbounded: any quota ({quota.unreserved} unreserved) can be "
            "outrun",
            "deploy the stack as it is: its provision Map sets MaxConcurrency",
        )
    said = (
        f"{quota.unreserved} unreserved of {quota.concurrent} concurrent executions; "
        f"the provision Map runs {needed}"
    )
    if quota.unreserved < needed:
        fix = (
            f"ask for a Lambda concurrent executions quota ({LAMBDA_QUOTA_CODE}) of at least {needed} + what "
            "else runs in the account, in Service Quotas"
        )
        if quota.unreserved < THROTTLED_QUOTA_FLOOR:
            return _Judged(
                False, f"{said}: a larger provision's claims are throttled past their retries", fix
            )
        return _Judged(
            False,
            f"{said}: a larger provision's claims are throttled and retried, so it is slower",
            fix,
            warn_only=True,
        )
    return _Judged(True, said)


def _service_linked_roles(r: Readings) -> _Judged:
    missing = [name for name, there in r.service_roles.items() if there is not True]
    if missing:
        unread = [f"{n}: {s.reason}" for n, s in r.service_roles.items() if isinstance(s, Unread)]
        creates = "; ".join(
            f"aws iam create-service-linked-role --aws-service-name {SERVICE_LINKED_ROLES[name]}"
            for name in missing
        )
        return _Judged(
            False,
            f"{', '.join(missing)} not there"
            + (f" ({'; '.join(unread)})" if unread else "")
            + ": the stack's first CreateFleet makes them unless a policy forbids it",
            creates,
        )
    return _Judged(True, f"{' and '.join(r.service_roles)} exist")


def _images(r: Readings) -> _Judged:
    if isinstance(r.images, Unread):
        return _unread(r.images, "the launch templates", "deploy the stack")
    bad = []
    for image in r.images:
        if image.image_id is None:
            bad.append(
                f"{image.arch.value} ({image.template_id}) {image.image_ref}: the parameter does not exist"
            )
        elif image.state is None:
            bad.append(
                f"{image.arch.value} ({image.template_id}) {image.image_ref}: no image {image.image_id}"
            )
        elif image.state != "available":
            bad.append(f"{image.arch.value} ({image.template_id}) image {image.image_id} is {image.state}")
    if bad:
        return _Judged(
            False,
            "; ".join(bad) + ": no instance of that architecture launches",
            "point instances.ami_parameters at an existing AMI parameter, or run the runner image pipeline "
            "(RunnerImagePipelineArns), and deploy",
        )
    return _Judged(True, ", ".join(f"{i.arch.value} boots {i.image_id} (available)" for i in r.images))


CHECKS: tuple[Check, ...] = (
    Check(
        "app permissions",
        "the App has every permission its manifest asks for (github-app-manifest.json, or "
        "github-app-manifest.personal-account.json for repository registration)",
        "`GET /app` (App JWT)",
        "every registration",
        _app_permissions,
    ),
    Check(
        "app events",
        "the App is subscribed to every event the manifest names",
        "`GET /app` (App JWT)",
        "every job's webhook",
        _app_events,
    ),
    Check(
        "installation",
        "the installation's owner accepted those permissions",
        "`GET /app/installations/{id}` (App JWT)",
        "every registration",
        _installation,
    ),
    Check(
        "registration",
        "the installation's account has what `github.registration` uses (runner groups: an organisation) and "
        "accepted the permission it needs (`organization_self_hosted_runners: write` for runner groups, "
        "`administration: write` for repositories; an organisation registering at repositories warns)",
        "the config; `GET /app/installations/{id}` (App JWT): `target_type`, `permissions`",
        "every registration",
        _registration,
    ),
    Check(
        "repository runners",
        "with repository registration, the organisation lets repositories create repository-level runners "
        "(`selected` warns)",
        "`GET /orgs/{org}/actions/permissions/self-hosted-runners`",
        "every registration",
        _runner_policy,
    ),
    Check(
        "runner group",
        "runner groups: the organisation has one of runner-pool's beside Default (none yet warns); "
        "repository registration: `github.runner_group_id` is the Default group (1), the only one a "
        "repository has",
        "the config; `GET /orgs/{org}/actions/runner-groups`",
        "every registration",
        _runner_group,
    ),
    Check(
        "webhook",
        "the App's webhook URL is the stack's `WebhookUrl`, content type `json`, a secret set",
        "`GET /app/hook/config` (App JWT); the stack's outputs",
        "every job's webhook",
        _webhook,
    ),
    Check(
        "secrets",
        "the App's private key and the webhook secret exist and are not empty",
        "`secretsmanager:GetSecretValue`",
        "every job",
        _secrets,
    ),
    Check(
        "ebs encryption",
        "`instances.ebs_kms_key_arn` is set, or the account's default EBS key is AWS managed",
        "`ec2:GetEbsEncryptionByDefault`, `ec2:GetEbsDefaultKmsKeyId`, `kms:DescribeKey`",
        "every launch",
        _ebs,
    ),
    Check(
        "lambda concurrency",
        "unreserved Lambda concurrency covers the provision Map's `MaxConcurrency` "
        "(from 10 up to it warns: throttled claims are retried)",
        "`lambda:GetAccountSettings`; the deployed provision state machine",
        "larger provisions",
        _lambda_concurrency,
    ),
    Check(
        "service-linked roles",
        "`AWSServiceRoleForEC2Fleet` and `AWSServiceRoleForEC2Spot` exist (the first CreateFleet makes them)",
        "`iam:GetRole`",
        "",
        _service_linked_roles,
    ),
    Check(
        "runner image",
        "each launch template's image (through its `resolve:ssm:` parameter) exists and is available",
        "`ec2:DescribeLaunchTemplateVersions`, `ssm:GetParameter`, `ec2:DescribeImages`",
        "every launch",
        _images,
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
