"""Launch requests and outcomes of DESIGN.md 6.3: client tokens, the class's fence, the one fallback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.config import ConfigError, FleetSettings, StackConfig, load_config
from runner_pool.domain.fleet import (
    LaunchAttempt,
    LaunchFailure,
    LaunchOutcome,
    LaunchRequest,
    fallback_for,
)
from runner_pool.domain.records import Arch, UsageClass
from tests.support.builders import facts

CONFIG = StackConfig()


def spot_request(count: int = 3) -> LaunchRequest:
    return LaunchRequest.for_run(CONFIG.spec_for("pool=7/usage=spot"), count, "provision-7/create")


@given(key=st.text(min_size=1, max_size=2000))
def test_a_client_token_is_at_most_64_ascii_characters_for_any_key(key: str) -> None:
    # Given any idempotency key / When its launches' tokens are derived
    first = LaunchRequest.for_run(CONFIG.spec_for("pool=7"), 1, key)
    retry = first.model_copy(update={"attempt": LaunchAttempt.ON_DEMAND_FALLBACK})
    # Then each fits EC2's limit, and the retry's differs from the first call's
    for token in (first.client_token, retry.client_token):
        assert len(token) <= 64
        assert token.isascii()
    assert first.client_token != retry.client_token


def test_a_request_for_a_run_takes_the_spec_and_its_run_key() -> None:
    # Given a resolved label
    spec = CONFIG.spec_for("pool=7/class=2xlarge/usage=on-demand/arch=arm64/types=c7g*")
    # When a launch is asked for it
    request = LaunchRequest.for_run(spec, 4, "k")
    # Then it asks for the spec's size, usage, architecture and types, for the spec's run
    assert (request.resource_class, request.cpu, request.memory_mib) == ("2xlarge", 8, 16384)
    assert (request.usage, request.arch, request.types) == (UsageClass.ON_DEMAND, Arch.ARM64, ("c7g*",))
    assert (request.run_key, request.count) == (spec.run_key, 4)


def test_a_request_for_the_pool_takes_the_stack_defaults_and_no_run() -> None:
    # Given a stack whose defaults are on-demand arm64
    config = load_config({"defaults": {"usage": "on-demand", "arch": "arm64"}})
    # When a warm-pool launch is asked for class xlarge
    request = LaunchRequest.for_pool(config, "xlarge", 2, "refresh/xlarge")
    # Then it is of the class's size and the defaults, held by no run
    assert (request.cpu, request.memory_mib, request.usage, request.arch) == (
        4,
        8192,
        UsageClass.ON_DEMAND,
        Arch.ARM64,
    )
    assert request.run_key is None


def test_without_types_the_fence_caps_memory_and_excludes_accelerators() -> None:
    # Given a request naming no types / Then memory is capped at twice the class's, no accelerators
    request = spot_request()
    assert request.memory_max_mib == 2 * request.memory_mib
    assert request.excludes_accelerators


def test_named_types_lift_the_memory_and_accelerator_fences() -> None:
    # Given a request naming types / Then the job chose its families: no memory cap, accelerators allowed
    request = LaunchRequest.for_run(CONFIG.spec_for("pool=7/types=g5*"), 1, "k")
    assert request.memory_max_mib is None
    assert not request.excludes_accelerators


def test_the_fallback_is_the_remainder_on_demand() -> None:
    # Given a spot launch of 3 that launched 1
    request = spot_request(3)
    outcome = LaunchOutcome(requested=3, launched=(facts(1),))
    # When its fallback is asked for, with the config allowing it
    retry = fallback_for(request, outcome, FleetSettings())
    # Then it is the remainder of 2, on-demand, as the fallback attempt, otherwise the same request
    assert retry == request.model_copy(
        update={"count": 2, "usage": UsageClass.ON_DEMAND, "attempt": LaunchAttempt.ON_DEMAND_FALLBACK}
    )


def test_a_fallback_is_never_fallen_back_from() -> None:
    # Given the fallback attempt itself fell short
    retry = spot_request(2).model_copy(update={"attempt": LaunchAttempt.ON_DEMAND_FALLBACK})
    # When its fallback is asked for / Then there is none: the remainder is retried once only
    assert fallback_for(retry, LaunchOutcome(requested=2), FleetSettings()) is None


def test_an_outcome_followed_by_its_retry_keeps_the_first_count() -> None:
    # Given a first call that launched 1 of 3 and a retry that launched 1 of 2
    failure = LaunchFailure(code="InsufficientInstanceCapacity", usage=UsageClass.SPOT)
    first = LaunchOutcome(requested=3, launched=(facts(1),), failures=(failure,))
    retry = LaunchOutcome(requested=2, launched=(facts(2),))
    # When combined / Then 2 of the 3 asked for are launched, 1 short, the refusal kept
    combined = first.then(retry)
    assert (combined.requested, len(combined.launched), combined.shortfall) == (3, 2, 1)
    assert combined.failures == (failure,)


def test_the_fallback_to_on_demand_is_on_by_default_and_can_be_turned_off() -> None:
    # Given the default config and one that keeps spot on spot / Then the switch follows
    assert StackConfig().fleet.spot_fallback_to_on_demand is True
    assert (
        load_config({"fleet": {"spot_fallback_to_on_demand": False}}).fleet.spot_fallback_to_on_demand
        is False
    )


def test_a_bad_fallback_setting_is_named_with_its_path() -> None:
    # Given a setting that is not a boolean / Then the error names it in full
    with pytest.raises(ConfigError, match=r"fleet\.spot_fallback_to_on_demand"):
        load_config({"fleet": {"spot_fallback_to_on_demand": "sometimes"}})
