"""The one retry policy: every client the product builds retries in standard mode, ATTEMPTS times in all."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.stub import Stubber

from runner_pool.adapters import aws_clients
from runner_pool.environment import ControlPlaneSettings
from runner_pool.wiring import ControlPlane

STANDARD = {"mode": "standard", "total_max_attempts": aws_clients.ATTEMPTS}
"""botocore's client config for standard mode with a total number of attempts, the first included
(https://boto3.amazonaws.com/v1/documentation/api/latest/guide/retries.html)."""


def retries_of(client: Any) -> dict[str, Any]:
    return dict(client.meta.config.retries)


@pytest.mark.parametrize("service", ["dynamodb", "sqs", "ec2", "kms", "stepfunctions", "secretsmanager"])
def test_a_lambdas_clients_retry_as_stated(service: str) -> None:
    # Given a control plane built from its environment, as a Lambda's cold start builds it
    plane = ControlPlane(ControlPlaneSettings(table_name="t"))
    # When it makes a client / Then the client retries in standard mode, ATTEMPTS times in all
    assert retries_of(plane.client(service)) == STANDARD


def test_the_agents_clients_retry_as_stated() -> None:
    # Given the clients `python -m agent` builds (from a session of the instance's region)
    import boto3  # noqa: PLC0415

    session = boto3.session.Session(region_name="us-east-1")
    # Then they retry as the Lambdas' do, and give up with the product's own error
    for service in ("dynamodb", "kms", "ec2"):
        assert retries_of(aws_clients.client(service, session)) == STANDARD


@pytest.mark.parametrize(
    ("code", "status", "busy"),
    [
        ("ProvisionedThroughputExceededException", 400, True),
        ("ThrottlingException", 400, True),
        ("RequestLimitExceeded", 503, True),
        ("InternalServerError", 500, True),
        ("SomethingNew", 503, True),
        ("ConditionalCheckFailedException", 400, False),
        ("ResourceNotFoundException", 400, False),
        ("AccessDeniedException", 400, False),
    ],
)
def test_busy_is_what_standard_mode_retries(code: str, status: int, busy: bool) -> None:
    # Given an AWS error / Then it is "busy" exactly when botocore's standard mode would have retried it
    assert aws_clients.is_busy(code, status) is busy


def test_a_call_that_never_reaches_aws_raises_the_products_own_error() -> None:
    # Given a client of the product aimed at a port where nothing listens (every attempt is refused)
    unreachable = aws_clients.client(
        "dynamodb",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    # When a call is made / Then once botocore's attempts are spent, the caller gets ServiceUnreachableError
    # (what a state machine's Retry names), botocore's own error kept as its cause
    with pytest.raises(aws_clients.ServiceUnreachableError) as raised:
        unreachable.list_tables()
    assert isinstance(raised.value.__cause__, aws_clients.TRANSPORT_ERRORS)


def stubbed(service: str = "dynamodb") -> tuple[Any, Stubber]:
    """A client of the product whose answers a Stubber gives (no network, no moto)."""
    made = aws_clients.client(
        service, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    return made, Stubber(made)


WRITE = {"TableName": "t", "Key": {"pk": {"S": "a"}}, "UpdateExpression": "SET v = :v"}


def test_a_refusal_is_the_products_own_error_and_reads_as_botocores() -> None:
    # Given a product client that AWS refuses with a code no adapter expects
    client, stubber = stubbed()
    stubber.add_client_error("update_item", "AccessDeniedException", "no", 400)
    # When the call is made / Then it raises AwsRefusedError, still botocore's class of that code
    with stubber, pytest.raises(aws_clients.AwsRefusedError) as raised:
        client.update_item(**WRITE)
    assert isinstance(raised.value, client.exceptions.ClientError)
    assert aws_clients.error_code(raised.value) == "AccessDeniedException"
    assert raised.value.operation_name == "UpdateItem"


def test_a_conditional_write_is_applied_or_finds_the_item_as_it_was() -> None:
    # Given a write that applies, then one whose condition fails and returns the item as it was
    client, stubber = stubbed()
    stubber.add_response("update_item", {"Attributes": {"v": {"S": "new"}}})
    stubber.add_client_error(
        "update_item",
        aws_clients.CONDITION_FAILED,
        "The conditional request failed",
        400,
        response_meta={},
        modeled_fields={"Item": {"v": {"S": "old"}}},
    )
    with stubber:
        applied = aws_clients.conditional_write(lambda: client.update_item(**WRITE))
        refused = aws_clients.conditional_write(lambda: client.update_item(**WRITE))
    # Then the first answers as AWS did, and the second is a Refusal holding the item it found
    assert applied == {"Attributes": {"v": {"S": "new"}}}
    assert isinstance(refused, aws_clients.Refusal)
    assert refused.code == aws_clients.CONDITION_FAILED
    assert refused.item == {"v": {"S": "old"}}


@pytest.mark.parametrize("product_client", [True, False])
def test_a_refusal_not_expected_is_raised_as_the_products_error(product_client: bool) -> None:
    # Given a conditional write refused for another reason, by a product client or one built bare
    client, stubber = stubbed()
    if not product_client:
        import boto3  # noqa: PLC0415

        client = boto3.client(
            "dynamodb", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
        )
        stubber = Stubber(client)
    stubber.add_client_error("update_item", "ResourceNotFoundException", "no table", 400)
    # Then it is not taken for a lost condition: AwsRefusedError, of botocore's class for the code
    with stubber, pytest.raises(aws_clients.AwsRefusedError) as raised:
        aws_clients.conditional_write(lambda: client.update_item(**WRITE))
    assert isinstance(raised.value, client.exceptions.ResourceNotFoundException)
