"""Real clients against a leader whose HW lags the start of its epoch (see
``test_list_offsets_of_a_new_leader_whose_hw_lags_its_epoch``).

Each client seeks to the end of the partition while the node refuses "latest" (aiokafka asks
ListOffsets v4 and gets LEADER_NOT_AVAILABLE, kafka-python and librdkafka newer versions and
OFFSET_NOT_AVAILABLE); it must retry, not fail and not settle on the older HW. Once the leader
has caught up, a new record is produced: the client's first record must be that one, at
offset 2. Had it taken HW 0 for "latest", it would read a and b first.

librdkafka's admin ``list_offsets`` does not retry: the Spark source's planning
(``pipeline.source.Cluster``) asks again itself (``pipeline.retries``), and is checked here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiokafka
import confluent_kafka
import kafka
import pytest

from kcoord.errors import Errors
from kcoord.node.kafka import fetch
from kcoord.node.replica_manager import KafkaError, Partition
from kcoord.pipeline.options import parse_source_options
from kcoord.pipeline.source import Cluster
from tests.unit.node.kafka.harness import HOST, Harness, running
from tests.unit.node.kafka.test_handlers import (
    PRODUCE,
    TEST_TIMEOUT_S,
    batch,
    catch_up_alone,
    lead_with_a_lagging_hw,
    only_partition,
    produce_values,
)
from tests.unit.node.kafka.wire import AsyncWireClient

CLIENT_DEADLINE_S = 15.0
LAGGING_ERRORS = (Errors.OFFSET_NOT_AVAILABLE, Errors.LEADER_NOT_AVAILABLE)
# aiokafka 0.14 speaks ListOffsets up to v4, below OFFSET_NOT_AVAILABLE's v5.
EXPECTED_REFUSAL = {
    "aiokafka": Errors.LEADER_NOT_AVAILABLE,
    "kafka-python": Errors.OFFSET_NOT_AVAILABLE,
    "confluent-kafka": Errors.OFFSET_NOT_AVAILABLE,
}


class ListOffsetsLog:
    """What the node answered each "latest" ListOffsets: an error code or an offset."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.refused: list[Errors] = []
        self.answered: list[int] = []
        offset_for = fetch._offset_for

        def recording(
            part: Partition,
            timestamp: int,
            lagging_error: Errors | None = None,
            *,
            client: bool = True,
        ) -> Any:
            try:
                found = offset_for(part, timestamp, lagging_error, client=client)
            except KafkaError as e:
                if e.code in LAGGING_ERRORS:
                    self.refused.append(e.code)
                raise
            if timestamp == fetch.LATEST_TIMESTAMP:
                self.answered.append(found[1])
            return found

        monkeypatch.setattr(fetch, "_offset_for", recording)

    async def wait(self, what: Callable[[], bool], reader: asyncio.Future[Any]) -> None:
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        while not what():
            if reader.done():
                reader.result()  # raises what the client raised
                raise AssertionError("the client finished before it read a record")
            assert time.monotonic() < deadline, (self.refused, self.answered)
            await asyncio.sleep(0.02)


def first_record_kafka_python(bootstrap: str, topic: str, partition: int) -> tuple[int, bytes]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                return records[0].offset, records[0].value
        raise AssertionError("kafka-python read nothing")
    finally:
        consumer.close()


def first_record_confluent(bootstrap: str, topic: str, partition: int) -> tuple[int, bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "lagging-leader",  # required; never joined (assign only)
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, partition, confluent_kafka.OFFSET_END)]
        )
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            offset, value = message.offset(), message.value()
            assert offset is not None and value is not None
            return offset, value
        raise AssertionError("confluent-kafka read nothing")
    finally:
        consumer.close()


async def first_record_aiokafka(bootstrap: str, topic: str, partition: int) -> tuple[int, bytes]:
    consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = aiokafka.TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        record = await asyncio.wait_for(consumer.getone(), CLIENT_DEADLINE_S)
        assert record.value is not None
        return record.offset, record.value
    finally:
        await consumer.stop()


THREADED: dict[str, Callable[[str, str, int], tuple[int, bytes]]] = {
    "kafka-python": first_record_kafka_python,
    "confluent-kafka": first_record_confluent,
}


@contextlib.asynccontextmanager
async def lagging_leader(
    tmp_path: Path,
) -> AsyncIterator[tuple[Harness, AsyncWireClient, Partition]]:
    """The in-process node, reachable by real clients, leading topic "t" with its HW lagging
    the start of its epoch (``lead_with_a_lagging_hw``), and a wire client to it."""
    async with asyncio.timeout(TEST_TIMEOUT_S), running(tmp_path) as h:
        h.advertise_listener()
        c = await h.client()
        try:
            yield h, c, await lead_with_a_lagging_hw(h, c, "t")
        finally:
            await c.close()


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python", "confluent-kafka"])
def test_a_client_seeking_to_the_end_waits_for_the_leader_to_catch_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    asked = ListOffsetsLog(monkeypatch)

    async def main() -> None:
        async with lagging_leader(tmp_path) as (h, c, part):
            bootstrap = f"{HOST}:{h.port}"
            if client == "aiokafka":
                reader = asyncio.ensure_future(
                    first_record_aiokafka(bootstrap, "t", part.partition)
                )
            else:
                reader = asyncio.ensure_future(
                    asyncio.to_thread(THREADED[client], bootstrap, "t", part.partition)
                )
            await asked.wait(lambda: bool(asked.refused), reader)
            assert asked.answered == [], asked.answered
            assert set(asked.refused) == {EXPECTED_REFUSAL[client]}
            catch_up_alone(h, part)
            # The client's retry gets the new end; only then does a record follow it.
            await asked.wait(lambda: bool(asked.answered), reader)
            assert asked.answered == [2]
            values = produce_values("t", part.partition, batch([b"c"]), acks=1)
            produced = only_partition(await c.call(PRODUCE, 9, values))
            assert (produced.error_code, produced.base_offset) == (Errors.NONE, 2)
            assert await reader == (2, b"c")

    asyncio.run(main())


def test_the_spark_source_plans_from_the_caught_up_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's driver asks the partitions' offsets through librdkafka's admin client,
    which hands OFFSET_NOT_AVAILABLE straight back: the source asks again until the leader
    has caught up, and plans up to the new end, 2."""
    asked = ListOffsetsLog(monkeypatch)

    async def main() -> None:
        async with lagging_leader(tmp_path) as (h, _, part):
            options = parse_source_options(
                {"kafka.bootstrap.servers": f"{HOST}:{h.port}", "subscribe": "t"},
                streaming=False,
            )
            tp = ("t", part.partition)
            planned = asyncio.ensure_future(
                asyncio.to_thread(lambda: Cluster(options).offsets([tp]))
            )
            await asked.wait(lambda: bool(asked.refused), planned)
            assert set(asked.refused) == {Errors.OFFSET_NOT_AVAILABLE}
            catch_up_alone(h, part)
            earliest, latest = await planned
            assert (earliest, latest) == ({tp: 0}, {tp: 2})

    asyncio.run(main())
