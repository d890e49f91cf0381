"""The follow-up batch of a run key: its states and transitions, and when its window closes.

A run key's first demand is dispatched at once; what arrives in the next moments joins ONE follow-up
batch. Lambda reads a standard queue with five concurrent pollers (and more under load), so the
`queued` deliveries of a matrix, sent a moment apart, reach the dispatcher as several batches at the
same time; a batching window per poller does not bring them together. The demand ledger does, with one
item per (repository, run key) whose state moves through TRANSITIONS, each one conditional write.

A dispatch's demand takes one of these roles (BatchRole), by the follow-up it finds:

    first      no follow-up of this run key is pending, and its last one started (or its window closed
               unjoined) BURST_QUIET_SECONDS ago or more: start its provision now, and open the
               follow-up window (FOLLOW_UP_WINDOW_SECONDS; each job that joins keeps it open longer, up to
               FOLLOW_UP_LIMIT_SECONDS after the first: follow_up_closes_at)
    joined     the window is open and another dispatch leads the follow-up: the jobs are added to it and
               the messages are done
    leader     the window is open and nobody leads the follow-up yet, or the run key's last follow-up
               started (or its window closed) less than BURST_QUIET_SECONDS ago, so the same burst goes on
               and these jobs open the next follow-up: the jobs are added, and this dispatch starts the
               follow-up state machine, which gathers it: waits for the window to close, seals the
               follow-up (no job joins after) and starts one provision for every job in it. Should that
               start fail, this dispatch gathers it itself, waiting in its own Lambda.
    taken over the follow-up's leader died before starting it (its lease passed): this dispatch adds its
               jobs, seals it and starts it at once
    waiting    the follow-up is sealed and being started right now: wait for that start to end (looking
               again every SEALED_LOOK_SECONDS), then take a turn again; after SEALED_WAIT_SECONDS (its
               leader died while starting it) start these jobs apart

So a matrix whose jobs arrive within the window costs two provisions however the pollers split it (and
one follow-up execution, which gathers the second), and a run's demand that keeps coming past the window
costs one more follow-up each time a window closes. A job queued later, once the run's burst is over
(one that `needs` the matrix), is a first again, started at once.

Past the window, GitHub's own list keeps a run's burst together: the gather step that seals a follow-up
first asks GitHub for the run attempt's jobs (while the window is still open) and takes every job queued
for the follow-up's run key that no dispatch counted yet. GitHub creates a matrix's jobs from one job
definition ("A matrix strategy lets you use variables in a single job definition to automatically create
multiple job runs", docs.github.com, "Running variations of jobs in a workflow"), but in a burst delivers
their `queued` events over seconds; a delivery that comes after the seal finds its job counted and is a
repeat. A job the list does not hold yet joins the window as before, or opens the next follow-up.

The leader does not wait for the window in its Lambda: the demand queue's only readers are Lambda's
pollers, and a leader waiting there holds one. The follow-up state machine waits in Wait states instead,
which hold no poller and no Lambda, so a window can stay open as long as a large matrix's deliveries keep
coming (FOLLOW_UP_LIMIT_SECONDS).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from runner_pool.domain.clock import Epoch

FOLLOW_UP_WINDOW_SECONDS = 0.3
"""How long a run key's follow-up stays open after its first dispatch, and after each job that joins
it. GitHub sends a matrix's `queued` deliveries side by side, each its own POST (no order is promised
between them), and the webhook turns each into one SQS message within tens of milliseconds, so they
reach the dispatchers a moment apart: a run's first job is dispatched at once, the rest in one provision
once 0.3 s pass with no more. Every job after a run's first waits this out; deliveries spread wider only
cost more executions, one per quiet gap, never a job."""
FOLLOW_UP_PACE_FACTOR = 4.0
"""How many of its run's mean gaps between the dispatches that joined a follow-up it stays open after the
last, when that is longer than FOLLOW_UP_WINDOW_SECONDS: a run whose deliveries come at a slower pace (a
large matrix, a loaded receiver) is not cut into an execution at every gap a little longer than 0.3 s.
Gaps between arrivals that come independently are about exponential: a window of twice the mean gap
closes at one gap in seven, of four times the mean at one in fifty. Dispatches, not jobs: pollers take
the demand queue in batches, so the jobs come in clumps, and the gaps that close a window are those
between clumps."""
FOLLOW_UP_PACE_CAP_SECONDS = 3.0
"""The longest quiet gap the pace keeps a follow-up open for. The follow-up state machine waits in Wait
states, which hold no poller, so the cap is only what a run's jobs may wait for a straggler."""
FOLLOW_UP_AGE_FACTOR = 0.5
"""How much of the time a follow-up has been open it waits, at least, for its next job after the last (at
most FOLLOW_UP_PACE_CAP_SECONDS). Jobs that come in clumps make a mean gap far shorter than the stall
between two clumps; a follow-up seconds old has kept its jobs waiting that long already, and a matrix's,
joined within a tenth of a second, is not held by this."""
FOLLOW_UP_LIMIT_SECONDS = 20.0
"""The longest a follow-up stays open after the first dispatch, however its demand keeps coming: long
enough for a large run's deliveries in a burst, short beside the minutes GitHub's rate limit takes to
register that many runners. A small matrix's window closes on its first quiet gap, long before."""
GATHER_PAUSE_SECONDS = 1.0
"""The longest the follow-up state machine's gather step waits in its Lambda for the window to close;
longer waits are its Wait state's, in whole seconds: a Wait state's Seconds (or SecondsPath's value) is
an integer number of seconds (AWS Step Functions Developer Guide, "Wait workflow state"), and moto's
executor truncates a wait to whole seconds too (moto/stepfunctions/parser/.../wait_function)."""
BURST_QUIET_SECONDS = 5.0
"""How long after a run key's follow-up started (or its window closed with nobody joining) its next
demand is still the same burst, and joins a follow-up instead of starting at once. GitHub delivers a
large matrix's `queued` events over seconds, and a delivery that failed comes again later; a job that
`needs` others is queued only once they completed, long after."""
SEALED_WAIT_SECONDS = 2.0
"""How long demand that finds its run key's follow-up being started waits for that start to end. The
start is one conditional write per job (at most PROVISION_LIMIT), a StartExecution and two writes: a few
hundred milliseconds on AWS. A leader that died while starting keeps its lease much longer, so past this
the waiting jobs are started apart rather than held for it."""
SEALED_LOOK_SECONDS = 0.1
"""How often waiting demand looks whether the follow-up has started (one conditional write a look)."""
SEAL_ATTEMPTS = 100
"""A leader looks again each time a join moved the window; the limit ends that long before this."""


class FollowUpState(StrEnum):
    """Where a run key's follow-up batch is, as its ledger item stores it."""

    OPEN = "open"
    """A first dispatch started its jobs and opened the window; nobody has joined (so nobody leads)."""
    LED = "led"
    """Jobs joined; the leader seals it once the window closes, and more jobs may join until then."""
    SEALED = "sealed"
    """Closed to further jobs; its leader is starting its provisions."""
    STARTED = "started"
    """Its provisions started: the run key's next demand opens the next follow-up, or is a first."""


class FollowUpTransition(StrEnum):
    """A move of a run key's follow-up batch; each is one conditional write of the ledger."""

    OPEN = "open"
    """A first: no follow-up is pending and the run key's last burst is quiet."""
    LEAD_NEXT = "lead-next"
    """The burst goes on after a follow-up started (or a window closed unjoined): these jobs open the
    next follow-up, which this dispatch leads."""
    JOIN = "join"
    """Jobs added while the window is open (the first to join leads)."""
    TAKE_OVER = "take-over"
    """The leader's lease passed before it started the follow-up: another dispatch seals it and starts it."""
    SEAL = "seal"
    """The leader closes the follow-up to further jobs once its window closed, to start it itself."""
    SEAL_STARTED = "seal-started"
    """The follow-up machine's gather step seals it and marks it started in one write."""
    MARK_STARTED = "mark-started"
    """The leader (or whoever took it over) started every provision of the sealed follow-up."""


@dataclass(frozen=True)
class Move:
    """Where a transition may start from (None: no item yet) and where it leads."""

    sources: frozenset[FollowUpState | None]
    target: FollowUpState


TRANSITIONS: Mapping[FollowUpTransition, Move] = {
    FollowUpTransition.OPEN: Move(
        frozenset({None, FollowUpState.OPEN, FollowUpState.STARTED}), FollowUpState.OPEN
    ),
    FollowUpTransition.LEAD_NEXT: Move(
        frozenset({FollowUpState.OPEN, FollowUpState.STARTED}), FollowUpState.LED
    ),
    FollowUpTransition.JOIN: Move(frozenset({FollowUpState.OPEN, FollowUpState.LED}), FollowUpState.LED),
    FollowUpTransition.TAKE_OVER: Move(
        frozenset({FollowUpState.LED, FollowUpState.SEALED}), FollowUpState.SEALED
    ),
    FollowUpTransition.SEAL: Move(frozenset({FollowUpState.LED}), FollowUpState.SEALED),
    FollowUpTransition.SEAL_STARTED: Move(frozenset({FollowUpState.LED}), FollowUpState.STARTED),
    FollowUpTransition.MARK_STARTED: Move(frozenset({FollowUpState.SEALED}), FollowUpState.STARTED),
}
"""Every move of a follow-up batch. A sealed follow-up never reopens: nothing leads from SEALED or STARTED
back to a state that takes jobs, except LEAD_NEXT and OPEN, which begin the next follow-up."""

TAKES_JOBS = frozenset({FollowUpState.OPEN, FollowUpState.LED})
"""States in which a follow-up's jobs may still grow."""


def next_move(
    state: FollowUpState, *, now: Epoch, closes_at: Epoch, lease_until: Epoch | None
) -> FollowUpTransition | None:
    """What demand of the same burst does with the follow-up it found in `state` (OPEN having failed):
    open the next one (its window is over), take it over (its leader died), join it, or nothing yet
    (None: it is being started right now, wait for that)."""
    lease_passed = lease_until is not None and lease_until < now
    if state is FollowUpState.STARTED or (state is FollowUpState.OPEN and closes_at < now):
        return FollowUpTransition.LEAD_NEXT
    if state in {FollowUpState.LED, FollowUpState.SEALED} and lease_passed:
        return FollowUpTransition.TAKE_OVER
    if state is FollowUpState.SEALED:
        return None
    return FollowUpTransition.JOIN


class BatchRole(StrEnum):
    """What one dispatch does with a run key's demand (see the module's docstring)."""

    FIRST = "first"
    JOINED = "joined"
    LEADER = "leader"
    TAKEN_OVER = "taken-over"
    WAITING = "waiting"


@dataclass(frozen=True)
class WindowSpan:
    """The follow-up window's lengths: each arrival keeps it open `window_seconds` more (or longer,
    `follow_up_closes_at`), up to `limit_seconds` after it opened; demand of a run key whose last burst
    ended `quiet_seconds` ago or more is a first."""

    window_seconds: float = FOLLOW_UP_WINDOW_SECONDS
    limit_seconds: float = FOLLOW_UP_LIMIT_SECONDS
    quiet_seconds: float = BURST_QUIET_SECONDS


@dataclass(frozen=True)
class Arrival:
    """The jobs one dispatch adds to a run key's follow-up, and, should it lead the follow-up, its
    `holder` and how long its lead lasts (`lease_until`)."""

    job_ids: Sequence[int]
    public_ids: Sequence[int]
    holder: str
    lease_until: Epoch


@dataclass(frozen=True)
class FollowUp:
    """The jobs of a sealed follow-up batch, and which of them are a public repository's."""

    job_ids: frozenset[int]
    public_ids: frozenset[int] = frozenset()

    def with_jobs(self, job_ids: Collection[int]) -> FollowUp:
        """This follow-up with `job_ids` added; they are a public repository's when its jobs are (a
        follow-up's jobs are all one repository's)."""
        added = frozenset(job_ids) - self.job_ids
        return FollowUp(self.job_ids | added, self.public_ids | (added if self.public_ids else frozenset()))


@dataclass(frozen=True)
class BatchTurn:
    role: BatchRole
    closes_at: Epoch = 0.0
    """When the follow-up window closes, unless another job joins (FIRST, LEADER, JOINED)."""
    follow_up: FollowUp | None = None
    """TAKEN_OVER: every job of the follow-up, this dispatch's too."""


@dataclass(frozen=True)
class Sealing:
    """What sealing a follow-up found: sealed (its jobs), still open (a job joined since: try again at
    `closes_at`), or neither (another dispatch took it over)."""

    follow_up: FollowUp | None = None
    closes_at: Epoch | None = None


def follow_up_closes_at(
    now: Epoch,
    *,
    closes_at: Epoch,
    limit_at: Epoch,
    joined_at: Epoch | None,
    joined: int,
    window_seconds: float,
    opened_at: Epoch | None = None,
) -> Epoch:
    """When a follow-up closes once another dispatch joins it at `now`: after a quiet gap of
    `window_seconds`, or of FOLLOW_UP_PACE_FACTOR times the mean gap between the `joined` dispatches that
    joined it since its first join (`joined_at`), or of FOLLOW_UP_AGE_FACTOR times how long it has been
    open (since `opened_at`), whichever is longest (the last two up to FOLLOW_UP_PACE_CAP_SECONDS);
    never sooner than it was to close (`closes_at`), never past its limit."""
    gap = window_seconds
    if joined > 0 and joined_at is not None:
        paced = FOLLOW_UP_PACE_FACTOR * max(0.0, now - joined_at) / joined
        gap = max(gap, min(paced, FOLLOW_UP_PACE_CAP_SECONDS))
    if opened_at is not None:
        gap = max(gap, min(FOLLOW_UP_AGE_FACTOR * max(0.0, now - opened_at), FOLLOW_UP_PACE_CAP_SECONDS))
    return min(max(closes_at, now + gap), limit_at)


def next_follow_up_closes_at(
    now: Epoch, *, last_closed_at: Epoch, limit_at: Epoch, window_seconds: float
) -> Epoch:
    """When a run's next follow-up closes unless more jobs join, opened at `now` by demand of a burst that
    goes on after its last follow-up closed at `last_closed_at`: that demand came after the run's previous
    job by at least the quiet gap that closed the window (`window_seconds`) plus the time since it closed,
    a sample of the run's pace, so the new window is paced by it from the start (follow_up_closes_at, as
    one join) instead of closing at the next gap longer than the bare window."""
    return follow_up_closes_at(
        now,
        closes_at=now + window_seconds,
        limit_at=limit_at,
        joined_at=last_closed_at - window_seconds,
        joined=1,
        window_seconds=window_seconds,
    )
