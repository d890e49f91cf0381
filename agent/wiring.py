"""Assembles the agent from settings, identity and AWS clients, for `python -m agent` and the bench."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.docker import Docker
from agent.imds import InstanceIdentity
from agent.log import EventLog
from agent.log_shipping import LogShipper
from agent.loop import Agent
from agent.memory import MemoryFile
from agent.notices import NoticeListener
from agent.scrub import build_scrub
from agent.settings import AgentSettings
from agent.termination import SelfTermination, power_off
from runner_pool.adapters.job_logs import JobLogStreams
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain import notices
from runner_pool.domain.clock import Clock, SystemClock
from runner_pool.domain.timeouts import Timeouts


def build_agent(
    settings: AgentSettings,
    identity: InstanceIdentity,
    *,
    dynamodb: Any,
    kms: Any,
    ec2: Any,
    log: EventLog,
    sqs: Any = None,
    logs: Any = None,
    clock: Clock | None = None,
    poweroff: Callable[[], None] = power_off,
    docker: Callable[[], Docker | None] | None = None,
) -> Agent:
    """Without `sqs` (or a notice queue prefix in the settings), the agent hears of changes only by
    reading its record every watch period; without `logs` (or a log group in the settings), its lines and
    the runner's stay on the instance."""
    clock = clock or SystemClock()
    # Of the timeouts, the agent's writes use only the retention (the TTL of its items).
    timeouts = Timeouts(terminated_retention_days=settings.retention_days)
    log = log.bind(instance_id=identity.instance_id)
    shipper = None
    if logs is not None and settings.log_group_name:
        shipper = LogShipper(
            JobLogStreams(settings.log_group_name, logs),
            identity.instance_id,
            log,
            period_seconds=settings.log_ship_period_seconds,
        )
        log = log.shipping_to(shipper.agent_line)
    return Agent(
        identity=identity,
        settings=settings,
        # Keyed by this instance's own ARN, from the metadata service: no STS call, and the very
        # key the instance role's LeadingKeys condition allows.
        records=StateTable(settings.table_name, timeouts, clock, dynamodb, arns=identity.arns),
        credentials=RunnerCredentials(
            settings.table_name,
            timeouts,
            clock,
            key_id=settings.credentials_key_id,
            dynamodb=dynamodb,
            kms=kms,
        ),
        termination=SelfTermination(identity.instance_id, ec2, log, poweroff),
        scrub=build_scrub(settings, docker),
        memory=MemoryFile(settings.state_file),
        clock=clock,
        log=log,
        notices=_notices(settings, identity, sqs, log),
        shipper=shipper,
    )


def _notices(
    settings: AgentSettings, identity: InstanceIdentity, sqs: Any, log: EventLog
) -> NoticeListener | None:
    if sqs is None or not settings.notice_queue_url_prefix:
        return None
    return NoticeListener(
        sqs,
        notices.queue_name(settings.notice_queue_url_prefix, identity.instance_id),
        wait_seconds=settings.notice_wait_seconds,
        retry_seconds=settings.watch_period_seconds,
        log=log,
    )
