"""DESIGN.md 5, the hand-over: a JIT runner registered for a run, its config stored for one instance only.

What a hand-over came to is decided by what took effect, never by whether its last call raised:

- GitHub refused or deferred the registration: nothing took effect. A claimed instance goes back to
  the pool (`RegistrationDeferred`, `RegistrationRefused`); a created one waits for the next look.
- The runner is noted on the record: from then on the instance belongs to the run, whatever happens to
  a later write, read or notice. An error there fails the step, whose retry finds the hand-over done (a
  config stored for the noted runner) or registers the same name again; nothing gives it back, since
  its agent may hold the config and its runner may be listening for one of the run's jobs.
- A read that decides "already handed over?" answers or fails the step; it never gives the instance back.
- The notice that tells the agent to look now is best effort: the agent's watch reads its record anyway.

A registration GitHub refuses for a reason that will not change (`refused_for_good`) is not asked again
by the same provision: its token goes back to the budget, and the provision's other hand-overs stop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from typing import TypeVar

from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.side_by_side import in_background, side_by_side
from runner_pool.domain.config import GitHubSettings
from runner_pool.domain.executions import runner_name
from runner_pool.domain.labels import instant_class
from runner_pool.domain.pickup import PoolQueue
from runner_pool.domain.ports import HandOverRecords
from runner_pool.domain.provision import unavailable_wait_seconds
from runner_pool.domain.records import PoolMessage
from runner_pool.domain.registration_budget import RegistrationBudget, wait_seconds
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import (
    GitHubError,
    GitHubRateLimitedError,
    GitHubRetryableError,
    RepositoryUnknownError,
    RunnerRegistry,
    refused_for_good,
)
from runner_pool.observability import count, logger
from runner_pool.steps.notices import NoticeSource, notify

AHEAD_SETTLE_SECONDS = 5.0
"""The most a step waits, before it returns, for the installation token it asked for ahead
(`HandOver.settle`): a token request takes about 200 ms (bench/aws_model.py), a fresh environment's first
one a Secrets Manager read more."""
HAND_OVERS_AT_ONCE = 10
"""Hand-overs Begin (its claims), Create and CheckFleet (the instances created) make side by side: each
is GitHub's JIT call (a few hundred ms) and four AWS calls, so one after another 350 instances took
Create past its 120 s timeout. GitHub allows an App 100 concurrent requests ("Rate limits for the REST
API", About secondary rate limits), which these share with up to 40 claim workers; the registration
budget paces how many a minute."""


class NotTried(Enum):
    NOT_TRIED = "not begun, because GitHub deferred or refused another of its batch"


@dataclass(frozen=True)
class Refused:
    """GitHub refused the registration for a reason that will not change; its words."""

    reason: str


Outcome = float | GitHubRetryableError | Refused | NotTried | None
"""When it was handed over; the error that deferred it; GitHub's refusal; NOT_TRIED; None: its record
moved on."""
_Item = TypeVar("_Item")


class RegistrationDeferred(Exception):  # noqa: N818 - an outcome carried out of the hand-over, not an error
    """GitHub rate-limited or failed a claimed instance's registration; the instance went back to the pool."""

    def __init__(self, cause: GitHubRetryableError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class RegistrationRefused(Exception):  # noqa: N818 - an outcome carried out of the hand-over, not an error
    """GitHub refused a claimed instance's registration for good; the instance went back to the pool."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def github_wait(cause: GitHubRetryableError, deferrals: int, budget: RegistrationBudget) -> int:
    """How long to leave GitHub alone after it deferred a registration: its own wait for a rate limit,
    which every other registration then honours too (docs.github.com, "Rate limits for the REST API",
    "Exceeding the rate limit"); a growing one while GitHub fails (`deferrals` in a row)."""
    if isinstance(cause, GitHubRateLimitedError):
        budget.hold_off(cause.retry_after_seconds)
        count("GitHubRateLimited")
        return wait_seconds(cause.retry_after_seconds)
    count("GitHubUnavailable")
    return unavailable_wait_seconds(deferrals)


@dataclass(frozen=True)
class HandOver:
    """Registers runners and stores their configs, for the provision steps. Every collaborator but the
    table is built on first use, so a step that hands nothing over never reads the App's key."""

    table: HandOverRecords
    _: KW_ONLY
    github: GitHubSettings
    arns: InstanceArns
    registry: Callable[[], RunnerRegistry]
    credentials: Callable[[], RunnerCredentials]
    queues: Callable[[], PoolQueue]
    notices: NoticeSource
    _ahead: list[Future[None]] = field(default_factory=list, init=False, repr=False, compare=False)
    """The token request `authenticate_ahead` began, until `settle` has waited for it."""

    def register(self, instance_id: str, run_key: str, claim: str) -> float | None:
        """Register a JIT runner for the run and store its config for this instance only.

        The runner is noted on the record before its config is stored. A retry that finds a config
        stored for the noted runner knows the hand-over is complete; one that finds the runner noted but
        no config for it registers again under the same name, which replaces a registration no agent can
        have started. Noting it after the store instead would let a retry replace the registration of a
        runner the agent already started with the stored config. Returns when the runner was noted (the
        same for a retry that finds it done), or None if the record is no longer held for the run.
        Raises GitHub's error when the registration was not made; anything else that raises leaves the
        hand-over to the step's retry.
        """
        record = self.table.get(instance_id)
        if record is None or record.run_key != run_key:
            return None
        instant = instant_class(run_key) is not None
        if record.repository is None and not instant:
            # Registered at the App's scope, an organisation's runner could take any repository's job.
            raise RepositoryUnknownError(
                f"{instance_id}'s record names no repository: no runner is registered"
            )
        arn = self.arns.arn(instance_id)
        if record.runner_id is not None and self.credentials().stored_runner(instance_id, arn) == (
            run_key,
            record.runner_id,
        ):
            # Handed over by an earlier try, whose notice may not have gone out.
            self._notify(instance_id)
            return record.updated_at
        # Every label the job asked for: GitHub gives a job only to a runner carrying all of them. At
        # the job's repository, so no other repository's job can be given the runner; an instant tier's
        # where any repository's job can (domain/instant.py): it waits for a job nobody knows yet.
        runner = self.registry().jit_config(
            runner_name(instance_id, claim),
            list(RunKey.parse(run_key).runner_labels),
            runner_group_id=self.github.runner_group_id,
            repository=record.repository,
            repository_id=record.repository_id,
            instant=instant,
        )
        noted = self.table.record_runner(instance_id, run_key, runner.runner_id)
        if not noted.succeeded or noted.record is None:
            return None
        self.credentials().store(
            instance_id, arn, run_key, runner.encoded_jit_config, runner_id=runner.runner_id
        )
        # Only now, with the config in place: the agent that reads its record on this notice finds it.
        self._notify(instance_id)
        return noted.record.updated_at

    def claimed(self, instance_id: str, run_key: str, token: str) -> float | None:
        """`register` for an instance claimed with `token`: while GitHub defers or refuses the
        registration, the instance goes back to the pool (a warm instance is never thrown away for
        GitHub's sake) and the outcome is raised. Any other error is raised as it is, the claim kept."""
        try:
            return self.register(instance_id, run_key, token)
        except GitHubError as exc:
            if not isinstance(exc, GitHubRetryableError) and not refused_for_good(exc):
                raise
            self.give_back(instance_id, run_key, token)
            if isinstance(exc, GitHubRetryableError):
                raise RegistrationDeferred(exc) from exc
            count("RegistrationsRefused")
            raise RegistrationRefused(str(exc)) from exc

    def give_back(self, instance_id: str, run_key: str, token: str) -> bool:
        """A claimed instance that was handed nothing, back to the pool; expired (for refresh to
        terminate) if its claim moved on meanwhile. Whether it went back to the pool."""
        returned = self.table.unclaim(instance_id, run_key, token)
        if returned.succeeded and returned.record is not None:
            self._notify(instance_id)
            self.queues().offer(PoolMessage.for_idle(returned.record))
            return True
        self.table.expire(instance_id, run_key)
        return False

    def side_by_side(self, hand_over: Callable[[_Item], float | None], items: list[_Item]) -> list[Outcome]:
        """`hand_over` on each item, HAND_OVERS_AT_ONCE at a time. Once GitHub defers or refuses one, the
        hand-overs not yet begun are not begun (those in flight finish). Any other error is raised once
        every hand-over in flight has ended."""
        # Built here, once, not by the first of several threads at the same moment.
        self.registry()
        self.credentials()
        self.notices()
        stop = threading.Event()

        def one(item: _Item) -> Outcome:
            if stop.is_set():
                return NotTried.NOT_TRIED
            try:
                return hand_over(item)
            except GitHubRetryableError as exc:
                stop.set()
                return exc
            except GitHubError as exc:
                if not refused_for_good(exc):
                    raise
                stop.set()
                count("RegistrationsRefused")
                return Refused(str(exc))

        return side_by_side(one, items, at_once=HAND_OVERS_AT_ONCE)

    def authenticate_ahead(self) -> None:
        """Ask GitHub for the installation token in the background while the step goes on. A fresh Lambda
        environment's first registration would ask for it first (about 200 ms, bench/aws_model.py) after
        the pool's look or the launch; a warm one holds it and asks nothing. Best effort: whatever fails
        here fails again, and is handled, where the token is needed.

        The registry is made in the background too: in a fresh environment that is a Secrets Manager
        call for the App's key, which the step need not wait for (0.1 s before CreateFleet in the
        emulator). Nothing waits for the token before it is needed: a step that hands over waits for it
        there (the token cache's lock), and one that found nothing to hand over (an empty pool) only as
        it returns (`settle`)."""
        try:
            ahead: Future[None] = in_background(lambda: self.registry().authenticate())
        except Exception:
            logger.debug("no installation token ahead; the first registration asks for it", exc_info=True)
        else:
            ahead.add_done_callback(_note_token_not_ahead)
            self._ahead.append(ahead)

    def settle(self) -> None:
        """Wait for the token request begun ahead to end (AHEAD_SETTLE_SECONDS at most) before the step
        returns. Lambda freezes an environment once its handler has returned: "Background processes or
        callbacks that were initiated by your Lambda function and did not complete when the function ended
        resume if Lambda reuses the execution environment. Make sure that any background processes or
        callbacks in your code are complete before the code exits" (Lambda Developer Guide,
        lambda-runtime-environment.html). A request frozen in flight would hold the token cache's lock into
        a later invocation, whose hand-overs would wait for it to thaw, or for its connection to time out.
        A step that handed over waited for the token already; one that found an empty pool waits here, in
        a fresh environment only (a warm one holds the token)."""
        while self._ahead:
            ahead = self._ahead.pop()
            with contextlib.suppress(Exception):  # only waited for: what it raised, its callback noted
                ahead.result(timeout=AHEAD_SETTLE_SECONDS)

    def _notify(self, instance_id: str) -> None:
        try:
            notify(self.notices, instance_id)
        except Exception:  # best effort: the hand-over took effect, and the agent's watch reads its record
            logger.exception("notice not sent; the agent sees its record at its watch period")


def _note_token_not_ahead(ahead: Future[None]) -> None:
    if ahead.exception() is not None:
        logger.info("installation token not obtained ahead", error=repr(ahead.exception()))
