"""The job logs' rules (domain/job_logs.py): PutLogEvents batches within CloudWatch Logs' limits, the
retention setting, and one hand-over's lines picked out of a reused instance's."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.config import ConfigError, load_config
from runner_pool.domain.job_logs import (
    EVENT_OVERHEAD_BYTES,
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    MAX_BATCH_SPAN_MS,
    MAX_EVENT_BYTES,
    MAX_FUTURE_MS,
    MAX_PAST_MS,
    HandOverWindow,
    LogEvent,
    Source,
    batches,
    lines_of,
    stream_name,
    window_of,
)
from runner_pool.domain.job_story import JobRef, Step, Story

NOW_MS = 1_790_000_000_000
HOUR_MS = 3600 * 1000


def assert_within_limits(batch: tuple[LogEvent, ...]) -> None:
    assert 0 < len(batch) <= MAX_BATCH_EVENTS
    assert sum(event.size for event in batch) <= MAX_BATCH_BYTES
    assert batch[-1].timestamp_ms - batch[0].timestamp_ms <= MAX_BATCH_SPAN_MS
    assert [e.timestamp_ms for e in batch] == sorted(e.timestamp_ms for e in batch)


def test_more_events_than_one_batch_holds_are_cut_at_ten_thousand() -> None:
    # Given 25,000 small events of one second
    events = [LogEvent(NOW_MS - 1000, f"line {n}") for n in range(25_000)]
    # When they are batched
    cut = batches(events, NOW_MS)
    # Then three batches carry them all, none above PutLogEvents' 10,000 events, in the order written
    assert [len(batch) for batch in cut.batches] == [10_000, 10_000, 5_000]
    assert [e.message for batch in cut.batches for e in batch] == [e.message for e in events]


def test_a_batch_never_passes_a_mebibyte_counting_26_bytes_an_event() -> None:
    # Given events of 100 KiB each
    events = [LogEvent(NOW_MS - 1000, "x" * 100 * 1024) for _ in range(25)]
    # When they are batched
    cut = batches(events, NOW_MS)
    # Then each batch's messages plus 26 bytes an event stay within 1,048,576 bytes, and as few batches
    per_batch = MAX_BATCH_BYTES // (100 * 1024 + EVENT_OVERHEAD_BYTES)
    assert [len(batch) for batch in cut.batches] == [per_batch, per_batch, 25 - 2 * per_batch]
    for batch in cut.batches:
        assert_within_limits(batch)


def test_events_come_out_in_time_order_and_no_batch_spans_more_than_a_day() -> None:
    # Given events written out of order (the runner's files, read after the agent's lines), two days apart
    events = [
        LogEvent(NOW_MS - 1000, "late"),
        LogEvent(NOW_MS - 2 * 24 * HOUR_MS, "two days ago"),
        LogEvent(NOW_MS - 23 * HOUR_MS, "23 hours ago"),
    ]
    # When they are batched
    cut = batches(events, NOW_MS)
    # Then they are in time order, and a batch ends before it would span more than 24 hours
    assert [[e.message for e in batch] for batch in cut.batches] == [
        ["two days ago"],
        ["23 hours ago", "late"],
    ]


def test_events_older_than_cloudwatch_takes_are_counted_not_sent_and_future_ones_are_moved_to_its_edge() -> (
    None
):
    # Given an event from 15 days ago and one 3 hours ahead (a clock that jumped)
    events = [LogEvent(NOW_MS - MAX_PAST_MS - 1, "old"), LogEvent(NOW_MS + 3 * HOUR_MS, "ahead")]
    # When they are batched
    cut = batches(events, NOW_MS)
    # Then the old one is counted as stale, and the one ahead is sent within the 2 hours CloudWatch takes
    assert cut.stale == 1
    ((ahead,),) = cut.batches
    assert ahead.message == "ahead"
    assert ahead.timestamp_ms < NOW_MS + MAX_FUTURE_MS


def test_a_line_longer_than_an_event_may_be_is_cut_and_stays_a_json_object() -> None:
    # Given a line of 300 KB of two-byte characters, with its hand-over's identity
    event = LogEvent.of(NOW_MS, {"message": "é" * 150_000, "run_key": "pool=1", "runner_id": 41})
    # Then it fits one event, still a JSON object with its identity whole, and says it was cut
    assert event.size <= MAX_EVENT_BYTES + EVENT_OVERHEAD_BYTES
    fields = json.loads(event.message)
    assert fields["message"].endswith("[truncated]")
    assert (fields["run_key"], fields["runner_id"]) == ("pool=1", 41)


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-3 * 24 * HOUR_MS, max_value=0), st.integers(min_value=0, max_value=9000)
        ),
        max_size=60,
    )
)
def test_every_batch_holds_within_every_limit_and_nothing_is_lost(pairs: list[tuple[int, int]]) -> None:
    events = [LogEvent(NOW_MS + offset, "y" * size) for offset, size in pairs]
    cut = batches(events, NOW_MS)
    for batch in cut.batches:
        assert_within_limits(batch)
    assert sum(len(batch) for batch in cut.batches) == len(events)


def test_retention_is_one_cloudwatch_accepts() -> None:
    # Given the default, and a retention CloudWatch takes
    assert load_config({}).logs.retention_days == 30
    assert load_config({"logs": {"retention_days": 731}}).logs.retention_days == 731
    # When the operator sets one it does not take
    with pytest.raises(ConfigError) as refused:
        load_config({"logs": {"retention_days": 10}})
    # Then synth says so, with the values it takes and the nearest one
    assert "logs.retention_days: 10 days is not a retention CloudWatch Logs accepts" in str(refused.value)
    assert "the nearest: 7" in str(refused.value)


def event(stream: str, at_ms: int, **fields: object) -> tuple[str, int, str]:
    return stream, at_ms, json.dumps(fields)


def test_a_hand_overs_lines_are_those_of_its_runner_and_none_of_the_next_jobs() -> None:
    # Given two hand-overs of one run key on one instance (runners 41 and 42), lines of an idle spell, and
    # a line no agent wrote
    agent, runner = stream_name("i-0abc", Source.AGENT), stream_name("i-0abc", Source.RUNNER)
    events = [
        event(agent, 1000, message="agent started"),
        event(agent, 2000, message="starting the runner", run_key="pool=1", runner_id=41),
        event(runner, 2500, message="[...] Running job: build", run_key="pool=1", runner_id=41),
        event(agent, 3000, message="workspace clean", run_key="pool=1", runner_id=41),
        event(agent, 4000, message="starting the runner", run_key="pool=1", runner_id=42),
        (agent, 2600, "not json"),
    ]
    window = HandOverWindow("i-0abc", 0.0, 10.0, runner_id=41)
    # When the first hand-over's lines are picked out
    lines = lines_of(window, events)
    # Then they are its runner's alone, agent's and runner's, in time order
    assert [(line.source, line.fields["message"]) for line in lines] == [
        (Source.AGENT, "starting the runner"),
        (Source.RUNNER, "[...] Running job: build"),
        (Source.AGENT, "workspace clean"),
    ]
    # And the streams read are the instance's two
    assert window.streams == ["i-0abc/agent", "i-0abc/runner"]


def test_the_window_runs_from_the_story_s_first_time_to_its_scrub_or_now() -> None:
    ref = JobRef("octo-org/app", 1, 2)
    steps = (Step("queued", 100.0, ""), Step("hand-over", 101.0, ""), Step("scrub", 130.0, ""))
    # Given a finished job's story, and one still running
    done = Story(ref, steps, instance_id="i-0abc", runner_id=41)
    running = Story(ref, steps[:2], instance_id="i-0abc", runner_id=41)
    # Then its window is queued to scrub, and the running one's ends now
    assert window_of(done, now=500.0) == HandOverWindow("i-0abc", 100.0, 130.0, 41)
    assert window_of(running, now=500.0) == HandOverWindow("i-0abc", 100.0, 500.0, 41)
    # And a story with no instance has none
    assert window_of(Story(ref, steps), now=500.0) is None
