"""``kcoord pipeline run payments-totals``: payment totals per account and event-time window.

Two structured streaming queries over the ``payments`` topic, each with its checkpoint under
``--checkpoint`` (``totals/`` and ``dlq/``) and its consumer group:

- **totals** (group ``payments-totals``): parse and validate each event
  (``events.parse_payment``, in a ``mapInArrow``), keep the valid ones, and aggregate per
  account, currency and tumbling event-time window (``--window``), with a watermark of
  ``--watermark`` on the event time (events later than that are dropped by Spark). The output
  mode is *update*: each micro-batch emits the windows it changed, with their running totals,
  and ``foreachBatch`` writes them to the ``payments-totals`` topic (key
  ``account|currency|window start``, a JSON value with the batch id) and to Parquet under
  ``--output/batch_id=N/``. A batch re-run after a crash overwrites its Parquet directory and
  re-sends the same records, so the current total of a window is its row (or record) with the
  highest batch id.
- **dlq** (group ``payments-totals-dlq``): the malformed events, value and key unchanged, to the
  ``payments-dlq`` topic with the reason in the ``dlq.reason`` header (and where they came
  from in ``dlq.topic``, ``dlq.partition``, ``dlq.offset``). Never dropped silently.

Both read the topic through the ``kcoord`` source, so a restart from the same checkpoint
resumes where each query's last finished batch ended.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter
from pyspark.sql.types import (
    BinaryType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kcoord.pipeline.events import (
    AMOUNT_PRECISION,
    AMOUNT_SCALE,
    TOTAL_PRECISION,
    Payment,
    parse_payment,
)

log = logging.getLogger(__name__)

TOTALS_GROUP = "payments-totals"
DLQ_GROUP = "payments-totals-dlq"
INITIAL_OFFSETS_FILE = "kcoord-initial-offsets.json"  # in each query's checkpoint

PARSED_SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("account", StringType()),
        StructField("amount", DecimalType(AMOUNT_PRECISION, AMOUNT_SCALE)),
        StructField("currency", StringType()),
        StructField("event_time", TimestampType()),
        StructField("reason", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
    ]
)
_ARROW_PARSED = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("account", pa.string()),
        pa.field("amount", pa.decimal128(AMOUNT_PRECISION, AMOUNT_SCALE)),
        pa.field("currency", pa.string()),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("reason", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
    ]
)


@dataclass(frozen=True, slots=True)
class PaymentsConfig:
    bootstrap_servers: str
    checkpoint: Path
    output: Path
    source_topic: str = "payments"
    totals_topic: str = "payments-totals"
    dlq_topic: str = "payments-dlq"
    window: str = "1 minute"
    watermark: str = "10 minutes"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    trigger_interval: str = "2 seconds"


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: source rows in, one parsed row per event out (``reason`` set for
    a malformed one)."""
    for batch in batches:
        columns: dict[str, list[object]] = {f.name: [] for f in _ARROW_PARSED}
        # The records' own timestamps (microseconds), against which event times are checked.
        record_us = batch.column("timestamp").cast(pa.int64()).to_pylist()
        rows = batch.select(["key", "value", "topic", "partition", "offset"]).to_pylist()
        for row, at_us in zip(rows, record_us, strict=True):
            parsed = parse_payment(row["value"], None if at_us is None else at_us // 1000)
            payment = parsed if isinstance(parsed, Payment) else None
            columns["id"].append(payment.id if payment else None)
            columns["account"].append(payment.account if payment else None)
            columns["amount"].append(payment.amount if payment else None)
            columns["currency"].append(payment.currency if payment else None)
            columns["event_time"].append(payment.timestamp_ms * 1000 if payment else None)
            columns["reason"].append(None if payment else parsed)
            for name in ("key", "value", "topic", "partition", "offset"):
                columns[name].append(row[name])
        yield pa.RecordBatch.from_arrays(
            [pa.array(columns[f.name], f.type) for f in _ARROW_PARSED], schema=_ARROW_PARSED
        )


def _source(
    spark: SparkSession, config: PaymentsConfig, group_id: str, checkpoint: Path
) -> DataFrame:
    reader = (
        spark.readStream.format("kcoord")
        .option("kafka.bootstrap.servers", config.bootstrap_servers)
        .option("subscribe", config.source_topic)
        .option("startingOffsets", config.starting_offsets)
        .option("groupId", group_id)
        # In the query's checkpoint: a restart before its first batch finished starts where
        # that batch did (see KcoordStreamReader.initialOffset).
        .option("initialOffsetsPath", str(checkpoint / INITIAL_OFFSETS_FILE))
    )
    if config.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    return reader.load().mapInArrow(parse_batches, PARSED_SCHEMA)


def totals_frame(parsed: DataFrame, config: PaymentsConfig) -> DataFrame:
    return (
        parsed.where(sf.col("reason").isNull())
        .withWatermark("event_time", config.watermark)
        .groupBy(sf.col("account"), sf.col("currency"), sf.window("event_time", config.window))
        .agg(sf.sum("amount").alias("total"), sf.count(sf.lit(1)).alias("payments"))
        .select(
            "account",
            "currency",
            sf.col("window.start").alias("window_start"),
            sf.col("window.end").alias("window_end"),
            sf.unix_millis(sf.col("window.start")).alias("window_start_ms"),
            sf.col("total").cast(DecimalType(TOTAL_PRECISION, AMOUNT_SCALE)).alias("total"),
            "payments",
        )
    )


def _header(name: str, value: Column) -> Column:
    return sf.struct(sf.lit(name).alias("key"), value.cast("binary").alias("value"))


def dlq_frame(parsed: DataFrame) -> DataFrame:
    return parsed.where(sf.col("reason").isNotNull()).select(
        "key",
        "value",
        sf.array(
            _header("dlq.reason", sf.col("reason")),
            _header("dlq.topic", sf.col("topic")),
            _header("dlq.partition", sf.col("partition").cast("string")),
            _header("dlq.offset", sf.col("offset").cast("string")),
        ).alias("headers"),
    )


def _write_totals(config: PaymentsConfig, batch: DataFrame, batch_id: int) -> None:
    batch.persist()
    try:
        if batch.isEmpty():
            return
        window_start = sf.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
        (
            batch.select(
                # One record per (account, currency, window): an account paying in two
                # currencies in one window had two totals under one key.
                sf.concat_ws("|", "account", "currency", window_start).alias("key"),
                sf.to_json(
                    sf.struct(
                        "account",
                        "currency",
                        window_start.alias("window_start"),
                        sf.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias(
                            "window_end"
                        ),
                        sf.col("total").cast("string").alias("total"),
                        "payments",
                        sf.lit(batch_id).alias("batch_id"),
                    )
                ).alias("value"),
            )
            .write.format("kcoord")
            .option("kafka.bootstrap.servers", config.bootstrap_servers)
            .option("topic", config.totals_topic)
            .mode("append")
            .save()
        )
        batch.coalesce(1).write.mode("overwrite").parquet(
            str(config.output / f"batch_id={batch_id}")
        )
    finally:
        batch.unpersist()


def _writers(
    spark: SparkSession, config: PaymentsConfig, *, available_now: bool
) -> list[DataStreamWriter]:
    def trigger(writer: DataStreamWriter) -> DataStreamWriter:
        if available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=config.trigger_interval)

    totals_checkpoint, dlq_checkpoint = config.checkpoint / "totals", config.checkpoint / "dlq"
    totals_writer = (
        totals_frame(_source(spark, config, TOTALS_GROUP, totals_checkpoint), config)
        .writeStream.queryName("payments-totals")
        .outputMode("update")
        .option("checkpointLocation", str(totals_checkpoint))
        .foreachBatch(lambda df, batch_id: _write_totals(config, df, batch_id))
    )
    dlq_writer = (
        dlq_frame(_source(spark, config, DLQ_GROUP, dlq_checkpoint))
        .writeStream.queryName("payments-dlq")
        .format("kcoord")
        .option("kafka.bootstrap.servers", config.bootstrap_servers)
        .option("topic", config.dlq_topic)
        .option("checkpointLocation", str(dlq_checkpoint))
    )
    return [trigger(totals_writer), trigger(dlq_writer)]


def start(spark: SparkSession, config: PaymentsConfig) -> list[StreamingQuery]:
    """Start both queries, continuous (``trigger_interval``); the caller waits for them
    (``awaitTermination``) or stops them."""
    return [writer.start() for writer in _writers(spark, config, available_now=False)]


# A wait for queries is made of waits of a second (Spark's timeouts are whole seconds), so
# that a stop asked for by a signal is seen: the signal's handler may not call into Spark
# itself, as the main thread is in the middle of such a call ("reentrant call" from py4j's
# socket, then a traceback each).
WAIT_STEP_S = 1


def wait_in_steps(
    wait: Callable[[int], bool | None], timeout_s: int | None, stop: threading.Event
) -> bool:
    """Wait with ``wait(seconds)`` (a query's ``awaitTermination``, the session's
    ``awaitAnyTermination``) a step at a time, ``timeout_s`` seconds at most (None: no
    limit), until ``stop`` is set; True if what it waited for ended."""
    steps = itertools.count() if timeout_s is None else range(0, timeout_s, WAIT_STEP_S)
    for _ in steps:
        if stop.is_set():
            return False
        if wait(WAIT_STEP_S):
            return True
    return False


def run_available_now(
    spark: SparkSession,
    config: PaymentsConfig,
    timeout_s: int | None = None,
    stop: threading.Event | None = None,
) -> list[StreamingQuery]:
    """Process what the topic holds now (``availableNow``), one query after the other, and
    return the queries that ran; it stops at the first that fails (``exception()``) or does
    not finish within ``timeout_s`` (``isActive``), or once ``stop`` is set.

    Not both at once: two queries starting together in one local session, both restoring
    from their checkpoints, now and then failed to deserialize a task
    (``java.io.OptionalDataException`` in a ``HashMap``, PySpark 4.0, ``local[2]``), which
    ended the restarted payments job of the kill-and-restart test in one run out of four.
    """
    from pyspark.errors import StreamingQueryException

    stop = stop or threading.Event()
    queries: list[StreamingQuery] = []
    for writer in _writers(spark, config, available_now=True):
        query = writer.start()
        queries.append(query)
        try:
            finished = wait_in_steps(query.awaitTermination, timeout_s or None, stop)
        except StreamingQueryException:
            break  # query.exception() tells the caller
        if not finished:
            break
    return queries


def current_totals(
    spark: SparkSession, output: Path
) -> dict[tuple[str, str, int], tuple[Decimal, int]]:
    """The Parquet output's current totals: per (account, currency, window start ms), the row
    of the highest batch id."""
    rows = spark.read.parquet(str(output)).collect()
    latest: dict[tuple[str, str, int], tuple[int, Decimal, int]] = {}
    for row in rows:
        key = (row.account, row.currency, row.window_start_ms)
        if key not in latest or row.batch_id > latest[key][0]:
            latest[key] = (row.batch_id, row.total, row.payments)
    return {key: (total, payments) for key, (_, total, payments) in latest.items()}
