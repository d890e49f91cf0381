"""What the stack hands every control-plane Lambda through its environment, validated at cold start.

One model for all of them: each function is given the variables it needs (the CDK constructs set
them), and a handler that reaches for one it was not given fails at once with the variable's name.
Variables are named `RUNNER_POOL_<FIELD>`; structured ones (the stack config, the launch templates) are JSON.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Arch

ENV_PREFIX = "RUNNER_POOL_"
STACK_TAG_KEY = "runner-pool:stack"
"""The tag every instance of the stack carries; refresh finds orphans by it."""


class MissingSettingError(LookupError):
    def __init__(self, field: str, purpose: str) -> None:
        super().__init__(f"{ENV_PREFIX}{field.upper()} is not set; this function needs it for {purpose}")


class ControlPlaneSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    table_name: str = Field(min_length=1)
    config: StackConfig = StackConfig()
    stack_name: str = "runner-pool"
    """The value of the stack tag (`runner-pool:stack`) on every instance this stack launches."""
    pool_queue_url_prefix: str | None = None
    """Every pool queue's URL up to its partition's name (domain/pool_partitions.py)."""
    notice_queue_url_prefix: str | None = None
    """Every instance's notice queue URL up to its instance id (domain/notices.py); unset, no step sends
    notices and agents find their claims by reading their records."""
    credentials_key_id: str | None = None
    """The KMS key that runner configs are encrypted with."""
    account_id: str | None = Field(None, pattern=r"^\d{12}$")
    """The stack's account, for instance ARNs (the state table's keys); asked of STS once when unset."""
    subnet_ids: tuple[str, ...] = ()
    launch_templates: dict[Arch, str] = Field(default_factory=dict)
    """Launch template id per architecture."""
    session_launch_templates: dict[Arch, str] = Field(default_factory=dict)
    """Launch template id per architecture for the classes with Session Manager (`resource_classes.<class>
    .ssm`), whose instance profile carries the SSM agent's permissions; empty when no class has it."""
    provision_state_machine_arn: str | None = None
    release_state_machine_arn: str | None = None
    follow_up_state_machine_arn: str | None = None
    demand_queue_url: str | None = None
    github_token_function_name: str | None = None
    """The token function (handlers/github_token.py), which alone reads the App's key; every function that
    calls GitHub asks it for tokens."""
    idempotency_table_name: str | None = None

    def require(self, field: str, purpose: str) -> str:
        value = getattr(self, field)
        if not value:
            raise MissingSettingError(field, purpose)
        return str(value)
