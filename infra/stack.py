"""The runner-pool stack: composes one construct per concern and nothing else."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from infra.constructs import PoolQueues, StateTable
from runner_pool.domain.config import StackConfig


class RunnerPoolStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig, **kwargs: Any) -> None:
        super().__init__(
            scope,
            construct_id,
            description="runner-pool: a warm pool of self-hosted EC2 runners for GitHub Actions",
            **kwargs,
        )
        self.state_table = StateTable(self, "StateTable")
        self.pool_queues = PoolQueues(self, "PoolQueues", config=config)
