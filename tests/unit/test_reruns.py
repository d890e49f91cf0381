"""The re-run rule (domain/reruns.py): once per attempt, never a cancelled run, a re-run one or our own re-run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.reruns import RunNow, Verdict, decide, job_failed, label_set, served_on_demand

FAILED = RunNow(status="completed", conclusion="failure", latest_attempt=1)
CANCELLED = RunNow(status="completed", conclusion="cancelled", latest_attempt=1)
FAILED_AGAIN = RunNow(status="completed", conclusion="failure", latest_attempt=2)
"""Attempt 2 failed too: the latest, whoever re-ran attempt 1."""


@pytest.mark.parametrize(
    ("enabled", "attempt", "run", "asked_for_previous", "verdict"),
    [
        # attempt 1 failed, latest, never asked for: it is re-run
        pytest.param(True, 1, FAILED, False, Verdict.RERUN, id="failed-latest-never-asked"),
        # a run someone cancelled is left alone
        pytest.param(True, 1, CANCELLED, False, Verdict.CANCELLED, id="cancelled"),
        # attempt 1, which a person re-ran (attempt 2 is the latest) before the stack acted: no second re-run
        pytest.param(True, 1, FAILED_AGAIN, False, Verdict.NOT_LATEST, id="a-person-re-ran-it-first"),
        # attempt 2, the stack's own re-run of attempt 1, interrupted too: not re-run again
        pytest.param(True, 2, FAILED_AGAIN, True, Verdict.OUR_RERUN, id="our-own-re-run"),
        # the setting turns it off
        pytest.param(False, 1, FAILED, False, Verdict.OFF, id="off"),
    ],
)
def test_the_verdict_on_a_run(
    enabled: bool, attempt: int, run: RunNow, asked_for_previous: bool, verdict: Verdict
) -> None:
    # Given the run as GitHub has it and the ledger's history / When decided / Then the verdict
    decided, _ = decide(
        enabled=enabled, attempt=attempt, run=run, asked_for_previous=asked_for_previous, asked_for_this=False
    )
    assert decided is verdict


runs = st.builds(
    RunNow,
    status=st.sampled_from(["completed", "in_progress", "queued"]),
    conclusion=st.sampled_from([None, "failure", "cancelled", "success", "timed_out"]),
    latest_attempt=st.integers(1, 60),
)


@given(st.booleans(), st.integers(1, 60), runs, st.tuples(st.booleans(), st.booleans()))
def test_a_re_run_is_asked_only_of_a_failed_latest_attempt_once_and_never_of_our_own(
    enabled: bool, attempt: int, run: RunNow, asked: tuple[bool, bool]
) -> None:
    # Given any run and any history / When decided
    asked_previous, asked_this = asked
    verdict, why = decide(
        enabled=enabled,
        attempt=attempt,
        run=run,
        asked_for_previous=asked_previous,
        asked_for_this=asked_this,
    )
    # Then a re-run is asked only when every condition holds, and every verdict says why
    failed_latest = (
        run.status == "completed" and run.conclusion == "failure" and run.latest_attempt == attempt
    )
    assert (verdict is Verdict.RERUN) == (enabled and failed_latest and not asked_previous and not asked_this)
    assert why


def test_attempt_two_of_an_interrupted_label_set_is_served_on_demand() -> None:
    # Given attempt 1's interrupted label set, as its re-run's ledger item names it
    interrupted = {label_set("pool=7/usage=spot linux")}
    # When attempt 2's demand asks / Then the same labels are on-demand, other labels are not
    assert served_on_demand("pool=7/usage=spot@2 linux", interrupted)
    assert not served_on_demand("pool=7/usage=spot@2 gpu", interrupted)
    assert not served_on_demand("pool=7/class=xlarge@2 linux", interrupted)


def test_only_a_failed_job_counts_as_failed() -> None:
    # Given the conclusions GitHub gives a completed job / Then only `failure` is one a re-run repeats
    assert job_failed("failure")
    assert not any(map(job_failed, ["success", "cancelled", "skipped", "neutral", "timed_out", None]))
