"""The restricted loader behind pysyncobj's transport (``kcoord.raft.quorum``): every message
pysyncobj sends at its pickle protocol 2 loads back equal; anything naming another global, or
``bytes`` asked to allocate, is refused before it runs."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pysyncobj.pickle
import pytest

from kcoord.raft.quorum import _PlainDataPickle


@pytest.mark.parametrize(
    "message",
    [
        {"type": "append_entries", "term": 3, "commit_index": 7, "entries": [(b"\x00ab", 8, 3)]},
        # The last part of a snapshot transmission is the empty string.
        {"type": "append_entries", "term": 3, "commit_index": 7, "serialized": (b"", False, True)},
        {"type": "append_entries", "serialized": (bytes(range(256)) * 10, True, False)},
        {"type": "request_vote", "term": 4, "last_log_index": 9, "last_log_term": 3},
        {"cluster": {"127.0.0.1:1", "127.0.0.1:2"}, "frozen": frozenset({1, 2})},
        ["127.0.0.1:9094", None, True, 1.5, 10**30, ()],
    ],
)
def test_pysyncobj_messages_load_back_equal(message: Any) -> None:
    assert _PlainDataPickle.loads(pysyncobj.pickle.dumps(message)) == message


class _Call:
    def __init__(self, fn: Any, *args: Any) -> None:
        self.reduced = (fn, args)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.reduced


@pytest.mark.parametrize(
    "hostile",
    [
        _Call(os.getcwd),
        _Call(eval, "1"),
        # bytes(n) is plain data's own global, but with an argument it allocates n bytes.
        _Call(bytes, 10**12),
        _Call(bytes, "x", "ascii"),
    ],
)
def test_anything_else_is_refused_before_it_runs(hostile: _Call) -> None:
    with pytest.raises(pickle.UnpicklingError):
        _PlainDataPickle.loads(pickle.dumps({"type": "append_entries", "x": hostile}, 2))
