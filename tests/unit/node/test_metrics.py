"""node/metrics.py over a real ReplicaManager and CoordinatorRuntime (no processes): the
kafka_exporter lag families, partition offsets, coordinator counters; the request stats; and
the text exposition, read back by Prometheus' parser as prometheus_client's own."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kcoord.cluster.coordinator import types as t
from kcoord.errors import Errors
from kcoord.node import metrics as metrics_module
from kcoord.node.kafka.server import RequestStats
from kcoord.node.log_maintenance import MaintenanceStats
from kcoord.node.metrics import NodeMetrics, exposition
from kcoord.raft import records as rec
from kcoord.storage import format as fmt
from tests.unit.node.test_runtime import OFFSETS_ID, Node, commit, loaded

if TYPE_CHECKING:
    from kcoord.node.log_maintenance import LogMaintenance
    from kcoord.node.server import Node as ServerNode

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(
    metrics: NodeMetrics, remote: Mapping[tuple[str, int], int] | None = None
) -> Samples:
    """A scrape whose leaders of partitions led elsewhere answer ``remote``."""

    async def fetch(wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {key: end for key, end in (remote or {}).items() if key in wanted}

    return parse((await metrics.scrape(fetch)).decode())


def scrape_now(metrics: NodeMetrics) -> Samples:
    return asyncio.run(scrape(metrics))


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def node_view(node: Node, request_stats: RequestStats | None = None) -> ServerNode:
    """The parts of a server Node the collector reads; the quorum and controller are absent."""
    server = SimpleNamespace(
        stats=request_stats,
        connection_count=2,
        connections_closed_for_errors=1,
        connections_refused=3,
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


def commit_many(group: str, offsets: dict[int, int], topic: str = "orders") -> Any:
    req = t.OffsetCommitRequest(
        group_id=group,
        topics=(
            t.OffsetCommitRequestTopic(
                name=topic,
                partitions=tuple(
                    t.OffsetCommitRequestPartition(partition_index=p, committed_offset=o)
                    for p, o in offsets.items()
                ),
            ),
        ),
    )
    return lambda s, tok, now: s.handle_offset_commit(tok, req, now)


async def led_with_records(tmp_path: Path) -> tuple[Node, Any]:
    """A node leading its shard, with 10 records in orders-0; and its offsets partition."""
    node = Node(tmp_path)
    node.elect()
    await loaded(node)
    produce(node, 10)
    return node, node.offsets_partition


def test_offsets_are_shown_once_committed_and_a_partial_lag_sum_not_at_all(
    tmp_path: Path,
) -> None:
    """A commit the high watermark has not passed is not shown (the shard holds it before it
    commits, and a failover may lose it): the last committed value is, as OffsetFetch would
    read. A lag sum over the partitions whose end offset is known only would read as the lag
    dropping whenever a leader does not answer: it is left out, as that partition's lag is."""

    async def scenario() -> None:
        node, offsets = await led_with_records(tmp_path)
        metrics = NodeMetrics(node_view(node))
        key = {"consumergroup": "g", "topic": "orders", "partition": "0"}
        first = node.runtime.submit("g", commit_many("g", {0: 3}))
        node.runtime.contexts[0].flush()
        assert value(await scrape(metrics), "kafka_consumergroup_current_offset", **key) is None
        node.replicas.release(offsets)
        await first
        assert value(await scrape(metrics), "kafka_consumergroup_current_offset", **key) == 3
        # Partition 1 of orders does not exist here: its end offset is unknown.
        second = node.runtime.submit("g", commit_many("g", {0: 6, 1: 2}))
        node.runtime.contexts[0].flush()
        samples = await scrape(metrics)
        assert value(samples, "kafka_consumergroup_current_offset", **key) == 3
        assert value(samples, "kcoord_coordinator_committed_offsets") == 1
        node.replicas.release(offsets)
        await second
        samples = await scrape(metrics)
        assert value(samples, "kafka_consumergroup_current_offset", **key) == 6
        assert value(samples, "kafka_consumergroup_lag", **key) == 4
        other = {**key, "partition": "1"}
        assert value(samples, "kafka_consumergroup_current_offset", **other) == 2
        assert value(samples, "kafka_consumergroup_lag", **other) is None
        assert (
            value(samples, "kafka_consumergroup_lag_sum", consumergroup="g", topic="orders") is None
        )
        assert value(samples, "kcoord_coordinator_committed_offsets") == 2

    asyncio.run(scenario())


def test_a_committed_offset_stays_shown_across_a_new_leader_epoch_of_the_same_shard(
    tmp_path: Path,
) -> None:
    """A new leader epoch with this node still leading keeps the shard (runtime.py): the last
    committed value of an offset whose newer commit is pending stays shown. The scrape took
    any epoch change for a reload and showed nothing until the newer commit committed."""

    async def scenario() -> None:
        node, offsets = await led_with_records(tmp_path)
        metrics = NodeMetrics(node_view(node))
        key = {"consumergroup": "g", "topic": "orders", "partition": "0"}
        first = node.runtime.submit("g", commit_many("g", {0: 3}))
        node.runtime.contexts[0].flush()
        node.replicas.release(offsets)
        await first
        assert value(await scrape(metrics), "kafka_consumergroup_current_offset", **key) == 3
        second = node.runtime.submit("g", commit_many("g", {0: 6}))
        node.runtime.contexts[0].flush()
        ctx = node.runtime.contexts[0]
        state = node.cache.image.partition(OFFSETS_ID, 0)
        assert state is not None
        # The same leader, a new leader epoch (as a node that missed its leaderless stretch).
        node.cache.apply(2, [rec.PartitionChange(OFFSETS_ID, 0, state.partition_epoch, leader=1)])
        assert node.runtime.contexts[0] is ctx and ctx.leader_epoch == 1
        assert value(await scrape(metrics), "kafka_consumergroup_current_offset", **key) == 3
        node.replicas.release(offsets)
        await second
        assert value(await scrape(metrics), "kafka_consumergroup_current_offset", **key) == 6

    asyncio.run(scenario())


def test_consumer_lag_against_the_high_watermark(tmp_path: Path) -> None:
    async def scenario() -> None:
        node, offsets = await led_with_records(tmp_path)
        fut = node.runtime.submit("g", commit("g", 3))
        node.runtime.contexts[0].flush()  # the open batch, which the release commits
        node.replicas.release(offsets)
        await fut
        metrics = NodeMetrics(node_view(node))
        samples = await scrape(metrics)
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
        fut = node.runtime.submit("g", commit_many("g", {0: 4}, "elsewhere"))
        node.runtime.contexts[0].flush()  # the open batch, which the release commits
        node.replicas.release(offsets)
        await fut
        committed = await metrics.collector.committed_offsets()
        wanted = metrics.collector.lag_partitions_led_elsewhere(committed.partitions)
        assert wanted == {("elsewhere", 0)}
        samples = await scrape(metrics)
        remote = {"consumergroup": "g", "topic": "elsewhere", "partition": "0"}
        assert value(samples, "kafka_consumergroup_current_offset", **remote) == 4
        assert value(samples, "kafka_consumergroup_lag", **remote) is None
        samples = await scrape(metrics, {("elsewhere", 0): 9})
        assert value(samples, "kafka_consumergroup_lag", **remote) == 5
        node.runtime.close()
        node.logs.close()

    asyncio.run(scenario())


def test_a_scrape_writes_the_lag_off_the_event_loop(tmp_path: Path) -> None:
    """A scrape of a node holding a million committed offsets held the event loop for 7 s
    (each offset a sample object, then a line). The lag is now written as text on a thread
    from what the loop gathered, escapes included, with the high watermarks the leaders of
    partitions led elsewhere answered."""

    async def scenario() -> None:
        node, offsets = await led_with_records(tmp_path)
        odd = 'g"\\\n'  # a group id needing every label escape
        futures = [
            node.runtime.submit(odd, commit_many(odd, {0: 3})),
            node.runtime.submit("g", commit_many("g", {0: 4, 1: 2}, "elsewhere")),
        ]
        node.runtime.contexts[0].flush()
        node.replicas.release(offsets)
        await asyncio.gather(*futures)
        metrics = NodeMetrics(node_view(node))
        asked: list[set[tuple[str, int]]] = []

        async def fetch(wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
            asked.append(wanted)
            return {("elsewhere", 0): 9}  # partition 1's leader did not answer

        started, gate = threading.Event(), threading.Event()
        write = metrics_module.consumer_lag_text

        def gated(*args: Any) -> bytes:
            started.set()
            assert gate.wait(10), "the lag was written on the event loop"
            return write(*args)

        async def open_gate() -> None:
            while not started.is_set():
                await asyncio.sleep(0.001)
            gate.set()

        with mock.patch.object(metrics_module, "consumer_lag_text", gated):
            opener = asyncio.create_task(open_gate())
            body = await metrics.scrape(fetch)
            await opener
        assert asked == [{("elsewhere", 0), ("elsewhere", 1)}]

        def lag_samples(text: str) -> Samples:
            return {
                key: v for key, v in parse(text).items() if key[0].startswith("kafka_consumergroup")
            }

        scraped = lag_samples(body.decode())
        key = {"consumergroup": odd, "topic": "orders", "partition": "0"}
        assert value(scraped, "kafka_consumergroup_lag", **key) == 7
        remote = {"consumergroup": "g", "topic": "elsewhere"}
        assert value(scraped, "kafka_consumergroup_lag", partition="0", **remote) == 5
        assert value(scraped, "kafka_consumergroup_lag", partition="1", **remote) is None
        assert value(scraped, "kafka_consumergroup_current_offset", partition="1", **remote) == 2
        assert value(scraped, "kafka_consumergroup_current_offset_sum", **remote) == 6
        assert value(scraped, "kafka_consumergroup_lag_sum", **remote) is None
        node.runtime.close()
        node.logs.close()

    asyncio.run(scenario())


def test_a_scrape_builds_the_partition_families_off_the_event_loop(tmp_path: Path) -> None:
    """Each hosted partition's families were built and written on the event loop: ~270 ms a
    scrape at 10,000 partitions (review helper-208). The loop reads the rows; the families
    are built on the scrape's thread."""

    async def scenario() -> None:
        node, offsets = await led_with_records(tmp_path)
        node.replicas.release(offsets)
        metrics = NodeMetrics(node_view(node))
        started, gate = threading.Event(), threading.Event()
        build = metrics_module.partition_families

        def gated(rows: Any) -> Any:
            started.set()
            assert gate.wait(10), "the partition families were built on the event loop"
            return build(rows)

        async def open_gate() -> None:
            while not started.is_set():
                await asyncio.sleep(0.001)
            gate.set()

        async def fetch(wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
            return {}

        with mock.patch.object(metrics_module, "partition_families", gated):
            opener = asyncio.create_task(open_gate())
            body = await metrics.scrape(fetch)
            await opener
        samples = parse(body.decode())
        rows = metrics.collector.partition_rows()
        assert rows
        for row in rows:
            key = {"topic": row.topic, "partition": str(row.partition)}
            assert value(samples, "kcoord_partition_log_end_offset", **key) == row.log_end_offset
        assert value(samples, "kcoord_replica_partitions") == len(rows)
        node.runtime.close()
        node.logs.close()

    asyncio.run(scenario())


def test_the_lag_text_is_what_metric_families_of_the_same_samples_give(
    tmp_path: Path,
) -> None:
    """``consumer_lag_text`` writes the four per-partition families directly; prometheus_client
    families of the same samples, through ``exposition``, give the same bytes (label escapes,
    order, a partition with no known end, chunks of lines past the first)."""
    offsets = {
        'g"\\\n': {"t": {0: 3, 1: 5}, "u": {0: 1}},
        "": {"t": {2: 7}},
        "ü {}": {"t": {p: p for p in range(5000)}},
    }
    ends = {("t", p): 10 + p for p in range(5000)} | {("u", 1): 4}
    members = [('g"\\\n', 2), ("", 0), ("ü {}", 1)]
    families = {
        name: GaugeMetricFamily(name, doc, labels=labels)
        for name, doc, labels in (
            ("kafka_consumergroup_members", "Members of a consumer group.", ["consumergroup"]),
            (
                "kafka_consumergroup_current_offset",
                "Committed offset of a consumer group in a partition.",
                ["consumergroup", "topic", "partition"],
            ),
            (
                "kafka_consumergroup_current_offset_sum",
                "Sum of a consumer group's committed offsets in a topic.",
                ["consumergroup", "topic"],
            ),
            (
                "kafka_consumergroup_lag",
                "Lag of a consumer group in a partition: high watermark minus committed offset.",
                ["consumergroup", "topic", "partition"],
            ),
            (
                "kafka_consumergroup_lag_sum",
                "Sum of a consumer group's lags in a topic.",
                ["consumergroup", "topic"],
            ),
        )
    }
    for group, topics in offsets.items():
        for topic, parts in topics.items():
            known = [(p, o, ends.get((topic, p))) for p, o in sorted(parts.items())]
            for p, o, end in known:
                families["kafka_consumergroup_current_offset"].add_metric([group, topic, str(p)], o)
                if end is not None:
                    families["kafka_consumergroup_lag"].add_metric([group, topic, str(p)], end - o)
            families["kafka_consumergroup_current_offset_sum"].add_metric(
                [group, topic], sum(o for _, o, _ in known)
            )
            if all(end is not None for _, _, end in known):
                families["kafka_consumergroup_lag_sum"].add_metric(
                    [group, topic], sum(end - o for _, o, end in known if end is not None)
                )
    for group, n in members:
        families["kafka_consumergroup_members"].add_metric([group], n)
    head = b"# HELP x A head.\n# TYPE x gauge\nx 1\n"
    assert metrics_module.consumer_lag_text(offsets, ends, head, members) == head + exposition(
        families.values()
    )


def test_request_stats_families(tmp_path: Path) -> None:
    node = Node(tmp_path)
    stats = RequestStats()
    stats.record(8, 0.003, {"error_code": Errors.NONE})
    stats.record(8, 0.2, {"error_code": Errors.NOT_COORDINATOR})
    stats.record(0, 0.001, None)
    stats.bytes_received, stats.bytes_sent = 100, 40
    samples = scrape_now(NodeMetrics(node_view(node, stats)))
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
    assert value(samples, "kcoord_kafka_connections_refused_total") == 3
    # metrics.enable=false: the listener counts nothing and the families are absent.
    samples = scrape_now(NodeMetrics(node_view(node, None)))
    assert value(samples, "kcoord_kafka_requests_total", api="OffsetCommit") is None
    assert value(samples, "kcoord_kafka_connections") == 2
    node.logs.close()


def test_the_metadata_age_is_the_time_since_this_node_last_applied_a_batch(
    tmp_path: Path,
) -> None:
    """KIP-835's staleness (Kafka's last-applied-record-lag-ms): the seconds since this node
    applied a committed metadata batch, so with the controller's NoOps it stays below
    metadata.max.idle.interval.ms on a node following the log, and grows on one that is not."""
    node = Node(tmp_path)
    clock = [1_000_000]
    node.cache.monotonic_ms = lambda: clock[0]
    node.cache.apply(node.cache.offset + 1, [rec.NoOp()])
    clock[0] += 750
    samples = scrape_now(NodeMetrics(node_view(node)))
    assert value(samples, "kcoord_metadata_last_applied_age_seconds") == 0.75
    node.cache.apply(node.cache.offset + 1, [rec.NoOp()])
    samples = scrape_now(NodeMetrics(node_view(node)))
    assert value(samples, "kcoord_metadata_last_applied_age_seconds") == 0
    node.logs.close()


class Families(Collector):
    """Families of every kind the exposition handles, with values and texts to escape."""

    def collect(self) -> list[Metric]:
        counter = CounterMetricFamily(
            "demo_requests", 'Requests.\nWith a \\ and a "quote".', labels=["api", "note"]
        )
        counter.add_metric(["Fetch", 'a "quoted"\nline \\ here'], 3)
        counter.add_metric(["Produce", "plain"], 2.5, created=1_700_000_000.25)
        gauge = GaugeMetricFamily("demo_level", "Levels.", labels=["partition", "topic"])
        for partition, level in enumerate((0, -7, 1e21, 1.5e-7, float("inf"), float("-inf"))):
            gauge.add_metric([str(partition), "orders"], level)
        gauge.add_metric(["9", "nan"], float("nan"))
        stamped = GaugeMetricFamily("demo_stamped", "Timestamped.")
        stamped.add_metric([], 1, timestamp=1_700_000_000.5)
        histogram = HistogramMetricFamily("demo_latency_seconds", "Latency.", labels=["api"])
        histogram.add_metric(["Fetch"], [("0.005", 1), ("0.1", 4), ("+Inf", 5)], sum_value=0.3)
        info = InfoMetricFamily("demo_build", "Build.", value={"version": "1.2", "commit": "c0"})
        return [counter, gauge, stamped, histogram, info]


def parsed(text: str) -> list[tuple[str, str, str, list[tuple[str, Any, Any, Any]]]]:
    """Every family as Prometheus' parser reads it; NaN as a string, since NaN != NaN."""
    return [
        (
            f.name,
            f.type,
            f.documentation,
            [
                (s.name, s.labels, "NaN" if math.isnan(s.value) else s.value, s.timestamp)
                for s in f.samples
            ],
        )
        for f in text_string_to_metric_families(text)
    ]


def test_exposition_reads_back_as_prometheus_clients_own() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    ours = exposition(registry.collect()).decode()
    assert parsed(ours) == parsed(generate_latest(registry).decode())
    # The escapes of the text format, in HELP and in a label value.
    assert '# HELP demo_requests_total Requests.\\nWith a \\\\ and a "quote".\n' in ours
    assert 'note="a \\"quoted\\"\\nline \\\\ here"' in ours
    # A counter's created time goes in a gauge family of its own after the counter's.
    assert "# TYPE demo_requests_created gauge\n" in ours
    assert "demo_stamped 1 1700000000500\n" in ours


def test_exposition_of_a_node_reads_back_as_prometheus_clients_own(tmp_path: Path) -> None:
    node = Node(tmp_path)
    stats = RequestStats()
    stats.record(8, 0.003, {"error_code": Errors.NONE})
    metrics = NodeMetrics(node_view(node, stats))
    committed = asyncio.run(metrics.collector.committed_offsets())
    families = [*metrics.collector.families(committed), *metrics.registry.collect()]
    assert {"kcoord_node_info", "kafka_brokers", "process_cpu_seconds"} <= {
        f.name for f in families
    }

    class Fixed(Collector):
        def collect(self) -> list[Metric]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    assert parsed(exposition(families).decode()) == parsed(generate_latest(registry).decode())
    node.logs.close()


def test_cleaner_passes_count_as_cleaned_only_once_swapped_in(tmp_path: Path) -> None:
    """ "cleaned" was runs - abandoned - failed: a scrape during a pass counted it, and when it
    then failed the counter went down, which rate() reads as a reset."""
    node = Node(tmp_path)
    view = node_view(node)
    stats = MaintenanceStats(cleaner_runs=1)  # a pass under way
    view.log_maintenance = cast("LogMaintenance", SimpleNamespace(stats=stats, uncleanable=set()))
    metrics = NodeMetrics(view)

    def passes(result: str) -> float | None:
        return value(scrape_now(metrics), "kcoord_log_cleaner_passes_total", result=result)

    assert passes("cleaned") == 0
    stats.cleaner_failed = 1  # it failed
    assert (passes("cleaned"), passes("failed")) == (0, 1)
    stats.cleaner_runs, stats.cleaner_cleaned = 2, 1
    assert passes("cleaned") == 1


def test_a_scrape_reads_a_shards_groups_and_offsets_a_few_thousand_per_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One shard's groups and offsets were read in one turn of the event loop (a review's
    probe: a million offsets in one shard held it 1.2 s, 100,000 groups' members 0.4 s). They
    are read a few thousand per turn now, each group as it is when its turn comes; a shard
    unloaded in the middle adds nothing."""

    async def scenario() -> None:
        node, offsets = await led_with_records(tmp_path)
        for i in range(6):
            fut = node.runtime.submit(f"g{i}", commit_many(f"g{i}", {0: i, 1: i + 1}))
            node.runtime.contexts[0].flush()
            node.replicas.release(offsets)
            await fut
        metrics = NodeMetrics(node_view(node))
        monkeypatch.setattr(metrics_module, "SCRAPE_ITEMS_PER_TURN", 3)
        turns = 0
        done = False

        async def count_turns() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(count_turns())
        committed = await metrics.collector.committed_offsets()
        done = True
        await ticker
        assert turns >= 4  # 6 groups, 12 offsets, 3 items a turn
        assert committed.count == 12 and committed.members == 0
        assert sorted(committed.group_members) == [(f"g{i}", 0) for i in range(6)]
        assert sum(committed.groups.values()) == 6
        samples = await scrape(metrics)
        assert value(samples, "kafka_consumergroup_members", consumergroup="g5") == 0
        key = {"consumergroup": "g5", "topic": "orders", "partition": "1"}
        assert value(samples, "kafka_consumergroup_current_offset", **key) == 6
        assert value(samples, "kcoord_coordinator_committed_offsets") == 12

        # Unloaded at the first turn the read gives up: nothing of the shard is added.
        gathering = asyncio.create_task(metrics.collector.committed_offsets())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        node.runtime.unload(0, offsets.leader_epoch)
        half = await gathering
        assert half.count == 0 and not half.group_members
        node.runtime.close()

    asyncio.run(scenario())


def test_a_quorum_status_that_raises_leaves_out_the_raft_families_only(
    tmp_path: Path,
) -> None:
    """pysyncobj's getStatus can raise while its thread grows its dicts (its first election):
    raised out of the collector, it failed the whole scrape, which Prometheus reads as the
    node down."""

    class Racing:
        def status(self) -> Any:
            raise RuntimeError("dictionary changed size during iteration")

    node = Node(tmp_path)
    view = node_view(node)
    cast(Any, view).quorum = Racing()
    samples = scrape_now(NodeMetrics(view))
    assert value(samples, "kcoord_node_info", node_id="1", cluster_id="") == 1
    assert not [name for name, _ in samples if name.startswith("kcoord_raft_")]
    node.logs.close()
