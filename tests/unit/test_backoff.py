"""The delay before retry n: min(max_delay, initial * multiplier^(n-1)), jitter, Retry-After
(RUNNER.md, "Execution policy")."""

from __future__ import annotations

import random

import pytest

from app.domain.backoff import RetryDelay, retry_delay
from app.domain.policy import RetryPolicy


def rp(**kw: object) -> RetryPolicy:
    return RetryPolicy.model_validate(kw)


def test_sequence_100_200_400() -> None:
    p = rp(initial_delay_ms=100, multiplier=2, max_delay_ms=60_000)
    assert [retry_delay(p, n).delay_ms for n in (1, 2, 3)] == [100, 200, 400]


def test_default_policy_sequence() -> None:
    p = RetryPolicy()
    assert [retry_delay(p, n).delay_ms for n in range(1, 9)] == [
        1000,
        2000,
        4000,
        8000,
        16000,
        32000,
        60000,  # 64000 capped at max_delay_ms
        60000,
    ]


@pytest.mark.parametrize(
    ("initial", "multiplier", "max_delay", "n", "expected"),
    [
        (100, 2.0, 60_000, 1, 100),
        (100, 2.0, 60_000, 5, 1600),
        (100, 3.0, 60_000, 4, 2700),
        (200, 1.5, 60_000, 3, 450),
        (250, 1.0, 60_000, 40, 250),
        (100, 2.0, 300, 2, 200),
        (100, 2.0, 300, 3, 300),
        (100, 2.0, 300, 60, 300),
        (0, 2.0, 300, 7, 0),
        (1000, 2.0, 0, 1, 0),
        (1000, 100.0, 86_400_000, 101, 86_400_000),  # huge exponent: capped, no overflow
    ],
)
def test_formula(initial: int, multiplier: float, max_delay: int, n: int, expected: int) -> None:
    p = rp(initial_delay_ms=initial, multiplier=multiplier, max_delay_ms=max_delay)
    assert retry_delay(p, n) == RetryDelay(expected, expected, False)


def test_cap_at_max_delay() -> None:
    p = rp(initial_delay_ms=100, multiplier=10, max_delay_ms=5000)
    delays = [retry_delay(p, n).delay_ms for n in range(1, 10)]
    assert delays == [100, 1000, 5000, 5000, 5000, 5000, 5000, 5000, 5000]


# ---- jitter -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("jitter", "n", "delay"), [(0.5, 3, 400), (0.25, 1, 1000), (1.0, 2, 200)])
def test_jitter_stays_in_range_and_spreads(jitter: float, n: int, delay: int) -> None:
    p = rp(initial_delay_ms=delay // 2 ** (n - 1), multiplier=2, jitter=jitter)
    low = delay * (1 - jitter)
    rng = random.Random(1234)
    draws = [retry_delay(p, n, rng=rng) for _ in range(2000)]
    values = [d.delay_ms for d in draws]
    assert all(low <= v <= delay for v in values)
    assert all(d.computed_ms == d.delay_ms and not d.retry_after_honoured for d in draws)
    # Really drawn from the whole range, not pinned at one end.
    assert min(values) < low + (delay - low) * 0.05
    assert max(values) > delay - (delay - low) * 0.05
    assert len(set(values)) > 20
    mean = sum(values) / len(values)
    assert abs(mean - (low + delay) / 2) < (delay - low) * 0.05


def test_jitter_is_applied_after_the_cap() -> None:
    p = rp(initial_delay_ms=1000, multiplier=2, max_delay_ms=3000, jitter=0.5)
    rng = random.Random(7)
    values = [retry_delay(p, 10, rng=rng).delay_ms for _ in range(1000)]
    assert all(1500 <= v <= 3000 for v in values)
    assert min(values) < 1600


def test_jitter_is_deterministic_for_a_seed() -> None:
    p = rp(initial_delay_ms=1000, jitter=0.5)
    a = [retry_delay(p, 2, rng=random.Random(42)).delay_ms for _ in range(5)]
    b = [retry_delay(p, 2, rng=random.Random(42)).delay_ms for _ in range(5)]
    assert a == b
    rng = random.Random(42)
    assert len({retry_delay(p, 2, rng=rng).delay_ms for _ in range(5)}) > 1


def test_zero_jitter_does_not_consume_randomness() -> None:
    p = rp(initial_delay_ms=100)
    rng = random.Random(3)
    state = rng.getstate()
    assert retry_delay(p, 2, rng=rng).delay_ms == 200
    assert rng.getstate() == state


# ---- Retry-After ------------------------------------------------------------------------------


def test_retry_after_used_when_longer() -> None:
    p = rp(initial_delay_ms=100, max_delay_ms=60_000)
    assert retry_delay(p, 1, retry_after_ms=5000) == RetryDelay(5000, 100, True)


def test_retry_after_ignored_when_shorter_or_equal() -> None:
    p = rp(initial_delay_ms=1000)
    assert retry_delay(p, 2, retry_after_ms=500) == RetryDelay(2000, 2000, False)
    assert retry_delay(p, 2, retry_after_ms=2000) == RetryDelay(2000, 2000, False)
    assert retry_delay(p, 2, retry_after_ms=0) == RetryDelay(2000, 2000, False)


def test_retry_after_still_capped_by_max_delay() -> None:
    p = rp(initial_delay_ms=100, max_delay_ms=3000)
    got = retry_delay(p, 1, retry_after_ms=120_000)
    assert got.delay_ms == 3000
    assert got.computed_ms == 100
    assert got.retry_after_honoured is True


def test_retry_after_ignored_when_respect_retry_after_is_false() -> None:
    p = rp(initial_delay_ms=100, respect_retry_after=False)
    assert retry_delay(p, 1, retry_after_ms=5000) == RetryDelay(100, 100, False)
    assert retry_delay(p, 3, retry_after_ms=10**6) == RetryDelay(400, 400, False)


def test_retry_after_none_means_formula() -> None:
    p = rp(initial_delay_ms=100)
    assert retry_delay(p, 2, retry_after_ms=None) == RetryDelay(200, 200, False)


def test_retry_after_compared_with_the_jittered_delay() -> None:
    p = rp(initial_delay_ms=1000, jitter=1.0)
    rng = random.Random(5)
    for _ in range(200):
        got = retry_delay(p, 1, retry_after_ms=1000, rng=rng)
        assert got.delay_ms == 1000
        assert got.retry_after_honoured is (got.computed_ms < 1000)
