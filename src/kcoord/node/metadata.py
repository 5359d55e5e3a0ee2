"""The node's view of cluster metadata, on the event loop (Kafka's ``BrokerMetadataPublisher``).

The Raft thread hands every committed batch over with ``loop.call_soon_threadsafe`` (see
``QuorumBridge``); ``MetadataCache.apply`` replays it into the node's own ``MetadataImage`` in
offset order, derives this node's role changes (``become_leader`` / ``become_follower`` /
``stop_replica``, once per leader epoch) and passes them to the ``RoleListener`` (the node fans
them out to ``ReplicaRoles``, the ``ReplicaManager`` and the replica fetchers), then hands the
whole delta to every ``delta_listeners`` entry (the ReplicaManager picks up ISR changes there:
partition-epoch-only changes make no role change).

Coroutines can wait until the image has reached an offset (``wait_for_offset``): the controller
service answers a request only once the records it proposed are in this node's image.

A node starts its cache holding (``hold=True``): the image follows the metadata log, but
nothing is published until ``release``, at the node's initial catch-up, which publishes one
delta from the empty image to the image then (Kafka's ``MetadataLoader`` publishes nothing
while it catches up, and its first publish is such a delta). Published batch by batch, the
replay of a restarted node went through past states: it led old epochs alone in old ISRs (its
HW jumping to its log end, which the log cleaner read), followed old leaders, and took the log
of a topic deleted and created again under the same name for a stray of the first topic,
deleting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kcoord.node.clock import SYSTEM_CLOCK
from kcoord.raft import records as rec
from kcoord.raft.image import (
    BecomeFollower,
    BecomeLeader,
    MetadataApplyError,
    MetadataDelta,
    MetadataImage,
    RoleChange,
    StopReplica,
    TopicIdPartition,
    diff,
    role_changes,
)

log = logging.getLogger(__name__)


class RoleListener(Protocol):
    def on_role_changes(self, changes: list[RoleChange]) -> None: ...


@dataclass(slots=True)
class PartitionRole:
    topic_name: str
    partition: int
    role: str  # "leader" | "follower" | "stopped"
    leader: int
    leader_epoch: int


@dataclass(slots=True)
class ReplicaRoles:
    """Records this node's role per partition, as instructed by the metadata log."""

    node_id: int
    roles: dict[TopicIdPartition, PartitionRole] = field(default_factory=dict)
    history: list[RoleChange] = field(default_factory=list)
    history_limit: int = 10_000

    def on_role_changes(self, changes: list[RoleChange]) -> None:
        for change in changes:
            tp = change.tp
            if isinstance(change, BecomeLeader):
                self.roles[tp] = PartitionRole(
                    change.topic_name, tp.partition, "leader", self.node_id, change.leader_epoch
                )
            elif isinstance(change, BecomeFollower):
                self.roles[tp] = PartitionRole(
                    change.topic_name, tp.partition, "follower", change.leader, change.leader_epoch
                )
            elif isinstance(change, StopReplica):
                self.roles.pop(tp, None)
            self.history.append(change)
        if len(self.history) > self.history_limit:
            del self.history[: len(self.history) - self.history_limit]

    def led(self) -> list[PartitionRole]:
        return [r for r in self.roles.values() if r.role == "leader"]


class MetadataCache:
    def __init__(
        self,
        node_id: int,
        listener: RoleListener,
        *,
        hold: bool = False,
        monotonic_ms: Callable[[], int] = SYSTEM_CLOCK.monotonic_ms,
    ) -> None:
        self.node_id = node_id
        self.monotonic_ms = monotonic_ms
        self.image = MetadataImage()
        self.listener = listener
        # Nothing is published before ``release`` (see the module docstring).
        self.holding = hold
        # Called with every applied delta, after the role changes it made.
        self.delta_listeners: list[Callable[[MetadataDelta], None]] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.applied_batches = 0
        self.skipped_batches = 0
        # When this node last applied a committed batch or a snapshot (its start before the
        # first): with the active controller's NoOp every metadata.max.idle.interval.ms
        # (KIP-835), a node that follows the log applies one at least that often, and the
        # time since is its metadata's staleness (Kafka's last-applied-record-lag-ms).
        self.last_applied_ms = monotonic_ms()

    @property
    def offset(self) -> int:
        return self.image.last_offset

    def apply(self, offset: int, records: list[rec.MetadataRecord]) -> None:
        """Replay one committed batch; the Raft thread already checked it applies."""
        try:
            delta = self.image.apply_batch(offset, records)
        except MetadataApplyError as e:
            # The quorum's image refused nothing it passed on, so this is a divergence bug.
            self.skipped_batches += 1
            log.error("metadata offset %d did not apply to the node image: %s", offset, e)
            return
        self.applied_batches += 1
        self.last_applied_ms = self.monotonic_ms()
        self._publish(delta)

    def load_snapshot(
        self, offset: int, records: list[rec.MetadataRecord], image: MetadataImage | None = None
    ) -> None:
        """Replace the image with a snapshot's: ``image`` if given (the quorum's, parsed
        already), else one replayed from ``records``."""
        if offset < self.image.last_offset:
            # None should be (pysyncobj's leader sends a snapshot only to a follower behind
            # its log start), but the quorum installs whatever pysyncobj hands it without a
            # check, so this is the check: taken, it would publish leadership this node lost
            # since, at an older epoch.
            log.error(
                "metadata snapshot at %d is older than the image at %d: not loaded",
                offset,
                self.image.last_offset,
            )
            return
        try:
            delta = (
                self.image.load_snapshot(offset, records)
                if image is None
                else self.image.replace_with(image)
            )
        except MetadataApplyError as e:
            log.error("metadata snapshot at %d did not load: %s", offset, e)
            return
        log.info("metadata image replaced by the snapshot at offset %d", offset)
        self.last_applied_ms = self.monotonic_ms()
        self._publish(delta)

    def release(self) -> None:
        """Stop holding: publish the image as one delta from the empty image."""
        if not self.holding:
            return
        self.holding = False
        log.info("publishing the metadata image at offset %d", self.image.last_offset)
        self._publish(diff(MetadataImage(), self.image))

    def _publish(self, delta: MetadataDelta) -> None:
        if self.holding:
            self._wake_waiters()
            return
        changes = role_changes(delta, self.node_id)
        if changes:
            try:
                self.listener.on_role_changes(changes)
            except Exception:
                log.exception("role listener failed at metadata offset %d", delta.offset)
        for delta_listener in self.delta_listeners:
            try:
                delta_listener(delta)
            except Exception:
                log.exception("delta listener failed at metadata offset %d", delta.offset)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        ready = [(o, f) for o, f in self._waiters if o <= self.image.last_offset]
        if ready:
            self._waiters = [(o, f) for o, f in self._waiters if o > self.image.last_offset]
            for _, fut in ready:
                if not fut.done():
                    fut.set_result(None)

    async def wait_for_offset(self, offset: int) -> None:
        if self.image.last_offset >= offset:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, fut))
        await fut


class LogPreparer(Protocol):
    def logs_to_create(self, records: Sequence[rec.MetadataRecord]) -> Sequence[object]: ...

    async def create_logs_ahead(self, records: Sequence[rec.MetadataRecord]) -> None: ...


_Apply = Callable[[int, list[rec.MetadataRecord]], None]


def _load_snapshot(
    cache: MetadataCache, image: MetadataImage, offset: int, records: list[rec.MetadataRecord]
) -> None:
    cache.load_snapshot(offset, records, image)


class QuorumBridge:
    """A ``QuorumListener`` that moves every callback from the Raft thread onto the loop.

    Batches are applied in offset order. One that gives this node new partitions first has
    ``prepare`` create their logs off the loop (``ReplicaManager.create_logs_ahead``); the
    batches behind it wait their turn, the loop does not.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        cache: MetadataCache,
        on_state_changed: Callable[[], None],
        prepare: LogPreparer | None = None,
    ) -> None:
        self.loop = loop
        self.cache = cache
        self._on_state_changed = on_state_changed
        self.prepare = prepare
        self._pending: deque[tuple[_Apply, int, list[rec.MetadataRecord]]] = deque()
        self._draining: asyncio.Task[None] | None = None
        self.closed = False

    def close(self) -> None:
        """Apply nothing more: the node is stopping, and the parts a batch reaches (the
        coordinator, fetchers, replica manager) are closing; a batch the Raft thread still
        hands over (a controlled shutdown's leaderships moving away) would start shard loads
        and standby replays on them."""
        self.closed = True
        self._pending.clear()
        if self._draining is not None:
            # Its creation of logs ahead stops after the log it is making (create_logs_ahead).
            self._draining.cancel()

    async def wait_closed(self) -> None:
        """Once ``close``: until the logs being created ahead are made or given up, so that
        nothing writes the data directory after the node let its lock go."""
        draining = self._draining
        if draining is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await draining

    def on_committed(self, offset: int, records: list[rec.MetadataRecord]) -> None:
        self.loop.call_soon_threadsafe(self._submit, self.cache.apply, offset, records)

    def on_snapshot_loaded(
        self, offset: int, records: list[rec.MetadataRecord], image: MetadataImage
    ) -> None:
        load = functools.partial(_load_snapshot, self.cache, image)
        self.loop.call_soon_threadsafe(self._submit, load, offset, records)

    def _submit(self, apply: _Apply, offset: int, records: list[rec.MetadataRecord]) -> None:
        if self.closed:
            return
        if not self._pending and (
            # Held batches host nothing yet: their logs are made at the release.
            self.prepare is None or self.cache.holding or not self.prepare.logs_to_create(records)
        ):
            apply(offset, records)  # the usual batch: applied at once, as it came
            return
        self._pending.append((apply, offset, records))
        if self._draining is None:
            self._draining = self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._pending:
                apply, offset, records = self._pending[0]
                if self.prepare is not None:
                    try:
                        await self.prepare.create_logs_ahead(records)
                    except Exception:
                        # The role changes create what is still missing, on the loop.
                        log.exception("creating logs ahead of metadata offset %d failed", offset)
                if self.closed:
                    return
                self._pending.popleft()
                try:
                    apply(offset, records)
                except Exception:
                    log.exception("metadata offset %d: applying it failed", offset)
        finally:
            self._draining = None

    def on_state_changed(self) -> None:
        self.loop.call_soon_threadsafe(self._on_state_changed)
