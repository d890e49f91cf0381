"""The stack's own KMS keys, made alike: what they protect is of no use once the stack is gone."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_kms as kms
from constructs import Construct


def stack_key(scope: Construct, construct_id: str, description: str) -> kms.Key:
    """A customer managed key that rotates yearly and goes with the stack, after the shortest pending
    window AWS allows (7 days), since nothing it encrypted is kept beyond it."""
    return kms.Key(
        scope,
        construct_id,
        description=description,
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.DESTROY,
        pending_window=Duration.days(7),
    )
