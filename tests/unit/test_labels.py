"""The label grammar of DESIGN.md section 2: parse, format, round-trip, and rejections a user can act on."""

from __future__ import annotations

import re

import botocore.session
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import (
    LABEL_KEYS,
    MAX_TYPE_GLOBS,
    OPTIONAL_KEYS,
    LabelError,
    RunnerLabel,
    is_pool_label,
)
from runner_pool.domain.records import Arch, UsageClass

type_globs = st.lists(
    st.from_regex(r"[a-z0-9*][a-z0-9.*-]{0,12}", fullmatch=True), min_size=1, max_size=4, unique=True
).map(tuple)


VALUES: dict[str, st.SearchStrategy[object]] = {
    "class": st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}", fullmatch=True),
    "usage": st.sampled_from(UsageClass),
    "types": type_globs,
    "arch": st.sampled_from(Arch),
    "max-runtime": st.integers(1, 7200),
}
"""Wider values than a key's examples, for the keys that have many; any other key draws its examples."""


@st.composite
def labels(draw: st.DrawFn) -> RunnerLabel:
    order = tuple(draw(st.permutations(OPTIONAL_KEYS))[: draw(st.integers(0, len(OPTIONAL_KEYS)))])
    values = {
        key.attribute: draw(VALUES.get(key.name, st.sampled_from(key.examples).map(key.parse)))
        for key in LABEL_KEYS
        if key.name in order
    }
    return RunnerLabel(run_id=str(draw(st.integers(1, 10**19))), key_order=order, **values)


def test_full_label_parses_into_its_parts() -> None:
    # Given the label of DESIGN.md section 2
    text = "pool=12345/class=large/usage=spot/types=c7*+m7*"
    # When it is parsed
    label = RunnerLabel.parse(text)
    # Then every key is read and nothing else is filled in
    assert label.run_id == "12345"
    assert label.resource_class == "large"
    assert label.usage is UsageClass.SPOT
    assert label.types == ("c7*", "m7*")
    assert label.arch is None
    assert label.max_runtime_minutes is None


@given(labels())
def test_formatting_then_parsing_gives_the_same_label(label: RunnerLabel) -> None:
    # Given any valid label / When formatted and parsed back / Then nothing changed
    assert RunnerLabel.parse(label.format()) == label


@given(labels())
def test_parsing_then_formatting_gives_the_same_text(label: RunnerLabel) -> None:
    # Given a valid label text in any key order / When parsed and formatted / Then exactly the same text
    text = label.format()
    assert RunnerLabel.parse(text).format() == text


@given(st.text(alphabet=st.sampled_from("pol=/c1a-s+*.?Xx9 _"), max_size=40).map(lambda tail: "pool=" + tail))
def test_any_pool_text_parses_exactly_or_is_rejected_with_a_reason(text: str) -> None:
    # Given arbitrary text that claims to be ours
    # When it is parsed
    try:
        label = RunnerLabel.parse(text)
    except LabelError as error:
        # Then either it is refused with a reason that quotes the label
        assert error.reason
        assert text in str(error)
    else:
        # Or it is a label that formats back to exactly that text
        assert label.format() == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("pool=", "is not a run id"),
        ("pool=abc", "is not a run id"),
        ("pool=012", "is not a run id"),
        ("pool=1/", "is not key=value"),
        ("pool=1//class=large", "is not key=value"),
        (
            "pool=1/size=large",
            "unknown key 'size'; the keys are class, usage, types, arch, max-runtime, fresh",
        ),
        ("pool=1/class=large/class=xlarge", "key 'class' appears twice"),
        ("pool=1/pool=2", "'pool' must appear once"),
        ("pool=1/class=Large", "is not a class name"),
        ("pool=1/usage=Spot", "use usage=spot or on-demand"),
        ("pool=1/arch=amd64", "use arch=x64 or arm64"),
        ("pool=1/types=", "is not an instance-type glob"),
        ("pool=1/types=c7*+", "is not an instance-type glob"),
        ("pool=1/types=c7*+c7*", "lists the same glob twice"),
        ("pool=1/types=C7*", "is not an instance-type glob"),
        # EC2's own rules for AllowedInstanceTypes (issue 12, defect 10): "*" only, 30 characters
        ("pool=1/types=c7?.large", "is not an instance-type glob"),
        ("pool=1/types=" + "c" * 31, "is not an instance-type glob"),
        ("pool=1/types=" + "+".join(f"c{n}*" for n in range(401)), "EC2 takes at most 400"),
        ("pool=1/max-runtime=0", "whole minutes from 1 to 7200"),
        ("pool=1/max-runtime=7201", "whole minutes from 1 to 7200"),
        ("pool=1/max-runtime=060", "whole minutes from 1 to 7200"),
        ("pool=1/max-runtime=1.5", "whole minutes from 1 to 7200"),
        ("run=1", "starts with 'pool=<run id>'"),
        ("pool=1/fresh=false", "write fresh=true or leave the key out"),
        ("pool=1/fresh=True", "write fresh=true or leave the key out"),
    ],
)
def test_bad_label_is_rejected_with_an_actionable_reason(text: str, reason: str) -> None:
    # Given a malformed label / When parsed / Then refused, and the reason says what to change
    with pytest.raises(LabelError) as refused:
        RunnerLabel.parse(text)
    assert reason in refused.value.reason
    assert refused.value.label == text


def test_key_order_must_name_exactly_the_keys_given() -> None:
    # Given a label built in code whose key order names a key that has no value
    # When it is built / Then it is refused: such a label could not round-trip
    with pytest.raises(ValueError, match="does not name exactly the keys given"):
        RunnerLabel(run_id="1", resource_class="large", key_order=("class", "usage"))


def test_label_built_in_code_formats_in_canonical_order() -> None:
    # Given a label built without an explicit key order
    label = RunnerLabel(run_id="7", arch=Arch.ARM64, resource_class="xlarge")
    # When formatted / Then keys come in the grammar's order
    assert label.format() == "pool=7/class=xlarge/arch=arm64"


def test_only_pool_labels_are_ours() -> None:
    assert is_pool_label("pool=1")
    assert not is_pool_label("self-hosted")
    assert not is_pool_label("ubuntu-latest")


def test_resolving_fills_missing_keys_with_stack_defaults() -> None:
    # Given the default stack configuration and a label that gives only the run
    config = StackConfig()
    # When resolved
    spec = config.spec_for("pool=99")
    # Then the defaults of DESIGN.md section 9 apply and the run key is the label itself
    assert spec.run_key == "pool=99"
    assert (spec.resource_class, spec.cpu, spec.memory_mib) == ("large", 2, 4096)
    assert spec.usage is UsageClass.SPOT
    assert spec.arch is Arch.X64
    assert spec.types == ()
    assert spec.max_runtime_minutes == 360


def test_resolving_keeps_what_the_label_asked_for() -> None:
    spec = StackConfig().spec_for(
        "pool=5/max-runtime=30/class=4xlarge/usage=on-demand/arch=arm64/types=m7g.*"
    )
    assert (spec.resource_class, spec.cpu, spec.memory_mib) == ("4xlarge", 16, 32768)
    assert spec.usage is UsageClass.ON_DEMAND
    assert spec.arch is Arch.ARM64
    assert spec.types == ("m7g.*",)
    assert spec.max_runtime_minutes == 30
    assert spec.run_key == "pool=5/max-runtime=30/class=4xlarge/usage=on-demand/arch=arm64/types=m7g.*"


def test_unknown_class_is_rejected_naming_the_known_ones() -> None:
    # Given a label asking for a class the stack does not define
    # When resolved / Then refused with the classes the user can choose from
    with pytest.raises(LabelError) as refused:
        StackConfig().spec_for("pool=1/class=huge")
    assert (
        refused.value.reason
        == "class='huge' is not defined; use one of large, xlarge, 2xlarge, 4xlarge, 8xlarge"
    )


@pytest.mark.parametrize(
    ("types", "instance_type", "allowed"),
    [
        ("c7*+m7*", "c7i.large", True),
        ("c7*+m7*", "m7g.xlarge", True),
        ("c7*+m7*", "r7i.large", False),
        ("c7i.large", "c7i.large", True),
        ("c7i.large", "c7i.xlarge", False),
        ("m*i.*", "m7i.2xlarge", True),
    ],
)
def test_spec_allows_types_by_glob(types: str, instance_type: str, allowed: bool) -> None:
    assert StackConfig().spec_for(f"pool=1/types={types}").allows_type(instance_type) is allowed


def test_spec_without_types_allows_any_type() -> None:
    assert StackConfig().spec_for("pool=1").allows_type("anything.large")


def test_every_type_glob_the_grammar_accepts_is_one_ec2_accepts() -> None:
    # Given EC2's own model of AllowedInstanceTypes, as botocore ships it (the request CreateFleet validates)
    model = botocore.session.get_session().get_service_model("ec2")
    entry = model.shape_for("AllowedInstanceType").metadata
    entries = model.shape_for("AllowedInstanceTypeSet").metadata
    pattern = re.compile(entry["pattern"])
    # Then the longest and widest globs we accept are inside it, and one character more is refused
    for glob in ["c" * entry["max"], "*", "m7i-flex.*", "*3*", "r*"]:
        spec = RunnerLabel.parse(f"pool=1/types={glob}")
        assert spec.types == (glob,)
        assert pattern.fullmatch(glob)
        assert entry["min"] <= len(glob) <= entry["max"]
    with pytest.raises(LabelError):
        RunnerLabel.parse("pool=1/types=" + "c" * (entry["max"] + 1))
    assert entries["max"] == MAX_TYPE_GLOBS


def test_fresh_asks_for_a_newly_launched_instance() -> None:
    # Given a label with fresh=true (issue 14, item 2) / When resolved with the stack defaults
    spec = StackConfig().spec_for("pool=7/fresh=true")
    # Then the spec asks to skip the pool, and a label without the key does not
    assert spec.fresh
    assert not StackConfig().spec_for("pool=7").fresh
