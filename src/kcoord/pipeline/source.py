"""The ``kcoord`` Spark data source (PySpark 4's Python Data Source API).

Theory of operation
-------------------
``spark.dataSource.register(KcoordDataSource)`` makes ``format("kcoord")`` available to
``read``, ``readStream``, ``write`` and ``writeStream``. (Not "kafka": Spark's built-in name
wins.) Options are those of Spark's Kafka source; ``kcoord.pipeline.options`` lists them and
does every decision that needs no I/O. Rows have Spark's Kafka source schema:

  key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
  timestampType int (0 CreateTime, 1 LogAppendTime), and with ``includeHeaders=true``
  headers array<struct<key, value>>

Planning runs on the driver: a Metadata request lists the topics' partitions, ListOffsets
(the admin client's ``list_offsets``, asked again on a leader's retriable answer: see
``retries``) gives each partition's log start offset and high watermark, and each partition
with records to read becomes one Spark input partition, an ``OffsetRange`` ``[from, until)``.
A task reads its range with a confluent-kafka consumer assigned to that one partition at
``from`` (no group membership, nothing committed) and stops at ``until`` or at the end of the
partition (a compacted topic may have no record at ``until - 1``). Records come back as
Arrow record batches.

Streaming: offsets are Spark's JSON form ``{"topic": {"0": next offset}}``. ``latestOffset``
asks ListOffsets for the high watermarks and applies ``maxOffsetsPerTrigger`` (or, under
``Trigger.AvailableNow``, the watermarks recorded when the query started). ``commit(end)``
runs after Spark has written the micro-batch's results and its commit log, and sends an
OffsetCommit of ``end`` for ``groupId``, so the query's progress and lag show as any consumer
group's do. The checkpoint stays the source of truth for a restart (as with Spark's Kafka
source); the committed offsets are what the query has finished, never ahead of it, and a
commit that fails is logged, not fatal, and is sent by a thread of its own, so a batch never
waits for one (``BackgroundCommits``); only a query with nothing new to read waits for its
commit, once, as Spark may end it there.

Writing: each task produces its rows with an idempotent producer (acks=all), flushes, and
fails the task if any record was not acknowledged. Spark retries a failed task, so a record
may be written twice after a failure: the sink is at-least-once, as Spark's Kafka sink is.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ClientTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    Row,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kcoord.pipeline.options import (
    LATEST,
    DataLossError,
    OffsetRange,
    Offsets,
    OptionError,
    SourceOptions,
    Subscription,
    TopicPartition,
    check_data_loss,
    from_json_offsets,
    parse_include_headers,
    parse_source_options,
    plan_ranges,
    raise_if_not_assigned,
    raise_if_unknown_partitions,
    rate_limit,
    resolve,
    to_json_offsets,
)
from kcoord.pipeline.retries import GONE_CODES, error_code, retrying
from kcoord.storage.checkpoint import write_atomically

log = logging.getLogger(__name__)

NAME = "kcoord"
METADATA_TIMEOUT_S = 30.0
COMMIT_TIMEOUT_S = 10.0
# How much longer than two commits' deadlines a stopping query waits for its last commit.
CLOSE_GRACE_S = 5.0
# The pause after a commit that raised (a bug, a client that cannot be made) before the next.
ERROR_BACKOFF_S = 1.0
FLUSH_TIMEOUT_S = 120.0
ARROW_BATCH_ROWS = 8192
# How long the log may end inside a range being read before its end is asked for: a new
# leader's high watermark catches up within a replication round.
TRUNCATION_GRACE_S = 5.0
# The reader of a range assigns through librdkafka, which insists on a group id; it never
# joins, fetches offsets of or commits to this group.
READER_GROUP_ID = "kcoord-spark-reader"

HEADER_TYPE = StructType(
    [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
)
# The rows' schema, as Spark's Kafka source has it; with includeHeaders=true, a ``headers``
# column after the others (SCHEMA_WITH_HEADERS).
SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
)
SCHEMA_WITH_HEADERS = StructType(
    [*SCHEMA.fields, StructField("headers", ArrayType(HEADER_TYPE, True), True)]
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
)
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(
    pa.field(
        "headers",
        pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
    )
)
# librdkafka's message timestamp types -> Kafka's TimestampType ids, which Spark shows.
_TIMESTAMP_TYPES = {1: 0, 2: 1, 0: -1}


def default_pyspark_python() -> None:
    """Spark's Python workers run ``PYSPARK_PYTHON``; unless told otherwise, the interpreter
    running this code, whose environment has kcoord, confluent-kafka and pyarrow."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


# --------------------------------------------------------------------------------------------
# Client I/O


def _client_config(options: SourceOptions) -> dict[str, Any]:
    # log_level 4: librdkafka's informational lines (an admin client's shutdown) are noise
    # in a Spark task's output.
    config: dict[str, Any] = {"bootstrap.servers": options.bootstrap_servers, "log_level": 4}
    config.update(dict(options.client_config))
    return config


class Cluster:
    """The driver's view of the cluster: partitions and their offsets (Metadata, ListOffsets).

    Holds an admin client; not picklable, so readers create one where they run."""

    def __init__(self, options: SourceOptions):
        self._options = options
        config = _client_config(options)
        # Reading names topics, it never creates them (Spark's offset reader describes
        # topics with the admin client): librdkafka's admin handle asks Metadata to create
        # the topic it names unless told not to, so a mistyped topic read as empty, created.
        config["allow.auto.create.topics"] = False
        self._admin = AdminClient(config)
        # The offsets a read plans up to are those its readers can reach (``read_range``).
        self._isolation = (
            IsolationLevel.READ_COMMITTED
            if config.get("isolation.level") == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )

    def partitions(self) -> list[TopicPartition]:
        sub = self._options.subscription
        explicit = sub.explicit_topics()
        counts: dict[str, int] = {}
        try:
            if len(explicit) == 1:
                metadata = self._admin.list_topics(topic=explicit[0], timeout=METADATA_TIMEOUT_S)
            else:
                metadata = self._admin.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as e:
            # librdkafka's own words ("_TRANSPORT") named no broker: say which were asked.
            raise KafkaException(
                KafkaError(
                    error_code(e) or KafkaError._TRANSPORT,
                    f"no Metadata from kafka.bootstrap.servers="
                    f"{self._options.bootstrap_servers} within {METADATA_TIMEOUT_S} s: {e}",
                )
            ) from e
        for name, topic in metadata.topics.items():
            if topic.error is None or topic.error.code() == KafkaError.NO_ERROR:
                counts[name] = len(topic.partitions)
        return sub.select(counts)

    def offsets(
        self, partitions: Sequence[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """(log start offsets, high watermarks) of ``partitions``: two ListOffsets requests
        per leader, sent by the admin client."""
        if not partitions:
            return {}, {}
        earliest = self._list_offsets(partitions, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        latest = self._list_offsets(partitions, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return earliest, latest

    def _list_offsets(
        self, partitions: Sequence[TopicPartition], spec: Any
    ) -> dict[TopicPartition, int]:
        """One ListOffsets per leader, asked again while a leader answers a retriable error
        (see ``retries``: librdkafka's admin client gives those straight back)."""
        return retrying(
            lambda: self._list_offsets_once(partitions, spec), "ListOffsets", METADATA_TIMEOUT_S
        )

    def _list_offsets_once(
        self, partitions: Sequence[TopicPartition], spec: Any
    ) -> dict[TopicPartition, int]:
        request = {ClientTopicPartition(t, p): spec for t, p in partitions}
        futures = self._admin.list_offsets(
            request, isolation_level=self._isolation, request_timeout=METADATA_TIMEOUT_S
        )
        out: dict[TopicPartition, int] = {}
        for tp, future in futures.items():
            out[(tp.topic, tp.partition)] = int(future.result(timeout=METADATA_TIMEOUT_S).offset)
        return out


class Committed(enum.Enum):
    """How one ``OffsetCommitter.commit`` ended."""

    DONE = "done"  # every partition still there was committed
    REFUSED = "refused"  # with an answer no retry changes: the same offsets are not sent again
    FAILED = "failed"  # still retriable at the deadline (no coordinator): worth sending again


class OffsetCommitter:
    """Commits a streaming query's progress for its group (OffsetCommit from a consumer that
    never joins: generation -1, as a "simple consumer" in Kafka commits).

    For monitoring only: the checkpoint is what a restart reads. So a commit that still fails
    after ``COMMIT_TIMEOUT_S`` of retries is FAILED and never stops the query (Spark's own
    Kafka source commits nothing); one refused with an error no retry changes
    (``COMMIT_RETRIABLE_CODES`` lists those that may) is REFUSED at once; a partition whose
    topic is gone (UNKNOWN_TOPIC_OR_PARTITION) is left out, as the broker will never take it.
    Blocking: the query's own commits go through ``BackgroundCommits``."""

    def __init__(self, options: SourceOptions, group_id: str):
        config = _client_config(options)
        config.update({"group.id": group_id, "enable.auto.commit": False})
        self._consumer = Consumer(config)
        self.group_id = group_id
        self._refused_with: int | None = None  # the last refusal's code, said once

    def commit(self, offsets: Mapping[TopicPartition, int]) -> Committed:
        pending = dict(offsets)
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while pending:
            request = [ClientTopicPartition(t, p, o) for (t, p), o in sorted(pending.items())]
            try:
                result = self._consumer.commit(offsets=request, asynchronous=False)
            except KafkaException as e:
                error: Any = e
            else:
                error = None
                for tp in result or []:
                    key = (tp.topic, tp.partition)
                    if tp.error is None:
                        pending.pop(key, None)
                    elif tp.error.code() in GONE_CODES:
                        log.warning(
                            "not committing %s-%d for group %r: it is gone", *key, self.group_id
                        )
                        pending.pop(key, None)
                    else:
                        error = tp.error
                if not pending:
                    self._refused_with = None
                    return Committed.DONE
            # A coordinator that moved (NOT_COORDINATOR, a dead node) is found again by the
            # client: retry until the deadline. Any other refusal (UNKNOWN_MEMBER_ID: the
            # group id is a live consumer group's; an authorization failure) is answered the
            # same way again: retried, it held every micro-batch for the whole deadline.
            code = error_code(error)
            if code is not None and code not in COMMIT_RETRIABLE_CODES:
                if code != self._refused_with:
                    log.warning(
                        "OffsetCommit for group %r refused (%s); not retried, the next batch "
                        "commits again",
                        self.group_id,
                        error,
                    )
                self._refused_with = code
                return Committed.REFUSED
            if time.monotonic() >= deadline:
                log.warning(
                    "OffsetCommit for group %r failed (%s); sent again later",
                    self.group_id,
                    error,
                )
                return Committed.FAILED
            log.warning("OffsetCommit for group %r failed (%s); retrying", self.group_id, error)
            time.sleep(0.2)  # back off before the client's next coordinator lookup
        return Committed.DONE

    def close(self) -> None:
        self._consumer.close()


class BackgroundCommits:
    """A streaming query's monitoring commits, sent by a thread of their own so that planning
    a batch never waits for one: sent from ``latestOffset``, a commit while the group's
    coordinator moved (a node down, an election) held the query up to ``COMMIT_TIMEOUT_S``
    at every batch. As Kafka's consumer does with ``commitAsync``, the query goes on; unlike
    it, only the newest offsets are sent: offsets not yet sent when newer ones come are
    dropped, so the group's offsets never go back to an older batch's.

    Offsets that FAILED (no coordinator within the deadline, or an error of the client) are
    sent again until newer ones come; REFUSED or DONE ones are not sent again (an idle query
    asks ``latestOffset`` every few milliseconds, and a refused group was sent a commit each
    time). A query with nothing new waits for its offsets once (``wait_sent``): Spark ends an
    AvailableNow query, and stops an idle one, by killing the Python process that plans it,
    so ``close`` (its ``stop``) is not called then and a commit still being sent would be
    lost."""

    def __init__(self, options: SourceOptions, group_id: str):
        self._options = options
        self.group_id = group_id
        self._changed = threading.Condition()
        self._wanted: Offsets | None = None  # newest offsets, not yet being sent
        self._sending: Offsets | None = None
        self._settled: Offsets | None = None  # the last offsets DONE or REFUSED
        self._attempts = 0  # commits ended, whatever their outcome
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, name=f"kcoord-commits-{group_id}", daemon=True
        )
        self._thread.start()

    def submit(self, offsets: Mapping[TopicPartition, int]) -> None:
        with self._changed:
            if self._closing:
                return
            if offsets == self._sending or (self._sending is None and offsets == self._settled):
                self._wanted = None  # the newest are on their way, or were settled
            else:
                self._wanted = dict(offsets)
                self._changed.notify_all()

    def settled(self) -> Offsets | None:
        """The last offsets committed or refused (for tests and logs)."""
        with self._changed:
            return self._settled

    def wait_sent(self, offsets: Mapping[TopicPartition, int], timeout_s: float) -> bool:
        """Until ``offsets`` were committed or refused, or one attempt at them ended, or newer
        ones were submitted, ``timeout_s`` at most; whether they were settled."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            attempts = self._attempts
            while offsets in (self._wanted, self._sending) and self._attempts <= attempts:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    break
                self._changed.wait(left)
            return self._settled == offsets

    def _run(self) -> None:
        committer: OffsetCommitter | None = None
        try:
            while True:
                with self._changed:
                    while self._wanted is None and not self._closing:
                        self._changed.wait()
                    if self._wanted is None:
                        return
                    offsets, self._wanted = self._wanted, None
                    self._sending = offsets
                    closing = self._closing
                try:
                    if committer is None:
                        committer = OffsetCommitter(self._options, self.group_id)
                    outcome = committer.commit(offsets)
                except Exception:  # a bug or the client's: the next offsets try again
                    log.exception("OffsetCommit for group %r failed", self.group_id)
                    outcome = Committed.FAILED
                    closing = closing or self._pause(ERROR_BACKOFF_S)
                with self._changed:
                    self._sending = None
                    self._attempts += 1
                    if outcome is not Committed.FAILED:
                        self._settled = offsets
                    elif self._wanted is None and not closing and not self._closing:
                        self._wanted = offsets  # nothing newer: send these again
                    self._changed.notify_all()
        finally:
            if committer is not None:
                committer.close()

    def _pause(self, seconds: float) -> bool:
        """Waits ``seconds`` unless closed meanwhile; whether it was."""
        with self._changed:
            self._changed.wait_for(lambda: self._closing, seconds)
            return self._closing

    def close(self) -> None:
        """Sends what is pending, once: an attempt in flight and one more."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join(2 * COMMIT_TIMEOUT_S + CLOSE_GRACE_S)
        if self._thread.is_alive():
            log.warning(
                "the last OffsetCommit for group %r is still being sent; not waiting for it",
                self.group_id,
            )


# OffsetCommit's retriable answers (the Java consumer's ``OffsetCommitResponseHandler``: the
# coordinator moved or is loading, a timeout) and librdkafka's own while it looks for it.
COMMIT_RETRIABLE_CODES: Final = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._WAIT_COORD,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)


def _watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float
) -> tuple[int, int]:
    """The partition's (log start, high watermark), asked of its leader again while it gives
    a retriable answer, up to ``timeout_s``: a new leader answers OFFSET_NOT_AVAILABLE while
    its high watermark is below the start of its epoch, the very moment a log truncated
    under a read is looked at, and librdkafka raised it at once: the task failed, and with
    it the query (Spark's source polls on up to ``pollTimeoutMs``)."""
    low, high = retrying(
        lambda: consumer.get_watermark_offsets(
            ClientTopicPartition(topic, partition), timeout=timeout_s, cached=False
        ),
        f"the offsets of {topic}-{partition}",
        timeout_s,
    )
    return int(low), int(high)


def _skip_lost(
    consumer: Consumer, offset_range: OffsetRange, offset: int, timeout_s: float, error: Any
) -> int:
    """With failOnDataLoss=false, where a range goes on after its next offset went out of
    range: from the log start if that is still inside the range (retention or DeleteRecords
    took what was below it), else nowhere (Spark's ``KafkaDataConsumer.get`` and
    ``getEarliestAvailableOffsetBetween``). Ending the range there dropped the records of the
    range that were still in the log."""
    topic, partition, until = offset_range.topic, offset_range.partition, offset_range.until_offset
    low, high = _watermarks(consumer, topic, partition, timeout_s)
    if offset < low < until:
        log.warning(
            "%s-%d: offsets %d..%d are gone (%s); reading on from the log start %d",
            topic,
            partition,
            offset,
            low - 1,
            error,
            low,
        )
        consumer.assign([ClientTopicPartition(topic, partition, low)])
        return int(low)
    log.warning(
        "%s-%d: offset %d is out of range [%d, %d) (%s); the range ends here",
        topic,
        partition,
        offset,
        low,
        high,
        error,
    )
    return until


def _end_if_truncated(
    consumer: Consumer, options: SourceOptions, offset_range: OffsetRange, offset: int
) -> int:
    """Where a range goes on after its log ended inside it for ``TRUNCATION_GRACE_S``: the
    log end offset below the range's end is data loss (an unclean election truncated the log,
    or the topic was made again); the range was planned below the high watermark, which
    never goes back otherwise. Spark's ``KafkaDataConsumer`` sees an offset past the latest
    one the same way. A new leader's high watermark can lag for a moment, hence the grace."""
    topic, partition, until = offset_range.topic, offset_range.partition, offset_range.until_offset
    _, high = _watermarks(consumer, topic, partition, options.poll_timeout_ms / 1000)
    if high >= until:
        return offset  # it grew back meanwhile: read on
    message = (
        f"{topic}-{partition}: the log ends at offset {high}, inside the range "
        f"[{offset_range.from_offset}, {until}) being read (truncated or recreated)"
    )
    if options.fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to go on.")
    log.warning("data loss: %s; the range ends here", message)
    return until


def read_range(options: SourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of one range as Arrow record batches, in offset order."""
    config = _client_config(options)
    # Spark's Kafka source reads uncommitted records unless told otherwise (the Kafka
    # consumer's default), and plans to the high watermark (``Cluster``); librdkafka's
    # default, read_committed, stopped a reader at an open transaction's first offset,
    # below its planned end, until the poll timeout failed the task.
    config.setdefault("isolation.level", "read_uncommitted")
    config.update(
        {
            "group.id": READER_GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # An offset below the log start is data loss, never a silent jump.
            "auto.offset.reset": "error",
        }
    )
    consumer = Consumer(config)
    topic, partition = offset_range.topic, offset_range.partition
    until = offset_range.until_offset
    next_offset = offset_range.from_offset
    columns = _Columns(options.include_headers)
    try:
        consumer.assign([ClientTopicPartition(topic, partition, offset_range.from_offset)])
        last_progress = time.monotonic()
        timeout_s = options.poll_timeout_ms / 1000
        eof_inside_since: float | None = None  # the log ended inside the range from then on
        while next_offset < until:
            messages = consumer.consume(num_messages=1000, timeout=0.5)
            for m in messages:
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # The end of the log: records up to ``until`` were compacted away.
                        if (m.offset() or 0) >= until:
                            next_offset = until
                        elif eof_inside_since is None:
                            eof_inside_since = time.monotonic()
                        continue
                    if error.code() != KafkaError._AUTO_OFFSET_RESET:
                        raise KafkaException(error)
                    if options.fail_on_data_loss:
                        # Spark's KafkaDataConsumer: the records are gone, said as data loss.
                        raise DataLossError(
                            f"{topic}-{partition}: offset {next_offset} of the range "
                            f"[{offset_range.from_offset}, {until}) is no longer in the log "
                            f"({error}). Set failOnDataLoss=false to go on from what "
                            "is there."
                        )
                    next_offset = _skip_lost(consumer, offset_range, next_offset, timeout_s, error)
                    break
                offset = m.offset()
                assert offset is not None, m
                if offset >= until:
                    next_offset = until
                    break
                columns.append(m)
                next_offset = offset + 1
                eof_inside_since = None
                if len(columns) >= ARROW_BATCH_ROWS:
                    yield columns.flush()
            if (
                next_offset < until
                and eof_inside_since is not None
                and time.monotonic() - eof_inside_since >= TRUNCATION_GRACE_S
            ):
                eof_inside_since = None
                next_offset = _end_if_truncated(consumer, options, offset_range, next_offset)
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout_s:
                raise TimeoutError(
                    f"{topic}-{partition}: no records for {timeout_s:.0f} s while reading "
                    f"offset {next_offset} of [{offset_range.from_offset}, {until})"
                )
        if len(columns):
            yield columns.flush()
    finally:
        consumer.close()


class _Columns:
    """Column lists for one Arrow record batch of source rows (with their headers, if
    ``include_headers``)."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.schema = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, m: Any) -> None:
        ts_type, ts_ms = m.timestamp()
        self.keys.append(m.key())
        self.values.append(m.value())
        self.topics.append(m.topic())
        self.partitions.append(m.partition())
        self.offsets.append(m.offset())
        self.timestamps.append(ts_ms * 1000)
        self.timestamp_types.append(_TIMESTAMP_TYPES.get(ts_type, -1))
        if self.include_headers:
            self.headers.append([{"key": k, "value": v} for k, v in m.headers() or ()])

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array(self.topics, pa.string()),
                pa.array(self.partitions, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self.timestamp_types, pa.int32()),
                *(
                    [pa.array(self.headers, self.schema.field("headers").type)]
                    if self.include_headers
                    else []
                ),
            ],
            schema=self.schema,
        )
        self._reset()
        return batch


# --------------------------------------------------------------------------------------------
# Readers


class RangePartition(InputPartition):
    def __init__(self, offset_range: OffsetRange):
        super().__init__(offset_range)
        self.offset_range = offset_range


class KcoordBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        cluster = Cluster(self.options)
        partitions = cluster.partitions()
        raise_if_not_assigned(self.options.subscription, partitions)
        raise_if_unknown_partitions("startingOffsets", self.options.starting, partitions)
        raise_if_unknown_partitions("endingOffsets", self.options.ending, partitions)
        earliest, latest = cluster.offsets(partitions)
        start = resolve(self.options.starting, partitions, earliest, latest)
        start, lost = check_data_loss(
            start, partitions, earliest, latest, fail_on_data_loss=self.options.fail_on_data_loss
        )
        for message in lost:
            log.warning("data loss: %s", message)
        end = resolve(self.options.ending, partitions, earliest, latest, unnamed=LATEST)
        for tp, until in end.items():
            if until > latest[tp]:
                raise OptionError(
                    f"option 'endingOffsets': {tp[0]}-{tp[1]} offset {until} is past its "
                    f"log end offset {latest[tp]}"
                )
            if until < start[tp]:
                raise OptionError(
                    f"{tp[0]}-{tp[1]}: ending offset {until} is before starting offset {start[tp]}"
                )
        return [RangePartition(r) for r in plan_ranges(start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_planned(self.options, partition)


def _read_planned(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of one planned range. A plan with no range (no partition to read, every
    range empty) is run by PySpark as one task given its default partition: nothing to read
    (it failed an assertion, so a read of an empty or missing topic failed)."""
    if isinstance(partition, RangePartition):
        yield from read_range(options, partition.offset_range)


INITIAL_OFFSETS_VERSION = 1


def _read_initial_offsets(path: Path, subscription: Subscription) -> dict[str, Any] | None:
    """The initial offsets ``initialOffset`` kept at ``path`` for ``subscription``, or None
    before it kept any (the format is in ``options``' docstring)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        kept = json.loads(text)
        if kept.get("version") != INITIAL_OFFSETS_VERSION:
            raise ValueError(f"version {kept.get('version')!r}")
        offsets = dict(kept["offsets"])
        from_json_offsets(offsets)  # the shape Spark's offsets have, or ValueError
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise OptionError(
            f"option 'initialOffsetsPath': {path} does not hold a query's initial offsets: {e!r}"
        ) from e
    if kept.get("subscription") != subscription.describe():
        # Another source's, or a query whose subscription changed since: its offsets would
        # start this one somewhere it never was.
        raise OptionError(
            f"option 'initialOffsetsPath': {path} holds the initial offsets of another "
            f"subscription ({kept.get('subscription')}); give each source its own path"
        )
    return offsets


def _keep_initial_offsets(path: Path, subscription: Subscription, offsets: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {
        "version": INITIAL_OFFSETS_VERSION,
        "subscription": subscription.describe(),
        "offsets": offsets,
    }
    write_atomically(path, json.dumps(kept, sort_keys=True))


class KcoordStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives on the driver for the query's lifetime (its clients too); Spark pickles a copy
    for each task's ``read``, without the clients (``__getstate__``)."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._cluster: Cluster | None = None
        self._commits: BackgroundCommits | None = None
        self._waited: Offsets | None = None  # the offsets _wait_committed waited for last
        # Trigger.AvailableNow: the high watermarks when the query started; the query ends
        # when it has read up to them.
        self._target: Offsets | None = None
        # initialOffset's first answer, given again (see there).
        self._initial: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A task's copy needs the options only.
        return {
            "options": self.options,
            "_cluster": None,
            "_commits": None,
            "_waited": None,
            "_target": None,
            "_initial": None,
        }

    def _get_cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(self.options)
        return self._cluster

    def _latest(
        self,
    ) -> tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int]]:
        cluster = self._get_cluster()
        partitions = cluster.partitions()
        earliest, latest = cluster.offsets(partitions)
        return partitions, earliest, latest

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts, resolved once: Spark asks when it plans the first batch
        and again when it runs it (``MicroBatchExecution.runBatch``: no batch committed yet,
        ``stream.initialOffset``), and the Python runner passes each ask on. Resolved at each,
        ``latest`` had moved on between them: the batch planned from the first answer began
        past its end (DataLossError) or was empty, its records skipped. Spark's Kafka source
        resolves its initial offsets once a query (``getOrCreateInitialPartitionOffsets``).

        Spark asks again, too, when it restarts a query whose first batch it planned but never
        finished: a new reader. With ``initialOffsetsPath`` the first answer is kept there and
        given again, as Spark's Kafka source keeps its initial offsets in the checkpoint
        (``sources/0``)."""
        if self._initial is None:
            self._initial = self._resolve_initial()
        return copy.deepcopy(self._initial)

    def _resolve_initial(self) -> dict[str, Any]:
        path = self.options.initial_offsets_path
        subscription = self.options.subscription
        if path is not None:
            kept = _read_initial_offsets(Path(path), subscription)
            if kept is not None:
                return kept
        partitions, earliest, latest = self._latest()
        raise_if_not_assigned(self.options.subscription, partitions)
        raise_if_unknown_partitions("startingOffsets", self.options.starting, partitions)
        start = to_json_offsets(resolve(self.options.starting, partitions, earliest, latest))
        if path is not None:
            _keep_initial_offsets(Path(path), subscription, start)
        return start

    def prepareForTriggerAvailableNow(self) -> None:
        _, _, latest = self._latest()
        self._target = latest

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def _latest_not_behind(
        self, begin: Offsets
    ) -> tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int]]:
        """``_latest``, asked again (``fetchOffset.numRetries`` times in all) while a log end
        is below where the query is, or a partition of the query is missing from the
        metadata: one stale answer (a deposed leader's) is not data loss (Spark's
        ``fetchLatestOffsets`` with known offsets, KAFKA-7703), nor is one answer whose
        topic carried an error (a leader not available yet). Taken as gone at once, such a
        partition failed the query, or was forgotten and read again from its earliest offset
        once the next answer showed it (or, behind, went on from the stale log end)."""
        for _ in range(self.options.fetch_offset_attempts - 1):
            current, earliest, latest = self._latest()
            behind = sorted(tp for tp, at in begin.items() if latest.get(tp, at) < at)
            missing = sorted(tp for tp in begin if tp not in latest)
            if not behind and not missing:
                return current, earliest, latest
            log.warning(
                "log end offsets below the query's or missing (%s); asking again",
                ", ".join(
                    [f"{t}-{p} at {latest[(t, p)]} < {begin[(t, p)]}" for t, p in behind]
                    + [f"{t}-{p} missing" for t, p in missing]
                ),
            )
            time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
        return self._latest()  # the last ask: what it says goes

    def _seeing(
        self,
        wanted: Sequence[TopicPartition],
        answer: tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int]],
    ) -> tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int]]:
        """``answer`` (a ``_latest``), asked again (``fetchOffset.numRetries`` times in all)
        while its metadata lacks partitions of ``wanted`` that an earlier answer showed."""
        for _ in range(self.options.fetch_offset_attempts - 1):
            missing = [tp for tp in wanted if tp not in answer[1]]
            if not missing:
                break
            log.warning(
                "the metadata lacks %s, which it showed before; asking again",
                ", ".join(f"{t}-{p}" for t, p in missing),
            )
            time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
            answer = self._latest()
        return answer

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json_offsets(start)
        current, earliest, now_latest = self._latest_not_behind(begin)
        # Spark asks for the latest offset only once the previous micro-batch (which ended
        # at ``start``) is done, results and commit log written. Spark's own ``commit(end)``
        # comes later, when the *next* batch is planned, so an idle query or the last batch
        # of an AvailableNow run would never be committed; committing ``start`` here does.
        # Not a partition that is gone (its topic deleted): its commit is refused
        # (UNKNOWN_TOPIC_OR_PARTITION), and the query failed after the committer's retries.
        existing = set(current)
        committing = {tp: offset for tp, offset in begin.items() if tp in existing}
        self._maybe_commit(committing)
        if self._target is None:
            latest = dict(now_latest)
        else:
            # A partition of the query that the target's one answer lacked (its topic carried
            # an error then) is not gone: it goes on to where the log ends the first time it
            # is seen, which is its target from then on. To the log end at every batch, a
            # query over a partition written to steadily never finished.
            for tp in begin:
                if tp not in self._target and tp in now_latest:
                    self._target[tp] = now_latest[tp]
            latest = {tp: now_latest[tp] for tp in begin if tp in now_latest}
            latest.update(self._target)
        # A partition whose log end fell below where the query is (truncated, or deleted and
        # created again) is data loss. Its end is planned there, below the start, so that
        # ``partitions`` sees it (and fails, or plans nothing for it, and the next batch goes
        # on from that log end, as Spark's does); clamped to the start, it planned nothing
        # and then read on from the old position once the new log passed it, skipping the
        # new records before it. Under AvailableNow too: the target recorded at the start is
        # no log end now.
        behind = {tp: now_latest[tp] for tp, at in begin.items() if now_latest.get(tp, at) < at}
        # A partition of ``start`` that is gone has no end: ``partitions`` reports it as data
        # loss, and the next batch forgets it (Spark's "are gone"). Carried on in every end,
        # it was committed, and refused, for ever.
        begin_known = {
            tp: offset for tp, offset in begin.items() if tp in latest and tp not in behind
        }
        if isinstance(limit, ReadMaxRows):
            # A partition that appeared since ``start`` counts from its earliest offset, as in
            # Spark's rateLimit: it took its whole backlog in one batch, past the limit.
            new = {tp: earliest.get(tp, 0) for tp in latest if tp not in begin}
            end = rate_limit(
                {**new, **begin_known},
                {tp: latest[tp] for tp in latest if tp not in behind},
                limit.max_rows,
            )
        else:
            end = {tp: offset for tp, offset in latest.items() if tp not in behind}
        # Otherwise never plan backwards (a stale AvailableNow target, a rate limit).
        end = {tp: max(offset, begin.get(tp, offset)) for tp, offset in end.items()}
        end.update(behind)
        if end == begin:
            self._wait_committed(committing)
        return to_json_offsets(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        _, _, latest = self._latest()
        return to_json_offsets(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, until = from_json_offsets(start), from_json_offsets(end)
        if begin == until:
            return []
        partitions, earliest, latest = self._seeing(list(until), self._latest())
        # A partition that appeared since ``start`` is read from offset 0; one whose log starts
        # later lost records before the query saw it, which ``check_data_loss`` reports (Spark's
        # "Added partition starts from X instead of 0"), moving it to its earliest offset. One
        # this metadata does not show (a node's that is behind the one ``latestOffset`` asked)
        # was left out without a word, and its records below ``end`` were never read: it
        # counts from 0 too, and ``check_data_loss`` reports it gone (Spark: "Cannot find
        # earliest offsets of ... Some data may have been missed").
        begin.update({tp: 0 for tp in until if tp not in begin})
        # ``latestOffset`` planned below the start a partition whose log end had fallen below
        # it: data loss, even if the new log has grown past the start by now.
        # One ``latestOffset`` planned at or past its start was checked against the log end
        # there (asked again while behind): a stale answer now (a deposed leader's high
        # watermark) is not data loss, as in Spark, which checks only ``until < start`` here;
        # a log truncated under the read is caught where it is read (``_end_if_truncated``).
        # Checked against this answer, such a partition failed the query, or was planned
        # nothing and went on from the stale log end.
        latest = {
            tp: (min(offset, until[tp]) if until[tp] < begin[tp] else max(offset, until[tp]))
            if tp in until
            else offset
            for tp, offset in latest.items()
        }
        # A partition of ``start`` that ``end`` lacks is gone (Spark: the start's partitions
        # less the end's), whatever the metadata says now: back by now, it was forgotten
        # unreported, and read again from 0 as a new partition.
        current = [tp for tp in partitions if tp in until]
        begin, lost = check_data_loss(
            begin, current, earliest, latest, fail_on_data_loss=self.options.fail_on_data_loss
        )
        for message in lost:
            log.warning("data loss: %s", message)
        until = {tp: offset for tp, offset in until.items() if tp in begin}
        return [RangePartition(r) for r in plan_ranges(begin, until)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_planned(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._maybe_commit(from_json_offsets(end))

    def _maybe_commit(self, offsets: Offsets) -> None:
        """OffsetCommit for ``groupId``, sent in the background (``BackgroundCommits``)."""
        if self.options.group_id is None:
            return
        if self._commits is None:
            self._commits = BackgroundCommits(self.options, self.options.group_id)
        self._commits.submit(offsets)

    def _wait_committed(self, offsets: Offsets) -> None:
        """Nothing new to read: the commit of where the query is goes out before Spark goes on,
        once for these offsets. Spark ends an AvailableNow query at such an answer, and stops
        an idle one, by killing this process (``stop`` is not called): a commit still on its
        way then was never sent, and the group showed the last batch unfinished for good."""
        if self._commits is None or offsets == self._waited:
            return
        self._waited = dict(offsets)
        self._commits.wait_sent(offsets, COMMIT_TIMEOUT_S)

    def stop(self) -> None:
        if self._commits is not None:
            self._commits.close()
            self._commits = None
        self._cluster = None


# --------------------------------------------------------------------------------------------
# Writers


@dataclass(frozen=True, slots=True)
class WriterOptions:
    bootstrap_servers: str
    topic: str | None
    client_config: tuple[tuple[str, str], ...]


_WRITER_COLUMNS: dict[str, tuple[type[DataType], ...]] = {
    "key": (BinaryType, StringType),
    "value": (BinaryType, StringType),
    "topic": (StringType,),
    "partition": (IntegerType,),
    "headers": (ArrayType,),
}


def parse_writer_options(options: Mapping[str, str], schema: StructType) -> WriterOptions:
    """Spark's Kafka sink's rules (``KafkaWriter.validateQuery``): a ``value`` column of
    string or binary; optional ``key``, ``topic``, ``partition`` and ``headers``; the
    ``topic`` option, when given, overrides the column."""
    lowered = {k.lower(): v for k, v in options.items()}
    bootstrap = lowered.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' must be given")
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise OptionError("the rows to write need a 'value' column")
    for name, allowed in _WRITER_COLUMNS.items():
        if name in fields and not isinstance(fields[name], allowed):
            raise OptionError(f"column {name!r} has type {fields[name].simpleString()}")
    topic = lowered.get("topic")
    if topic is None and "topic" not in fields:
        raise OptionError("give the 'topic' option or a 'topic' column")
    client = tuple(
        sorted(
            (k[len("kafka.") :], v)
            for k, v in options.items()
            if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"
        )
    )
    return WriterOptions(bootstrap, topic, client)


@dataclass(frozen=True, slots=True)
class WriteCount(WriterCommitMessage):
    records: int


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def write_rows(options: WriterOptions, rows: Iterator[Row]) -> WriteCount:
    config: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap_servers,
        "linger.ms": 5,
        # Spark's Kafka sink writes with the Java producer, whose keyed records go by murmur2;
        # librdkafka's default (CRC32) put a key on another partition than it would.
        "partitioner": "murmur2_random",
    }
    config.update(dict(options.client_config))
    # Never weaker than these, whatever kafka.* said: the sink promises acknowledged writes
    # without duplicates from producer retries (KIP-98 idempotence).
    config.update({"acks": "all", "enable.idempotence": True})
    producer = Producer(config)
    errors: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    count = 0
    for row in rows:
        fields = row.asDict()
        topic = options.topic or fields.get("topic")
        if not topic:
            raise ValueError(f"a row has no topic: {fields!r}")
        kwargs: dict[str, Any] = {
            "key": _as_bytes(fields.get("key")),
            "value": _as_bytes(fields.get("value")),
            "on_delivery": delivered,
        }
        if fields.get("partition") is not None:
            kwargs["partition"] = int(fields["partition"])
        if fields.get("headers"):
            kwargs["headers"] = [(h["key"], _as_bytes(h["value"])) for h in fields["headers"]]
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain
        count += 1
        producer.poll(0)
        if errors:
            break
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors or remaining:
        raise KafkaException(
            f"{len(errors)} records failed, {remaining} unacknowledged: {errors[:3]}"
        )
    return WriteCount(count)


class KcoordBatchWriter(DataSourceWriter):
    def __init__(self, options: WriterOptions):
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return write_rows(self.options, iterator)


class KcoordStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriterOptions):
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return write_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Every task has flushed with acks=all before returning its message.
        return

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Records a task did write stay written (at-least-once, as Spark's Kafka sink).
        return


class KcoordDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA_WITH_HEADERS if parse_include_headers(self.options) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        self._raise_if_not_own(schema)
        return KcoordBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._raise_if_not_own(schema)
        return KcoordStreamReader(parse_source_options(self.options, streaming=True))

    def _raise_if_not_own(self, schema: StructType) -> None:
        """A schema given with ``.schema(...)`` that is not the rows' (Spark's Kafka source
        refuses any: its schema is fixed): the batches have the columns ``includeHeaders``
        says, and one more or less failed deep in an executor."""
        if schema != self.schema():
            raise OptionError(
                "the kcoord source has a fixed schema and cannot be set with a custom one "
                f"({self.schema().simpleString()}; headers come with includeHeaders=true)"
            )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            # KafkaSourceProvider.createRelation: a topic cannot be overwritten.
            raise OptionError(
                "save mode overwrite is not allowed for kcoord: append to the topic instead"
            )
        return KcoordBatchWriter(parse_writer_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KcoordStreamWriter(parse_writer_options(self.options, schema))
