"""Where each limit trips and the reason it gives (RUNNER.md, "Limits: where each is checked")."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain import limits
from app.domain.limits import Counters, LimitTrip
from app.domain.policy import ExecutionPolicy
from app.domain.status import TurnEvent


def policy(**budget: Any) -> ExecutionPolicy:
    return ExecutionPolicy.model_validate({"budget": budget})


def test_counters_total_is_input_plus_output() -> None:
    assert Counters(input_tokens=12000, output_tokens=8412).total_tokens == 20412
    assert Counters().total_tokens == 0


# ---- max_steps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "trips"), [(0, False), (8, False), (9, False), (10, True), (11, True)]
)
def test_max_steps_before_a_step(steps: int, trips: bool) -> None:
    p = ExecutionPolicy(max_steps=10)
    trip = limits.before_step(p, Counters(steps=steps))
    if trips:
        assert trip == LimitTrip(TurnEvent.MAX_STEPS, f"max_steps (used={steps}, limit=10)")
    else:
        assert trip is None


def test_max_steps_ignores_other_counters() -> None:
    p = ExecutionPolicy(max_steps=5, max_iterations=1)
    c = Counters(steps=4, iterations=50, tool_calls=50, input_tokens=10**9)
    assert limits.before_step(p, c) is None


# ---- max_iterations ---------------------------------------------------------------------------


@pytest.mark.parametrize(("iterations", "trips"), [(0, False), (2, False), (3, True), (4, True)])
def test_max_iterations_before_a_model_call(iterations: int, trips: bool) -> None:
    p = ExecutionPolicy(max_iterations=3)
    trip = limits.before_model_call(p, Counters(iterations=iterations))
    if trips:
        assert trip == LimitTrip(
            TurnEvent.MAX_ITERATIONS, f"max_iterations (used={iterations}, limit=3)"
        )
    else:
        assert trip is None


def test_max_iterations_one_allows_exactly_one_model_call() -> None:
    p = ExecutionPolicy(max_iterations=1)
    assert limits.before_model_call(p, Counters(iterations=0)) is None
    assert limits.before_model_call(p, Counters(iterations=1)) is not None


def test_max_iterations_ignores_steps() -> None:
    p = ExecutionPolicy(max_iterations=3, max_steps=1)
    assert limits.before_model_call(p, Counters(iterations=2, steps=100)) is None


# ---- max_tool_calls ---------------------------------------------------------------------------


@pytest.mark.parametrize(("used", "trips"), [(0, False), (1, False), (2, True), (3, True)])
def test_max_tool_calls_used_at_limit_trips(used: int, trips: bool) -> None:
    trip = limits.before_tool_call(policy(max_tool_calls=2), Counters(tool_calls=used))
    if trips:
        assert trip == LimitTrip(TurnEvent.BUDGET, f"max_tool_calls (used={used}, limit=2)")
    else:
        assert trip is None


@pytest.mark.parametrize("limit", [0, None])
def test_max_tool_calls_zero_or_none_is_unlimited(limit: int | None) -> None:
    assert limits.before_tool_call(policy(max_tool_calls=limit), Counters(tool_calls=10**6)) is None


# ---- token limits -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "counters"),
    [
        ("max_input_tokens", lambda n: Counters(input_tokens=n)),
        ("max_output_tokens", lambda n: Counters(output_tokens=n)),
        ("max_total_tokens", lambda n: Counters(input_tokens=n - n // 2, output_tokens=n // 2)),
    ],
)
def test_each_token_limit_trips_only_above_the_limit(name: str, counters: Any) -> None:
    p = policy(**{name: 100})
    assert limits.after_model_answer(p, counters(99)) is None
    assert limits.after_model_answer(p, counters(100)) is None  # equal does not trip
    trip = limits.after_model_answer(p, counters(101))
    assert trip == LimitTrip(TurnEvent.BUDGET, f"{name} (used=101, limit=100)")


def test_total_tokens_reason_text_from_runner_md() -> None:
    trip = limits.after_model_answer(
        policy(max_total_tokens=20000), Counters(input_tokens=20000, output_tokens=412)
    )
    assert trip is not None
    assert trip.event is TurnEvent.BUDGET
    assert trip.reason == "max_total_tokens (used=20412, limit=20000)"


def test_total_limit_counts_both_directions() -> None:
    p = policy(max_total_tokens=100, max_input_tokens=1000, max_output_tokens=1000)
    assert limits.after_model_answer(p, Counters(input_tokens=60, output_tokens=40)) is None
    trip = limits.after_model_answer(p, Counters(input_tokens=60, output_tokens=41))
    assert trip is not None
    assert trip.reason == "max_total_tokens (used=101, limit=100)"


@pytest.mark.parametrize("limit", [0, None])
def test_token_limits_zero_or_none_are_unlimited(limit: int | None) -> None:
    p = policy(max_input_tokens=limit, max_output_tokens=limit, max_total_tokens=limit)
    assert limits.after_model_answer(p, Counters(input_tokens=10**9, output_tokens=10**9)) is None


def test_token_limits_are_independent() -> None:
    p = policy(max_output_tokens=10)
    # Input tokens far over anything do not trip an output limit.
    assert limits.after_model_answer(p, Counters(input_tokens=10**6, output_tokens=10)) is None
    trip = limits.after_model_answer(p, Counters(input_tokens=0, output_tokens=11))
    assert trip is not None
    assert trip.reason.startswith("max_output_tokens ")


def test_default_policy_has_no_budget_limits() -> None:
    p = ExecutionPolicy()
    big = Counters(tool_calls=10**6, input_tokens=10**9, output_tokens=10**9)
    assert limits.after_model_answer(p, big) is None
    assert limits.before_tool_call(p, big) is None
    assert limits.duration_exceeded(p, 10**12) is None
    assert limits.remaining_duration_ms(p, 10**12) is None


# ---- max_duration_ms --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "trips"), [(0, False), (4999, False), (5000, True), (7300, True)]
)
def test_max_duration(elapsed: int, trips: bool) -> None:
    trip = limits.duration_exceeded(policy(max_duration_ms=5000), elapsed)
    if trips:
        assert trip == LimitTrip(TurnEvent.BUDGET, f"max_duration_ms (used={elapsed}, limit=5000)")
    else:
        assert trip is None


@pytest.mark.parametrize("limit", [0, None])
def test_max_duration_zero_or_none_is_unlimited(limit: int | None) -> None:
    p = policy(max_duration_ms=limit)
    assert limits.duration_exceeded(p, 10**9) is None
    assert limits.remaining_duration_ms(p, 10**9) is None


def test_remaining_duration() -> None:
    p = policy(max_duration_ms=5000)
    assert limits.remaining_duration_ms(p, 0) == 5000
    assert limits.remaining_duration_ms(p, 1200) == 3800
    assert limits.remaining_duration_ms(p, 5000) == 0
