"""The fake GitHub's route table: requests, answers in GitHub's shapes, and `@route` to add an endpoint."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from emulator.fake_github.state import FakeInstallation, FakeRunner
from runner_pool.domain.clock import Epoch

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub

DOCS = "https://docs.github.com/rest"
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100


class Auth(Enum):
    APP = "App JWT"
    INSTALLATION = "installation token"
    RUNNER = "runner credential"
    """The fake's own runner protocol: the token in the runner's JIT config."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    """Below the fake's path prefix, e.g. `/repos/octo/app/actions/runners`."""
    query: Mapping[str, str]
    headers: Mapping[str, str]
    """Lowercased names."""
    body: bytes
    params: Mapping[str, str] = field(default_factory=dict)
    """The path's `{placeholders}`."""
    installation: FakeInstallation | None = None
    """Who sent it, for installation-token routes."""
    runner: FakeRunner | None = None
    """Who sent it, for runner routes."""
    app_id: int | None = None
    """The App that signed it, for App-JWT routes."""

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            raise Refusal(400, "Problems parsing JSON") from None


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any = None
    """JSON-able; None for no body (204)."""
    headers: Mapping[str, str] = field(default_factory=dict)


class Refusal(Exception):  # noqa: N818 - an answer, not an error of the fake
    """An error answer, in the shape of GitHub's error bodies."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = dict(headers or {})

    def answer(self) -> Answer:
        """A BasicError, or with `errors` a ValidationErrorSimple (which has no `status`)."""
        body: dict[str, Any] = {"message": self.message, "documentation_url": DOCS}
        if self.errors is None:
            body["status"] = str(self.status)
        else:
            body["errors"] = self.errors
        return Answer(self.status, body, self.headers)


Handler = Callable[["FakeGitHub", Request], Answer]


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    auth: Auth
    handler: Handler
    pattern: re.Pattern[str]

    @property
    def name(self) -> str:
        return f"{self.method} {self.template}"


ROUTES: list[Route] = []


def route(method: str, template: str, auth: Auth) -> Callable[[Handler], Handler]:
    """Add an endpoint: `template` names its placeholders in braces, as GitHub's docs write paths."""
    pattern = re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$")

    def register(handler: Handler) -> Handler:
        ROUTES.append(Route(method, template, auth, handler, pattern))
        return handler

    return register


def invalid(key: str, value: Any) -> Refusal:
    if value is None:
        return Refusal(422, f'Invalid request.\n\n"{key}" wasn\'t supplied.', [])
    return Refusal(422, f'Invalid request.\n\nInvalid value for "{key}".', [])


def per_page(request: Request) -> int:
    return min(MAX_PER_PAGE, max(1, whole(request.query.get("per_page", str(DEFAULT_PER_PAGE)))))


def whole(text: str) -> int:
    """A path or query number; anything else is GitHub's 404."""
    try:
        return int(text)
    except ValueError:
        raise Refusal(404, "Not Found") from None


def iso(epoch: Epoch) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
