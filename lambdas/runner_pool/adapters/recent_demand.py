"""Runs with recent demand, kept in the state table for refresh to reconcile against GitHub's queued jobs.

    pk = demand#recent, sk = <repository>#<run id>#<attempt>
    repository, run_id, attempt
    run_keys        (string set) the labels the run's demand used
    trust           the run attempt's level of trust (domain.trust) as its first provision that knew it
                    had it; absent while none did
    privileged_labels
                    (string set) its pool labels whose provisions were privileged (domain.demand
                    privileged_label): every run key of such a label is provisioned again privileged
    on_demand_keys  (string set) its run keys whose provisions were served on-demand whatever their
                    `usage=` said (the re-run of a job an interruption failed, domain/reruns.py): each is
                    provisioned again on-demand
    demand_at       the last provision for it began
    busy_until      until then a provision for it may still be claiming or creating: not reconciled
    reconciled_at   when refresh last asked GitHub about it
    refused_at, refused_reason
                    when and why GitHub last refused the run's registration for good (a provision's
                    Finish notes it, the next provision's Begin clears it): refresh leaves the run alone
                    until domain/refresh.py REFUSAL_BACKOFF_SECONDS have passed
    expires_at      TTL, a backstop: refresh forgets a run once its demand is no longer recent

One partition, written once per provision (not per job) and read once per refresh run, so it never
gets hot; refresh keeps it small by forgetting runs whose demand has aged out. Its items carry no
run key and no sweep shard, so they stay out of both of the table's indexes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import conditional_write
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.demand import privileged_label
from runner_pool.domain.refresh import RecentRun
from runner_pool.domain.trust import TrustLevel

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

RECENT_DEMAND_PARTITION = "demand#recent"


class RecentDemand:
    def __init__(
        self,
        table_name: str,
        clock: Clock,
        client: DynamoDBClient | None = None,
        *,
        retention_seconds: float = 2 * 3600.0,
    ) -> None:
        self._table = table_name
        self._clock = clock
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")
        self._retention = retention_seconds

    def note(
        self,
        repository: str,
        run_id: int,
        attempt: int,
        run_key: str,
        busy_for: float,
        *,
        single_use: bool = False,
        repository_id: int | None = None,
        trust: TrustLevel | None = None,
        on_demand: bool = False,
        at: Epoch | None = None,
    ) -> None:
        """A provision for the run's `run_key` begins now (or `at`, its Begin's time) and may be at work for
        `busy_for` seconds.
        Idempotent: a retried note sets the same values again (a later one moves the times on); once
        single use, a run stays so. A refusal noted before is cleared: this provision asks GitHub anew.
        A privileged provision marks its pool label; the run's level is kept as first noted (the demand
        ledger decides it once per run attempt); an unknown one (None) changes nothing. A provision served
        on-demand whatever its label's usage marks its run key, which stays so."""
        now = self._clock.now() if at is None else at
        run = RecentRun(repository, run_id, attempt, frozenset({run_key}), now, now + busy_for)
        marks = ", single_use = :single_use" if single_use else ""
        if repository_id is not None:
            marks += ", repository_id = :repository_id"
        additions = "run_keys :run_keys"
        levels: dict[str, Any] = {}
        if trust is TrustLevel.PRIVILEGED:
            additions += ", privileged_labels :label"
            levels[":label"] = {"SS": [privileged_label(run_key)]}
        elif trust is not None:
            marks += ", trust = if_not_exists(trust, :trust)"
            levels[":trust"] = {"S": trust}
        if on_demand:
            additions += ", on_demand_keys :run_keys"
        self._client.update_item(
            TableName=self._table,
            Key=_key(run.key),
            UpdateExpression=(
                "SET repository = :repository, run_id = :run_id, attempt = :attempt, "
                f"demand_at = :now, busy_until = :busy, #ttl = :ttl{marks} ADD {additions} "
                "REMOVE refused_at, refused_reason"
            ),
            ExpressionAttributeNames={"#ttl": TTL_ATTRIBUTE},
            ExpressionAttributeValues={
                ":repository": {"S": repository},
                ":run_id": {"N": str(run_id)},
                ":attempt": {"N": str(attempt)},
                ":now": {"N": repr(now)},
                ":busy": {"N": repr(run.busy_until)},
                ":ttl": {"N": str(int(now + self._retention))},
                ":run_keys": {"SS": [run_key]},
                **({":single_use": {"BOOL": True}} if single_use else {}),
                **({":repository_id": {"N": str(repository_id)}} if repository_id is not None else {}),
                **levels,
            },
        )

    def runs(self) -> list[RecentRun]:
        """Every run noted and not forgotten yet, least recently reconciled first."""
        found: list[RecentRun] = []
        start: dict[str, Any] | None = None
        while True:
            request: dict[str, Any] = {
                "TableName": self._table,
                "KeyConditionExpression": f"{PARTITION_KEY} = :pk",
                "ExpressionAttributeValues": {":pk": {"S": RECENT_DEMAND_PARTITION}},
                "ConsistentRead": True,
            }
            if start is not None:
                request["ExclusiveStartKey"] = start
            page = self._client.query(**request)
            found += [_run(item) for item in page.get("Items", [])]
            start = page.get("LastEvaluatedKey")
            if not start:
                return sorted(found, key=lambda run: (run.reconciled_at, run.demand_at))

    def reconciled(self, run: RecentRun) -> None:
        self._set_time(run, "reconciled_at", self._clock.now())

    def refused(self, repository: str, run_id: int, attempt: int, reason: str) -> None:
        """GitHub refused the run's registration for good, in its words `reason`. Only a run noted before
        (by its provision's Begin) is marked: a mark never brings a forgotten run back."""
        self._update_run_if(
            repository,
            run_id,
            attempt,
            UpdateExpression="SET refused_at = :now, refused_reason = :reason",
            ConditionExpression="attribute_exists(demand_at)",
            ExpressionAttributeValues={
                ":now": {"N": repr(self._clock.now())},
                ":reason": {"S": reason[:1000]},
            },
        )

    def busy(self, run: RecentRun, busy_for: float) -> None:
        """A provision was started for the run (by refresh): leave it alone until it has had its chance."""
        self._set_time(run, "busy_until", self._clock.now() + busy_for)

    def provision_ended(self, repository: str, run_id: int, attempt: int, begun_at: Epoch) -> None:
        """The provision Begin noted at `begun_at` has ended with jobs still queued: reconciliation need not
        wait out its busy time (a capacity wait's back-off decides when to ask again). Unless a later
        provision for the run began since (its demand_at moved on): that one may still be at work."""
        now = self._clock.now()
        self._update_run_if(
            repository,
            run_id,
            attempt,
            UpdateExpression="SET busy_until = :now",
            ConditionExpression="demand_at = :begun AND busy_until > :now",
            ExpressionAttributeValues={":begun": {"N": repr(begun_at)}, ":now": {"N": repr(now)}},
        )

    def _update_run_if(self, repository: str, run_id: int, attempt: int, **update: Any) -> None:
        """An update of a run's item that applies only under its condition: a refused one changes nothing."""
        key = _run_key(repository, run_id, attempt)
        conditional_write(lambda: self._client.update_item(TableName=self._table, Key=key, **update))

    def _set_time(self, run: RecentRun, attribute: str, at: Epoch) -> None:
        """One of the run's times set to `at`, whatever it held: the writes that need no condition."""
        self._client.update_item(
            TableName=self._table,
            Key=_key(run.key),
            UpdateExpression=f"SET {attribute} = :at",
            ExpressionAttributeValues={":at": {"N": repr(at)}},
        )

    def forget(self, run: RecentRun) -> None:
        """Unless the run had new demand since it was read (its demand_at moved on)."""
        conditional_write(
            lambda: self._client.delete_item(
                TableName=self._table,
                Key=_key(run.key),
                ConditionExpression="demand_at = :seen",
                ExpressionAttributeValues={":seen": {"N": repr(run.demand_at)}},
            )
        )


def _key(sort_key: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": RECENT_DEMAND_PARTITION}, SORT_KEY: {"S": sort_key}}


def _run_key(repository: str, run_id: int, attempt: int) -> dict[str, Any]:
    """The item of a run's attempt, as RecentRun keys it."""
    return _key(RecentRun(repository, run_id, attempt, frozenset(), 0.0, 0.0).key)


def _run(item: dict[str, Any]) -> RecentRun:
    return RecentRun(
        repository=item["repository"]["S"],
        run_id=int(item["run_id"]["N"]),
        attempt=int(item["attempt"]["N"]),
        run_keys=frozenset(item.get("run_keys", {}).get("SS", [])),
        demand_at=float(item["demand_at"]["N"]),
        busy_until=float(item.get("busy_until", {}).get("N", "0")),
        reconciled_at=float(item.get("reconciled_at", {}).get("N", "0")),
        single_use=bool(item.get("single_use", {}).get("BOOL", False)),
        trust=TrustLevel(item["trust"]["S"]) if "trust" in item else None,
        privileged_labels=frozenset(item.get("privileged_labels", {}).get("SS", [])),
        repository_id=int(item["repository_id"]["N"]) if "repository_id" in item else None,
        refused_at=float(item["refused_at"]["N"]) if "refused_at" in item else None,
        refused_reason=item.get("refused_reason", {}).get("S"),
        on_demand_keys=frozenset(item.get("on_demand_keys", {}).get("SS", [])),
    )
