"""Partitions hosted by this node: logs, roles and high watermarks (Kafka's ``ReplicaManager``).

Theory of operation
-------------------
The metadata log says which partitions this node hosts and in which role (``on_role_changes``:
``become_leader`` / ``become_follower`` / ``stop_replica``, once per leader epoch). A hosted
partition is a ``Partition``: its ``Log`` (storage), its role and leader epoch, and its high
watermark (HW), the offset below which records are committed and visible to consumers and to the
group coordinator.

Writes go through the leader only (``append``); ``acks=all`` (-1) waits until the HW passes the
appended batch, ``acks=1`` answers once the leader's log has it, ``acks=0`` is answered by
nobody. Reads (``fetch``) see records below the HW (consumers) or below the log end (replicas).
HW listeners (the coordinator runtime) are told every time the HW of a partition moves.

Replication across nodes is not built yet: until it is, a leader's ISR is itself alone and
its HW moves to its log end offset after each append (``_maybe_advance_high_watermark`` is
where "min LEO over the ISR" will go). Everything above already waits for the HW, so
nothing changes for callers when followers start to count.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kcoord.errors import Errors
from kcoord.node.metadata import MetadataCache
from kcoord.raft.image import BecomeFollower, BecomeLeader, RoleChange, StopReplica
from kcoord.storage import format as fmt
from kcoord.storage.config import InvalidConfigError, LogConfig
from kcoord.storage.log import (
    FetchData,
    InvalidRecordError,
    Log,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from kcoord.storage.manager import LogManager
from kcoord.storage.segment import LogCorruptError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
HighWatermarkListener = Callable[["Partition", int], None]
RoleListener = Callable[["Partition", bool], None]  # (partition, is_leader now)


class KafkaError(Exception):
    """An error with Kafka's code, answered to the client as is."""

    def __init__(self, code: Errors, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message


@dataclass(slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_start_offset: int
    log_append_time_ms: int = -1


@dataclass(slots=True)
class FetchResult:
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int


@dataclass(slots=True)
class Partition:
    topic: str
    partition: int
    topic_id: str
    log: Log
    is_leader: bool = False
    leader_id: int = -1
    leader_epoch: int = -1
    high_watermark: int = 0
    _waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)

    @property
    def tp(self) -> TopicPartition:
        return self.topic, self.partition

    def set_high_watermark(self, high_watermark: int) -> bool:
        """Move the HW up (never down, never past the log end); True if it moved."""
        high_watermark = min(high_watermark, self.log.log_end_offset)
        if high_watermark <= self.high_watermark:
            return False
        self.high_watermark = high_watermark
        ready = [f for o, f in self._waiters if o <= high_watermark]
        self._waiters = [(o, f) for o, f in self._waiters if o > high_watermark]
        for fut in ready:
            if not fut.done():
                fut.set_result(None)
        return True

    async def wait_for_high_watermark(self, offset: int) -> None:
        """Return once the HW is at or above ``offset``; KafkaError if leadership is lost."""
        if self.high_watermark >= offset:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, fut))
        await fut

    def fail_waiters(self, code: Errors) -> None:
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(KafkaError(code, f"{self.topic}-{self.partition}"))


class ReplicaManager:
    def __init__(
        self,
        node_id: int,
        logs: LogManager,
        cache: MetadataCache,
        now_ms: Callable[[], int],
        *,
        default_log_config: LogConfig | None = None,
    ) -> None:
        self.node_id = node_id
        self.logs = logs
        self.cache = cache
        self.now_ms = now_ms
        self.default_log_config = default_log_config or LogConfig()
        self.partitions: dict[TopicPartition, Partition] = {}
        self._hw_listeners: list[HighWatermarkListener] = []
        self._role_listeners: list[RoleListener] = []
        self._checkpointed_hw = logs.read_high_watermarks()

    # -----------------------------------------------------------------------------------------
    # Listeners.

    def add_high_watermark_listener(self, listener: HighWatermarkListener) -> None:
        self._hw_listeners.append(listener)

    def add_role_listener(self, listener: RoleListener) -> None:
        self._role_listeners.append(listener)

    # -----------------------------------------------------------------------------------------
    # Roles, from the metadata log.

    def log_config_for(self, topic_configs: dict[str, str]) -> LogConfig:
        known = {
            k: v
            for k, v in topic_configs.items()
            if k.replace(".", "_") in LogConfig.__dataclass_fields__
        }
        try:
            return self.default_log_config.with_topic_configs(known)
        except InvalidConfigError as e:
            log.error("ignoring invalid topic configs %s: %s", known, e)
            return self.default_log_config

    def on_role_changes(self, changes: Iterable[RoleChange]) -> None:
        for change in changes:
            tp = (change.topic_name, change.tp.partition)
            if isinstance(change, StopReplica):
                self._stop_replica(tp)
                continue
            part = self.partitions.get(tp)
            if part is None:
                topic = self.cache.image.topic(change.tp.topic_id)
                config = self.log_config_for(dict(topic.configs) if topic else {})
                try:
                    lg = self.logs.get_or_create_log(tp, config, topic_id=change.tp.topic_id)
                except (OSError, ValueError) as e:
                    log.error("cannot host %s-%d: %s", tp[0], tp[1], e)
                    continue
                part = Partition(tp[0], tp[1], change.tp.topic_id, lg)
                part.high_watermark = min(self._checkpointed_hw.get(tp, 0), lg.log_end_offset)
                self.partitions[tp] = part
            was_leader = part.is_leader
            if isinstance(change, BecomeLeader):
                part.is_leader = True
                part.leader_id = self.node_id
                part.leader_epoch = change.leader_epoch
                self._maybe_advance_high_watermark(part)
            elif isinstance(change, BecomeFollower):
                part.is_leader = False
                part.leader_id = change.leader
                part.leader_epoch = change.leader_epoch
                part.fail_waiters(Errors.NOT_LEADER_OR_FOLLOWER)
            if part.is_leader or was_leader:
                for listener in self._role_listeners:
                    try:
                        listener(part, part.is_leader)
                    except Exception:
                        log.exception("role listener failed for %s-%d", tp[0], tp[1])

    def _stop_replica(self, tp: TopicPartition) -> None:
        part = self.partitions.pop(tp, None)
        if part is None:
            return
        part.fail_waiters(Errors.NOT_LEADER_OR_FOLLOWER)
        if part.is_leader:
            part.is_leader = False
            for listener in self._role_listeners:
                listener(part, False)
        self.logs.delete_log(tp)

    # -----------------------------------------------------------------------------------------
    # Lookups.

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def leader_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this node leads it, else Kafka's error for the client."""
        part = self.partitions.get((topic, partition))
        if part is not None and part.is_leader:
            return part
        topic_image = self.cache.image.topic_by_name(topic)
        if (
            topic_image is None
            or self.cache.image.partition(topic_image.topic_id, partition) is None
        ):
            raise KafkaError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
        raise KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition}")

    # -----------------------------------------------------------------------------------------
    # Writes and reads.

    def append_local(self, part: Partition, records: bytes) -> AppendResult:
        """Append as leader; raises KafkaError with the code Kafka answers for bad input."""
        if not part.is_leader:
            raise KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, f"{part.topic}-{part.partition}")
        try:
            info = part.log.append_as_leader(records, part.leader_epoch, self.now_ms())
        except RecordTooLargeError as e:
            raise KafkaError(Errors.MESSAGE_TOO_LARGE, str(e)) from e
        except fmt.CorruptRecordError as e:
            raise KafkaError(Errors.CORRUPT_MESSAGE, str(e)) from e
        except InvalidRecordError as e:
            raise KafkaError(Errors.INVALID_RECORD, str(e)) from e
        except fmt.RecordFormatError as e:
            raise KafkaError(Errors.CORRUPT_MESSAGE, str(e)) from e
        except OSError as e:
            log.error("append to %s-%d failed: %s", part.topic, part.partition, e)
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, str(e)) from e
        self._maybe_advance_high_watermark(part)
        return AppendResult(info.first_offset, info.last_offset, part.log.log_start_offset)

    async def append(
        self, topic: str, partition: int, records: bytes, *, acks: int, timeout_ms: int
    ) -> AppendResult:
        part = self.leader_partition(topic, partition)
        result = self.append_local(part, records)
        if acks == -1:
            try:
                await asyncio.wait_for(
                    part.wait_for_high_watermark(result.last_offset + 1), timeout_ms / 1000
                )
            except TimeoutError as e:
                raise KafkaError(Errors.REQUEST_TIMED_OUT, "high watermark did not advance") from e
        return result

    def _maybe_advance_high_watermark(self, part: Partition) -> None:
        # Until replication: the leader is its ISR (see the module docstring).
        if part.is_leader and part.set_high_watermark(part.log.log_end_offset):
            for listener in self._hw_listeners:
                try:
                    listener(part, part.high_watermark)
                except Exception:
                    log.exception("high watermark listener failed")

    def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        max_bytes: int,
        *,
        committed_only: bool = True,
        min_one: bool = True,
    ) -> FetchResult:
        part = self.leader_partition(topic, partition)
        bound = part.high_watermark if committed_only else None
        try:
            data: FetchData = part.log.read(
                fetch_offset, max_bytes, max_offset=bound, min_one=min_one
            )
        except OffsetOutOfRangeError as e:
            raise KafkaError(Errors.OFFSET_OUT_OF_RANGE, str(e)) from e
        except LogCorruptError as e:
            log.error("corrupt data in %s-%d: %s", topic, partition, e)
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, str(e)) from e
        return FetchResult(
            data.records,
            part.high_watermark,
            part.log.log_start_offset,
            part.log.log_end_offset,
            part.high_watermark,
        )

    # -----------------------------------------------------------------------------------------
    # Checkpoints.

    def checkpoint_high_watermarks(self) -> None:
        self.logs.write_high_watermarks({tp: p.high_watermark for tp, p in self.partitions.items()})
