"""Starting the provision, release and follow-up state machines (Step Functions StartExecution), by name.

A name that already exists is success: Standard workflows refuse a second execution of a name for
90 days, so a repeated request is recognised there (with the same input StartExecution answers as
for the first call; with another, `ExecutionAlreadyExists`). Express workflows do not keep names,
which is why the dispatcher deduplicates demand before it gets here.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import error_code
from runner_pool.domain.executions import FollowUpRequest, ProvisionRequest, ReleaseRequest


class ExecutionNotStartedError(RuntimeError):
    """Step Functions did not start the execution; `code` is its error code (e.g. ExecutionLimitExceeded)."""

    def __init__(self, code: str, name: str, detail: str) -> None:
        super().__init__(f"execution {name} not started ({code}): {detail}")
        self.code = code


class Executions:
    def __init__(
        self,
        provision_machine_arn: str,
        release_machine_arn: str,
        client: Any | None = None,
        *,
        follow_up_machine_arn: str | None = None,
    ) -> None:
        self._provision_arn = provision_machine_arn
        self._release_arn = release_machine_arn
        self._follow_up_arn = follow_up_machine_arn
        self._client: Any = client or aws_clients.client("stepfunctions")

    def provision(self, request: ProvisionRequest) -> bool:
        return self.start(self._provision_arn, request.execution_name, request)

    def release(self, request: ReleaseRequest) -> bool:
        return self.start(self._release_arn, request.execution_name, request)

    def follow_up(self, request: FollowUpRequest) -> bool:
        if not self._follow_up_arn:
            raise ExecutionNotStartedError("NoMachine", request.execution_name, "no follow-up state machine")
        return self.start(self._follow_up_arn, request.execution_name, request)

    def start(self, machine_arn: str, name: str, request: BaseModel) -> bool:
        """Start an execution named `name` with the request as its input; False if that name existed."""
        try:
            self._client.start_execution(
                stateMachineArn=machine_arn, name=name, input=request.model_dump_json()
            )
        except ClientError as exc:
            if error_code(exc) == "ExecutionAlreadyExists":
                return False
            raise ExecutionNotStartedError(error_code(exc), name, str(exc)) from exc
        return True
