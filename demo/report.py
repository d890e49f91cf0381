"""What the demo prints: per job, queued → ready and whose time it was; then the run's totals and the
accounting check. Also the figures `make bench` keeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from demo.figures import JobFigures, Kind, Spread, job_figures
from demo.scenario import Played
from emulator.accounting import Accounting
from emulator.timeline import Happening
from emulator.world import World


@dataclass(frozen=True)
class Totals:
    jobs: list[JobFigures]
    launched: int
    terminated: int
    aws_calls: Counter[str]
    lambda_invocations: dict[str, int]
    state_transitions: int
    executions: Counter[str]
    deliveries_failed: int
    redeliveries: int
    accounting: Accounting

    @property
    def served(self) -> list[JobFigures]:
        return [j for j in self.jobs if j.kind is not Kind.NONE]

    @property
    def warm(self) -> list[JobFigures]:
        return [j for j in self.jobs if j.kind is Kind.WARM]

    @property
    def cold(self) -> list[JobFigures]:
        return [j for j in self.jobs if j.kind is Kind.COLD]

    def per_job(self, count: float) -> float:
        return count / max(1, len(self.served))


def totals(world: World) -> Totals:
    events = world.events()
    executions = world.stack.executions()
    with world.github.state.lock:
        deliveries = list(world.github.state.deliveries.values())
    return Totals(
        jobs=job_figures(events, world.github.state),
        launched=sum(1 for e in events if e.happening is Happening.LAUNCHED),
        terminated=sum(1 for e in events if e.happening is Happening.TERMINATED),
        aws_calls=Counter(world.stack.calls.calls),
        lambda_invocations=world.stack.invocations(),
        state_transitions=sum(world.stack.state_transitions(e["executionArn"]) for e in executions),
        executions=Counter(e["machine"] for e in executions),
        deliveries_failed=sum(1 for d in deliveries if not d.succeeded and not d.redelivery),
        redeliveries=sum(1 for d in deliveries if d.redelivery),
        accounting=world.accounting(),
    )


def print_report(world: World, played: Played, found: Totals) -> None:
    print(
        f"\n{'job':44} {'runner':9} {'queued→ready':>12} {'control':>8} {'instance':>8} {'github':>7}  result"
    )
    for job in found.jobs:
        print(
            f"{job.job[:44]:44} {job.kind.value:9} {_seconds(job.ready_seconds):>12} "
            f"{_seconds(job.control_plane_seconds):>8} {_seconds(job.instance_seconds):>8} "
            f"{_seconds(job.github_seconds):>7}  {job.conclusion}"
        )
    print()
    for kind, jobs in (("warm", found.warm), ("cold", found.cold)):
        ready = Spread.of(j.ready_seconds for j in jobs)
        own = Spread.of(j.control_plane_seconds for j in jobs)
        if ready is not None:
            print(f"{kind} queued→ready: {ready}; the control plane's share {own or '-'}")
    served = len(found.served)
    print(
        f"warm-hit ratio: {len(found.warm)} of {served} jobs "
        f"({len(found.warm) / max(1, served):.0%}); {found.launched} instances launched for {served} jobs"
    )
    aws = sum(found.aws_calls.values())
    services = Counter({name.split(":", 1)[0]: 0 for name in found.aws_calls})
    for name, count in found.aws_calls.items():
        services[name.split(":", 1)[0]] += count
    by_service = ", ".join(f"{s} {n / max(1, served):.1f}" for s, n in services.most_common())
    print(f"AWS calls by the control plane: {found.per_job(aws):.1f} per job ({by_service})")
    lambdas = sum(found.lambda_invocations.values())
    print(
        f"Step Functions: {sum(found.executions.values())} executions ({_listed(found.executions)}), "
        f"{found.per_job(found.state_transitions):.1f} state transitions per job; "
        f"Lambda: {found.per_job(lambdas):.1f} invocations per job"
    )
    print(
        f"webhooks: {found.deliveries_failed} failed, {found.redeliveries} redelivered by refresh; "
        f"crashed: {', '.join(played.crashed) or 'none'}"
    )
    print(f"\n{found.accounting.summary()}; {found.terminated} instances terminated")
    for problem in found.accounting.problems:
        print(f"  - {problem}")
    if not played.settled:
        print("  - the system had not settled when the scenario ended")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _listed(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))


def holds(found: Totals, played: Played, expected_jobs: int) -> bool:
    """The demo's verdict: the accounting holds, the system settled, and every job got a runner or
    ended without needing one (cancelled)."""
    return found.accounting.holds and played.settled and len(found.jobs) == expected_jobs


def summary_lines(found: Totals) -> Sequence[str]:
    """The chart's caption."""
    return [
        f"{len(found.served)} jobs served, {len(found.warm)} warm, {len(found.cold)} cold; "
        f"{found.launched} instances launched",
        found.accounting.summary(),
    ]
