"""The AWS model's arithmetic, and how it reads calls into steps, on hand-made input."""

from __future__ import annotations

import pytest

from bench.aws_model import (
    INSTANT_TARGET_SECONDS,
    LATENCIES,
    RUNNER_START_CALLS,
    Call,
    Hop,
    InstantStart,
    Invocation,
    JobTrace,
    Step,
    Traced,
    instant_path,
    listing_past_window,
    model,
    own_hand_over,
    report,
    report_instant,
    steps,
)
from bench.results import BenchTable
from demo.figures import Kind
from runner_pool.domain.follow_up import FOLLOW_UP_WINDOW_SECONDS


def test_a_path_is_priced_count_times_latency_per_segment_and_hop() -> None:
    # Given a path with two segments, a hop counted twice in one, and a configured wait
    path = [
        Step("webhook", Hop.SQS, 1),
        Step("webhook", Hop.DYNAMODB, 1),
        Step("window", Hop.WAIT, 1.5),
        Step("webhook", Hop.DYNAMODB, 2),
    ]
    latencies = {hop: 0.0 for hop in Hop} | {Hop.DYNAMODB: 0.010, Hop.SQS: 0.020, Hop.WAIT: 1.0}
    # When it is modelled
    modelled = model(path, latencies)
    # Then each segment's hops are summed and priced, together and in the order the path reaches them
    assert [(r.segment, r.hop, r.count) for r in modelled.rows] == [
        ("webhook", Hop.SQS, 1),
        ("webhook", Hop.DYNAMODB, 3),
        ("window", Hop.WAIT, 1.5),
    ]
    assert [r.seconds for r in modelled.rows] == pytest.approx([0.020, 0.030, 1.5])
    assert modelled.seconds == pytest.approx(1.55)
    assert modelled.total(Hop.DYNAMODB, Hop.SQS) == 4
    assert modelled.rows[1].describe() == "3 x 10 ms = 0.030 s"
    assert modelled.rows[2].describe() == "1.5 s waited = 1.500 s"


def test_every_hop_has_a_published_latency_and_a_wait_counts_its_seconds() -> None:
    assert set(LATENCIES) == set(Hop)
    assert LATENCIES[Hop.WAIT] == 1.0
    assert all(seconds > 0 for seconds in LATENCIES.values())


def test_the_follow_ups_list_of_its_run_costs_only_what_it_takes_past_the_window() -> None:
    # The machine's start, two states and the gather's invocation, then GitHub's read, beside the window
    started = 0.050 + 2 * 0.030 + 0.030
    warm = listing_past_window()
    assert warm == pytest.approx(started + LATENCIES[Hop.GITHUB_READ] - FOLLOW_UP_WINDOW_SECONDS)
    assert 0 < warm < LATENCIES[Hop.GITHUB_READ]
    # A fresh environment asks for the App's installation token first
    assert listing_past_window(fresh=True) == pytest.approx(warm + LATENCIES[Hop.GITHUB_AUTH])


def test_an_empty_long_poll_is_its_wait_and_a_hand_over_brings_its_github_calls() -> None:
    # Given a claim's calls: an empty long poll (the next call a full WaitTimeSeconds later), one that
    # found a message, the App's key read, the config encrypted and stored, then an in-line check
    calls = [
        Call(0.0, 1, "sqs:ReceiveMessage", {"WaitTimeSeconds": 1}),
        Call(1.0, 1, "sqs:ReceiveMessage", {"WaitTimeSeconds": 1}),
        Call(1.01, 1, "secretsmanager:GetSecretValue", {}),
        Call(1.2, 1, "kms:Encrypt", {}),
        Call(1.21, 1, "dynamodb:PutItem", {"Item": {"sk": {"S": "runner-config"}}}),
        Call(1.5, 1, "dynamodb:BatchGetItem", {}),
    ]
    # When they are read up to the config stored
    read = steps("claim", calls, until=lambda call: call.operation == "dynamodb:PutItem", hand_over=True)
    # Then the empty poll is a wait, the other calls their services, the hand-over its token and JIT
    # registration, and nothing after the store is on the path
    assert [(s.hop, s.count) for s in read] == [
        (Hop.WAIT, 1.0),
        (Hop.SQS, 1),
        (Hop.SECRETS_MANAGER, 1),
        (Hop.GITHUB_AUTH, 1),
        (Hop.GITHUB_JIT, 1),
        (Hop.KMS, 1),
        (Hop.DYNAMODB, 1),
    ]


def test_the_token_asked_for_in_the_background_costs_only_what_the_calls_beside_it_leave() -> None:
    # Given Create's calls: the App's key read (the token then asked for in the background), CreateFleet,
    # the records, a hand-over; and a warm Begin's: the key read, the pool's read, a claim, a hand-over
    create = [
        Call(0.0, 1, "secretsmanager:GetSecretValue", {}),
        Call(0.01, 1, "ec2:CreateFleet", {}),
        Call(1.5, 1, "dynamodb:PutItem", {}),
        Call(1.6, 1, "dynamodb:GetItem", {}),
        Call(1.7, 1, "kms:Encrypt", {}),
    ]
    begin = [
        Call(0.0, 1, "secretsmanager:GetSecretValue", {}),
        Call(0.01, 1, "sqs:ReceiveMessage", {"WaitTimeSeconds": 1}),
        Call(0.02, 1, "dynamodb:UpdateItem", {}),
        Call(0.03, 1, "dynamodb:GetItem", {}),
        Call(0.2, 1, "kms:Encrypt", {}),
    ]
    # When each is read
    created = steps("create", create, until=lambda call: False, hand_over=True)
    began = steps("begin", begin, until=lambda call: False, hand_over=True)
    # Then CreateFleet hid the whole token request, and the pool's read and the claim hid part of it
    assert Hop.GITHUB_AUTH not in [step.hop for step in created]
    token = [step.count for step in began if step.hop is Hop.GITHUB_AUTH]
    hidden = LATENCIES[Hop.SQS] + 2 * LATENCIES[Hop.DYNAMODB]
    assert token == [pytest.approx(1 - hidden / LATENCIES[Hop.GITHUB_AUTH])]


def test_the_report_keeps_each_kinds_median_and_shows_the_median_jobs_segments_side_by_side() -> None:
    # Given two warm jobs (one waited a window) and a cold one that launched
    def traced(job_id: int, kind: Kind, *path: Step) -> Traced:
        return Traced(JobTrace(job_id, 0.0, f"i-{job_id}", kind), path)

    common = (Step("webhook", Hop.DYNAMODB, 1), Step("webhook", Hop.SQS, 1))
    jobs = [
        traced(1, Kind.WARM, *common, Step("claim", Hop.GITHUB_JIT, 1)),
        traced(2, Kind.WARM, *common, Step("window", Hop.WAIT, 1.0), Step("claim", Hop.GITHUB_JIT, 1)),
        traced(3, Kind.COLD, *common, Step("create", Hop.EC2_CREATE_FLEET, 1)),
    ]
    table = BenchTable("emulator", ("figure", "cold", "warm"))
    # When they are reported
    report(table, jobs)
    # Then each kind keeps the median of its jobs' modelled seconds, and the rows follow the path, each
    # kind's cell empty where its median job (warm: the lower of two) has no such segment
    warm = [
        LATENCIES[Hop.DYNAMODB] + LATENCIES[Hop.SQS] + LATENCIES[Hop.GITHUB_JIT] + extra for extra in (0, 1)
    ]
    assert table.figures["aws_model_warm_control_plane_seconds"] == pytest.approx(sum(warm) / 2, abs=1e-3)
    assert table.figures["aws_model_cold_critical_path_aws_calls_count"] == 3
    assert [row[0] for row in table.rows] == [
        "AWS model: webhook, DynamoDB",
        "AWS model: webhook, SQS",
        "AWS model: claim, GitHub JIT",
        "AWS model: create, EC2 CreateFleet",
        "AWS model: queued -> config stored (median job)",
    ]
    assert table.rows[2][1:] == ("-", "1 x 300 ms = 0.300 s")


def test_hand_overs_side_by_side_put_only_their_own_calls_on_an_instances_path() -> None:
    # Given Begin's calls: two claims one after another, then two hand-overs side by side, interleaved
    def record(instance_id: str) -> dict[str, object]:
        return {"Key": {"pk": {"S": f"arn:aws:ec2:us-east-1:1:instance/{instance_id}"}}}

    def config(instance_id: str) -> dict[str, object]:
        pk = {"S": f"arn:aws:ec2:us-east-1:1:instance/{instance_id}"}
        return {"Item": {"pk": pk, "sk": {"S": "runner-config"}}}

    calls = (
        Call(0.00, 1, "dynamodb:UpdateItem", record("i-a")),
        Call(0.01, 1, "dynamodb:UpdateItem", record("i-b")),
        Call(0.02, 1, "dynamodb:GetItem", record("i-a")),
        Call(0.02, 1, "dynamodb:GetItem", record("i-b")),
        Call(0.03, 1, "kms:Encrypt", {"EncryptionContext": {"instance": "i-b"}}),
        Call(0.03, 1, "dynamodb:PutItem", config("i-b")),
        Call(0.04, 1, "kms:Encrypt", {"EncryptionContext": {"instance": "i-a"}}),
        Call(0.05, 1, "dynamodb:PutItem", config("i-a")),
    )
    begin = Invocation("provision-begin", 0.06, calls)
    # When i-a's path through it is read
    own = own_hand_over(begin, "i-a", end=7)
    # Then both claims are on it (one after another), and of the hand-overs only i-a's own
    assert [call.params for call in own] == [
        calls[0].params,
        calls[1].params,
        calls[2].params,
        calls[6].params,
        calls[7].params,
    ]


def _start(listening: bool = True, queued: float = 10.0, offered: float | None = 10.1) -> InstantStart:
    return InstantStart(7, queued_at=queued, offered_at=offered, started_at=10.2, listening_ahead=listening)


def test_a_job_given_to_a_runner_listening_ahead_costs_githubs_assignment_and_the_runners_calls() -> None:
    # Given a job queued while one of our runners was connected and idle with its label, offered to it,
    # then picked up
    path = instant_path(_start())
    # Then its path is GitHub's assignment, the long poll's answer and the runner's three calls before
    # it starts the job, and nothing of ours
    assert path is not None
    modelled = model(path)
    assert modelled.total(Hop.GITHUB_ASSIGNMENT) == 1
    assert modelled.total(Hop.GITHUB_RUNNER_CALL) == 1 + RUNNER_START_CALLS
    assert modelled.total(*(hop for hop in Hop if not hop.name.startswith("GITHUB_"))) == 0
    assert modelled.seconds == pytest.approx(
        LATENCIES[Hop.GITHUB_ASSIGNMENT] + 4 * LATENCIES[Hop.GITHUB_RUNNER_CALL]
    )
    assert modelled.seconds <= INSTANT_TARGET_SECONDS


@pytest.mark.parametrize(
    "start",
    [
        _start(listening=False),  # the runner that took it was registered for it after it was queued
        _start(offered=None),  # never offered: not started by the fake GitHub's assignment
        _start(offered=9.0),  # offered before it was queued: not this job's record
    ],
)
def test_a_job_not_started_on_a_runner_listening_ahead_has_no_instant_path(start: InstantStart) -> None:
    assert instant_path(start) is None


def test_the_instant_report_keeps_the_median_job_and_says_when_no_job_was_instant() -> None:
    # Given two instant jobs and one whose runner came after it
    table = BenchTable("instant", ("figure", "value"))
    report_instant(table, [_start(), _start(), _start(listening=False)])
    # Then the figure is the modelled path, with no AWS call on it
    assert table.figures["aws_model_instant_queued_to_started_seconds"] == pytest.approx(0.874)
    assert table.figures["aws_model_instant_critical_path_aws_calls_count"] == 0
    assert "2 of 3" in table.notes[-1]
    # And with none, no figure: the test of the small run then fails
    empty = BenchTable("instant", ("figure", "value"))
    report_instant(empty, [_start(listening=False)])
    assert "aws_model_instant_queued_to_started_seconds" not in empty.figures
