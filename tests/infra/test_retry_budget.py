"""One retry layer (issue 17): every function's timeout outlasts a call AWS throttles through every attempt, and
every state machine's task outlasts Lambda throttling it at a concurrency quota of 10 (issue 38, item 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from infra.constructs import retries, workflow
from runner_pool.adapters import aws_clients
from runner_pool.adapters.github_token_function import invoking_client
from tests.infra.synthesis import Synthesis
from tests.infra.test_functions import functions

GITHUB_DELIVERY_TIMEOUT_SECONDS = 10
"""GitHub gives up on a delivery not answered within 10 s
(https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks#respond-within-10-seconds)."""
WEBHOOK = "webhook.receive"
STATE_MACHINES = Path(__file__).resolve().parents[2] / "infra" / "statemachines"


def test_the_waits_of_a_throttled_call_are_the_stated_figures() -> None:
    # Given ATTEMPTS = 3: two retries, waiting at most 1 s and 2 s (rand(0, 1) * 2**i, throttling base
    # 1 s), each raised by at most 5 s if AWS asks for it with x-amz-retry-after
    # Then the worst case is 3 s, or 13 s with the retry-after allowance
    assert aws_clients.ATTEMPTS == 3
    assert aws_clients.throttled_wait_seconds(retry_after=False) == 3.0
    assert aws_clients.throttled_wait_seconds() == 13.0


def test_every_function_outlasts_a_call_throttled_through_every_attempt(synthesis: Synthesis) -> None:
    # Given every Lambda as synthesised, and the longest a throttled call can wait between its attempts
    worst = aws_clients.throttled_wait_seconds()
    timeouts = {handler: properties["Timeout"] for handler, properties in functions(synthesis).items()}
    # Then each function ends a call AWS kept throttling with ServiceBusyError, not with its own timeout
    too_short = {
        handler: timeout for handler, timeout in timeouts.items() if handler != WEBHOOK and timeout <= worst
    }
    assert too_short == {}, f"timeouts shorter than a throttled call's {worst} s of waits: {too_short}"
    # And the webhook, whose timeout is GitHub's 10 s, outlasts the waits of a call AWS throttles
    # without a retry-after; one that waits longer fails the delivery, which refresh redelivers, as a 503
    assert timeouts[WEBHOOK] == GITHUB_DELIVERY_TIMEOUT_SECONDS
    assert aws_clients.throttled_wait_seconds(retry_after=False) < timeouts[WEBHOOK]


def test_a_call_whose_every_attempt_hangs_ends_within_the_stated_bound(synthesis: Synthesis) -> None:
    # Given 3 attempts, each given up after 2 s to connect and 10 s to read, with transient waits of at
    # most 50 ms and 100 ms between them (botocore's non-throttling base scale)
    bound = aws_clients.hung_call_seconds()
    # Then such a call ends within 36.15 s: within the functions that launch and dump (CreateFleet can
    # be slow), while a 30 s step is ended by its own timeout first, and its state machine retries it
    # like any failure (every step is idempotent)
    assert bound == pytest.approx(36.15)
    timeouts = {handler: properties["Timeout"] for handler, properties in functions(synthesis).items()}
    outlasting = sorted(handler for handler, timeout in timeouts.items() if timeout > bound)
    assert {"provision.create", "provision.dump"} <= set(outlasting), outlasting


def test_every_lambda_task_retries_throttling_first_and_outwaits_any_map_iteration(
    synthesis: Synthesis,
) -> None:
    # Given every task of every state machine that invokes one of our functions, as the ASL files hold them
    mapped: set[str] = set()
    for path in sorted(STATE_MACHINES.glob("*.asl.json")):
        definition = json.loads(path.read_text())
        for name, task in workflow.tasks(definition):
            invoked = workflow.function_placeholders(json.dumps(task.get("Parameters")))
            assert invoked, f"{path.name}'s {name} invokes no function of ours"
            # Then its first retrier is the throttling one: a throttled invocation ran nothing
            assert task["Retry"][0] == retries.THROTTLED.asl(), f"{path.name}'s {name}"
            # And no later retrier of it names throttling (the first match wins: it would never be reached)
            later = [error for retrier in task["Retry"][1:] for error in retrier["ErrorEquals"]]
            assert "Lambda.TooManyRequestsException" not in later, f"{path.name}'s {name}"
        mapped |= {
            handler
            for state in _maps(definition)
            for _, task in workflow.tasks(state["ItemProcessor"])
            for handler in workflow.function_placeholders(json.dumps(task.get("Parameters"))).values()
        }
    # And its waits, 1 + 2 + 4 + 8 + 16 x 16 = 271 s at worst (jitter only shortens them), outlast the
    # longest any function a Map runs can hold the concurrency a throttled iteration waits for (its
    # timeout): at a quota of 10, a Map of 40 throttles 30 iterations until the first 10 end
    assert retries.THROTTLED.longest_wait_seconds() == 271.0
    timeouts = {handler: properties["Timeout"] for handler, properties in functions(synthesis).items()}
    held = {
        handler: timeout
        for handler, timeout in timeouts.items()
        if handler.split(".")[-1] in mapped and handler.split(".")[0] in {"provision", "release"}
    }
    assert held, mapped
    assert max(held.values()) < retries.THROTTLED.longest_wait_seconds(), held


def _maps(definition: Any) -> Iterator[Mapping[str, Any]]:
    """Every Map state of an ASL definition."""
    if isinstance(definition, dict):
        if definition.get("Type") == "Map":
            yield definition
        for value in definition.values():
            yield from _maps(value)
    elif isinstance(definition, list):
        for value in definition:
            yield from _maps(value)


def test_a_caller_waits_for_the_token_function_past_its_timeout(synthesis: Synthesis) -> None:
    # Given the token function as synthesised, and the Lambda client its callers invoke it with
    timeout = functions(synthesis)["github_token.github_token"]["Timeout"]
    read_timeout = invoking_client().meta.config.read_timeout
    # Then the token function outlasts a throttled read of the App's key, and a caller waits for it to end
    # rather than invoking it again while it runs
    assert timeout > aws_clients.throttled_wait_seconds()
    assert read_timeout > timeout
