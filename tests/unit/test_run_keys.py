"""Run keys (domain.run_keys): one spelling per (pool label, run attempt, other labels), read back exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.run_keys import RunKey

LABEL = "pool=42/class=large"
others = st.lists(
    st.text(min_size=1, max_size=20).filter(lambda t: t.strip() and not t.lower().startswith("pool=")),
    max_size=5,
)


@given(attempt=st.integers(min_value=1, max_value=10_000), labels=others)
def test_every_run_key_reads_back_as_itself(attempt: int, labels: list[str]) -> None:
    # Given any job's labels and run attempt / When its run key is written and read
    key = RunKey.of_job([*labels, LABEL], attempt)
    # Then it is the same key, naming the same runner labels
    assert RunKey.parse(str(key)) == key
    assert RunKey.parse(str(key)).runner_labels == (LABEL, *sorted({label.lower() for label in labels}))


def test_an_attempt_1_job_with_only_our_label_has_that_label_as_its_run_key() -> None:
    # Given the common case / When keyed / Then the key is the label, as before re-runs were told apart
    assert str(RunKey.of_job([LABEL], 1)) == LABEL


def test_attempts_and_label_sets_make_different_run_keys() -> None:
    # Given the same label in two attempts and with other labels / When keyed / Then all differ
    keys = {str(RunKey.of_job(labels, attempt)) for labels in ([LABEL], ["gpu", LABEL]) for attempt in (1, 2)}
    assert keys == {LABEL, f"{LABEL}@2", f"{LABEL} gpu", f"{LABEL}@2 gpu"}


def test_labels_that_differ_only_in_case_are_one_label_set() -> None:
    # Given GitHub's "Labels are case-insensitive" / When [GPU, Linux] and [gpu, linux] are keyed
    # Then they are one run key: one runner can take either job
    assert RunKey.of_job(["GPU", "Linux", LABEL], 1) == RunKey.of_job(["linux", "gpu", LABEL], 1)


@pytest.mark.parametrize(
    "text", [f"{LABEL}@1", f"{LABEL}@02", f"{LABEL}@x", f"{LABEL} b a", f"{LABEL} A", "gpu"]
)
def test_text_that_is_not_a_run_key_in_its_one_spelling_is_refused(text: str) -> None:
    # Given text no run key is written as / When read / Then refused
    with pytest.raises(ValueError, match=r"run key|pool label|canonical"):
        RunKey.parse(text)
