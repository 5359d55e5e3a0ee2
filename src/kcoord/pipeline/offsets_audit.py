"""``kcoord pipeline run offsets-audit``: a batch job over ``__consumer_offsets``.

Reads the whole topic through the ``kcoord`` source (one Spark task per offsets partition
with records), decodes each record with Kafka's schemas
(``kcoord.cluster.coordinator.records.decode_record``) in a ``mapInArrow`` and keeps the
OffsetCommit records and their tombstones (group metadata and record types this build does
not know are skipped); a tombstone deletes its key's earlier commits. The driver then asks
the cluster for the log end offsets the rules need (ListOffsets by timestamp for each
sample's commit time, and the high watermarks now) and evaluates ``kcoord.pipeline.audit``'s
rules.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as ClientTopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from kcoord.cluster.coordinator.records import (
    CoordinatorRecordError,
    OffsetCommitKey,
    OffsetCommitValue,
    UnknownRecordTypeError,
    decode_record,
)
from kcoord.pipeline.audit import (
    DEFAULT_MAX_SAMPLES,
    Commit,
    Deleted,
    GroupReport,
    build_report,
    latest_commits,
    without_deleted,
)
from kcoord.pipeline.retries import is_gone, retrying

OFFSETS_TOPIC = "__consumer_offsets"
LIST_OFFSETS_TIMEOUT_S = 30.0

COMMIT_SCHEMA = StructType(
    [
        StructField("group", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("commit_timestamp_ms", LongType()),
        StructField("log_partition", IntegerType()),
        StructField("log_offset", LongType()),
    ]
)
_ARROW_COMMIT = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("commit_timestamp_ms", pa.int64()),
        pa.field("log_partition", pa.int32()),
        pa.field("log_offset", pa.int64()),
    ]
)


def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: ``__consumer_offsets`` rows in, OffsetCommit records out, and their
    tombstones (an offset deleted or expired) with a null offset."""
    for batch in batches:
        out: list[dict[str, Any]] = []
        for row in batch.select(["key", "value", "partition", "offset"]).to_pylist():
            if row["key"] is None:
                continue
            try:
                record = decode_record(row["key"], row["value"])
            except UnknownRecordTypeError:
                continue  # a record type this build does not know, skipped as Kafka's loader
            except CoordinatorRecordError as e:
                # A record of a known type that does not decode fails the audit, as it fails
                # a coordinator's load of its partition: skipped, a corrupt commit went
                # unseen by an audit of commits.
                raise CoordinatorRecordError(
                    f"{OFFSETS_TOPIC}-{row['partition']} offset {row['offset']}: {e}"
                ) from e
            key, value = record.key, record.value
            if not isinstance(key, OffsetCommitKey):
                continue
            if value is not None and not isinstance(value, OffsetCommitValue):
                continue
            out.append(
                {
                    "group": key.group_id,
                    "topic": key.topic,
                    "partition": key.partition,
                    "offset": None if value is None else value.offset,
                    "commit_timestamp_ms": None if value is None else value.commit_timestamp_ms,
                    "log_partition": row["partition"],
                    "log_offset": row["offset"],
                }
            )
        yield pa.RecordBatch.from_pylist(out, schema=_ARROW_COMMIT)


def read_commits(spark: SparkSession, bootstrap_servers: str) -> list[Commit]:
    rows = (
        spark.read.format("kcoord")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", OFFSETS_TOPIC)
        .load()
        .select("key", "value", "partition", "offset")
        .mapInArrow(decode_batches, COMMIT_SCHEMA)
        .collect()
    )
    records: list[Commit | Deleted] = []
    for row in rows:
        fields = row.asDict()
        if fields["offset"] is None:
            del fields["offset"], fields["commit_timestamp_ms"]
            records.append(Deleted(**fields))
        else:
            records.append(Commit(**fields))
    # A deleted group's or offset's commits stay in the log until compaction: without the
    # tombstones, a group deleted with lag was reported as stopped for good.
    return without_deleted(records)


def end_offsets(
    bootstrap_servers: str, commits: list[Commit], max_samples: int
) -> tuple[dict[tuple[str, int, int], int], dict[tuple[str, int], int]]:
    """(log end offset at each kept commit's time, high watermark now) per partition. The end
    offset at a time is the first offset with a timestamp at or after it (ListOffsets by
    timestamp), or the high watermark if no record is that recent."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "kcoord-offsets-audit",
            "enable.auto.commit": False,
            "log_level": 4,
        }
    )
    try:
        windows = latest_commits(commits, max_samples)
        now: dict[tuple[str, int], int] = {}
        for _, topic, partition in windows:
            if (topic, partition) in now:
                continue
            ask_end = functools.partial(
                consumer.get_watermark_offsets,
                ClientTopicPartition(topic, partition),
                timeout=LIST_OFFSETS_TIMEOUT_S,
                cached=False,
            )
            try:
                _, high = retrying(
                    ask_end,
                    f"end offset of {topic}-{partition}",
                    LIST_OFFSETS_TIMEOUT_S,
                )
            except KafkaException as e:
                # The topic is gone: its lags are unknown. Anything else (a timeout, a leader
                # that never came) fails the audit: read as unknown, a group that stopped an
                # hour ago was reported OK.
                if not is_gone(e):
                    raise
                continue
            now[(topic, partition)] = high
        at: dict[tuple[str, int, int], int] = {}
        for (_, topic, partition), items in windows.items():
            if (topic, partition) not in now:
                continue
            wanted = [c.commit_timestamp_ms for c in items]
            for ts in wanted:
                if (topic, partition, ts) in at:
                    continue
                ask_at = functools.partial(
                    consumer.offsets_for_times,
                    [ClientTopicPartition(topic, partition, ts)],
                    timeout=LIST_OFFSETS_TIMEOUT_S,
                )
                (found,) = retrying(
                    ask_at,
                    f"offset of {topic}-{partition} at {ts}",
                    LIST_OFFSETS_TIMEOUT_S,
                )
                if found.error is not None:
                    raise KafkaException(found.error)
                at[(topic, partition, ts)] = (
                    now[(topic, partition)] if found.offset < 0 else found.offset
                )
        return at, now
    finally:
        consumer.close()


def run_audit(
    spark: SparkSession,
    bootstrap_servers: str,
    *,
    now_ms: int,
    window_ms: int,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> list[GroupReport]:
    commits = read_commits(spark, bootstrap_servers)
    at, now = end_offsets(bootstrap_servers, commits, max_samples)
    return build_report(
        commits,
        end_offsets_at=at,
        end_offsets_now=now,
        now_ms=now_ms,
        window_ms=window_ms,
        max_samples=max_samples,
    )
