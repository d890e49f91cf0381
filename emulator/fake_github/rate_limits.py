"""GitHub's secondary rate limits and outages, as the fake plays them on its REST routes.

What GitHub documents ("Rate limits for the REST API", docs.github.com/en/rest/using-the-rest-api/
rate-limits-for-the-rest-api, sections "About secondary rate limits", "Calculating points for the
secondary rate limit" and "Exceeding the rate limit"):

- "No more than 900 points per minute are allowed for REST API endpoints", counted per endpoint;
  most GET, HEAD and OPTIONS requests cost 1 point, most POST, PATCH, PUT and DELETE requests 5.
  The JIT endpoint (`POST .../actions/runners/generate-jitconfig`) is a POST: 180 a minute.
- Content creation: "no more than 80 content-generating requests per minute and no more than 500
  content-generating requests per hour". Whether a JIT registration counts as content is not
  documented, so it is a switch here (`content_creation`), off by default.
- Exceeding a secondary limit is answered 403 or 429 with a message saying so; "If the
  `retry-after` response header is present, you should not retry your request until after that
  many seconds has elapsed." The fake always sends `retry-after`: the seconds until its window has
  room again.

Every window here is kept per App (the App of the request's token or JWT), so a second App registers
alongside the first, as the Terraform module's several Apps do. GitHub counts a client's requests
against its own limits: "GitHub sets a limit on the number of requests a GitHub App can make ... In
addition to these primary rate limits, GitHub may also apply secondary rate limits" (docs.github.com,
"Rate limits for GitHub Apps"); the secondary limits are those a client meets when it makes "too many
requests to a single endpoint per minute" or creates "too much content". The primary (hourly) limit is
an installation's own, "the installation's minimum rate limit of 5,000 requests per hour" ("Rate limits
for the REST API", "Primary rate limit for GitHub App installations"); the fake counts it per
installation in GitHubState (`spend_hourly`).

The windows are the fake's own minute and hour (`window_seconds`, `hour_seconds`), so the emulator
can play a burst against GitHub's limits in compressed time, as it compresses everything else.
`outage` stands for GitHub being down: every REST request is answered 503 until it ends (GitHub's
status page reports such incidents; its API then answers 5xx or not at all).
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from emulator.fake_github.routes import Refusal, Request
from runner_pool.domain.clock import Clock, Epoch, SystemClock

POINTS_PER_MINUTE = 900
POINTS_BY_METHOD = {"GET": 1, "HEAD": 1, "OPTIONS": 1, "POST": 5, "PATCH": 5, "PUT": 5, "DELETE": 5}
CONTENT_PER_MINUTE = 80
CONTENT_PER_HOUR = 500
SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you "
    "reach out to GitHub Support for help, please include the request ID."
)
"""The message GitHub sends with a secondary rate limit (githubkit tells it apart by "secondary rate")."""


@dataclass
class RateLimits:
    """Secondary rate limits per endpoint, optionally content creation, and outages. Off until enabled.
    `gate` is the fake's gate (server.Gate) that applies them."""

    clock: Clock = field(default_factory=SystemClock)
    enabled: bool = False
    points_per_window: int = POINTS_PER_MINUTE
    window_seconds: float = 60.0
    """GitHub's minute; shorter in compressed scenarios."""
    content_creation: bool = False
    """Count POSTs to the JIT endpoint as content creation too (undocumented either way)."""
    hour_seconds: float = 3600.0
    status: int = 403
    """403 or 429: GitHub documents both."""
    refused: Counter[str] = field(default_factory=Counter)
    """Requests answered with a rate limit, per endpoint (`POST /repos/{owner}/...`)."""
    outage_refused: int = 0
    admitted: Counter[tuple[int, str]] = field(default_factory=Counter)
    """Requests let through (enabled or not), per App and endpoint."""
    _spent: dict[tuple[int, str], deque[tuple[Epoch, int]]] = field(default_factory=dict, repr=False)
    _content: dict[int, deque[Epoch]] = field(default_factory=dict, repr=False)
    """Each App's content-creating requests in the last hour."""
    _down: tuple[Epoch, Epoch] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def outage(self, start: Epoch, end: Epoch) -> None:
        """GitHub's REST API is down from `start` until `end`."""
        with self._lock:
            self._down = (start, end)

    def spend(self, endpoint: str, points: int, now: Epoch, *, app_id: int) -> None:
        """Another client of the App `app_id` spent `points` on `endpoint` at `now`:
        GitHub counts an App's requests together, whichever of its clients made them."""
        with self._lock:
            self._spent.setdefault((app_id, endpoint), deque()).append((now, points))

    def gate(self, endpoint: str, request: Request) -> None:
        installation = request.installation
        app_id = installation.app_id if installation is not None else request.app_id
        self.admit(endpoint, request.method, self.clock.now(), app_id=app_id or 0)

    def admit(self, endpoint: str, method: str, now: Epoch, app_id: int = 0) -> None:
        """Count one request of App `app_id` to `endpoint`; Refusal when GitHub would not serve it now."""
        with self._lock:
            if self._down is not None and self._down[0] <= now < self._down[1]:
                self.outage_refused += 1
                raise Refusal(503, "Service Unavailable")
            if not self.enabled:
                self.admitted[(app_id, endpoint)] += 1
                return
            cost = POINTS_BY_METHOD.get(method, 1)
            spent = self._spent.setdefault((app_id, endpoint), deque())
            _forget(spent, now - self.window_seconds)
            used = sum(points for _, points in spent)
            if used + cost > self.points_per_window:
                self._refuse(
                    endpoint,
                    _room_after(spent, used + cost - self.points_per_window, now, self.window_seconds),
                )
            creates = self.content_creation and method == "POST" and endpoint.endswith("/generate-jitconfig")
            if creates:
                content = self._content.setdefault(app_id, deque())
                self._check_content(endpoint, content, now)
                content.append(now)
            spent.append((now, cost))
            self.admitted[(app_id, endpoint)] += 1

    def _check_content(self, endpoint: str, content: deque[Epoch], now: Epoch) -> None:
        minute = now - self.window_seconds
        while content and content[0] <= now - self.hour_seconds:
            content.popleft()
        in_minute = [at for at in content if at > minute]
        if len(in_minute) >= CONTENT_PER_MINUTE:
            self._refuse(endpoint, in_minute[len(in_minute) - CONTENT_PER_MINUTE] + self.window_seconds - now)
        if len(content) >= CONTENT_PER_HOUR:
            self._refuse(endpoint, content[len(content) - CONTENT_PER_HOUR] + self.hour_seconds - now)

    def _refuse(self, endpoint: str, seconds: float) -> None:
        self.refused[endpoint] += 1
        raise Refusal(
            self.status,
            SECONDARY_MESSAGE,
            headers={"retry-after": str(max(1, math.ceil(seconds)))},
        )


def _forget(spent: deque[tuple[Epoch, int]], before: Epoch) -> None:
    while spent and spent[0][0] <= before:
        spent.popleft()


def _room_after(spent: deque[tuple[Epoch, int]], excess: int, now: Epoch, window: float) -> float:
    """Seconds until enough of the window's points have aged out to let `excess` more in."""
    freed = 0
    for at, points in spent:
        freed += points
        if freed >= excess:
            return at + window - now
    return window
