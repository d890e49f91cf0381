"""`runner-pool connect` (domain/connect.py): which instance a job, a run or an id names, and each refusal
with its reason; the session it would start."""

from __future__ import annotations

import re
from typing import Any

import pytest

from runner_pool.cli import parser
from runner_pool.domain.config import StackConfig, load_config
from runner_pool.domain.connect import (
    ConnectRefusedError,
    is_instance_id,
    refusal,
    served_by,
    session_command,
)
from runner_pool.domain.job_story import JobRef, Story
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from tests.support import builders

REPOSITORY = "octo-org/app"
RUN = JobRef(REPOSITORY, 41)
T0 = 1_800_000_000.0
WITH_SSM = load_config({"resource_classes": {"large": {"cpu": 2, "memory_mib": 4096, "ssm": True}}})


def story(job_id: int, instance_id: str | None, waiting: str | None = None) -> Story:
    return Story(JobRef(REPOSITORY, 41, job_id), steps=(), instance_id=instance_id, waiting=waiting)


def record(**changes: Any) -> InstanceRecord:
    fields = builders.facts(1).model_dump() | {
        "state": InstanceState.RUNNING,
        "run_key": "pool=41",
        "threshold": T0 + 600,
        "created_at": T0 - 300,
        "updated_at": T0,
    }
    return InstanceRecord.model_validate(fields | changes)


def test_a_job_names_the_instance_it_ran_on() -> None:
    # Given the story of a job that ran on i-1 / Then that instance is the one to connect to
    assert served_by(JobRef(REPOSITORY, 41, 7), [story(7, "i-0123456789abcdef0")]) == "i-0123456789abcdef0"


def test_a_run_whose_jobs_all_ran_on_one_instance_names_it() -> None:
    # Given a run whose two jobs ran one after the other on one instance, and a third not yet on any
    stories = [story(7, "i-0123456789abcdef0"), story(8, "i-0123456789abcdef0"), story(9, None)]
    # Then that one instance is named
    assert served_by(RUN, stories) == "i-0123456789abcdef0"


def test_a_run_whose_jobs_ran_on_several_instances_lists_them_to_choose_from() -> None:
    # Given a run whose jobs ran on two instances
    stories = [story(7, "i-0000000000000000a"), story(8, "i-0000000000000000b")]
    # When connect is asked for the run / Then it refuses, listing each job with its instance
    with pytest.raises(ConnectRefusedError) as refused:
        served_by(RUN, stories)
    message = str(refused.value)
    assert message.startswith("the jobs of run 41 ran on 2 instances; name one:")
    assert "  job 7: i-0000000000000000a" in message
    assert "  job 8: i-0000000000000000b" in message


def test_a_job_on_no_instance_says_why_it_waits() -> None:
    # Given a job still waiting, for a reason its story gives
    waiting = story(7, None, waiting="no capacity: EC2 refused 1 (InsufficientInstanceCapacity)")
    # Then there is nothing to connect to, and the reason is the story's
    with pytest.raises(ConnectRefusedError, match=r"^job 7 ran on no instance .*: no capacity: EC2 refused"):
        served_by(JobRef(REPOSITORY, 41, 7), [waiting])


def test_an_instance_of_a_class_with_ssm_may_be_connected_to_while_it_exists() -> None:
    # Given a running instance of class large, which has ssm on / Then a session may be opened
    assert refusal("i-1", record(), WITH_SSM) is None
    # And the same on an idle one in the pool
    assert refusal("i-1", record(state=InstanceState.IDLE, run_key=None), WITH_SSM) is None


@pytest.mark.parametrize(
    ("changes", "config", "reason"),
    [
        ({}, StackConfig(), r"^class large has SSM off: .*resource_classes\.large\.ssm to true"),
        ({}, None, r"^whether class large lets Session Manager in is not known"),
        ({"resource_class": "gpu"}, WITH_SSM, r"^class gpu of i-1 is no longer defined"),
        ({"state": InstanceState.TERMINATED, "run_key": None}, WITH_SSM, r"^i-1 is gone: terminated"),
        (
            {"state": InstanceState.STOPPED, "run_key": None},
            WITH_SSM,
            r"^i-1 is stopped \(the stopped tier\)",
        ),
    ],
)
def test_each_refusal_says_why(changes: dict[str, Any], config: StackConfig | None, reason: str) -> None:
    # Given an instance as the record says / Then no session, with the reason
    told = refusal("i-1", record(**changes), config)
    assert told is not None
    assert re.match(reason, told), told


def test_an_instance_without_a_record_is_gone() -> None:
    assert refusal("i-1", None, WITH_SSM) == (
        "i-1 is gone: the stack has no record of it (terminated, or past its record's TTL)"
    )


def test_what_names_an_instance_and_the_session_started_on_it() -> None:
    assert is_instance_id("i-0123456789abcdef0")
    assert is_instance_id("i-01234567")
    assert not is_instance_id("https://github.com/o/r/actions/runs/1")
    assert not is_instance_id("i-XYZ")
    assert session_command("i-0123456789abcdef0", "eu-west-1") == [
        "aws",
        "ssm",
        "start-session",
        "--target",
        "i-0123456789abcdef0",
        "--region",
        "eu-west-1",
    ]


def test_the_cli_takes_a_url_or_an_instance_and_print() -> None:
    arguments = parser().parse_args(["--region", "eu-west-1", "connect", "i-0123456789abcdef0", "--print"])
    assert (arguments.command, arguments.target, arguments.print_only) == (
        "connect",
        "i-0123456789abcdef0",
        True,
    )
    assert parser().parse_args(["connect", "https://github.com/o/r/actions/runs/1"]).print_only is False
