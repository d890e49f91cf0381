"""The lifecycle's waits (DESIGN.md section 9's `timeouts`), each in seconds, checked against each other."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from runner_pool.domain.settings import SettingError, Settings

FINISH_MARGIN_SECONDS = 30
"""What a provision needs after its waits: the Map's last hand-offs and Finish's own Lambda."""


class Timeouts(Settings):
    """How long each wait of the lifecycle lasts, in seconds."""

    heartbeat_period_seconds: float = Field(30, gt=0)
    """The agent's heartbeat; with notices (domain/notices.py) no claim waits on it: slow and cheap."""
    healthy_window_seconds: float = Field(90, gt=0)
    claim_registration_seconds: float = Field(30, gt=0)
    """How long a claim waits for the agent's runner to listen: more than the agent's watch period (15 s),
    so a claim whose notice was lost is still served by the agent's next look at its record."""
    fleet_validation_seconds: float = Field(180, gt=0)
    fleet_validation_poll_seconds: float = Field(5, gt=0)
    release_receipt_seconds: float = Field(120, gt=0)
    release_receipt_poll_seconds: float = Field(2, gt=0)
    """How often a release looks for the agent's receipt; the agent hears of its release at once (a
    notice) and cleans up in a second or two."""
    created_threshold_seconds: float = Field(600, gt=0)
    claimed_threshold_seconds: float = Field(300, gt=0)
    idle_seconds: float = Field(600, gt=0)
    stopping_seconds: float = Field(600, gt=0)
    """How long an instance chosen for the stopped tier may take to stop before refresh terminates it
    instead. EC2 stops an instance by an OS shutdown: "When you stop an instance, we shut it down", and
    "we attempt to shut it down forcibly after a short while" (EC2 API Reference, StopInstances)."""
    start_registration_seconds: float = Field(180, gt=0)
    """How long a stopped instance, claimed and started, has to register its runner: EC2's pending, the
    OS's boot and the agent's start, where a hot claim's `claim_registration_seconds` has none of these."""
    terminated_retention_days: int = Field(7, gt=0)

    @model_validator(mode="after")
    def _waits_fit_together(self) -> Self:
        if self.healthy_window_seconds <= self.heartbeat_period_seconds:
            raise SettingError(
                "healthy_window_seconds",
                f"{self.healthy_window_seconds:g} s is not longer than heartbeat_period_seconds "
                f"({self.heartbeat_period_seconds:g} s), so every instance would look dead",
                "make it at least 3 x heartbeat_period_seconds",
            )
        if self.fleet_validation_poll_seconds >= self.fleet_validation_seconds:
            raise SettingError(
                "fleet_validation_poll_seconds",
                "polls no more often than the validation timeout, so validation would check at most once",
                "make it a fraction of fleet_validation_seconds",
            )
        # A warm instance claimed for a batch stays claimed until Finish, which runs once the batch's
        # cold part has passed fleet validation; a created one likewise. Their thresholds must outlast
        # both waits and Finish's own work, or a live runner is expired under its job.
        provision = self.claim_registration_seconds + self.fleet_validation_seconds + FINISH_MARGIN_SECONDS
        for setting in ("claimed_threshold_seconds", "created_threshold_seconds"):
            if getattr(self, setting) < provision:
                raise SettingError(
                    setting,
                    f"{getattr(self, setting):g} s is shorter than a provision can take: "
                    f"claim_registration_seconds + fleet_validation_seconds + {FINISH_MARGIN_SECONDS} s "
                    f"for Finish = {provision:g} s, "
                    "so an instance would expire before Finish sets it running",
                    f"make it at least {provision:g} s, or shorten those waits",
                )
        if self.idle_seconds <= self.release_receipt_seconds:
            raise SettingError(
                "idle_seconds",
                f"{self.idle_seconds:g} s is not longer than release_receipt_seconds "
                f"({self.release_receipt_seconds:g} s), so a released instance's idle time would run out "
                "while its release still waits for the agent's receipt",
                "make it longer than release_receipt_seconds",
            )
        return self
