"""The agent's metadata client: IMDSv2 only, and what it learns of the instance."""

from __future__ import annotations

import pytest

from agent.imds import Imds, MetadataUnavailableError
from tests.agent.conftest import FakeImds


def test_the_identity_comes_from_imdsv2_with_a_session_token(fake_imds: FakeImds) -> None:
    # Given a metadata service that answers only requests bearing a session token
    imds = Imds(fake_imds.endpoint)

    # When the agent asks who it is
    identity = imds.identity()

    # Then it learns its id, region, account and partition, and from them its ARN
    assert identity == fake_imds.identity
    assert identity.arn == "arn:aws:ec2:eu-west-1:123456789012:instance/i-0123456789abcdef0"

    # And it first took a token, then sent it with every read
    assert fake_imds.requests[0] == ("PUT", "/latest/api/token", True)
    assert all(authorised for method, _, authorised in fake_imds.requests[1:] if method == "GET")


def test_no_metadata_service_is_a_clear_error() -> None:
    # Given nothing listening where the metadata service should be
    imds = Imds("http://127.0.0.1:9", timeout_seconds=0.5)

    # When the agent asks, a few times / Then it gives up with an error that says so
    with pytest.raises(MetadataUnavailableError, match="/latest/api/token"):
        imds.wait_for_identity(attempts=2, pause_seconds=0.01)
