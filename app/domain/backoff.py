"""The delay before a retry (RUNNER.md, "Execution policy")."""

from __future__ import annotations

import random
from dataclasses import dataclass

from app.domain.policy import RetryPolicy


@dataclass(frozen=True)
class RetryDelay:
    delay_ms: int
    computed_ms: int
    retry_after_honoured: bool


def retry_delay(
    policy: RetryPolicy,
    attempt: int,
    retry_after_ms: int | None = None,
    rng: random.Random | None = None,
) -> RetryDelay:
    """Delay before retry number `attempt` (1-based): capped exponential, jitter, Retry-After."""
    base = min(
        float(policy.max_delay_ms), policy.initial_delay_ms * policy.multiplier ** (attempt - 1)
    )
    if policy.jitter > 0:
        base = (rng or random).uniform(base * (1 - policy.jitter), base)
    computed = round(base)
    if policy.respect_retry_after and retry_after_ms is not None and retry_after_ms > computed:
        return RetryDelay(min(policy.max_delay_ms, retry_after_ms), computed, True)
    return RetryDelay(computed, computed, False)
