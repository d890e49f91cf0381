"""The log group of job logs: each instance's agent ships its own lines and the runner's diagnostic logs
here, one pair of streams per instance (domain/job_logs.py), and `runner-pool logs <job URL>` reads a
hand-over's lines back.

Its retention is `logs.retention_days` (one of the values CloudWatch Logs accepts, checked by the config);
like the functions' and state machines' log groups it goes with the stack (`cdk destroy`), unlike the
state table, which is the only account of which instances exist. Ingestion is billed per GB (README,
"What a job costs and how long it waits").
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs
from constructs import Construct

from runner_pool.domain.config import StackConfig


class JobLogs(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig) -> None:
        super().__init__(scope, construct_id)
        # The L1 resource: its RetentionInDays is the setting's number itself (CDK's RetentionDays names
        # the same values as an enum).
        self.log_group = logs.CfnLogGroup(self, "LogGroup", retention_in_days=config.logs.retention_days)
        self.log_group.apply_removal_policy(RemovalPolicy.DESTROY)

    @property
    def name(self) -> str:
        return self.log_group.ref

    @property
    def arn(self) -> str:
        """`arn:…:log-group:<name>:*`, the form IAM policies give a log group's streams (CloudWatch Logs
        User Guide, "Overview of managing access permissions to your CloudWatch Logs resources")."""
        return self.log_group.attr_arn
