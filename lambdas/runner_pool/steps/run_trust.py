"""A run attempt's level of trust as the dispatcher decides it: from its `requested` delivery, else from
GitHub's answer about the run, else not at all (None: its jobs are served single use).

The first level decided for a run attempt stands (the ledger's `decide_trust`): a later delivery that
disagrees changes nothing already served by it, and is logged with both. When a run's demand comes
before its `requested` delivery (late, or lost: GitHub never retries a failed delivery on its own), the
run attempt is read from GitHub once, GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/
{attempt_number} (docs.github.com, "REST API endpoints for workflow runs", "Get a workflow run attempt":
its `event`, `actor`, `triggering_actor` and `head_repository`), within GitHub's hourly limit above
RUN_READ_FLOOR, and its answer is kept in the ledger as the level decided. When GitHub does not answer
(an error, a rate limit, the hour's share spent) the level stays undecided: fail closed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from runner_pool.domain.clock import Clock
from runner_pool.domain.demand import DemandLedger, RunFromFork, RunReader, RunRequested
from runner_pool.domain.registration_budget import RUN_READ_FLOOR, HourlyQuota
from runner_pool.domain.trust import RunFacts, TrustLevel, from_fork, run_trust
from runner_pool.observability import logger

HourlyRead = Callable[[], HourlyQuota | None]
"""GitHub's hourly remainder as last read by any of our processes (None: never read)."""


class RunTrust:
    """Without `reader`, no run is read from GitHub: a level not delivered stays undecided."""

    def __init__(
        self,
        ledger: DemandLedger,
        clock: Clock,
        *,
        by_event: Mapping[str, TrustLevel] | None = None,
        reader: Callable[[], RunReader] | None = None,
        hourly: HourlyRead | None = None,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._by_event = dict(by_event or {})
        self._reader = reader
        self._hourly = hourly
        self._asked: dict[tuple[int, int], TrustLevel | None] = {}
        """Run attempts this dispatch asked GitHub about, with what came of it: asked once each."""

    def requested(self, message: RunRequested | RunFromFork) -> TrustLevel:
        """Decide the level of a requested run attempt; the level that stands."""
        if isinstance(message, RunFromFork):
            return self._decide(message.run_id, message.run_attempt, TrustLevel.UNTRUSTED, fork=True)
        facts = message.facts
        level = run_trust(facts, self._by_event)
        return self._decide(message.run_id, message.run_attempt, level, fork=from_fork(facts))

    def undelivered(self, repository: str, run_id: int, attempt: int) -> TrustLevel | None:
        """The level of a run attempt whose `requested` delivery has not been seen: from GitHub's answer
        about it (kept in the ledger), or None when GitHub does not answer."""
        key = (run_id, attempt)
        if key not in self._asked:
            self._asked[key] = self._read(repository, run_id, attempt)
        return self._asked[key]

    def _read(self, repository: str, run_id: int, attempt: int) -> TrustLevel | None:
        if self._reader is None:
            return None
        try:
            reader = self._reader()  # built first: no hourly read for a stack that cannot ask GitHub
            if not self._hour_allows():
                logger.warning(
                    "run's level not read: GitHub's hourly share for it is spent; its jobs are single use",
                    repository=repository,
                    run_id=run_id,
                    attempt=attempt,
                )
                return None
            facts: RunFacts = reader.run_attempt(repository, run_id, attempt)
            level = run_trust(facts, self._by_event)
            return self._decide(run_id, attempt, level, fork=from_fork(facts))
        except Exception as exc:  # any fault (GitHub down, refused, the ledger): fail closed
            logger.warning(
                "run's level not known: its jobs are single use",
                repository=repository,
                run_id=run_id,
                attempt=attempt,
                error=repr(exc),
            )
            return None

    def _hour_allows(self) -> bool:
        quota = None if self._hourly is None else self._hourly()
        return quota is None or quota.left_above(RUN_READ_FLOOR, self._clock.now()) >= 1

    def _decide(self, run_id: int, attempt: int, level: TrustLevel, *, fork: bool) -> TrustLevel:
        standing = self._ledger.decide_trust(run_id, attempt, level, from_fork=fork)
        if standing is not level:
            logger.warning(
                "run attempt's level already decided otherwise; the first stands",
                run_id=run_id,
                attempt=attempt,
                decided=standing.value,
                delivered=level.value,
            )
        return standing
