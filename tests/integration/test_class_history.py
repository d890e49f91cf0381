"""The class history in the state table (adapters/class_history.py) on moto: arrivals noted by dispatchers
at once, retried writes, boot times, and the watch a class's first read starts."""

from __future__ import annotations

from functools import partial
from typing import Any

from runner_pool.adapters.class_history import DynamoDbClassHistory
from runner_pool.domain.class_history import MEASURED, Entry, Fact
from runner_pool.domain.clock import ManualClock
from tests.conftest import TABLE_NAME
from tests.support.aws_faults import lose_answers
from tests.support.racing import at_once


def history(dynamodb: Any, clock: ManualClock) -> DynamoDbClassHistory:
    return DynamoDbClassHistory(TABLE_NAME, clock, dynamodb)


def test_dispatchers_noting_at_once_count_every_job_once(dynamodb: Any, clock: ManualClock) -> None:
    # Given 8 dispatchers, each noting 25 jobs of one class in the same minute, every job noted by two
    def dispatcher(number: int) -> None:
        mine = history(dynamodb, clock)
        for batch in range(5):
            jobs = [(number * 25 + batch * 5 + n) % 100 for n in range(5)]
            mine.note(Fact.ARRIVAL, "large", [Entry(str(job), clock.now()) for job in jobs], clock.now())

    at_once(*(partial(dispatcher, n) for n in range(8)))

    # When refresh reads the class
    record = history(dynamodb, clock).read("large", clock.now() - 60)

    # Then the 100 jobs arrived, each once, and none of another class
    assert sorted(int(entry.key) for entry in record.arrivals) == list(range(100))
    assert history(dynamodb, clock).read("xlarge", clock.now() - 60).arrivals == []


def test_a_note_whose_answer_was_lost_and_retried_counts_once(dynamodb: Any, clock: ManualClock) -> None:
    # Given DynamoDB applying a note but losing its answer, so botocore sends it again
    lost = lose_answers(dynamodb, "UpdateItem")
    history(dynamodb, clock).note(Fact.ARRIVAL, "large", [Entry("41", clock.now())], clock.now())
    assert lost.lost == 1
    # When read / Then the job arrived once
    assert len(history(dynamodb, clock).read("large", clock.now() - 60).arrivals) == 1


def test_arrivals_are_read_from_the_time_asked_across_minutes(dynamodb: Any, clock: ManualClock) -> None:
    # Given a job a minute for an hour and a half
    notes = history(dynamodb, clock)
    start = clock.now()
    for minute in range(90):
        at = start + minute * 60 + 7
        notes.note(Fact.ARRIVAL, "large", [Entry(str(minute), at)], at)
    clock.advance(90 * 60)
    # When the last hour is read / Then exactly the jobs of the last hour are
    record = notes.read("large", clock.now() - 3600)
    assert sorted(int(entry.key) for entry in record.arrivals) == list(range(30, 90))


def test_boot_times_read_are_the_newest_and_a_first_read_starts_the_watch(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given a launch measured each minute for two hours, the later ones slower, and one start
    notes = history(dynamodb, clock)
    for minute in range(120):
        at = clock.now() + minute * 60
        notes.note(Fact.LAUNCH, "large", [Entry(f"i-{minute:03d}", float(minute))], at)
    notes.note(Fact.START, "large", [Entry("i-start", 9.5)], clock.now())
    clock.advance(120 * 60)

    # When read, twice an hour apart
    first = notes.read("large", clock.now())
    clock.advance(3600)
    second = notes.read("large", clock.now())

    # Then the launches are the newest MEASURED at least, newest first, and the start is there
    assert [entry.value for entry in first.launches[:3]] == [119.0, 118.0, 117.0]
    assert len(first.launches) >= MEASURED
    assert min(entry.value for entry in first.launches) >= 120 - MEASURED - 1
    assert first.starts == [Entry("i-start", 9.5)]
    # And the watch began at the first read, and stays there
    assert second.watched_since == first.watched_since == clock.now() - 3600
