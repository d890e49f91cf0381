"""The demo's `runner-pool cost`: what its jobs cost at list prices, per repository, the idle pool apart.

The command's own code (runner_pool/cli.py Operator.cost) over the demo's state table: each hand-over the
releases recorded, and each instance refresh ended. The instances still in the pool when the demo ends
have not ended, so their idle time is not in it yet (it is counted when they end)."""

from __future__ import annotations

import sys

from emulator.world import World
from runner_pool.cli import Deployment, Operator
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.cost import Grouping


def print_cost(system: World) -> bool:
    """Print `runner-pool cost --since 1d --by repository` for the demo's stack; True when it ran."""
    print("\nrunner-pool cost --since 1d --by repository, against the demo's stack:")
    deployment = Deployment(system.stack.plane.settings.table_name, "", ())
    operator = Operator(deployment, system.aws.client("dynamodb"), None, SystemClock(), sys.stdout)
    return operator.cost("1d", Grouping.REPOSITORY) == 0
