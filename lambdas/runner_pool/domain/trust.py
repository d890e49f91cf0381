"""A job's level of trust, from what GitHub says about its run, and who may follow whom on an instance.

Reuse is safe only between jobs that may see each other's leftovers. GitHub's own words draw the line:
self-hosted runners "can be persistently compromised by untrusted code in a workflow", and jobs that
use an environment on a self-hosted runner "are not run in an isolated environment" (docs.github.com,
"Secure use reference", Hardening for self-hosted runners). So a job is one of three levels:

- UNTRUSTED: it runs code anyone with a branch or a fork wrote, or code written by others for it. A pull
  request's run of any kind (`pull_request`, `pull_request_target`, its reviews and comments), a merge
  queue's (`merge_group`: "a merge group includes the changes from one or more pull requests", GitHub
  changelog 2022-08-18), a run whose head repository is not its repository (a fork), Dependabot's
  (`github.actor == 'dependabot[bot]'`; GitHub: Dependabot's runs "are treated as if they were opened
  from a repository fork", "Troubleshooting Dependabot on GitHub Actions"), and anything triggered by
  someone who need not be a collaborator (`issue_comment`, `issues`, `discussion`, `fork`, `watch`...).
  An event GitHub may add later, or one this table does not name, is untrusted: the table fails closed.
- TRUSTED: it runs reviewed code of the repository: `push`, `schedule`, `workflow_dispatch`, `release`,
  `repository_dispatch` and the like.
- PRIVILEGED: its job targets an environment (the `workflow_job` payload's `deployment`, present
  "when a job refers to an environment key in its YAML definition", GitHub changelog 2022-11-22): it
  holds that environment's secrets, and often mints an OIDC token for production. It never takes a
  reused instance and never leaves its own to the pool.

A level that cannot be decided (neither the run's `requested` delivery nor GitHub's answer about the
run is at hand) is None, and None is served single use: the job gets a pristine instance and nobody
follows it. An operator may map events to levels (`reuse.trust_by_event`), never to a level above what
the run's actor and head repository allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class TrustLevel(StrEnum):
    UNTRUSTED = "untrusted"
    TRUSTED = "trusted"
    PRIVILEGED = "privileged"


TRUSTED_EVENTS = frozenset(
    {
        "branch_protection_rule",
        "check_run",
        "check_suite",
        "create",
        "delete",
        "deployment",
        "deployment_status",
        "image_version",
        "label",
        "milestone",
        "page_build",
        "public",
        "push",
        "registry_package",
        "release",
        "repository_dispatch",
        "schedule",
        "status",
        "workflow_dispatch",
    }
)
"""Events only someone with write access (or GitHub on their behalf) can cause, whose run executes the
repository's own code."""

UNTRUSTED_EVENTS = frozenset(
    {
        "discussion",
        "discussion_comment",
        "fork",
        "gollum",
        "issue_comment",
        "issues",
        "merge_group",
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
        "pull_request_target",
        "watch",
        "workflow_call",
        "workflow_run",
    }
)
"""Events a pull request, a fork or someone who need not be a collaborator can cause, `workflow_run`
included: it runs after another workflow, which may have been a pull request's, and is the classic way
such a run's output reaches a privileged one ("Keeping your GitHub Actions and workflows secure:
Preventing pwn requests")."""

WORKFLOW_EVENTS = TRUSTED_EVENTS | UNTRUSTED_EVENTS
"""The events that trigger workflows (docs.github.com, "Events that trigger workflows"): the names a
run's `event` can carry, and so the only names `reuse.trust_by_event` may map. One GitHub adds later is
in neither table, and untrusted."""

DEPENDABOT = "dependabot[bot]"
"""The actor Dependabot's runs carry (`github.actor == 'dependabot[bot]'`, "Troubleshooting Dependabot
on GitHub Actions"); its restrictions "apply even if the workflow is re-run by a different actor"."""


@dataclass(frozen=True)
class RunFacts:
    """What GitHub says about a workflow run attempt, from its `workflow_run` delivery or its REST read."""

    repository: str
    event: str
    actor: str | None = None
    triggering_actor: str | None = None
    head_repository: str | None = None
    """None when GitHub does not say: treated as a fork's, the side that never shares."""


def run_trust(facts: RunFacts, by_event: Mapping[str, TrustLevel] | None = None) -> TrustLevel:
    """The level of a run's jobs before any job's own `deployment` is seen."""
    if from_fork(facts) or DEPENDABOT in (facts.actor, facts.triggering_actor):
        return TrustLevel.UNTRUSTED
    configured = (by_event or {}).get(facts.event)
    if configured is not None:
        return configured
    return TrustLevel.TRUSTED if facts.event in TRUSTED_EVENTS else TrustLevel.UNTRUSTED


def job_trust(run: TrustLevel | None, *, deployment: bool) -> TrustLevel | None:
    """A job's own level: privileged when it targets an environment, whatever its run; else its run's
    (None: not known, served single use)."""
    if deployment:
        return TrustLevel.PRIVILEGED
    return run


def reuses(level: TrustLevel | None) -> bool:
    """Whether a job of this level may take a used instance and leave its own to the pool."""
    return level in (TrustLevel.UNTRUSTED, TrustLevel.TRUSTED)


def may_follow(served: TrustLevel | None, level: TrustLevel | None, *, used: bool) -> bool:
    """Whether a job of `level` may take an instance that last served a job of `served` (`used`), or a
    pristine one (booted, never used: any job may take it)."""
    if not used:
        return True
    return reuses(level) and served is level


def from_fork(facts: RunFacts) -> bool:
    """Whether the run's commit comes from another repository than the run's (a fork's pull request), or
    GitHub does not say where it comes from."""
    return facts.head_repository is None or facts.head_repository.lower() != facts.repository.lower()


def least_trusted(levels: Iterable[TrustLevel | None]) -> TrustLevel | None:
    """The level of jobs that may come from any of these runs: the least trusted of them, None (not
    known, served single use) when any is not known or there are none."""
    seen = list(levels)
    if not seen or None in seen:
        return None
    if TrustLevel.UNTRUSTED in seen:
        return TrustLevel.UNTRUSTED
    if TrustLevel.TRUSTED in seen:
        return TrustLevel.TRUSTED
    return TrustLevel.PRIVILEGED
