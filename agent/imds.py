"""The instance metadata service, IMDSv2 only: who this instance is (id, region, account, partition)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from runner_pool.adapters.instance_arns import InstanceArns

TOKEN_PATH = "/latest/api/token"  # noqa: S105 - a URL path, not a secret
IDENTITY_PATH = "/latest/dynamic/instance-identity/document"
PARTITION_PATH = "/latest/meta-data/services/partition"


class MetadataUnavailableError(RuntimeError):
    """The metadata service did not answer, or refused the session token."""


@dataclass(frozen=True)
class InstanceIdentity:
    instance_id: str
    region: str
    account_id: str
    partition: str = "aws"

    @property
    def arns(self) -> InstanceArns:
        """Where this instance lives: what keys its items in the state table."""
        return InstanceArns(partition=self.partition, region=self.region, account_id=self.account_id)

    @property
    def arn(self) -> str:
        """This instance's ARN, as IAM resolves `${ec2:SourceInstanceARN}` for its requests."""
        return self.arns.arn(self.instance_id)


class Imds:
    """Reads the instance metadata with a session token (IMDSv2); the launch template refuses v1."""

    def __init__(
        self,
        endpoint: str = "http://169.254.169.254",
        timeout_seconds: float = 2.0,
        token_ttl_seconds: int = 300,
        open_url: Callable[..., object] = urllib.request.urlopen,
    ) -> None:
        self._endpoint = endpoint.rstrip("/")
        self._timeout = timeout_seconds
        self._token_ttl = token_ttl_seconds
        self._open = open_url

    def identity(self) -> InstanceIdentity:
        token = self._request(
            "PUT", TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": str(self._token_ttl)}
        )
        headers = {"X-aws-ec2-metadata-token": token}
        document = json.loads(self._request("GET", IDENTITY_PATH, headers))
        partition = self._request("GET", PARTITION_PATH, headers).strip() or "aws"
        return InstanceIdentity(
            instance_id=document["instanceId"],
            region=document["region"],
            account_id=document["accountId"],
            partition=partition,
        )

    def wait_for_identity(self, attempts: int = 30, pause_seconds: float = 1.0) -> InstanceIdentity:
        """The identity, asking again while the metadata service is not yet up (early in boot)."""
        for attempt in range(attempts):
            try:
                return self.identity()
            except MetadataUnavailableError:
                if attempt == attempts - 1:
                    raise
                time.sleep(pause_seconds)
        raise AssertionError("unreachable: the loop returns or raises")

    def _request(self, method: str, path: str, headers: dict[str, str]) -> str:
        request = urllib.request.Request(  # noqa: S310 - the endpoint is the link-local metadata service
            self._endpoint + path, method=method, headers=headers
        )
        try:
            with self._open(request, timeout=self._timeout) as response:  # type: ignore[attr-defined]
                body: bytes = response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise MetadataUnavailableError(f"{method} {path}: {exc}") from exc
        return body.decode()
