"""The fake GitHub's server: `with FakeGitHub(...) as github:` serves it on a free loopback port."""

from __future__ import annotations

import base64
import json
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

from emulator.fake_github import (
    app_settings,
    check_runs,
    installations,
    rest,
    runner_groups,
    runner_protocol,
    workflow_jobs,
    workflow_runs,
)
from emulator.fake_github.actions import (
    LOST_AFTER_SECONDS,
    QUEUE_EXPIRY_SECONDS,
    REQUEUE_AFTER_SECONDS,
    Actions,
)
from emulator.fake_github.rate_limits import RateLimits
from emulator.fake_github.routes import ROUTES, Answer, Auth, Refusal, Request, Route
from emulator.fake_github.state import DEFAULT_RUNNER_GROUP_ID, FakeRunner, GitHubState
from emulator.fake_github.webhooks import Webhooks
from emulator.listening import LoopbackHandler, LoopbackServer, Served
from runner_pool.domain.clock import Clock, SystemClock

SUPPORTED_API_VERSIONS = ("2022-11-28", "2026-03-10")
DEFAULT_API_VERSION = "2022-11-28"
"""What GitHub assumes when a request names no `X-GitHub-Api-Version`."""
JWT_MAX_LIFETIME_SECONDS = 600
JWT_CLOCK_SKEW_SECONDS = 60
SHUTDOWN_POLL_SECONDS = 0.01
"""How often the server looks for a stop request; `stop` waits up to this long."""
LOST_RUNNER_CHECK_SECONDS = 0.25
"""How often a running fake looks for runners that stopped talking."""
_ENDPOINTS = (
    rest,
    app_settings,
    check_runs,
    installations,
    runner_groups,
    runner_protocol,
    workflow_jobs,
    workflow_runs,
)
"""The modules whose `@route`s make up the fake; imported for their routes."""

Gate = Callable[[str, Request], None]
"""Asked about every authenticated REST request, with its route's name (`POST /repos/{owner}/...`),
before the route answers it: raises Refusal to refuse it (as GitHub's secondary rate limits do,
with their `retry-after`), returns to let it through. The runners' own protocol passes no gate."""


class FakeGitHub(Served):
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
        lost_runner_seconds: float = LOST_AFTER_SECONDS,
        requeue_after_seconds: float = REQUEUE_AFTER_SECONDS,
        queue_expiry_seconds: float = QUEUE_EXPIRY_SECONDS,
    ) -> None:
        self.state = GitHubState(app_id, public_key_pem, clock or SystemClock())
        self.webhooks = Webhooks(self.state, app_id)
        self.actions = Actions(
            self.state,
            self.webhooks,
            lost_runner_seconds,
            requeue_after_seconds=requeue_after_seconds,
            queue_expiry_seconds=queue_expiry_seconds,
        )
        self.limits = RateLimits(self.state.clock)
        """Secondary rate limits and outages of the REST routes (emulator/fake_github/rate_limits.py)."""
        self.gates: list[Gate] = [self.limits.gate]
        """Checks every REST request passes before it is answered (see Gate): rate limits go here."""
        self._prefix = path_prefix.rstrip("/")
        self._api_versions = api_versions
        self._server: _Server | None = None
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- lifecycle

    def start(self) -> None:
        """Serve on a free port, send webhooks from sender threads, and watch for lost runners."""
        self._server = _Server(self)
        self._stopping.clear()
        self._watcher = threading.Thread(target=self._watch_runners, name="fake-github-runners", daemon=True)
        self._server.start()
        self._watcher.start()
        self.webhooks.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop()
        if self._watcher is not None:
            self._watcher.join()
        self.webhooks.stop()
        self._server, self._watcher = None, None

    def _watch_runners(self) -> None:
        while not self._stopping.wait(LOST_RUNNER_CHECK_SECONDS):
            self.actions.tick()

    @property
    def origin(self) -> str:
        return self._server.origin if self._server is not None else "http://127.0.0.1:0"

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
                # A JIT runner is ephemeral; generate-jitconfig has no option for updates, so the
                # settings carry no DisableUpdate: the agent adds it (agent/jit_config.py).
                "Ephemeral": True,
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
            if candidate.auth is Auth.RUNNER:  # a runner's own requests are not the App's
                return candidate.handler(self, request)
            # Installation requests count against their installation's hour, and their answers say what
            # is left of it (App-JWT ones have a limit of their own, not counted here).
            installation_id = None if request.installation is None else request.installation.installation_id
            try:
                if self.state.limited_on_purpose() or not (
                    installation_id is None or self.state.spend_hourly(installation_id)
                ):
                    raise Refusal(403, "API rate limit exceeded.")
                answer = self._answer(candidate, request)
            except Refusal as refusal:
                refusal.headers = {**self._rate_limit_headers(installation_id), **refusal.headers}
                raise
            return replace(answer, headers={**self._rate_limit_headers(installation_id), **answer.headers})
        raise Refusal(404, "Not Found")

    def _answer(self, route: Route, request: Request) -> Answer:
        """The route's answer, once the gates (GitHub's secondary limits, outages) let it through."""
        for gate in self.gates:
            gate(route.name, request)
        return route.handler(self, request)

    def _authenticate(self, auth: Auth, request: Request) -> Request:
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if auth is Auth.RUNNER:
            runner = self.state.runner_with_secret(credential) if scheme.lower() == "bearer" else None
            if runner is None:
                raise Refusal(401, "Bad credentials")
            return replace(request, runner=runner)
        if auth is Auth.APP:
            if scheme.lower() != "bearer":
                raise Refusal(401, "A JSON web token could not be decoded")
            return replace(request, app_id=self._check_app_jwt(credential))
        installation = None
        if scheme.lower() in ("token", "bearer"):
            installation = self.state.installation_for(credential)
        if installation is None:
            raise Refusal(401, "Bad credentials")
        return replace(request, installation=installation)

    def _check_app_jwt(self, token: str) -> int:
        """GitHub's checks of an App JWT: signed RS256 by the App's key, issued by the App, in date; the
        App's id."""
        try:
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
            app_id = int(str(issuer))
        except (jwt.PyJWTError, ValueError):
            raise Refusal(401, "A JSON web token could not be decoded") from None
        public_key = self.state.public_key_of(app_id)
        if public_key is None:
            raise Refusal(401, "'Issuer' claim ('iss') must be the App's id")
        try:
            claims = jwt.decode(
                token,
                public_key,
                algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "require": ["iat", "exp", "iss"]},
            )
        except jwt.PyJWTError:
            raise Refusal(401, "A JSON web token could not be decoded") from None
        now = self.state.clock.now()
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
        return app_id

    def _rate_limit_headers(self, installation_id: int | None) -> dict[str, str]:
        """GitHub's primary-limit headers ("Rate limits for the REST API", "Checking the status of your
        rate limit"): the installation's hour as counted, or nothing left while exhausted on purpose;
        none for an App's own requests (their limit is not counted here)."""
        limit = self.state.hourly_limit
        if self.state.limited_on_purpose():
            used, reset = limit, self.state.rate_limited_until or 0.0
        elif installation_id is None:
            return {}
        else:
            used, reset = self.state.hourly_status(installation_id)
        return {
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(max(0, limit - used)),
            "x-ratelimit-reset": str(int(reset)),
            "x-ratelimit-used": str(used),
            "x-ratelimit-resource": "core",
        }


class _Server(LoopbackServer):
    def __init__(self, fake: FakeGitHub) -> None:
        super().__init__(_HttpHandler, name="fake-github", poll_seconds=SHUTDOWN_POLL_SECONDS)
        self.fake = fake


class _HttpHandler(LoopbackHandler):
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

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def _serve(self) -> None:
        answer = self.server.fake.handle(self.command, self.path, dict(self.headers.items()), self.body())
        headers = list(answer.headers.items())
        if answer.body is None:
            self.reply(answer.status, headers, b"")
        else:
            json_type = ("Content-Type", "application/json; charset=utf-8")
            self.reply(answer.status, [*headers, json_type], json.dumps(answer.body).encode())


def decode_jit_config(encoded: str) -> dict[str, Any]:
    """The runner files inside an encoded JIT config, each decoded (`.runner`, `.credentials`, ...)."""
    files = json.loads(base64.b64decode(encoded))
    return {name: json.loads(base64.b64decode(content)) for name, content in files.items()}


def _b64_json(content: Any) -> str:
    return base64.b64encode(json.dumps(content).encode()).decode()
