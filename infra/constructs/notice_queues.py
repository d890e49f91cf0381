"""The instances' notice queues (runner_pool.domain.notices): not resources of the stack, since the
control plane opens one per instance at run time, but names the stack fixes and grants scope.

`url_prefix` is what the functions and the agents are told; `arns` what their grants name. Each grant
is in permissions.py (the control plane's) or instances.py (the instance role's own queue only).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from constructs import Construct

from infra.constructs.pool_queues import queue_url_prefix
from runner_pool.domain import notices
from runner_pool.domain.config import ConfigError


class NoticeQueueNames:
    def __init__(self, scope: Construct) -> None:
        stack = Stack.of(scope)
        problem = notices.name_too_long(stack.stack_name)
        if problem is not None:
            raise ConfigError([problem])
        name_prefix = notices.queue_name_prefix(stack.stack_name)
        self.url_prefix: str = queue_url_prefix(name_prefix)
        self.arns: str = stack.format_arn(
            service="sqs", resource=f"{name_prefix}*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )
        """Every notice queue of the stack: `arn:<partition>:sqs:<region>:<account>:<stack>-notice-*`."""
        self.finding = f"arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:{name_prefix}*"
        """How cdk-nag spells `arns` in its IAM5 findings."""
