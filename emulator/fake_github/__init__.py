"""A fake GitHub for the emulator and the tests: the REST endpoints runner-pool calls, workflow runs and
jobs that send signed webhooks, and runners started from JIT configs that take those jobs.

It is a real HTTP server on 127.0.0.1 (`with FakeGitHub(...) as github:`). All state lives in one
GitHubState (state.py); each endpoint is one function in a route table (`@route`, routes.py): the
REST endpoints in rest.py, the runners' own small protocol in runner_protocol.py. Actions
(actions.py) plays GitHub Actions: runs, jobs, and handing a queued job to a connected runner whose
labels match. Webhooks (webhooks.py) signs and sends the events, records every attempt as a
delivery for the App's hook deliveries API, and can be told to drop some. Answers and webhook
bodies are shaped like GitHub's, and tests/unit/test_fake_github_*.py validate them against
githubkit's models, which are generated from GitHub's own API description.
"""

from emulator.fake_github.actions import JobSpec
from emulator.fake_github.routes import Answer, Refusal, Request
from emulator.fake_github.server import FakeGitHub, decode_jit_config
from emulator.fake_github.state import (
    Conclusion,
    FakeDelivery,
    FakeJob,
    FakeRunner,
    FakeWorkflowRun,
    GitHubState,
    JobStatus,
)
from emulator.fake_github.webhooks import signature

__all__ = [
    "Answer",
    "Conclusion",
    "FakeDelivery",
    "FakeGitHub",
    "FakeJob",
    "FakeRunner",
    "FakeWorkflowRun",
    "GitHubState",
    "JobSpec",
    "JobStatus",
    "Refusal",
    "Request",
    "decode_jit_config",
    "signature",
]
