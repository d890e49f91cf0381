"""Every webhook the fake GitHub sends has the structure of GitHub's real example of the same event and
action (tests/fixtures/github-webhooks/, octokit/webhooks' payload examples): each key the real one
has, with a value of the same JSON type, all the way down. A null on either side is allowed (GitHub's
examples have nulls where a run or job has not got that far). The fields runner-pool reads are held
to their type exactly, null included: `run_attempt`, `labels`, `runner_id`, `runner_name`,
`head_repository`.
"""

from __future__ import annotations

import json
from typing import Any

from emulator.fake_github import Conclusion, FakeGitHub, JobSpec
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from emulator.harness.webhooks import fixture
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runner_scope import RepositoryScope

REPOSITORY = f"{OWNER}/{REPO}"
LABEL = "pool=${{ github.run_id }}/class=large"
REAL_EXAMPLES: dict[tuple[str, str | None, str | None], str] = {
    ("workflow_job", "queued", None): "workflow_job.queued.payload.json",
    ("workflow_job", "in_progress", None): "workflow_job.in_progress.payload.json",
    ("workflow_job", "completed", "success"): "workflow_job.completed.success.with-organization.payload.json",
    ("workflow_job", "completed", "failure"): "workflow_job.completed.failure.with-organization.payload.json",
    ("workflow_run", "requested", None): "workflow_run.requested.payload.json",
    ("workflow_run", "completed", None): "workflow_run.completed.payload.json",
}
READ_BY_US = {
    "workflow_job": ("run_attempt", "labels", "runner_id", "runner_name"),
    "workflow_run": ("run_attempt", "head_repository"),
}


def type_name(value: Any) -> str:
    return (
        "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__
    )


def mismatches(ours: Any, real: Any, path: str = "") -> list[str]:
    """Where `ours` lacks a key `real` has, or holds a value of another JSON type."""
    if ours is None or real is None:
        return []
    if type_name(ours) != type_name(real):
        return [f"{path}: {type_name(ours)} where GitHub sends {type_name(real)}"]
    if isinstance(real, dict):
        found = []
        for key, value in real.items():
            if key not in ours:
                found.append(f"{path}.{key}: missing")
            else:
                found += mismatches(ours[key], value, f"{path}.{key}")
        return found
    if isinstance(real, list) and real and ours:
        return mismatches(ours[0], real[0], f"{path}[0]")
    return []


def a_run_with_a_rerun(fake: FakeGitHub) -> list[tuple[str, str | None, dict[str, Any]]]:
    """A run of two jobs, one failing, served, and its failed job re-run and served: every event sent."""
    run = fake.actions.start_run(
        REPOSITORY,
        "ci",
        [JobSpec("build", LABEL), JobSpec("test", ("self-hosted", LABEL), fail_attempts=(1,))],
    )
    for attempt in (1, 2):
        if attempt == 2:
            fake.actions.rerun_failed_jobs(run.run_id)
        for job_id in list(run.job_ids):
            job = fake.state.jobs[job_id]
            if job.run_attempt != attempt:
                continue
            runner = fake.state.register_runner(
                RepositoryScope(owner=OWNER, repo=REPO), f"i-0abc-{job_id:08x}", list(job.labels)
            )
            fake.actions.connect(runner)
            taken = fake.actions.next_job(runner)
            assert taken is not None
            fake.actions.finish(runner, job_id, Conclusion.FAILURE if taken.fails else Conclusion.SUCCESS)
    deliveries = sorted(fake.state.deliveries.values(), key=lambda d: d.delivery_id)
    return [(d.event, d.action, json.loads(d.payload)) for d in deliveries]


def test_every_webhook_the_fake_sends_has_the_structure_of_githubs_real_example(
    app_key: AppKey, clock: ManualClock
) -> None:
    # Given a run, and the re-run of its failed job, played on the fake
    fake = FakeGitHub(APP_ID, app_key.public_pem, clock=clock)
    fake.state.add_installation(INSTALLATION_ID, OWNER)
    sent = a_run_with_a_rerun(fake)
    compared: set[str] = set()
    for event, action, payload in sent:
        conclusion = (
            payload["workflow_job"]["conclusion"]
            if event == "workflow_job" and action == "completed"
            else None
        )
        name = REAL_EXAMPLES.get((event, action, conclusion))
        if name is None:
            continue
        real = fixture(name)
        # When it is compared with GitHub's example of the same event and action
        found = mismatches(payload, real)
        # Then it has every key of it, each of the same type, and the fields we read exactly so
        assert found == [], f"{name}: {found}"
        for key in READ_BY_US[event]:
            ours, theirs = payload[event][key], real[event][key]
            assert key in payload[event], f"{event}.{key} missing"
            assert ours is None or theirs is None or type_name(ours) == type_name(theirs), key
        compared.add(name)
    # And every real example was met, in both attempts
    assert compared == set(REAL_EXAMPLES.values())
    attempts = {p[e]["run_attempt"] for e, _, p in sent}
    assert attempts == {1, 2}
