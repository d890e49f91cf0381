"""The pool's partitions: one queue per resource class, usage and architecture.

A label's hard keys choose the queue a request reads, so no instance that a hard key rules out ever
stands in front of one that fits: a spot x64 request never reads an arm64 or an on-demand offer.
What a request judges in memory is what cannot choose a queue: its type globs, its repository's
reuse scope, and the offer's age.

Why instance type is not a partition. The types of a class are not a list the stack knows: creation
asks EC2 for any type inside the class's fence (attribute-based selection, domain/fleet.py), so the
set is EC2's choice and grows with every new family, and `types=` may name a type outside the fence
(`r7i.large`). Per-type queues would need either a catalogue of types that goes stale, with a
catch-all queue beside it, or queues created at run time outside the stack and its grants; and the
common request, which names no types, would read every type's queue of its class to find any
instance. So type misfits share their partition's queue, and pickup reads through them within its
budget (domain/pickup.py, PICKUP_BUDGET_SECONDS; bench/pickup.py measures it behind 10,000 misfits).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product

from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.records import Arch, InstanceFacts, PoolMessage, UsageClass

QUEUE_NAME_LIMIT = 80
"""SQS: "A queue name can have up to 80 characters" of alphanumerics, hyphens and underscores (Amazon SQS
API Reference, CreateQueue, QueueName)."""


def queue_name_prefix(stack_name: str) -> str:
    """What every pool queue's name of the stack starts with; a partition's name follows it."""
    return f"{stack_name}-pool-"


@dataclass(frozen=True, order=True)
class PoolPartition:
    """The idle instances of one resource class, usage class and architecture: one pool queue."""

    resource_class: str
    usage: UsageClass
    arch: Arch

    @property
    def name(self) -> str:
        """`large-spot-x64`: class names are lowercase letters, digits and '-' (labels.CLASS_NAME), as
        are the usage and architecture values, so the name is a valid part of a queue name."""
        return f"{self.resource_class}-{self.usage.value}-{self.arch.value}"

    def queue_name(self, prefix: str) -> str:
        """The partition's queue under `prefix` (queue_name_prefix), or the queue's URL under a URL
        prefix that ends with it: the one place a partition's queue is named."""
        return f"{prefix}{self.name}"

    @classmethod
    def of(cls, message: PoolMessage | InstanceFacts) -> PoolPartition:
        """The partition an offer or an instance belongs in: its own class, usage and architecture; hot,
        its queue; stopped, its key in the state table's by-stopped index."""
        return cls(message.resource_class, message.usage_class, message.arch)

    @classmethod
    def every(cls, resource_classes: Iterable[str]) -> tuple[PoolPartition, ...]:
        """Every partition of the given classes: the queues a stack creates."""
        return tuple(
            cls(name, usage, arch) for name, usage, arch in product(resource_classes, UsageClass, Arch)
        )

    @classmethod
    def admitting(cls, spec: RunnerSpec) -> tuple[PoolPartition, ...]:
        """The partitions whose instances a request's hard keys admit, in the order pickup reads them.

        Each hard key resolves to one value (a label without `usage` or `arch` gets the stack's
        default, never "any"), so a request reads exactly one partition today. Pickup reads a tuple so
        that a key admitting several values adds partitions here and nowhere else; they would be read
        cheapest first (spot before on-demand), so that an on-demand offer, which only an on-demand
        request can otherwise use, is taken last.
        """
        return (cls(spec.resource_class, spec.usage, spec.arch),)


def longest_queue_name(prefix: str, resource_classes: Iterable[str]) -> str:
    """The longest queue name the stack would create under `prefix`, to check against QUEUE_NAME_LIMIT."""
    return max((p.queue_name(prefix) for p in PoolPartition.every(resource_classes)), key=len, default="")
