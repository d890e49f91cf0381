"""A class's instant tier: pristine instances whose runners wait registered with the class's generic label.

A job that asks for `pool=instant/class=<class>` (domain/labels.py `instant_label`) is given by GitHub to
a runner of the tier that is idle and listening, with no step of ours in between: GitHub "queues" a job on
"runners that have all the labels that you specify", compared without case (docs.github.com, Actions,
"Using self-hosted runners in a workflow" and "Using labels with self-hosted runners"), and a listening
runner that asks for work is handed the oldest such job. No run is bound to such a runner, so only an
instance nothing of an earlier job is on may wait so: a pristine one, which serves its one job and is
terminated (never pooled), whatever the job's level of trust.

The control plane follows: each `queued` job of the tier is one more runner asked for (whichever queued
job GitHub gives it is fine), counted once in the demand ledger and batched with the tier's other jobs of
a burst as a run's are (steps/dispatcher.py), each `completed` one releases its instance to termination,
and refresh tops the tier up to its size. The tier's runners then outnumber its size plus the jobs queued
for it only for a moment: a queued job asks for one runner, and the runner it is given (or another's,
which it then leaves waiting) is the one that job counts against; one asked for a job that was cancelled,
or taken by a runner asked for by another, leaves more waiting than the size, which refresh takes back
(`surplus_waiting`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import LabelError, instant_class, instant_label
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import Arch, InstanceRecord
from runner_pool.domain.runner_scope import OrganizationScope
from runner_pool.domain.runners import RegisteredRunner, RunnerStatus

DEFAULT_RUNNER_LABELS = ("self-hosted", "linux")
"""The labels GitHub gives every self-hosted runner besides its architecture's ("Using labels with
self-hosted runners", default labels; a JIT runner gets them too): a job may list them beside the tier's
label and still be given one of its runners."""


def instant_job(labels: Sequence[str], arch: Arch) -> str | None:
    """The class whose instant tier a job's `labels` ask for; None for a job that asks for none.

    LabelError for one that asks for a tier but lists a label the tier's runners never carry: GitHub
    would never give it one, so it is not counted as the tier's demand."""
    classes = [name for name in map(instant_class, labels) if name is not None]
    if not classes:
        return None
    label = instant_label(classes[0])
    if len(set(classes)) > 1:
        raise LabelError(label, "a job asks for one instant tier, this one for several")
    carried = {label, *DEFAULT_RUNNER_LABELS, arch.value}
    missing = sorted({other.lower() for other in labels} - carried)
    if missing:
        raise LabelError(
            label,
            f"the instant tier's runners carry only {', '.join(sorted(carried))}; this job also asks for "
            f"{', '.join(missing)}, which none of them has",
        )
    return classes[0]


def tier_holds(records: Iterable[InstanceRecord], resource_class: str, now: Epoch) -> int:
    """The instances that hold the tier's label now: waiting registered, registering, or on their job."""
    label = instant_label(resource_class)
    return sum(
        1
        for record in records
        if record.run_key == label
        and record.state is not InstanceState.TERMINATED
        and not record.threshold_passed(now)
    )


def surplus_waiting(
    records: Iterable[InstanceRecord], resource_class: str, size: int, now: Epoch
) -> list[str]:
    """The tier's waiting instances beyond its size, oldest hand-over first: running for its label with
    a runner that has not been seen taking a job (no repository noted, `StateTable.job_started`). A
    waiting runner GitHub had a job for would have been given it, so more of them than the tier's size
    are more than any queued job needs: a replacement asked for a job that was cancelled, or that another
    runner took. Those on a job are not counted: they end with it."""
    label = instant_label(resource_class)
    waiting = sorted(
        (
            record
            for record in records
            if record.run_key == label
            and record.state is InstanceState.RUNNING
            and record.repository is None
            and record.runner_id is not None
            and not record.threshold_passed(now)
        ),
        key=lambda record: record.updated_at,
    )
    return [record.instance_id for record in waiting[: max(0, len(waiting) - size)]]


def tier_shortfall(size: int, held: int) -> int:
    """How many runners refresh asks for to bring the tier to `size`. Those on a job count as held until
    their job completes: the `queued` that started the job asked for its own replacement already."""
    return max(0, size - held)


def waited_offline(record: InstanceRecord | None, runner: RegisteredRunner, now: Epoch) -> bool:
    """Whether a tier's runner GitHub lists offline had been listening on its instance: the record is
    running for the tier's label with this runner, which it goes to only once the agent said the runner
    was listening (`UD_REG_OK`). The runner died or lost GitHub while waiting (a busy one is online, one
    done with its job is gone from the list), so its instance is ended and the tier refilled. One still
    created or claimed for it may yet start its runner, and is left alone."""
    return (
        record is not None
        and record.state is InstanceState.RUNNING
        and record.run_key is not None
        and instant_class(record.run_key) is not None
        and record.run_key == runner.run_key
        and record.runner_id == runner.runner_id
        and runner.status is RunnerStatus.OFFLINE
        and not record.threshold_passed(now)
    )


@dataclass(frozen=True)
class TierGroupAccess:
    """Which repositories' jobs the organisation's tier runner group admits: every repository of the
    organisation (`repository_ids` None, visibility `all`), or exactly these (visibility `selected`)."""

    repository_ids: frozenset[int] | None

    @property
    def visibility(self) -> Literal["all", "selected"]:
        return "all" if self.repository_ids is None else "selected"


def tier_group_access(repository_selection: str, repository_ids: Iterable[int]) -> TierGroupAccess:
    """The tier group's access for an installation whose `repository_selection` is `all` (every repository
    of the organisation) or `selected` (`repository_ids` only). A tier runner waits for whichever job
    GitHub gives it, and we hear only of the jobs of the repositories the installation covers ("A webhook
    can only access events that are available in the ... GitHub App where it is installed",
    docs.github.com, "Types of webhooks"): a repository outside a selection could take a runner whose job
    we never follow. Any other answer is read as `selected`, so the group never admits more than the
    repositories listed."""
    if repository_selection == "all":
        return TierGroupAccess(None)
    return TierGroupAccess(frozenset(repository_ids))


def keeps_tier_group(config: StackConfig) -> bool:
    """Whether the stack keeps an organisation runner group for its instant tiers: an organisation's, any
    of whose classes keeps a tier at any hour (which the config lets register only in runner groups)."""
    return isinstance(config.github.scope, OrganizationScope) and any(
        minimum.keeps_instant() for minimum in config.warm_pool_minimum.values()
    )
