"""GitHub's refusals, rate limits and outages as the product's errors (domain/runners.py), named once.

No automatic retry: githubkit would sleep in the Lambda until a rate limit resets (up to an hour) and
retry server errors with sleeps of its own. Both become a GitHubRetryableError instead, carrying how long
GitHub asks us to wait, and the caller's retry (Step Functions, the next refresh) does the waiting.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx
import pydantic
from githubkit.exception import RateLimitExceeded, RequestError, RequestFailed, RequestTimeout

from runner_pool.domain.clock import Epoch
from runner_pool.domain.runners import (
    GitHubAuthError,
    GitHubError,
    GitHubForbiddenError,
    GitHubNotFoundError,
    GitHubRateLimitedError,
    GitHubRejectedError,
    GitHubUnavailableError,
)

RATE_LIMIT_DEFAULT_WAIT_SECONDS = 60.0

_ERRORS_BY_STATUS: Mapping[int, type[GitHubError]] = {
    401: GitHubAuthError,
    403: GitHubForbiddenError,
    404: GitHubNotFoundError,
    409: GitHubRejectedError,
    422: GitHubRejectedError,
}


def translate(exc: BaseException, now: Epoch) -> GitHubError:
    """githubkit's exception as one of ours; the message names the request and GitHub's own words."""
    exc = _unwrapped(exc)
    if isinstance(exc, GitHubError):  # the token request's own failure, already ours
        return exc
    if isinstance(exc, RequestFailed):
        return _refused(exc, now)
    if isinstance(exc, RequestTimeout | httpx.TransportError):
        return GitHubUnavailableError(f"could not reach GitHub: {exc!r}")
    if isinstance(exc, pydantic.ValidationError):
        return GitHubError(f"GitHub answered in a shape its API description does not allow: {exc}")
    return GitHubError(f"request to GitHub failed: {exc!r}")


def retry_after(headers: httpx.Headers, now: Epoch) -> float:
    """How long GitHub asks us to wait, in the order its documentation gives ("Exceeding the rate
    limit"): `retry-after` seconds; else, when `x-ratelimit-remaining` is 0, until `x-ratelimit-reset`;
    otherwise at least a minute."""
    seconds = headers.get("retry-after")
    if seconds is not None:
        try:
            return max(0.0, float(seconds))
        except ValueError:
            pass  # an HTTP date, which GitHub does not send; wait the default
    if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
        return max(0.0, float(headers["x-ratelimit-reset"]) - now)
    return RATE_LIMIT_DEFAULT_WAIT_SECONDS


def _unwrapped(exc: BaseException) -> BaseException:
    """What githubkit wrapped: whatever the HTTP client raised, including the failure of a token
    request our authentication made on the way."""
    while type(exc) is RequestError:
        exc = exc.exc
    return exc


def _refused(exc: RequestFailed, now: Epoch) -> GitHubError:
    status = exc.response.status_code
    if isinstance(exc, RateLimitExceeded) or _rate_limited(exc):
        wait = retry_after(exc.response.headers, now)
        return GitHubRateLimitedError(f"{_described(exc)}; retry in {wait:.0f} s", status, wait)
    kind = GitHubUnavailableError if status >= 500 else _ERRORS_BY_STATUS.get(status, GitHubError)
    return kind(_described(exc), status)


def _rate_limited(exc: RequestFailed) -> bool:
    """A secondary rate limit that names itself only in its message (no `retry-after`, remaining not 0),
    which githubkit reads as a plain failure. GitHub answers it 403 or 429 "and an error message that
    indicates that you exceeded a secondary rate limit" (docs.github.com, "Rate limits for the REST
    API", "Exceeding the rate limit"); a 429 is a rate limit whatever it says."""
    status = exc.response.status_code
    if status == httpx.codes.TOO_MANY_REQUESTS:
        return True
    return status == httpx.codes.FORBIDDEN and "rate limit" in _message(exc).lower()


def _message(exc: RequestFailed) -> str:
    try:
        body = exc.response.json()
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) else ""


def _described(exc: RequestFailed) -> str:
    request = exc.request
    message = _message(exc)
    said = f": {message}" if message else ""
    return f"{request.method} {request.url.path} answered {exc.response.status_code}{said}"
