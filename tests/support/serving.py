"""How our instances served the fake GitHub's jobs, as the end-to-end tests check it."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from emulator.fake_github import FakeJob
from runner_pool.domain.executions import instance_of_runner


def assert_one_job_at_a_time(jobs: Iterable[FakeJob]) -> None:
    """No instance ran two of the finished `jobs` at once: none was handed to another run while its
    runner served one."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job in jobs:
        assert job.started_at is not None
        assert job.completed_at is not None
        spans[instance_of_runner(job.runner_name) or "?"].append((job.started_at, job.completed_at))
    for held in spans.values():
        for (_, first_end), (second_start, _) in itertools.pairwise(sorted(held)):
            assert first_end <= second_start
