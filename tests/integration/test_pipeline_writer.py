"""The ``kcoord`` sink's producer against a real node, without Spark: a keyed record lands on
the partition Spark's Kafka sink (the Java producer: murmur2 of the key) would give it."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.partitioner.default import murmur2
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from kcoord.pipeline.source import parse_writer_options, write_rows
from tests.integration.cluster import DEADLINE_S, LocalCluster

pytestmark = pytest.mark.integration

PARTITIONS = 6
RECORDS = 300


def test_keyed_records_land_where_the_java_producer_puts_them(tmp_path: Path) -> None:
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    rng = random.Random(seed)
    keys = [f"k-{rng.randrange(10**9)}".encode() for _ in range(RECORDS)]
    with LocalCluster(tmp_path, nodes=1) as cluster:
        assert cluster.state is not None
        bootstrap = cluster.state.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics([NewTopic("keyed", PARTITIONS, 1)])
        finally:
            admin.close()
        schema = StructType([StructField("key", BinaryType()), StructField("value", StringType())])
        options = parse_writer_options(
            {"kafka.bootstrap.servers": bootstrap, "topic": "keyed"}, schema
        )
        written = write_rows(options, iter(Row(key=k, value=str(i)) for i, k in enumerate(keys)))
        assert written.records == RECORDS
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000
        )
        try:
            consumer.assign([TopicPartition("keyed", p) for p in range(PARTITIONS)])
            consumer.seek_to_beginning()
            landed: dict[bytes, int] = {}
            end = time.monotonic() + DEADLINE_S
            while len(landed) < len(set(keys)) and time.monotonic() < end:
                for batch in consumer.poll(timeout_ms=1000).values():
                    for record in batch:
                        landed[record.key] = record.partition
        finally:
            consumer.close()
    expected = {k: (murmur2(k) & 0x7FFFFFFF) % PARTITIONS for k in keys}
    assert landed == expected
    assert len(set(landed.values())) > 1  # the keys did spread: the check compared something
