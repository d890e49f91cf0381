"""A run's release in bounded parts (domain.release): each part within the history quota, every instance in
exactly one part, and the same instances always making the same parts by the same names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.release import (
    HISTORY_BUDGET_EVENTS,
    RECEIPT_CHECK_EVENTS,
    RELEASE_EXECUTION_EVENTS,
    RELEASE_INSTANCE_EVENTS,
    RELEASE_PART_LIMIT,
    receipt_checks,
    release_part_size,
    release_parts,
)
from runner_pool.domain.timeouts import Timeouts

RUN = "pool=101"
RUN_RELEASE = ReleaseRequest(run_key=RUN, cause="run-45-attempt-1", repository="octo/app")

instance_ids = st.lists(
    st.integers(min_value=0, max_value=16**17 - 1).map(lambda n: f"i-{n:017x}"), unique=True, max_size=600
).map(lambda ids: tuple(sorted(ids)))


@given(instance_ids, st.integers(min_value=1, max_value=120))
def test_every_instance_is_in_exactly_one_part_of_at_most_the_size(ids: tuple[str, ...], size: int) -> None:
    # Given a run's release holding some instances / When it is split at a part size
    parts = release_parts(RUN_RELEASE, ids, size)
    # Then it splits only when one execution may not give them all back ...
    assert bool(parts) == (len(ids) > size)
    # ... and then each instance is in exactly one part, in order, and no part is over the size
    if parts:
        assert [i for part in parts for i in part.part or ()] == list(ids)
        assert all(0 < len(part.part or ()) <= size for part in parts)


@given(instance_ids.filter(lambda ids: len(ids) > 3), st.integers(min_value=1, max_value=3))
def test_the_same_instances_make_the_same_parts_by_the_same_names(ids: tuple[str, ...], size: int) -> None:
    # Given a run's release split into parts, and the same plan made again (a retried step)
    first, again = release_parts(RUN_RELEASE, ids, size), release_parts(RUN_RELEASE, ids, size)
    # Then the parts and their execution names are the same, each name its own, none the run release's
    names = [part.execution_name for part in first]
    assert [part.execution_name for part in again] == names
    assert len(set(names)) == len(names)
    assert RUN_RELEASE.execution_name not in names


def test_a_part_carries_everything_the_run_release_asked_but_its_instances() -> None:
    # Given a run's release of five instances, split by two
    ids = tuple(f"i-{n:017x}" for n in range(5))
    parts = release_parts(RUN_RELEASE, ids, 2)
    # Then each part is the run's release with its share of the instances
    assert [part.part for part in parts] == [ids[0:2], ids[2:4], ids[4:5]]
    assert {part.model_copy(update={"part": None}) for part in parts} == {RUN_RELEASE}


def test_another_run_release_of_the_same_instances_names_its_parts_apart() -> None:
    # Given the same run released for another cause (a sweep after the run's webhook), same instances
    ids = tuple(f"i-{n:017x}" for n in range(4))
    other = RUN_RELEASE.model_copy(update={"cause": "reconcile-7"})
    # Then no part of one has the name of a part of the other
    names = {part.execution_name for part in release_parts(RUN_RELEASE, ids, 2)}
    assert names.isdisjoint(part.execution_name for part in release_parts(other, ids, 2))


@pytest.mark.parametrize(
    "request_",
    [
        ReleaseRequest(run_key=RUN, cause="job-1", instance_id="i-0123456789abcdef0", runner_id=7),
        ReleaseRequest(run_key=RUN, cause="run-1", part=tuple(f"i-{n:017x}" for n in range(30))),
    ],
    ids=["a job's release", "a part"],
)
def test_only_a_whole_run_release_is_split(request_: ReleaseRequest) -> None:
    # Given a job's release, or a part already planned / When asked to split at 2 / Then it is not
    assert release_parts(request_, tuple(f"i-{n:017x}" for n in range(30)), 2) == ()


def test_a_part_names_no_single_instance() -> None:
    # Given a part that also names an instance / Then it is refused
    with pytest.raises(ValueError, match="part"):
        ReleaseRequest(run_key=RUN, cause="run-1", instance_id="i-0123456789abcdef0", part=("i-1",))


@given(
    st.floats(min_value=1, max_value=3600),
    st.floats(min_value=0.1, max_value=60),
)
def test_a_part_on_its_worst_path_stays_within_half_the_history_quota(receipt: float, poll: float) -> None:
    # Given any receipt timeout and poll / When the part size is derived
    timeouts = Timeouts(release_receipt_seconds=receipt, release_receipt_poll_seconds=poll, idle_seconds=7200)
    size = release_part_size(timeouts)
    # Then a part of that many instances, each checked until its receipt is overdue, is within the budget
    # (a single instance always makes a part, however long its checks)
    worst = RELEASE_EXECUTION_EVENTS + size * (
        RELEASE_INSTANCE_EVENTS + receipt_checks(timeouts) * RECEIPT_CHECK_EVENTS
    )
    assert 1 <= size <= RELEASE_PART_LIMIT
    assert worst <= HISTORY_BUDGET_EVENTS or size == 1


def test_at_the_defaults_a_part_is_twenty_one_instances() -> None:
    # Given the default timeouts (a receipt within 120 s, looked for every 2 s) / Then 21 instances a part
    assert release_part_size(Timeouts()) == 21
