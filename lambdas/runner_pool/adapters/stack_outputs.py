"""A deployed stack's outputs, read from CloudFormation: how the operator's commands find a deployment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def stack_outputs(
    cloudformation: Any, stack_name: str, required: Iterable[str], not_found: type[LookupError]
) -> dict[str, str]:
    """Every output of the stack by its key; `not_found` (the command's own error) when the stack is not
    there or lacks one of the `required` outputs."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except cloudformation.exceptions.ClientError as error:
        raise not_found(f"stack {stack_name!r}: {error}") from None
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
    missing = [name for name in required if name not in outputs]
    if missing:
        names = ", ".join(missing)
        raise not_found(f"stack {stack_name!r} has no output {names}: is it a runner-pool stack?")
    return outputs
