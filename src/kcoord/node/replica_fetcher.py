"""Followers' fetchers: one task per leader node pulls every partition this node follows there
(Kafka's ``ReplicaFetcherManager`` / ``ReplicaFetcherThread``).

Theory of operation
-------------------
``on_role_changes`` (after the ReplicaManager applied them) starts a fetcher for every leader
node this node now follows a partition of; a fetcher ends when it has no partition left. Each
round of a fetcher:

1. Truncation (KIP-101/279). Partitions with ``truncation_pending`` (a new leader epoch, or a
   fetch that found a divergence) ask the leader ``EpochEndOffset`` for their latest epoch and
   truncate to where both logs agree (Kafka's ``AbstractFetcherThread.getOffsetTruncationState``):
   the leader knows our epoch -> truncate to min(its end offset, our LEO), done; the leader
   answers an older epoch -> truncate to our own end of that epoch and ask again, epoch by
   epoch, until the logs agree; the leader knows no epoch at or below ours -> truncate to our
   HW. Only then does the partition fetch.
2. ``ReplicaFetch`` with every ready partition (fetch offset = our LEO, our leader epoch and
   last fetched epoch, our HW and log start), long-polling up to ``replica.fetch.wait.max.ms``;
   in a fetch session (KIP-227, cluster/fetch_session.py; one per leader) the request names
   only the partitions whose fetch state changed since the previous one, and the answer names
   only the partitions with something to apply. Records are
   appended with ``Log.append_as_follower``; the HW becomes min(leader HW, our LEO); the log
   start follows the leader's. ``OFFSET_OUT_OF_RANGE`` below the leader's log start restarts
   the log there (``truncate_fully_and_start_at``); a ``diverging_epoch`` truncates as above.
   ``FENCED_LEADER_EPOCH`` / ``UNKNOWN_LEADER_EPOCH`` / ``NOT_LEADER_OR_FOLLOWER`` back the
   partition off until the metadata catches up on one side or the other.

An answer is applied to a partition only if it is still a follower of the same leader epoch
and log as when the request left; everything else about it is dropped.

A fetcher does not rebuild the fetch state of every partition it follows for every request:
what moves a follower's fetch state is its own doing (an answer applied, a truncation) or a
role change, so it rebuilds only the partitions of the previous answer, and all of them when
the partitions it fetches change (a role change, a truncation, a back-off) and every
``FULL_REBUILD_INTERVAL_S`` (a log start moved by retention). Its session handler then looks
only at those (``FetchSessionHandler.request_changes``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from kcoord.cluster.fetch_session import FetchItem, FetchSessionHandler, TopicPartition
from kcoord.errors import Errors
from kcoord.node.config import registered_endpoint
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_manager import Partition, ReplicaManager
from kcoord.node.rpc import (
    MAX_ANSWER_BYTES,
    RpcClient,
    RpcClientError,
    RpcClientPool,
    RpcRemoteError,
)
from kcoord.raft.image import RoleChange
from kcoord.storage import format as fmt
from kcoord.storage.epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from kcoord.storage.log import InvalidRecordError, Log, UnexpectedAppendOffsetError
from kcoord.storage.segment import LogCorruptError

log = logging.getLogger(__name__)

_BACKOFF_ERRORS = frozenset(
    {
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.KAFKA_STORAGE_ERROR,
        Errors.INCONSISTENT_TOPIC_ID,  # until the deletion reaches this node's metadata
    }
)


# How often a fetcher rebuilds the fetch state of every partition it fetches (module docstring).
FULL_REBUILD_INTERVAL_S: Final = 1.0
# An error answer from a leader (see _run) is logged at most this often per leader.
REMOTE_ERROR_LOG_EVERY_S: Final = 60.0


class _Fetched(NamedTuple):
    """A partition as a request left: the answer is applied only to the same epoch and log."""

    part: Partition
    leader_epoch: int
    log: Log
    item: FetchItem

    @classmethod
    def of(cls, part: Partition) -> _Fetched:
        lg, leader_epoch = part.log, part.leader_epoch
        item = FetchItem(
            part.topic,
            part.partition,
            lg.log_end_offset,
            leader_epoch,
            lg.epoch_cache.latest_epoch,
            part.high_watermark,
            lg.log_start_offset,
            part.topic_id,
        )
        return cls(part, leader_epoch, lg, item)


@dataclass
class _FetchState:
    """A fetcher's partitions as its latest request left, and those to rebuild. ``items``
    holds each ``fetched`` entry's item, kept alongside so that a request does not build a
    dict of every partition to hand the session handler."""

    parts: list[Partition]
    fetched: dict[TopicPartition, _Fetched]
    rebuild_all_at: float
    items: dict[TopicPartition, FetchItem] = field(init=False)
    dirty: set[TopicPartition] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.items = {tp: f.item for tp, f in self.fetched.items()}

    def rebuild_dirty(self) -> None:
        fetched, items = self.fetched, self.items
        for tp in self.dirty:
            found = fetched.get(tp)
            if found is not None:
                fetched[tp] = again = _Fetched.of(found.part)
                items[tp] = again.item


class ReplicaFetcherManager:
    def __init__(
        self,
        node_id: int,
        replicas: ReplicaManager,
        cache: MetadataCache,
        rpc_pool: RpcClientPool,
        broker_epoch: Callable[[], int | None],
        *,
        max_wait_ms: int = 500,
        max_bytes: int = 1024 * 1024,
        backoff_ms: int = 200,
        rpc_timeout_s: float = 2.0,
    ) -> None:
        self.node_id = node_id
        self.replicas = replicas
        self.cache = cache
        self.rpc_pool = rpc_pool
        self.broker_epoch = broker_epoch
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.backoff_ms = backoff_ms
        self.rpc_timeout_s = rpc_timeout_s
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        # One fetch session per leader (KIP-227): a request names only what changed.
        self._sessions: dict[int, FetchSessionHandler] = {}
        # (topic, partition) -> loop time before which it is not fetched (after an error).
        self._backoff_until: dict[tuple[str, int], float] = {}
        self._closed = False
        # Per leader: the partitions followed there, as of ``_roles_version``.
        self._roles_version = 0
        self._remote_error_logged: dict[int, float] = {}  # leader id -> loop time
        self._followed_by_leader: dict[int, tuple[int, list[Partition]]] = {}
        self._fetch_states: dict[int, _FetchState] = {}

    # -----------------------------------------------------------------------------------------
    # Fetchers per leader.

    def on_role_changes(self, changes: list[RoleChange]) -> None:
        self._roles_version += 1
        # A partition given a new role starts with no back-off (AbstractFetcherThread's
        # addPartitions: a fresh PartitionFetchState): its old leader's errors do not delay
        # the new one's truncation.
        for change in changes:
            self._backoff_until.pop((change.topic_name, change.tp.partition), None)
        self.maybe_start_fetchers()

    def maybe_start_fetchers(self) -> None:
        if self._closed:
            return
        for leader_id in {p.leader_id for p in self._followed()}:
            task = self._fetchers.get(leader_id)
            if task is None or task.done():
                self._fetchers[leader_id] = asyncio.get_running_loop().create_task(
                    self._run(leader_id), name=f"replica-fetcher-{leader_id}"
                )

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._fetchers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _followed(self, leader_id: int | None = None) -> list[Partition]:
        return [
            p
            for p in self.replicas.partitions.values()
            if not p.is_leader
            and p.leader_id >= 0
            and p.leader_id != self.node_id
            and (leader_id is None or p.leader_id == leader_id)
        ]

    def _client(self, leader_id: int) -> RpcClient | None:
        broker = self.cache.image.broker(leader_id)
        rpc = registered_endpoint(broker.endpoints if broker is not None else None, "rpc")
        if rpc is None:
            return None
        return self.rpc_pool.get(rpc.host, rpc.port)

    def _followed_from(self, leader_id: int) -> list[Partition]:
        """``_followed(leader_id)``, the same list until the roles change."""
        cached = self._followed_by_leader.get(leader_id)
        if cached is not None and cached[0] == self._roles_version:
            return cached[1]
        parts = self._followed(leader_id)
        self._followed_by_leader[leader_id] = (self._roles_version, parts)
        return parts

    async def _run(self, leader_id: int) -> None:
        log.info("replica fetcher for leader %d started", leader_id)
        while True:
            parts = self._followed_from(leader_id)
            if not parts:
                log.info("replica fetcher for leader %d stopped: nothing to follow", leader_id)
                # What it kept of the leader goes with it (Kafka's idle fetcher thread shut
                # down): its fetch state held the partitions and logs it last fetched, deleted
                # ones too, and a fetcher started again opens a session of its own.
                for kept in (self._fetch_states, self._sessions, self._followed_by_leader):
                    kept.pop(leader_id, None)
                return
            try:
                await self._step(leader_id, parts)
            except asyncio.CancelledError:
                raise
            except RpcRemoteError as e:
                # The leader answered, with an error (a method or shape it does not take: a node
                # of another version): retried as any failure, but said, once a minute.
                now = asyncio.get_running_loop().time()
                if now - self._remote_error_logged.get(leader_id, -REMOTE_ERROR_LOG_EVERY_S) >= (
                    REMOTE_ERROR_LOG_EVERY_S
                ):
                    self._remote_error_logged[leader_id] = now
                    log.warning("fetch from leader %d refused: %s (retrying)", leader_id, e)
                await asyncio.sleep(self.backoff_ms / 1000)  # the fetch backoff
            except (RpcClientError, OSError) as e:
                log.debug("fetch from leader %d failed: %s", leader_id, e)
                await asyncio.sleep(self.backoff_ms / 1000)  # the fetch backoff
            except Exception:
                log.exception("replica fetcher for leader %d failed", leader_id)
                await asyncio.sleep(self.backoff_ms / 1000)  # the fetch backoff

    async def _step(self, leader_id: int, parts: list[Partition]) -> None:
        client = self._client(leader_id)
        if client is None:
            await asyncio.sleep(self.backoff_ms / 1000)  # the leader's endpoint is not known yet
            return
        now = asyncio.get_running_loop().time()
        if self._backoff_until:  # a back-off over is forgotten, so a quiet partition's too
            self._backoff_until = {tp: t for tp, t in self._backoff_until.items() if t > now}
        # A partition backing off is not asked to truncate either (PartitionFetchState's
        # isTruncating: truncating and not delayed): its leader's error was asked again
        # every round, each fetch of the others behind it.
        truncating = [
            p for p in parts if p.truncation_pending and self._backoff_until.get(p.tp, 0.0) <= now
        ]
        if truncating:
            await self._truncate(client, truncating)
            now = asyncio.get_running_loop().time()
        if truncating or self._backoff_until:
            ready = [
                p
                for p in parts
                if not p.truncation_pending and self._backoff_until.get(p.tp, 0.0) <= now
            ]
        else:
            ready = parts  # the same list: the fetch state need not be rebuilt in full
        if not ready:
            await asyncio.sleep(self.backoff_ms / 1000)  # every partition is backing off
            return
        await self._fetch(leader_id, client, ready)

    # -----------------------------------------------------------------------------------------
    # Truncation (KIP-101/279).

    async def _truncate(self, client: RpcClient, parts: list[Partition]) -> None:
        # Each partition at the epoch and log it had when given to this leader's fetcher: one
        # that moved to another leader between rounds (truncation pending again, for the new
        # one) was asked of this one, whose error backed it off for the new leader's fetcher.
        given = {p.tp: (p.leader_epoch, p.log) for p in parts}
        for _ in range(100):  # one round per epoch the logs disagree on; bounded for safety
            pending: list[tuple[Partition, int, int, Any]] = []
            dropped: set[TopicPartition] = set()  # out of the next rounds (one pass a round)
            for p in parts:
                if not p.truncation_pending or not self._still_following(p, *given[p.tp]):
                    continue
                epoch = p.log.epoch_cache.latest_epoch
                if epoch == UNDEFINED_EPOCH:
                    # Nothing in our log carries an epoch: nothing to ask the leader about.
                    # What lies above our HW may not be the leader's, so it goes (Kafka's
                    # ReplicaManager.initialFetchOffset: such a log is fetched from its HW):
                    # the step taken when the leader knows no epoch of ours.
                    try:
                        self._truncate_step(
                            p, UNDEFINED_EPOCH, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
                        )
                    except OSError as e:
                        self.replicas.log_dir_failure.fail(f"truncating {p.topic}-{p.partition}", e)
                        self._back_off(p, Errors.KAFKA_STORAGE_ERROR)
                        dropped.add(p.tp)
                        continue
                    p.truncation_pending = False
                    continue
                pending.append((p, p.leader_epoch, epoch, p.log))
            if not pending:
                return
            reply = await client.call(
                "EpochEndOffset",
                {
                    "replica_id": self.node_id,
                    "partitions": [
                        {
                            "topic": p.topic,
                            "topic_id": p.topic_id,
                            "partition": p.partition,
                            "leader_epoch": leader_epoch,
                            "epoch": epoch,
                        }
                        for p, leader_epoch, epoch, _ in pending
                    ],
                },
                self.rpc_timeout_s,
            )
            for (p, leader_epoch, epoch, lg), r in zip(pending, reply["partitions"], strict=True):
                if not self._still_following(p, leader_epoch, lg):
                    # Not this round's to truncate any more: asked again, the old leader
                    # answered each of the 100 rounds, and its error backed off the
                    # partition for the new leader's fetcher too (AbstractFetcherThread
                    # truncates only the partitions it still fetches, at their epoch).
                    dropped.add(p.tp)
                    continue
                error = Errors.of(r["error"])
                if error is not Errors.NONE:
                    self._back_off(p, error)
                    dropped.add(p.tp)
                    continue
                try:
                    done = self._truncate_step(p, epoch, int(r["epoch"]), int(r["end_offset"]))
                except OSError as e:
                    self.replicas.log_dir_failure.fail(f"truncating {p.topic}-{p.partition}", e)
                    self._back_off(p, Errors.KAFKA_STORAGE_ERROR)
                    dropped.add(p.tp)
                    continue
                if done:
                    p.truncation_pending = False
            parts = [q for q in parts if q.tp not in dropped]

    def _truncate_step(
        self, part: Partition, requested_epoch: int, leader_epoch: int, leader_end_offset: int
    ) -> bool:
        """One step of Kafka's ``getOffsetTruncationState``; True once the logs agree."""
        lg = part.log
        log_end_offset = lg.log_end_offset
        if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
            # The leader knows no epoch at or below ours: truncate to the initial fetch offset
            # (AbstractFetcherThread.getOffsetTruncationState), which is the log end for a log
            # with epochs and the HW for one without (initialFetchOffset). Cutting a log with
            # epochs to its HW dropped records the leader had committed above it.
            has_epochs = lg.epoch_cache.latest_epoch != UNDEFINED_EPOCH
            target, done = (log_end_offset if has_epochs else part.high_watermark), True
        elif leader_epoch == requested_epoch:
            target, done = min(leader_end_offset, log_end_offset), True
        else:
            own_epoch, own_end = lg.epoch_cache.end_offset_for(leader_epoch, log_end_offset)
            if own_epoch == UNDEFINED_EPOCH:
                target, done = min(leader_end_offset, log_end_offset), True
            elif own_epoch != leader_epoch:
                # We do not know the leader's epoch: cut to the end of our older epochs, ask again.
                target, done = min(own_end, log_end_offset), False
            else:
                target, done = min(own_end, leader_end_offset, log_end_offset), True
        if target >= log_end_offset:
            lg.truncate_to(target)  # no records go; epochs of ours starting at the end do
        else:
            new_end = lg.truncate_to(max(target, 0))
            part.reset_high_watermark_to_log_end()
            log.info(
                "%s-%d: truncated from %d to %d (leader epoch %d ends at %d for our epoch %d)",
                part.topic,
                part.partition,
                log_end_offset,
                new_end,
                leader_epoch,
                leader_end_offset,
                requested_epoch,
            )
        if not done and lg.epoch_cache.latest_epoch >= requested_epoch:
            # Truncation removed nothing of the epoch we asked about: stop rather than loop.
            done = True
        return done

    # -----------------------------------------------------------------------------------------
    # Fetching.

    def _fetch_state(self, leader_id: int, parts: list[Partition]) -> tuple[_FetchState, bool]:
        """The fetch state for a request to ``parts``, and whether it was rebuilt in full."""
        now = asyncio.get_running_loop().time()
        state = self._fetch_states.get(leader_id)
        if state is None or state.parts is not parts or now >= state.rebuild_all_at:
            state = _FetchState(
                parts, {p.tp: _Fetched.of(p) for p in parts}, now + FULL_REBUILD_INTERVAL_S
            )
            self._fetch_states[leader_id] = state
            return state, True
        state.rebuild_dirty()
        return state, False

    async def _fetch(self, leader_id: int, client: RpcClient, parts: list[Partition]) -> None:
        state, rebuilt = self._fetch_state(leader_id, parts)
        fetched = state.fetched
        session = self._sessions.setdefault(leader_id, FetchSessionHandler())
        if rebuilt:
            fields = session.request(state.items.values())
        else:
            fields = session.request_changes(state.items, state.dirty)
        state.dirty = set()
        request = {
            "replica_id": self.node_id,
            "replica_epoch": self.broker_epoch() or -1,
            "max_wait_ms": self.max_wait_ms,
            "max_bytes": self.max_bytes,
            **fields,
        }
        try:
            reply = await client.call(
                "ReplicaFetch",
                request,
                self.max_wait_ms / 1000 + self.rpc_timeout_s,
                # Its first batch comes whole, however large (Kafka's fetch): up to what a
                # produce request may carry, past the RPC's usual 64 MiB.
                max_answer_bytes=MAX_ANSWER_BYTES,
            )
        except BaseException:
            session.reset()  # the leader may or may not have taken this request
            raise
        error = session.handle_response(reply)
        if error is not Errors.NONE:
            # The leader lost the session (it restarted, say): the next request is full.
            log.info("fetch session with leader %d ended: %s", leader_id, error.name)
            return
        # The answer names only the partitions with something to apply (we sent our HW and
        # log start, so the leader knows what we have).
        with self.replicas.one_log_start_checkpoint():
            self._apply(reply, fetched, state)

    def _apply(
        self, reply: Any, fetched: dict[TopicPartition, _Fetched], state: _FetchState
    ) -> None:
        for r in reply["partitions"]:
            tp = (str(r["topic"]), int(r["partition"]))
            found = fetched.get(tp)
            if found is None:
                continue  # not asked for: a confused leader; nothing to apply
            state.dirty.add(tp)  # whatever happens to it next, its fetch state is rebuilt
            p, leader_epoch, lg, item = found
            fetch_offset = item.fetch_offset
            if not self._still_following(p, leader_epoch, lg) or lg.log_end_offset != fetch_offset:
                continue
            try:
                self._process(p, fetch_offset, r)
            except OSError as e:
                self.replicas.log_dir_failure.fail(
                    f"appending fetched data to {p.topic}-{p.partition}", e
                )
                p.truncation_pending = True
                self._back_off(p, Errors.KAFKA_STORAGE_ERROR)
            except (
                UnexpectedAppendOffsetError,
                InvalidRecordError,
                fmt.RecordFormatError,
                LogCorruptError,
            ) as e:
                log.error("%s-%d: cannot append fetched data: %s", p.topic, p.partition, e)
                p.truncation_pending = True
                self._back_off(p, Errors.KAFKA_STORAGE_ERROR)

    def _process(self, part: Partition, fetch_offset: int, r: Any) -> None:
        error = Errors.of(r["error"])
        lg = part.log
        if error is Errors.OFFSET_OUT_OF_RANGE:
            leader_end, leader_start = int(r["log_end_offset"]), int(r["log_start_offset"])
            # Kafka's fetchOffsetAndTruncate: cut to the leader's log end when ours is past it;
            # restart the log at the leader's log start only when that is past our log end.
            if leader_end >= 0 and fetch_offset > leader_end:
                lg.truncate_to(leader_end)
                part.reset_high_watermark_to_log_end()
            elif leader_start > fetch_offset:
                log.info(
                    "%s-%d: restarting the log at %d", part.topic, part.partition, leader_start
                )
                lg.truncate_fully_and_start_at(leader_start)
                part.high_watermark = leader_start
            else:
                # The leader holds our position and still refused it (it cannot place our last
                # epoch): Kafka keeps the log and asks again; the log of a replica perhaps in
                # the ISR is not thrown away for it. Asked again after the back-off.
                self._back_off(part, error)
            return
        if error is not Errors.NONE:
            self._back_off(part, error)
            return
        self._backoff_until.pop(part.tp, None)
        diverging = r.get("diverging_epoch")
        if diverging is not None:
            requested = lg.epoch_cache.latest_epoch
            if not self._truncate_step(
                part, requested, int(diverging["epoch"]), int(diverging["end_offset"])
            ):
                part.truncation_pending = True
            return
        records = r["records"]
        if records:
            first = fmt.parse_header(records)
            end = lg.log_end_offset
            if first.base_offset < end <= first.last_offset and (
                end == lg.log_start_offset or end <= int(r["log_start_offset"])
            ):
                # The fetch offset is the leader's log start, which DeleteRecords put inside a
                # batch: the batch comes whole, from below it. Kafka's
                # Partition.appendRecordsToFollowerOrFutureReplica starts an empty log at the
                # batch instead (the leader's log start is applied below); refused, the
                # follower fetched the same batch for ever. So does a log holding records
                # below that start (a replica back from being down; Kafka's fetcher fails the
                # partition): the leader has none of them any more, and the log restarts too.
                lg.truncate_fully_and_start_at(first.base_offset)
            lg.append_as_follower(records, self.replicas.now_ms())
            self.replicas.follower_bytes_appended += len(records)
        if lg.maybe_increment_log_start_offset(int(r["log_start_offset"])):
            # At once, not on a timer: the leader's DeleteRecords answer counts this replica's
            # log start once its next fetch reports it, so it must survive a crash by then.
            self.replicas.checkpoint_log_start_offsets()
        self.replicas.follow_leader_high_watermark(part, int(r["high_watermark"]))

    # -----------------------------------------------------------------------------------------

    def _still_following(self, part: Partition, leader_epoch: int, lg: object) -> bool:
        current = self.replicas.partitions.get(part.tp)
        return (
            current is part
            and not part.is_leader
            and part.leader_epoch == leader_epoch
            and part.log is lg
        )

    def _back_off(self, part: Partition, error: Errors) -> None:
        if error not in _BACKOFF_ERRORS:
            log.warning("%s-%d: fetch answered %s", part.topic, part.partition, error.name)
        self._backoff_until[part.tp] = asyncio.get_running_loop().time() + self.backoff_ms / 1000
