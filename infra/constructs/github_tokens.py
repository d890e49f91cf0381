"""The token function: the one Lambda whose role may read the GitHub App's private key."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.constructs.functions import ControlPlaneFunctions
from runner_pool.adapters.github_token_function import TOKEN_FUNCTION_TIMEOUT_SECONDS


class GitHubTokens(Construct):
    """`function` mints installation tokens narrowed to the permissions asked (and answers the App's own
    failed deliveries); every other function is granted only to invoke it (permissions.act_as_github_app)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: ControlPlaneFunctions,
        github_app_keys: Sequence[secretsmanager.ISecret],
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = functions.function(
            self,
            "github_token.github_token",
            description="the only reader of the GitHub App's key: mints narrowed installation tokens",
            timeout=Duration.seconds(TOKEN_FUNCTION_TIMEOUT_SECONDS),
            memory_mib=256,
        )
        for github_app_key in github_app_keys:  # one per App the stack acts as
            github_app_key.grant_read(self.function)
