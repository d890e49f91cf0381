"""The operator CLI, `runner-pool status|instances|pool|drain|doctor|job|logs|connect|cost`: a deployed
pool, from its table, queues, and (doctor) its App and account; (job) one job's story; (logs) its
hand-over's lines; (connect) a shell on its instance; (cost) what the stack spent.

It finds the state table and the pool queues (one per class, usage and architecture) through the
stack's outputs (`--stack`, default
RunnerPool), with the operator's own AWS credentials, and prints plain tables. `drain CLASS` expires
the idle instances of one class: their pool messages go stale, and the next refresh terminates them.
`doctor` checks the deployment's GitHub App and AWS account, one line per check with its fix
(runner_pool/checkup.py), and exits 1 when something would stop jobs. `job URL` tells what happened to
the job a GitHub job (or run) URL names, in order, from the stack's records (runner_pool/job_command.py);
`logs URL` prints what its instance's agent and runner logged of its hand-over (runner_pool/logs_command.py).
`connect URL|INSTANCE` starts (or prints) a Session Manager session on that job's instance, when its class
lets Session Manager in (runner_pool/connect_command.py).
`cost` prices the hand-overs and idle time the stack recorded (runner_pool/cost_command.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from runner_pool import connect_command, cost_command, job_command, logs_command
from runner_pool.adapters import aws_clients
from runner_pool.adapters.capacity_waits import CapacityWaits
from runner_pool.adapters.cost_ledger import DynamoDbCostLedger
from runner_pool.adapters.stack_outputs import stack_outputs
from runner_pool.adapters.state_table import StateTable
from runner_pool.checkup import Target, TargetNotFoundError, doctor, load_manifest
from runner_pool.domain.clock import Clock, SystemClock
from runner_pool.domain.cost import Grouping
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.timeouts import Timeouts
from runner_pool.prices import gp3_hourly, on_demand_hourly

DEFAULT_STACK = "RunnerPool"
TABLE_OUTPUT = "StateTableName"
QUEUES_OUTPUT = "PoolQueueUrlPrefix"
CLASSES_OUTPUT = "ResourceClasses"
VOLUME_OUTPUT = "RootVolumeGib"
"""Each instance's root volume size; a stack older than it leaves the volumes unpriced (`+?`)."""
LIVE_STATES = (InstanceState.CREATED, InstanceState.CLAIMED, InstanceState.RUNNING, InstanceState.IDLE)


class DeploymentNotFoundError(LookupError):
    """The stack, or an output the CLI reads, is not there."""


@dataclass(frozen=True)
class Deployment:
    """Where a deployed pool keeps its records and its idle instances."""

    table_name: str
    pool_queue_url_prefix: str
    resource_classes: tuple[str, ...]
    root_volume_gib: int | None = None

    @property
    def pool_queue_urls(self) -> dict[PoolPartition, str]:
        """Each partition's queue URL."""
        return {
            p: p.queue_name(self.pool_queue_url_prefix) for p in PoolPartition.every(self.resource_classes)
        }

    @classmethod
    def of_stack(cls, stack_name: str, cloudformation: Any) -> Deployment:
        required = (TABLE_OUTPUT, QUEUES_OUTPUT, CLASSES_OUTPUT)
        outputs = stack_outputs(cloudformation, stack_name, required, DeploymentNotFoundError)
        volume = outputs.get(VOLUME_OUTPUT)
        return cls(
            outputs[TABLE_OUTPUT],
            outputs[QUEUES_OUTPUT],
            tuple(json.loads(outputs[CLASSES_OUTPUT])),
            None if volume is None else int(volume),
        )


class Operator:
    """The CLI's commands over one deployment; each writes a table to `out` and returns an exit code."""

    def __init__(self, deployment: Deployment, dynamodb: Any, sqs: Any, clock: Clock, out: TextIO) -> None:
        self._deployment = deployment
        # The CLI reads and expires only: no transition it makes depends on the timeouts' values.
        self._table = StateTable(deployment.table_name, Timeouts(), clock, dynamodb)
        self._waits = CapacityWaits(deployment.table_name, clock, dynamodb)
        self._costs = DynamoDbCostLedger(deployment.table_name, dynamodb)
        self._sqs = sqs
        self._clock = clock
        self._out = out

    def status(self) -> int:
        """Instances per class and state, with how many are overdue and how many wait in the pool; then
        each class's hot (idle and still offered) and stopped counts, and what its idle and stopped
        instances cost an hour at list prices (`_idle_cost_per_hour`); then the jobs waiting for capacity,
        with EC2's reason."""
        records = self._table.live()
        now = self._clock.now()
        by_class_state = Counter((r.resource_class, r.state) for r in records)
        overdue = Counter(r.resource_class for r in records if r.threshold_passed(now))
        hot = Counter(
            r.resource_class for r in records if r.state is InstanceState.IDLE and not r.threshold_passed(now)
        )
        stopped = Counter(r.resource_class for r in records if r.state is InstanceState.STOPPED)
        pooled: Counter[str] = Counter()
        for partition, (ready, _, _) in self._depths().items():
            pooled[partition.resource_class] += int(ready)
        classes = sorted(set(self._deployment.resource_classes) | {r.resource_class for r in records})
        rows = [
            [
                name,
                *(str(by_class_state[(name, state)]) for state in LIVE_STATES),
                str(overdue[name]),
                str(pooled[name]) if name in self._deployment.resource_classes else "-",
                str(hot[name]),
                str(stopped[name]),
                _idle_cost_per_hour(
                    (r for r in records if r.resource_class == name), self._deployment.root_volume_gib
                ),
            ]
            for name in classes
        ]
        self._table_out(
            [
                "class",
                *(s.value for s in LIVE_STATES),
                "overdue",
                "pooled",
                "hot",
                "stopped",
                "idle_usd_per_hour",
            ],
            rows,
        )
        self._capacity_waits_out(now)
        return 0

    def _capacity_waits_out(self, now: float) -> None:
        """The run keys whose jobs wait for EC2 capacity (domain/capacity_waits.py), with EC2's reason;
        nothing when none does."""
        waits = sorted(self._waits.all(), key=lambda wait: wait.since)
        if not waits:
            return
        print("\njobs waiting for capacity", file=self._out)
        self._table_out(
            ["class", "usage", "jobs", "reason", "waiting", "tries", "next try", "repository", "run key"],
            [
                [
                    wait.resource_class,
                    wait.usage,
                    str(wait.jobs),
                    wait.reason,
                    _duration(now - wait.since),
                    str(wait.tries),
                    "due" if wait.due(now) else f"in {_duration(wait.next_try - now)}",
                    wait.repository,
                    wait.run_key,
                ]
                for wait in waits
            ],
        )

    def instances(self) -> int:
        """Every live instance, oldest first."""
        now = self._clock.now()
        records = sorted(self._table.live(), key=lambda r: r.created_at)
        rows = [
            [
                r.instance_id,
                r.state.value,
                r.resource_class,
                r.instance_type,
                r.usage_class.value,
                _until(r, now),
                r.run_key or "",
            ]
            for r in records
        ]
        self._table_out(["instance", "state", "class", "type", "usage", "threshold", "run key"], rows)
        return 0

    def pool(self) -> int:
        """Each partition's pool queue: messages ready to be picked up, being picked up, and delayed."""
        idle = Counter(
            PoolPartition(r.resource_class, r.usage_class, r.arch)
            for r in self._table.live()
            if r.state is InstanceState.IDLE
        )
        depths = self._depths()
        rows = [
            [p.resource_class, p.usage.value, p.arch.value, *depths[p], str(idle[p])] for p in sorted(depths)
        ]
        self._table_out(["class", "usage", "arch", "ready", "in flight", "delayed", "idle records"], rows)
        return 0

    def drain(self, resource_class: str) -> int:
        """Expire every idle instance of a class; refresh then terminates them."""
        if resource_class not in self._deployment.resource_classes:
            known = ", ".join(sorted(self._deployment.resource_classes))
            print(f"no class {resource_class!r} in this stack; classes: {known}", file=sys.stderr)
            return 2
        idle = [
            r
            for r in self._table.live()
            if r.state is InstanceState.IDLE and r.resource_class == resource_class
        ]
        rows = []
        for record in idle:
            result = self._table.expire(record.instance_id, None)
            rows.append(
                [record.instance_id, "expired" if result.succeeded else f"left ({result.outcome.value})"]
            )
        self._table_out(["instance", "drained"], rows)
        expired = sum(1 for row in rows if row[1] == "expired")
        print(
            f"{expired} idle {resource_class} instance(s) expired; refresh terminates them.", file=self._out
        )
        return 0

    def _depths(self) -> dict[PoolPartition, tuple[str, str, str]]:
        attributes = (
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        )
        depths = {}
        for partition, url in self._deployment.pool_queue_urls.items():
            found = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(attributes))[
                "Attributes"
            ]
            depths[partition] = (found[attributes[0]], found[attributes[1]], found[attributes[2]])
        return depths

    def cost(self, since: str, by: Grouping, *, as_json: bool = False) -> int:
        """The jobs' and the idle pool's dollars over the last `since` (7d, 12h) per group, at list
        prices (runner_pool/cost_command.py)."""
        try:
            seconds = cost_command.window_seconds(since)
        except ValueError as error:
            print(f"runner-pool: {error}", file=sys.stderr)
            return 1
        found = cost_command.read_report(self._costs, self._clock.now(), seconds, by)
        if as_json:
            print(json.dumps(cost_command.as_document(found, since, by), indent=2), file=self._out)
            return 0
        print(f"cost of the last {since} by {by}, at {cost_command.YARDSTICK}", file=self._out)
        self._table_out(cost_command.HEADER, cost_command.rows(found))
        for note in cost_command.notes(found):
            print(note, file=self._out)
        return 0

    def _table_out(self, header: list[str], rows: list[list[str]]) -> None:
        if not rows:
            print("(none)", file=self._out)
            return
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, ["-" * width for width in widths], *rows]:
            print(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
                file=self._out,
            )


def _idle_cost_per_hour(records: Iterable[InstanceRecord], volume_gib: int | None) -> str:
    """What the waiting instances among `records` cost an hour at list prices (runner_pool/prices.py): an
    idle one its type's on-demand price and its gp3 root volume, a stopped one its volume alone ("We
    don't charge usage for a stopped instance ... you are charged for Amazon EBS volume usage", EC2 API
    Reference, StopInstances). `+?` when a type's price, or (from a stack without the output) the
    volumes' size, is unknown."""
    waiting = [r for r in records if r.state in (InstanceState.IDLE, InstanceState.STOPPED)]
    prices = [on_demand_hourly(r.instance_type) for r in waiting if r.state is InstanceState.IDLE]
    known = sum(price for price in prices if price is not None)
    unknown = None in prices or (bool(waiting) and volume_gib is None)
    if volume_gib is not None:
        known += len(waiting) * gp3_hourly(volume_gib)
    if not known and unknown:
        return "?"
    return f"{known:.5f}".rstrip("0").rstrip(".") + ("+?" if unknown else "")


def _until(record: InstanceRecord, now: float) -> str:
    if record.threshold is None:
        return ""
    seconds = record.threshold - now
    if seconds <= 0:
        return f"passed {_duration(-seconds)} ago"
    return f"in {_duration(seconds)}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="runner-pool", description=__doc__.splitlines()[0])
    root.add_argument("--stack", default=DEFAULT_STACK, help=f"the stack's name (default {DEFAULT_STACK})")
    root.add_argument("--region", help="the stack's region (default: your AWS configuration's)")
    commands = root.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "status", help="instances per class and state, hot and stopped counts, idle cost per hour"
    )
    commands.add_parser("instances", help="every live instance")
    commands.add_parser("pool", help="the pool queues' depths")
    drain = commands.add_parser(
        "drain", help="expire the idle instances of a class (refresh terminates them)"
    )
    drain.add_argument("resource_class", metavar="CLASS")
    checkup = commands.add_parser(
        "doctor", help="check the App, the organisation's runner policy and the account; one line per check"
    )
    checkup.add_argument(
        "--manifest",
        type=Path,
        help="the App manifest the App was made from (default: this clone's for the stack's registration: "
        "github-app-manifest.json for runner groups, github-app-manifest.personal-account.json for "
        "repository registration)",
    )
    story = commands.add_parser(
        "job", help="a job's story from a job or run URL: demand, provision, instance, runner, release"
    )
    story.add_argument("url", metavar="URL", help="https://github.com/OWNER/REPO/actions/runs/RUN[/job/JOB]")
    story.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    lines = commands.add_parser(
        "logs", help="the agent's and the runner's lines of a job's hand-over, from a job or run URL"
    )
    lines.add_argument("url", metavar="URL", help="https://github.com/OWNER/REPO/actions/runs/RUN[/job/JOB]")
    lines.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    session = commands.add_parser(
        "connect",
        help="a Session Manager shell on a job's instance, when its class has ssm on (README, Security)",
    )
    session.add_argument("target", metavar="URL|INSTANCE", help="a job's or run's URL, or an instance id")
    session.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="print the `aws ssm start-session` command instead of starting it (the default without the "
        "session-manager-plugin)",
    )
    _cost_parser(commands)
    return root


def _cost_parser(commands: Any) -> None:
    spend = commands.add_parser(
        "cost",
        help="EC2, EBS and control-plane dollars per job and group, the idle share apart (list prices)",
    )
    spend.add_argument("--since", default="7d", help="how far back: 7d (the default), 36h, ...")
    spend.add_argument("--by", choices=[g.value for g in Grouping], default=Grouping.REPOSITORY.value)
    spend.add_argument("--json", action="store_true", help="one JSON document, for scripts")


def main(
    argv: Sequence[str] | None = None,
    *,
    clients: Callable[[str, str | None], Any] | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
) -> int:
    """The `runner-pool` entry point; tests pass their own clients (moto), clock and output."""
    arguments = parser().parse_args(argv)
    make = clients or (lambda service, region: aws_clients.client(service, region_name=region))
    if arguments.command == "doctor":
        try:
            target = Target.of_stack(
                arguments.stack, make("cloudformation", arguments.region), make("lambda", arguments.region)
            )
            manifest = load_manifest(arguments.manifest) if arguments.manifest else None
        except (TargetNotFoundError, OSError) as error:
            print(f"runner-pool: {error}", file=sys.stderr)
            return 1
        return doctor(target, lambda service: make(service, arguments.region), out or sys.stdout, manifest)
    if arguments.command in ("job", "logs", "connect"):
        return _job(arguments, lambda service: make(service, arguments.region), clock, out)
    try:
        deployment = Deployment.of_stack(arguments.stack, make("cloudformation", arguments.region))
    except DeploymentNotFoundError as error:
        print(f"runner-pool: {error}", file=sys.stderr)
        return 1
    operator = Operator(
        deployment,
        make("dynamodb", arguments.region),
        make("sqs", arguments.region),
        clock or SystemClock(),
        out or sys.stdout,
    )
    with_arguments: dict[str, Callable[[], int]] = {
        "drain": lambda: operator.drain(arguments.resource_class),
        "cost": lambda: operator.cost(arguments.since, Grouping(arguments.by), as_json=arguments.json),
    }
    command: Callable[[], int] = with_arguments.get(arguments.command) or getattr(operator, arguments.command)
    return command()


def _job(
    arguments: argparse.Namespace, clients: Callable[[str], Any], clock: Clock | None, out: TextIO | None
) -> int:
    try:
        found = job_command.JobTarget.of_stack(arguments.stack, clients)
    except job_command.JobTargetNotFoundError as error:
        print(f"runner-pool: {error}", file=sys.stderr)
        return 1
    if arguments.command == "connect":
        return connect_command.connect(
            found,
            arguments.target,
            clients,
            clock or SystemClock(),
            out or sys.stdout,
            print_only=arguments.print_only,
        )
    command = job_command.job if arguments.command == "job" else logs_command.logs
    return command(
        found, arguments.url, clients, clock or SystemClock(), out or sys.stdout, as_json=arguments.json
    )


if __name__ == "__main__":
    sys.exit(main())
