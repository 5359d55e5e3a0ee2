"""ElectLeaders and DescribeLogDirs on the wire, against the harness node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kcoord.errors import Errors
from kcoord.raft import records as rec
from tests.unit.node.kafka.harness import NODE_ID, Harness
from tests.unit.node.kafka.test_handlers import PRODUCE, batch, produce_values, run
from tests.unit.node.kafka.wire import AsyncWireClient

ELECT_LEADERS, DESCRIBE_LOG_DIRS = 43, 35
PREFERRED, UNCLEAN = 0, 1


def elect_values(election: int, partitions: dict[str, list[int]] | None) -> dict[str, Any]:
    return {
        "election_type": election,
        "topic_partitions": None
        if partitions is None
        else [{"topic": t, "partitions": ps} for t, ps in partitions.items()],
        "timeout": 5000,
    }


def results(response: Any) -> dict[tuple[str, int], Errors]:
    return {
        (r.topic, p.partition_id): Errors(p.error_code)
        for r in response.replica_election_results
        for p in r.partition_result
    }


def test_elect_leaders_moves_leadership_back_to_the_preferred_replica(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)
        mine = h.led_partitions("t")[0]
        state = h.cache.image.partition(h.topic_id("t"), mine)
        assert state is not None and state.replicas[0] == NODE_ID
        # Leadership moved to another in-sync replica (as after a failover and catch-up).
        h.quorum.commit(
            [rec.PartitionChange(state.topic_id, mine, state.partition_epoch, leader=2)]
        )
        assert h.led_partitions("t") == []
        response = await c.call(ELECT_LEADERS, 2, elect_values(UNCLEAN, {"t": [mine]}))
        assert results(response) == {("t", mine): Errors.ELECTION_NOT_NEEDED}
        others = [p for p in range(3) if p != mine]
        response = await c.call(
            ELECT_LEADERS, 1, elect_values(PREFERRED, {"t": [mine, *others], "nope": [0]})
        )
        assert response.error_code == Errors.NONE
        assert results(response) == {
            ("t", mine): Errors.NONE,
            **{("t", p): Errors.ELECTION_NOT_NEEDED for p in others},
            ("nope", 0): Errors.UNKNOWN_TOPIC_OR_PARTITION,
        }
        assert h.led_partitions("t") == [mine]  # the answer waited for the image
        # Every partition (null) answers only where an election was needed: none now.
        response = await c.call(ELECT_LEADERS, 0, {"topic_partitions": None, "timeout": 5000})
        assert results(response) == {}
        bad = await c.call(ELECT_LEADERS, 2, elect_values(7, None))
        assert bad.error_code == Errors.INVALID_REQUEST

    run(tmp_path, test)


def test_describe_log_dirs_lists_the_hosted_partitions_and_their_sizes(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)  # every partition hosted here
        mine = h.led_partitions("t")[0]
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"x" * 100] * 10), acks=1))
        response = await c.call(DESCRIBE_LOG_DIRS, 4, {"topics": None})
        (result,) = response.results
        assert (response.error_code, result.error_code) == (Errors.NONE, Errors.NONE)
        assert result.log_dir == str(tmp_path.resolve())
        assert result.total_bytes >= result.usable_bytes > 0
        sizes = {
            (t.name, p.partition_index): p.partition_size
            for t in result.topics
            for p in t.partitions
        }
        assert {tp for tp in sizes if tp[0] == "t"} == {("t", 0), ("t", 1), ("t", 2)}
        assert sizes[("t", mine)] == h.replicas.partitions[("t", mine)].log.size_bytes > 1000
        assert all(sizes[("t", p)] == 0 for p in range(3) if p != mine)
        only = await c.call(
            DESCRIBE_LOG_DIRS, 1, {"topics": [{"topic": "t", "partitions": [mine, 7]}]}
        )
        assert [
            (t.name, [p.partition_index for p in t.partitions]) for t in only.results[0].topics
        ] == [("t", [mine])]

    run(tmp_path, test)
