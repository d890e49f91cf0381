"""The `logs` section of the stack config: how long the stack's log group keeps the instances' lines
(domain/job_logs.py)."""

from __future__ import annotations

from pydantic import Field, field_validator

from runner_pool.domain.settings import SettingError, Settings

RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653
)  # fmt: skip
"""The retentions CloudWatch Logs accepts (API Reference, PutRetentionPolicy, `retentionInDays`: "Valid
values are: 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
3288, and 3653"); CloudFormation's AWS::Logs::LogGroup RetentionInDays takes the same."""


class LogsSettings(Settings):
    """The stack's log group of the instances' agent and runner logs."""

    retention_days: int = Field(30)
    """How long CloudWatch Logs keeps a job's lines; one of the values it accepts."""

    @field_validator("retention_days")
    @classmethod
    def _accepted(cls, days: int) -> int:
        if days not in RETENTION_DAYS:
            nearest = min(RETENTION_DAYS, key=lambda accepted: abs(accepted - days))
            raise SettingError(
                "",
                f"{days} days is not a retention CloudWatch Logs accepts",
                f"use one of {', '.join(map(str, RETENTION_DAYS))} (the nearest: {nearest})",
            )
        return days
