"""The chaos clients' reports as the runner records them."""

from __future__ import annotations

import json
import os
import random
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from kcoord.chaos.history import UNRECORDED_REPORT_F, History
from kcoord.chaos.member import definite_failure
from kcoord.chaos.queue_consumer import _generation
from kcoord.chaos.workload import GroupsWorkload


class _Metadata:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def consumer_group_metadata(self) -> Any:
        return self.raw


def test_the_queue_consumer_reads_the_generation_of_librdkafkas_group_metadata() -> None:
    """``"CGMDv2:"``, then the generation as a native int32 (the checker resets a consumer's
    expected offsets when it changes; read at the wrong place it never did)."""
    for generation in (1, 7):
        raw = b"CGMDv2:" + struct.pack("=i", generation) + b"group\0member\0"
        assert _generation(_Metadata(raw)) == generation
    assert _generation(_Metadata(b"")) == -1


def test_a_client_report_of_an_unknown_kind_is_an_unrecorded_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt acknowledgement must fail the run (check_progress), not vanish."""
    (tmp_path / "fake_client.py").write_text(
        'print(\'{"event": "started"}\')\nprint(\'{"event": "comitted", "offsets": {"0": 5}}\')\n'
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    history = History(clock=time.monotonic)
    workload = GroupsWorkload("127.0.0.1:1", history, tmp_path, random.Random(0))
    client = workload._spawn("m1", "fake_client", {"group": "g", "topic": "t"})
    client.proc.wait(timeout=30)
    client._reader.join(timeout=30)
    assert client.events == 2
    assert [e.value for e in history.ops(UNRECORDED_REPORT_F)] == [
        {"error": "ValueError(\"unknown event 'comitted'\")"}
    ]


def test_a_whole_line_that_is_not_json_is_an_unrecorded_report_a_cut_last_line_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stray output may stand where an acknowledgement was (fail the run); a last line cut
    by a kill was never a report (nothing to say)."""
    (tmp_path / "stray_client.py").write_text(
        "import sys\n"
        'print(\'{"event": "started"}\')\n'
        "print('connecting...')\n"
        'sys.stdout.write(\'{"event": "comm\')\n'
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    history = History(clock=time.monotonic)
    workload = GroupsWorkload("127.0.0.1:1", history, tmp_path, random.Random(0))
    client = workload._spawn("m1", "stray_client", {"group": "g", "topic": "t"})
    client.proc.wait(timeout=30)
    client._reader.join(timeout=30)
    assert client.events == 1
    assert [e.value for e in history.ops(UNRECORDED_REPORT_F)] == [
        {"error": "not JSON: b'connecting...\\n'"}
    ]


class _LibrdkafkaError:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class CommitFailedError(Exception):
    pass


class KafkaConnectionError(Exception):
    pass


class KafkaException(Exception):  # noqa: N818 - librdkafka's own name, which is what is checked
    pass


def test_only_refusals_made_before_a_write_are_definite_commit_failures() -> None:
    """A timeout or NOT_COORDINATOR may come after the write: unknown (``info``); the
    coordinator's validation errors come before it: the commit did not happen (``fail``)."""
    assert definite_failure(CommitFailedError("rebalanced"))
    assert not definite_failure(KafkaConnectionError("reset"))
    assert definite_failure(_LibrdkafkaError("ILLEGAL_GENERATION"))
    assert not definite_failure(_LibrdkafkaError("NOT_COORDINATOR"))
    assert not definite_failure(_LibrdkafkaError("REQUEST_TIMED_OUT"))
    assert definite_failure(KafkaException(_LibrdkafkaError("UNKNOWN_MEMBER_ID")))
    assert not definite_failure(KafkaException(_LibrdkafkaError("_TIMED_OUT")))


def test_a_definite_commit_failure_is_recorded_as_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [
        {"event": "committing", "offsets": {"0": 5}, "generation": 3, "member_id": "m"},
        {"event": "commit_failed", "offsets": {"0": 5}, "error": "x", "definite": True},
        {"event": "committing", "offsets": {"0": 6}, "generation": 3, "member_id": "m"},
        {"event": "commit_failed", "offsets": {"0": 6}, "error": "y", "definite": False},
    ]
    (tmp_path / "failing_client.py").write_text(
        "".join(f"print({json.dumps(json.dumps(line))})\n" for line in lines)
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    history = History(clock=time.monotonic)
    workload = GroupsWorkload("127.0.0.1:1", history, tmp_path, random.Random(0))
    client = workload._spawn("m1", "failing_client", {"group": "g", "topic": "t"})
    client.proc.wait(timeout=30)
    client._reader.join(timeout=30)
    assert [e.type for e in history.ops("commit")] == ["invoke", "fail", "invoke", "info"]
