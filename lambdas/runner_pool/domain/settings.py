"""What every group of settings shares: frozen, no unknown setting, and a rule's breach told as setting,
problem and fix (config.py's load_config puts it in the operator's words)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SettingError(ValueError):
    """A rule across settings was broken; `setting` is relative to the model that checked it."""

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        super().__init__(f"{setting}: {problem}; fix: {fix}")
        self.setting = setting
        self.problem = problem
        self.fix = fix
