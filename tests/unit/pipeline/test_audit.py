"""The offsets audit's rules: each Burrow-style status from a known window of commits, the
rules' order, the commit rate and a group's worst status."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as ClientTopicPartition

from kcoord.cluster.coordinator.records import (
    CoordinatorRecord,
    CoordinatorRecordError,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_record,
)
from kcoord.pipeline import offsets_audit
from kcoord.pipeline.audit import (
    Commit,
    Deleted,
    GroupReport,
    Sample,
    Status,
    build_report,
    latest_commits,
    partition_status,
    without_deleted,
)
from kcoord.pipeline.offsets_audit import decode_batches

NOW_MS = 1_000_000
STOP_AFTER_MS = 60_000


def samples(*rows: tuple[int, int | None]) -> list[Sample]:
    """(offset, lag) pairs, one second apart, the last one a second ago."""
    return [
        Sample(offset, NOW_MS - 1000 * (len(rows) - i), lag) for i, (offset, lag) in enumerate(rows)
    ]


@pytest.mark.parametrize(
    ("window", "lag_now", "status"),
    [
        ([(10, 5), (20, 0), (30, 3)], 3, Status.OK),  # caught up within the window
        ([(10, 5), (12, 4)], 0, Status.OK),  # caught up now
        ([(10, 5), (12, 6), (14, 6)], 6, Status.OK),  # moving, lag not growing every step
        ([(10, 5), (12, 7), (14, 9)], 9, Status.WARN),  # moving, falling behind
        ([(10, 5), (10, 5), (10, 9)], 9, Status.STALL),  # not moving with a lag
        ([(10, 5), (10, None)], None, Status.STALL),  # lags unknown, offsets not moving
        ([(10, 5), (12, None), (14, 9)], 9, Status.OK),  # an unknown lag breaks the WARN rule
        ([(10, 5), (8, 7), (9, 6)], 6, Status.REWIND),
        ([(10, 5), (12, 0)], -12, Status.AHEAD),  # the log is now below the commit
        ([(10, 5)], 5, Status.OK),  # one sample: nothing to compare
    ],
)
def test_status_rules(
    window: list[tuple[int, int | None]], lag_now: int | None, status: Status
) -> None:
    assert partition_status(samples(*window), lag_now, NOW_MS, STOP_AFTER_MS) == status


def test_stop_when_commits_stopped_with_a_lag() -> None:
    old = samples((10, 5), (10, 5))
    later = NOW_MS + STOP_AFTER_MS + 1
    assert partition_status(old, 5, later, STOP_AFTER_MS) == Status.STOP
    # Caught up: no lag, no STOP however old the last commit.
    assert partition_status(samples((10, 0)), 0, later, STOP_AFTER_MS) == Status.OK
    # REWIND is reported first: going backwards is the worse news.
    assert partition_status(samples((10, 5), (9, 6)), 6, later, STOP_AFTER_MS) == Status.REWIND


def commit(group: str, partition: int, offset: int, ts: int, log_offset: int) -> Commit:
    return Commit(group, "t", partition, offset, ts, log_partition=3, log_offset=log_offset)


def test_window_is_the_last_commits_in_log_order() -> None:
    commits = [commit("g", 0, o, 100 + o, log_offset=o) for o in range(15)]
    commits.reverse()
    window = latest_commits(commits, max_samples=4)[("g", "t", 0)]
    assert [c.offset for c in window] == [11, 12, 13, 14]


def test_a_tombstone_deletes_the_commits_before_it() -> None:
    """A deleted group's (or expired offset's) commits stay in the log until compaction: the
    audit reported a group deleted with lag as STOP indefinitely."""
    deleted = Deleted("g", "t", 0, log_partition=3, log_offset=9)  # between offsets 4 and 5
    rows: list[Commit | Deleted] = [commit("g", 0, o, 100 + o, log_offset=2 * o) for o in range(8)]
    rows += [commit("g", 1, 7, 107, log_offset=20), deleted]
    kept = without_deleted(reversed(rows))
    assert sorted((c.partition, c.offset) for c in kept) == [(0, 5), (0, 6), (0, 7), (1, 7)]


def test_decoded_offsets_records_keep_tombstones_with_a_null_offset() -> None:
    commit_record = CoordinatorRecord(
        OffsetCommitKey(group_id="g", topic="t", partition=0),
        OffsetCommitValue(offset=5, commit_timestamp_ms=9),
    )
    key, value = encode_record(commit_record)
    batch = pa.RecordBatch.from_pylist(
        [
            {"key": key, "value": value, "partition": 3, "offset": 0},
            {"key": key, "value": None, "partition": 3, "offset": 1},
        ]
    )
    (out,) = decode_batches(iter([batch]))
    assert [(r["offset"], r["log_offset"]) for r in out.to_pylist()] == [(5, 0), (None, 1)]


def test_report_rates_lags_and_worst_status() -> None:
    commits = [
        commit("g", 0, 5, NOW_MS - 3000, 0),
        commit("g", 0, 10, NOW_MS - 2000, 1),
        commit("g", 1, 7, NOW_MS - 2000, 2),
        commit("g", 1, 4, NOW_MS - 1000, 3),
        commit("old", 0, 1, NOW_MS - 500_000, 4),
    ]
    end_at = {("t", 0, NOW_MS - 3000): 8, ("t", 0, NOW_MS - 2000): 10}
    reports = build_report(
        commits,
        end_offsets_at=end_at,
        end_offsets_now={("t", 0): 10, ("t", 1): 9},
        now_ms=NOW_MS,
        window_ms=10_000,
    )
    by_group = {r.group: r for r in reports}
    g = by_group["g"]
    assert g.status == Status.REWIND  # partition 1 went from 7 to 4
    assert [(p.partition, p.status, p.lag) for p in g.partitions] == [
        (0, Status.OK, 0),
        (1, Status.REWIND, 5),
    ]
    assert [s.lag for s in g.partitions[0].samples] == [3, 0]
    assert g.commits_in_window == 4
    assert g.commit_rate_per_s == pytest.approx(0.4)
    old = by_group["old"]
    assert (old.commits_in_window, old.status) == (0, Status.STOP)  # lag 9, silent for 500 s


def test_a_commit_past_the_log_end_is_ahead_with_a_negative_lag() -> None:
    """A topic recreated (or its log truncated) below a group's commit: the consumer will
    get OFFSET_OUT_OF_RANGE and reset. Clamped to 0, it read as caught up: OK."""
    commits = [commit("g", 0, 40, NOW_MS - 2000, 0), commit("g", 0, 50, NOW_MS - 1000, 1)]
    (report,) = build_report(
        commits,
        end_offsets_at={("t", 0, NOW_MS - 2000): 45, ("t", 0, NOW_MS - 1000): 48},
        end_offsets_now={("t", 0): 3},
        now_ms=NOW_MS,
        window_ms=10_000,
    )
    (partition,) = report.partitions
    assert (report.status, partition.lag) == (Status.AHEAD, -47)
    # A sample's lag is an estimate across two clocks: never below 0.
    assert [s.lag for s in partition.samples] == [5, 0]


@pytest.mark.parametrize(("status", "code"), [(Status.OK, 0), (Status.WARN, 1), (Status.AHEAD, 1)])
def test_the_audit_command_exits_1_when_a_group_is_not_ok(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], status: Status, code: int
) -> None:
    from kcoord.pipeline import cli, session

    stopped: list[bool] = []
    monkeypatch.setattr(
        session, "build_session", lambda *_: SimpleNamespace(stop=lambda: stopped.append(True))
    )
    reports = [GroupReport("fine", Status.OK, 0, 0.0), GroupReport("g", status, 0, 0.0)]
    monkeypatch.setattr(offsets_audit, "run_audit", lambda *_, **__: reports)
    assert cli.main(["run", "offsets-audit", "--json"]) == code
    assert stopped == [True]
    assert [g["status"] for g in json.loads(capsys.readouterr().out)] == ["OK", status.name]


class _Lookups:
    """A consumer whose end-offset lookups fail with ``error`` for topic "bad"."""

    error = KafkaError.UNKNOWN_TOPIC_OR_PART

    def __init__(self, _config: object) -> None:
        pass

    def get_watermark_offsets(
        self, tp: ClientTopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        if tp.topic == "bad":
            raise KafkaException(KafkaError(self.error))
        return 0, 100

    def offsets_for_times(self, tps: list[ClientTopicPartition], timeout: float) -> list[Any]:
        return [SimpleNamespace(offset=50, error=None) for _ in tps]

    def close(self) -> None:
        pass


def test_an_end_offset_lookup_that_fails_fails_the_audit_unless_the_topic_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any failure read as 'the topic is gone': lags unknown, and a group that had stopped an
    hour before was reported OK."""
    monkeypatch.setattr(offsets_audit, "Consumer", _Lookups)
    commits = [
        Commit(g, t, 0, 10, NOW_MS, 0, i) for i, (g, t) in enumerate([("g", "bad"), ("g", "ok")])
    ]
    at, now = offsets_audit.end_offsets("127.0.0.1:1", commits, 5)
    assert now == {("ok", 0): 100} and at == {("ok", 0, NOW_MS): 50}
    monkeypatch.setattr(_Lookups, "error", KafkaError._TIMED_OUT)
    # Retriable: asked again until the deadline, 30 s of this test's run without this.
    monkeypatch.setattr(offsets_audit, "LIST_OFFSETS_TIMEOUT_S", 0.3)
    with pytest.raises(KafkaException):
        offsets_audit.end_offsets("127.0.0.1:1", commits, 5)


def test_a_corrupt_offsets_record_fails_the_audit_and_an_unknown_type_is_skipped() -> None:
    """A record of a known type that does not decode was skipped as an unknown type is: an
    audit of commits passed over a corrupt commit without a word. Kafka's loader skips
    unknown types and fails on the rest; so does the audit, naming where the record is."""
    key, value = encode_record(
        CoordinatorRecord(
            OffsetCommitKey(group_id="g", topic="t", partition=0),
            OffsetCommitValue(offset=5, commit_timestamp_ms=9),
        )
    )
    unknown_type = (999).to_bytes(2, "big") + key[2:]
    assert value is not None
    rows = [
        {"key": unknown_type, "value": value, "partition": 3, "offset": 0},
        {"key": key, "value": value, "partition": 3, "offset": 1},
    ]
    (out,) = decode_batches(iter([pa.RecordBatch.from_pylist(rows)]))
    assert [r["log_offset"] for r in out.to_pylist()] == [1]
    rows.append({"key": key, "value": value[:3], "partition": 3, "offset": 2})
    with pytest.raises(CoordinatorRecordError, match="__consumer_offsets-3 offset 2"):
        list(decode_batches(iter([pa.RecordBatch.from_pylist(rows)])))
