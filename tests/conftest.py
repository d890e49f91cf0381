"""Fixtures: moto with DynamoDB's item atomicity, the state table, pool queues, a steerable clock."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from moto import mock_aws

from emulator.aws import behaving_as_aws
from emulator.harness.control_plane import NO_WAIT, REGION
from emulator.harness.github_app import AppKey, generate_app_key
from emulator.iam_check import USAGE_DIRECTORY_VARIABLE, usage_report
from emulator.resources import create_pool_queues, create_state_table
from emulator.step_functions_quotas import QuotaWatch
from emulator.step_functions_quotas import install as install_step_functions_quotas
from runner_pool.adapters import aws_clients
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from tests.support.aws_faults import RetryDelays, record_retry_delays

# Property tests judge behaviour, never speed: make test shares 2 cores with whatever else runs, and
# there Hypothesis' deadline (200 ms an example) and its slow-generation check fail good code. Speed
# belongs to make bench.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# Never let a test reach for real credentials or a real region.
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_SESSION_TOKEN="testing",
    AWS_DEFAULT_REGION="us-east-1",
)
TABLE_NAME = "runner-pool-state"


@pytest.fixture(autouse=True)
def retry_delays(monkeypatch: pytest.MonkeyPatch) -> RetryDelays:
    """botocore's retries, as deployed but without their waits; the delays it chose, for tests to check."""
    return record_retry_delays(monkeypatch)


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws(), behaving_as_aws():
        yield


@pytest.fixture(scope="module")
def app_key() -> AppKey:
    """A GitHub App's key pair, made once a module: generating one takes a while."""
    return generate_app_key()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def config() -> StackConfig:
    return StackConfig()


@pytest.fixture
def dynamodb(aws: None) -> object:
    client = aws_clients.client("dynamodb", region_name=REGION)
    create_state_table(client, TABLE_NAME)
    return client


@pytest.fixture
def state_table(dynamodb: object, clock: ManualClock, config: StackConfig) -> StateTable:
    return StateTable(TABLE_NAME, config.timeouts, clock, dynamodb, NO_WAIT)  # type: ignore[arg-type]


@pytest.fixture
def sqs(aws: None) -> Any:
    return aws_clients.client("sqs", region_name=REGION)


@pytest.fixture
def pool_queue_url_prefix(sqs: object, config: StackConfig) -> str:
    return create_pool_queues(sqs, "runner-pool-pool-", config.resource_classes)  # type: ignore[arg-type]


@pytest.fixture
def sqs_calls(sqs: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every SQS call the client makes from here on: operation name and parameters."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append((model.name, dict(params)))

    sqs.meta.events.register("provide-client-params.sqs.*", record)
    return calls


# --- the IAM check's figures (emulator/iam_check.py): every local stack notes what its calls used -----


def pytest_configure(config: pytest.Config) -> None:
    """One directory for the whole session, set before xdist starts its workers (they inherit it)."""
    if not hasattr(config, "workerinput") and USAGE_DIRECTORY_VARIABLE not in os.environ:
        os.environ[USAGE_DIRECTORY_VARIABLE] = tempfile.mkdtemp(prefix="runner-pool-iam-usage-")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    lines = usage_report(Path(os.environ[USAGE_DIRECTORY_VARIABLE]))
    if lines:
        terminalreporter.section("IAM check")
        for line in lines:
            terminalreporter.write_line(line)


# --- Step Functions' quotas (emulator/step_functions_quotas.py) ------------------------------------


@pytest.fixture(autouse=True)
def step_functions_quotas() -> Iterator[QuotaWatch]:
    """Fails the test during which any state machine passed a payload or history quota of AWS's."""
    watch = install_step_functions_quotas()
    watch.take_violations()
    yield watch
    breaches = watch.take_violations()
    if breaches:
        pytest.fail("Step Functions would fail this: " + "; ".join(dict.fromkeys(breaches)), pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests (whole-system scenarios, mostly waiting on compressed timers) are dealt out evenly
    and each worker starts on its share of them: the xdist workers then finish on short tests instead of
    one waiting out a long one at the end, and a scenario's waits overlap other tests' CPU from the
    start. Order within each group is kept."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    items[:] = dealt(items, workers, slow=lambda item: item.get_closest_marker("slow") is not None)


def dealt(items: list[Any], workers: int, slow: Any) -> list[Any]:
    """`items` in `workers` runs, one after the other, each its share of the `slow` ones (dealt in turn)
    then its share of the rest: xdist's worksteal hands each worker one run, in order, as it cuts the
    list at the start (len // workers left, then so on), so each worker starts on slow tests. Before,
    every slow test went first in one list, and so to the first worker alone."""
    slow_items = [item for item in items if slow(item)]
    rest = [item for item in items if not slow(item)]
    sizes, left = [], len(items)
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    runs: list[list[Any]] = [[] for _ in range(workers)]
    for index, item in enumerate(slow_items):
        runs[index % workers].append(item)
    for run, size in zip(runs, sizes, strict=True):
        while len(run) < size and rest:
            run.append(rest.pop(0))
    return [item for run in runs for item in run] + rest
