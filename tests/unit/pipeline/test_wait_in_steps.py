"""``wait_in_steps``: how the payments job waits for its queries so that a signal's stop is
seen between calls into Spark, without Spark (a fake wait)."""

from __future__ import annotations

import threading

from kcoord.pipeline.payments import WAIT_STEP_S, wait_in_steps


class FakeWait:
    """Spark's ``awaitTermination(seconds)``: True once the query ended, at call
    ``ends_at_call``; a stop may be asked in the middle of call ``stop_at_call``."""

    def __init__(self, ends_at_call: int | None = None, stop_at_call: int | None = None) -> None:
        self.calls: list[int] = []
        self.ends_at_call = ends_at_call
        self.stop_at_call = stop_at_call
        self.stop = threading.Event()

    def __call__(self, seconds: int) -> bool:
        self.calls.append(seconds)
        if len(self.calls) == self.stop_at_call:
            self.stop.set()  # a signal arriving in the middle of the call
        return len(self.calls) == self.ends_at_call


def test_it_waits_in_steps_until_what_it_waits_for_ends() -> None:
    wait = FakeWait(ends_at_call=4)
    assert wait_in_steps(wait, None, wait.stop)
    assert wait.calls == [WAIT_STEP_S] * 4


def test_a_stop_asked_in_the_middle_of_a_step_ends_the_wait_after_it() -> None:
    wait = FakeWait(stop_at_call=2)
    assert not wait_in_steps(wait, None, wait.stop)
    assert len(wait.calls) == 2


def test_the_timeout_bounds_the_steps() -> None:
    wait = FakeWait()
    assert not wait_in_steps(wait, 3, wait.stop)
    assert sum(wait.calls) == 3


def test_a_stop_already_asked_waits_for_nothing() -> None:
    wait = FakeWait()
    wait.stop.set()
    assert not wait_in_steps(wait, None, wait.stop)
    assert wait.calls == []
