"""Spark pipeline benchmark: ``make bench-pipeline``.

On a 3-node local cluster (``kcoord.node.launcher.up`` on loopback ports found free at run
time) and one SparkSession with ``local[2]`` (``kcoord.pipeline.session``):

(a) **batch source -> noop**: ``--records`` records of ``--value-bytes`` bytes on a topic of
    ``--partitions`` partitions (RF 3), read with ``spark.read.format("kcoord")`` and written to
    Spark's ``noop`` sink; one input partition per topic partition. ``--rounds`` rounds; the
    first one also starts Spark's Python workers and is reported apart (``warmup_s``).
(b) **streaming source -> noop**: the same topic through ``readStream`` with
    ``Trigger.AvailableNow`` (a new checkpoint each round), committing to a group, to the
    ``noop`` sink: planning, reading and the OffsetCommit of each micro-batch.
(c) **payments job**: ``--payments`` JSON payment events (5% malformed) produced at full speed,
    then both queries of ``kcoord pipeline run payments-totals`` with ``Trigger.AvailableNow``
    (totals to a topic and Parquet, malformed events to the DLQ), one round. Records/s is
    events / wall time from the start of the queries to the end of the last one.

Records/s is the median of the rounds. The machine is shared and Spark's start-up dominates
small runs, so figures vary by run; the JSON keeps every sample. Prints a table and writes
``bench/results/pipeline.json``. The cluster is stopped at the end, on failure too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kcoord.node import launcher
from kcoord.pipeline.generate import generate
from kcoord.pipeline.payments import PaymentsConfig, run_available_now
from kcoord.pipeline.session import build_session

NODES = 3
TOPIC = "bench"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--payments", type=int, default=50_000)
    parser.add_argument("--base-port", type=int, default=0, help="0: pick a free block")
    parser.add_argument("--out", type=Path, default=Path("bench/results/pipeline.json"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


def free_base_port() -> int:
    import random
    import socket

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10_000, 32_768 - 10 * NODES)  # below the ephemeral range
        try:
            for port in (base + 10 * i + k for i in range(NODES) for k in range(4)):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of loopback ports found")


def rows_read(query: Any) -> int:
    """The rows a finished streaming query read, from its progress reports."""
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


def require_rows(what: str, read: int, expected: int) -> None:
    if read != expected:
        raise RuntimeError(f"{what} read {read} records, {expected} were produced")


def produce(bootstrap: str, records: int, value_bytes: int) -> float:
    """Produce the topic's records; returns records/s (acks=all, idempotent)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 512 * 1024,
            "log_level": 4,
        }
    )
    value = b"x" * value_bytes
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, key=str(i % 1000).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("unacknowledged records")
    return records / (time.perf_counter() - started)


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work_dir = Path(tempfile.mkdtemp(prefix="kcoord-bench-pipeline-"))
    state = launcher.up(work_dir / "cluster", NODES, args.base_port or free_base_port())
    bootstrap = state.bootstrap_servers
    samples: dict[str, list[float]] = {"batch_s": [], "stream_s": [], "payments_s": []}
    succeeded = False
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [NewTopic(TOPIC, args.partitions, 3)] + [
            NewTopic(t, args.partitions, 3) for t in ("payments", "payments-totals", "payments-dlq")
        ]
        for future in admin.create_topics(topics).values():
            future.result(timeout=60)
        produce_rate = produce(bootstrap, args.records, args.value_bytes)
        print(f"produced {args.records} records at {produce_rate:,.0f} records/s", flush=True)

        spark_started = time.perf_counter()
        spark = build_session("kcoord-bench-pipeline")
        spark_start_s = time.perf_counter() - spark_started

        def batch() -> None:
            (
                spark.read.format("kcoord")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", TOPIC)
                .load()
                .write.format("noop")
                .mode("overwrite")
                .save()
            )

        def stream(round_no: int) -> None:
            query = (
                spark.readStream.format("kcoord")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .option("groupId", f"bench-stream-{round_no}")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(work_dir / f"stream-{round_no}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            require_rows(f"stream round {round_no}", rows_read(query), args.records)

        warmup_s = timed(batch)
        # What the timed batch reads, counted once outside the clock: the figure divides the
        # records produced by the time, so a source that read fewer would look faster.
        counted = (
            spark.read.format("kcoord")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", TOPIC)
            .load()
            .count()
        )
        require_rows("batch read", counted, args.records)
        for _ in range(args.rounds):
            samples["batch_s"].append(timed(batch))
        for i in range(args.rounds):
            samples["stream_s"].append(timed(lambda i=i: stream(i)))

        generated = generate(
            bootstrap,
            "payments",
            rate=1_000_000,
            duration_s=args.payments / 1_000_000,
            accounts=100,
            malformed_ratio=0.05,
            seed=1,
        )
        config = PaymentsConfig(
            bootstrap_servers=bootstrap,
            checkpoint=work_dir / "payments-ck",
            output=work_dir / "payments-out",
        )

        def payments() -> None:
            for query in run_available_now(spark, config):
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                # Each of the job's queries reads the whole payments topic.
                require_rows(f"payments query {query.name}", rows_read(query), generated.produced)

        samples["payments_s"].append(timed(payments))
        spark.stop()
        succeeded = True
    finally:
        launcher.down(state, kill=True)
        if succeeded and not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            print(f"work directory kept: {work_dir}", file=sys.stderr)

    figures = {
        "batch_source_to_noop_records_per_s": args.records / statistics.median(samples["batch_s"]),
        "streaming_source_to_noop_records_per_s": args.records
        / statistics.median(samples["stream_s"]),
        "payments_job_records_per_s": generated.produced / statistics.median(samples["payments_s"]),
    }
    print(f"\n{'figure':<42} {'records/s':>12}")
    for name, value in figures.items():
        print(f"{name:<42} {value:>12,.0f}")
    print(f"(spark session start {spark_start_s:.1f} s, first batch read {warmup_s:.1f} s)")
    result = {
        "benchmark": "pipeline",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {
            "master": "local[2]",
            "records": args.records,
            "value_bytes": args.value_bytes,
            "partitions": args.partitions,
            "rounds": args.rounds,
            "payments": generated.produced,
            "payments_malformed": generated.malformed,
        },
        "figures": {k: round(v) for k, v in figures.items()},
        "produce_records_per_s": round(produce_rate),
        "spark_session_start_s": round(spark_start_s, 2),
        "warmup_s": round(warmup_s, 2),
        "samples": {k: [round(x, 3) for x in v] for k, v in samples.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
