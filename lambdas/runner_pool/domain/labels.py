"""The `runs-on` label grammar of DESIGN.md section 2, and the runner spec a label resolves to.

    pool=<run id>[/class=<name>][/usage=spot|on-demand][/types=<glob>+<glob>...]
                 [/arch=x64|arm64][/max-runtime=<minutes>][/fresh=true]

`pool` comes first; the optional keys follow in any order, each at most once. The label is also
the run key: the runner is registered with exactly this string, so `format` gives back, character
for character, the text that `parse` read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from runner_pool.domain.records import Arch, UsageClass

POOL_PREFIX = "pool="
MAX_RUNTIME_LIMIT_MINUTES = 7200
"""GitHub stops a self-hosted job after 5 days; a longer runtime could never be used."""

OPTIONAL_KEYS = ("class", "usage", "types", "arch", "max-runtime", "fresh")

_RUN_ID = re.compile(r"[1-9][0-9]{0,19}")
CLASS_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_TYPE_GLOB = re.compile(r"[a-z0-9*][a-z0-9.*-]{0,29}")
"""One `types=` glob, as CreateFleet takes it in InstanceRequirements.AllowedInstanceTypes: "*" is the
only wildcard, each entry 1 to 30 characters of `[a-zA-Z0-9.*-]` (botocore's EC2 model, shape
AllowedInstanceType; EC2 API reference, InstanceRequirementsRequest), lowercase as type names are.
A glob outside it was accepted here and failed every CreateFleet (issue 12, defect 10)."""
MAX_TYPE_GLOBS = 400
"""AllowedInstanceTypes holds at most 400 entries (botocore's EC2 model, AllowedInstanceTypeSet)."""
_MINUTES = re.compile(r"[1-9][0-9]{0,5}")
_Choice = TypeVar("_Choice", UsageClass, Arch)


class LabelError(ValueError):
    """A `pool=` label that cannot be served; `reason` says what to change."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(f"label {label!r} is not served: {reason}")
        self.label = label
        self.reason = reason


def is_pool_label(text: str) -> bool:
    """Whether a label is meant for us at all; labels that are not are none of our business."""
    return text.startswith(POOL_PREFIX)


@dataclass(frozen=True)
class RunnerLabel:
    """A parsed label: what the job asked for, and nothing filled in yet."""

    run_id: str
    resource_class: str | None = None
    usage: UsageClass | None = None
    types: tuple[str, ...] | None = None
    arch: Arch | None = None
    max_runtime_minutes: int | None = None
    fresh: bool | None = None
    """`fresh=true`: this job takes a newly launched instance, never one from the pool."""
    key_order: tuple[str, ...] = field(default=())
    """The optional keys in the order they were written; empty means the canonical order."""

    def __post_init__(self) -> None:
        given = tuple(key for key in OPTIONAL_KEYS if self._value_text(key) is not None)
        if not self.key_order:
            object.__setattr__(self, "key_order", given)
        elif sorted(self.key_order) != sorted(given):
            raise ValueError(f"key_order {self.key_order} does not name exactly the keys given {given}")

    @classmethod
    def parse(cls, text: str) -> RunnerLabel:
        if not is_pool_label(text):
            raise LabelError(text, "a runner-pool label starts with 'pool=<run id>'")
        parts = text.split("/")
        values: dict[str, str] = {}
        for index, part in enumerate(parts):
            key, sep, value = part.partition("=")
            if not sep:
                raise LabelError(
                    text, f"part {index + 1} ({part!r}) is not key=value; separate parts with '/'"
                )
            if index == 0:
                values["pool"] = value
                continue
            if key == "pool":
                raise LabelError(text, "'pool' must appear once, as the first part")
            if key not in OPTIONAL_KEYS:
                raise LabelError(text, f"unknown key {key!r}; the keys are {', '.join(OPTIONAL_KEYS)}")
            if key in values:
                raise LabelError(text, f"key {key!r} appears twice; give each key once")
            values[key] = value
        return cls(
            run_id=_parse_run_id(text, values["pool"]),
            resource_class=_parse_class(text, values.get("class")),
            usage=_parse_choice(text, "usage", values.get("usage"), UsageClass),
            types=_parse_types(text, values.get("types")),
            arch=_parse_choice(text, "arch", values.get("arch"), Arch),
            max_runtime_minutes=_parse_minutes(text, values.get("max-runtime")),
            fresh=_parse_fresh(text, values.get("fresh")),
            key_order=tuple(values)[1:],
        )

    def format(self) -> str:
        parts = [f"pool={self.run_id}"]
        parts.extend(f"{key}={self._value_text(key)}" for key in self.key_order)
        return "/".join(parts)

    def __str__(self) -> str:
        return self.format()

    def _value_text(self, key: str) -> str | None:
        match key:
            case "class":
                return self.resource_class
            case "usage":
                return None if self.usage is None else self.usage.value
            case "types":
                return None if self.types is None else "+".join(self.types)
            case "arch":
                return None if self.arch is None else self.arch.value
            case "max-runtime":
                return None if self.max_runtime_minutes is None else str(self.max_runtime_minutes)
            case "fresh":
                return None if self.fresh is None else "true"
        raise KeyError(key)


class RunnerSpec(BaseModel):
    """A label with the stack's defaults filled in: what a runner for this run must be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_key: str
    run_id: str
    resource_class: str
    cpu: int
    memory_mib: int
    usage: UsageClass
    types: tuple[str, ...]
    """Allowed instance-type globs; empty means any type of the class's size."""
    arch: Arch
    max_runtime_minutes: int
    fresh: bool = False
    """The job asked for a newly launched instance (`fresh=true`): pickup is skipped."""

    def allows_type(self, instance_type: str) -> bool:
        return not self.types or any(fnmatchcase(instance_type, glob) for glob in self.types)


def _parse_run_id(text: str, value: str) -> str:
    if not _RUN_ID.fullmatch(value):
        raise LabelError(text, f"pool={value!r} is not a run id; use pool=${{{{ github.run_id }}}}")
    return value


def _parse_class(text: str, value: str | None) -> str | None:
    if value is not None and not CLASS_NAME.fullmatch(value):
        raise LabelError(text, f"class={value!r} is not a class name (lowercase letters, digits, '-')")
    return value


def _parse_choice(text: str, key: str, value: str | None, choices: type[_Choice]) -> _Choice | None:
    if value is None:
        return None
    try:
        return choices(value)
    except ValueError:
        allowed = " or ".join(choice.value for choice in choices)
        raise LabelError(text, f"{key}={value!r} is not allowed; use {key}={allowed}") from None


def _parse_types(text: str, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    globs = tuple(value.split("+"))
    for glob in globs:
        if not _TYPE_GLOB.fullmatch(glob):
            raise LabelError(
                text,
                f"types entry {glob!r} is not an instance-type glob such as c7i.large or m7* "
                "(lowercase letters, digits, '.', '-' and '*', at most 30 characters); join several with '+'",
            )
    if len(set(globs)) != len(globs):
        raise LabelError(text, "types lists the same glob twice; give each once")
    if len(globs) > MAX_TYPE_GLOBS:
        raise LabelError(text, f"types lists {len(globs)} globs; EC2 takes at most {MAX_TYPE_GLOBS}")
    return globs


def _parse_minutes(text: str, value: str | None) -> int | None:
    if value is None:
        return None
    if not _MINUTES.fullmatch(value) or int(value) > MAX_RUNTIME_LIMIT_MINUTES:
        raise LabelError(
            text, f"max-runtime={value!r} must be whole minutes from 1 to {MAX_RUNTIME_LIMIT_MINUTES}"
        )
    return int(value)


def _parse_fresh(text: str, value: str | None) -> bool | None:
    """Only `fresh=true`: a `fresh=false` would be the default written out, and a second spelling of
    one run key."""
    if value is None:
        return None
    if value != "true":
        raise LabelError(text, f"fresh={value!r} is not allowed; write fresh=true or leave the key out")
    return True
