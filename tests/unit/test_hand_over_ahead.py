"""The installation token a step asks for ahead (steps/hand_over.py `authenticate_ahead`) has ended before
the step returns (`settle`): Lambda freezes an environment once its handler returns, and a request frozen
in flight would hold the token cache's lock into a later invocation."""

from __future__ import annotations

import threading
from typing import Any, cast

from runner_pool.steps.hand_over import HandOver
from tests.support.waiting import eventually


class SlowRegistry:
    """A registry whose token request ends only when `release` is set, noting its start and end in `story`."""

    def __init__(self, story: list[str]) -> None:
        self.story = story
        self.release = threading.Event()

    def authenticate(self) -> None:
        self.story.append("asked")
        self.release.wait(timeout=30)
        self.story.append("token")


def hand_over(registry: SlowRegistry) -> HandOver:
    unused = cast(Any, None)
    return HandOver(
        unused,
        github=unused,
        arns=unused,
        registry=lambda: cast(Any, registry),
        credentials=unused,
        queues=unused,
        notices=unused,
    )


def test_settling_waits_for_the_token_asked_for_ahead() -> None:
    # Given a step that asked for the token ahead, the request still in flight
    story: list[str] = []
    registry = SlowRegistry(story)
    handing = hand_over(registry)
    handing.authenticate_ahead()

    def step_returns() -> None:
        story.append("settling")
        handing.settle()
        story.append("returned")

    step = threading.Thread(target=step_returns)
    step.start()
    eventually(lambda: story[:2] in (["asked", "settling"], ["settling", "asked"]), "the step to settle")
    # When the request ends after the step began to settle
    registry.release.set()
    step.join(timeout=30)
    # Then the step returned only after the token came
    assert story[2:] == ["token", "returned"]


def test_settling_with_nothing_asked_ahead_returns_at_once_and_a_failed_request_is_not_raised() -> None:
    # Given a step that asked for nothing ahead, and one whose request failed
    story: list[str] = []
    handing = hand_over(SlowRegistry(story))
    handing.settle()

    class Refusing(SlowRegistry):
        def authenticate(self) -> None:
            raise RuntimeError("GitHub is down")

    failing = hand_over(Refusing(story))
    failing.authenticate_ahead()
    # When each settles, then neither raises, and nothing was asked of the first
    failing.settle()
    assert story == []
