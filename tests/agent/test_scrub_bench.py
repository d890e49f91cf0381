"""`make bench agent`'s scrub figures, small: every release of the bench comes out clean, in bounded time."""

from __future__ import annotations

from bench.agent import measure_scrub


def test_the_scrub_bench_times_releases_that_all_come_out_clean() -> None:
    # Given two releases after the residue test's job, on a runner directory of 1 MiB
    # When the bench measures them (it raises if a scrub left anything)
    times = measure_scrub(releases=2, runner_megabytes=1)
    # Then each scrub and each check before a start took a measured, bounded time
    assert len(times.seconds) == 2
    assert all(0 < seconds < 10 for seconds in times.seconds), times.seconds
    assert all(0 < seconds < 1 for seconds in times.check_before_start_seconds), (
        times.check_before_start_seconds
    )
