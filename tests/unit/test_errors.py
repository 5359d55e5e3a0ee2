"""Kafka's error codes as read from a peer's answer (``kcoord.errors``)."""

from __future__ import annotations

import pytest

from kcoord.errors import Errors


def test_a_code_this_build_does_not_know_reads_as_unknown_server_error() -> None:
    """A node of a newer version may answer a code this one lacks: Kafka's Errors.forCode
    reads it as UNKNOWN_SERVER_ERROR. ``Errors(code)`` raised ValueError, which stopped a
    replica fetcher's handling of the whole answer at every round."""
    assert Errors.of(0) is Errors.NONE
    assert Errors.of(Errors.NOT_LEADER_OR_FOLLOWER.value) is Errors.NOT_LEADER_OR_FOLLOWER
    assert Errors.of(9999) is Errors.UNKNOWN_SERVER_ERROR
    assert Errors.of(-77) is Errors.UNKNOWN_SERVER_ERROR
    for not_a_code in ("3", None, True, 1.5):
        with pytest.raises((ValueError, TypeError)):
            Errors.of(not_a_code)  # type: ignore[arg-type]
