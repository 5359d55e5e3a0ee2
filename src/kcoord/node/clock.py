"""The one place that reads the wall clock and the monotonic clock (STYLE.md rule 2).

Everything else takes ``now_ms`` or a ``Clock``, so tests can pass a fake one.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (record timestamps, retention)."""
        ...

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes back (timeouts, sessions)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


SYSTEM_CLOCK = SystemClock()
