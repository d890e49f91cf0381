"""How a stateful (hypothesis) test over moto runs: its own count of programs and steps, no deadline."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def programs(examples: int, steps: int) -> settings:
    """`examples` programs of `steps` steps each, each step as slow as moto is on a loaded machine (no
    deadline, no too-slow health check): a test's count is what make test's time allows it."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
