"""The run key: which runners a job can take, as one string that every per-run record is keyed by.

GitHub gives a job only to a runner that carries every label of its `runs-on`, compared without
regard to case ("When you specify an array of labels, jobs will be queued on runners that have
all the labels that you specify", and "Labels are case-insensitive": docs.github.com, Actions,
"Using self-hosted runners in a workflow" and "Using labels with self-hosted runners"). A re-run
keeps `github.run_id` and counts up `run_attempt` ("Re-running workflows and jobs"), so our
`pool=${{ github.run_id }}/…` label is the same in every attempt of a run.

So one run key names one (pool label, run attempt, the job's other labels), and is written

    <pool label>[@<attempt>][ <other label> ...]

`@<attempt>` is left out for attempt 1 and the other labels, lowercased, deduplicated and sorted, are
each percent-encoded, so an attempt-1 job with only our label has that label as its run key, and
`parse(str(key)) == key` for every key. Everything kept per run (the state table's by-run-key index,
the run-finished mark, the demand ledger's run keys, the provision's and release's names and
inputs) is therefore kept per attempt and per full label set: a runner registered for one key is
never released, marked finished or handed a job by another.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import LabelError, RunnerLabel, RunnerSpec, is_pool_label
from runner_pool.domain.records import Arch

MAX_RUNNER_LABELS = 100
"""GitHub's REST API registers a JIT runner with 1 to 100 labels (`labels`, "Maximum items: 100",
POST …/actions/runners/generate-jitconfig). GitHub documents no length limit for one label."""
MAX_RUN_KEY_BYTES = 1024
"""The run key is a partition key of the by-run-key index and, prefixed, of the run-finished mark:
DynamoDB allows 2048 bytes for a partition key value (DynamoDB developer guide, "Service, account,
and table quotas": partition key length); half of that leaves room for the prefixes."""
OTHER_OPERATING_SYSTEMS = frozenset({"windows", "macos"})
"""Default OS labels GitHub gives runners of another OS ("linux, windows, or macOS"); ours run Linux."""
ARCH_LABELS: dict[str, Arch | None] = {"x64": Arch.X64, "arm64": Arch.ARM64, "arm": None}
"""GitHub's default architecture labels ("x64, ARM, or ARM64"); ARM (32-bit) is none of ours."""
_ATTEMPT = "@"
_SEPARATOR = " "
_SAFE = "".join(sorted(set(string.punctuation) - {"%"}))
"""Printable ASCII stays readable in a run key; a space, `%` and anything else is percent-encoded."""


@dataclass(frozen=True)
class RunKey:
    label: str
    """Our `pool=` label, exactly as the job wrote it."""
    attempt: int = 1
    others: tuple[str, ...] = ()
    """The job's other labels: lowercased, without repeats, sorted."""

    def __post_init__(self) -> None:
        if not is_pool_label(self.label) or _ATTEMPT in self.label or _SEPARATOR in self.label:
            raise ValueError(f"{self.label!r} is not a pool label a run key can hold")
        if self.attempt < 1:
            raise ValueError(f"run attempt {self.attempt} is not a run attempt")
        if self.others != _canonical(self.others) or any(map(is_pool_label, self.others)):
            raise ValueError(f"{self.others!r} are not canonical (lowercased, unique, sorted, not ours)")

    @classmethod
    def of_job(cls, labels: Sequence[str], attempt: int) -> RunKey:
        """The run key a queued job's `labels` ask for; LabelError (with the reason) for a set we
        cannot register a runner with."""
        ours = [label for label in labels if is_pool_label(label)]
        if len(ours) != 1:
            raise LabelError(" ".join(ours), f"a job takes one pool= label, this one has {len(ours)}")
        label = ours[0]
        others = _canonical([other for other in labels if other != label])
        if 1 + len(others) > MAX_RUNNER_LABELS:
            reason = (
                f"GitHub registers a runner with at most {MAX_RUNNER_LABELS} labels, not {1 + len(others)}"
            )
            raise LabelError(label, reason)
        if any(not other.strip() for other in others):
            raise LabelError(label, "the job lists an empty label")
        key = cls(label, attempt, others)
        if len(str(key).encode()) > MAX_RUN_KEY_BYTES:
            raise LabelError(
                label, f"its labels come to more than {MAX_RUN_KEY_BYTES} bytes; list fewer or shorter ones"
            )
        return key

    @classmethod
    def parse(cls, text: str) -> RunKey:
        """The key `str(key)` wrote; ValueError for any other text."""
        head, *others = text.split(_SEPARATOR)
        label, at, attempt = head.partition(_ATTEMPT)
        if at and (not attempt.isdigit() or attempt.startswith("0") or attempt == "1"):
            raise ValueError(f"{text!r} is not a run key: attempt {attempt!r}")
        key = cls(label, int(attempt) if at else 1, tuple(unquote(other) for other in others))
        if str(key) != text:
            raise ValueError(f"{text!r} is not a run key in its one spelling, {str(key)!r}")
        return key

    def __str__(self) -> str:
        head = self.label if self.attempt == 1 else f"{self.label}{_ATTEMPT}{self.attempt}"
        return _SEPARATOR.join([head, *(quote(other, safe=_SAFE) for other in self.others)])

    @property
    def run_attempt(self) -> tuple[str, int]:
        """The run id its label names and its attempt: whose jobs its runners are for. LabelError for a
        label that does not parse."""
        return RunnerLabel.parse(self.label).run_id, self.attempt

    @property
    def runner_labels(self) -> tuple[str, ...]:
        """Every label the runner is registered with: every label the job asked for."""
        return (self.label, *self.others)

    def resolve(self, config: StackConfig) -> RunnerSpec:
        """The spec of this key's runners: the pool label with the stack's defaults, this key as its run
        key. LabelError if the label does not parse, or if the job also asks for an OS or architecture
        that runner never has."""
        spec = config.spec_for(self.label).model_copy(update={"run_key": str(self)})
        for other in self.others:
            if other in OTHER_OPERATING_SYSTEMS:
                raise LabelError(self.label, f"the job asks for {other!r}; runner-pool runners are Linux")
            if other in ARCH_LABELS and ARCH_LABELS[other] is not spec.arch:
                raise LabelError(
                    self.label,
                    f"the job asks for {other!r} but its runner is {spec.arch.value}; "
                    f"drop {other!r} or set arch= to match",
                )
        return spec


def _canonical(labels: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({label.lower() for label in labels}))
