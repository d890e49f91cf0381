"""One construct per concern of the deployment; the stack only composes them."""

from infra.constructs.instances import Instances
from infra.constructs.pool_queues import PoolQueues
from infra.constructs.state_table import StateTable

__all__ = ["Instances", "PoolQueues", "StateTable"]
