"""The refresh Lambda, on an EventBridge schedule: one run of steps.refresh, its report as metrics.

Its timeout should be shorter than the schedule's period, so that runs of two schedule slots never
overlap (runs of one slot may: see steps.refresh).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict

from runner_pool.domain.refresh import RefreshReport, refresh_tick
from runner_pool.environment import STACK_TAG_KEY
from runner_pool.observability import logger, metrics, tracer
from runner_pool.steps.capacity_waits import CapacityWaitSteps
from runner_pool.steps.refresh import Refresh
from runner_pool.wiring import ControlPlane, control_plane


class ScheduledEvent(BaseModel):
    """EventBridge's scheduled event; `time` is the schedule slot, the same for a retried invocation."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    time: datetime | None = None


class RefreshIncompleteError(RuntimeError):
    """Some jobs failed (and were logged); raised after the rest ran, so the function's errors show it."""


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def refresh(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    plane = control_plane()
    scheduled = ScheduledEvent.model_validate(event)
    at = plane.clock.now() if scheduled.time is None else scheduled.time.timestamp()
    report = refresh_of(plane).run(
        refresh_tick(at, plane.config), time_left=lambda: context.get_remaining_time_in_millis() / 1000
    )
    _measure(report)
    logger.info("refresh done", **report.as_json())
    if report.failed:
        raise RefreshIncompleteError(f"refresh jobs failed: {', '.join(report.failed)}")
    return report.as_json()


def refresh_of(plane: ControlPlane) -> Refresh:
    """The stack's refresh over the process's adapters; GitHub is reached only by the jobs that need it.
    Replacing dead runners and reconciling queued jobs start executions: only where the stack names both
    state machines."""
    settings = plane.settings
    starts = bool(settings.provision_state_machine_arn and settings.release_state_machine_arn)
    return Refresh(
        plane.state_table,
        plane.fleet,
        plane.pool_queues,
        lambda: plane.github,
        clock=plane.clock,
        config=plane.config,
        stack_tag=(STACK_TAG_KEY, settings.stack_name),
        recent_demand=plane.recent_demand if starts else None,
        executions=plane.executions if starts else None,
        notices=lambda: plane.notices,
        pickup=lambda: plane.pickup,
        budget=lambda: plane.registration_budget,
        capacity_waits=CapacityWaitSteps(
            lambda: plane.capacity_waits, clock=plane.clock, check_runs=lambda: plane.github
        ),
        history=plane.class_history,
        spend=plane.spend,
    )


def _measure(report: RefreshReport) -> None:
    counts = {
        "InstancesVanished": report.vanished,
        **{f"Terminated.{state}": count for state, count in report.terminated.items()},
        "TerminatedAlreadyGone": report.already_gone,
        "OrphansTerminated": report.orphans_terminated,
        "UnreadableRecords": report.unreadable,
        "PoolAdmitted": report.admitted,
        "PoolUnready": report.unready,
        **{f"PoolLaunched.{name}": count for name, count in report.launched.items()},
        **{f"PoolIdle.{name}": count for name, count in report.idle.items()},
        **{f"PoolMinimum.{name}": count for name, count in report.minimum.items()},
        **{f"PoolStoppedMinimum.{name}": count for name, count in report.stopped_minimum.items()},
        **{f"PoolIdlePristine.{name}": count for name, count in report.idle_pristine.items()},
        **{f"PoolPristineMinimum.{name}": count for name, count in report.pristine_minimum.items()},
        **{f"PoolLaunchedForStopped.{name}": count for name, count in report.launched_for_stopped.items()},
        **{f"PoolTrimmed.{name}": count for name, count in report.trimmed.items()},
        "RunnersDeleted": report.runners_deleted,
        "WebhooksRedelivered": report.redelivered,
        "RunnersReplaced": report.runners_replaced,
        "RunsReconciled": report.runs_reconciled,
        "JobsReprovisioned": report.jobs_reprovisioned,
        "NoticeQueuesClosed": report.notice_queues_closed,
        "NoticeQueuesOpened": report.notice_queues_opened,
        "PoolMessagesDropped": report.pool_messages_dropped,
        "RunsUnservedRefused": report.runs_refused,
        "RefreshJobsFailed": len(report.failed),
        "RefreshJobsDeferred": len(report.deferred),
        "RefreshJobsCutShort": len(report.cut_short),
    }
    if report.github_hourly_remaining is not None:
        counts["GitHubHourlyRemaining"] = report.github_hourly_remaining
    counts["GitHubHourShortJobs"] = len(report.hour_short)
    for name, count in counts.items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=count)
