"""Refresh (DESIGN.md section 8): the scheduled sweep that ends what is due, leaks nothing, keeps the pool.

Each run does fifteen jobs, one after the other, each on its own (one failing does not stop the rest).
A job begins only with JOB_RESERVE_SECONDS of the Lambda's time left; those left are deferred, and the
next run begins with them (`run`). Jobs 6, 8 and 9 read GitHub for runs with recent demand and live in
steps.reconcile:

1. vanished: a live record whose instance EC2 reports gone (a spot interruption, a terminate from
   outside) is expired at once, rather than when its threshold would have passed;
1b. stopped tier: stopping instances EC2 reports stopped are marked stopped; idle on-demand instances
   whose idle time ends before the next run are stopped instead of terminated, up to
   `pool.stopped_maximum` per class (domain/stopped_tier.py); a stopped one past its time is due below;
   one launched for the stopped minimum and admitted, whose stop a dead run left undone, is stopped;
2. terminate due: every live record whose threshold has passed (expired created, claimed, running
   and idle alike) is terminated in EC2, in batches, then marked terminated; one EC2 no longer
   knows is marked terminated too;
2b. unreadable: a `state` item of the threshold index that does not parse is no record: its instance is
   terminated at once, logged and counted, and the item taken out of every index (StateTable.set_aside).
   Every other read passes such an item over as if it were not there, so no job fails on it;
3. orphans: instances with the stack's tag and no live record (or none that parses) are terminated, once
   older than a grace period (a creation records its instances right after CreateFleet returns);
4. admit: instances launched for the pool whose agent has signalled `UD_OK` with a fresh
   heartbeat go created → idle and into their class's queue, or, launched for the stopped minimum,
   straight on to idle → stopping; `UD_FAILED` expires them;
5. warm pool: each class short of the warm minimum in force now (idle plus still booting) is topped
   up, and each short of its stopped minimum (the tier plus those launched for it) gets on-demand
   instances marked for the tier; a minimum that drops (a schedule's window closes) terminates nothing.
   With `pool.sizing: adaptive`, the sizing rule's numbers (domain/sizing.py, over the class's recorded
   arrivals and boot times, the schedule its floor) replace the minimums, and idle instances beyond its
   hot number are taken back: stopped while the rule wants more stopped, else ended (only while still
   idle and unheld: a claim that came first keeps its instance). No history, or none readable, keeps
   the schedule;
5a. budget: with `budget.daily_usd`, today's spend is emitted; past it, warm minimums are 0 (steps/spend.py);
5b. instant tier: its organisation runner group is set to the installation's repositories (the backstop
   of a lost `installation_repositories` delivery); each class whose instant tier holds fewer instances
   than its size asks for the rest in one provision (domain/instant.py); one whose instance died or whose
   runner exited is short by it once jobs 1, 2 and 8 have ended it (job 6 ends one whose runner GitHub
   shows offline), and GitHub's runner is deleted by job 6; waiting runners beyond the size (all of them,
   once a window closes and the size is 0) are deleted at GitHub and their instances ended;
6. runners: our runners GitHub lists as offline are deleted, unless one may still start;
7. redeliveries: webhook deliveries that failed in the last hour are asked for again;
8. dead runners: a running instance whose agent reports its runner exited before it took a job
   (UD_REG_FAILED for its run key) is released, to be cleaned and pooled, and one more runner is
   asked for the run;
9. reconcile: for runs with recent demand and no provision at work for them, GitHub is asked for
   their jobs (List jobs for a workflow run attempt), and every queued job with our label that no
   runner of ours is free to take gets one: no job is ever stranded. At most
   RECONCILE_REQUESTS_PER_RUN requests to GitHub a run, least recently reconciled runs first;
10. notice queues: a notice queue whose instance has no live record is deleted, and a live record
   without one gets one (its opening failed); queues are opened only after their record is written, so
   a queue without a record is one whose instance has ended (domain/notices.py);
11. pool sweep: what no request can take is dropped from queues pickup skips (PickupManager.sweep).

Two runs at once, or a run that dies anywhere, leave nothing wrong: a passed threshold is final
(no transition applies once it has passed), termination and deletion are idempotent, the marks and
admissions are conditional writes whose loser leaves the work alone, and the warm-pool top-up and
each redelivery are claimed through a compare-and-set marker in the state table before acting.
What a dead run left undone, the next run finds still to do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from runner_pool.adapters.executions import Executions
from runner_pool.adapters.fleet import Fleet
from runner_pool.adapters.recent_demand import RecentDemand
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.class_history import ClassHistory, Fact
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.fleet import Ec2State, LaunchRequest, Termination
from runner_pool.domain.lifecycle import InstanceState, Outcome
from runner_pool.domain.pickup import PickupManager, PoolQueue
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import InstanceRecord, PoolMessage, Signal, UsageClass
from runner_pool.domain.refresh import (
    JOB_RESERVE_SECONDS,
    ORPHAN_GRACE_SECONDS,
    REDELIVERY_MARKER,
    REDELIVERY_WINDOW_SECONDS,
    RESUME_MARKER,
    STOPPED_TIER_MARKER,
    SWEEP_BATCH,
    WARM_POOL_MARKER,
    RefreshReport,
    batches,
    booting_for_pool,
    in_turn,
    pool_shortfall,
    surplus_idle,
    untracked,
)
from runner_pool.domain.registration_budget import RegistrationBudget
from runner_pool.domain.runners import GitHubError, RunnerRegistry
from runner_pool.domain.sizing import Holding
from runner_pool.domain.stopped_tier import (
    awaiting_stop,
    clean_to_stop,
    launched_for_tier,
    stopped_shortfall,
    stopped_until,
    surplus_stopped,
    to_stop,
)
from runner_pool.observability import logger
from runner_pool.steps.capacity_waits import CapacityWaitSteps
from runner_pool.steps.class_history import HistoryNotes, sized
from runner_pool.steps.instant_tier import InstantTier
from runner_pool.steps.notices import NoticeSource, close_queues, no_notices, open_queues
from runner_pool.steps.reconcile import RunReconciliation, TimeLeft
from runner_pool.steps.spend import Spend


class Refresh:
    def __init__(
        self,
        table: StateTable,
        fleet: Fleet,
        queues: PoolQueue,
        registry: Callable[[], RunnerRegistry],
        *,
        clock: Clock,
        config: StackConfig,
        stack_tag: tuple[str, str],
        orphan_grace_seconds: float = ORPHAN_GRACE_SECONDS,
        recent_demand: RecentDemand | None = None,
        executions: Callable[[], Executions] | None = None,
        notices: NoticeSource = no_notices,
        pickup: Callable[[], PickupManager] | None = None,
        budget: Callable[[], RegistrationBudget] | None = None,
        capacity_waits: CapacityWaitSteps | None = None,
        history: ClassHistory | None = None,
        spend: Spend | None = None,
    ) -> None:
        """Without `recent_demand` and `executions` (both needed), jobs 8 and 9 do nothing. With
        `capacity_waits`, job 9 provisions a run key waiting for capacity only once its back-off is over;
        without `history`, adaptive sizing keeps the schedule and no boot time is noted; `spend` records
        each instance's life as it ends and keeps the daily budget."""
        self._table = table
        self._fleet = fleet
        self._queues = queues
        self._registry = registry
        self._clock = clock
        self._config = config
        self._stack_tag = stack_tag
        self._orphan_grace = orphan_grace_seconds
        self._recent = recent_demand
        self._executions = executions
        self._notices = notices
        self._pickup = pickup
        self._budget = budget
        self._capacity_waits = capacity_waits
        self._history = history
        self._notes = None if history is None else HistoryNotes(history, config, clock)
        self._spend = spend
        self._sizing: tuple[int, dict[str, Holding]] | None = None

    def run(self, tick: int, time_left: TimeLeft = lambda: math.inf) -> RefreshReport:
        """Every job in turn while `time_left()` (seconds) allows; the rest are deferred to the next run,
        which begins with the first of them (RESUME_MARKER), so every job gets its turn however short
        the runs are. Jobs are independent and idempotent, so the order they run in is only a matter of
        who goes first."""
        report = RefreshReport()
        github = RunReconciliation(
            self._table,
            self._registry,
            clock=self._clock,
            config=self._config,
            recent_demand=self._recent,
            executions=self._executions,
            time_left=time_left,
            budget=self._budget,
            capacity_waits=self._capacity_waits,
        )
        instant = InstantTier(
            self._table, self._registry, clock=self._clock, config=self._config, executions=self._executions
        )
        jobs: list[tuple[str, Callable[[RefreshReport], None]]] = [
            ("vanished", self._expire_vanished),
            ("stopped-tier", lambda r: self._keep_stopped(r, tick)),
            ("terminate-due", self._terminate_due),
            ("unreadable", self._end_unreadable),
            ("orphans", self._terminate_orphans),
            ("admit", self._admit_ready),
            ("budget", lambda r: self._spend.keep_budget(self._table.live()) if self._spend else None),
            ("warm-pool", lambda r: self._keep_warm(r, tick)),
            ("instant-tier", lambda r: instant.keep(r, tick)),
            ("runners", github.delete_offline_runners),
            ("redeliveries", self._redeliver),
            ("dead-runners", github.replace_dead_runners),
            ("reconcile", lambda r: github.reconcile(r, tick)),
            ("notice-queues", self._sync_notice_queues),
            ("pool-sweep", self._sweep_pool),
        ]
        resume = self._table.read_marker(RESUME_MARKER)
        turn = int(resume or 0)
        for offset, (name, job) in enumerate(in_turn(jobs, turn)):
            if time_left() < JOB_RESERVE_SECONDS:
                report.deferred = [name for name, _ in in_turn(jobs, turn)[offset:]]
                break
            report.ran.append(name)
            try:
                job(report)
            except Exception:
                logger.exception("refresh job failed; the next run tries again", job=name)
                report.failed.append(name)
        names = [name for name, _ in jobs]
        follow = names.index(report.deferred[0]) if report.deferred else 0
        if follow != turn:
            # Lost to a run at once: that run's place is as good, so the loss is left alone.
            self._table.move_marker(RESUME_MARKER, follow, expected=resume)
        if self._budget is not None:
            hourly = self._budget().hourly()
            report.github_hourly_remaining = None if hourly is None else hourly.remaining
        if report.deferred:
            logger.warning("refresh ran short of time; the next run begins here", deferred=report.deferred)
        return report

    # --- 1. instances EC2 has lost -------------------------------------------------------------

    def _expire_vanished(self, report: RefreshReport) -> None:
        now = self._clock.now()
        # EC2 may not show an instance launched a moment ago: only records older than the grace count.
        settled = [
            record
            for record in self._table.live()
            if not record.threshold_passed(now) and now - record.created_at >= self._orphan_grace
        ]
        if not settled:
            return
        states = self._fleet.states([record.instance_id for record in settled])
        for record in settled:
            state = states.get(record.instance_id, Ec2State.UNKNOWN)
            if not state.is_gone:
                continue
            logger.warning(
                "instance gone from EC2; expiring its record", instance_id=record.instance_id, ec2=state
            )
            # Whoever holds it loses its next transition and lets go; the sweep below marks it terminated.
            if self._table.expire(record.instance_id).outcome is Outcome.APPLIED:
                report.vanished += 1

    # --- 1b. the stopped tier -------------------------------------------------------------------

    def _keep_stopped(self, report: RefreshReport, tick: int) -> None:
        if self._config.pool.stopped_maximum == 0:
            return
        now = self._clock.now()
        records = self._table.live()
        stopping = [r for r in records if r.state is InstanceState.STOPPING and not r.threshold_passed(now)]
        if stopping:
            states = self._fleet.states([record.instance_id for record in stopping])
            for record in stopping:
                if states.get(record.instance_id) is Ec2State.STOPPED:
                    until = stopped_until(record, self._config, now)
                    if self._table.mark_stopped(record, until).outcome is Outcome.APPLIED:
                        report.stopped += 1
                elif states.get(record.instance_id) in (Ec2State.RUNNING, Ec2State.PENDING):
                    # A stop asked by a run that died before EC2 took it: asked again (EC2 accepts it twice).
                    self._fleet.stop(record.instance_id)
        # Launched for the stopped minimum and admitted, but a run died before it stopped them: their room
        # in the tier is theirs already (to_stop counts them), so no marker is needed.
        for record in records:
            if awaiting_stop(record, now):
                self._stop(record.instance_id, report)
        # An agent not known clean (its scrub not done yet, or failed) is looked at again next run, and is
        # terminated as due if its idle time ends first.
        # Under adaptive sizing the tier has room for the rule's stopped number, not the maximum.
        tier = {name: need.stopped for name, need in self._sized(tick).items()} or None
        chosen = to_stop(
            records,
            self._config,
            now,
            clean=lambda r: clean_to_stop(self._table.read_signal(r.instance_id)),
            tier=tier,
        )
        if not chosen:
            return
        # One run a schedule slot chooses, so two runs at once never stop past the maximum together.
        claimed, _ = self._claim_marker(
            STOPPED_TIER_MARKER, tick, self._table.read_marker(STOPPED_TIER_MARKER)
        )
        if not claimed:
            return
        for record in chosen:
            self._stop(record.instance_id, report)

    def _stop(self, instance_id: str, report: RefreshReport) -> None:
        """idle → stopping, then EC2 StopInstances; only the run whose write applied asks EC2."""
        if self._table.stop(instance_id).outcome is not Outcome.APPLIED:
            return  # claimed, expired or stopped by another run meanwhile
        if not self._fleet.stop(instance_id):
            logger.warning("EC2 refused to stop an idle instance; expiring it", instance_id=instance_id)
            self._table.expire(instance_id, run_key=None)
            return
        report.stopping += 1

    # --- 2. what is due ------------------------------------------------------------------------

    def _terminate_due(self, report: RefreshReport) -> None:
        for batch in batches(self._table.due(), SWEEP_BATCH):
            results = self._fleet.terminate([record.instance_id for record in batch])
            for record in batch:
                # TerminateInstances first: a record is never marked terminated while its instance runs.
                ended = self._table.mark_terminated(record.instance_id)
                if ended.outcome is not Outcome.APPLIED or ended.record is None:
                    continue
                if self._spend is not None:
                    self._spend.instance_ended(record, ended.record.updated_at)
                report.terminated[record.state.value] += 1
                if results.get(record.instance_id) in (Termination.TERMINATED, Termination.UNKNOWN):
                    report.already_gone += 1

    # --- 2b. records that do not parse ------------------------------------------------------------

    def _end_unreadable(self, report: RefreshReport) -> None:
        """Nothing an unreadable record says is trusted, its threshold neither: its instance is untracked,
        terminated now rather than after the orphans' grace, and the item set aside so no run meets it
        again. TerminateInstances first: an item is never set aside while its instance runs."""
        found = self._table.unreadable()
        if not found:
            return
        for unreadable in found:
            logger.error(
                "instance record does not parse; terminating its instance as untracked",
                instance_id=unreadable.instance_id,
                reason=unreadable.reason,
            )
        instance_ids = [u.instance_id for u in found if u.instance_id is not None]
        if instance_ids:
            self._fleet.terminate(instance_ids)
        report.unreadable += sum(1 for unreadable in found if self._table.set_aside(unreadable))

    # --- 3. orphans ----------------------------------------------------------------------------

    def _terminate_orphans(self, report: RefreshReport) -> None:
        launched_before = self._clock.now() - self._orphan_grace
        tagged = self._fleet.tagged_instances(*self._stack_tag, launched_before=launched_before)
        if not tagged:
            return
        live = {record.instance_id for record in self._table.live()}
        # The index may not show a record written a moment ago; a consistent read settles each suspect.
        orphans = [
            instance_id
            for instance_id in tagged
            if instance_id not in live and untracked(self._table.get(instance_id))
        ]
        if not orphans:
            return
        logger.warning("terminating instances that have no live record", instance_ids=orphans)
        results = self._fleet.terminate(orphans)
        report.orphans_terminated += sum(
            1 for result in results.values() if result is Termination.TERMINATING
        )

    # --- 4. pooled instances that are ready ----------------------------------------------------

    def _admit_ready(self, report: RefreshReport) -> None:
        now = self._clock.now()
        healthy_window = self._config.timeouts.healthy_window_seconds
        booting = [record for record in self._table.live() if booting_for_pool(record, now)]
        views = self._table.observe_many([record.instance_id for record in booting])
        for record in booting:
            view = views[record.instance_id]
            signal = view.signal
            if signal is not None and signal.confirms(Signal.UD_FAILED, None):
                logger.warning(
                    "pool instance failed to boot", instance_id=record.instance_id, reason=signal.reason
                )
                if self._table.expire(record.instance_id, run_key=None).outcome is Outcome.APPLIED:
                    report.unready += 1
                continue
            beat = view.heartbeat
            if signal is None or not signal.confirms(Signal.UD_OK, None) or beat is None:
                continue
            if not beat.is_fresh(now, healthy_window):
                continue
            admitted = self._table.admit(record.instance_id)
            # Only the run whose admit applied offers the instance: it is pooled once.
            if admitted.outcome is not Outcome.APPLIED or admitted.record is None:
                continue
            report.admitted += 1
            if self._notes is not None:
                self._notes.boot(
                    Fact.LAUNCH, record.resource_class, record.instance_id, signal.at - record.created_at
                )
            if admitted.record.for_stopped_tier:
                # Never offered hot: stopped at once, its room in the tier taken since its launch.
                self._stop(record.instance_id, report)
            else:
                self._queues.offer(PoolMessage.for_idle(admitted.record))

    # --- 5. the warm minimum -------------------------------------------------------------------

    def _keep_warm(self, report: RefreshReport, tick: int) -> None:
        """Launch each class's shortfall of idle instances (its warm minimum in force), or of pristine ones
        among them (its pristine minimum), whichever is larger: what is launched for the pool is pristine,
        so it counts toward both (domain/config.py WarmMinimum)."""
        now = self._clock.now()
        idle: dict[str, list[InstanceRecord]] = {name: [] for name in self._config.resource_classes}
        pristine: Counter[str] = Counter()
        booting: Counter[str] = Counter()
        records = self._table.live()
        for record in records:
            if launched_for_tier(record, now):
                continue  # the stopped minimum's, counted there
            if (
                record.state is InstanceState.IDLE
                and record.run_key is None
                and not record.threshold_passed(now)
            ):
                idle.setdefault(record.resource_class, []).append(record)
                pristine[record.resource_class] += record.pristine
            elif booting_for_pool(record, now):
                booting[record.resource_class] += 1
        report.idle = {name: len(idle[name]) for name in self._config.resource_classes}
        report.idle_pristine = {name: pristine[name] for name in self._config.resource_classes}
        # On the schedule only a shortfall launches: when a window closes and its minimum drops, the
        # surplus is left to run out its idle time and be terminated as due, like any idle instance.
        holdings = self._sized(tick)
        report.minimum = {
            name: holdings[name].hot if name in holdings else self._warm_minimum(name, now)
            for name in self._config.resource_classes
        }
        report.pristine_minimum = {
            name: self._config.pristine_minimum(name, now) for name in self._config.resource_classes
        }
        surplus = {
            name: surplus_idle(idle[name], need.hot, report.pristine_minimum[name])
            for name, need in holdings.items()
        }
        short = {
            name: pool_shortfall(
                report.minimum[name],
                report.pristine_minimum[name],
                idle=len(idle[name]),
                idle_pristine=pristine[name],
                booting=booting[name],
            )
            for name in self._config.resource_classes
        }
        shortfall = {name: count for name, count in short.items() if count > 0}
        report.stopped_minimum = {
            name: holdings[name].stopped if name in holdings else self._config.stopped_minimum(name, now)
            for name in self._config.resource_classes
        }
        stopped_short = stopped_shortfall(records, self._config, now, report.stopped_minimum)
        tier = {name: need.stopped for name, need in holdings.items()}
        stopped_surplus = surplus_stopped(records, tier, now)
        if not shortfall and not stopped_short and not any(surplus.values()) and not stopped_surplus:
            return
        # One claim covers the top-ups and the take-back: two runs at once never do either twice.
        claimed, _ = self._claim_marker(WARM_POOL_MARKER, tick, self._table.read_marker(WARM_POOL_MARKER))
        if not claimed:
            return  # this schedule slot's top-up is another run's
        for name, chosen in surplus.items():
            stopped_short[name] = self._take_back_idle(chosen, stopped_short.get(name, 0), report)
        for record in stopped_surplus:
            # A claim that came first holds a run key, so this expiry fails: its instance starts for its job.
            if self._table.expire(record.instance_id, run_key=None).outcome is Outcome.APPLIED:
                report.trimmed[record.resource_class] += 1
        stopped_short = {name: count for name, count in stopped_short.items() if count > 0}
        self._launch_for_pool(report, tick, shortfall, stopped_short)

    def _warm_minimum(self, name: str, now: Epoch) -> int:
        return 0 if self._spend is not None and self._spend.dropped else self._config.warm_minimum(name, now)

    def _launch_for_pool(
        self, report: RefreshReport, tick: int, shortfall: dict[str, int], stopped_short: dict[str, int]
    ) -> None:
        launches = [(name, number, False) for name, number in sorted(shortfall.items())] + [
            (name, number, True) for name, number in sorted(stopped_short.items())
        ]
        failures = []
        for name, number, for_tier in launches:
            # The tier is on-demand only (EC2 stops no one-time Spot Instance); config refuses a stopped
            # minimum under spot defaults, and the launch says on-demand itself, so no fallback applies.
            request = LaunchRequest.for_pool(
                self._config,
                name,
                number,
                f"refresh-{tick}-{'stopped-tier' if for_tier else 'warm-pool'}-{name}",
                usage=UsageClass.ON_DEMAND if for_tier else None,
            )
            try:
                outcome = self._fleet.launch_with_fallback(request, self._config.fleet)
            except Exception:
                logger.exception(
                    "warm-pool launch failed", resource_class=name, count=number, for_tier=for_tier
                )
                failures.append(name)
                continue
            for facts in outcome.launched:
                # Recorded at once: an instance is never left without a record (the orphan sweep's grace
                # covers the moment between CreateFleet's answer and these writes).
                self._table.create(facts, run_key=None, for_stopped_tier=for_tier)
            open_queues(self._notices, (facts.instance_id for facts in outcome.launched))
            if for_tier:
                report.launched_for_stopped[name] += len(outcome.launched)
            else:
                report.launched[name] += len(outcome.launched)
        if failures:
            raise RuntimeError(f"warm-pool launches failed for: {', '.join(failures)}")

    def _sized(self, tick: int) -> dict[str, Holding]:
        """Per class, what adaptive sizing holds now (steps/class_history.py `sized`), read once a run: the
        stopped tier's room and the warm pool's numbers are the same answer. Past a daily budget that drops
        warm minimums, the rule holds nothing hot either (its stopped tier costs only volumes)."""
        if self._sizing is None or self._sizing[0] != tick:
            holdings = sized(self._history, self._config, self._clock.now())
            if self._spend is not None and self._spend.dropped:
                holdings = {name: replace(holding, hot=0) for name, holding in holdings.items()}
            self._sizing = (tick, holdings)
        return self._sizing[1]

    def _take_back_idle(self, chosen: list[InstanceRecord], stopped_short: int, report: RefreshReport) -> int:
        """Idle instances beyond adaptive sizing's hot number: each stopped while the class's stopped tier
        is short (on-demand, its agent clean) and ended otherwise, only while still idle and unheld. How
        short the tier is still."""
        for record in chosen:
            if (
                stopped_short > 0
                and record.usage_class is UsageClass.ON_DEMAND
                and clean_to_stop(self._table.read_signal(record.instance_id))
            ):
                stopping = report.stopping
                self._stop(record.instance_id, report)
                if report.stopping > stopping:
                    stopped_short -= 1
                    report.trimmed[record.resource_class] += 1
                continue
            # A claim that came first holds a run key, so this expiry fails: its instance serves its job.
            if self._table.expire(record.instance_id, run_key=None).outcome is Outcome.APPLIED:
                report.trimmed[record.resource_class] += 1
        return stopped_short

    # --- 5b. the instant tier: steps/instant_tier.py ----------------------------------------------

    # --- 7. missed webhooks --------------------------------------------------------------------

    def _redeliver(self, report: RefreshReport) -> None:
        github = self._registry()
        since = self._clock.now() - REDELIVERY_WINDOW_SECONDS
        failed = sorted(github.failed_deliveries(since), key=lambda delivery: delivery.delivery_id)
        seen = self._table.read_marker(REDELIVERY_MARKER)
        for delivery in failed:
            claimed, previous = self._claim_marker(REDELIVERY_MARKER, delivery.delivery_id, seen)
            if not claimed:
                seen = previous
                continue
            seen = delivery.delivery_id
            try:
                github.redeliver(delivery.delivery_id)
            except GitHubError:
                # Handed back unless another run has moved past it since, so the next run asks again.
                self._table.move_marker(REDELIVERY_MARKER, previous or 0, expected=delivery.delivery_id)
                raise
            report.redelivered += 1

    def _claim_marker(self, name: str, value: float, seen: float | None) -> tuple[bool, float | None]:
        """Move a marker, last `seen` at a value, up to `value`, first come first served: (won, the
        marker before it moved). Losing means another run got the marker to `value` or beyond: that
        work is its.
        """
        current = seen
        while current is None or current < value:
            if self._table.move_marker(name, value, expected=current):
                return True, current
            current = self._table.read_marker(name)
        return False, current

    # --- 10. notice queues ---------------------------------------------------------------------

    def _sync_notice_queues(self, report: RefreshReport) -> None:
        queues = self._notices()
        if queues is None:
            return
        # Listed before the records are read: a queue is opened only after its record is written, so a
        # queue listed here whose record is not live is one whose instance has ended.
        opened = set(queues.instance_ids())
        live = {record.instance_id for record in self._table.live()}
        # The index may lag a record written or ended a moment ago; a consistent read settles each suspect.
        ended = sorted(i for i in opened - live if untracked(self._table.get(i)))
        missing = sorted(live - opened)
        report.notice_queues_closed += close_queues(queues, ended)
        report.notice_queues_opened += open_queues(lambda: queues, missing)

    # --- 11. pool sweep ------------------------------------------------------------------------

    def _sweep_pool(self, report: RefreshReport) -> None:
        if self._pickup is None:
            return
        pickup = self._pickup()
        for partition in PoolPartition.every(sorted(self._config.resource_classes)):
            counts = pickup.sweep(partition)
            report.pool_messages_dropped += counts.dropped_unparseable + counts.dropped_stale
