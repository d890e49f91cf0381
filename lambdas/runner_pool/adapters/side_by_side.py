"""Calls made side by side from one Lambda: many instances' AWS and GitHub calls in parallel threads.

A step that acts on hundreds of instances (Create's hand-overs, opening notice queues) cannot make its
calls one after another: at a few hundred milliseconds each, 350 of them took Create past its 120 s
timeout. Threads share the step's clients, which boto3 documents as thread-safe
("Multithreading or multiprocessing with clients", boto3 guide) and githubkit builds per call on our
one pooled transport (adapters/github_api.py). Each call runs in a copy of the caller's context, so
what a context variable holds (the logger's keys) holds in every call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from runner_pool.adapters import aws_clients

CALLS_AT_ONCE = aws_clients.POOL_CONNECTIONS
"""Calls in flight at once: as many as a boto3 client keeps connections."""

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def side_by_side(
    call: Callable[[_Item], _Result], items: Iterable[_Item], at_once: int = CALLS_AT_ONCE
) -> list[_Result]:
    """`call` on every item, `at_once` at a time; the results in the items' order. An exception a call
    raises is raised here, once every call has ended."""
    work = list(items)
    if not work:
        return []
    with ThreadPoolExecutor(max_workers=min(at_once, len(work))) as pool:
        futures = [pool.submit(contextvars.copy_context().run, call, item) for item in work]
        return [future.result() for future in futures]


def in_background(call: Callable[[], _Result]) -> Future[_Result]:
    """`call` in a thread of its own (in a copy of the caller's context) while the caller goes on; its
    result, or what it raised, from the future."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(contextvars.copy_context().run, call)
    finally:
        pool.shutdown(wait=False)
