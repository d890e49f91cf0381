"""A JIT runner config as the hand-off stores it for one instance (DESIGN.md 5), and how reading it fails:
the shapes the control plane's adapter (adapters/runner_credentials.py) and the agent share."""

from __future__ import annotations

from dataclasses import dataclass, field


class CredentialsUnreadableError(RuntimeError):
    """A config is stored for the run but cannot be decrypted here: another instance's, or the key refuses."""


@dataclass(frozen=True)
class RunnerConfig:
    """A decrypted JIT runner config, with the id that tells one handed-over config from another."""

    config_id: str
    run_key: str
    jit_config: str = field(repr=False)
    runner_id: int | None = None
    """The GitHub runner the config registers, as the control plane noted it on the instance's record."""
    stored_at: float | None = None
    """When the control plane stored it: the agent reports how long the config waited to be heard."""


@dataclass(frozen=True)
class StoredConfig:
    """A runner config as stored, not yet decrypted: what tells its hand-off, and its ciphertext."""

    config_id: str
    run_key: str
    runner_id: int | None
    stored_at: float | None
    ciphertexts: tuple[bytes, ...] = field(repr=False)
