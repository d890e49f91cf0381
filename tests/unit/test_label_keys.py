"""Each label key is one row of LABEL_KEYS, and every part of the product that knows the key follows it.

A row that leaves a column out does not build (every column is a required argument); these tests fail
when a column is there but not true: a key that does not round-trip, a default that is not a setting,
a key said to reach CreateFleet that does not change the request (or one said not to that does), a
pickup filter that filters nothing, a README table that is not the generated one.
Run as a module (`uv run --frozen python -m tests.unit.test_label_keys`) to rewrite the README's table.
"""

from __future__ import annotations

import dataclasses
import sys
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from runner_pool.adapters.fleet import RUN_KEY_TAG, Fleet, FleetSetup, LaunchTemplate
from runner_pool.domain.config import LabelDefaults, StackConfig
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.labels import (
    LABEL_KEYS,
    ConfigDefault,
    FixedDefault,
    LabelKey,
    NotUsed,
    RunnerLabel,
    RunnerSpec,
    label_table,
)
from runner_pool.domain.pickup import Verdict, judge
from runner_pool.domain.records import Arch, PoolMessage
from runner_pool.domain.trust import TrustLevel

README = Path(__file__).resolve().parents[2] / "README.md"
START = "<!-- labels:start (generated from LABEL_KEYS: uv run --frozen python -m tests.unit.test_label_keys) -->\n"
END = "<!-- labels:end -->\n"
NOW = 1_800_000_000.0
INSTANCE_TYPES = ("c7i.large", "r7i.large", "m7g.large", "c7g.xlarge")
"""Types a pooled instance may have; the message for a spec takes the first the spec allows."""

KEYS = pytest.mark.parametrize("key", LABEL_KEYS, ids=[key.name for key in LABEL_KEYS])


def _readme_table() -> str:
    return README.read_text().split(START)[1].split(END)[0]


def _variants(key: LabelKey[Any]) -> list[RunnerSpec]:
    """The spec of a label without the key, and of one with each of its example values."""
    texts = ["pool=1"] + [f"pool=1/{key.name}={example}" for example in key.examples]
    return [StackConfig().spec_for(text) for text in texts]


def _fleet_request(spec: RunnerSpec) -> dict[str, Any]:
    """CreateFleet's parameters for the spec, less what names the launch rather than what it launches."""
    setup = FleetSetup(
        subnet_ids=("subnet-0a1b2c3d",),
        templates={Arch.X64: LaunchTemplate("lt-x64"), Arch.ARM64: LaunchTemplate("lt-arm64")},
        stack_tag_key="runner-pool:stack",
        stack_tag_value="test",
    )
    request = Fleet(setup, client=object()).fleet_request(  # type: ignore[arg-type]
        LaunchRequest.for_run(spec, count=1, idempotency_key="launch")
    )
    params: dict[str, Any] = {**request}
    params.pop("ClientToken")
    params["TagSpecifications"] = [
        {**tags, "Tags": [tag for tag in tags["Tags"] if tag["Key"] != RUN_KEY_TAG]}
        for tags in params["TagSpecifications"]
    ]
    return params


def _message_for(spec: RunnerSpec) -> PoolMessage:
    """A pooled instance of exactly the spec's size and kind, that served a trusted job (a fresh job
    takes only pristine ones)."""
    return PoolMessage(
        instance_id="i-0123456789abcdef0",
        resource_class=spec.resource_class,
        instance_type=next(t for t in INSTANCE_TYPES if spec.allows_type(t)),
        usage_class=spec.usage,
        arch=spec.arch,
        cpu=spec.cpu,
        memory_mib=spec.memory_mib,
        threshold=NOW + 600,
        trust=TrustLevel.TRUSTED,
    )


def test_readme_label_table_is_the_generated_one() -> None:
    # Given the README and the table of keys / Then the README's label table is generated from it
    assert _readme_table() == label_table(), (
        "README's label table differs from LABEL_KEYS; rewrite it: "
        "uv run --frozen python -m tests.unit.test_label_keys"
    )


def test_labels_and_specs_carry_exactly_the_keys_of_the_table() -> None:
    # Given the label and spec models / Then each key has its attribute on both, and the label no other
    attributes = {key.attribute for key in LABEL_KEYS}
    label_fields = {f.name for f in dataclasses.fields(RunnerLabel)} - {"run_id", "key_order"}
    assert label_fields == attributes
    assert attributes <= set(RunnerSpec.model_fields)
    assert len({key.name for key in LABEL_KEYS}) == len(LABEL_KEYS)


@KEYS
def test_each_example_round_trips_and_resolves(key: LabelKey[Any]) -> None:
    # Given the key's example values / When each is parsed, formatted and resolved in a label
    for example in key.examples:
        text = f"pool=3/{key.name}={example}"
        label = RunnerLabel.parse(text)
        # Then it formats back to the same text, byte for byte (the run key), and resolves to the value
        assert label.format() == text
        assert key.format(key.parse(example)) == example
        assert getattr(StackConfig().spec_for(text), key.attribute) == key.parse(example)


@KEYS
def test_each_key_has_at_least_two_resolved_values(key: LabelKey[Any]) -> None:
    # Given the default and the examples / Then they differ, so the tests below compare something
    assert len({getattr(spec, key.attribute) for spec in _variants(key)}) >= 2


@KEYS
def test_each_config_default_is_a_setting_with_that_default(key: LabelKey[Any]) -> None:
    # Given a key whose default the stack config sets / Then `defaults.<attribute>` is that setting
    defaults = StackConfig().defaults
    if isinstance(key.default, ConfigDefault):
        assert getattr(defaults, key.attribute) == key.default.value
        assert getattr(StackConfig().spec_for("pool=1"), key.attribute) == key.default.value
    else:
        assert isinstance(key.default, FixedDefault)
        assert key.attribute not in LabelDefaults.model_fields
        assert getattr(StackConfig().spec_for("pool=1"), key.attribute) == key.default.value


def test_a_config_default_reaches_a_label_without_the_key() -> None:
    # Given a stack whose defaults differ from the design's for every key that has a setting
    changed = {
        key.attribute: key.parse(key.examples[-1])
        for key in LABEL_KEYS
        if isinstance(key.default, ConfigDefault)
    }
    assert all(value != getattr(StackConfig().defaults, attribute) for attribute, value in changed.items())
    config = StackConfig.model_validate({"defaults": changed})
    # When a label with no keys is resolved / Then it gets each configured default
    spec = config.spec_for("pool=1")
    assert {attribute: getattr(spec, attribute) for attribute in changed} == changed


@KEYS
def test_the_fleet_column_is_what_reaches_create_fleet(key: LabelKey[Any]) -> None:
    # Given the specs of a label without the key and with each example
    specs = _variants(key)
    requests = [_fleet_request(spec) for spec in specs]
    distinct_requests = [r for i, r in enumerate(requests) if r not in requests[:i]]
    if isinstance(key.fleet, NotUsed):
        # Then a key that does not reach the fleet leaves CreateFleet's request as it was
        assert len(distinct_requests) == 1, key.fleet.why
    else:
        # Then every value the key resolves to asks CreateFleet for something else
        assert set(key.fleet) <= set(LaunchRequest.model_fields) & set(RunnerSpec.model_fields)
        resolved = {tuple(getattr(spec, name) for name in key.fleet) for spec in specs}
        assert len(distinct_requests) == len(resolved)


@KEYS
def test_the_pickup_column_is_what_pickup_filters_on(key: LabelKey[Any]) -> None:
    # Given the specs of a label without the key and with each example, and an instance made for each
    specs = _variants(key)
    # When each instance is judged for each spec
    verdicts = {
        (a, b): judge(_message_for(specs[a]), specs[b], NOW) for a, b in product(range(len(specs)), repeat=2)
    }
    if isinstance(key.pickup, NotUsed):
        # Then a key that does not filter pickup lets every instance serve every value of it
        assert set(verdicts.values()) == {Verdict.MATCH}, key.pickup.why
    else:
        # Then one value of the key turns away an instance another value of it takes
        assert Verdict.MATCH in verdicts.values()
        assert Verdict.REQUEUE in verdicts.values()


def _rewrite_readme() -> None:
    text = README.read_text()
    before, rest = text.split(START)
    after = rest.split(END)[1]
    README.write_text(before + START + label_table() + END + after)


if __name__ == "__main__":
    _rewrite_readme()
    sys.exit(0)
