"""Reading a provider's or a tool's Retry-After (RUNNER.md: seconds or an HTTP date)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def parse_retry_after(headers: Mapping[str, str]) -> int | None:
    """Milliseconds to wait from `retry-after-ms` or `Retry-After` (seconds or HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = _non_negative(lowered.get("retry-after-ms"))
    if millis is not None:
        return math.ceil(millis)
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return math.ceil(seconds * 1000)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0, math.ceil((when - datetime.now(UTC)).total_seconds() * 1000))


def _non_negative(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None
