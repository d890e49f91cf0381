"""The collaborators the provision machine's parts share: `Provision` builds them once, and its claim
workers, its creation and its leftovers each take the one set instead of a list of their own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import ExecutionStarter
from runner_pool.domain.pickup import PickupManager, PoolQueue
from runner_pool.domain.ports import ProvisionFleet, ProvisionRecords
from runner_pool.domain.registration_budget import RegistrationBudget
from runner_pool.steps.class_history import HistoryNotes
from runner_pool.steps.hand_over import HandOver
from runner_pool.steps.held_instances import HeldInstances
from runner_pool.steps.notices import NoticeSource


@dataclass(frozen=True)
class ProvisionParts:
    """Every adapter but the table is reached through a factory, built on first use: a step's Lambda
    creates only the clients that step calls."""

    table: ProvisionRecords
    clock: Clock
    config: StackConfig
    pickup: Callable[[], PickupManager]
    queues: Callable[[], PoolQueue]
    fleet: Callable[[], ProvisionFleet]
    budget: Callable[[], RegistrationBudget]
    executions: Callable[[str | None], ExecutionStarter]
    """`executions(machine)` starts executions on `machine` (a step's own state machine), else on the
    configured one."""
    handing: HandOver
    held: HeldInstances
    notices: NoticeSource
    pause: Callable[[float], None]
    """How a step waits briefly in-line."""
    time_left: Callable[[], float]
    """The seconds the step's Lambda has left."""
    history: HistoryNotes | None
    """Notes boot times for adaptive sizing (None: none is)."""


class ProvisionPart:
    """A part of the provision machine's steps, over the shared collaborators under their one set of names."""

    def __init__(self, parts: ProvisionParts) -> None:
        self._table = parts.table
        self._clock = parts.clock
        self._config = parts.config
        self._timeouts = parts.config.timeouts
        self._pickup = parts.pickup
        self._queues = parts.queues
        self._fleet = parts.fleet
        self._budget = parts.budget
        self._executions = parts.executions
        self._handing = parts.handing
        self._held = parts.held
        self._notices = parts.notices
        self._pause = parts.pause
        self._time_left = parts.time_left
        self._history = parts.history
