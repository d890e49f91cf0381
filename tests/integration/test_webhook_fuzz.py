"""Bad requests, generated: whatever comes from outside gets 401, 400 or 413 with a short reason, never a
5xx, and changes nothing (no message queued, no idempotency record, no other write)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.harness.webhooks import (
    DELETE,
    IngressWorld,
    api_request,
    completed_job,
    completed_run,
    encoded,
    fixture,
    fixture_names,
    github_headers,
    ingress_world,
    queued_job,
    signature,
    with_value,
)
from runner_pool.domain.webhooks import MAX_BODY_BYTES, REASON_LIMIT

LABEL = "pool=4242/class=large"
GITHUB_HEADERS = {name.lower() for name in github_headers(b"", "ping")}

Case = tuple[dict[str, Any], int]
"""An API Gateway event and the status it must get."""


@pytest.fixture(scope="module")
def world() -> Iterator[IngressWorld]:
    with ingress_world() as world:
        yield world


# --- what a body can be ------------------------------------------------------------------------------

real_payloads = st.sampled_from(fixture_names()).map(lambda name: (name.split(".", 1)[0], fixture(name)))
our_payloads = st.sampled_from(
    [
        ("workflow_job", queued_job(LABEL, job_id=1)),
        ("workflow_job", completed_job(LABEL, runner_name=None, job_id=2)),
        ("workflow_run", completed_run()),
    ]
)
any_payload = st.one_of(real_payloads, our_payloads)
"""(event, payload): what GitHub really sends, ours and others'."""

not_an_int = st.one_of(
    st.text(max_size=8),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.just([1]),
    st.integers(max_value=0),
)
not_a_str = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(), st.just(["a/b"]))
not_a_label_list = st.one_of(
    st.text(max_size=8), st.integers(), st.none(), st.lists(st.integers(), min_size=1, max_size=3)
)
not_an_object: st.SearchStrategy[object] = st.one_of(
    st.text(max_size=8), st.integers(), st.none(), st.just([])
)
VIOLATIONS: dict[str, list[tuple[tuple[str | int, ...], st.SearchStrategy[Any]]]] = {
    "workflow_job": [
        (("action",), not_a_str),
        (("workflow_job",), not_an_object),
        (("workflow_job", "id"), not_an_int),
        (("workflow_job", "run_id"), not_an_int),
        (("workflow_job", "run_attempt"), not_an_int),
        (("workflow_job", "labels"), not_a_label_list),
        (("workflow_job", "runner_name"), st.one_of(st.integers(), st.just(["x"]))),
        (("repository",), not_an_object),
        (("repository", "full_name"), st.one_of(not_a_str, st.just("no-slash"), st.just("a/b/c"))),
    ],
    "workflow_run": [
        (("action",), not_a_str),
        (("workflow_run",), not_an_object),
        (("workflow_run", "id"), not_an_int),
        (("workflow_run", "run_attempt"), not_an_int),
        (("repository", "full_name"), st.one_of(not_a_str, st.just(""))),
    ],
}
REQUIRED = {
    "workflow_job": [
        ("action",),
        ("workflow_job",),
        ("workflow_job", "id"),
        ("workflow_job", "labels"),
        ("repository",),
    ],
    "workflow_run": [("action",), ("workflow_run",), ("workflow_run", "id"), ("repository", "full_name")],
}


@st.composite
def schema_violations(draw: st.DrawFn) -> tuple[str, bytes]:
    """A workflow_job or workflow_run payload with one field we read removed or of the wrong type."""
    event, payload = draw(
        st.sampled_from([(n.split(".", 1)[0], n) for n in fixture_names() if not n.startswith("ping")])
    )
    base = fixture(payload)
    if draw(st.booleans()):
        path = draw(st.sampled_from(REQUIRED[event]))
        return event, encoded(with_value(base, path, DELETE))
    path, values = draw(st.sampled_from(VIOLATIONS[event]))
    return event, encoded(with_value(base, path, draw(values)))


@st.composite
def extra_headers(draw: st.DrawFn) -> dict[str, str]:
    """Headers of any name and value that are not GitHub's own."""
    names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True).filter(
        lambda n: n.lower() not in GITHUB_HEADERS
    )
    return draw(st.dictionaries(names, st.text(max_size=30), max_size=4))


@st.composite
def recased(draw: st.DrawFn, headers: dict[str, str]) -> dict[str, str]:
    """The same headers with their names in any case, as proxies may pass them."""
    styles: list[Callable[[str], str]] = [str, str.lower, str.upper]
    style = draw(st.sampled_from(styles))
    return {style(name): value for name, value in headers.items()}


def request(body: bytes, headers: dict[str, str], base64_encoded: bool = False) -> dict[str, Any]:
    return api_request(body, headers, base64_encoded=base64_encoded)


# --- the cases -----------------------------------------------------------------------------------------


@st.composite
def unsigned_or_forged(draw: st.DrawFn) -> Case:
    event, payload = draw(any_payload)
    body = draw(
        st.one_of(st.just(encoded(payload)), st.binary(max_size=300), st.text(max_size=300).map(str.encode))
    )
    headers = github_headers(body, event)
    forgery = draw(
        st.sampled_from(["missing", "other secret", "other body", "random hex", "garbage", "sha1", "empty"])
    )
    match forgery:
        case "missing":
            del headers["X-Hub-Signature-256"]
        case "other secret":
            headers["X-Hub-Signature-256"] = signature(body, draw(st.text(max_size=20)))
        case "other body":
            headers["X-Hub-Signature-256"] = signature(body + b" ")
        case "random hex":
            headers["X-Hub-Signature-256"] = "sha256=" + draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
        case "garbage":
            headers["X-Hub-Signature-256"] = draw(st.text(max_size=80))
        case "sha1":
            headers["X-Hub-Signature-256"] = "sha1=" + draw(st.from_regex(r"[0-9a-f]{40}", fullmatch=True))
        case "empty":
            headers["X-Hub-Signature-256"] = ""
    return request(body, {**draw(recased(headers)), **draw(extra_headers())}), 401


@st.composite
def oversized(draw: st.DrawFn) -> Case:
    event, payload = draw(any_payload)
    padding = draw(st.integers(1, 4096))
    body = encoded(payload)
    body = body[:-1] + b" " * (MAX_BODY_BYTES - len(body) + padding) + b"}"
    signed = draw(st.booleans())
    headers = github_headers(body, event) if signed else {"Content-Type": "application/json"}
    return request(body, headers), 413


@st.composite
def wrong_content_type(draw: st.DrawFn) -> Case:
    event, payload = draw(any_payload)
    body = encoded(payload)
    content_type = draw(
        st.one_of(
            st.sampled_from(
                ["application/x-www-form-urlencoded", "text/plain", "application/jsonp", "", "json"]
            ),
            st.text(max_size=30).filter(lambda t: t.split(";")[0].strip().lower() != "application/json"),
        )
    )
    headers = {**github_headers(body, event), "Content-Type": content_type}
    if draw(st.booleans()):
        del headers["Content-Type"]
    return request(body, headers), 400


@st.composite
def not_json(draw: st.DrawFn) -> Case:
    event, payload = draw(st.one_of(any_payload.filter(lambda p: p[0] != "ping")))
    whole = encoded(payload)
    body = draw(
        st.one_of(
            st.integers(0, len(whole) - 1).map(lambda cut: whole[:cut]),  # truncated
            st.binary(max_size=200),
            st.sampled_from([b"null", b"[]", b"42", b'"text"', b"{", b"\xff\xfe{}"]),
        )
    )
    return request(body, github_headers(body, event), base64_encoded=not _is_utf8(body)), 400


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def schema_violating(draw: st.DrawFn) -> Case:
    event, body = draw(schema_violations())
    return request(body, draw(recased(github_headers(body, event)))), 400


@st.composite
def bad_github_headers(draw: st.DrawFn) -> Case:
    event, payload = draw(any_payload)
    body = encoded(payload)
    headers = github_headers(body, event)
    name = draw(st.sampled_from(["X-GitHub-Event", "X-GitHub-Delivery"]))
    if draw(st.booleans()):
        del headers[name]
    else:
        headers[name] = draw(st.one_of(st.just(""), st.text(min_size=65, max_size=80), st.just("bad value!")))
    return request(body, headers), 400


@st.composite
def bad_base64(draw: st.DrawFn) -> Case:
    event, payload = draw(any_payload)
    body = encoded(payload)
    event_data = request(body, github_headers(body, event), base64_encoded=True)
    event_data["body"] = draw(st.sampled_from(["***", "abc", "not base64 at all!"]))
    return event_data, 400


every_bad_request = st.one_of(
    unsigned_or_forged(),
    wrong_content_type(),
    not_json(),
    schema_violating(),
    bad_github_headers(),
    bad_base64(),
    oversized(),
)


@pytest.mark.slow
@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(case=every_bad_request)
def test_a_bad_request_gets_its_4xx_with_a_short_reason_and_changes_nothing(
    world: IngressWorld, case: Case
) -> None:
    # Given a request that is unsigned, forged, oversized, of the wrong type, not JSON or not the schema
    event, expected = case
    writes_before = len(world.writes())
    # When the webhook handles it
    answer = world.deliver(event)
    # Then it gets exactly its 4xx, with a short one-line reason
    assert answer.status == expected, answer.message
    assert 0 < len(answer.message) <= REASON_LIMIT
    assert "\n" not in answer.message
    # And nothing was written: no write call was made, no message is queued, no record is kept
    assert world.writes()[writes_before:] == []
    assert world.queue_depth() == 0
    assert world.stored_items() == 0
