"""How a stateful (hypothesis) test over moto runs: its own count of programs and steps, no deadline."""

from __future__ import annotations

from contextlib import ExitStack

from hypothesis import HealthCheck, settings
from moto import mock_aws

from emulator.atomic_dynamodb import atomic_items


def programs(examples: int, steps: int) -> settings:
    """`examples` programs of `steps` steps each, each step as slow as moto is on a loaded machine (no
    deadline, no too-slow health check): a test's count is what make test's time allows it."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def program_aws() -> ExitStack:
    """moto for one program, each DynamoDB item operation alone as in DynamoDB (emulator/atomic_dynamodb.py),
    for the state machine's teardown to close."""
    aws = ExitStack()
    aws.enter_context(mock_aws())
    aws.enter_context(atomic_items())
    return aws
