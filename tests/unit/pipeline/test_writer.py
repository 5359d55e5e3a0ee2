"""The ``kcoord`` sink: what Spark's Kafka sink allows and how its records are produced."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from kcoord.pipeline import source as source_module
from kcoord.pipeline.options import OptionError
from kcoord.pipeline.source import KcoordDataSource, parse_writer_options


def test_a_batch_write_may_not_overwrite_a_topic() -> None:
    """Spark's Kafka sink allows Append and ErrorIfExists only (``createRelation``): the
    writer appended whatever the mode said."""
    source = KcoordDataSource({"kafka.bootstrap.servers": "h:1", "topic": "t"})
    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(OptionError, match="overwrite is not allowed"):
        source.writer(schema, overwrite=True)
    assert source.writer(schema, overwrite=False) is not None


@pytest.mark.parametrize("chosen", [None, "consistent_random"])
def test_keyed_records_are_partitioned_as_the_java_producer_does(
    monkeypatch: pytest.MonkeyPatch, chosen: str | None
) -> None:
    """Spark's Kafka sink writes with the Java producer (murmur2 on the key); librdkafka's
    default, CRC32, put a key on another partition. kafka.partitioner still decides."""
    configs: list[dict[str, Any]] = []

    class Recording:
        def __init__(self, config: dict[str, Any]) -> None:
            configs.append(config)

        def flush(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(source_module, "Producer", Recording)
    options = {"kafka.bootstrap.servers": "h:1", "topic": "t"}
    if chosen is not None:
        options["kafka.partitioner"] = chosen
    schema = StructType([StructField("value", BinaryType())])
    source_module.write_rows(parse_writer_options(options, schema), iter([]))
    assert configs[0]["partitioner"] == (chosen or "murmur2_random")
