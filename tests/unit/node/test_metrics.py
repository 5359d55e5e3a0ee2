"""node/metrics.py over a real ReplicaManager and CoordinatorRuntime (no processes): the
kafka_exporter lag families, partition offsets, coordinator counters; and the request stats."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from prometheus_client.parser import text_string_to_metric_families

from kcoord.cluster.coordinator import types as t
from kcoord.errors import Errors
from kcoord.node.kafka.server import RequestStats
from kcoord.node.metrics import NodeMetrics
from kcoord.storage import format as fmt
from tests.unit.node.test_runtime import Node, commit, loaded

if TYPE_CHECKING:
    from kcoord.node.server import Node as ServerNode

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: NodeMetrics) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def node_view(node: Node, request_stats: RequestStats | None = None) -> ServerNode:
    """The parts of a server Node the collector reads; the quorum and controller are absent."""
    server = SimpleNamespace(
        stats=request_stats, connection_count=2, connections_closed_for_errors=1
    )
    return cast(
        "ServerNode",
        SimpleNamespace(
            config=SimpleNamespace(node_id=1),
            cache=node.cache,
            replicas=node.replicas,
            log_maintenance=None,
            coordinator=node.runtime,
            quorum=None,
            monitor=None,
            controller=None,
            lifecycle=None,
            kafka=SimpleNamespace(server=server),
            rpc_server=None,
        ),
    )


def produce(node: Node, count: int) -> None:
    part = node.replicas.get_partition("orders", 0)
    assert part is not None
    batch = fmt.build_batch([fmt.Record(i, node.now, b"k", b"v") for i in range(count)])
    node.replicas.append_local(part, batch, required_acks=1)
    node.replicas.release(part)


def test_consumer_lag_against_the_high_watermark(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path)
        node.elect()
        await loaded(node)
        produce(node, 10)
        offsets = node.offsets_partition
        fut = node.runtime.submit("g", commit("g", 3))
        node.runtime.contexts[0].flush()  # the open batch, which the release commits
        node.replicas.release(offsets)
        await fut
        metrics = NodeMetrics(node_view(node))
        samples = scrape(metrics)
        key = {"consumergroup": "g", "topic": "orders", "partition": "0"}
        assert value(samples, "kafka_consumergroup_current_offset", **key) == 3
        assert value(samples, "kafka_consumergroup_lag", **key) == 7
        assert value(samples, "kafka_consumergroup_lag_sum", consumergroup="g", topic="orders") == 7
        assert value(samples, "kafka_consumergroup_members", consumergroup="g") == 0
        assert (
            value(samples, "kafka_topic_partition_current_offset", topic="orders", partition="0")
            == 10
        )
        # __consumer_offsets is internal: not a kafka_exporter topic.
        assert not any(
            name == "kafka_topic_partition_current_offset"
            and ("topic", "__consumer_offsets") in labels
            for name, labels in samples
        )
        assert value(samples, "kafka_brokers") == 1
        assert (
            value(samples, "kcoord_partition_high_watermark", topic="orders", partition="0") == 10
        )
        assert (
            value(samples, "kcoord_partition_log_end_offset", topic="orders", partition="0") == 10
        )
        assert value(samples, "kcoord_partition_leader", topic="orders", partition="0") == 1
        assert value(samples, "kcoord_log_appended_bytes_total", role="leader") is not None
        assert value(samples, "kcoord_coordinator_offset_commits_total") == 1
        assert value(samples, "kcoord_coordinator_batches_appended_total") == 1
        assert value(samples, "kcoord_coordinator_records_appended_total") == 1
        assert value(samples, "kcoord_coordinator_offset_commit_latency_seconds_count") == 0
        assert value(samples, "kcoord_coordinator_shards", state="active") == 1
        assert (
            value(
                samples,
                "kcoord_coordinator_groups",
                protocol="classic",
                protocol_type="none",
                state="Empty",
            )
            == 1
        )
        assert (
            value(samples, "kcoord_coordinator_shard_load_duration_seconds_count", kind="cold") == 1
        )

        # A partition another node leads: no lag series until its leader's HW is known.
        fut = node.runtime.submit("g", commit_to("g", "elsewhere", 4))
        node.runtime.contexts[0].flush()  # the open batch, which the release commits
        node.replicas.release(offsets)
        await fut
        assert metrics.collector.lag_partitions_led_elsewhere() == {("elsewhere", 0)}
        samples = scrape(metrics)
        remote = {"consumergroup": "g", "topic": "elsewhere", "partition": "0"}
        assert value(samples, "kafka_consumergroup_current_offset", **remote) == 4
        assert value(samples, "kafka_consumergroup_lag", **remote) is None
        metrics.collector.set_remote_end_offsets({("elsewhere", 0): 9})
        samples = scrape(metrics)
        assert value(samples, "kafka_consumergroup_lag", **remote) == 5
        node.runtime.close()
        node.logs.close()

    asyncio.run(scenario())


def commit_to(group: str, topic: str, offset: int) -> Any:
    req = t.OffsetCommitRequest(
        group_id=group,
        topics=(
            t.OffsetCommitRequestTopic(
                name=topic,
                partitions=(
                    t.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset),
                ),
            ),
        ),
    )
    return lambda s, tok, now: s.handle_offset_commit(tok, req, now)


def test_request_stats_families(tmp_path: Path) -> None:
    node = Node(tmp_path)
    stats = RequestStats()
    stats.record(8, 0.003, {"error_code": Errors.NONE})
    stats.record(8, 0.2, {"error_code": Errors.NOT_COORDINATOR})
    stats.record(0, 0.001, None)
    stats.bytes_received, stats.bytes_sent = 100, 40
    samples = scrape(NodeMetrics(node_view(node, stats)))
    assert value(samples, "kcoord_kafka_requests_total", api="OffsetCommit") == 2
    assert value(samples, "kcoord_kafka_requests_total", api="Produce") == 1
    assert (
        value(
            samples,
            "kcoord_kafka_request_errors_total",
            api="OffsetCommit",
            error="NOT_COORDINATOR",
        )
        == 1
    )
    assert (
        value(
            samples, "kcoord_kafka_request_duration_seconds_bucket", api="OffsetCommit", le="0.005"
        )
        == 1
    )
    assert value(samples, "kcoord_kafka_request_duration_seconds_count", api="OffsetCommit") == 2
    assert value(samples, "kcoord_kafka_received_bytes_total") == 100
    assert value(samples, "kcoord_kafka_sent_bytes_total") == 40
    assert value(samples, "kcoord_kafka_connections") == 2
    # metrics.enable=false: the listener counts nothing and the families are absent.
    samples = scrape(NodeMetrics(node_view(node, None)))
    assert value(samples, "kcoord_kafka_requests_total", api="OffsetCommit") is None
    assert value(samples, "kcoord_kafka_connections") == 2
    node.logs.close()
