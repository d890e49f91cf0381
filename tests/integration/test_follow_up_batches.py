"""Follow-up batches: a run key's first demand is dispatched at once, what comes within the window joins
one follow-up, however Lambda's concurrent batches split the demand (domain.follow_up).

Lambda reads a standard queue with five concurrent batches ("Configuring scaling behavior for SQS event
source mappings", services-sqs-scaling.html), so dispatches of one matrix overlap. Here the ledger is
the real one on moto, and overlapping dispatches are played in the one place where a dispatch waits:
a follow-up leader's pause, during which the test runs the other batches, then moves the clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from emulator.event_sources import QueueEventSource
from emulator.harness.webhooks import IDEMPOTENCY_TABLE, IngressWorld, ingress_world
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.demand import DemandMessage, JobQueued, RunCompleted, from_body, to_body
from runner_pool.domain.executions import PROVISION_LIMIT, FollowUpRequest, ProvisionRequest, ReleaseRequest
from runner_pool.domain.follow_up import (
    BURST_QUIET_SECONDS,
    FOLLOW_UP_LIMIT_SECONDS,
    FOLLOW_UP_PACE_FACTOR,
    FOLLOW_UP_WINDOW_SECONDS,
    GATHER_PAUSE_SECONDS,
    SEALED_WAIT_SECONDS,
    BatchRole,
    BatchTurn,
)
from runner_pool.domain.runners import GitHubRetryableError, RunJob
from runner_pool.steps.demand_starts import DispatchReport
from runner_pool.steps.dispatcher import Dispatcher
from runner_pool.steps.follow_up import FollowUpSteps
from tests.support.builders import demand_starts
from tests.support.waiting import eventually

REPOSITORY = "octo-org/octo-repo"
RUN_ID = 4242
LABEL = f"pool={RUN_ID}/class=large"
LEASE_SECONDS = 60.0
MOTO_WINDOW_SECONDS = 1.0
"""The window where real time runs: GitHub's deliveries and DynamoDB's writes (single-digit ms) fit
the product's 0.3 s many times over, but moto on two cores busy with the rest of make test takes up
to 0.5 s a write, so turns a few milliseconds apart on AWS land further apart than 0.3 s here. What
such a test checks is that concurrent batches meet in the ledger, not the window's length."""
MOTO_SEALED_WAIT_SECONDS = 10.0
"""The wait for a follow-up being started, where real time runs: on AWS its start takes a few hundred
milliseconds, on moto under make test's load a few seconds."""


class LeaderDiedError(BaseException):
    """The leader's Lambda ended (a timeout kills its environment) while it waited: nothing of it runs on."""


@dataclass
class Starts:
    """Records the provisions started; `during` runs inside the next start (another dispatch meanwhile).
    A follow-up whose machine starts is gathered in line by `gather` (the follow-up state machine, played here in
    the leader's own dispatch, its Wait states by the leader's pause)."""

    provisions: list[ProvisionRequest] = field(default_factory=list)
    during: Callable[[], object] | None = None
    follow_ups: list[FollowUpRequest] = field(default_factory=list)
    gather: Callable[[FollowUpRequest], DispatchReport] | None = None
    gathered: list[DispatchReport] = field(default_factory=list)
    """What each follow-up's gathering reported (its provisions, duplicates, stale jobs)."""
    machine_down: bool = False
    """The follow-up state machine does not start: each leader gathers its follow-up itself."""
    now: Callable[[], float] = time.time
    handed_at: list[float] = field(default_factory=list)
    """When each follow-up was handed to the machine, by `now`."""

    def follow_up(self, request: FollowUpRequest) -> bool:
        if self.machine_down:
            raise RuntimeError("the follow-up state machine did not start")
        self.follow_ups.append(request)
        self.handed_at.append(self.now())
        if self.gather is not None:
            self.gathered.append(self.gather(request))
        return True

    def provision(self, request: ProvisionRequest) -> bool:
        if self.during is not None:
            during, self.during = self.during, None
            during()
        self.provisions.append(request)
        return True

    def release(self, request: ReleaseRequest) -> bool:
        return True

    def job_ids(self) -> list[tuple[int, ...]]:
        return [request.job_ids for request in self.provisions]


@dataclass
class TimedStarts(Starts):
    """Starts from several threads, with when each began."""

    started_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def provision(self, request: ProvisionRequest) -> bool:
        with self.lock:
            self.started_at.append(time.time())
            return super().provision(request)


@dataclass
class GitHubRun:
    """GitHub's list of the run's jobs, as the follow-up's gather step asks for it; `down` fails the ask.
    Each job as GET .../actions/runs/{run_id}/attempts/{attempt}/jobs gives it (its status, its labels)."""

    jobs: list[RunJob] = field(default_factory=list)
    down: bool = False
    asked: list[tuple[str, int, int]] = field(default_factory=list)

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
        self.asked.append((repository, run_id, attempt))
        if self.down:
            raise GitHubRetryableError("502 Bad Gateway")
        return list(self.jobs), 1

    def queue(self, *job_ids: int, label: str = LABEL, status: str = "queued") -> None:
        self.jobs += [RunJob(job_id, status, (label,), created_at=0.0) for job_id in job_ids]


@dataclass
class Dispatches:
    world: IngressWorld
    starts: Starts = field(default_factory=Starts)
    github: GitHubRun = field(default_factory=GitHubRun)
    window_seconds: float = FOLLOW_UP_WINDOW_SECONDS
    started_at: float = 0.0
    """The world's clock when the test began."""
    meanwhile: list[Callable[[], object]] = field(default_factory=list)
    """What other dispatches do while a leader waits (run in its pause, in order), before the clock moves."""

    def pause(self, seconds: float) -> None:
        while self.meanwhile:
            self.meanwhile.pop(0)()
        self.world.clock.advance(seconds)

    def dispatch(self, holder: str, messages: list[DemandMessage]) -> DispatchReport:
        ledger = DynamoDbLedger(IDEMPOTENCY_TABLE, self.world.clock, self.world.plane.client("dynamodb"))
        starts = demand_starts(ledger, self.starts, self.world.clock, self.pause)
        dispatcher = Dispatcher(starts, window_seconds=self.window_seconds)
        steps = FollowUpSteps(starts, run_jobs=lambda: self.github)
        self.starts.gather = lambda request: gather_in_line(steps, request, self.pause)
        self.starts.now = self.world.clock.now
        batch = [(f"{holder}-m{n}", message) for n, message in enumerate(messages)]
        return dispatcher.dispatch(batch, holder, LEASE_SECONDS)


def gather_in_line(
    steps: FollowUpSteps, request: FollowUpRequest, pause: Callable[[float], None]
) -> DispatchReport:
    """The follow-up state machine: gather, wait as it says, gather again until gathered (and started),
    then start what it could not."""
    while not (gathering := steps.gather(request, LEASE_SECONDS)).gathered:
        pause(gathering.wait_seconds)
        request = gathering.request
    if gathering.follow_up is None:
        return gathering.report
    return steps.start(request, gathering.follow_up, LEASE_SECONDS)


@pytest.fixture
def dispatches() -> Iterator[Dispatches]:
    with ingress_world() as world:
        yield Dispatches(world, started_at=world.clock.now())


def jobs(*job_ids: int, public: bool = False, repository_id: int | None = None) -> list[DemandMessage]:
    return [
        JobQueued(
            repository=REPOSITORY,
            run_key=LABEL,
            run_id=RUN_ID,
            run_attempt=1,
            job_id=job_id,
            public=public,
            repository_id=repository_id,
        )
        for job_id in job_ids
    ]


def test_the_first_demand_starts_at_once_and_overlapping_batches_make_one_follow_up(
    dispatches: Dispatches,
) -> None:
    # Given a run's first job, dispatched on its own
    first = dispatches.dispatch("a", jobs(1))
    # Then its provision started at once, without waiting
    assert dispatches.starts.job_ids() == [(1,)]
    assert first.failed_message_ids == set()

    # When four more batches of the matrix overlap: one leads the follow-up, three join while it waits
    dispatches.meanwhile += [
        lambda: dispatches.dispatch("c", jobs(6, 7, 8, 9, 10)),
        lambda: dispatches.dispatch("d", jobs(11, 12, 13, 14, 15)),
        lambda: dispatches.dispatch("e", jobs(16, 17, 18, 19, 20)),
    ]
    leader = dispatches.dispatch("b", jobs(2, 3, 4, 5))

    # Then the 20 jobs cost two provisions: the first job, then the other 19 together
    assert dispatches.starts.job_ids() == [(1,), tuple(range(2, 21))]
    assert leader.failed_message_ids == set()


def test_the_first_provision_and_the_follow_up_carry_the_repositorys_id(dispatches: Dispatches) -> None:
    # Given a run's jobs whose webhooks gave their repository's id (issue 36, item 5)
    dispatches.dispatch("a", jobs(1, repository_id=186853077))

    # When more of its jobs come while the first provision's window is open: a follow-up
    dispatches.meanwhile += [lambda: dispatches.dispatch("c", jobs(3, repository_id=186853077))]
    dispatches.dispatch("b", jobs(2, repository_id=186853077))

    # Then both the first provision and the follow-up's name the repository's id, by which the runner's
    # group is found and reuse decided
    assert dispatches.starts.job_ids() == [(1,), (2, 3)]
    assert [p.repository_id for p in dispatches.starts.provisions] == [186853077, 186853077]


def led_follow_up(dispatches: Dispatches, join_after: float) -> float:
    """A first dispatch, the next batch leading the follow-up most of a window later, and another batch
    joining it `join_after` seconds after the leader: how long after it began to lead the leader started
    the follow-up (both jobs in it, checked)."""
    dispatches.dispatch("a", jobs(1))
    clock = dispatches.world.clock
    clock.advance(0.75 * FOLLOW_UP_WINDOW_SECONDS)

    def join_later() -> None:
        clock.advance(join_after)
        dispatches.dispatch("c", jobs(3))

    dispatches.meanwhile.append(join_later)
    led_at = clock.now()
    dispatches.dispatch("b", jobs(2))
    assert dispatches.starts.job_ids() == [(1,), (2, 3)]
    return clock.now() - led_at


def test_the_follow_up_closes_a_window_after_its_last_job_joined(dispatches: Dispatches) -> None:
    # When the join comes a moment after the leader, as a matrix's deliveries do side by side
    waited = led_follow_up(dispatches, join_after=0.05)

    # Then the leader waited until a window had passed since the last join, and started both
    assert waited == pytest.approx(0.05 + FOLLOW_UP_WINDOW_SECONDS)


def test_a_follow_up_whose_jobs_come_slower_stays_open_a_few_of_their_gaps(dispatches: Dispatches) -> None:
    # When the join comes 0.2 s after the leader: the run's deliveries come at a slower pace than a
    # matrix's side by side, and a gap of 0.3 s would often close the window between two of them
    waited = led_follow_up(dispatches, join_after=0.2)

    # Then the follow-up stayed open four of those gaps after the last join (domain.follow_up
    # FOLLOW_UP_PACE_FACTOR), not one window
    assert waited == pytest.approx(0.2 + FOLLOW_UP_PACE_FACTOR * 0.2)


def test_a_follow_up_that_keeps_growing_is_started_at_its_limit(dispatches: Dispatches) -> None:
    # Given a first dispatch at t0
    dispatches.dispatch("a", jobs(1))
    clock = dispatches.world.clock
    opened = clock.now()

    # When jobs keep joining the follow-up, each less than a window after the last, for twice the limit
    def trickle(job_id: int) -> Callable[[], None]:
        def join() -> None:
            clock.advance(0.5 * FOLLOW_UP_WINDOW_SECONDS)
            dispatches.dispatch(f"j{job_id}", jobs(job_id))

        return join

    steps = int(2 * FOLLOW_UP_LIMIT_SECONDS / (0.5 * FOLLOW_UP_WINDOW_SECONDS))
    dispatches.meanwhile += [trickle(job_id) for job_id in range(3, 3 + steps)]
    dispatches.dispatch("b", jobs(2))

    # Then the follow-up was sealed once its limit had passed: what joined until then is in it, the
    # rest started at once, apart from it or in the next follow-up
    assert dispatches.starts.job_ids()[0] == (1,)
    # (started as provisions of PROVISION_LIMIT jobs each, one after another, the last one short)
    provisions = dispatches.starts.provisions
    at = next(n for n, request in enumerate(provisions) if 2 in request.job_ids)
    follow_up = [provisions[at]]
    while follow_up[-1].count == PROVISION_LIMIT and at + len(follow_up) < len(provisions):
        follow_up.append(provisions[at + len(follow_up)])
    assert follow_up[0].job_ids[0] == 2
    assert sum(request.count for request in follow_up) >= FOLLOW_UP_LIMIT_SECONDS / (
        0.5 * FOLLOW_UP_WINDOW_SECONDS
    )
    assert sorted(j for started in dispatches.starts.job_ids() for j in started) == list(range(1, 3 + steps))
    assert clock.now() >= opened + FOLLOW_UP_LIMIT_SECONDS


def test_a_job_delivered_twice_across_the_first_batch_and_the_follow_up_starts_once(
    dispatches: Dispatches,
) -> None:
    # Given a first batch with jobs 1 and 2
    dispatches.dispatch("a", jobs(1, 2))
    # When job 2's delivery comes again while job 3's follow-up is open
    repeats: list[DispatchReport] = []
    dispatches.meanwhile.append(lambda: repeats.append(dispatches.dispatch("c", jobs(2))))
    dispatches.dispatch("b", jobs(3))
    # Then job 2 was counted once: its repeat is known counted before it joins anything, and the
    # follow-up starts job 3 alone
    assert dispatches.starts.job_ids() == [(1, 2), (3,)]
    assert [(report.duplicates, report.joined) for report in repeats] == [(1, 0)]


def test_a_follow_up_whose_leader_died_is_started_by_the_redelivery_of_the_leaders_messages(
    dispatches: Dispatches,
) -> None:
    # Given a first dispatch, a follow-up led by "b", which batch "c" joined (its message acknowledged)
    dispatches.dispatch("a", jobs(1))
    joined: list[DispatchReport] = []

    def join_then_die() -> None:
        joined.append(dispatches.dispatch("c", jobs(3, 4)))
        raise LeaderDiedError

    dispatches.meanwhile.append(join_then_die)
    # When the leader's Lambda ends while it waits
    with pytest.raises(LeaderDiedError):
        dispatches.dispatch("b", jobs(2))
    assert joined[0].failed_message_ids == set()
    assert dispatches.starts.job_ids() == [(1,)]

    # And SQS delivers the leader's message again once its visibility timeout passed (past the lease)
    dispatches.world.clock.advance(LEASE_SECONDS + 1)
    dispatches.dispatch("b-again", jobs(2))

    # Then that delivery took the follow-up over and started every job in it, the joined ones too
    assert dispatches.starts.job_ids() == [(1,), (2, 3, 4)]


def test_demand_once_the_runs_burst_is_over_is_a_first_again(dispatches: Dispatches) -> None:
    # Given a matrix served by a first batch and a follow-up
    dispatches.dispatch("a", jobs(1))
    dispatches.dispatch("b", jobs(2))
    # When a later job of the run is queued once its burst is over (a job that `needs` the matrix)
    dispatches.world.clock.advance(BURST_QUIET_SECONDS)
    before = dispatches.world.clock.now()
    dispatches.dispatch("c", jobs(3))
    # Then it is dispatched at once, not held for a window
    assert dispatches.starts.job_ids() == [(1,), (2,), (3,)]
    assert dispatches.world.clock.now() == before


def test_demand_right_after_the_follow_up_started_opens_the_next_follow_up(dispatches: Dispatches) -> None:
    # Given a matrix served by a first batch and a follow-up
    dispatches.dispatch("a", jobs(1))
    dispatches.dispatch("b", jobs(2))
    # When more of its deliveries come a moment later, in two batches (GitHub spreads a large matrix's
    # deliveries over seconds)
    dispatches.meanwhile.append(lambda: dispatches.dispatch("d", jobs(5, 6)))
    dispatches.dispatch("c", jobs(3, 4))
    # Then they are one more follow-up, not a first and a follow-up
    assert dispatches.starts.job_ids() == [(1,), (2,), (3, 4, 5, 6)]


def test_a_window_nobody_joined_keeps_the_burst_going_for_the_next_demand(dispatches: Dispatches) -> None:
    # Given a run's first job, whose window closed with nobody joining it
    dispatches.dispatch("a", jobs(1))
    dispatches.world.clock.advance(2 * FOLLOW_UP_WINDOW_SECONDS)
    # When the next delivery of the matrix comes a moment after, then another while it leads
    dispatches.meanwhile.append(lambda: dispatches.dispatch("c", jobs(3)))
    dispatches.dispatch("b", jobs(2))
    # Then the two are one follow-up
    assert dispatches.starts.job_ids() == [(1,), (2, 3)]


def test_demand_that_meets_a_follow_up_whose_start_never_ends_is_started_apart_after_the_wait(
    dispatches: Dispatches,
) -> None:
    # Given a first batch, and a follow-up whose leader is starting it right now, and stays inside
    # that start (as a leader that died there would, with its lease far ahead; the follow-up state
    # machine did not start, so the leader gathers it itself)
    dispatches.starts.machine_down = True
    dispatches.dispatch("a", jobs(1))
    arrivals: list[DispatchReport] = []
    # (the first batch's start has passed: the next start is the follow-up's)
    dispatches.starts.during = lambda: arrivals.append(dispatches.dispatch("c", jobs(3)))
    # When a job arrives during that start: it cannot join a sealed follow-up
    dispatches.dispatch("b", jobs(2))
    # Then it waited SEALED_WAIT_SECONDS for that start to end, then got a provision of its own, and the
    # follow-up kept its own job
    assert sorted(dispatches.starts.job_ids()) == [(1,), (2,), (3,)]
    assert arrivals[0].failed_message_ids == set()
    assert dispatches.world.clock.now() - dispatches.started_at >= SEALED_WAIT_SECONDS


def test_demand_whose_ledger_fails_while_it_waits_for_a_follow_up_being_started_is_started_apart(
    dispatches: Dispatches, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a follow-up being started by its leader (its state machine did not start), and a job
    # arriving meanwhile that meets it sealed
    dispatches.starts.machine_down = True
    dispatches.dispatch("a", jobs(1))
    take_turn = DynamoDbLedger.take_turn
    turns: list[str] = []

    def failing_after_the_first_look(self: DynamoDbLedger, *args: Any, **kwargs: Any) -> BatchTurn:
        turns.append(kwargs["arrival"].holder)
        if turns.count("c") > 1:
            raise RuntimeError("ProvisionedThroughputExceededException")
        return take_turn(self, *args, **kwargs)

    monkeypatch.setattr(DynamoDbLedger, "take_turn", failing_after_the_first_look)
    arrivals: list[DispatchReport] = []
    dispatches.starts.during = lambda: arrivals.append(dispatches.dispatch("c", jobs(3)))
    # When its next look at the ledger fails
    dispatches.dispatch("b", jobs(2))
    # Then its job is still started, apart, and its message is done: the wait only ever delays a job
    assert sorted(dispatches.starts.job_ids()) == [(1,), (2,), (3,)]
    assert arrivals[0].failed_message_ids == set()
    assert turns.count("c") == 2


def test_batches_that_meet_a_follow_up_its_leader_is_starting_wait_for_it_then_make_the_next_together(
    dispatches: Dispatches,
) -> None:
    # Given a follow-up being started by its leader (the follow-up state machine did not start), and four
    # batches of the same run arriving meanwhile, each from a poller of its own (issue 15's burst: each
    # such batch used to get an execution of its own), on the real ledger and in real time
    world = dispatches.world
    clock = SystemClock()
    starts = TimedStarts(machine_down=True)
    waiting: set[str] = set()
    all_waiting = threading.Event()

    class Ledger(DynamoDbLedger):
        def take_turn(self, *args: Any, **kwargs: Any) -> BatchTurn:
            turn = super().take_turn(*args, **kwargs)
            if turn.role is BatchRole.WAITING:
                waiting.add(kwargs["arrival"].holder)
                if len(waiting) == len(waiters):
                    all_waiting.set()
            return turn

    def dispatch(holder: str, messages: list[DemandMessage]) -> DispatchReport:
        ledger = Ledger(IDEMPOTENCY_TABLE, clock, world.plane.client("dynamodb"))
        dispatcher = Dispatcher(
            demand_starts(ledger, starts, clock, time.sleep),
            window_seconds=MOTO_WINDOW_SECONDS,
            sealed_wait_seconds=MOTO_SEALED_WAIT_SECONDS,
        )
        return dispatcher.dispatch([(f"{holder}-m{n}", m) for n, m in enumerate(messages)], holder, 60)

    waiters = [
        threading.Thread(target=dispatch, args=(holder, jobs(job_id)))
        for holder, job_id in (("c", 3), ("d", 4), ("e", 5), ("f", 6))
    ]

    def arrive_meanwhile() -> None:
        for waiter in waiters:
            waiter.start()
        assert all_waiting.wait(timeout=30), f"only {sorted(waiting)} met the follow-up being started"

    dispatch("a", jobs(1))
    starts.during = arrive_meanwhile
    dispatch("b", jobs(2))
    for waiter in waiters:
        waiter.join(timeout=30)

    # Then the four batches waited for that start and cost one provision, not four: the burst goes on,
    # so they made the run key's next follow-up together
    assert sorted(job for request in starts.provisions for job in request.job_ids) == list(range(1, 7))
    later = [request.job_ids for request in starts.provisions[2:]]
    assert [sorted(job_ids) for job_ids in later] == [[3, 4, 5, 6]]


def test_demand_that_meets_a_follow_up_the_machine_is_starting_opens_the_next_follow_up_at_once(
    dispatches: Dispatches,
) -> None:
    # Given a first dispatch, and a follow-up led by "b" that its state machine has sealed
    clock = dispatches.world.clock
    dispatches.dispatch("a", jobs(1))
    arrived: list[float] = []

    def arrive() -> None:
        arrived.append(clock.now())
        dispatches.dispatch("c", jobs(3))

    # When demand of the run arrives while the machine starts that follow-up's provision
    dispatches.starts.during = arrive
    dispatches.dispatch("b", jobs(2))
    # Then it did not wait for that start (sealed and marked started in one write): it led the next
    # follow-up, handed to the machine the moment it arrived
    assert [request.holder for request in dispatches.starts.follow_ups] == ["b", "c"]
    assert dispatches.starts.handed_at[1] == arrived[0]
    assert dispatches.starts.job_ids() == [(1,), (3,), (2,)]


def test_a_run_that_completes_while_the_window_is_open_gets_no_follow_up(dispatches: Dispatches) -> None:
    # Given a first dispatch, and a follow-up that another batch joined
    dispatches.dispatch("a", jobs(1))
    completion = RunCompleted(repository=REPOSITORY, run_id=RUN_ID, run_attempt=1)
    dispatches.meanwhile += [
        lambda: dispatches.dispatch("c", jobs(3)),
        # When the run completes (cancelled) before the window closes
        lambda: dispatches.dispatch("d", [completion]),
    ]
    report = dispatches.dispatch("b", jobs(2))
    # Then the follow-up's jobs are stale: nothing more is provisioned for the finished run
    assert dispatches.starts.job_ids() == [(1,)]
    assert [gathered.stale for gathered in dispatches.starts.gathered] == [2]
    assert report.failed_message_ids == set()


def test_a_matrix_read_by_five_concurrent_pollers_costs_two_provisions_and_its_first_waits_for_none(
    dispatches: Dispatches,
) -> None:
    # Given the demand queue read as Lambda reads a standard queue: five pollers, batches of up to 10,
    # no window (services-sqs-scaling.html), each invocation a dispatcher of its own on the real ledger,
    # waiting in real time
    world = dispatches.world
    dynamodb = world.plane.client("dynamodb")
    clock = SystemClock()
    starts = TimedStarts()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        ledger = DynamoDbLedger(IDEMPOTENCY_TABLE, clock, dynamodb)
        batch = [(record["messageId"], from_body(record["body"])) for record in event["Records"]]
        both = demand_starts(ledger, starts, clock, time.sleep)
        dispatcher = Dispatcher(both, window_seconds=MOTO_WINDOW_SECONDS)
        steps = FollowUpSteps(both)
        starts.gather = lambda request: gather_in_line(steps, request, time.sleep)
        report = dispatcher.dispatch(batch, context.aws_request_id, 60)
        return {"batchItemFailures": [{"itemIdentifier": m} for m in report.failed_message_ids]}

    # When a matrix's 20 `queued` messages arrive a few milliseconds apart
    with QueueEventSource(handler, "dispatcher", sqs=world.sqs, queue_url=world.queue_url) as source:
        first_sent = time.time()
        for message in jobs(*range(1, 21)):
            world.sqs.send_message(QueueUrl=world.queue_url, MessageBody=to_body(message))
            time.sleep(0.02)  # the arrivals' spacing is the behaviour under test
        eventually(
            lambda: sum(request.count for request in starts.provisions) >= 20, "20 jobs provisioned", 30
        )

    # Then the five pollers split it into several batches, yet it cost two provisions at most
    assert source.concurrency == 5
    assert source.invocations >= 2
    assert sorted(job for request in starts.provisions for job in request.job_ids) == list(range(1, 21))
    assert len(starts.provisions) <= 2
    # And the first provision started within a fraction of the event source's old 1 s window
    assert starts.started_at[0] - first_sent < 1.0


# --- the run's queued jobs, as GitHub lists them -----------------------------------------------------------


def test_a_follow_up_takes_the_queued_jobs_github_lists_for_its_run_key_before_their_deliveries_come(
    dispatches: Dispatches,
) -> None:
    # Given a matrix whose six jobs GitHub lists as queued, beside a job of another label, one already
    # in progress, and a job whose delivery was a first (started at once)
    dispatches.github.queue(1, 2, 3, 4, 5, 6)
    dispatches.github.queue(7, label=f"pool={RUN_ID}/class=small")
    dispatches.github.queue(8, status="in_progress")
    dispatches.dispatch("a", jobs(1))
    # When job 2's delivery opens the follow-up, and the deliveries of jobs 3 to 6 have not come yet
    dispatches.dispatch("b", jobs(2))
    # Then the follow-up starts jobs 2 to 6 in one provision: GitHub was asked once, for the run attempt
    assert dispatches.starts.job_ids() == [(1,), (2, 3, 4, 5, 6)]
    assert dispatches.github.asked == [(REPOSITORY, RUN_ID, 1)]
    # And when their deliveries come, past the seal, they are repeats: no follow-up, no provision
    late = dispatches.dispatch("c", jobs(3, 4, 5, 6))
    assert (late.duplicates, late.joined, late.failed_message_ids) == (4, 0, set())
    assert late.follow_up_machines == []
    assert len(dispatches.starts.provisions) == 2
    assert len(dispatches.starts.follow_ups) == 1


def test_the_listed_jobs_of_a_public_repository_are_single_use_in_every_provision_of_the_follow_up(
    dispatches: Dispatches,
) -> None:
    # Given a public repository's 61-job matrix, GitHub listing all of them queued
    dispatches.github.queue(*range(1, 62))
    dispatches.dispatch("a", jobs(1, public=True))
    # When job 2's delivery opens the follow-up alone
    dispatches.dispatch("b", jobs(2, public=True))
    # Then the follow-up's 60 jobs go in two provisions, the one holding only listed jobs public too
    follow_up = dispatches.starts.provisions[1:]
    assert [(len(request.job_ids), request.public) for request in follow_up] == [
        (PROVISION_LIMIT, True),
        (10, True),
    ]


def test_a_follow_up_gathers_what_joined_it_when_github_cannot_be_asked(dispatches: Dispatches) -> None:
    # Given GitHub failing (a 502) when the follow-up asks for the run's jobs
    dispatches.github.queue(1, 2, 3)
    dispatches.github.down = True
    dispatches.dispatch("a", jobs(1))
    # When job 2 opens the follow-up
    report = dispatches.dispatch("b", jobs(2))
    # Then the follow-up starts what joined it, at once: GitHub's failure only loses the listed jobs
    assert dispatches.starts.job_ids() == [(1,), (2,)]
    assert report.failed_message_ids == set()
    # And job 3's delivery, once it comes, is the run's next follow-up, as without the list
    dispatches.dispatch("c", jobs(3))
    assert dispatches.starts.job_ids() == [(1,), (2,), (3,)]


def test_github_is_asked_by_the_gather_step_whose_window_closes_within_its_pause_not_before(
    dispatches: Dispatches,
) -> None:
    # Given a follow-up window of 5 s, longer than the gather step's pause (its machine waits in between)
    dispatches.window_seconds = 5.0
    dispatches.github.queue(1, 2, 3)
    clock = dispatches.world.clock
    asked_at: list[float] = []
    listed = dispatches.github.run_jobs

    def timed(repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
        asked_at.append(clock.now())
        return listed(repository, run_id, attempt)

    dispatches.github.run_jobs = timed  # type: ignore[method-assign]
    dispatches.dispatch("a", jobs(1))
    # When job 2 opens the follow-up
    led_at = clock.now()
    dispatches.dispatch("b", jobs(2))
    # Then GitHub was asked once, by the step that sealed (within its pause of the window's end), and
    # the follow-up took job 3 from the list
    assert len(asked_at) == 1
    assert asked_at[0] >= led_at + 5.0 - GATHER_PAUSE_SECONDS
    assert dispatches.starts.job_ids() == [(1,), (2, 3)]


def test_the_ledger_knows_which_jobs_are_counted_started_or_cancelled_not_reserved(
    dispatches: Dispatches,
) -> None:
    # Given 150 jobs started (more than one BatchGetItem's 100 keys), one cancelled, one reserved
    ledger = DynamoDbLedger(
        IDEMPOTENCY_TABLE, dispatches.world.clock, dispatches.world.plane.client("dynamodb")
    )
    until = dispatches.world.clock.now() + LEASE_SECONDS
    started = list(range(1, 151))
    for job_id in [*started, 300]:
        ledger.reserve(job_id, "a", until)
    ledger.confirm(started, "a", "provision-x")
    ledger.cancel(200)
    # When asked about them and a job never seen
    counted = ledger.counted([*started, 200, 300, 400])
    # Then the started and the cancelled are counted, the reserved and the unknown are not
    assert counted == frozenset([*started, 200])


def forget_states(world: IngressWorld) -> None:
    """Every follow-up item as the ledger wrote it before it stored states: no state attribute."""
    items = world.dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Items"]
    for item in items:
        if item["id"]["S"].startswith("batch#"):
            world.dynamodb.update_item(
                TableName=IDEMPOTENCY_TABLE,
                Key={"id": item["id"]},
                UpdateExpression="REMOVE #s",
                ExpressionAttributeNames={"#s": "state"},
            )


def test_a_follow_up_written_before_states_were_stored_is_joined_and_sealed_as_before(
    dispatches: Dispatches,
) -> None:
    # Given a first dispatch and a follow-up led by "b", whose item, like those of a stack running the
    # earlier ledger, has no state: before a batch joins it, and again before its leader seals it
    dispatches.dispatch("a", jobs(1))
    world = dispatches.world
    dispatches.meanwhile += [
        lambda: forget_states(world),
        lambda: dispatches.dispatch("c", jobs(3)),
        lambda: forget_states(world),
    ]
    # When "b" leads it
    leader = dispatches.dispatch("b", jobs(2))
    # Then the join and the seal read the state from the attributes, and the follow-up started once
    assert dispatches.starts.job_ids() == [(1,), (2, 3)]
    assert leader.failed_message_ids == set()
