"""The `runs-on` label grammar of DESIGN.md section 2, and the runner spec a label resolves to.

    pool=<run id>[/<key>=<value>]...
    pool=instant/class=<class>

The second form is a class's instant tier (DESIGN.md 5.1, README "Which label"): pristine instances
whose runners wait registered with exactly that label, so GitHub gives a job that asks for it to one of
them with no step of ours in between. GitHub gives a job only to a runner that carries every label it
lists, compared without case ("Using self-hosted runners in a workflow": "jobs will be queued on runners
that have all the labels that you specify"; "Using labels with self-hosted runners": "Labels are
case-insensitive"), so the tier's label has one spelling: `class=` and nothing else, lowercase.

`pool` comes first; the optional keys follow in any order, each at most once. Every optional key is
one row of LABEL_KEYS, which says how its value is read and written, what a label without it gets
(a stack config default or a fixed one), which CreateFleet parameters it reaches and how it filters
pickup; the README's label table is generated from the same rows. The label is also the run key:
the runner is registered with exactly this string, so `format` gives back, character for character,
the text that `parse` read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from runner_pool.domain.records import Arch, PoolMessage, UsageClass

POOL_PREFIX = "pool="
INSTANT_RUN_ID = "instant"
"""In place of a run id: any run's job may take the instance tier's runners (`instant_label`)."""
MAX_RUNTIME_LIMIT_MINUTES = 7200
"""GitHub stops a self-hosted job after 5 days; a longer runtime could never be used."""

_RUN_ID = re.compile(r"[1-9][0-9]{0,19}")
CLASS_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_TYPE_GLOB = re.compile(r"[a-z0-9*][a-z0-9.*-]{0,29}")
"""One `types=` glob, as CreateFleet takes it in InstanceRequirements.AllowedInstanceTypes: "*" is the
only wildcard, each entry 1 to 30 characters of `[a-zA-Z0-9.*-]` (botocore's EC2 model, shape
AllowedInstanceType; EC2 API reference, InstanceRequirementsRequest), lowercase as type names are.
A glob outside it was accepted here and failed every CreateFleet."""
MAX_TYPE_GLOBS = 400
"""AllowedInstanceTypes holds at most 400 entries (botocore's EC2 model, AllowedInstanceTypeSet)."""
_MINUTES = re.compile(r"[1-9][0-9]{0,5}")
_Value = TypeVar("_Value")
_Choice = TypeVar("_Choice", UsageClass, Arch)


class LabelError(ValueError):
    """A `pool=` label that cannot be served; `reason` says what to change."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(f"label {label!r} is not served: {reason}")
        self.label = label
        self.reason = reason


class _RefusedError(ValueError):
    """A key's parser refusing its value; the message is the reason the user reads."""


def is_pool_label(text: str) -> bool:
    """Whether a label is meant for us at all; labels that are not are none of our business."""
    return text.startswith(POOL_PREFIX)


def instant_label(resource_class: str) -> str:
    """The generic label of a class's instant tier: its waiting runners are registered with it."""
    return f"{POOL_PREFIX}{INSTANT_RUN_ID}/class={resource_class}"


def instant_class(text: str) -> str | None:
    """The class whose instant tier a label names, compared as GitHub compares labels (without case);
    None for any other label."""
    head, slash, rest = text.lower().partition("/")
    if head != f"{POOL_PREFIX}{INSTANT_RUN_ID}" or not slash:
        return None
    key, sep, value = rest.partition("=")
    if key != "class" or not sep or not CLASS_NAME.fullmatch(value):
        return None
    return value


# --- the table of keys ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NotUsed:
    """A key that takes no part in a stage on purpose; `why` is what a reader of the table needs."""

    why: str


@dataclass(frozen=True)
class ConfigDefault:
    """A stack-wide default: the setting `defaults.<attribute>` of the stack config, of this type."""

    annotation: Any
    value: Any
    limits: Mapping[str, Any] = field(default_factory=dict)
    """Pydantic's bounds on the setting (`gt`, `le`)."""

    def setting(self) -> tuple[Any, FieldInfo]:
        """The setting as pydantic's create_model takes it."""
        return self.annotation, Field(self.value, **self.limits)


@dataclass(frozen=True)
class FixedDefault:
    """A default no config changes; `readme` is how the label table shows it."""

    value: object
    readme: str


PickupFilter = Callable[[PoolMessage, "RunnerSpec"], bool]
"""Whether a pooled instance (its message) can serve a spec, as far as one key is concerned."""


@dataclass(frozen=True)
class LabelKey(Generic[_Value]):
    """One optional key of the label, everything about it in one row."""

    name: str
    """As written in the label: `max-runtime`."""
    attribute: str
    """The attribute holding its value on RunnerLabel and RunnerSpec, and its `defaults.` setting."""
    parse: Callable[[str], _Value]
    """The value text to a value; raises _RefusedError with what to write instead."""
    format: Callable[[_Value], str]
    """A value back to exactly the text `parse` read."""
    values: str
    """The README's description of what the key takes."""
    default: ConfigDefault | FixedDefault
    fleet: tuple[str, ...] | NotUsed
    """The RunnerSpec fields it resolves to that a LaunchRequest (so CreateFleet) carries."""
    pickup: PickupFilter | NotUsed
    """What it asks of a pooled instance; every filter must pass for pickup to offer one."""
    examples: tuple[str, ...]
    """Value texts the key accepts, at least two unless it has one value: the table's tests use them."""

    def default_value(self, defaults: BaseModel) -> _Value:
        """What a label without the key gets, from the stack config's `defaults` or the fixed one."""
        if isinstance(self.default, FixedDefault):
            return self.default.value  # type: ignore[return-value]
        return getattr(defaults, self.attribute)  # type: ignore[no-any-return]

    def readme_row(self) -> str:
        if isinstance(self.default, FixedDefault):
            default = self.default.readme
        else:
            shown = self.format(self.default.value)
            default = f"`defaults.{self.attribute}` ({f'`{shown}`' if shown else 'any'})"
        return f"| `{self.name}` | no | {self.values} | {default} |"


def _class_name(value: str) -> str:
    if not CLASS_NAME.fullmatch(value):
        raise _RefusedError(f"class={value!r} is not a class name (lowercase letters, digits, '-')")
    return value


def _choice(key: str, choices: type[_Choice]) -> Callable[[str], _Choice]:
    def parse(value: str) -> _Choice:
        try:
            return choices(value)
        except ValueError:
            allowed = " or ".join(choice.value for choice in choices)
            raise _RefusedError(f"{key}={value!r} is not allowed; use {key}={allowed}") from None

    return parse


def _types(value: str) -> tuple[str, ...]:
    globs = tuple(value.split("+"))
    for glob in globs:
        if not _TYPE_GLOB.fullmatch(glob):
            raise _RefusedError(
                f"types entry {glob!r} is not an instance-type glob such as c7i.large or m7* "
                "(lowercase letters, digits, '.', '-' and '*', at most 30 characters); join several with '+'"
            )
    if len(set(globs)) != len(globs):
        raise _RefusedError("types lists the same glob twice; give each once")
    if len(globs) > MAX_TYPE_GLOBS:
        raise _RefusedError(f"types lists {len(globs)} globs; EC2 takes at most {MAX_TYPE_GLOBS}")
    return globs


def _minutes(value: str) -> int:
    if not _MINUTES.fullmatch(value) or int(value) > MAX_RUNTIME_LIMIT_MINUTES:
        raise _RefusedError(
            f"max-runtime={value!r} must be whole minutes from 1 to {MAX_RUNTIME_LIMIT_MINUTES}"
        )
    return int(value)


def _fresh(value: str) -> bool:
    """Only `fresh=true`: a `fresh=false` would be the default written out, and a second spelling of
    one run key."""
    if value != "true":
        raise _RefusedError(f"fresh={value!r} is not allowed; write fresh=true or leave the key out")
    return True


LABEL_KEYS: tuple[LabelKey[Any], ...] = (
    LabelKey[str](
        name="class",
        attribute="resource_class",
        parse=_class_name,
        format=str,
        values="a resource class of the stack config",
        default=ConfigDefault(str, "large"),
        # The class resolves to its size (StackConfig.resolve): CreateFleet's VCpuCount and MemoryMiB.
        fleet=("resource_class", "cpu", "memory_mib"),
        # The class also names the queue pickup reads; an instance of it has at least its size.
        pickup=lambda message, spec: message.cpu >= spec.cpu and message.memory_mib >= spec.memory_mib,
        examples=("xlarge", "2xlarge"),
    ),
    LabelKey[UsageClass](
        name="usage",
        attribute="usage",
        parse=_choice("usage", UsageClass),
        format=lambda usage: usage.value,
        values="`spot` or `on-demand`",
        default=ConfigDefault(UsageClass, UsageClass.SPOT),
        fleet=("usage",),
        pickup=lambda message, spec: message.usage_class is spec.usage,
        examples=("spot", "on-demand"),
    ),
    LabelKey[tuple[str, ...]](
        name="types",
        attribute="types",
        parse=_types,
        format="+".join,
        values=(
            "instance-type globs joined by `+`, e.g. `c7*+m7i.large`; as EC2 takes them: `*` the only "
            "wildcard, at most 30 characters each, at most 400"
        ),
        default=ConfigDefault(tuple[str, ...], ()),
        fleet=("types",),
        pickup=lambda message, spec: spec.allows_type(message.instance_type),
        examples=("c7*+m7*", "r7i.large"),
    ),
    LabelKey[Arch](
        name="arch",
        attribute="arch",
        parse=_choice("arch", Arch),
        format=lambda arch: arch.value,
        values="`x64` or `arm64`",
        default=ConfigDefault(Arch, Arch.X64),
        fleet=("arch",),
        pickup=lambda message, spec: message.arch is spec.arch,
        examples=("x64", "arm64"),
    ),
    LabelKey[int](
        name="max-runtime",
        attribute="max_runtime_minutes",
        parse=_minutes,
        format=str,
        values=f"whole minutes, 1 to {MAX_RUNTIME_LIMIT_MINUTES}",
        default=ConfigDefault(int, 360, {"gt": 0, "le": MAX_RUNTIME_LIMIT_MINUTES}),
        fleet=NotUsed("the running threshold set when the runner goes running, not what is launched"),
        pickup=NotUsed("an idle instance's runtime starts when it goes running, so any can serve any"),
        examples=("30", "7200"),
    ),
    LabelKey[bool](
        name="fresh",
        attribute="fresh",
        parse=_fresh,
        format=lambda _: "true",
        values=(
            "`true`: this job is served single use: a pristine instance (booted, never used by a job) "
            "from the pool when there is one, else a newly launched one; terminated after the job"
        ),
        default=FixedDefault(False, "not fresh"),
        fleet=NotUsed("a fresh job's instances are launched like any other; it takes only pristine ones"),
        # A fresh job is single use (domain/provision.py `single_use`), and pickup offers a single-use job
        # pristine instances only; the filter says the same where the label is judged, so no path can
        # hand a fresh job a used instance.
        pickup=lambda message, spec: not spec.fresh or message.pristine,
        examples=("true",),
    ),
)
"""Every optional key, in the canonical order of a label built in code."""

KEYS: Mapping[str, LabelKey[Any]] = {key.name: key for key in LABEL_KEYS}
OPTIONAL_KEYS = tuple(KEYS)


def label_table() -> str:
    """The README's label table, generated from LABEL_KEYS."""
    head = [
        "| key | required | values | default |",
        "|---|---|---|---|",
        "| `pool` | yes, first | the workflow run id: `${{ github.run_id }}` | |",
    ]
    return "\n".join(head + [key.readme_row() for key in LABEL_KEYS]) + "\n"


# --- labels and specs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerLabel:
    """A parsed label: what the job asked for, and nothing filled in yet.

    One attribute per row of LABEL_KEYS (`attribute`), None when the label leaves the key out."""

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
        given = tuple(key.name for key in LABEL_KEYS if getattr(self, key.attribute) is not None)
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
            if key not in KEYS:
                raise LabelError(text, f"unknown key {key!r}; the keys are {', '.join(OPTIONAL_KEYS)}")
            if key in values:
                raise LabelError(text, f"key {key!r} appears twice; give each key once")
            values[key] = value
        if values["pool"] == INSTANT_RUN_ID:
            return _instant(text, values)
        run_id = _parse_run_id(text, values["pool"])
        parsed: dict[str, Any] = {}
        for label_key in LABEL_KEYS:
            if label_key.name in values:
                try:
                    parsed[label_key.attribute] = label_key.parse(values[label_key.name])
                except _RefusedError as refused:
                    raise LabelError(text, str(refused)) from None
        return cls(run_id=run_id, key_order=tuple(values)[1:], **parsed)

    @property
    def instant(self) -> bool:
        """A class's instant tier, not one run's (`instant_label`)."""
        return self.run_id == INSTANT_RUN_ID

    def format(self) -> str:
        parts = [f"pool={self.run_id}"]
        parts.extend(
            f"{name}={KEYS[name].format(getattr(self, KEYS[name].attribute))}" for name in self.key_order
        )
        return "/".join(parts)

    def __str__(self) -> str:
        return self.format()


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

    def fits(self, message: PoolMessage) -> bool:
        """Whether the pooled instance can serve this spec: every key's pickup filter passes."""
        return all(key.pickup(message, self) for key in LABEL_KEYS if not isinstance(key.pickup, NotUsed))


def _instant(text: str, values: Mapping[str, str]) -> RunnerLabel:
    """`pool=instant/class=<class>`: the tier's runners carry exactly this label, so a job asking for any
    other key, or none, would never be given one."""
    resource_class = values.get("class")
    if set(values) != {"pool", "class"} or resource_class is None:
        raise LabelError(text, "the instant tier's label is pool=instant/class=<class>, with no other key")
    try:
        return RunnerLabel(run_id=INSTANT_RUN_ID, resource_class=_class_name(resource_class))
    except _RefusedError as refused:
        raise LabelError(text, str(refused)) from None


def _parse_run_id(text: str, value: str) -> str:
    if not _RUN_ID.fullmatch(value):
        raise LabelError(text, f"pool={value!r} is not a run id; use pool=${{{{ github.run_id }}}}")
    return value
