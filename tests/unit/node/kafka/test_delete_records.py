"""DeleteRecords on the wire against the harness node: the log start offset moves, the answer
waits for the followers' log starts (the low watermark), and Kafka's refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kcoord.errors import Errors
from kcoord.node.replica_manager import Partition
from kcoord.raft import records as rec
from kcoord.raft.controller import OFFSETS_TOPIC_NAME
from kcoord.storage import checkpoint
from tests.unit.node.kafka.harness import NODE_ID, Harness
from tests.unit.node.kafka.test_handlers import (
    FETCH,
    PRODUCE,
    batch,
    fetch_values,
    only_partition,
    produce_values,
    run,
)
from tests.unit.node.kafka.wire import AsyncWireClient

DELETE_RECORDS = 21


async def fetch_as_follower(h: Harness, part: Partition, replica: int, log_start: int) -> None:
    """A replica's fetch at the leader's log end, reporting ``log_start`` as its log start."""
    await h.replicas.handle_replica_fetch(
        {
            "replica_id": replica,
            "max_wait_ms": 0,
            "partitions": [
                {
                    "topic": part.topic,
                    "partition": part.partition,
                    "fetch_offset": part.log.log_end_offset,
                    "leader_epoch": part.leader_epoch,
                    "log_start_offset": log_start,
                }
            ],
        }
    )


async def three_records_followed_by_2_and_3(
    h: Harness, c: AsyncWireClient, topic: str
) -> Partition:
    """A partition this node leads, brokers 2 and 3 following, holding three records that both
    fetched (so the HW is 3) while reporting log start 0."""
    await h.create_topic(topic, 3, 3)
    mine = h.led_partitions(topic)[0]
    part = h.replicas.get_partition(topic, mine)
    assert part is not None
    await c.call(PRODUCE, 9, produce_values(topic, mine, batch([b"a", b"b", b"c"]), acks=1))
    for replica in (2, 3):
        await fetch_as_follower(h, part, replica, 0)
    return part


async def parked_delete(
    c: AsyncWireClient, part: Partition, offset: int, timeout_ms: int = 5000
) -> asyncio.Future[tuple[Errors, int]]:
    """A DeleteRecords sent and waiting at the node for the low watermark."""
    waiting = asyncio.ensure_future(delete(c, part.topic, part.partition, offset, timeout_ms))
    async with asyncio.timeout(5):
        while not part.low_watermark_waiters:
            await asyncio.sleep(0.001)  # until the request reached the node
    return waiting


def delete_values(topic: str, partition: int, offset: int, timeout_ms: int = 5000) -> Any:
    return {
        "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "offset": offset}]}
        ],
        "timeout": timeout_ms,
    }


async def delete(
    c: AsyncWireClient, topic: str, partition: int, offset: int, timeout_ms: int = 5000
) -> tuple[Errors, int]:
    response = await c.call(DELETE_RECORDS, 2, delete_values(topic, partition, offset, timeout_ms))
    (result,) = response.topics[0].partitions
    return Errors(result.error_code), int(result.low_watermark)


def test_delete_records_moves_the_log_start_and_refuses_what_kafka_refuses(
    tmp_path: Path,
) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        other = h.led_partitions("t", by=2)[0]
        for _ in range(3):
            await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"a", b"b"])))
        assert await delete(c, "t", mine, 7) == (Errors.OFFSET_OUT_OF_RANGE, -1)  # HW is 6
        assert await delete(c, "t", mine, -2) == (Errors.OFFSET_OUT_OF_RANGE, -1)
        assert await delete(c, "t", mine, 3) == (Errors.NONE, 3)
        # Written at once, so a crash does not bring the records back.
        path = h.replicas.logs.data_dir / checkpoint.LOG_START_OFFSET_CHECKPOINT
        assert checkpoint.read_offsets(path)[("t", mine)] == 3
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", mine, 0)))
        assert fetched.error_code == Errors.OFFSET_OUT_OF_RANGE
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", mine, 4)))
        assert (fetched.error_code, fetched.log_start_offset) == (Errors.NONE, 3)
        assert await delete(c, "t", mine, 1) == (Errors.NONE, 3)  # never moves back
        assert await delete(c, "t", mine, -1) == (Errors.NONE, 6)  # -1: the high watermark
        assert await delete(c, "t", other, 0) == (Errors.NOT_LEADER_OR_FOLLOWER, -1)
        assert await delete(c, "nope", 0, 0) == (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert await delete(c, OFFSETS_TOPIC_NAME, 0, 0) == (Errors.INVALID_TOPIC_EXCEPTION, -1)
        response = await c.call(
            44,  # IncrementalAlterConfigs: cleanup.policy=compact
            1,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": "t",
                        "configs": [
                            {"name": "cleanup.policy", "config_operation": 0, "value": "compact"}
                        ],
                    }
                ],
                "validate_only": False,
            },
        )
        assert response.responses[0].error_code == Errors.NONE
        assert await delete(c, "t", mine, 6) == (Errors.POLICY_VIOLATION, -1)

    run(tmp_path, test)


def test_the_answer_waits_for_the_followers_log_starts(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        part = await three_records_followed_by_2_and_3(h, c, "r")
        mine = part.partition
        assert part.high_watermark == 3
        # Follower 3 never reports a log start past 0: the wait times out.
        assert await delete(c, "r", mine, 2, timeout_ms=200) == (Errors.REQUEST_TIMED_OUT, -1)
        assert part.log.log_start_offset == 2  # the leader's moved all the same
        waiting = await parked_delete(c, part, 2)
        await fetch_as_follower(h, part, 2, 2)
        assert (h.replicas.low_watermark(part), len(part.low_watermark_waiters)) == (0, 1)
        await fetch_as_follower(h, part, 3, 2)
        assert await asyncio.wait_for(waiting, 5) == (Errors.NONE, 2)

    run(tmp_path, test)


def test_a_fenced_follower_no_longer_holds_the_answer_back(tmp_path: Path) -> None:
    """Follower 3 never reports the new log start; once it is fenced, the next fetch of the
    other follower completes the wait (Kafka's low watermark counts live replicas only)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part = await three_records_followed_by_2_and_3(h, c, "f")
        waiting = await parked_delete(c, part, 2, timeout_ms=10_000)
        await fetch_as_follower(h, part, 2, 2)
        assert not waiting.done()
        broker = h.cache.image.brokers[3]
        h.quorum.commit([rec.FenceBroker(broker_id=3, broker_epoch=broker.broker_epoch)])
        await fetch_as_follower(
            h, part, 2, 2
        )  # the same log start as before: only the fencing changed
        assert await asyncio.wait_for(waiting, 5) == (Errors.NONE, 2)

    run(tmp_path, test)


def test_a_follower_yet_to_fetch_from_a_new_leader_holds_the_answer_back(tmp_path: Path) -> None:
    """A node that leads again after another did knows none of the followers' log starts
    (Kafka's Replica.resetReplicaState on a new leader): one that has not fetched since holds
    the low watermark back, rather than the answer coming while its copy still starts at 0.
    Elected again while leading, it keeps what they reported."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part = await three_records_followed_by_2_and_3(h, c, "n")
        h.change_partition("n", part.partition, leader=NODE_ID)  # elected again
        assert part.is_leader and h.replicas.low_watermark(part) == 0
        h.change_partition("n", part.partition, leader=2)
        h.change_partition("n", part.partition, leader=NODE_ID)  # leads again after 2
        assert part.is_leader and h.replicas.low_watermark(part) == -1
        await fetch_as_follower(h, part, 2, 0)
        waiting = await parked_delete(c, part, 2)
        await fetch_as_follower(h, part, 2, 2)
        assert not waiting.done()
        assert h.replicas.low_watermark(part) == -1  # follower 3 has not fetched
        await fetch_as_follower(h, part, 3, 2)
        assert await asyncio.wait_for(waiting, 5) == (Errors.NONE, 2)

    run(tmp_path, test)


def test_the_answer_names_the_low_watermark_that_completed_it(tmp_path: Path) -> None:
    """A partition done early keeps the low watermark it was done at: follower 3, fenced, no
    longer held it back; unfenced again before the request's other partition is done, its
    last report (log start 0) counts again, and the answer said 0 for the first partition."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("w", 6, 3)
        first, second = h.led_partitions("w")[:2]
        parts = []
        for index in (first, second):
            part = h.replicas.get_partition("w", index)
            assert part is not None
            await c.call(PRODUCE, 9, produce_values("w", index, batch([b"a", b"b", b"c"])))
            for replica in (2, 3):
                await fetch_as_follower(h, part, replica, 0)
            parts.append(part)
        broker = h.cache.image.brokers[3]
        h.quorum.commit([rec.FenceBroker(broker_id=3, broker_epoch=broker.broker_epoch)])
        values = {
            "topics": [
                {
                    "name": "w",
                    "partitions": [
                        {"partition_index": first, "offset": 2},
                        {"partition_index": second, "offset": 2},
                    ],
                }
            ],
            "timeout": 5000,
        }
        waiting = asyncio.ensure_future(c.call(DELETE_RECORDS, 2, values))
        async with asyncio.timeout(5):
            while not (parts[0].low_watermark_waiters and parts[1].low_watermark_waiters):
                await asyncio.sleep(0.001)  # until the request reached the node
        await fetch_as_follower(h, parts[0], 2, 2)  # the first is done (3 is fenced)
        assert not parts[0].low_watermark_waiters
        h.quorum.commit([rec.UnfenceBroker(broker_id=3, broker_epoch=broker.broker_epoch)])
        assert h.replicas.low_watermark(parts[0]) == 0  # 3 reported 0 before it was fenced
        await fetch_as_follower(h, parts[1], 2, 2)
        await fetch_as_follower(h, parts[1], 3, 2)
        response = await asyncio.wait_for(waiting, 5)
        answers = {
            p.partition_index: (p.error_code, p.low_watermark)
            for p in response.topics[0].partitions
        }
        assert answers == {first: (Errors.NONE, 2), second: (Errors.NONE, 2)}

    run(tmp_path, test)


def test_one_request_over_many_partitions_writes_the_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint holds every partition: one write after the request's moves, before its
    answer, not one (with its fsyncs) per partition on the event loop."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("many", 8, 1)
        mine = h.led_partitions("many")
        assert len(mine) >= 2
        for index in mine:
            await c.call(PRODUCE, 9, produce_values("many", index, batch([b"a", b"b", b"c"])))
        logs = h.replicas.logs
        writes: list[None] = []
        write = logs.checkpoint_log_start_offsets

        def counted() -> None:
            writes.append(None)
            write()

        monkeypatch.setattr(logs, "checkpoint_log_start_offsets", counted)
        values = {
            "topics": [
                {
                    "name": "many",
                    "partitions": [{"partition_index": i, "offset": 2} for i in mine],
                }
            ],
            "timeout": 5000,
        }
        response = await c.call(DELETE_RECORDS, 2, values)
        answers = {(p.error_code, p.low_watermark) for p in response.topics[0].partitions}
        assert answers == {(Errors.NONE, 2)}
        assert len(writes) == 1
        path = logs.data_dir / checkpoint.LOG_START_OFFSET_CHECKPOINT
        assert {checkpoint.read_offsets(path)[("many", i)] for i in mine} == {2}

    run(tmp_path, test)


def test_a_topic_deleted_while_the_answer_waits_is_unknown(tmp_path: Path) -> None:
    """Kafka's DelayedDeleteRecords answers a partition no longer hosted with
    UNKNOWN_TOPIC_OR_PARTITION (a client retrying NOT_LEADER_OR_FOLLOWER would look for a
    leader of a topic that is gone)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part = await three_records_followed_by_2_and_3(h, c, "d")
        waiting = await parked_delete(c, part, 2)
        h.quorum.commit([rec.RemoveTopic(h.topic_id("d"))])
        assert await asyncio.wait_for(waiting, 5) == (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1)

    run(tmp_path, test)


def test_a_partition_named_twice_is_deleted_once_at_its_last_offset(tmp_path: Path) -> None:
    """KafkaApis collects DeleteRecords' partitions in a map: one named twice (in one topic
    entry or two) moves once, to its last offset, and is answered once. Each entry was
    applied and answered, and parked its own wait (found by a review)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"a", b"b", b"c"])))
        values = {
            "topics": [
                {"name": "t", "partitions": [{"partition_index": mine, "offset": 1}]},
                {
                    "name": "t",
                    "partitions": [
                        {"partition_index": mine, "offset": 3},
                        {"partition_index": mine, "offset": 2},
                    ],
                },
            ],
            "timeout": 5000,
        }
        response = await c.call(DELETE_RECORDS, 2, values)
        answers = [
            (t.name, p.partition_index, p.error_code, p.low_watermark)
            for t in response.topics
            for p in t.partitions
        ]
        assert answers == [("t", mine, Errors.NONE, 2)]
        part = h.replicas.get_partition("t", mine)
        assert part is not None and part.log.log_start_offset == 2

    run(tmp_path, test)
