"""Notices: how the control plane tells an instance's agent "your record changed, read it now"
without ever connecting to the instance.

Each instance has a notice queue of its own, an SQS standard queue named `<stack>-notice-<instance id>`,
opened by the control plane right after it records the instance and tagged with the instance's ARN. Its
agent long-polls it (ReceiveMessage with a 20 s wait, SQS's longest) and reads its record as soon as a
notice arrives; the instance role may receive only from a queue whose `runner-pool:instance` tag is the
ARN of the instance that signs the request (IAM's `${ec2:SourceInstanceARN}`), so no instance, and no
job on it, can read or drain another's notices.

A notice carries nothing: the record stays the only truth, and the agent still reads it now and then
without one (its watch period), so a notice lost or late only slows an agent down, never misleads it.
That is why sending one is best effort: a step that cannot send it logs, counts and goes on.

Refresh keeps queues and records in step: it deletes a queue whose instance has no live record and
opens one for a live record that has none (an opening that failed).
"""

from __future__ import annotations

from runner_pool.domain.pool_partitions import QUEUE_NAME_LIMIT

INSTANCE_TAG_KEY = "runner-pool:instance"
"""The tag on each notice queue that names its instance's ARN; the instance role's receive condition."""
NOTICE = "look"
"""A notice's body: SQS wants one of at least a character, and a notice means only "read your record"."""
RETENTION_SECONDS = 300
"""A notice older than this is of no use: the agent has read its record since, by its watch period."""
INSTANCE_ID_LENGTH = len("i-0123456789abcdef0")
"""EC2's instance ids are `i-` and 17 hexadecimal digits (8 for instances of before 2016, shorter)."""


def queue_name_prefix(stack_name: str) -> str:
    """What every notice queue's name of the stack starts with; an instance id follows it."""
    return f"{stack_name}-notice-"


def queue_name(prefix: str, instance_id: str) -> str:
    """The instance's notice queue under `prefix`, or its URL under a URL prefix that ends with it."""
    return f"{prefix}{instance_id}"


def instance_of(queue_url_or_name: str, prefix: str) -> str | None:
    """The instance id a notice queue is for, or None for a queue that is not one of this stack's."""
    name = queue_url_or_name.rstrip("/").rsplit("/", 1)[-1]
    name_prefix = prefix.rsplit("/", 1)[-1]
    if not name.startswith(name_prefix):
        return None
    instance_id = name[len(name_prefix) :]
    return instance_id if instance_id.startswith("i-") else None


def name_too_long(stack_name: str) -> str | None:
    """Why the stack's notice queues could not be named, or None: SQS names hold 80 characters."""
    longest = queue_name(queue_name_prefix(stack_name), "i-" + "0" * (INSTANCE_ID_LENGTH - 2))
    if len(longest) <= QUEUE_NAME_LIMIT:
        return None
    return (
        f"the notice queue {longest!r} would have {len(longest)} characters, more than SQS's "
        f"{QUEUE_NAME_LIMIT}; fix: shorten the stack's name to at most "
        f"{QUEUE_NAME_LIMIT - len(longest) + len(stack_name)} characters"
    )
