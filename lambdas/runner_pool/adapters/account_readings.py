"""What `runner-pool doctor` reads of the AWS account: secrets, EBS defaults, quotas, roles, images.

Each read answers a reading of domain/doctor_readings.py, or an Unread with AWS's own words when it could
not be made (a missing permission, a missing resource): the doctor reports it instead of stopping.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from runner_pool.adapters.aws_clients import (
    Refusal,
    ServiceBusyError,
    ServiceUnreachableError,
    attempt,
    error_code,
)
from runner_pool.adapters.fleet import LaunchTemplate
from runner_pool.domain.doctor_readings import (
    AWS_MANAGED_EBS_ALIAS,
    EbsDefault,
    LambdaQuota,
    LaunchImage,
    SecretState,
    Unread,
)
from runner_pool.domain.records import Arch

T = TypeVar("T")

SSM_PREFIX = "resolve:ssm:"
"""How a launch template names an AMI by SSM parameter, resolved by EC2 at each launch (EC2 User Guide,
"Use a Systems Manager parameter instead of an AMI ID")."""
_ACCESS_DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")
_MISSING_SECRET = "ResourceNotFoundException"  # noqa: S105 - an error code
_NO_SUCH_ROLE = "NoSuchEntity"
_NO_SUCH_PARAMETER = "ParameterNotFound"
_NO_SUCH_IMAGE = ("InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable")
"""EC2's codes for an AMI id that names no usable image (EC2 API Reference, "Error codes for the Amazon
EC2 API", errors-overview.html: the three InvalidAMIID codes)."""


def _read(operation: Callable[[], T]) -> T | Unread:
    """`operation`'s answer, or AWS's refusal as an Unread."""
    try:
        return operation()
    except ClientError as exc:
        return Unread(f"{error_code(exc)}: {exc}", forbidden=error_code(exc) in _ACCESS_DENIED)
    except (BotoCoreError, ServiceBusyError, ServiceUnreachableError) as exc:
        return Unread(str(exc))


class AccountReadings:
    """The doctor's reads of one account and region, over the clients it is given."""

    def __init__(self, clients: Callable[[str], Any]) -> None:
        self._clients = clients

    def secrets(self, names: Iterable[str]) -> dict[str, SecretState | Unread]:
        """Each secret: there with a value, there but empty, or not there."""
        client = self._clients("secretsmanager")

        def state(name: str) -> SecretState:
            value = attempt(lambda: client.get_secret_value(SecretId=name), (_MISSING_SECRET,))
            if isinstance(value, Refusal):
                return SecretState.MISSING
            held = value.get("SecretString") or value.get("SecretBinary")
            return SecretState.PRESENT if held and str(held).strip() else SecretState.EMPTY

        return {name: _read(lambda name=name: state(name)) for name in names}  # type: ignore[misc]

    def ebs_default(self) -> EbsDefault | Unread:
        """Whether EBS encrypts by default and with which key; the key's manager from KMS. The launch
        templates encrypt root volumes naming no key, so EBS uses this default key either way."""
        ec2 = self._clients("ec2")

        def read() -> EbsDefault:
            by_default = bool(ec2.get_ebs_encryption_by_default()["EbsEncryptionByDefault"])
            key_id = str(ec2.get_ebs_default_kms_key_id()["KmsKeyId"])
            if key_id == AWS_MANAGED_EBS_ALIAS:
                return EbsDefault(by_default, key_id, aws_managed=True)
            metadata = self._clients("kms").describe_key(KeyId=key_id)["KeyMetadata"]
            return EbsDefault(by_default, key_id, aws_managed=metadata.get("KeyManager") == "AWS")

        return _read(read)

    def lambda_quota(self) -> LambdaQuota | Unread:
        def read() -> LambdaQuota:
            limit = self._clients("lambda").get_account_settings()["AccountLimit"]
            return LambdaQuota(
                int(limit["ConcurrentExecutions"]), int(limit["UnreservedConcurrentExecutions"])
            )

        return _read(read)

    def map_concurrency(self, state_machine_arn: str) -> int | Unread:
        """The largest MaxConcurrency among the Map states of a deployed state machine (0: unbounded)."""

        def read() -> int:
            definition = self._clients("stepfunctions").describe_state_machine(
                stateMachineArn=state_machine_arn
            )["definition"]
            return max(_map_concurrencies(json.loads(definition)), default=0)

        return _read(read)

    def service_roles(self, names: Iterable[str]) -> dict[str, bool | Unread]:
        iam = self._clients("iam")

        def exists(name: str) -> bool:
            return not isinstance(attempt(lambda: iam.get_role(RoleName=name), (_NO_SUCH_ROLE,)), Refusal)

        return {name: _read(lambda name=name: exists(name)) for name in names}  # type: ignore[misc]

    def launch_images(self, templates: Mapping[Arch, str]) -> list[LaunchImage] | Unread:
        """What each launch template boots in the version CreateFleet names, resolved as EC2 resolves it."""
        ec2 = self._clients("ec2")

        def read() -> list[LaunchImage]:
            return [self._image(ec2, arch, template_id) for arch, template_id in sorted(templates.items())]

        return _read(read)

    def _image(self, ec2: Any, arch: Arch, template_id: str) -> LaunchImage:
        (version,) = ec2.describe_launch_template_versions(
            LaunchTemplateId=template_id, Versions=[LaunchTemplate(template_id).version]
        )["LaunchTemplateVersions"]
        ref = str(version["LaunchTemplateData"].get("ImageId", ""))
        image_id: str | None = ref
        if ref.startswith(SSM_PREFIX):
            ssm = self._clients("ssm")
            parameter = attempt(
                lambda: ssm.get_parameter(Name=ref.removeprefix(SSM_PREFIX)), (_NO_SUCH_PARAMETER,)
            )
            image_id = None if isinstance(parameter, Refusal) else parameter["Parameter"]["Value"]
        if image_id is None:
            return LaunchImage(arch, template_id, ref, None, None)
        described = attempt(lambda: ec2.describe_images(ImageIds=[image_id]), _NO_SUCH_IMAGE)
        images = [] if isinstance(described, Refusal) else described["Images"]
        state = str(images[0]["State"]) if images else None
        return LaunchImage(arch, template_id, ref, image_id, state)


def _map_concurrencies(machine: Mapping[str, Any]) -> Iterable[int]:
    """MaxConcurrency of every Map state, nested ones (ItemProcessor, Iterator, Parallel branches) too."""
    for state in machine.get("States", {}).values():
        if state.get("Type") == "Map":
            yield int(state.get("MaxConcurrency", 0))
        for inner in (state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", ())):
            if inner:
                yield from _map_concurrencies(inner)
