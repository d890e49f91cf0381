"""One construct per concern of the deployment; the stack only composes them."""

from infra.constructs.functions import ControlPlaneFunctions
from infra.constructs.github_tokens import GitHubTokens
from infra.constructs.ingress import Ingress
from infra.constructs.instances import Instances
from infra.constructs.interruptions import Interruptions
from infra.constructs.observability import Observability
from infra.constructs.pool_queues import PoolQueues
from infra.constructs.provision import Provision
from infra.constructs.refresh import Refresh
from infra.constructs.release import Release
from infra.constructs.runner_image import RunnerImage
from infra.constructs.state_table import StateTable

__all__ = [
    "ControlPlaneFunctions",
    "GitHubTokens",
    "Ingress",
    "Instances",
    "Interruptions",
    "Observability",
    "PoolQueues",
    "Provision",
    "Refresh",
    "Release",
    "RunnerImage",
    "StateTable",
]
