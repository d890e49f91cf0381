"""A run's release too large for one execution: its parts started, each as a release execution of its own.

Started by name (ReleaseRequest.execution_name), so starting them again, whether this step was retried or
stopped half way, starts none twice, and a part started once gives back its instances once. A part that
never starts leaves its instances holding the run key until their thresholds pass, when refresh
terminates them (steps.refresh, terminate due), as it does after a release whose Plan failed.

Express workflows keep no names (and have no history quota to split for): there a StartParts retried
after starting some parts starts those again, and each instance's two releases recognise each other as
twin releases of the run (steps.release), at worst offering it to the pool twice, a copy pickup drops.
"""

from __future__ import annotations

from runner_pool.domain.release import PartsStarted, ReleasePlan, ReleaseStarter


class ReleaseParts:
    def __init__(self, starter: ReleaseStarter) -> None:
        self._starter = starter

    def start(self, plan: ReleasePlan) -> PartsStarted:
        """Start every part of the plan, in order; a part whose execution exists already counts as started
        (Step Functions answers a start of a running execution's name and input as it did the first)."""
        for part in plan.parts:
            self._starter.release(part)
        return PartsStarted(names=tuple(part.execution_name for part in plan.parts))
