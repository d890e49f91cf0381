"""What `runner-pool doctor` reads of a deployment: GitHub's and AWS's answers, each as it was read or an
Unread in its place. The adapters gather them (adapters/github_readings.py, adapters/account_readings.py);
domain/doctor_judges.py judges them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Arch

SERVICE_LINKED_ROLES: Mapping[str, str] = MappingProxyType(
    {"AWSServiceRoleForEC2Fleet": "ec2fleet.amazonaws.com", "AWSServiceRoleForEC2Spot": "spot.amazonaws.com"}
)
"""The roles EC2 Fleet and Spot act through, by name, with the service that owns each (EC2 User Guide,
"EC2 Fleet prerequisites", "Service-linked role for EC2 Fleet"; the same pairs as
infra/constructs/permissions.py's SERVICE_LINKED_ROLES, which grants the stack their creation)."""
AWS_MANAGED_EBS_ALIAS = "alias/aws/ebs"


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
