"""A fake of exactly the GitHub REST endpoints runner-pool calls, as a real HTTP server on 127.0.0.1.

All state lives in one GitHubState; each endpoint is one function in a route table (`@route`), so
more of GitHub (workflow runs and jobs, webhooks, runner connections) is added as more state and
more routes. Answers are shaped like GitHub's, down to the error bodies, the pagination links and
the rate-limit headers, and tests/unit/test_fake_github_shapes.py validates each one against
githubkit's models, which are generated from GitHub's own API description.

    POST   /app/installations/{installation_id}/access_tokens        App JWT
    GET    /app/hook/deliveries                                       App JWT
    POST   /app/hook/deliveries/{delivery_id}/attempts                App JWT
    POST   /repos/{owner}/{repo}/actions/runners/generate-jitconfig   installation token
    GET    /repos/{owner}/{repo}/actions/runners                      installation token
    DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}          installation token
    ... and the same three runner endpoints under /orgs/{org}

Where GitHub's documentation is silent the fake makes a choice and says so: an unknown runner
group in a JIT request is a 422.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

from runner_pool.domain.clock import Clock, Epoch, SystemClock
from runner_pool.domain.runner_scope import OrganizationScope, RepositoryScope, RunnerScope

DOCS = "https://docs.github.com/rest"
SUPPORTED_API_VERSIONS = ("2022-11-28", "2026-03-10")
DEFAULT_API_VERSION = "2022-11-28"
"""What GitHub assumes when a request names no `X-GitHub-Api-Version`."""
TOKEN_LIFETIME_SECONDS = 3600
JWT_MAX_LIFETIME_SECONDS = 600
JWT_CLOCK_SKEW_SECONDS = 60
RATE_LIMIT = 5000
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
DEFAULT_RUNNER_GROUP_ID = 1
SHUTDOWN_POLL_SECONDS = 0.01
"""How often the server looks for a stop request; `stop` waits up to this long."""
RUNNER_PERMISSIONS = {"administration": "write", "organization_self_hosted_runners": "write"}
"""What an App needs for repository runners and for organisation runners."""


# --- state -----------------------------------------------------------------------------------------


@dataclass
class FakeInstallation:
    installation_id: int
    account: str
    permissions: dict[str, str]

    def owns(self, account: str) -> bool:
        return self.account.lower() == account.lower()


@dataclass(frozen=True)
class FakeLabel:
    label_id: int
    name: str
    type: str
    """`read-only` for the labels GitHub gives every self-hosted runner, `custom` for the ones asked for."""


@dataclass
class FakeRunner:
    runner_id: int
    name: str
    scope: RunnerScope
    runner_group_id: int
    labels: list[FakeLabel]
    work_folder: str
    secret: str = field(repr=False)
    """What a runner started from its JIT config would authenticate with."""
    online: bool = False
    busy: bool = False
    os: str = "unknown"
    """GitHub learns the OS when the runner first connects; a fresh JIT runner has none yet."""


@dataclass(frozen=True)
class FakeDelivery:
    delivery_id: int
    guid: str
    event: str
    action: str | None
    status_code: int
    delivered_at: Epoch
    redelivery: bool = False
    installation_id: int | None = None
    repository_id: int | None = None

    @property
    def status(self) -> str:
        if 200 <= self.status_code < 300:
            return "OK"
        if self.status_code == 0:
            return "failed to connect to host"
        return f"Invalid HTTP Response: {self.status_code}"


@dataclass
class GitHubState:
    """Everything the fake knows. Every method is safe to call from the server's threads and from tests."""

    app_id: int
    public_key_pem: str = field(repr=False)
    clock: Clock = field(default_factory=SystemClock)
    installations: dict[int, FakeInstallation] = field(default_factory=dict)
    runners: dict[int, FakeRunner] = field(default_factory=dict)
    deliveries: dict[int, FakeDelivery] = field(default_factory=dict)
    runner_groups: dict[str, set[int]] = field(default_factory=dict)
    """Runner group ids per organisation (lowercased) beyond the Default group every owner has."""
    redelivery_requests: list[int] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    """Requests received, per route (`POST /app/installations/{installation_id}/access_tokens`)."""
    connections: int = 0
    rate_limited_until: Epoch | None = None
    webhook_receiver: Callable[[FakeDelivery], int] = field(default=lambda _delivery: 200, repr=False)
    """Where a redelivery goes; answers the HTTP status the receiver gave. Accepts everything until
    the emulator points it at the webhook endpoint."""
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _tokens: dict[str, tuple[int, Epoch]] = field(default_factory=dict, repr=False)
    _label_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _next_id: int = 1000

    # --- the App and its installations

    def add_installation(
        self, installation_id: int, account: str, permissions: Mapping[str, str] | None = None
    ) -> FakeInstallation:
        installation = FakeInstallation(
            installation_id, account, dict(RUNNER_PERMISSIONS if permissions is None else permissions)
        )
        with self.lock:
            self.installations[installation_id] = installation
        return installation

    def issue_token(self, installation_id: int) -> tuple[str, Epoch]:
        token = f"ghs_{secrets.token_hex(18)}"
        expires_at = float(int(self.clock.now()) + TOKEN_LIFETIME_SECONDS)
        with self.lock:
            self._tokens[token] = (installation_id, expires_at)
        return token, expires_at

    def installation_for(self, token: str) -> FakeInstallation | None:
        """The installation a token was issued to, while it is neither expired nor revoked."""
        with self.lock:
            issued = self._tokens.get(token)
            if issued is None or issued[1] <= self.clock.now():
                return None
            return self.installations.get(issued[0])

    def revoke_tokens(self) -> None:
        with self.lock:
            self._tokens.clear()

    @property
    def token_requests(self) -> int:
        return self.calls[f"POST {ACCESS_TOKENS}"]

    def exhaust_rate_limit(self, until: Epoch) -> None:
        """Refuse every authenticated request as over the primary rate limit until `until`."""
        with self.lock:
            self.rate_limited_until = until

    def rate_limited(self) -> bool:
        with self.lock:
            return self.rate_limited_until is not None and self.clock.now() < self.rate_limited_until

    # --- runners

    def add_runner_group(self, org: str, runner_group_id: int) -> None:
        with self.lock:
            self.runner_groups.setdefault(org.lower(), set()).add(runner_group_id)

    def has_runner_group(self, scope: RunnerScope, runner_group_id: int) -> bool:
        if runner_group_id == DEFAULT_RUNNER_GROUP_ID:
            return True
        if isinstance(scope, RepositoryScope):
            return False
        with self.lock:
            return runner_group_id in self.runner_groups.get(scope.org.lower(), set())

    def register_runner(
        self,
        scope: RunnerScope,
        name: str,
        labels: list[str],
        runner_group_id: int = DEFAULT_RUNNER_GROUP_ID,
        work_folder: str = "_work",
    ) -> FakeRunner:
        """A runner as GitHub records it at registration: offline until it connects."""
        with self.lock:
            runner = FakeRunner(
                runner_id=self._new_id(),
                name=name,
                scope=scope,
                runner_group_id=runner_group_id,
                labels=[self._label("self-hosted", "read-only"), *(self._label(n, "custom") for n in labels)],
                work_folder=work_folder,
                secret=secrets.token_hex(16),
            )
            self.runners[runner.runner_id] = runner
            return runner

    def runners_in(self, scope: RunnerScope, name: str | None = None) -> list[FakeRunner]:
        with self.lock:
            return [
                runner
                for runner in sorted(self.runners.values(), key=lambda r: r.runner_id)
                if runner.scope == scope and (name is None or runner.name == name)
            ]

    def set_runner_state(self, runner_id: int, *, online: bool, busy: bool = False) -> None:
        with self.lock:
            runner = self.runners[runner_id]
            runner.online = online
            runner.busy = busy

    # --- webhook deliveries

    def add_delivery(
        self,
        event: str,
        action: str | None,
        status_code: int,
        *,
        guid: str | None = None,
        redelivery: bool = False,
        installation_id: int | None = None,
        repository_id: int | None = None,
    ) -> FakeDelivery:
        """One attempt at delivering an event, made now; `guid` names the event (new if not given)."""
        with self.lock:
            delivery = FakeDelivery(
                delivery_id=self._new_id(),
                guid=guid or str(uuid.uuid4()),
                event=event,
                action=action,
                status_code=status_code,
                delivered_at=self.clock.now(),
                redelivery=redelivery,
                installation_id=installation_id,
                repository_id=repository_id,
            )
            self.deliveries[delivery.delivery_id] = delivery
            return delivery

    def redeliver(self, delivery_id: int) -> FakeDelivery:
        """A new attempt at a delivery's event, sent to the webhook receiver outside the lock."""
        with self.lock:
            original = self.deliveries[delivery_id]
            self.redelivery_requests.append(delivery_id)
        status_code = self.webhook_receiver(original)
        return self.add_delivery(
            original.event,
            original.action,
            status_code,
            guid=original.guid,
            redelivery=True,
            installation_id=original.installation_id,
            repository_id=original.repository_id,
        )

    def _new_id(self) -> int:
        with self.lock:
            self._next_id += 1
            return self._next_id

    def _label(self, name: str, kind: str) -> FakeLabel:
        with self.lock:
            label_id = self._label_ids.setdefault(name, len(self._label_ids) + 1)
        return FakeLabel(label_id, name, kind)


# --- requests, answers and the route table ----------------------------------------------------------


class Auth(Enum):
    APP = "App JWT"
    INSTALLATION = "installation token"


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


# --- the endpoints ----------------------------------------------------------------------------------

ACCESS_TOKENS = "/app/installations/{installation_id}/access_tokens"


@route("POST", ACCESS_TOKENS, Auth.APP)
def create_installation_token(github: FakeGitHub, request: Request) -> Answer:
    installation = github.state.installations.get(_int(request.params["installation_id"]))
    if installation is None:
        raise Refusal(404, "Not Found")
    token, expires_at = github.state.issue_token(installation.installation_id)
    return Answer(
        201,
        {
            "token": token,
            "expires_at": _iso(expires_at),
            "permissions": installation.permissions,
            "repository_selection": "all",
        },
    )


@route("POST", "/repos/{owner}/{repo}/actions/runners/generate-jitconfig", Auth.INSTALLATION)
@route("POST", "/orgs/{org}/actions/runners/generate-jitconfig", Auth.INSTALLATION)
def generate_jitconfig(github: FakeGitHub, request: Request) -> Answer:
    scope = _runner_scope(request)
    body = request.json()
    if not isinstance(body, dict):
        raise Refusal(400, "Problems parsing JSON")
    name, group, labels = body.get("name"), body.get("runner_group_id"), body.get("labels")
    if not isinstance(name, str) or not name:
        raise _invalid("name", name)
    if not isinstance(group, int) or isinstance(group, bool):
        raise _invalid("runner_group_id", group)
    if not isinstance(labels, list) or not 1 <= len(labels) <= 100:
        raise _invalid("labels", labels)
    if not all(isinstance(label, str) and label for label in labels):
        raise _invalid("labels", labels)
    work_folder = body.get("work_folder", "_work")
    state = github.state
    with state.lock:
        if not state.has_runner_group(scope, group):
            raise Refusal(422, f"Invalid request.\n\nNo runner group with id {group}.", [])
        if state.runners_in(scope, name):
            raise Refusal(409, f"Already exists - A runner with the name {name} already exists.")
        runner = state.register_runner(scope, name, labels, group, work_folder)
    return Answer(201, {"runner": _runner_json(runner), "encoded_jit_config": github.jit_config_for(runner)})


@route("GET", "/repos/{owner}/{repo}/actions/runners", Auth.INSTALLATION)
@route("GET", "/orgs/{org}/actions/runners", Auth.INSTALLATION)
def list_runners(github: FakeGitHub, request: Request) -> Answer:
    scope = _runner_scope(request)
    runners = github.state.runners_in(scope, request.query.get("name"))
    per_page = _per_page(request)
    page = max(1, _int(request.query.get("page", "1")))
    shown = runners[(page - 1) * per_page : page * per_page]
    last = max(1, -(-len(runners) // per_page))
    links = {"next": page + 1, "last": last} if page < last else {}
    if page > 1:
        links = {"prev": page - 1, "first": 1, **links}
    headers = {}
    if links:
        keep = {k: v for k, v in request.query.items() if k != "page"} | {"per_page": str(per_page)}
        headers["Link"] = ", ".join(
            f'<{github.link(request.path, keep | {"page": str(number)})}>; rel="{rel}"'
            for rel, number in links.items()
        )
    body = {"total_count": len(runners), "runners": [_runner_json(runner) for runner in shown]}
    return Answer(200, body, headers)


@route("DELETE", "/repos/{owner}/{repo}/actions/runners/{runner_id}", Auth.INSTALLATION)
@route("DELETE", "/orgs/{org}/actions/runners/{runner_id}", Auth.INSTALLATION)
def delete_runner(github: FakeGitHub, request: Request) -> Answer:
    scope = _runner_scope(request)
    state = github.state
    with state.lock:
        runner = state.runners.get(_int(request.params["runner_id"]))
        if runner is None or runner.scope != scope:
            raise Refusal(404, "Not Found")
        if runner.busy:
            raise Refusal(422, f'Bad request - Runner "{runner.name}" is still running a job"', [])
        del state.runners[runner.runner_id]
    return Answer(204)


@route("GET", "/app/hook/deliveries", Auth.APP)
def list_deliveries(github: FakeGitHub, request: Request) -> Answer:
    """Newest first, a page at a time; the `next` link carries an opaque cursor, as GitHub's does."""
    per_page = _per_page(request)
    cursor = request.query.get("cursor")
    before = None
    if cursor is not None:
        if not re.fullmatch(r"v1_\d+", cursor):
            raise Refusal(400, "Invalid cursor")
        before = int(cursor.removeprefix("v1_"))
    with github.state.lock:
        newest_first = sorted(github.state.deliveries.values(), key=lambda d: d.delivery_id, reverse=True)
    matching = [d for d in newest_first if before is None or d.delivery_id < before]
    shown = matching[:per_page]
    headers = {}
    if len(matching) > per_page:
        keep = {k: v for k, v in request.query.items() if k != "cursor"} | {"per_page": str(per_page)}
        next_url = github.link(request.path, keep | {"cursor": f"v1_{shown[-1].delivery_id}"})
        headers["Link"] = f'<{next_url}>; rel="next"'
    return Answer(200, [_delivery_json(delivery) for delivery in shown], headers)


@route("POST", "/app/hook/deliveries/{delivery_id}/attempts", Auth.APP)
def redeliver(github: FakeGitHub, request: Request) -> Answer:
    delivery_id = _int(request.params["delivery_id"])
    if delivery_id not in github.state.deliveries:
        raise Refusal(404, "Not Found")
    github.state.redeliver(delivery_id)
    return Answer(202, {})


# --- the server -------------------------------------------------------------------------------------


class FakeGitHub:
    """The fake GitHub App host: `with FakeGitHub(...) as github:` serves it on a free loopback port.

    `path_prefix="/api/v3"` and `api_versions=("2022-11-28",)` make it answer like GitHub
    Enterprise Server. `handle` answers one request without the network, for unit tests.
    """

    def __init__(
        self,
        app_id: int,
        public_key_pem: str,
        *,
        clock: Clock | None = None,
        path_prefix: str = "",
        api_versions: tuple[str, ...] = SUPPORTED_API_VERSIONS,
    ) -> None:
        self.state = GitHubState(app_id, public_key_pem, clock or SystemClock())
        self._prefix = path_prefix.rstrip("/")
        self._api_versions = api_versions
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle

    def __enter__(self) -> FakeGitHub:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name="fake-github",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    @property
    def origin(self) -> str:
        port = self._server.server_address[1] if self._server is not None else 0
        return f"http://127.0.0.1:{port}"

    @property
    def url(self) -> str:
        """The API's base URL, as the client's `base_url`."""
        return f"{self.origin}{self._prefix}/"

    def link(self, path: str, query: Mapping[str, str]) -> str:
        return f"{self.origin}{self._prefix}{path}?{urlencode(query)}"

    def jit_config_for(self, runner: FakeRunner) -> str:
        """The encoded config of a JIT runner: base64 JSON of the runner's files, each base64 JSON."""
        owner = str(runner.scope)
        files = {
            ".runner": {
                "AgentId": runner.runner_id,
                "AgentName": runner.name,
                "PoolId": runner.runner_group_id,
                "PoolName": "Default" if runner.runner_group_id == DEFAULT_RUNNER_GROUP_ID else "",
                "ServerUrl": self.url,
                "GitHubUrl": f"{self.origin}/{owner}",
                "WorkFolder": runner.work_folder,
                "Ephemeral": True,
                "DisableUpdate": True,
            },
            ".credentials": {"Scheme": "OAuthAccessToken", "Data": {"token": runner.secret}},
            ".credentials_rsaparams": {},
        }
        return _b64_json({name: _b64_json(content) for name, content in files.items()})

    # --- answering

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"") -> Answer:
        """Answer one request (`target` is the path and query, as on the request line)."""
        headers = {name.lower(): value for name, value in headers.items()}
        try:
            version = headers.get("x-github-api-version", DEFAULT_API_VERSION)
            answer = self._route(method, target, headers, body, version)
        except Refusal as refusal:
            answer = refusal.answer()
            version = DEFAULT_API_VERSION
        common = {
            "x-github-api-version-selected": version,
            "x-github-request-id": uuid.uuid4().hex[:20].upper(),
            **self._rate_limit_headers(),
        }
        return Answer(answer.status, answer.body, {**common, **answer.headers})

    def _route(self, method: str, target: str, headers: dict[str, str], body: bytes, version: str) -> Answer:
        parts = urlsplit(target)
        if not parts.path.startswith(f"{self._prefix}/"):
            raise Refusal(404, "Not Found")
        path = parts.path.removeprefix(self._prefix)
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        for candidate in ROUTES:
            match = candidate.pattern.match(path)
            if match is None or candidate.method != method:
                continue
            with self.state.lock:
                self.state.calls[candidate.name] += 1
            if version not in self._api_versions:
                raise Refusal(
                    400,
                    f"Unsupported 'X-GitHub-Api-Version' header: {version}. "
                    f"Supported versions are: {', '.join(self._api_versions)}.",
                )
            request = Request(method, path, query, headers, body, match.groupdict())
            request = self._authenticate(candidate.auth, request)
            if self.state.rate_limited():
                raise Refusal(403, "API rate limit exceeded.", headers=self._rate_limit_headers())
            return candidate.handler(self, request)
        raise Refusal(404, "Not Found")

    def _authenticate(self, auth: Auth, request: Request) -> Request:
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if auth is Auth.APP:
            if scheme.lower() != "bearer":
                raise Refusal(401, "A JSON web token could not be decoded")
            self._check_app_jwt(credential)
            return request
        installation = None
        if scheme.lower() in ("token", "bearer"):
            installation = self.state.installation_for(credential)
        if installation is None:
            raise Refusal(401, "Bad credentials")
        return replace(request, installation=installation)

    def _check_app_jwt(self, token: str) -> None:
        """GitHub's checks of an App JWT: signed RS256 by the App's key, issued by the App, in date."""
        try:
            claims = jwt.decode(
                token,
                self.state.public_key_pem,
                algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "require": ["iat", "exp", "iss"]},
            )
        except jwt.PyJWTError:
            raise Refusal(401, "A JSON web token could not be decoded") from None
        now = self.state.clock.now()
        if str(claims["iss"]) != str(self.state.app_id):
            raise Refusal(401, "'Issuer' claim ('iss') must be the App's id")
        if not isinstance(claims["exp"], int) or claims["exp"] <= now:
            raise Refusal(
                401,
                "'Expiration time' claim ('exp') must be a numeric value representing the future time "
                "at which the assertion expires",
            )
        if not isinstance(claims["iat"], int) or claims["iat"] > now + JWT_CLOCK_SKEW_SECONDS:
            raise Refusal(
                401,
                "'Issued at' claim ('iat') must be an Integer representing the time that the assertion "
                "was issued",
            )
        if claims["exp"] > now + JWT_MAX_LIFETIME_SECONDS:
            raise Refusal(401, "'Expiration time' claim ('exp') is too far in the future")

    def _rate_limit_headers(self) -> dict[str, str]:
        now = self.state.clock.now()
        limited = self.state.rate_limited()
        reset = self.state.rate_limited_until if limited and self.state.rate_limited_until else now + 3600
        return {
            "x-ratelimit-limit": str(RATE_LIMIT),
            "x-ratelimit-remaining": "0" if limited else str(RATE_LIMIT - 1),
            "x-ratelimit-reset": str(int(reset)),
            "x-ratelimit-used": str(RATE_LIMIT if limited else 1),
            "x-ratelimit-resource": "core",
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeGitHub) -> None:
        super().__init__(("127.0.0.1", 0), _HttpHandler)
        self.fake = fake


class _HttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as two writes; without this, Nagle holds the body back for the
        # client's delayed ACK, 40 ms a request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.fake.state.lock:
            self.server.fake.state.connections += 1

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = self.server.fake.handle(self.command, self.path, dict(self.headers.items()), body)
        payload = b"" if answer.body is None else json.dumps(answer.body).encode()
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        if answer.body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request otherwise."""


# --- shapes -----------------------------------------------------------------------------------------


def decode_jit_config(encoded: str) -> dict[str, Any]:
    """The runner files inside an encoded JIT config, each decoded (`.runner`, `.credentials`, ...)."""
    files = json.loads(base64.b64decode(encoded))
    return {name: json.loads(base64.b64decode(content)) for name, content in files.items()}


def _runner_scope(request: Request) -> RunnerScope:
    """The scope a runner route names, if the calling installation may manage its runners."""
    installation = request.installation
    if installation is None:
        raise Refusal(401, "Bad credentials")
    params = request.params
    if "org" in params:
        scope: RunnerScope = OrganizationScope(org=params["org"])
        account, permission = params["org"], "organization_self_hosted_runners"
    else:
        scope = RepositoryScope(owner=params["owner"], repo=params["repo"])
        account, permission = params["owner"], "administration"
    if not installation.owns(account):
        raise Refusal(404, "Not Found")
    if installation.permissions.get(permission) != "write":
        raise Refusal(403, "Resource not accessible by integration")
    return scope


def _runner_json(runner: FakeRunner) -> dict[str, Any]:
    return {
        "id": runner.runner_id,
        "runner_group_id": runner.runner_group_id,
        "name": runner.name,
        "os": runner.os,
        "status": "online" if runner.online else "offline",
        "busy": runner.busy,
        "ephemeral": True,
        "labels": [{"id": label.label_id, "name": label.name, "type": label.type} for label in runner.labels],
    }


def _delivery_json(delivery: FakeDelivery) -> dict[str, Any]:
    return {
        "id": delivery.delivery_id,
        "guid": delivery.guid,
        "delivered_at": _iso(delivery.delivered_at),
        "redelivery": delivery.redelivery,
        "duration": 0.27,
        "status": delivery.status,
        "status_code": delivery.status_code,
        "event": delivery.event,
        "action": delivery.action,
        "installation_id": delivery.installation_id,
        "repository_id": delivery.repository_id,
        "throttled_at": None,
    }


def _invalid(key: str, value: Any) -> Refusal:
    if value is None:
        return Refusal(422, f'Invalid request.\n\n"{key}" wasn\'t supplied.', [])
    return Refusal(422, f'Invalid request.\n\nInvalid value for "{key}".', [])


def _per_page(request: Request) -> int:
    return min(MAX_PER_PAGE, max(1, _int(request.query.get("per_page", str(DEFAULT_PER_PAGE)))))


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Refusal(404, "Not Found") from None


def _iso(epoch: Epoch) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _b64_json(content: Any) -> str:
    return base64.b64encode(json.dumps(content).encode()).decode()
