"""The node's Prometheus metrics, served at ``/metrics`` on the admin port (node/admin.py).

Theory of operation
-------------------
Nothing here runs on a hot path. ``NodeCollector`` builds every family of a node at scrape
time from what the node's parts already keep: the metadata image and cache, the quorum's
status, the controller service, the broker lifecycle, the ``ReplicaManager``'s partitions, the
coordinator runtime's shards and standbys, and plain counters the parts increment (the pure
shard's ``CoordinatorStats``, the Kafka listener's ``RequestStats``,
``kcoord.stats.Histogram`` latencies); a ``CollectorRegistry`` of the node's own holds
prometheus_client's process, platform and GC collectors (``NodeMetrics``). Only this module
(and node/admin.py, which serves it) imports ``prometheus_client``; pure code exposes
integers.

Conventions: one ``kcoord_`` prefix, base units (``_seconds``, ``_bytes``), counters end in
``_total``, and labels stay bounded: API names, Kafka error names, group states, topics and
partitions of the cluster; the exception is the kafka_exporter families' ``consumergroup``,
one value per group with committed offsets (as kafka_exporter's), which a client creates by
committing and which lasts until ``offsets.retention.minutes`` expires its offsets. Counters
are per process: they start at zero when a node restarts (Prometheus' ``rate`` handles the
reset). Gauges that describe the whole cluster rather than
this node (brokers, offline partitions, topic and partition counts) are reported by the active
controller only and are 0 elsewhere, as Kafka's controller metrics are; sum them over nodes.

Consumer lag, compatible with kafka_exporter (its names and labels: ``consumergroup``,
``topic``, ``partition``), so existing dashboards work: each node exports the groups it
coordinates (its active shards): the committed offsets, those the partition's high watermark
has passed (``committed_offsets``), as OffsetFetch reads them. The log end offset a
lag is measured against is the partition's high watermark, what ``ListOffsets(latest)`` answers
and what kafka_exporter reads. A partition this node leads is read locally; for the others a
scrape (``NodeMetrics.scrape``) first asks their leaders over the inter-node RPC
(``PartitionOffsets``, one call per leader node, bounded by a short timeout); a partition
whose leader did not answer has no lag series in that scrape (kafka_exporter also skips what
it cannot read) rather than a wrong one, and its topic no ``kafka_consumergroup_lag_sum`` (a
sum over the others would read as the lag dropping). There is a sample per committed offset,
so a scrape gathers them a shard per turn of the event loop and writes them on a thread.
``kafka_topic_partition_current_offset`` comes from the partitions this node leads (internal
topics excluded), so every partition is exported once across the cluster. Once only while the
cluster is whole: a node cut off from the controller still coordinates and leads what it did
until it hears otherwise, so for a while both it and the new coordinator or leader export the
same series. Dashboards take ``max`` of a group's or a partition's series across targets, and
``sum`` only over different groups or partitions.

The families (``{labels}``; G gauge, C counter, H histogram)::

    node         G kcoord_node_info{node_id,cluster_id}  G kcoord_broker_registered
                 G kcoord_broker_fenced  G kcoord_metadata_offset
                 C kcoord_metadata_batches_applied_total
                 G kcoord_metadata_last_applied_age_seconds
    raft         G kcoord_raft_state{state}  G kcoord_raft_leader_id  G kcoord_raft_epoch
                 G kcoord_raft_commit_index  G kcoord_raft_last_applied  G kcoord_raft_log_entries
                 G kcoord_raft_voters_connected  G kcoord_raft_voter_match_index{voter}
                 C kcoord_raft_leader_changes_total
    controller   G kcoord_controller_active  C kcoord_controller_activations_total
                 C kcoord_controller_proposals_total  C kcoord_controller_proposal_failures_total
                 H kcoord_controller_commit_latency_seconds
                 C kcoord_controller_broker_fencings_total  G kcoord_controller_fenced_brokers
                 G kcoord_controller_active_brokers  G kcoord_controller_topics
                 G kcoord_controller_partitions  G kcoord_controller_offline_partitions
    replication  G kcoord_partition_log_end_offset{topic,partition}
                 G kcoord_partition_high_watermark{..}  G kcoord_partition_log_start_offset{..}
                 G kcoord_partition_leader{..}  G kcoord_partition_isr_size{..}
                 G kcoord_partition_replicas{..}  G kcoord_log_segments{..}
                 G kcoord_log_size_bytes{..}  G kcoord_replica_partitions
                 G kcoord_replica_leader_partitions  G kcoord_replica_under_replicated_partitions
                 G kcoord_replica_under_min_isr_partitions  C kcoord_replica_isr_shrinks_total
                 C kcoord_replica_isr_expands_total  C kcoord_log_appended_bytes_total{role}
                 G kcoord_replica_fetch_sessions  C kcoord_replica_fetch_sessions_opened_total
    logs         C kcoord_log_retention_deleted_segments_total
                 C kcoord_log_cleaner_passes_total{result}  C kcoord_log_cleaner_read_bytes_total
                 C kcoord_log_cleaner_dropped_records_total{kind}
                 G kcoord_log_uncleanable_partitions
    coordinator  G kcoord_coordinator_shards{state}
                 G kcoord_coordinator_groups{protocol,protocol_type,state}
                 G kcoord_coordinator_members  G kcoord_coordinator_committed_offsets
                 G kcoord_coordinator_pending_requests
                 G kcoord_coordinator_responses_waiting_for_high_watermark
                 C kcoord_coordinator_rebalances_started_total
                 C kcoord_coordinator_rebalances_completed_total
                 C kcoord_coordinator_consumer_group_rebalances_total
                 H kcoord_coordinator_rebalance_duration_seconds
                 C kcoord_coordinator_offset_commits_total
                 C kcoord_coordinator_offset_commit_errors_total{error}
                 H kcoord_coordinator_offset_commit_latency_seconds
                 C kcoord_coordinator_expirations_total{kind}
                 H kcoord_coordinator_shard_load_duration_seconds{kind}
                 C kcoord_coordinator_records_replayed_total{by}
                 C kcoord_coordinator_shard_load_failures_total
                 C kcoord_coordinator_batches_appended_total
                 C kcoord_coordinator_records_appended_total
                 G kcoord_coordinator_standby_shards
                 G kcoord_coordinator_standby_lag_offsets{partition}
    requests     G kcoord_kafka_connections  C kcoord_kafka_connections_accepted_total
                 C kcoord_kafka_connections_closed_for_errors_total
                 C kcoord_kafka_connections_refused_total  G kcoord_rpc_connections
                 C kcoord_kafka_received_bytes_total  C kcoord_kafka_sent_bytes_total
                 C kcoord_kafka_requests_total{api}  H kcoord_kafka_request_duration_seconds{api}
                 C kcoord_kafka_request_errors_total{api,error}
    lag          G kafka_brokers  G kafka_topic_partition_current_offset{topic,partition}
                 G kafka_consumergroup_current_offset{consumergroup,topic,partition}
                 G kafka_consumergroup_current_offset_sum{consumergroup,topic}
                 G kafka_consumergroup_lag{consumergroup,topic,partition}
                 G kafka_consumergroup_lag_sum{consumergroup,topic}
                 G kafka_consumergroup_members{consumergroup}
    process      prometheus_client's process_*, python_info and python_gc_* collectors

With ``metrics.enable=false`` the listener counts nothing (the request families and the
OffsetCommit latency are absent) and /metrics answers 404; what is left costs nothing until a
scrape (plain integer additions on rebalances, commits and appends).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from kcoord.errors import Errors
from kcoord.node.kafka.codec import api_name
from kcoord.node.runtime import OFFSETS_TOPIC, ShardContext, ShardState
from kcoord.stats import Histogram

if TYPE_CHECKING:
    from kcoord.node.server import Node

log = logging.getLogger(__name__)

# The format ``exposition`` writes (text 0.0.4, names unescaped), whatever prometheus_client's
# latest is (1.0.0 since 0.21, a format with escaped names that Prometheus parses otherwise).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Groups and committed offsets a scrape reads per turn of the event loop (~1 us each): ~10 ms.
SCRAPE_ITEMS_PER_TURN: Final = 10_000
_OffsetKey = tuple[str, str, int]  # group, topic, partition
PartitionKey = tuple[str, int]
Committed = dict[str, dict[str, dict[int, int]]]  # group -> topic -> partition -> offset

# Group protocol types a label may carry; any other (client-chosen) one reads "other".
_PROTOCOL_TYPES = frozenset({"consumer", "connect"})


def error_name(code: int) -> str:
    try:
        return Errors(code).name
    except ValueError:
        return str(code)


def _protocol_type_label(protocol_type: str | None) -> str:
    if not protocol_type:
        return "none"  # a "simple" group: offsets committed without membership
    return protocol_type if protocol_type in _PROTOCOL_TYPES else "other"


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (``+Inf``, ``0.005``, ``10.0``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _add_histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    buckets = [(_le(bound), count) for bound, count in histogram.cumulative()]
    family.add_metric(labels, buckets, sum_value=histogram.sum)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class _Seen(dict[int, tuple[weakref.ref[ShardContext], dict[_OffsetKey, int]]]):
    """Per offsets partition: its shard context (weakly: an unloaded shard is let go) and its
    committed offsets, (group, topic, partition) -> offset, as a scrape saw them."""


class _Turns:
    """A scrape's reading of one shard, ``SCRAPE_ITEMS_PER_TURN`` items per turn of the event
    loop: ``done`` counts the items read since the last turn."""

    def __init__(self, ctx: ShardContext, shard: object) -> None:
        self.ctx = ctx
        self.shard = shard
        self.done = 0

    async def go_on(self) -> bool:
        """False once the shard read is no longer the context's active one (unloaded or
        reloaded during a turn given to the loop's other work)."""
        if self.done < SCRAPE_ITEMS_PER_TURN:
            return True
        self.done = 0
        await asyncio.sleep(0)
        return self.ctx.state is ShardState.ACTIVE and self.ctx.shard is self.shard


@dataclass
class CommittedOffsets:
    """A scrape's view of the groups this node coordinates: their committed offsets, and
    their members, read in the same pass a few thousand at a time (``committed_offsets``)."""

    offsets: Committed = field(default_factory=dict)
    partitions: set[PartitionKey] = field(default_factory=set)  # those in ``offsets``
    count: int = 0
    # (protocol, protocol type, state) -> groups; every group's members; (group, members).
    groups: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    members: int = 0
    group_members: list[tuple[str, int]] = field(default_factory=list)


class NodeCollector:
    """Every ``kcoord_`` and ``kafka_`` family of one node, built at scrape time (the four
    per-partition consumer-lag families are written as text by ``consumer_lag_text``)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._committed = _Seen()  # as the last scrape saw them (see committed_offsets)

    def families(
        self, committed: CommittedOffsets, rows: list[PartitionRow] | None = None
    ) -> Iterator[Metric]:
        """Every family; with ``rows`` (``partition_rows``) those of each hosted partition
        are left out, for ``partition_families`` to build off the event loop."""
        if rows is None:
            rows = self.partition_rows()
            yield from partition_families(rows)
        yield from self._node()
        yield from self._raft()
        yield from self._controller()
        yield from self._replication(rows)
        yield from self._log_maintenance()
        yield from self._coordinator(committed)
        yield from self._requests()
        yield from self._consumer_lag()

    async def committed_offsets(self) -> CommittedOffsets:
        """The committed offsets as reads see them: a shard replays its records as it writes
        them, before they commit (runtime.py), and a value the high watermark has not passed
        yet may still be lost, so it is not shown: until it commits the last committed value
        seen by an earlier scrape is (or none), as Kafka's metrics read its timeline state at
        the committed offset. An offset deleted (a tombstone not yet committed) stays shown
        until its group's records commit. A few thousand offsets or groups per turn of the
        event loop: a node holding a million offsets took 0.5 s of the loop here, and one
        shard holding them 1.2 s (a review's probe); 100,000 groups' members 0.4 s."""
        out, seen = CommittedOffsets(), _Seen()
        for ctx in self._active_contexts():
            await asyncio.sleep(0)
            if ctx.state is ShardState.ACTIVE and ctx.shard is not None:
                await self._add_shard(out, ctx, seen)
        self._committed = seen  # only once whole: a scrape cancelled midway changes nothing
        return out

    def _active_contexts(self) -> list[ShardContext]:
        runtime = self.node.coordinator
        if runtime is None:
            return []
        return [
            ctx
            for ctx in runtime.contexts.values()
            if ctx.state is ShardState.ACTIVE and ctx.shard is not None
        ]

    async def _add_shard(
        self,
        out: CommittedOffsets,
        ctx: ShardContext,
        seen: _Seen,
    ) -> None:
        """Add the shard's committed offsets and groups to ``out``, and what the offsets are
        to ``seen`` (the next scrape's ``_committed``); nothing if the shard is unloaded
        meanwhile. Each group as it is when its turn comes, against the high watermark then
        (an offset below it is committed, whichever HW a scrape reads)."""
        shard = ctx.shard
        assert shard is not None
        shard_was, before = self._committed.get(ctx.index, (weakref.ref(ctx), {}))
        if shard_was() is not ctx:
            before = {}  # reloaded: everything below the HW is committed
        now: dict[_OffsetKey, int] = {}
        groups: Counter[tuple[str, str, str]] = Counter()
        group_members: list[tuple[str, int]] = []
        turns = _Turns(ctx, shard)
        for group_id in list(shard.groups):
            if not await turns.go_on():
                return
            group = shard.groups.get(group_id)
            if group is not None:
                turns.done += 1
                groups["classic", _protocol_type_label(group.protocol_type), str(group.state)] += 1
                group_members.append((group_id, group.num_members))
        for group_id in list(shard.consumer_groups):  # KIP-848
            if not await turns.go_on():
                return
            consumer_group = shard.consumer_groups.get(group_id)
            if consumer_group is not None:
                turns.done += 1
                groups["consumer", "consumer", consumer_group.state] += 1
                group_members.append((group_id, len(consumer_group.members)))
        for group_id in list(shard.offsets):
            if not await turns.go_on():
                return
            topics = shard.offsets.get(group_id)
            if topics is None:
                continue
            hw = ctx.partition.high_watermark
            for topic, parts in topics.items():
                turns.done += len(parts)
                for partition, entry in parts.items():
                    key = (group_id, topic, partition)
                    if entry.record_offset < hw:
                        now[key] = entry.committed_offset
                    elif key in before:
                        now[key] = before[key]
        hw = ctx.partition.high_watermark
        for key, value in before.items():
            if key not in now and ctx.group_written.get(key[0], 0) > hw:
                now[key] = value
        seen[ctx.index] = (weakref.ref(ctx), now)
        offsets, partitions = out.offsets, out.partitions
        for (group_id, topic, partition), value in now.items():
            offsets.setdefault(group_id, {}).setdefault(topic, {})[partition] = value
            partitions.add((topic, partition))
        out.count += len(now)
        out.groups.update(groups)
        out.members += sum(n for _, n in group_members)
        out.group_members += group_members

    # -----------------------------------------------------------------------------------------
    # Node, Raft and controller.

    def _node(self) -> Iterator[Metric]:
        node = self.node
        image = node.cache.image
        info = GaugeMetricFamily(
            "kcoord_node_info", "This node's id and cluster id.", labels=["node_id", "cluster_id"]
        )
        info.add_metric([str(node.config.node_id), image.cluster_id or ""], 1)
        yield info
        lifecycle = node.lifecycle
        registered = lifecycle is not None and lifecycle.broker_epoch is not None
        yield _gauge(
            "kcoord_broker_registered",
            "1 if this node is registered with the controller.",
            int(registered),
        )
        yield _gauge(
            "kcoord_broker_fenced",
            "1 if the controller has this node fenced (or it is not registered).",
            int(lifecycle is None or lifecycle.is_fenced),
        )
        yield _gauge(
            "kcoord_metadata_offset",
            "The metadata log offset this node's image has applied.",
            image.last_offset,
        )
        yield _counter(
            "kcoord_metadata_batches_applied_total",
            "Committed metadata batches applied to this node's image.",
            node.cache.applied_batches,
        )
        yield _gauge(
            "kcoord_metadata_last_applied_age_seconds",
            "Seconds since this node last applied a committed metadata batch (Kafka's "
            "last-applied-record-lag-ms, KIP-835): the active controller appends a NoOp every "
            "metadata.max.idle.interval.ms, so more than that means this node's metadata is "
            "stale.",
            max(0, node.cache.monotonic_ms() - node.cache.last_applied_ms) / 1000,
        )

    def _raft(self) -> Iterator[Metric]:
        quorum, monitor = self.node.quorum, self.node.monitor
        if quorum is None:
            return
        try:
            status = quorum.status()
        except Exception:
            # pysyncobj's getStatus iterates dicts its thread grows (at its first election):
            # this scrape goes without the Raft families, not without every family (an
            # error answer, which Prometheus takes for the node down). QuorumMonitor.sample
            # catches the same.
            log.debug("reading the quorum's status for /metrics failed", exc_info=True)
            return
        state = GaugeMetricFamily(
            "kcoord_raft_state",
            "This voter's Raft state: 1 for the current one of leader, follower, unattached "
            "(no leader known).",
            labels=["state"],
        )
        current = (
            "leader"
            if status.is_leader
            else "unattached"
            if status.leader_id is None
            else "follower"
        )
        for name in ("leader", "follower", "unattached"):
            state.add_metric([name], int(name == current))
        yield state
        yield _gauge(
            "kcoord_raft_leader_id",
            "The Raft leader's (active controller's) node id, -1 if unknown.",
            -1 if status.leader_id is None else status.leader_id,
        )
        yield _gauge("kcoord_raft_epoch", "The current Raft term (epoch).", status.epoch)
        yield _gauge(
            "kcoord_raft_commit_index",
            "The Raft commit index: the metadata log's high watermark.",
            status.commit_index,
        )
        yield _gauge(
            "kcoord_raft_last_applied", "The last Raft entry applied here.", status.last_applied
        )
        yield _gauge(
            "kcoord_raft_log_entries",
            "Entries in the Raft log (since the last snapshot).",
            status.log_size,
        )
        yield _gauge(
            "kcoord_raft_voters_connected",
            "Other voters this node is connected to.",
            len(status.connected),
        )
        match = GaugeMetricFamily(
            "kcoord_raft_voter_match_index",
            "On the leader: each follower's Raft match index.",
            labels=["voter"],
        )
        for voter, index in sorted(status.follower_match_index.items()):
            match.add_metric([str(voter)], index)
        yield match
        if monitor is not None:
            yield _counter(
                "kcoord_raft_leader_changes_total",
                "Changes of the Raft leader this node has seen (elections).",
                monitor.leader_changes,
            )

    def _controller(self) -> Iterator[Metric]:
        controller = self.node.controller
        if controller is None:
            return
        active = controller.is_active
        yield _gauge(
            "kcoord_controller_active", "1 if this node is the active controller.", int(active)
        )
        yield _counter(
            "kcoord_controller_activations_total",
            "Times this node became the active controller.",
            controller.activations,
        )
        yield _counter(
            "kcoord_controller_proposals_total",
            "Metadata record batches this node's controller proposed.",
            controller.proposals,
        )
        yield _counter(
            "kcoord_controller_proposal_failures_total",
            "Proposals that were not committed (leadership lost, timeout).",
            controller.proposal_failures,
        )
        latency = HistogramMetricFamily(
            "kcoord_controller_commit_latency_seconds",
            "From proposing a metadata batch to having it applied in this node's image.",
        )
        _add_histogram(latency, [], controller.commit_latency_s)
        yield latency
        yield _counter(
            "kcoord_controller_broker_fencings_total",
            "Brokers this node's controller fenced for missing heartbeats.",
            controller.fencings,
        )
        image = self.node.cache.image
        brokers = list(image.brokers.values())
        partitions = image.partition_count() if active else 0
        yield _gauge(
            "kcoord_controller_fenced_brokers",
            "On the active controller: registered brokers that are fenced.",
            sum(b.fenced for b in brokers) if active else 0,
        )
        yield _gauge(
            "kcoord_controller_active_brokers",
            "On the active controller: registered brokers that are unfenced.",
            sum(not b.fenced for b in brokers) if active else 0,
        )
        yield _gauge(
            "kcoord_controller_topics",
            "On the active controller: topics in the cluster.",
            len(image.topics) if active else 0,
        )
        yield _gauge(
            "kcoord_controller_partitions",
            "On the active controller: partitions in the cluster.",
            partitions,
        )
        yield _gauge(
            "kcoord_controller_offline_partitions",
            "On the active controller: partitions without a leader.",
            len(image.leaderless()) if active else 0,
        )

    # -----------------------------------------------------------------------------------------
    # Replication and storage.

    def partition_rows(self) -> list[PartitionRow]:
        """What the per-partition families show, read on the event loop (where the partitions
        live); ``partition_families`` builds them anywhere."""
        replicas = self.node.replicas
        if replicas is None:
            return []
        rows = []
        min_isr: dict[str, int] = {}  # by topic id: parsed once a scrape, not per partition
        for (topic, index), part in replicas.partitions.items():
            lg = part.log
            leads = part.is_leader
            if leads and part.topic_id not in min_isr:
                min_isr[part.topic_id] = replicas.configured_min_insync_replicas(part.topic_id)
            rows.append(
                PartitionRow(
                    topic,
                    index,
                    lg.log_end_offset,
                    part.high_watermark,
                    lg.log_start_offset,
                    leads,
                    len(lg.segments),
                    lg.size_bytes,
                    len(part.isr) if leads else -1,
                    len(part.replicas) if leads else -1,
                    leads
                    and len(part.isr)
                    < replicas.min_insync_replicas_for(part, min_isr[part.topic_id]),
                )
            )
        return rows

    def _replication(self, rows: list[PartitionRow]) -> Iterator[Metric]:
        replicas = self.node.replicas
        if replicas is None:
            return
        led = sum(1 for row in rows if row.is_leader)
        under_replicated = sum(1 for row in rows if row.is_leader and row.isr < row.replicas)
        under_min_isr = sum(1 for row in rows if row.under_min_isr)
        yield _gauge(
            "kcoord_replica_partitions", "Partitions hosted here.", len(replicas.partitions)
        )
        yield _gauge("kcoord_replica_leader_partitions", "Partitions this node leads.", led)
        yield _gauge(
            "kcoord_replica_under_replicated_partitions",
            "Partitions this node leads whose ISR is smaller than their replica set.",
            under_replicated,
        )
        yield _gauge(
            "kcoord_replica_under_min_isr_partitions",
            "Partitions this node leads whose ISR is below min.insync.replicas.",
            under_min_isr,
        )
        yield _counter(
            "kcoord_replica_isr_shrinks_total",
            "Committed ISR shrinks of partitions this node leads.",
            replicas.isr_shrinks,
        )
        yield _counter(
            "kcoord_replica_isr_expands_total",
            "Committed ISR expansions of partitions this node leads.",
            replicas.isr_expands,
        )
        appended = CounterMetricFamily(
            "kcoord_log_appended_bytes_total",
            "Bytes of record batches appended to logs here, as leader or as follower.",
            labels=["role"],
        )
        appended.add_metric(["leader"], replicas.leader_bytes_appended)
        appended.add_metric(["follower"], replicas.follower_bytes_appended)
        yield appended
        # Kafka's NumIncrementalFetchSessions; opened counts full requests that opened one.
        yield _gauge(
            "kcoord_replica_fetch_sessions",
            "Followers' fetch sessions (KIP-227) held here as leader.",
            len(replicas.fetch_sessions),
        )
        yield _counter(
            "kcoord_replica_fetch_sessions_opened_total",
            "Fetch sessions opened here: a follower's first fetch, or one after a lost session.",
            replicas.fetch_sessions.opened,
        )

    def _log_maintenance(self) -> Iterator[Metric]:
        maintenance = self.node.log_maintenance
        if maintenance is None:
            return
        stats = maintenance.stats
        yield _counter(
            "kcoord_log_retention_deleted_segments_total",
            "Segments deleted by retention (retention.ms, retention.bytes, log start).",
            stats.segments_deleted,
        )
        passes = CounterMetricFamily(
            "kcoord_log_cleaner_passes_total",
            "Log cleaner passes: swapped in, abandoned because the log changed meanwhile, or "
            "failed reading it.",
            labels=["result"],
        )
        # Counted when each pass ends: a scrape during a pass that then failed saw it cleaned,
        # and the series went down (a counter reset to rate()).
        passes.add_metric(["cleaned"], stats.cleaner_cleaned)
        passes.add_metric(["abandoned"], stats.cleaner_aborted)
        passes.add_metric(["failed"], stats.cleaner_failed)
        yield passes
        yield _counter(
            "kcoord_log_cleaner_read_bytes_total",
            "Bytes of segments the cleaner read.",
            stats.cleaned.bytes_read,
        )
        dropped = CounterMetricFamily(
            "kcoord_log_cleaner_dropped_records_total",
            "Records the cleaner removed: superseded by a later record of the same key (or "
            "keyless), or tombstones past delete.retention.ms.",
            labels=["kind"],
        )
        dropped.add_metric(
            ["superseded"],
            stats.cleaned.records_read
            - stats.cleaned.records_kept
            - stats.cleaned.tombstones_dropped,
        )
        dropped.add_metric(["tombstone"], stats.cleaned.tombstones_dropped)
        yield dropped
        yield _gauge(
            "kcoord_log_uncleanable_partitions",
            "Compacted partitions the cleaner set aside after finding a corrupt batch.",
            len(maintenance.uncleanable),
        )

    # -----------------------------------------------------------------------------------------
    # Group coordinator.

    def _coordinator(self, committed: CommittedOffsets) -> Iterator[Metric]:
        runtime = self.node.coordinator
        if runtime is None:
            return
        shard_states: Counter[str] = Counter()
        pending = waiting = 0
        for ctx in runtime.contexts.values():
            shard_states[ctx.state.value] += 1
            pending += len(ctx.futures)
            waiting += sum(len(d.responses) for d in ctx.deferred)
        family = GaugeMetricFamily(
            "kcoord_coordinator_shards",
            "Coordinator shards (led __consumer_offsets partitions) by state.",
            labels=["state"],
        )
        for state in (ShardState.LOADING, ShardState.ACTIVE):
            family.add_metric([state.value], shard_states[state.value])
        yield family
        family = GaugeMetricFamily(
            "kcoord_coordinator_groups",
            "Groups this node coordinates, by group protocol, protocol type and state.",
            labels=["protocol", "protocol_type", "state"],
        )
        for (protocol, protocol_type, group_state), n in sorted(committed.groups.items()):
            family.add_metric([protocol, protocol_type, group_state], n)
        yield family
        yield _gauge(
            "kcoord_coordinator_members",
            "Members of the groups this node coordinates.",
            committed.members,
        )
        yield _gauge(
            "kcoord_coordinator_committed_offsets",
            "Committed offsets held by the groups this node coordinates.",
            committed.count,
        )
        yield _gauge(
            "kcoord_coordinator_pending_requests",
            "Group requests not answered yet (parked joins and syncs, and those below).",
            pending,
        )
        yield _gauge(
            "kcoord_coordinator_responses_waiting_for_high_watermark",
            "Answers held until the high watermark passes the records they depend on.",
            waiting,
        )
        stats = runtime.stats
        yield _counter(
            "kcoord_coordinator_rebalances_started_total",
            "Group rebalances started (a group entering PreparingRebalance).",
            stats.rebalances_started,
        )
        yield _counter(
            "kcoord_coordinator_rebalances_completed_total",
            "Group rebalances completed (a group reaching Stable or Empty).",
            stats.rebalances_completed,
        )
        yield _counter(
            "kcoord_coordinator_consumer_group_rebalances_total",
            "KIP-848 consumer group rebalances (a new target assignment computed).",
            stats.consumer_group_rebalances,
        )
        duration = HistogramMetricFamily(
            "kcoord_coordinator_rebalance_duration_seconds",
            "From a rebalance's start to the group reaching Stable or Empty.",
        )
        _add_histogram(duration, [], stats.rebalance_duration_s)
        yield duration
        yield _counter(
            "kcoord_coordinator_offset_commits_total",
            "Partition offsets written by OffsetCommit.",
            stats.offset_commits,
        )
        errors = CounterMetricFamily(
            "kcoord_coordinator_offset_commit_errors_total",
            "OffsetCommit errors by Kafka error code (per request, or per partition for "
            "partition-level errors).",
            labels=["error"],
        )
        for code, n in sorted(stats.offset_commit_errors.items()):
            errors.add_metric([code.name], n)
        yield errors
        if runtime.offset_commit_latency_s is not None:
            latency = HistogramMetricFamily(
                "kcoord_coordinator_offset_commit_latency_seconds",
                "OffsetCommit requests, from arrival to the answer (the wait for the high "
                "watermark included).",
            )
            _add_histogram(latency, [], runtime.offset_commit_latency_s)
            yield latency
        expired = CounterMetricFamily(
            "kcoord_coordinator_expirations_total",
            "Expirations: offsets past their retention, groups deleted once Empty without "
            "offsets, members whose session timed out.",
            labels=["kind"],
        )
        expired.add_metric(["offset"], stats.offsets_expired)
        expired.add_metric(["group"], stats.groups_expired)
        expired.add_metric(["member"], stats.members_expired)
        yield expired
        loads = HistogramMetricFamily(
            "kcoord_coordinator_shard_load_duration_seconds",
            "Shard loads by kind: hot (promoted from a standby) or cold (whole log replayed).",
            labels=["kind"],
        )
        for hot, histogram in sorted(runtime.load_duration_s.items()):
            _add_histogram(loads, ["hot" if hot else "cold"], histogram)
        yield loads
        replayed = CounterMetricFamily(
            "kcoord_coordinator_records_replayed_total",
            "__consumer_offsets records replayed, by shard loads and by standbys.",
            labels=["by"],
        )
        replayed.add_metric(["load"], runtime.load_records_replayed)
        replayed.add_metric(["standby"], runtime.standby_records_replayed)
        yield replayed
        yield CounterMetricFamily(
            "kcoord_coordinator_shard_load_failures_total",
            "Shard loads that failed: the partition is not served (NOT_COORDINATOR) until its "
            "leadership changes.",
            value=runtime.load_failures,
        )
        yield CounterMetricFamily(
            "kcoord_coordinator_batches_appended_total",
            "Batches of coordinator writes appended to __consumer_offsets (one per "
            "group.coordinator.append.linger.ms window; Kafka's batch-flush-rate).",
            value=runtime.batches_appended,
        )
        yield CounterMetricFamily(
            "kcoord_coordinator_records_appended_total",
            "Records in the batches of kcoord_coordinator_batches_appended_total.",
            value=runtime.records_appended,
        )
        yield _gauge(
            "kcoord_coordinator_standby_shards",
            "Hot standby shards (followed __consumer_offsets partitions).",
            len(runtime.standbys),
        )
        lag = GaugeMetricFamily(
            "kcoord_coordinator_standby_lag_offsets",
            "How far each standby's replay is behind its partition's high watermark.",
            labels=["partition"],
        )
        for index, standby in sorted(runtime.standbys.items()):
            lag.add_metric(
                [str(index)], max(0, standby.partition.high_watermark - standby.next_offset)
            )
        yield lag

    # -----------------------------------------------------------------------------------------
    # The Kafka listener.

    def _requests(self) -> Iterator[Metric]:
        kafka = self.node.kafka
        if kafka is None:
            return
        server = kafka.server
        yield _gauge(
            "kcoord_kafka_connections", "Open client connections.", server.connection_count
        )
        yield _counter(
            "kcoord_kafka_connections_closed_for_errors_total",
            "Client connections closed for a protocol error.",
            server.connections_closed_for_errors,
        )
        yield _counter(
            "kcoord_kafka_connections_refused_total",
            "Client connections closed at once: max.connections (or half the open-files "
            "limit) were open.",
            server.connections_refused,
        )
        if self.node.rpc_server is not None:
            yield _gauge(
                "kcoord_rpc_connections",
                "Open inter-node RPC connections to this node.",
                self.node.rpc_server.connection_count,
            )
        stats = server.stats
        if stats is None:
            return  # metrics.enable=false
        yield _counter(
            "kcoord_kafka_connections_accepted_total",
            "Client connections accepted.",
            stats.connections_accepted,
        )
        yield _counter(
            "kcoord_kafka_received_bytes_total",
            "Bytes of requests received (frames with their size prefix).",
            stats.bytes_received,
        )
        yield _counter(
            "kcoord_kafka_sent_bytes_total", "Bytes of responses sent.", stats.bytes_sent
        )
        requests = CounterMetricFamily(
            "kcoord_kafka_requests_total", "Requests answered, by API.", labels=["api"]
        )
        for key, n in sorted(stats.requests.items()):
            requests.add_metric([api_name(key)], n)
        yield requests
        latency = HistogramMetricFamily(
            "kcoord_kafka_request_duration_seconds",
            "From a request read to its response ready (long polls and HW waits included).",
            labels=["api"],
        )
        for key, histogram in sorted(stats.latency_s.items()):
            _add_histogram(latency, [api_name(key)], histogram)
        yield latency
        errors = CounterMetricFamily(
            "kcoord_kafka_request_errors_total",
            "Responses with a top-level error code, by API and error.",
            labels=["api", "error"],
        )
        for (key, code), n in sorted(stats.errors.items()):
            errors.add_metric([api_name(key), error_name(code)], n)
        yield errors

    # -----------------------------------------------------------------------------------------
    # kafka_exporter-compatible consumer lag.

    def lag_partitions_led_elsewhere(self, partitions: Iterable[PartitionKey]) -> set[PartitionKey]:
        """Of the data partitions with committed offsets, those another node leads: the
        /metrics handler fetches their high watermarks before a scrape."""
        replicas = self.node.replicas
        led = replicas.partitions if replicas is not None else {}
        return {key for key in partitions if (part := led.get(key)) is None or not part.is_leader}

    def end_offsets(
        self, partitions: Iterable[PartitionKey], remote: Mapping[PartitionKey, int]
    ) -> dict[PartitionKey, int]:
        """The high watermark of each of ``partitions`` that is known: read here for those
        this node leads, else from their leaders' answers (``remote``)."""
        replicas = self.node.replicas
        led = replicas.partitions if replicas is not None else {}
        out: dict[PartitionKey, int] = {}
        for key in partitions:
            part = led.get(key)
            if part is not None and part.is_leader:
                out[key] = part.high_watermark
            elif (end := remote.get(key)) is not None:
                out[key] = end
        return out

    def _consumer_lag(self) -> Iterator[Metric]:
        node = self.node
        image = node.cache.image
        yield _gauge(
            "kafka_brokers",
            "Number of brokers in the cluster (registered and unfenced).",
            len(image.unfenced_broker_ids()),
        )
        topic_offset = GaugeMetricFamily(
            "kafka_topic_partition_current_offset",
            "Current offset (high watermark) of each partition this node leads.",
            labels=["topic", "partition"],
        )
        if node.replicas is not None:
            for (topic, index), part in sorted(node.replicas.partitions.items()):
                if part.is_leader and topic != OFFSETS_TOPIC:
                    topic_offset.add_metric([topic, str(index)], part.high_watermark)
        yield topic_offset


class _FamilyText:
    """One gauge family's lines, encoded a few thousand at a time: a thread holds the GIL for
    the whole of one join or encode, which for all of a large scrape's lines at once is
    hundreds of milliseconds of the event loop's time."""

    CHUNK_LINES: Final = 4096

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.chunks: list[bytes] = [f"# HELP {name} {doc}\n# TYPE {name} gauge\n".encode()]

    def add(self, labels: str, value: int) -> None:
        self.lines.append(f"{self.name}{{{labels}}} {value}\n")
        if len(self.lines) >= self.CHUNK_LINES:
            self.chunks.append("".join(self.lines).encode())
            self.lines.clear()

    def finish(self) -> list[bytes]:
        self.chunks.append("".join(self.lines).encode())
        return self.chunks


def consumer_lag_text(
    offsets: Committed,
    end_offsets: Mapping[PartitionKey, int],
    head: bytes = b"",
    group_members: Iterable[tuple[str, int]] = (),
) -> bytes:
    """``head``, then kafka_exporter's members family of each group (``group_members``), and
    its committed-offset and lag families of each group, partition and topic in the text
    format, written directly: one sample per committed offset, so a million of them as metric
    families and samples took 6.7 s; this runs off the event loop on what the scrape gathered
    on it (``NodeMetrics.scrape``). A partition with no known end has no lag series, and its
    topic no lag sum (a sum over the others would read as a lag drop)."""
    current = _FamilyText(
        "kafka_consumergroup_current_offset",
        "Committed offset of a consumer group in a partition.",
    )
    current_sum = _FamilyText(
        "kafka_consumergroup_current_offset_sum",
        "Sum of a consumer group's committed offsets in a topic.",
    )
    lag = _FamilyText(
        "kafka_consumergroup_lag",
        "Lag of a consumer group in a partition: high watermark minus committed offset.",
    )
    lag_sum = _FamilyText(
        "kafka_consumergroup_lag_sum", "Sum of a consumer group's lags in a topic."
    )
    members = _FamilyText("kafka_consumergroup_members", "Members of a consumer group.")
    for group_id, n in group_members:
        members.add(f'consumergroup="{group_id.translate(_LABEL_ESCAPES)}"', n)
    for group_id, topics in offsets.items():
        group = group_id.translate(_LABEL_ESCAPES)
        for topic, parts in topics.items():
            escaped = topic.translate(_LABEL_ESCAPES)
            offset_total = lag_total = 0
            lag_known = True
            for partition, offset in sorted(parts.items()):
                # Label names sorted, as ``exposition`` writes them.
                labels = f'consumergroup="{group}",partition="{partition}",topic="{escaped}"'
                current.add(labels, offset)
                offset_total += offset
                end = end_offsets.get((topic, partition))
                if end is None:
                    lag_known = False
                    continue
                lag.add(labels, end - offset)
                lag_total += end - offset
            labels = f'consumergroup="{group}",topic="{escaped}"'
            current_sum.add(labels, offset_total)
            if lag_known:
                lag_sum.add(labels, lag_total)
    chunks = [head]
    for family in (members, current, current_sum, lag, lag_sum):
        chunks += family.finish()
    return b"".join(chunks)


class PartitionRow(NamedTuple):
    """One hosted partition as the per-partition families show it (``isr`` and ``replicas``:
    -1 where this node only follows)."""

    topic: str
    partition: int
    log_end_offset: int
    high_watermark: int
    log_start_offset: int
    is_leader: bool
    segments: int
    size_bytes: int
    isr: int
    replicas: int
    under_min_isr: bool


def partition_families(rows: list[PartitionRow]) -> list[Metric]:
    """The per-partition families of ``rows``: pure, so a scrape builds them on a thread (at
    10,000 partitions building and writing them held the event loop ~270 ms a scrape)."""
    labels = ["topic", "partition"]
    leo = GaugeMetricFamily(
        "kcoord_partition_log_end_offset",
        "Log end offset of each partition hosted here.",
        labels=labels,
    )
    hw = GaugeMetricFamily(
        "kcoord_partition_high_watermark",
        "High watermark of each partition hosted here.",
        labels=labels,
    )
    start = GaugeMetricFamily(
        "kcoord_partition_log_start_offset",
        "Log start offset of each partition hosted here.",
        labels=labels,
    )
    leader = GaugeMetricFamily(
        "kcoord_partition_leader",
        "1 if this node leads the partition, 0 if it follows.",
        labels=labels,
    )
    isr = GaugeMetricFamily(
        "kcoord_partition_isr_size",
        "In-sync replicas of each partition this node leads.",
        labels=labels,
    )
    replication_factor = GaugeMetricFamily(
        "kcoord_partition_replicas",
        "Assigned replicas of each partition this node leads.",
        labels=labels,
    )
    segments = GaugeMetricFamily(
        "kcoord_log_segments", "Segments of each hosted partition's log.", labels=labels
    )
    size = GaugeMetricFamily(
        "kcoord_log_size_bytes", "Bytes in each hosted partition's log.", labels=labels
    )
    for row in rows:
        key = [row.topic, str(row.partition)]
        leo.add_metric(key, row.log_end_offset)
        hw.add_metric(key, row.high_watermark)
        start.add_metric(key, row.log_start_offset)
        leader.add_metric(key, int(row.is_leader))
        segments.add_metric(key, row.segments)
        size.add_metric(key, row.size_bytes)
        if row.is_leader:
            isr.add_metric(key, row.isr)
            replication_factor.add_metric(key, row.replicas)
    return [leo, hw, start, leader, isr, replication_factor, segments, size]


def _render(
    families: list[Metric],
    rows: list[PartitionRow],
    committed: CommittedOffsets,
    ends: Mapping[PartitionKey, int],
) -> bytes:
    """A scrape's text, off the event loop: the families built on it, those of each
    partition, and the consumer groups' members and lag."""
    head = exposition(itertools.chain(families, partition_families(rows)))
    return consumer_lag_text(committed.offsets, ends, head, committed.group_members)


class NodeMetrics:
    """The node's families: ``NodeCollector``'s, the consumer lag's, and prometheus_client's
    process, platform and GC collectors."""

    def __init__(self, node: Node) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = NodeCollector(node)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._scraping = asyncio.Lock()  # a scrape's committed view is the next one's "before"

    async def scrape(
        self,
        fetch_end_offsets: Callable[[set[PartitionKey]], Awaitable[Mapping[PartitionKey, int]]],
    ) -> bytes:
        """The text exposition format of every family, for the /metrics handler: the
        committed offsets gathered a shard per turn of the event loop, the high watermarks of
        partitions other nodes lead asked of them with ``fetch_end_offsets``, and the
        per-partition lag written on a thread."""
        async with self._scraping:
            collector = self.collector
            committed = await collector.committed_offsets()
            wanted = collector.lag_partitions_led_elsewhere(committed.partitions)
            remote = await fetch_end_offsets(wanted) if wanted else {}
            rows = collector.partition_rows()
            families = [*collector.families(committed, rows), *self.registry.collect()]
            ends = collector.end_offsets(committed.partitions, remote)
            return await asyncio.to_thread(_render, families, rows, committed, ends)


# Prometheus text format 0.0.4: HELP text escapes backslash and newline, label values also the
# double quote.
_HELP_ESCAPES: Final = str.maketrans({"\\": r"\\", "\n": r"\n"})
_LABEL_ESCAPES: Final = str.maketrans({"\\": r"\\", "\n": r"\n", '"': r"\""})
# OpenMetrics-only samples, which the text format carries as gauges of their own after the family.
_OPENMETRICS_SUFFIXES: Final = ("_created", "_gsum", "_gcount")
# How prometheus_client's OpenMetrics types are written in the text format.
_TEXT_TYPES: Final = {
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}


class _Escaped(dict[str, str]):
    """Label values and their escaped forms, filled as they are asked for."""

    def __missing__(self, value: str) -> str:
        escaped = self[value] = value.translate(_LABEL_ESCAPES)
        return escaped


def _sample_value(value: float) -> str:
    if type(value) is int:
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def exposition(families: Iterable[Metric]) -> bytes:
    """The families in Prometheus' text format 0.0.4, as ``generate_latest`` writes them.

    ``generate_latest`` checks every sample's metric and label names against the legacy name
    rules and escapes them: for the ~950 samples of a node (a partition's gauges, each API's
    latency buckets, each group's lag) 3.6 ms of the event loop, against 1.3 ms here. Here the
    names are not checked: they are this module's constants and those of prometheus_client's
    own collectors. Label values are escaped; label names are sorted, as there.
    """
    out: list[str] = []
    label_orders: dict[tuple[str, ...], tuple[str, ...]] = {}
    escaped = _Escaped()  # label values repeat (topics, partitions, APIs): escaped once
    for family in families:
        name, kind = family.name, family.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
        kind = _TEXT_TYPES.get(kind, kind)
        doc = family.documentation.translate(_HELP_ESCAPES)
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        trailing: dict[str, list[str]] = {}
        for sample in family.samples:
            labels = sample.labels
            if labels:
                keys = tuple(labels)
                order = label_orders.get(keys)
                if order is None:
                    order = label_orders[keys] = tuple(sorted(keys))
                pairs = ",".join([f'{k}="{escaped[labels[k]]}"' for k in order])
                line = f"{sample.name}{{{pairs}}} {_sample_value(sample.value)}"
            else:
                line = f"{sample.name} {_sample_value(sample.value)}"
            if sample.timestamp is not None:
                line += f" {int(float(sample.timestamp) * 1000)}"
            suffix = sample.name[len(family.name) :]
            if suffix in _OPENMETRICS_SUFFIXES and sample.name.startswith(family.name):
                trailing.setdefault(suffix, []).append(line + "\n")
            else:
                out.append(line + "\n")
        for suffix, lines in sorted(trailing.items()):
            out.append(f"# HELP {family.name}{suffix} {doc}\n# TYPE {family.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode()
