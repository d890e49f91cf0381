"""The emulator's spot reclaim: the warning in EventBridge and in the instance's metadata at the paths EC2
documents, and the instance terminated at the end of the notice (moto's EC2, the emulator's IMDS)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from emulator.ec2_events import SpotReclaim
from emulator.harness.control_plane import REGION
from emulator.imds import INSTANCE_ACTION_PATH, REBALANCE_PATH, TOKEN_PATH, InstanceMetadata
from runner_pool.adapters import aws_clients
from runner_pool.domain.interruptions import Notice
from tests.support.waiting import eventually


@pytest.fixture
def metadata() -> Iterator[InstanceMetadata]:
    with InstanceMetadata() as served:
        yield served


@pytest.fixture
def instance_id(aws: None) -> str:
    ec2 = aws_clients.client("ec2", region_name=REGION)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    return str(ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"])


def read(metadata: InstanceMetadata, instance_id: str, path: str) -> tuple[int, Any]:
    """GET one metadata item as an instance's IMDSv2 client does: a token first, then the read."""
    endpoint = metadata.endpoint(instance_id)
    put = urllib.request.Request(  # noqa: S310 - the emulator's metadata service on loopback
        endpoint + TOKEN_PATH, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    with urllib.request.urlopen(put, timeout=5) as answer:  # noqa: S310
        token = answer.read().decode()
    get = urllib.request.Request(endpoint + path, headers={"X-aws-ec2-metadata-token": token})  # noqa: S310
    try:
        with urllib.request.urlopen(get, timeout=5) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as missing:
        return missing.code, None


def test_an_instance_ec2_has_not_warned_has_no_notice_items(
    metadata: InstanceMetadata, instance_id: str
) -> None:
    # Given no notice / Then both items are absent, as on EC2 (404)
    assert read(metadata, instance_id, INSTANCE_ACTION_PATH) == (404, None)
    assert read(metadata, instance_id, REBALANCE_PATH) == (404, None)


def test_an_interruption_is_heard_in_eventbridge_and_in_metadata_and_ends_the_instance(
    metadata: InstanceMetadata, instance_id: str
) -> None:
    # Given EC2's events going to a list
    ec2 = aws_clients.client("ec2", region_name=REGION)
    delivered: list[dict[str, Any]] = []
    lock = threading.Lock()

    def deliver(event: dict[str, Any]) -> None:
        with lock:
            delivered.append(event)

    reclaim = SpotReclaim(ec2, deliver, metadata, notice_seconds=1.0)
    try:
        # When EC2 interrupts the spot instance, a rebalance recommendation first
        reclaim.interrupt(instance_id, rebalance_first=True)
        # Then the instance reads both notices at once: terminate, at the end of the notice
        status, action = read(metadata, instance_id, INSTANCE_ACTION_PATH)
        assert (status, action["action"]) == (200, "terminate")
        assert action["time"].endswith("Z")
        status, rebalance = read(metadata, instance_id, REBALANCE_PATH)
        assert status == 200
        assert set(rebalance) == {"noticeTime"}
        # And EventBridge had the recommendation, then the warning
        assert [e["detail-type"] for e in delivered] == [Notice.REBALANCE.value, Notice.INTERRUPTION.value]
        # And at the end of the notice EC2 terminates it, and says so
        eventually(lambda: len(delivered) == 4, "the instance to end")
        assert [e["detail"].get("state") for e in delivered[2:]] == ["shutting-down", "terminated"]
        state = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]
        assert state["Name"] in ("shutting-down", "terminated")
    finally:
        reclaim.close()
