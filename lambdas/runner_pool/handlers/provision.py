"""The provision state machine's Lambda tasks: one handler per step of statemachines/provision.asl.json."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, ValidationError

from runner_pool.domain.executions import MalformedRequestError, ProvisionRequest
from runner_pool.domain.provision import ClaimWorker, Creation, ProvisionPlan, WorkerResult
from runner_pool.observability import logger, tracer
from runner_pool.steps.capacity_waits import CapacityWaitSteps
from runner_pool.steps.provision import Provision
from runner_pool.wiring import ControlPlane, control_plane


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class BeginEvent(_Event):
    request: ProvisionRequest
    execution: str


class CreateEvent(_Event):
    plan: ProvisionPlan
    workers: tuple[WorkerResult, ...]


class CheckFleetEvent(_Event):
    plan: ProvisionPlan
    creation: Creation


class FinishEvent(_Event):
    plan: ProvisionPlan
    workers: tuple[WorkerResult, ...]
    creation: Creation
    machine: str | None = None
    """The provision state machine's own ARN (`$$.StateMachine.Id`), to ask again for unserved runners."""


class DumpEvent(_Event):
    plan: ProvisionPlan
    error: dict[str, Any] | None = None
    machine: str | None = None


def _provision(context: LambdaContext | None = None) -> Provision:
    """With the invocation's `context`, the steps know how much of their Lambda's time is left."""
    time_left = (lambda: context.get_remaining_time_in_millis() / 1000) if context is not None else None
    return provision_of(control_plane(), time_left)


def provision_of(plane: ControlPlane, time_left: Callable[[], float] | None = None) -> Provision:
    return Provision(
        plane.state_table,
        clock=plane.clock,
        config=plane.config,
        arns=plane.instance_arns,
        pickup=lambda: plane.pickup,
        queues=lambda: plane.pool_queues,
        fleet=lambda: plane.fleet,
        budget=lambda: plane.registration_budget,
        registry=lambda: plane.github,
        credentials=lambda: plane.credentials,
        recent_demand=lambda: plane.recent_demand,
        executions=plane.executions,
        notices=lambda: plane.notices,
        pause=plane.pause,
        time_left=time_left,
        spot_breaker=lambda: plane.spot_breaker,
        capacity_waits=CapacityWaitSteps(
            lambda: plane.capacity_waits, clock=plane.clock, check_runs=lambda: plane.github
        ),
        history=plane.history_notes,
    )


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def begin(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    try:
        parsed = BeginEvent.model_validate(event)
        logger.append_keys(run_key=parsed.request.run_key, execution=parsed.execution)
        return _provision().begin(parsed.request, parsed.execution).model_dump(mode="json")
    except ValidationError as refused:
        raise MalformedRequestError(str(refused)) from refused


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def claim(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    worker = ClaimWorker.model_validate(event)
    logger.append_keys(run_key=worker.plan.spec.run_key, execution=worker.plan.execution, slot=worker.slot)
    return _provision(context).claim(worker).model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def check_claim(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    return _provision().check_claim(ClaimWorker.model_validate(event)).model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def discard(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    return _provision().discard(ClaimWorker.model_validate(event)).model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def create(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    parsed = CreateEvent.model_validate(event)
    logger.append_keys(run_key=parsed.plan.spec.run_key, execution=parsed.plan.execution)
    return _provision().create(parsed.plan, parsed.workers).model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def check_fleet(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    parsed = CheckFleetEvent.model_validate(event)
    return _provision().check_fleet(parsed.plan, parsed.creation).model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def finish(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    parsed = FinishEvent.model_validate(event)
    logger.append_keys(run_key=parsed.plan.spec.run_key, execution=parsed.plan.execution)
    result = _provision().finish(parsed.plan, parsed.workers, parsed.creation, parsed.machine)
    return result.model_dump(mode="json")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def dump(event: dict[str, Any], _context: LambdaContext) -> dict[str, Any]:
    parsed = DumpEvent.model_validate(event)
    logger.append_keys(run_key=parsed.plan.spec.run_key, execution=parsed.plan.execution)
    return {"dumped": _provision().dump(parsed.plan, parsed.machine), "error": parsed.error}
