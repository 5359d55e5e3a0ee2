"""The streaming reader's planning on the driver, without Spark running: what ``latestOffset``
and ``partitions`` make of the offsets the cluster reports (``_latest`` stands in for it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException
from confluent_kafka import TopicPartition as ClientTopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from kcoord.pipeline import source
from kcoord.pipeline.options import (
    DataLossError,
    OffsetRange,
    OptionError,
    from_json_offsets,
    parse_source_options,
)
from kcoord.pipeline.source import KcoordStreamReader, RangePartition

TP = ("t", 0)


def reader(fail_on_data_loss: bool, log_start: int, log_end: int) -> KcoordStreamReader:
    options = parse_source_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
            "fetchOffset.retryIntervalMs": "1",
        },
        streaming=True,
    )
    stream = KcoordStreamReader(options)
    stream._latest = lambda: ([TP], {TP: log_start}, {TP: log_end})  # type: ignore[method-assign]
    return stream


@pytest.mark.parametrize("log_end", [0, 40])
def test_a_partition_whose_log_end_fell_below_the_query_is_data_loss(log_end: int) -> None:
    """The log end fell below the query at offset 100 (the topic was deleted and created
    again, or an unclean election truncated it). The end was clamped to the start: nothing
    was planned while the new log stayed below 100, and once past it the query read on from
    100, skipping the new records unreported. (A new log already past the old position when
    the query next looks cannot be told.)"""
    start = {"t": {"0": 100}}
    failing = reader(True, 0, log_end)
    end = failing.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": log_end}}
    with pytest.raises(DataLossError, match="past the log end offset"):
        failing.partitions(start, end)
    # failOnDataLoss=false: as in Spark, the range is dropped ("offset was changed from 100
    # to 40") and the next batch goes on from the log end. Read again from the log start,
    # a log truncated at 40 (an unclean election) gave the query its records 0..39 twice.
    going_on = reader(False, 0, log_end)
    end = going_on.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": log_end}}
    assert going_on.partitions(start, end) == []
    going_on._latest = lambda: ([TP], {TP: 0}, {TP: log_end + 5})  # type: ignore[method-assign]
    after = going_on.latestOffset(end, ReadAllAvailable())
    planned = going_on.partitions(end, after)
    assert [p.offset_range for p in planned if isinstance(p, RangePartition)] == [
        OffsetRange("t", 0, log_end, log_end + 5)
    ]


def test_a_log_grown_back_past_the_query_between_planning_and_reading_is_still_data_loss() -> None:
    """``latestOffset`` saw the log end at 40, below the query at 100; by ``partitions`` the
    new log had passed 100 again, and the range was dropped (its end below its start) and
    the next batch started at 40, skipping nothing it should have reported."""
    start = {"t": {"0": 100}}
    stream = reader(True, 0, 40)
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 40}}
    stream._latest = lambda: ([TP], {TP: 0}, {TP: 150})  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="past the log end offset"):
        stream.partitions(start, end)


def _stream(**options: str) -> KcoordStreamReader:
    return KcoordStreamReader(
        parse_source_options(
            {
                "kafka.bootstrap.servers": "127.0.0.1:1",
                "subscribe": "t,u",
                "fetchOffset.retryIntervalMs": "1",
                **options,
            },
            streaming=True,
        )
    )


def test_a_partition_of_a_deleted_topic_is_dropped_not_committed_for_ever() -> None:
    """Topic u was deleted while the query was at u-0 offset 50. Its end was carried on from
    the start in every batch and committed each time; the broker refuses a commit of an
    unknown partition, and after the committer's retries the query failed, at every restart
    too. Spark forgets it ("are gone"), reporting data loss."""
    commits: list[dict[tuple[str, int], int]] = []
    stream = _stream(failOnDataLoss="false", groupId="g")
    stream._maybe_commit = lambda offsets: commits.append(dict(offsets))  # type: ignore[method-assign]
    stream._latest = lambda: ([TP], {TP: 0}, {TP: 30})  # type: ignore[method-assign]
    start = {"t": {"0": 10}, "u": {"0": 50}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 30}}
    assert commits == [{TP: 10}]
    planned = stream.partitions(start, end)
    assert [p.offset_range for p in planned if isinstance(p, RangePartition)] == [
        OffsetRange("t", 0, 10, 30)
    ]
    failing = _stream()
    failing._latest = stream._latest  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="u-0 is gone"):
        failing.partitions(start, failing.latestOffset(start, ReadAllAvailable()))


def test_max_offsets_per_trigger_counts_a_new_partitions_backlog_from_its_earliest() -> None:
    stream = _stream(maxOffsetsPerTrigger="10")
    new = ("t", 1)
    stream._latest = lambda: (  # type: ignore[method-assign]
        [TP, new],
        {TP: 0, new: 0},
        {TP: 100, new: 1_000_000},
    )
    end = from_json_offsets(stream.latestOffset({"t": {"0": 0}}, ReadMaxRows(10)))
    assert sum(end.values()) == 10 and end[new] <= 10


def test_a_partition_added_after_the_start_that_does_not_begin_at_zero_is_data_loss() -> None:
    start = {"t": {"0": 5}}
    end = {"t": {"0": 10, "1": 40}}
    latest = lambda: ([TP, ("t", 1)], {TP: 0, ("t", 1): 7}, {TP: 10, ("t", 1): 40})  # noqa: E731
    failing = _stream()
    failing._latest = latest  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match=r"t-1: offsets 0\.\.6 are gone \(log start offset 7\)"):
        failing.partitions(start, end)
    going_on = _stream(failOnDataLoss="false")
    going_on._latest = latest  # type: ignore[method-assign]
    ranges = [
        p.offset_range for p in going_on.partitions(start, end) if isinstance(p, RangePartition)
    ]
    assert ranges == [OffsetRange("t", 0, 5, 10), OffsetRange("t", 1, 7, 40)]


def test_a_new_partition_the_metadata_does_not_show_yet_is_asked_for_then_reported() -> None:
    """``latestOffset`` saw t-1 (40 records); ``partitions`` asked a node whose metadata
    lagged and had no t-1: it was left out unreported, and the next batch read it from 40.
    It is asked for again, then reported as data loss (Spark: "Cannot find earliest offsets")."""
    start = {"t": {"0": 5}}
    end = {"t": {"0": 10, "1": 40}}
    answers = [
        ([TP], {TP: 0}, {TP: 10}),  # lagging metadata
        ([TP, ("t", 1)], {TP: 0, ("t", 1): 0}, {TP: 10, ("t", 1): 40}),
    ]
    seeing = _stream()
    seeing._latest = lambda: answers.pop(0) if len(answers) > 1 else answers[0]  # type: ignore[method-assign]
    ranges = [
        p.offset_range for p in seeing.partitions(start, end) if isinstance(p, RangePartition)
    ]
    assert ranges == [OffsetRange("t", 0, 5, 10), OffsetRange("t", 1, 0, 40)]
    blind = _stream()
    blind._latest = lambda: ([TP], {TP: 0}, {TP: 10})  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="t-1 is gone"):
        blind.partitions(start, end)


class _Message:
    def __init__(self, offset: int, error: object = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> object:
        return self._error

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0


class _OutOfRange:
    def code(self) -> int:
        return KafkaError._AUTO_OFFSET_RESET

    def __str__(self) -> str:
        return "offset out of range"


class _RetentionMidRange:
    """Offsets 100..119 read, then the log start moves to 150 (retention): the fetch of 120
    is out of range; 150..199 are still in the log."""

    def __init__(self, _config: object) -> None:
        self.position = 100
        self.assigned: list[int] = []

    def assign(self, partitions: list[ClientTopicPartition]) -> None:
        self.assigned.append(partitions[0].offset)
        self.position = partitions[0].offset

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        if self.position < 120:
            self.position = 120
            return [_Message(o) for o in range(100, 120)]
        if self.position == 120:
            return [_Message(120, _OutOfRange())]
        messages = [_Message(o) for o in range(self.position, 200)]
        self.position = 200
        return messages

    def get_watermark_offsets(
        self, _tp: ClientTopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        return 150, 200

    def close(self) -> None:
        pass


def test_a_task_whose_range_lost_records_mid_read_goes_on_from_the_log_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """failOnDataLoss=false: Spark's KafkaDataConsumer goes on from the earliest offset still
    in the range; ending the range there dropped 150..199, still in the log."""
    monkeypatch.setattr(source, "Consumer", _RetentionMidRange)
    options = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "failOnDataLoss": "false"},
        streaming=True,
    )
    batches = source.read_range(options, OffsetRange("t", 0, 100, 200))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == [*range(100, 120), *range(150, 200)]
    # failOnDataLoss=true: data loss, said as such (it was librdkafka's bare error).
    failing = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True
    )
    with pytest.raises(DataLossError, match=r"t-0: offset 120 .* failOnDataLoss=false"):
        list(source.read_range(failing, OffsetRange("t", 0, 100, 200)))


def test_available_now_reports_a_log_end_fallen_below_the_query() -> None:
    """Trigger.AvailableNow planned to the high watermarks recorded when it started, and so
    never saw that the topic had been made again below the query: the run ended cleanly, and
    a later one read on from the old position, skipping the new log's first records."""
    stream = reader(True, 0, 40)
    stream._target = {TP: 150}
    start = {"t": {"0": 100}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 40}}
    with pytest.raises(DataLossError, match="past the log end offset"):
        stream.partitions(start, end)


def test_a_log_end_below_the_query_is_asked_for_again_before_it_is_data_loss() -> None:
    """One stale answer (a deposed leader's high watermark) was data loss at once: the query
    failed for good (the bad end is in its offset log), or re-read what it had processed."""
    answers = iter([40, 40, 150])
    asked: list[int] = []

    def latest() -> tuple[list[tuple[str, int]], dict[tuple[str, int], int], dict[Any, int]]:
        asked.append(1)
        return [TP], {TP: 0}, {TP: next(answers)}

    stream = reader(True, 0, 0)
    stream._latest = latest  # type: ignore[method-assign]
    start = {"t": {"0": 100}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 150}} and len(asked) == 3
    # fetchOffset.numRetries asks in all: then it is what the log says.
    answers = iter([40, 40, 40])
    assert stream.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 40}}


def test_a_partition_the_end_lacks_is_gone_even_if_the_metadata_has_it_again() -> None:
    """Spark's deleted partitions are the start's less the end's. Read from the metadata,
    u-0 (gone when the end was planned, back by the time the batch was) was forgotten
    unreported, then read again from 0 as a new partition."""
    u = ("u", 0)
    latest = lambda: ([TP, u], {TP: 0, u: 0}, {TP: 30, u: 60})  # noqa: E731
    start, end = {"t": {"0": 10}, "u": {"0": 50}}, {"t": {"0": 30}}
    failing = _stream()
    failing._latest = latest  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="u-0 is gone"):
        failing.partitions(start, end)


class _TruncatedMidRange:
    """Offsets 100..109 read, then the log ends at 110 for good: an unclean election cut it
    below the range's end, 200."""

    def __init__(self, _config: object) -> None:
        self.position = 100

    def assign(self, partitions: list[ClientTopicPartition]) -> None:
        self.position = partitions[0].offset

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        if self.position < 110:
            self.position = 110
            return [_Message(o) for o in range(100, 110)]
        return [_Message(110, _Eof())]

    def get_watermark_offsets(
        self, _tp: ClientTopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        return 0, 110

    def close(self) -> None:
        pass


class _Eof:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF


def test_a_log_truncated_inside_the_range_being_read_is_data_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was a TimeoutError after kafkaConsumer.pollTimeoutMs (120 s), failOnDataLoss=false
    or not."""
    monkeypatch.setattr(source, "Consumer", _TruncatedMidRange)
    monkeypatch.setattr(source, "TRUNCATION_GRACE_S", 0.0)

    def read(fail_on_data_loss: bool) -> list[int]:
        options = parse_source_options(
            {
                "kafka.bootstrap.servers": "127.0.0.1:1",
                "subscribe": "t",
                "failOnDataLoss": str(fail_on_data_loss).lower(),
            },
            streaming=True,
        )
        batches = source.read_range(options, OffsetRange("t", 0, 100, 200))
        return [o for b in batches for o in b.column("offset").to_pylist()]

    with pytest.raises(DataLossError, match=r"the log ends at offset 110, inside the range"):
        read(True)
    assert read(False) == list(range(100, 110))


class _NewLeaderMidRange(_TruncatedMidRange):
    """As ``_TruncatedMidRange``, but the partition's new leader first answers its watermark
    lookups OFFSET_NOT_AVAILABLE (its high watermark below the start of its epoch)."""

    not_available = 2

    def get_watermark_offsets(
        self, tp: ClientTopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        if self.not_available:
            self.not_available -= 1
            raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE))
        return super().get_watermark_offsets(tp, timeout, cached)


def test_a_truncation_looked_at_during_a_leader_change_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log end is looked at once a read stops inside its range, which is when a new
    leader answers OFFSET_NOT_AVAILABLE: librdkafka raised it at once, and the task failed,
    and with it the query (found by a review). Spark's source polls on."""
    monkeypatch.setattr(source, "Consumer", _NewLeaderMidRange)
    monkeypatch.setattr(source, "TRUNCATION_GRACE_S", 0.0)
    options = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "failOnDataLoss": "false"},
        streaming=True,
    )
    batches = source.read_range(options, OffsetRange("t", 0, 100, 200))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(100, 110))


@pytest.mark.parametrize("include_headers", [False, True])
def test_rows_have_a_headers_column_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, include_headers: bool
) -> None:
    """Spark's Kafka source schema has ``headers`` only with includeHeaders=true; kcoord's
    always had it, so a job ported from Spark got a column more (found by a review)."""
    monkeypatch.setattr(source, "Consumer", _TruncatedMidRange)
    monkeypatch.setattr(source, "TRUNCATION_GRACE_S", 0.0)
    options = {
        "kafka.bootstrap.servers": "127.0.0.1:1",
        "subscribe": "t",
        "failOnDataLoss": "false",
        "includeHeaders": str(include_headers).lower(),
    }
    parsed = parse_source_options(options, streaming=True)
    (batch,) = list(source.read_range(parsed, OffsetRange("t", 0, 100, 200)))
    names = batch.schema.names
    assert names == source.KcoordDataSource(options).schema().fieldNames()
    assert ("headers" in names) is include_headers
    assert names[:7] == ["key", "value", "topic", "partition", "offset", "timestamp",
                         "timestampType"]  # fmt: skip
    if include_headers:
        assert batch.column("headers").to_pylist() == [[]] * 10


def test_a_schema_other_than_the_sources_own_is_refused() -> None:
    """Spark's Kafka source has a fixed schema; kcoord's batches follow includeHeaders, and a
    schema given with ``.schema(...)`` of one column more or less failed in an executor."""
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    data_source = source.KcoordDataSource(options)
    assert isinstance(data_source.streamReader(source.SCHEMA), source.KcoordStreamReader)
    with pytest.raises(OptionError, match="fixed schema"):
        data_source.reader(source.SCHEMA_WITH_HEADERS)
    with_headers = source.KcoordDataSource({**options, "includeHeaders": "true"})
    with pytest.raises(OptionError, match="fixed schema"):
        with_headers.streamReader(source.SCHEMA)


class _Committing:
    """A consumer whose commits answer per partition from ``errors`` (None: committed)."""

    errors: ClassVar[dict[tuple[str, int], int | None]] = {}
    raised: ClassVar[KafkaException | None] = None

    def __init__(self, _config: object) -> None:
        self.requests: list[list[tuple[str, int]]] = []

    def commit(self, offsets: list[ClientTopicPartition], asynchronous: bool) -> list[Any]:
        self.requests.append([(tp.topic, tp.partition) for tp in offsets])
        if self.raised is not None:
            raise self.raised
        out = []
        for tp in offsets:
            code = self.errors.get((tp.topic, tp.partition))
            out.append(
                SimpleNamespace(
                    topic=tp.topic, partition=tp.partition, error=code and KafkaError(code)
                )
            )
        return out

    def close(self) -> None:
        pass


def test_a_commit_of_a_gone_partition_leaves_it_out_and_a_failing_commit_is_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Committing the end of a batch that read a topic deleted since failed the query after
    30 s of retries (Spark's own source commits nothing: the group's offsets are for
    monitoring; the checkpoint is what a restart reads)."""
    monkeypatch.setattr(source, "Consumer", _Committing)
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    options = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True
    )
    _Committing.errors = {("u", 0): KafkaError.UNKNOWN_TOPIC_OR_PART}
    committer = source.OffsetCommitter(options, "g")
    assert committer.commit({TP: 10, ("u", 0): 50}) is source.Committed.DONE
    consumer = committer._consumer
    assert isinstance(consumer, _Committing) and consumer.requests == [[TP, ("u", 0)]]  # once

    _Committing.raised = KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE))
    monkeypatch.setattr(source, "COMMIT_TIMEOUT_S", 0.0)
    assert source.OffsetCommitter(options, "g").commit({TP: 10}) is source.Committed.FAILED
    _Committing.raised = None


def test_a_query_restarted_before_its_first_batch_finished_starts_where_it_did(
    tmp_path: Path,
) -> None:
    """Spark asks ``initialOffset`` again when it restarts a query whose first batch it
    planned but never finished. Resolved again, ``latest`` had moved: the records of that
    batch were skipped, unreported. With ``initialOffsetsPath`` the first answer is given."""
    u0 = ("u", 0)
    path = tmp_path / "checkpoint" / "totals" / "initial-offsets.json"
    first = _stream(startingOffsets="latest", initialOffsetsPath=str(path))
    first._latest = lambda: ([TP, u0], {TP: 0, u0: 0}, {TP: 100, u0: 7})  # type: ignore[method-assign]
    assert first.initialOffset() == {"t": {"0": 100}, "u": {"0": 7}}
    grown = lambda: ([TP, u0], {TP: 0, u0: 0}, {TP: 130, u0: 9})  # noqa: E731
    restarted = _stream(startingOffsets="latest", initialOffsetsPath=str(path))
    restarted._latest = grown  # type: ignore[method-assign]
    assert restarted.initialOffset() == {"t": {"0": 100}, "u": {"0": 7}}
    # Without it, as Spark's Python sources are left: the start moves with the log end.
    unkept = _stream(startingOffsets="latest")
    unkept._latest = grown  # type: ignore[method-assign]
    assert unkept.initialOffset() == {"t": {"0": 130}, "u": {"0": 9}}
    # Another source given the same path (or this one subscribing elsewhere since): refused,
    # where it would have started from offsets it never had.
    elsewhere = _stream(startingOffsets="latest", initialOffsetsPath=str(path), subscribe="t")
    elsewhere._latest = grown  # type: ignore[method-assign]
    with pytest.raises(OptionError, match="another subscription"):
        elsewhere.initialOffset()
    path.write_text('{"t": {"0": "a hundred"}}')
    with pytest.raises(OptionError, match="does not hold a query's initial offsets"):
        _stream(startingOffsets="latest", initialOffsetsPath=str(path)).initialOffset()


def test_the_first_batch_starts_where_it_was_planned_from() -> None:
    """Spark asks ``initialOffset`` when it plans the first batch and again when it runs it.
    Resolved at each, ``latest`` had moved on: the batch planned as [100, 110) was asked for
    from 120, past its end, and failed as data loss (or, with nothing produced meanwhile,
    was empty and its records skipped)."""
    stream = _stream(startingOffsets="latest", subscribe="t")
    ends = iter((100, 110, 120))
    stream._latest = lambda: ([TP], {TP: 0}, {TP: next(ends)})  # type: ignore[method-assign]
    planned_start = stream.initialOffset()
    planned_end = stream.latestOffset(planned_start, ReadAllAvailable())
    assert (planned_start, planned_end) == ({"t": {"0": 100}}, {"t": {"0": 110}})
    run_start = stream.initialOffset()
    assert run_start == planned_start
    run_start["t"]["0"] = 0  # the answer is Spark's to keep: it changes no later answer
    assert stream.initialOffset() == planned_start
    planned = stream.partitions(planned_start, planned_end)
    assert [p.offset_range for p in planned if isinstance(p, RangePartition)] == [
        OffsetRange("t", 0, 100, 110)
    ]


def test_initial_offsets_path_is_for_streaming_queries_only() -> None:
    with pytest.raises(OptionError, match="initialOffsetsPath"):
        parse_source_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "initialOffsetsPath": "x"},
            streaming=False,
        )


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_partition_one_metadata_answer_lacks_is_asked_for_again(fail_on_data_loss: str) -> None:
    """One metadata answer without t-1 (its topic carried an error, a node lagged) took it as
    gone: the query failed (failOnDataLoss=true), or forgot it and read it again from offset 0
    once the next answer showed it, duplicating what it had processed (found by a review)."""
    a, b = TP, ("t", 1)
    full = ([a, b], {a: 0, b: 0}, {a: 30, b: 30})
    lacking = ([a], {a: 0}, {a: 30})
    stream = _stream(failOnDataLoss=fail_on_data_loss)
    answers = [lacking, full, lacking, full]
    stream._latest = lambda: answers.pop(0) if len(answers) > 1 else answers[0]  # type: ignore[method-assign]
    start = {"t": {"0": 10, "1": 10}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 30, "1": 30}}
    ranges = [p.offset_range for p in stream.partitions(start, end)]  # type: ignore[attr-defined]
    assert ranges == [OffsetRange("t", 0, 10, 30), OffsetRange("t", 1, 10, 30)]


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_stale_log_end_when_the_batch_is_planned_is_not_data_loss(
    fail_on_data_loss: str,
) -> None:
    """``latestOffset`` planned t-0 from 10 to 30; ``partitions`` then got a stale answer (a
    deposed leader's high watermark, 5): the query failed, or re-read t-0 from its earliest
    offset. As in Spark, only an end below the start is data loss there; a log truncated
    under the read is caught by the reader."""
    answers = [([TP], {TP: 0}, {TP: 30}), ([TP], {TP: 0}, {TP: 5})]
    stream = _stream(failOnDataLoss=fail_on_data_loss)
    stream._latest = lambda: answers.pop(0) if len(answers) > 1 else answers[0]  # type: ignore[method-assign]
    start = {"t": {"0": 10}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 30}}
    ranges = [p.offset_range for p in stream.partitions(start, end)]  # type: ignore[attr-defined]
    assert ranges == [OffsetRange("t", 0, 10, 30)]


def test_a_commit_the_broker_refuses_for_good_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """UNKNOWN_MEMBER_ID (the groupId is a live consumer group's, which takes no commit from
    outside it) was retried for COMMIT_TIMEOUT_S at every micro-batch: each batch waited
    10 s for a commit that is for monitoring only. It is said once, and not retried."""
    sleeps: list[float] = []
    monkeypatch.setattr(source, "Consumer", _Committing)
    monkeypatch.setattr(time, "sleep", sleeps.append)
    options = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True
    )
    _Committing.errors = {TP: KafkaError.UNKNOWN_MEMBER_ID}
    try:
        committer = source.OffsetCommitter(options, "busy")
        with caplog.at_level("WARNING", logger=source.__name__):
            assert committer.commit({TP: 10}) is source.Committed.REFUSED
            assert committer.commit({TP: 20}) is source.Committed.REFUSED
        consumer = committer._consumer
        assert isinstance(consumer, _Committing) and consumer.requests == [[TP], [TP]]
        assert sleeps == []
        assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    finally:
        _Committing.errors = {}


class _Gated:
    """A consumer whose commits wait for ``gate`` and answer from ``outcomes`` in turn (None:
    committed; a code: refused or retriable), with what each was asked recorded."""

    def __init__(self, _config: object) -> None:
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)  # released as each commit begins
        self.asked: list[dict[tuple[str, int], int]] = []
        self.outcomes: list[int | None] = []
        self.closed = False

    def commit(self, offsets: list[ClientTopicPartition], asynchronous: bool) -> list[Any]:
        self.entered.release()
        assert self.gate.wait(30), "the test never opened the gate"
        self.asked.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        code = self.outcomes.pop(0) if self.outcomes else None
        if code is not None and code not in source.COMMIT_RETRIABLE_CODES:
            return [
                SimpleNamespace(topic=tp.topic, partition=tp.partition, error=KafkaError(code))
                for tp in offsets
            ]
        if code is not None:
            raise KafkaException(KafkaError(code))
        return [
            SimpleNamespace(topic=tp.topic, partition=tp.partition, error=None) for tp in offsets
        ]

    def close(self) -> None:
        self.closed = True


def _recording(consumers: list[_Gated]) -> Callable[[object], _Gated]:
    def make(config: object) -> _Gated:
        consumers.append(_Gated(config))
        return consumers[-1]

    return make


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_planning_a_batch_does_not_wait_for_the_groups_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``latestOffset`` sent the previous batch's commit and waited for it: with the group's
    coordinator down (a node killed, an election) each micro-batch was held up to
    COMMIT_TIMEOUT_S. The commit goes on a thread of its own; offsets superseded before they
    were sent are never sent. With nothing new to read, ``latestOffset`` waits for the commit
    once (Spark ends an AvailableNow query there by killing the process, no ``stop``)."""
    consumers: list[_Gated] = []
    monkeypatch.setattr(source, "Consumer", _recording(consumers))
    stream = _stream(groupId="g")
    stream._latest = lambda: ([TP], {TP: 0}, {TP: 100})  # type: ignore[method-assign]
    assert stream.latestOffset({"t": {"0": 10}}, ReadAllAvailable()) == {"t": {"0": 100}}
    _until(lambda: bool(consumers), "the commit thread's consumer")
    consumer = consumers[0]
    assert consumer.entered.acquire(timeout=10)  # the first commit is being sent
    stream.commit({"t": {"0": 20}})  # superseded while the first is still being sent
    stream.commit({"t": {"0": 30}})
    assert consumer.asked == []
    consumer.gate.set()
    _until(lambda: len(consumer.asked) == 2, "the newest offsets sent")
    assert consumer.asked == [{TP: 10}, {TP: 30}]
    stream.commit({"t": {"0": 30}})  # committed already: not sent again
    consumer.gate.clear()
    stream._latest = lambda: ([TP], {TP: 0}, {TP: 40})  # type: ignore[method-assign]
    opening = threading.Timer(0.2, consumer.gate.set)
    opening.start()
    # Nothing new past 40: the answer waits until the commit of 40 is sent.
    assert stream.latestOffset({"t": {"0": 40}}, ReadAllAvailable()) == {"t": {"0": 40}}
    assert consumer.asked == [{TP: 10}, {TP: 30}, {TP: 40}]
    opening.join()
    consumer.gate.clear()
    # Once: asked again, it neither sends nor waits (the gate is shut).
    assert stream.latestOffset({"t": {"0": 40}}, ReadAllAvailable()) == {"t": {"0": 40}}
    stream.commit({"t": {"0": 50}})
    consumer.gate.set()
    stream.stop()  # sends what is pending before it returns
    assert consumer.asked == [{TP: 10}, {TP: 30}, {TP: 40}, {TP: 50}] and consumer.closed


def _background_commits() -> source.BackgroundCommits:
    options = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True
    )
    return source.BackgroundCommits(options, "g")


def test_background_commits_send_failed_offsets_again_and_refused_ones_never(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumers: list[_Gated] = []
    monkeypatch.setattr(source, "Consumer", _recording(consumers))
    monkeypatch.setattr(source, "COMMIT_TIMEOUT_S", 0.0)
    commits = _background_commits()
    try:
        commits.submit({TP: 10})
        _until(lambda: bool(consumers), "the commit thread's consumer")
        consumer = consumers[0]
        consumer.outcomes = [KafkaError.COORDINATOR_NOT_AVAILABLE] * 2 + [None]
        consumer.gate.set()
        _until(lambda: commits.settled() == {TP: 10}, "sent until committed")
        assert consumer.asked == [{TP: 10}] * 3
        consumer.outcomes = [KafkaError.UNKNOWN_MEMBER_ID]
        commits.submit({TP: 20})
        _until(lambda: commits.settled() == {TP: 20}, "refused")
        commits.submit({TP: 20})
        commits.submit({TP: 10})
        _until(lambda: commits.settled() == {TP: 10}, "older offsets, newest again")
        assert consumer.asked == [{TP: 10}] * 3 + [{TP: 20}, {TP: 10}]
    finally:
        commits.close()
    assert consumer.closed


def test_background_commits_go_on_after_an_error_of_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception out of a commit (a bug, the client) ended the commit thread, and the query
    went on with no monitoring commit for the rest of its life."""
    made: list[_Gated] = []

    def consumer(config: object) -> _Gated:
        if not made:
            made.append(_Gated(config))
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG))  # the first one fails
        made.append(_Gated(config))
        made[-1].gate.set()
        return made[-1]

    monkeypatch.setattr(source, "Consumer", consumer)
    monkeypatch.setattr(source, "ERROR_BACKOFF_S", 0.0)
    commits = _background_commits()
    try:
        commits.submit({TP: 10})
        _until(lambda: commits.settled() == {TP: 10}, "sent again, by a new client")
        assert len(made) == 2 and made[-1].asked == [{TP: 10}]
    finally:
        commits.close()


def test_the_source_creates_no_topic_and_reads_as_it_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka's admin handle asks Metadata to create the topic it names: a batch read of
    a mistyped topic came back empty and left the topic created. Readers took librdkafka's
    read_committed while the plan went to the high watermark (Spark reads uncommitted unless
    told), so an open transaction held a task until its poll timeout."""
    configs: list[dict[str, Any]] = []

    class Admin:
        def __init__(self, config: dict[str, Any]) -> None:
            configs.append(config)

    monkeypatch.setattr(source, "AdminClient", Admin)
    plain = parse_source_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}, streaming=False
    )
    committed = parse_source_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "t",
            "kafka.isolation.level": "read_committed",
        },
        streaming=False,
    )
    assert source.Cluster(plain)._isolation is IsolationLevel.READ_UNCOMMITTED
    assert source.Cluster(committed)._isolation is IsolationLevel.READ_COMMITTED
    assert [c["allow.auto.create.topics"] for c in configs] == [False, False]

    class Reader(_TruncatedMidRange):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__(config)
            configs.append(config)

    monkeypatch.setattr(source, "Consumer", Reader)
    for options in (plain, committed):
        list(source.read_range(options, OffsetRange("t", 0, 100, 105)))
    assert [c["isolation.level"] for c in configs[2:]] == ["read_uncommitted", "read_committed"]


def test_no_metadata_names_the_bootstrap_servers_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreachable cluster failed the read with librdkafka's bare "_TRANSPORT" after 30 s,
    naming no broker."""

    class Unreachable:
        def __init__(self, _config: object) -> None:
            pass

        def list_topics(self, **_kwargs: object) -> None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))

    monkeypatch.setattr(source, "AdminClient", Unreachable)
    options = parse_source_options(
        {"kafka.bootstrap.servers": "h1:9092,h2:9092", "subscribe": "t"}, streaming=False
    )
    with pytest.raises(KafkaException, match=r"kafka\.bootstrap\.servers=h1:9092,h2:9092") as e:
        source.Cluster(options).partitions()
    assert e.value.args[0].code() == KafkaError._TRANSPORT


def test_available_now_goes_on_with_a_partition_its_target_lacked() -> None:
    """Trigger.AvailableNow's target is one metadata answer: a partition of the query that
    answer lacked (its topic carried an error) was planned as gone, failing the query or
    forgetting the partition until it was read again from its earliest offset."""
    a, b = TP, ("t", 1)
    stream = _stream()
    stream._latest = lambda: ([a, b], {a: 0, b: 0}, {a: 30, b: 40})  # type: ignore[method-assign]
    stream._target = {a: 30}
    start = {"t": {"0": 10, "1": 10}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 30, "1": 40}}
    ranges = [p.offset_range for p in stream.partitions(start, end)]  # type: ignore[attr-defined]
    assert ranges == [OffsetRange("t", 0, 10, 30), OffsetRange("t", 1, 10, 40)]
    # That first end is its target: read to the log end at every batch, a query over a
    # partition written to steadily never finished.
    stream._latest = lambda: ([a, b], {a: 0, b: 0}, {a: 30, b: 90})  # type: ignore[method-assign]
    assert stream.latestOffset(end, ReadAllAvailable()) == end


def test_an_assigned_partition_missing_mid_stream_is_data_loss_not_an_option_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``assign``, a partition the metadata did not show failed the query at once as a
    bad option, mid-stream too (a topic deleted, a node's metadata behind), whatever
    ``failOnDataLoss`` said and without the ``fetchOffset`` retries. Spark's AssignStrategy
    keeps the assigned partitions the metadata shows; one gone is reported as data loss."""
    counts = {"t": 2}

    class Admin:
        def __init__(self, config: dict[str, Any]) -> None:
            pass

        def list_topics(self, **_: Any) -> Any:
            topics = {
                name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(n)))
                for name, n in counts.items()
            }
            return SimpleNamespace(topics=topics)

    def offsets(
        self: Any, partitions: list[tuple[str, int]]
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        return dict.fromkeys(partitions, 0), dict.fromkeys(partitions, 30)

    monkeypatch.setattr(source, "AdminClient", Admin)
    monkeypatch.setattr(source.Cluster, "offsets", offsets)

    def assigned(**options: str) -> KcoordStreamReader:
        given = {"kafka.bootstrap.servers": "h:1", "assign": '{"t": [0, 1]}'}
        given["fetchOffset.retryIntervalMs"] = "1"
        return KcoordStreamReader(parse_source_options({**given, **options}, streaming=True))

    start = assigned(failOnDataLoss="false").initialOffset()
    assert start == {"t": {"0": 30, "1": 30}}
    counts["t"] = 1
    with pytest.raises(OptionError, match="no such partitions: t-1"):
        assigned().initialOffset()  # a query starting so is refused
    going_on = assigned(failOnDataLoss="false")
    end = going_on.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 30}}
    assert going_on.partitions(start, end) == []
    failing = assigned()
    with pytest.raises(DataLossError, match="t-1 is gone"):
        failing.partitions(start, failing.latestOffset(start, ReadAllAvailable()))
