"""The instances' notice queues (issue 15, item 4): opened by the steps that record instances, notified by
the hand-over and the release, and kept in step with the records by refresh; every call checked against
the synthesized stack's policies (the local stack fails a test at its end on a denied call)."""

from __future__ import annotations

from typing import Any

import pytest

from emulator.harness.control_plane import STACK_NAME, LocalControlPlane
from runner_pool.adapters import notice_queues
from runner_pool.adapters.notice_queues import NoticeQueues
from runner_pool.domain import notices
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.provision import ClaimWorker
from runner_pool.domain.trust import TrustLevel
from runner_pool.environment import STACK_TAG_KEY
from runner_pool.handlers.provision import provision_of


def opened(local: LocalControlPlane) -> NoticeQueues:
    queues = local.plane.notices
    assert queues is not None, "the local stack gives the notice queue prefix"
    return queues


def depth(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def test_a_queue_is_opened_with_its_instances_arn_and_the_stacks_tag(local: LocalControlPlane) -> None:
    # Given a recorded instance / When its queue is opened (twice: a retried step)
    (facts,) = local.launch(1)
    queues = opened(local)
    arn = local.plane.instance_arn(facts.instance_id)
    assert queues.open([facts.instance_id]) == []
    assert queues.open([facts.instance_id]) == []
    # Then it carries the tag the instance role's receive condition reads, and keeps notices briefly
    url = queues.url(facts.instance_id)
    tags = local.sqs.list_queue_tags(QueueUrl=url)["Tags"]
    assert tags == {notices.INSTANCE_TAG_KEY: arn, STACK_TAG_KEY: STACK_NAME}
    attributes = local.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["MessageRetentionPeriod"] == str(notices.RETENTION_SECONDS)
    assert queues.instance_ids() == [facts.instance_id]


def test_a_notice_to_a_queue_never_opened_is_a_failure_not_an_error(local: LocalControlPlane) -> None:
    failure = opened(local).notify("i-00000000000000000")
    assert failure is not None
    assert "NonExistentQueue" in failure.reason or "QueueDoesNotExist" in failure.reason


def test_the_listing_follows_every_page(local: LocalControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given more queues than one page holds (ListQueues pages at most 1,000; here 2)
    monkeypatch.setattr(notice_queues, "LIST_PAGE", 2)
    launched = local.launch(5)
    queues = opened(local)
    queues.open(f.instance_id for f in launched)
    # Then every one is listed
    assert sorted(queues.instance_ids()) == sorted(f.instance_id for f in launched)


def test_the_hand_over_of_a_warm_claim_sends_a_notice_once_the_config_is_stored(
    local: LocalControlPlane,
) -> None:
    # Given a pooled instance with its queue, as refresh opens it
    (idle,) = local.pooled(1)
    local.refresh()
    url = opened(local).url(idle.instance_id)
    assert depth(local.sqs, url) == 0
    # When a provision's Begin claims it and hands it its config (the step over the plane's adapters)
    steps = provision_of(local.plane)
    request = ProvisionRequest(
        trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key="pool=991", count=1
    )
    plan = steps.begin(request, "notice")
    # Then the config is stored and one notice waits for its agent
    record = local.table.get(idle.instance_id)
    assert record is not None
    assert record.runner_id is not None
    assert local.plane.credentials.stored_runner(idle.instance_id, local.plane.instance_arn(idle.instance_id))
    assert depth(local.sqs, url) == 1
    # And the slot's worker finds the hand-over done: it registers no second runner, and tells the agent
    # again (it cannot know whether Begin's notice went out; a second notice costs the agent one read)
    claimed = steps.claim(ClaimWorker(plan=plan, slot=0))
    assert claimed.instance_id == idle.instance_id
    assert local.table.get(idle.instance_id).runner_id == record.runner_id  # type: ignore[union-attr]
    assert depth(local.sqs, url) == 2


def test_refresh_closes_the_queues_of_ended_instances_and_opens_missing_ones(
    local: LocalControlPlane,
) -> None:
    # Given a live instance without a queue (its opening failed) and an ended one whose queue stayed
    live, ended = local.pooled(2)
    queues = opened(local)
    queues.open([ended.instance_id])
    assert local.table.expire(ended.instance_id).succeeded
    assert local.table.mark_terminated(ended.instance_id).succeeded
    # When refresh runs (as its own function, under its role)
    report = local.refresh()
    # Then the ended one's queue is gone and the live one has one
    assert queues.instance_ids() == [live.instance_id]
    assert (report["notice_queues_closed"], report["notice_queues_opened"]) == (1, 1)
    # And a second run finds nothing to do
    again = local.refresh()
    assert (again["notice_queues_closed"], again["notice_queues_opened"]) == (0, 0)
