"""The demand queue's messages: what the webhook writes is what the dispatcher reads, and nothing else."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runner_pool.domain.demand import (
    DemandMessage,
    InstanceRelease,
    JobCancelled,
    JobQueued,
    RunCompleted,
    from_body,
    to_body,
)
from runner_pool.domain.executions import PROVISION_LIMIT, ProvisionRequest, ReleaseRequest

MESSAGES: list[DemandMessage] = [
    JobQueued(repository="o/r", run_key="pool=1", run_id=1, run_attempt=1, job_id=10),
    JobCancelled(repository="o/r", run_key="pool=1", job_id=10),
    InstanceRelease(
        request=ReleaseRequest(run_key="pool=1", instance_id="i-0123456789abcdef0", cause="job-10")
    ),
    RunCompleted(repository="o/r", run_id=1, run_attempt=2),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda message: message.kind)
def test_a_message_reads_back_as_it_was_written(message: DemandMessage) -> None:
    # Given a message of each kind / When written and read back / Then it is the same message
    assert from_body(to_body(message)) == message


@pytest.mark.parametrize(
    "body", ['{"kind": "job-started"}', '{"kind": "job-queued", "job_id": 1}', "not json", "[]"]
)
def test_a_body_that_is_not_a_demand_message_is_a_value_error(body: str) -> None:
    # Given a body of another kind, missing fields, or no JSON / When read / Then ValueError
    with pytest.raises(ValueError, match="not a demand message"):
        from_body(body)


def test_the_provision_limit_is_the_largest_count_a_provision_request_takes() -> None:
    # Given the dispatcher's split size / When a request of that size and one more are made
    ProvisionRequest(repository="o/r", run_key="pool=1", count=PROVISION_LIMIT)
    # Then only the larger is refused
    with pytest.raises(ValidationError):
        ProvisionRequest(repository="o/r", run_key="pool=1", count=PROVISION_LIMIT + 1)
