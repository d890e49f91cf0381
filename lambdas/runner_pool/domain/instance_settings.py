"""How runner instances are built (`instances`) and the runner image the stack bakes for them (`image`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator

from runner_pool.domain.records import Arch
from runner_pool.domain.settings import SettingError, Settings

AL2023_AMI_PARAMETERS: Mapping[Arch, str] = MappingProxyType(
    {
        Arch.X64: "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        Arch.ARM64: "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    }
)
"""AWS's public SSM parameters naming the latest Amazon Linux 2023 image of each architecture."""


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest in lowercase hex."""

DEFAULT_RUNNER_VERSION = "2.328.0"
KNOWN_RUNNER_CHECKSUMS: Mapping[str, Mapping[Arch, str]] = MappingProxyType(
    {
        # The "SHA-256 Checksums" section of https://github.com/actions/runner/releases/tag/v2.328.0
        # (actions/runner's releaseNote.md fills one line per package at release time); the same two
        # digests appear in the "Validate the hash" step GitHub's "New self-hosted runner" page shows.
        DEFAULT_RUNNER_VERSION: MappingProxyType(
            {
                Arch.X64: "01066fad3a2893e63e6ca880ae3a1fad5bf9329d60e77ee15f2b97c148c3cd4e",
                Arch.ARM64: "b801b9809c4d9301932bccadf57ca13533073b2aa9fa9b8e625a8db905b5d8eb",
            }
        ),
    }
)
"""SHA-256 of `actions-runner-linux-<arch>-<version>.tar.gz` for the runner releases this code knows,
so that the default version is checked without the operator copying digests into the config."""


class InstanceSettings(Settings):
    """How runner instances are built: the launch templates and the user data that bootstraps them."""

    runner_version: str = Field(DEFAULT_RUNNER_VERSION, pattern=r"^\d+\.\d+\.\d+$")
    """The GitHub Actions runner release installed at boot."""
    runner_checksums: dict[Arch, Sha256] = Field(default_factory=dict)
    """SHA-256 of the runner archive per architecture; the user data refuses an archive that differs.
    Needed for every architecture unless KNOWN_RUNNER_CHECKSUMS has the version's."""
    ami_parameters: dict[Arch, str] = Field(default_factory=lambda: dict(AL2023_AMI_PARAMETERS))
    """SSM parameter holding the AMI id of each architecture; an architecture left out keeps AL2023's."""
    root_device_name: str = Field("/dev/xvda", pattern=r"^/dev/[a-z0-9]+$")
    """The AMI's root device: `/dev/xvda` on Amazon Linux, `/dev/sda1` on Ubuntu."""
    root_volume_gib: int = Field(40, ge=8, le=16384)
    ebs_kms_key_arn: str | None = Field(
        None,
        pattern=r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/"
        r"(mrk-[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$",
    )
    """The customer managed KMS key that encrypts root volumes, by its key ARN (an alias ARN cannot name a
    key in an IAM policy); the roles that launch and start instances get what EBS needs on it. None: EBS
    uses the account's default key, which must then be AWS managed (`runner-pool doctor` says so)."""
    pre_runner_script: str = ""
    """Run once at boot, as root, before any runner; its failure is signalled UD_FAILED."""
    termination_grace_seconds: int = Field(300, ge=0)
    """How long past its threshold an instance waits for the control plane before it ends itself."""
    block_imds_from_jobs: bool = True
    """Let only root (the agent) reach the instance metadata service: a job, running as the runner
    user, must not take the instance role's credentials and act as the instance (forge its signals,
    read its runner config). Jobs that need AWS use GitHub's OIDC provider instead."""

    @field_validator("ami_parameters")
    @classmethod
    def _every_arch_has_an_ami(cls, parameters: dict[Arch, str]) -> dict[Arch, str]:
        return {**AL2023_AMI_PARAMETERS, **parameters}

    @model_validator(mode="after")
    def _every_arch_has_a_checksum(self) -> Self:
        missing = [arch.value for arch in Arch if self.runner_checksum(arch) is None]
        if missing:
            raise SettingError(
                "runner_checksums",
                f"has no SHA-256 for runner {self.runner_version} on {', '.join(missing)}, and an "
                "instance installs only an archive whose checksum it can check",
                "copy each digest from the SHA-256 Checksums of https://github.com/actions/runner/"
                f'releases/tag/v{self.runner_version}, e.g. {{"{missing[0]}": "<64 hex digits>"}}',
            )
        return self

    def runner_checksum(self, arch: Arch) -> str | None:
        """The SHA-256 the runner archive of `arch` must have: the configured one, else the known one."""
        return self.runner_checksums.get(arch) or KNOWN_RUNNER_CHECKSUMS.get(self.runner_version, {}).get(
            arch
        )


DEFAULT_IMAGE_BUILD_INSTANCE_TYPES: Mapping[Arch, tuple[str, ...]] = MappingProxyType(
    {Arch.X64: ("c7i.large", "m7i.large", "c6i.large"), Arch.ARM64: ("c7g.large", "m7g.large", "c6g.large")}
)
"""The instances Image Builder may build each architecture's image on: 2 vCPUs are enough to unpack the
runner and install the wheelhouse, and Image Builder picks the first of them with capacity."""


class ImageSettings(Settings):
    """The runner image the stack builds with EC2 Image Builder (infra/constructs/runner_image.py).

    It bakes what the user data would install at every boot (the runner's prerequisites, the pinned runner,
    the agent's wheelhouse), so that a baked instance only configures and starts its agent.
    """

    docker: bool = False
    """Also install the distribution's Docker engine and enable its service (`docker` on AL2023,
    `docker.io` on Ubuntu 24.04). The runner account is never put in the `docker` group: see the
    README's security model."""
    schedule: str = Field("cron(0 4 * * ? *)", min_length=1, max_length=1024)
    """When Image Builder checks for changes (Image Builder's cron syntax, UTC): it builds only when a
    component's version (each deploy stamps a new one) or the base AMI changed since its last image."""
    images_kept: int = Field(3, ge=1, le=100)
    """Images of each architecture kept; older ones are deregistered with their snapshots."""
    build_instance_types: dict[Arch, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_IMAGE_BUILD_INSTANCE_TYPES)
    )
    """The instance types Image Builder may build each architecture's image on; an architecture left
    out keeps the default."""

    @field_validator("build_instance_types")
    @classmethod
    def _every_arch_has_build_types(cls, types: dict[Arch, tuple[str, ...]]) -> dict[Arch, tuple[str, ...]]:
        merged = {**DEFAULT_IMAGE_BUILD_INSTANCE_TYPES, **types}
        for arch, names in merged.items():
            if not names:
                raise ValueError(f"names no instance type for {arch.value}")
        return merged
