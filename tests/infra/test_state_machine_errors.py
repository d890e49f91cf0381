"""What a state machine's Retry and Catch name: Step Functions' own errors, Lambda's, and the product's,
never a botocore class (the client layer, adapters/aws_clients.py, turns those into the product's)."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from collections.abc import Iterator
from functools import cache
from typing import Any

import botocore.exceptions
import pytest

import runner_pool
from emulator.step_functions import LambdaContext
from infra.constructs.workflow import STATE_MACHINES
from runner_pool.domain.executions import MalformedRequestError
from runner_pool.handlers import provision

MACHINES = sorted(path.name.removesuffix(".asl.json") for path in STATE_MACHINES.glob("*.asl.json"))
SERVICE_PREFIXES = ("States.", "Lambda.")
LAMBDA_TIMED_OUT = "Sandbox.Timedout"
"""What Lambda answers for a function past its timeout
(https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html)."""


@cache
def product_errors() -> frozenset[str]:
    """The name of every exception class the product defines: what its Lambdas can raise by their own name."""
    names = set()
    for module in pkgutil.walk_packages(runner_pool.__path__, "runner_pool."):
        for name, member in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(member, BaseException) and member.__module__.startswith("runner_pool."):
                names.add(name)
    return frozenset(names)


def botocore_errors() -> frozenset[str]:
    return frozenset(
        name
        for name, member in inspect.getmembers(botocore.exceptions, inspect.isclass)
        if issubclass(member, BaseException)
    )


def named_errors(node: Any) -> Iterator[str]:
    """Every error a Retry or Catch of this ASL (any depth: a Map's states too) names."""
    if isinstance(node, dict):
        yield from node.get("ErrorEquals", ())
        for value in node.values():
            yield from named_errors(value)
    elif isinstance(node, list):
        for value in node:
            yield from named_errors(value)


def errors_of(machine: str) -> set[str]:
    return set(named_errors(json.loads((STATE_MACHINES / f"{machine}.asl.json").read_text())))


@pytest.mark.parametrize("machine", MACHINES)
def test_a_machine_names_no_botocore_error(machine: str) -> None:
    # Given every error the machine's Retry and Catch name / Then none is one of botocore's classes
    assert errors_of(machine) & botocore_errors() == set()


@pytest.mark.parametrize("machine", MACHINES)
def test_a_machine_names_only_service_errors_and_the_products_own(machine: str) -> None:
    # Given every error the machine's Retry and Catch name
    named = errors_of(machine)
    # Then each is Step Functions' or Lambda's, or an error class of the product's own
    foreign = {
        name
        for name in named
        if not name.startswith(SERVICE_PREFIXES) and name != LAMBDA_TIMED_OUT and name not in product_errors()
    }
    assert foreign == set(), (
        f"{machine}.asl.json names errors its Lambdas never raise by that name: {foreign}"
    )


def test_a_begin_event_that_does_not_parse_is_refused_by_the_products_name() -> None:
    # Given an event Begin's model refuses (no request)
    context = LambdaContext("provision-begin", "request-1", "arn:aws:lambda:us-east-1:1:function:begin")
    # When Begin is invoked / Then it fails with the product's error, which provision.asl.json never retries
    with pytest.raises(MalformedRequestError, match="request"):
        provision.begin({"execution": "e-1"}, context)
