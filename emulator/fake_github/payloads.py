"""Webhook bodies for `workflow_job` and `workflow_run` events, shaped like the ones GitHub sends.

The keys and nesting follow GitHub's published examples (octokit/webhooks' payload examples) and
validate against githubkit's webhook models; tests/unit/test_fake_github_webhooks.py checks both
that they validate and that they carry no key the models do not name. Values that do not matter to
runner-pool (avatars, commit messages) are plausible constants.
"""

from __future__ import annotations

import base64
from typing import Any

from emulator.fake_github.routes import iso
from emulator.fake_github.state import Conclusion, FakeJob, FakeWorkflowRun, JobStatus

API = "https://api.github.com"
WEB = "https://github.com"
HEAD_SHA = "3484a3fb816e0859fd6e1cea078d76385ff50625"
SENDER = ("octocat", 583231)
WORKFLOW_ID_BASE = 2823525
CHECK_SUITE_BASE = 1291536064
GITHUB_HOSTED_GROUP = "GitHub Actions"


def workflow_job(
    action: str, job: FakeJob, run: FakeWorkflowRun, repository_id: int, installation_id: int | None
) -> dict[str, Any]:
    """A `workflow_job` event (`queued`, `in_progress` or `completed`) about `job` of `run`."""
    runs = f"{API}/repos/{run.repository}/actions"
    with_runner = job.runner_id is not None
    body: dict[str, Any] = {
        "action": action,
        "workflow_job": {
            "id": job.job_id,
            "run_id": run.run_id,
            "run_url": f"{runs}/runs/{run.run_id}",
            "run_attempt": job.run_attempt,
            "node_id": _node_id("CheckRun", job.job_id),
            "head_sha": HEAD_SHA,
            "head_branch": "main",
            "url": f"{runs}/jobs/{job.job_id}",
            "html_url": f"{WEB}/{run.repository}/actions/runs/{run.run_id}/job/{job.job_id}",
            "status": job.status.value,
            "conclusion": job.conclusion.value if job.conclusion else None,
            "started_at": iso(job.started_at or job.queued_at),
            "created_at": iso(job.queued_at),
            "completed_at": iso(job.completed_at) if job.completed_at else None,
            "name": job.name,
            "steps": _steps(job),
            "check_run_url": f"{API}/repos/{run.repository}/check-runs/{job.job_id}",
            "labels": list(job.labels),
            "runner_id": job.runner_id,
            "runner_name": job.runner_name,
            "runner_group_id": 1 if with_runner else None,
            "runner_group_name": "Default" if with_runner else None,
            "workflow_name": run.workflow,
        },
    }
    if job.environment is not None:
        body["deployment"] = _deployment(job, run, repository_id)
    return body | _context(run, repository_id, installation_id)


def workflow_run(
    action: str, run: FakeWorkflowRun, repository_id: int, installation_id: int | None
) -> dict[str, Any]:
    """A `workflow_run` event (`requested`, `in_progress` or `completed`) about `run`."""
    workflow_id = WORKFLOW_ID_BASE + sum(map(ord, run.workflow))
    path = f".github/workflows/{run.workflow}.yml"
    body: dict[str, Any] = {
        "action": action,
        "workflow": {
            "badge_url": f"{WEB}/{run.repository}/workflows/{run.workflow}/badge.svg",
            "created_at": iso(run.created_at - 86400),
            "html_url": f"{WEB}/{run.repository}/blob/main/{path}",
            "id": workflow_id,
            "name": run.workflow,
            "node_id": _node_id("Workflow", workflow_id),
            "path": path,
            "state": "active",
            "updated_at": iso(run.created_at - 86400),
            "url": f"{API}/repos/{run.repository}/actions/workflows/{workflow_id}",
        },
        "workflow_run": run_attempt(run, repository_id),
    }
    if action == "in_progress":
        # GitHub's description of workflow_run.in_progress names no display_title (the others do).
        del body["workflow_run"]["display_title"]
    return body | _context(run, repository_id, installation_id)


def run_attempt(run: FakeWorkflowRun, repository_id: int) -> dict[str, Any]:
    """A run's latest attempt as `workflow_run` events carry it and "Get a workflow run attempt" answers
    it (docs.github.com, "REST API endpoints for workflow runs"): its trigger's `event`, `actor`,
    `triggering_actor` and `head_repository` among the rest."""
    runs = f"{API}/repos/{run.repository}/actions/runs/{run.run_id}"
    workflow_id = WORKFLOW_ID_BASE + sum(map(ord, run.workflow))
    path = f".github/workflows/{run.workflow}.yml"
    owner = account_json(run.owner, repository_id + 1, "Organization")
    trigger = run.trigger
    actor = _actor(trigger.actor)
    head = trigger.head_repository or run.repository
    head_owner = (
        owner if head == run.repository else account_json(head.split("/")[0], repository_id + 2, "User")
    )
    head_id = repository_id if head == run.repository else repository_id + 3
    return {
        "name": run.workflow,
        "artifacts_url": f"{runs}/artifacts",
        "cancel_url": f"{runs}/cancel",
        "check_suite_url": f"{API}/repos/{run.repository}/check-suites/{CHECK_SUITE_BASE + run.run_id}",
        "check_suite_id": CHECK_SUITE_BASE + run.run_id,
        "check_suite_node_id": _node_id("CheckSuite", CHECK_SUITE_BASE + run.run_id),
        "conclusion": run.conclusion.value if run.conclusion else None,
        "created_at": iso(run.created_at),
        "event": trigger.event,
        "head_branch": "main",
        "head_commit": {
            "author": {"email": "octocat@github.com", "name": "The Octocat"},
            "committer": {"email": "noreply@github.com", "name": "GitHub"},
            "id": HEAD_SHA,
            "message": "Build on the warm pool",
            "timestamp": iso(run.created_at - 60),
            "tree_id": "c30f6c3377009c4c91c85d1f15deb6f2b7c2eb37",
        },
        "head_repository": _minimal_repository(head, head_id, head_owner, run.public),
        "head_sha": HEAD_SHA,
        "path": path,
        "display_title": "Build on the warm pool",
        "html_url": f"{WEB}/{run.repository}/actions/runs/{run.run_id}",
        "id": run.run_id,
        "jobs_url": f"{runs}/jobs",
        "logs_url": f"{runs}/logs",
        "node_id": _node_id("WorkflowRun", run.run_id),
        "pull_requests": [],
        "repository": _minimal_repository(run.repository, repository_id, owner, run.public),
        "rerun_url": f"{runs}/rerun",
        "run_number": run.run_number,
        "run_attempt": run.run_attempt,
        "run_started_at": iso(run.attempt_started_at or run.created_at),
        "previous_attempt_url": f"{runs}/attempts/{run.run_attempt - 1}" if run.run_attempt > 1 else None,
        "status": run.status.value,
        "updated_at": iso(run.updated_at or run.created_at),
        "url": runs,
        "workflow_id": workflow_id,
        "workflow_url": f"{API}/repos/{run.repository}/actions/workflows/{workflow_id}",
        "actor": actor,
        "triggering_actor": _actor(trigger.triggering_actor) if trigger.triggering_actor else actor,
    }


def _actor(login: str) -> dict[str, Any]:
    """A run's actor: the sender for a human, a Bot account for an App's (`dependabot[bot]`)."""
    if login == SENDER[0]:
        return account_json(*SENDER, "User")
    return account_json(login, 49699333 + sum(map(ord, login)), "Bot" if login.endswith("[bot]") else "User")


def _deployment(job: FakeJob, run: FakeWorkflowRun, repository_id: int) -> dict[str, Any]:
    """The `deployment` a job that refers to an environment carries in its `workflow_job` deliveries, in
    the shape of GitHub's example (tests/fixtures/github-webhooks/workflow_job.queued.with-deployment)."""
    deployments = f"{API}/repos/{run.repository}/deployments"
    deployment_id = 875000000 + job.job_id
    return {
        "url": f"{deployments}/{deployment_id}",
        "id": deployment_id,
        "node_id": _node_id("Deployment", deployment_id),
        "task": "deploy",
        "original_environment": job.environment,
        "environment": job.environment,
        "description": None,
        "created_at": iso(job.queued_at),
        "updated_at": iso(job.queued_at),
        "statuses_url": f"{deployments}/{deployment_id}/statuses",
        "repository_url": f"{API}/repos/{run.repository}",
        "creator": _actor(run.trigger.triggering_actor or run.trigger.actor),
        "sha": HEAD_SHA,
        "ref": "main",
        "payload": {},
        "transient_environment": False,
        "production_environment": False,
    }


def _steps(job: FakeJob) -> list[dict[str, Any]]:
    """The job's steps as far as they have got: none while queued or never run."""
    if job.started_at is None or job.runner_id is None:
        return []
    done = job.status is JobStatus.COMPLETED
    setup = {
        "name": "Set up job",
        "status": "completed",
        "conclusion": "success",
        "number": 1,
        "started_at": iso(job.started_at),
        "completed_at": iso(job.started_at),
    }
    work = {
        "name": "Run the job",
        "status": "completed" if done else "in_progress",
        "conclusion": (job.conclusion or Conclusion.SUCCESS).value if done else None,
        "number": 2,
        "started_at": iso(job.started_at),
        "completed_at": iso(job.completed_at) if done and job.completed_at else None,
    }
    return [setup, work]


def _context(run: FakeWorkflowRun, repository_id: int, installation_id: int | None) -> dict[str, Any]:
    """What every event of a repository carries: the repository, its organisation, the sender, the App."""
    owner_id = repository_id + 1
    context: dict[str, Any] = {
        "repository": _repository(run, repository_id, account_json(run.owner, owner_id, "Organization")),
        "organization": _organization(run.owner, owner_id),
        "sender": account_json(*SENDER, "User"),
    }
    if installation_id is not None:
        context["installation"] = {
            "id": installation_id,
            "node_id": _node_id("IntegrationInstallation", installation_id),
        }
    return context


def account_json(login: str, account_id: int, kind: str) -> dict[str, Any]:
    """A user or organisation as GitHub's `simple-user` shows it (`kind`: `User` or `Organization`)."""
    users = f"{API}/users/{login}"
    return {
        "login": login,
        "id": account_id,
        "node_id": _node_id(kind, account_id),
        "avatar_url": f"https://avatars.githubusercontent.com/u/{account_id}?v=4",
        "gravatar_id": "",
        "url": users,
        "html_url": f"{WEB}/{login}",
        "followers_url": f"{users}/followers",
        "following_url": f"{users}/following{{/other_user}}",
        "gists_url": f"{users}/gists{{/gist_id}}",
        "starred_url": f"{users}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{users}/subscriptions",
        "organizations_url": f"{users}/orgs",
        "repos_url": f"{users}/repos",
        "events_url": f"{users}/events{{/privacy}}",
        "received_events_url": f"{users}/received_events",
        "type": kind,
        "site_admin": False,
    }


def _organization(login: str, account_id: int) -> dict[str, Any]:
    orgs = f"{API}/orgs/{login}"
    return {
        "login": login,
        "id": account_id,
        "node_id": _node_id("Organization", account_id),
        "url": orgs,
        "repos_url": f"{orgs}/repos",
        "events_url": f"{orgs}/events",
        "hooks_url": f"{orgs}/hooks",
        "issues_url": f"{orgs}/issues",
        "members_url": f"{orgs}/members{{/member}}",
        "public_members_url": f"{orgs}/public_members{{/member}}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{account_id}?v=4",
        "description": "",
    }


_REPOSITORY_LINKS = {
    "archive_url": "{archive_format}{/ref}",
    "assignees_url": "assignees{/user}",
    "blobs_url": "git/blobs{/sha}",
    "branches_url": "branches{/branch}",
    "collaborators_url": "collaborators{/collaborator}",
    "comments_url": "comments{/number}",
    "commits_url": "commits{/sha}",
    "compare_url": "compare/{base}...{head}",
    "contents_url": "contents/{+path}",
    "contributors_url": "contributors",
    "deployments_url": "deployments",
    "downloads_url": "downloads",
    "events_url": "events",
    "forks_url": "forks",
    "git_commits_url": "git/commits{/sha}",
    "git_refs_url": "git/refs{/sha}",
    "git_tags_url": "git/tags{/sha}",
    "hooks_url": "hooks",
    "issue_comment_url": "issues/comments{/number}",
    "issue_events_url": "issues/events{/number}",
    "issues_url": "issues{/number}",
    "keys_url": "keys{/key_id}",
    "labels_url": "labels{/name}",
    "languages_url": "languages",
    "merges_url": "merges",
    "milestones_url": "milestones{/number}",
    "notifications_url": "notifications{?since,all,participating}",
    "pulls_url": "pulls{/number}",
    "releases_url": "releases{/id}",
    "stargazers_url": "stargazers",
    "statuses_url": "statuses/{sha}",
    "subscribers_url": "subscribers",
    "subscription_url": "subscription",
    "tags_url": "tags",
    "teams_url": "teams",
    "trees_url": "git/trees{/sha}",
}


def _minimal_repository(
    full_name: str, repository_id: int, owner: dict[str, Any], public: bool
) -> dict[str, Any]:
    """The repository as a workflow run names it: ids, names and API links."""
    api = f"{API}/repos/{full_name}"
    return {
        "id": repository_id,
        "node_id": _node_id("Repository", repository_id),
        "name": full_name.split("/", 1)[1],
        "full_name": full_name,
        "private": not public,
        "owner": owner,
        "html_url": f"{WEB}/{full_name}",
        "description": None,
        "fork": False,
        "url": api,
        **{key: f"{api}/{suffix}" for key, suffix in _REPOSITORY_LINKS.items()},
    }


def _repository(run: FakeWorkflowRun, repository_id: int, owner: dict[str, Any]) -> dict[str, Any]:
    return repository_json(run.repository, repository_id, owner, public=run.public, at=run.created_at)


def repository_json(
    full_name: str, repository_id: int, owner: dict[str, Any], *, public: bool, at: float
) -> dict[str, Any]:
    """The repository as the top level of an event, or a list of repositories, carries it: everything a
    repository shows, last pushed a minute before `at`."""
    return _minimal_repository(full_name, repository_id, owner, public) | {
        "created_at": iso(at - 365 * 86400),
        "updated_at": iso(at - 60),
        "pushed_at": iso(at - 60),
        "git_url": f"git://github.com/{full_name}.git",
        "ssh_url": f"git@github.com:{full_name}.git",
        "clone_url": f"{WEB}/{full_name}.git",
        "svn_url": f"{WEB}/{full_name}",
        "homepage": None,
        "size": 504,
        "stargazers_count": 0,
        "watchers_count": 0,
        "language": "Python",
        "has_issues": True,
        "has_projects": False,
        "has_downloads": True,
        "has_wiki": False,
        "has_pages": False,
        "forks_count": 0,
        "mirror_url": None,
        "archived": False,
        "disabled": False,
        "open_issues_count": 0,
        "license": None,
        "forks": 0,
        "open_issues": 0,
        "watchers": 0,
        "default_branch": "main",
        "is_template": False,
        "topics": [],
        "visibility": "public" if public else "private",
        "web_commit_signoff_required": False,
        "custom_properties": {},
    }


def _node_id(kind: str, number: int) -> str:
    """GitHub's legacy global node id: base64 of `<len(kind)>:<kind><id>`."""
    return base64.b64encode(f"0{len(kind)}:{kind}{number}".encode()).decode()
