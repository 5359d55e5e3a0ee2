"""Fixtures every test gets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from kcoord.storage.segment import LogSegment

# No per-example deadline (hypothesis's default is 200 ms): tests check behaviour, not timing,
# and on two cores shared with integration clusters an example of a few milliseconds can take
# longer than that.
settings.register_profile("kcoord", deadline=None)
settings.load_profile("kcoord")


@pytest.fixture(autouse=True)
def _close_segments_left_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close, after the test, every log segment it opened and left open.

    Many tests open a log and drop it; a segment holds raw descriptors (its log file and two
    indexes) that garbage collection does not close, so one xdist worker piled up over a
    thousand and its ``select()`` calls then failed. Closing a segment twice is harmless."""
    opened: list[LogSegment] = []
    init = LogSegment.__init__

    def tracked(self: LogSegment, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(self)

    monkeypatch.setattr(LogSegment, "__init__", tracked)
    yield
    for segment in opened:
        segment.close()
