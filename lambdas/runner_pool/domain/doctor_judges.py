"""The doctor's judges: each turns the Readings into whether its check holds, what was found, and the fix.

CHECKS (domain/doctor.py) gives each judge its row: its name, what it reads and what a failure stops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from runner_pool.domain.doctor_readings import (
    SERVICE_LINKED_ROLES,
    Installation,
    Readings,
    RunnerPolicy,
    SecretState,
    Unread,
)
from runner_pool.domain.runner_scope import REGISTRATION_PERMISSIONS, OrganizationScope, Registration
from runner_pool.domain.runners import DEFAULT_RUNNER_GROUP_ID

T = TypeVar("T")

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


@dataclass(frozen=True)
class Judged:
    """A judge's answer before its row names it: whether the check passed, what was found, the fix."""

    ok: bool
    found: str
    fix: str = ""
    warn_only: bool = False
    """A problem that does not stop jobs even where the check's failures usually do."""


def _level(value: str | None) -> int:
    return PERMISSION_LEVELS.index(value) + 1 if value in PERMISSION_LEVELS else 0


def _short_of(needed: Mapping[str, str], granted: Mapping[str, str]) -> list[str]:
    return [
        f"{name}: {level}"
        for name, level in sorted(needed.items())
        if _level(granted.get(name)) < _level(level)
    ]


def _unread(reading: Unread, what: str, fix: str) -> Judged:
    return Judged(False, f"could not read {what}: {reading.reason}", fix)


APP_CREDENTIALS_FIX = "check github.app_id and the private key secret (the App's settings, Private keys)"


def app_permissions(r: Readings) -> Judged:
    if isinstance(r.app, Unread):
        return _unread(r.app, "the App (GET /app)", APP_CREDENTIALS_FIX)
    short = _short_of(r.manifest.permissions, r.app.permissions)
    if short:
        return Judged(
            False,
            f"the App lacks {', '.join(short)} (its manifest asks for them)",
            f"grant {', '.join(short)} in the App's settings, Permissions & events",
        )
    granted = ", ".join(f"{k}: {v}" for k, v in sorted(r.manifest.permissions.items()))
    return Judged(True, f"the App has {granted}")


def app_events(r: Readings) -> Judged:
    if isinstance(r.app, Unread):
        return _unread(r.app, "the App (GET /app)", APP_CREDENTIALS_FIX)
    missing = sorted(r.manifest.events - r.app.events)
    if missing:
        return Judged(
            False,
            f"the App is not subscribed to {', '.join(missing)}: no job reaches the stack",
            f"subscribe to {', '.join(missing)} in the App's settings, Permissions & events",
        )
    return Judged(True, f"subscribed to {', '.join(sorted(r.manifest.events))}")


def installation(r: Readings) -> Judged:
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
        return Judged(
            False,
            f"installation {installation_id} on {r.installation.account} has not accepted {', '.join(short)}",
            f"an owner of {r.installation.account} reviews and accepts the App's new permissions at {where}",
        )
    return Judged(True, f"installation {installation_id} on {r.installation.account} accepted them")


def runner_policy(r: Readings) -> Judged:
    account = r.installation.account if isinstance(r.installation, Installation) else "the organisation"
    if r.stack.config.github.effective_registration is Registration.RUNNER_GROUP:
        return Judged(True, f"not used: runners are registered in {account}'s runner groups")
    settings = f"https://github.com/organizations/{account}/settings/actions/runners"
    if isinstance(r.runner_policy, Unread):
        return Judged(
            False,
            f"could not read {account}'s policy on repository-level runners: {r.runner_policy.reason}",
            f"look at {settings} (or grant the App Organization administration: read so the doctor can)",
            warn_only=r.runner_policy.forbidden,
        )
    if r.runner_policy is None:
        return Judged(True, f"{account} is not an organisation: no policy limits repository runners")
    if r.runner_policy is RunnerPolicy.NONE:
        return Judged(
            False,
            f"{account} allows no repository to create repository-level runners: every registration "
            "is refused",
            f"an owner allows them for all (or selected) repositories at {settings}",
        )
    if r.runner_policy is RunnerPolicy.SELECTED:
        return Judged(
            False,
            f"{account} allows repository-level runners for selected repositories only: jobs of others are "
            "refused their runner",
            f"add the repositories that use the pool at {settings}",
            warn_only=True,
        )
    return Judged(True, f"{account} allows repository-level runners for all repositories")


def registration(r: Readings) -> Judged:
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
        return Judged(
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
        return Judged(
            False,
            f"{said} needs {permission}: {level}, which installation {github.installation_id} on {account} "
            "has not got: every registration is refused",
            f"give the App {permission}: {level} in its settings, Permissions & events (its manifest asks "
            f"for it), and have an owner of {account} accept it{instead}",
        )
    if registration is Registration.REPOSITORY and by_group and r.installation.organization:
        return Judged(
            False,
            f"{said}: every runner is registered at its job's repository, so the App holds administration: "
            f"write on {account}'s repositories, which reaches their settings, collaborators and deletion",
            "leave github.registration out to register in runner groups, with only "
            "organization_self_hosted_runners: write (github-app-manifest.json)",
            warn_only=True,
        )
    return Judged(
        True, f"{said}: installation {github.installation_id} on {account} has {permission}: {level}"
    )


def runner_group(r: Readings) -> Judged:
    if r.stack.config.github.effective_registration is Registration.RUNNER_GROUP:
        return _own_runner_groups(r)
    group = r.stack.config.github.runner_group_id
    if group == DEFAULT_RUNNER_GROUP_ID:
        return Judged(True, f"github.runner_group_id {group}: the Default group, the one a repository has")
    in_org = ""
    if isinstance(r.runner_groups, tuple) and group in r.runner_groups:
        in_org = f" (group {group} is an organisation's group, not a repository's)"
    return Judged(
        False,
        f"github.runner_group_id {group}: runners are registered at each job's repository, which has only "
        f"the Default group ({DEFAULT_RUNNER_GROUP_ID}){in_org}; every registration fails",
        f"set github.runner_group_id to {DEFAULT_RUNNER_GROUP_ID} (or leave it out) and deploy",
    )


def _own_runner_groups(r: Readings) -> Judged:
    account = r.installation.account if isinstance(r.installation, Installation) else "the organisation"
    if isinstance(r.runner_groups, Unread):
        return _unread(
            r.runner_groups,
            f"{account}'s runner groups",
            "give the App organization_self_hosted_runners: write, which registering in runner groups needs",
        )
    made = [group for group in r.runner_groups or () if group != DEFAULT_RUNNER_GROUP_ID]
    if made:
        return Judged(True, f"{account} has {len(made)} runner group(s) beside Default")
    return Judged(
        False,
        f"{account} has only the Default group so far; runner-pool makes one per repository at that "
        "repository's first job, and where GitHub refuses to (a plan or GitHub Enterprise Server release "
        "without runner groups beyond Default) every registration is refused in GitHub's words "
        "(RegistrationsRefused)",
        "run one job: if its provision reports refused, set github.registration: repository and give the "
        "App repository administration: write (github-app-manifest.personal-account.json)",
        warn_only=True,
    )


def webhook(r: Readings) -> Judged:
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
        return Judged(False, "the App's webhook: " + "; ".join(wrong), "; ".join(fixes))
    return Judged(True, f"{r.hook.url}, json, secret set")


def secrets(r: Readings) -> Judged:
    bad = []
    for name, state in r.secrets.items():
        if isinstance(state, Unread):
            bad.append(f"{name} could not be read ({state.reason})")
        elif state is not SecretState.PRESENT:
            bad.append(f"{name} is {state.value}")
    if bad:
        return Judged(
            False,
            "; ".join(bad),
            "put the App's private key (PEM) and the webhook secret into them: "
            "aws secretsmanager put-secret-value --secret-id <name> --secret-string file://<file>",
        )
    return Judged(True, f"{' and '.join(r.secrets)} hold values")


def ebs(r: Readings) -> Judged:
    if isinstance(r.ebs, Unread):
        return _unread(
            r.ebs, "the account's EBS encryption defaults", "run the doctor with ec2:GetEbs* allowed"
        )
    default = "on" if r.ebs.encrypted_by_default else "off"
    configured = r.stack.config.instances.ebs_kms_key_arn
    if configured is not None:
        return Judged(
            True,
            f"encryption by default {default}; root volumes use instances.ebs_kms_key_arn {configured}, "
            "granted to the roles that launch and start instances",
        )
    if r.ebs.aws_managed:
        return Judged(
            True,
            f"encryption by default {default}; root volumes use {r.ebs.key_id}, AWS managed: no grant needed",
        )
    return Judged(
        False,
        f"encryption by default {default}; root volumes (encrypted, no key named) use the customer managed "
        f"key {r.ebs.key_id}, on which no role of the stack has a grant: launches fail",
        f"set instances.ebs_kms_key_arn to {r.ebs.key_id} (its key ARN) and deploy, as {EBS_KEY_POLICY_DOCS} "
        "requires of the roles that launch and start instances",
    )


def lambda_concurrency(r: Readings) -> Judged:
    if isinstance(r.lambda_quota, Unread):
        return _unread(
            r.lambda_quota, "the Lambda quota", "run the doctor with lambda:GetAccountSettings allowed"
        )
    if isinstance(r.map_concurrency, Unread):
        return _unread(r.map_concurrency, "the provision state machine", "deploy the stack")
    quota, needed = r.lambda_quota, r.map_concurrency
    if needed == 0:
        return Judged(
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
            return Judged(False, f"{said}: a larger provision's claims are throttled past their retries", fix)
        return Judged(
            False,
            f"{said}: a larger provision's claims are throttled and retried, so it is slower",
            fix,
            warn_only=True,
        )
    return Judged(True, said)


def service_linked_roles(r: Readings) -> Judged:
    missing = [name for name, there in r.service_roles.items() if there is not True]
    if missing:
        unread = [f"{n}: {s.reason}" for n, s in r.service_roles.items() if isinstance(s, Unread)]
        creates = "; ".join(
            f"aws iam create-service-linked-role --aws-service-name {SERVICE_LINKED_ROLES[name]}"
            for name in missing
        )
        return Judged(
            False,
            f"{', '.join(missing)} not there"
            + (f" ({'; '.join(unread)})" if unread else "")
            + ": the stack's first CreateFleet makes them unless a policy forbids it",
            creates,
        )
    return Judged(True, f"{' and '.join(r.service_roles)} exist")


def images(r: Readings) -> Judged:
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
        return Judged(
            False,
            "; ".join(bad) + ": no instance of that architecture launches",
            "point instances.ami_parameters at an existing AMI parameter, or run the runner image pipeline "
            "(RunnerImagePipelineArns), and deploy",
        )
    return Judged(True, ", ".join(f"{i.arch.value} boots {i.image_id} (available)" for i in r.images))
