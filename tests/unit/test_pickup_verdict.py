"""The pickup verdict: what one pool message is to one runner spec, judged from the message alone."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.config import StackConfig
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.pickup import Taker, Verdict, judge
from runner_pool.domain.records import Arch, PoolMessage, UsageClass
from runner_pool.domain.trust import TrustLevel
from tests.support.builders import pool_message

NOW = 1_800_000_000.0
AHEAD = NOW + 300


@pytest.fixture
def spec(config: StackConfig) -> RunnerSpec:
    # class large (2 vCPU, 4 GiB), spot, x64, c7 or m7 types
    return config.spec_for("pool=7/usage=spot/types=c7*+m7*")


def test_a_message_that_fits_the_spec_matches(spec: RunnerSpec) -> None:
    # Given an idle c7i.large spot x64 instance whose idle period runs for another 5 minutes
    message = pool_message(threshold=AHEAD)
    # When it is judged for a large spot x64 c7*/m7* spec
    verdict = judge(message, spec, NOW)
    # Then it is a match
    assert verdict is Verdict.MATCH


def test_a_bigger_instance_than_the_class_asks_for_matches(spec: RunnerSpec) -> None:
    # Given an instance with more vCPUs and memory than class large's minimums
    message = pool_message(threshold=AHEAD, instance_type="m7i.2xlarge", cpu=8, memory_mib=32768)
    # When it is judged
    verdict = judge(message, spec, NOW)
    # Then the minimums are met, so it matches
    assert verdict is Verdict.MATCH


def test_a_spec_without_type_globs_takes_any_type(config: StackConfig) -> None:
    # Given a spec that names no types, and an instance of a type no glob above would allow
    spec = config.spec_for("pool=7")
    message = pool_message(threshold=AHEAD, instance_type="r6a.large")
    # When it is judged
    verdict = judge(message, spec, NOW)
    # Then the type does not matter
    assert verdict is Verdict.MATCH


@pytest.mark.parametrize(
    "mismatch",
    [
        {"usage_class": UsageClass.ON_DEMAND},
        {"arch": Arch.ARM64},
        {"instance_type": "r7i.large"},
        {"cpu": 1},
        {"memory_mib": 2048},
    ],
    ids=["usage", "arch", "type", "cpu", "memory"],
)
def test_a_live_message_that_does_not_fit_goes_back(spec: RunnerSpec, mismatch: dict[str, Any]) -> None:
    # Given a live message that differs from the spec in one respect
    message = pool_message(threshold=AHEAD, **mismatch)
    # When it is judged
    verdict = judge(message, spec, NOW)
    # Then another request may want it: it goes back to the queue
    assert verdict is Verdict.REQUEUE


@pytest.mark.parametrize("threshold", [NOW, NOW - 1], ids=["at-now", "before-now"])
def test_a_message_whose_idle_period_is_over_is_dropped(spec: RunnerSpec, threshold: float) -> None:
    # Given a message that fits the spec but whose threshold has come
    message = pool_message(threshold=threshold)
    # When it is judged
    verdict = judge(message, spec, NOW)
    # Then nobody can use it any more
    assert verdict is Verdict.DROP


def test_staleness_wins_over_a_mismatch(spec: RunnerSpec) -> None:
    # Given a message that neither fits nor is live
    message = pool_message(threshold=NOW - 1, usage_class=UsageClass.ON_DEMAND)
    # When it is judged
    verdict = judge(message, spec, NOW)
    # Then it is dropped rather than sent round the queue again
    assert verdict is Verdict.DROP


# --- properties ------------------------------------------------------------------------------------

INSTANCE_TYPES = [
    "c7i.large",
    "c7g.xlarge",
    "m7i.large",
    "m7g.2xlarge",
    "r7a.large",
    "t3.micro",
    "c6a.4xlarge",
]
GLOBS = ["c7*", "m7*", "c7i.large", "*.xlarge", "t3.*", "r?a.*", "c6a.4xlarge"]

specs = st.builds(
    RunnerSpec,
    run_key=st.just("pool=7"),
    run_id=st.just("7"),
    resource_class=st.just("large"),
    cpu=st.sampled_from([2, 4, 8, 16]),
    memory_mib=st.sampled_from([4096, 8192, 16384, 32768]),
    usage=st.sampled_from(UsageClass),
    types=st.lists(st.sampled_from(GLOBS), unique=True, max_size=3).map(tuple),
    arch=st.sampled_from(Arch),
    max_runtime_minutes=st.just(60),
)
messages = st.builds(
    PoolMessage,
    instance_id=st.just("i-00000000000000001"),
    resource_class=st.just("large"),
    instance_type=st.sampled_from(INSTANCE_TYPES),
    usage_class=st.sampled_from(UsageClass),
    arch=st.sampled_from(Arch),
    cpu=st.sampled_from([1, 2, 4, 8, 16, 32]),
    memory_mib=st.sampled_from([2048, 4096, 8192, 16384, 32768, 65536]),
    threshold=st.floats(min_value=NOW - 1000, max_value=NOW + 1000),
    pristine=st.just(True),
)


@given(message=messages, spec=specs)
def test_the_verdict_agrees_with_the_requirements_checked_one_by_one(
    message: PoolMessage, spec: RunnerSpec
) -> None:
    # Given any message and any spec, and the design's requirements checked here one by one
    live = message.threshold > NOW
    fits = [
        message.usage_class == spec.usage,
        message.arch == spec.arch,
        not spec.types or any(fnmatchcase(message.instance_type, glob) for glob in spec.types),
        message.cpu >= spec.cpu,
        message.memory_mib >= spec.memory_mib,
    ]
    # When the message is judged
    verdict = judge(message, spec, NOW)
    # Then it matches exactly when it is live and meets all of them, and is kept for others when live
    expected = Verdict.DROP if not live else Verdict.MATCH if all(fits) else Verdict.REQUEUE
    assert verdict is expected


@given(message=messages, spec=specs, past=st.floats(min_value=0, max_value=10_000))
def test_nothing_survives_its_threshold(message: PoolMessage, spec: RunnerSpec, past: float) -> None:
    # Given any message and any spec, judged at or after the message's threshold
    now = message.threshold + past
    # When it is judged
    verdict = judge(message, spec, now)
    # Then it is dropped, whatever it offers
    assert verdict is Verdict.DROP


@given(spec=specs, data=st.data())
def test_an_instance_built_to_the_spec_always_matches(spec: RunnerSpec, data: st.DataObject) -> None:
    # Given a live message built to meet the spec: its usage, arch, an allowed type, at least its size
    # (every glob in GLOBS matches at least one of INSTANCE_TYPES, so there is always a type to draw)
    allowed = [t for t in INSTANCE_TYPES if spec.allows_type(t)]
    message = PoolMessage(
        instance_id="i-00000000000000001",
        resource_class=spec.resource_class,
        instance_type=data.draw(st.sampled_from(allowed)),
        usage_class=spec.usage,
        arch=spec.arch,
        cpu=spec.cpu + data.draw(st.integers(min_value=0, max_value=16)),
        memory_mib=spec.memory_mib + data.draw(st.integers(min_value=0, max_value=65536)),
        threshold=NOW + data.draw(st.floats(min_value=0.001, max_value=3600)),
        pristine=True,
    )
    # When it is judged
    verdict = judge(message, spec, NOW)
    # Then it matches
    assert verdict is Verdict.MATCH


# --- reuse scope and age (issue 14, item 2) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "served", "asker", "verdict"),
    [
        ("repository", None, "octo/app", Verdict.MATCH),
        ("repository", "octo/app", "octo/app", Verdict.MATCH),
        ("repository", "octo/app", "octo/other", Verdict.REQUEUE),
        ("owner", "octo/app", "octo/other", Verdict.MATCH),
        ("owner", "octo/app", "someone/app", Verdict.REQUEUE),
        ("any", "octo/app", "someone/else", Verdict.MATCH),
    ],
)
def test_an_instance_is_offered_only_to_jobs_within_the_reuse_scope_of_what_it_served(
    spec: RunnerSpec, scope: str, served: str | None, asker: str, verdict: Verdict
) -> None:
    # Given an idle instance that last served `served` (None: nothing yet), under reuse.scope `scope`
    reuse = StackConfig.model_validate({"reuse": {"scope": scope}}).reuse
    message = pool_message(threshold=AHEAD, repository=served, created_at=NOW - 60)
    # When it is judged for a job of `asker` / Then it matches only within the scope; otherwise another
    # request (of a repository in scope) may want it, so it goes back
    assert judge(message, spec, NOW, Taker(asker, trust=TrustLevel.TRUSTED), reuse) is verdict


def test_an_instance_past_its_maximum_age_is_dropped(spec: RunnerSpec, config: StackConfig) -> None:
    # Given an idle instance launched reuse.max_age_minutes ago, offered to its own repository
    reuse = config.reuse
    message = pool_message(
        threshold=AHEAD, repository="octo/app", created_at=NOW - reuse.max_age_minutes * 60
    )
    # When it is judged / Then no request may use it any more
    assert judge(message, spec, NOW, Taker("octo/app", trust=TrustLevel.TRUSTED), reuse) is Verdict.DROP


# --- who an instance served -------------------------------------------------------------------------

LEVELS = st.sampled_from([None, *TrustLevel])
REPOSITORIES = st.sampled_from(["octo/app", "octo/other", "someone/app"])


@given(
    served=LEVELS,
    pristine=st.booleans(),
    served_repository=REPOSITORIES,
    asker=REPOSITORIES,
    level=LEVELS,
    single_use=st.booleans(),
    scope=st.sampled_from(["repository", "owner", "any"]),
)
def test_a_used_instance_is_never_offered_across_levels_or_to_a_single_use_job(
    *,
    served: TrustLevel | None,
    pristine: bool,
    served_repository: str,
    asker: str,
    level: TrustLevel | None,
    single_use: bool,
    scope: str,
) -> None:
    # Given an offer that fits the spec, of an instance that served a job of `served` (or none: pristine)
    spec = StackConfig().spec_for("pool=7")
    reuse = StackConfig.model_validate({"reuse": {"scope": scope}}).reuse
    message = pool_message(
        threshold=AHEAD,
        created_at=NOW - 60,
        usage_class=spec.usage,
        pristine=pristine,
        trust=None if pristine else served,
        repository=None if pristine else served_repository,
    )
    taker = Taker(asker, trust=level, single_use=single_use)
    # When it is judged for jobs of `level` (single use, or not)
    verdict = judge(message, spec, NOW, taker, reuse)
    # Then a pristine instance matches every job; a used one only a job that reuses, of its very level
    # (untrusted or trusted), within the scope; and one no job may follow is dropped
    if pristine:
        assert verdict is Verdict.MATCH
    elif served not in (TrustLevel.UNTRUSTED, TrustLevel.TRUSTED):
        assert verdict is Verdict.DROP
    elif verdict is Verdict.MATCH:
        assert not single_use
        assert level is served
        assert reuse.in_scope(served_repository, asker)


def test_an_offer_from_a_release_before_levels_is_taken_for_used_and_served_by_no_one() -> None:
    # Given a message a release before levels sent: no `pristine`, no `trust`
    spec = StackConfig().spec_for("pool=7")
    body = pool_message(threshold=AHEAD, usage_class=spec.usage).model_dump(exclude={"pristine", "trust"})
    message = PoolMessage.model_validate(body)
    # When it is judged for a trusted job / Then it is dropped: fail closed (the record waits out its idle)
    assert judge(message, spec, NOW, Taker("octo/app", trust=TrustLevel.TRUSTED)) is Verdict.DROP


@pytest.mark.parametrize(
    ("served_id", "asker_id", "verdict"),
    [(11, 11, Verdict.MATCH), (11, 12, Verdict.REQUEUE), (None, 12, Verdict.MATCH)],
    ids=["same-id", "other-id-same-name", "no-id-by-name"],
)
def test_within_a_repository_ids_decide_when_both_sides_have_one(
    spec: RunnerSpec, served_id: int | None, asker_id: int, verdict: Verdict
) -> None:
    # Given an instance that served octo/app (with id `served_id`), trusted
    message = pool_message(threshold=AHEAD, repository="octo/app", repository_id=served_id, created_at=NOW)
    # When a trusted job of a repository named octo/app with id `asker_id` asks
    taker = Taker("octo/app", repository_id=asker_id, trust=TrustLevel.TRUSTED)
    # Then ids decide when both have one (a new repository that took an old name is another), else names
    assert judge(message, spec, NOW, taker, StackConfig().reuse) is verdict
