"""The metadata image: the cluster metadata obtained by replaying the metadata log.

Theory of operation
-------------------
Every node replays the committed metadata log, record by record and in offset order, into one
``MetadataImage`` (Kafka's ``MetadataImage``/``MetadataDelta``, and the controller-side
``ClusterControlManager``/``ReplicationControlManager`` replay methods). The image holds:

- the cluster id (``ClusterId`` record);
- the registered brokers, ``broker id -> BrokerRegistration`` (incarnation, broker epoch,
  endpoints, rack, fenced);
- the topics, ``topic id -> TopicImage`` (name, configs) with the reverse index by name;
- the partitions, ``(topic id, partition) -> PartitionState`` (replicas, ISR, leader, leader
  epoch, partition epoch, ELR, last known ELR);
- configs of non-topic resources (``Config`` records for brokers and groups);
- the offset of the last applied record (``last_offset``; -1 when nothing was applied).

The image is mutable so that applying a record costs O(1) however many partitions exist; the
values in it (``BrokerRegistration``, ``TopicImage``, ``PartitionState``) are frozen and replaced,
never modified, so a reader may keep one as a consistent snapshot of that entity.
``apply(offset, record)`` and ``apply_batch(offset, records)`` return a ``MetadataDelta`` listing
every changed broker, topic, partition and config with its value before and after.
``role_changes(delta, local_broker_id)`` turns a delta into the local broker's
``BecomeLeader`` / ``BecomeFollower`` / ``StopReplica`` instructions, once per leader epoch
(Kafka's ``TopicDelta.localChanges``, as used by ``BrokerMetadataPublisher``).

Offsets. The metadata offset of a record is the Raft index of the log entry that carries it.
An entry may carry a batch of records (one controller decision, applied atomically, like
Kafka's ``ControllerResult.atomicOf``); all records of a batch share the entry's offset, so
``apply`` accepts an offset equal to ``last_offset`` and refuses one below it.

Out-of-contract records. A record that does not fit the image (a partition of an unknown topic,
a ``PartitionChange`` computed against an older partition epoch, a fence for a stale broker
epoch, an ISR that is not a subset of the replicas, ...) raises ``MetadataApplyError`` and
leaves the image exactly as it was: a single record is validated before anything is changed,
and ``apply_batch`` undoes the records of the batch already applied. Since every node replays
the same log with the same code, every node refuses the same records; the caller logs and skips
them.

Partition state invariants, checked on every ``Partition`` and ``PartitionChange``:
replicas are non-empty and distinct; ISR, ELR and last known ELR are distinct subsets of the
replicas; ISR and ELR are disjoint; the leader is ``NO_LEADER`` or a member of the ISR (an ELR
or unclean election makes the ISR exactly the new leader, as ``PartitionChangeBuilder`` does);
epochs are not negative. Broker epochs of one broker id only go up.

Snapshots. ``to_records()`` lists records (``ClusterId``, ``RegisterBroker`` with the current
fencing state, ``Config`` for non-topic resources, ``Topic`` with its configs, ``Partition``)
that ``MetadataImage.from_records(offset, records)`` replays into an equal image;
``load_snapshot`` replaces an image's contents with a snapshot and returns the delta between the
two.

Pure: no I/O, no clock; imports only ``records``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from kcoord.raft.records import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    ClusterId,
    Config,
    ConfigResourceType,
    FenceBroker,
    MetadataRecord,
    NoOp,
    Partition,
    PartitionChange,
    RegisterBroker,
    RemoveTopic,
    Topic,
    UnfenceBroker,
)

T = TypeVar("T")


class MetadataApplyError(Exception):
    """A record does not fit the image; the image is unchanged. The message says why."""


class TopicIdPartition(NamedTuple):
    """A partition, named by its topic id (Kafka's ``TopicIdPartition``)."""

    topic_id: str
    partition: int


class ConfigResource(NamedTuple):
    """A non-topic config resource: a ``ConfigResourceType`` code and a name."""

    resource_type: int
    resource_name: str


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A registered broker (Kafka's ``BrokerRegistration``)."""

    broker_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: Mapping[str, str]
    rack: str | None
    fenced: bool
    # The offset its RegisterBroker record was applied at (an image read from a snapshot: the
    # snapshot's, which is later). The broker epoch is the log end the controller saw when it
    # decided the registration; a write of its own still in flight then (a KIP-835 NoOp) puts
    # the record later, and a broker that replayed up to its epoch was told it was caught up
    # before it had its own registration. Kafka's epoch is the record's exact offset.
    registered_at: int = field(default=-1, compare=False)

    @property
    def caught_up_offset(self) -> int:
        """The metadata offset a broker must have replayed to be caught up: its own
        registration's (Kafka's ``BrokerHeartbeatManager``, ``metadataOffset >= brokerEpoch``)."""
        return max(self.broker_epoch, self.registered_at)


@dataclass(frozen=True, slots=True)
class TopicImage:
    """A topic: its id, name and configs (Kafka's ``TopicImage`` and its ``ConfigurationImage``)."""

    topic_id: str
    name: str
    configs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The replicated state of one partition (Kafka's ``PartitionRegistration``)."""

    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()

    @property
    def tp(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, self.partition)

    @property
    def preferred_leader(self) -> int:
        """The first replica: the leader placement chose (Kafka's preferred replica)."""
        return self.replicas[0]

    def merge(self, change: PartitionChange) -> PartitionState:
        """The state after ``change`` (Kafka's ``PartitionRegistration.merge``).

        Epoch rules: the partition epoch goes up by one on every change; the leader epoch goes
        up by one whenever the change sets the leader, even to the same broker. Does not check
        ``change.expected_partition_epoch`` nor the invariants; ``MetadataImage.apply`` does.
        """
        if change.leader == NO_LEADER_CHANGE:
            leader, leader_epoch = self.leader, self.leader_epoch
        else:
            leader, leader_epoch = change.leader, self.leader_epoch + 1
        return PartitionState(
            topic_id=self.topic_id,
            partition=self.partition,
            replicas=self.replicas if change.replicas is None else change.replicas,
            isr=self.isr if change.isr is None else change.isr,
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=self.partition_epoch + 1,
            elr=self.elr if change.elr is None else change.elr,
            last_known_elr=(
                self.last_known_elr if change.last_known_elr is None else change.last_known_elr
            ),
        )

    def to_record(self) -> Partition:
        return Partition(
            topic_id=self.topic_id,
            partition=self.partition,
            replicas=self.replicas,
            isr=self.isr,
            leader=self.leader,
            leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch,
            elr=self.elr,
            last_known_elr=self.last_known_elr,
        )

    @staticmethod
    def from_record(record: Partition) -> PartitionState:
        return PartitionState(
            topic_id=record.topic_id,
            partition=record.partition,
            replicas=record.replicas,
            isr=record.isr,
            leader=record.leader,
            leader_epoch=record.leader_epoch,
            partition_epoch=record.partition_epoch,
            elr=record.elr,
            last_known_elr=record.last_known_elr,
        )


def partition_state_error(state: PartitionState) -> str | None:
    """Why ``state`` breaks a partition invariant (see the module docstring), or None."""
    replicas = set(state.replicas)
    if state.partition < 0:
        return f"negative partition id {state.partition}"
    if not state.replicas:
        return "no replicas"
    if len(replicas) != len(state.replicas) or min(state.replicas) < 0:
        return f"replicas {list(state.replicas)} are not distinct broker ids"
    for name, members in (
        ("ISR", state.isr),
        ("ELR", state.elr),
        ("last known ELR", state.last_known_elr),
    ):
        if len(set(members)) != len(members):
            return f"{name} {list(members)} has duplicates"
        if not replicas.issuperset(members):
            return f"{name} {list(members)} is not a subset of replicas {list(state.replicas)}"
    if set(state.isr) & set(state.elr):
        return f"ISR {list(state.isr)} and ELR {list(state.elr)} overlap"
    if state.leader != NO_LEADER and state.leader not in state.isr:
        return f"leader {state.leader} is not in ISR {list(state.isr)}"
    if state.leader_epoch < 0 or state.partition_epoch < 0:
        return f"negative epoch (leader {state.leader_epoch}, partition {state.partition_epoch})"
    return None


@dataclass(frozen=True)
class Change(Generic[T]):
    """One entity's value before and after a delta; None means absent.

    (Not ``slots=True``: slotted generic dataclasses break on ``Change[int](...)`` in 3.11.)
    """

    before: T | None
    after: T | None


@dataclass(slots=True)
class MetadataDelta:
    """What one record or batch changed, with values before and after.

    When a batch touches an entity twice, ``before`` is its value before the batch and ``after``
    its value after it.
    """

    prev_offset: int
    offset: int
    cluster_id: Change[str] | None = None
    brokers: dict[int, Change[BrokerRegistration]] = field(default_factory=dict)
    topics: dict[str, Change[TopicImage]] = field(default_factory=dict)
    partitions: dict[TopicIdPartition, Change[PartitionState]] = field(default_factory=dict)
    configs: dict[ConfigResource, Change[Mapping[str, str]]] = field(default_factory=dict)
    # topic id -> name, for every topic whose partitions or configs are in the delta, so that
    # a partition of a deleted topic can still be named.
    topic_names: dict[str, str] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (
            self.cluster_id or self.brokers or self.topics or self.partitions or self.configs
        )

    def _note_broker(
        self, broker_id: int, before: BrokerRegistration | None, after: BrokerRegistration | None
    ) -> None:
        old = self.brokers.get(broker_id)
        self.brokers[broker_id] = Change(before if old is None else old.before, after)

    def _note_topic(
        self, topic_id: str, before: TopicImage | None, after: TopicImage | None
    ) -> None:
        old = self.topics.get(topic_id)
        self.topics[topic_id] = Change(before if old is None else old.before, after)
        named = after if after is not None else before
        assert named is not None
        self.topic_names[topic_id] = named.name

    def _note_partition(
        self,
        tp: TopicIdPartition,
        topic_name: str,
        before: PartitionState | None,
        after: PartitionState | None,
    ) -> None:
        old = self.partitions.get(tp)
        self.partitions[tp] = Change(before if old is None else old.before, after)
        self.topic_names[tp.topic_id] = topic_name

    def _note_config(
        self,
        resource: ConfigResource,
        before: Mapping[str, str] | None,
        after: Mapping[str, str] | None,
    ) -> None:
        old = self.configs.get(resource)
        self.configs[resource] = Change(before if old is None else old.before, after)

    def _note_cluster_id(self, before: str | None, after: str) -> None:
        old = self.cluster_id
        self.cluster_id = Change(before if old is None else old.before, after)


class MetadataImage:
    """The replayed metadata; see the module docstring."""

    __slots__ = (
        "_brokers",
        "_cluster_id",
        "_configs",
        "_elr_members",
        "_isr_members",
        "_last_offset",
        "_led_by",
        "_partitions",
        "_topic_ids_by_name",
        "_topics",
    )

    def __init__(self) -> None:
        self._cluster_id: str | None = None
        self._last_offset = -1
        self._brokers: dict[int, BrokerRegistration] = {}
        self._topics: dict[str, TopicImage] = {}
        self._topic_ids_by_name: dict[str, str] = {}
        # topic id -> partition id -> state. Every topic in _topics has an entry (maybe empty).
        self._partitions: dict[str, dict[int, PartitionState]] = {}
        self._configs: dict[ConfigResource, Mapping[str, str]] = {}
        # Indexes kept in step with _partitions by _put_partition (Kafka's BrokersToIsrs and
        # BrokersToElrs): leader -> partitions (NO_LEADER for leaderless ones), ISR member ->
        # partitions, ELR member -> partitions.
        self._led_by: dict[int, set[TopicIdPartition]] = {}
        self._isr_members: dict[int, set[TopicIdPartition]] = {}
        self._elr_members: dict[int, set[TopicIdPartition]] = {}

    # ---------------------------------------------------------------- construction, equality

    @classmethod
    def from_records(cls, offset: int, records: Iterable[MetadataRecord]) -> MetadataImage:
        """Replay a snapshot (records from ``to_records``) taken at ``offset``."""
        image = cls()
        image.apply_batch(offset, list(records))
        # Also when it has no records (an image of NoOps alone, before the cluster id): it
        # reloaded at -1, a step behind the snapshot.
        image._last_offset = offset
        return image

    def copy(self) -> MetadataImage:
        """An independent image with the same contents; O(partitions)."""
        other = MetadataImage()
        other._cluster_id = self._cluster_id
        other._last_offset = self._last_offset
        other._brokers = dict(self._brokers)
        other._topics = dict(self._topics)
        other._topic_ids_by_name = dict(self._topic_ids_by_name)
        other._partitions = {t: dict(parts) for t, parts in self._partitions.items()}
        other._configs = dict(self._configs)
        other._led_by = {b: set(tps) for b, tps in self._led_by.items()}
        other._isr_members = {b: set(tps) for b, tps in self._isr_members.items()}
        other._elr_members = {b: set(tps) for b, tps in self._elr_members.items()}
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetadataImage):
            return NotImplemented
        return (
            self._cluster_id == other._cluster_id
            and self._last_offset == other._last_offset
            and self._brokers == other._brokers
            and self._topics == other._topics
            # Derived, and compared so that an index gone wrong shows (a snapshot walks it).
            and self._topic_ids_by_name == other._topic_ids_by_name
            and self._partitions == other._partitions
            and self._configs == other._configs
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"MetadataImage(cluster_id={self._cluster_id!r}, last_offset={self._last_offset}, "
            f"brokers={len(self._brokers)}, topics={len(self._topics)}, "
            f"partitions={sum(len(p) for p in self._partitions.values())})"
        )

    # ---------------------------------------------------------------- reading

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    @property
    def last_offset(self) -> int:
        """The offset of the last applied record, or -1."""
        return self._last_offset

    @property
    def brokers(self) -> Mapping[int, BrokerRegistration]:
        return self._brokers

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        return self._brokers.get(broker_id)

    def is_fenced(self, broker_id: int) -> bool:
        """True unless the broker is registered and unfenced (an unknown broker is unusable)."""
        registration = self._brokers.get(broker_id)
        return registration is None or registration.fenced

    def unfenced_broker_ids(self) -> list[int]:
        return sorted(b for b, r in self._brokers.items() if not r.fenced)

    @property
    def topics(self) -> Mapping[str, TopicImage]:
        """Topics by topic id."""
        return self._topics

    def topic(self, topic_id: str) -> TopicImage | None:
        return self._topics.get(topic_id)

    def topic_by_name(self, name: str) -> TopicImage | None:
        topic_id = self._topic_ids_by_name.get(name)
        return None if topic_id is None else self._topics[topic_id]

    def partition(self, topic_id: str, partition: int) -> PartitionState | None:
        parts = self._partitions.get(topic_id)
        return None if parts is None else parts.get(partition)

    def partitions_of(self, topic_id: str) -> list[PartitionState]:
        """The partitions of a topic, by partition id (empty for an unknown topic)."""
        parts = self._partitions.get(topic_id, {})
        return [parts[p] for p in sorted(parts)]

    def all_partitions(self) -> Iterator[PartitionState]:
        for parts in self._partitions.values():
            yield from parts.values()

    def partition_count(self) -> int:
        return sum(len(parts) for parts in self._partitions.values())

    def partitions_led_by(self, broker_id: int) -> list[PartitionState]:
        """Partitions whose leader is ``broker_id``, sorted by (topic id, partition)."""
        return self._lookup(self._led_by.get(broker_id, set()))

    def leaderless(self) -> frozenset[TopicIdPartition]:
        """The partitions without a leader, unsorted (``partitions_led_by(NO_LEADER)`` looks
        up and sorts them all: costly when a whole cluster comes back)."""
        return frozenset(self._led_by.get(NO_LEADER, ()))

    def partitions_with_isr_member(self, broker_id: int) -> list[PartitionState]:
        return self._lookup(self._isr_members.get(broker_id, set()))

    def isr_memberships(self, broker_id: int) -> frozenset[TopicIdPartition]:
        """The partitions whose ISR has the broker, unsorted (``partitions_with_isr_member``
        looks up and sorts them all: costly at 50,000)."""
        return frozenset(self._isr_members.get(broker_id, ()))

    def partitions_with_elr_member(self, broker_id: int) -> list[PartitionState]:
        return self._lookup(self._elr_members.get(broker_id, set()))

    def leader_counts(self) -> dict[int, int]:
        """Broker id -> number of partitions it leads (brokers leading nothing are absent)."""
        return {b: len(tps) for b, tps in self._led_by.items() if b != NO_LEADER and tps}

    def resource_configs(self, resource: ConfigResource) -> Mapping[str, str]:
        """Configs of a broker or group resource (``Config`` records); empty if none."""
        return self._configs.get(resource, {})

    def _lookup(self, tps: Iterable[TopicIdPartition]) -> list[PartitionState]:
        return [self._partitions[tp.topic_id][tp.partition] for tp in sorted(tps)]

    # ---------------------------------------------------------------- applying records

    def apply(self, offset: int, record: MetadataRecord) -> MetadataDelta:
        """Replay one record at ``offset``; raises ``MetadataApplyError`` and changes nothing
        if the record does not fit."""
        delta = MetadataDelta(prev_offset=self._last_offset, offset=offset)
        self._apply_into(offset, record, delta)
        return delta

    def apply_batch(self, offset: int, records: Iterable[MetadataRecord]) -> MetadataDelta:
        """Replay the records of one log entry, all or nothing.

        If a record does not fit, the records of the batch already applied are undone and
        ``MetadataApplyError`` is raised: the image is as it was before the batch.
        """
        delta = MetadataDelta(prev_offset=self._last_offset, offset=offset)
        try:
            for record in records:
                self._apply_into(offset, record, delta)
        except MetadataApplyError:
            self._revert(delta)
            raise
        return delta

    def load_snapshot(self, offset: int, records: Iterable[MetadataRecord]) -> MetadataDelta:
        """Replace the whole image with a snapshot taken at ``offset``.

        Returns the delta from the old contents to the new ones, so that the caller can derive
        role changes as for any other delta. Raises ``MetadataApplyError`` and keeps the old
        contents if the snapshot does not replay.
        """
        return self.replace_with(MetadataImage.from_records(offset, records))

    def replace_with(self, new: MetadataImage) -> MetadataDelta:
        """Take ``new``'s contents (``new`` is this image's from now on: not to be changed
        elsewhere); returns the delta from the old contents, as ``load_snapshot``."""
        delta = diff(self, new)
        for name in MetadataImage.__slots__:
            setattr(self, name, getattr(new, name))
        return delta

    def to_records(self) -> list[MetadataRecord]:
        """Records that ``from_records`` replays into an image equal to this one."""
        records: list[MetadataRecord] = []
        if self._cluster_id is not None:
            records.append(ClusterId(self._cluster_id))
        for broker_id in sorted(self._brokers):
            b = self._brokers[broker_id]
            records.append(
                RegisterBroker(
                    broker_id=b.broker_id,
                    incarnation_id=b.incarnation_id,
                    broker_epoch=b.broker_epoch,
                    endpoints=dict(b.endpoints),
                    rack=b.rack,
                    fenced=b.fenced,
                )
            )
        for resource in sorted(self._configs):
            configs = self._configs[resource]
            records.extend(
                Config(resource.resource_type, resource.resource_name, key, configs[key])
                for key in sorted(configs)
            )
        for name in sorted(self._topic_ids_by_name):
            topic = self._topics[self._topic_ids_by_name[name]]
            records.append(Topic(topic.name, topic.topic_id, dict(topic.configs)))
            records.extend(state.to_record() for state in self.partitions_of(topic.topic_id))
        return records

    def _apply_into(self, offset: int, record: MetadataRecord, delta: MetadataDelta) -> None:
        if offset < 0 or offset < self._last_offset:
            raise MetadataApplyError(
                f"cannot apply {record!r} at offset {offset}: offsets must not go back "
                f"(last applied offset {self._last_offset})"
            )
        match record:
            case RegisterBroker():
                self._replay_register_broker(record, delta, offset)
            case FenceBroker():
                self._replay_fencing(record.broker_id, record.broker_epoch, True, record, delta)
            case UnfenceBroker():
                self._replay_fencing(record.broker_id, record.broker_epoch, False, record, delta)
            case Topic():
                self._replay_topic(record, delta)
            case Partition():
                self._replay_partition(record, delta)
            case PartitionChange():
                self._replay_partition_change(record, delta)
            case RemoveTopic():
                self._replay_remove_topic(record, delta)
            case Config():
                self._replay_config(record, delta)
            case ClusterId():
                self._replay_cluster_id(record, delta)
            case NoOp():
                pass
            case _:
                raise MetadataApplyError(f"cannot apply {record!r}: not a metadata record")
        self._last_offset = offset

    def _replay_register_broker(
        self, record: RegisterBroker, delta: MetadataDelta, offset: int
    ) -> None:
        # ClusterControlManager.replay(RegisterBrokerRecord): a registration replaces the
        # previous one of the same broker id. kcoord also insists that broker epochs go up, so
        # a registration decided on a stale image cannot overwrite a newer one.
        if record.broker_id < 0 or record.broker_epoch < 0 or not record.incarnation_id:
            raise MetadataApplyError(
                f"cannot apply {record!r}: broker id and epoch must be >= 0 and the "
                "incarnation id non-empty"
            )
        before = self._brokers.get(record.broker_id)
        if before is not None and record.broker_epoch <= before.broker_epoch:
            raise MetadataApplyError(
                f"cannot apply {record!r}: broker {record.broker_id} is already registered "
                f"with epoch {before.broker_epoch}; a registration must bring a higher epoch"
            )
        after = BrokerRegistration(
            broker_id=record.broker_id,
            incarnation_id=record.incarnation_id,
            broker_epoch=record.broker_epoch,
            endpoints=dict(record.endpoints),
            rack=record.rack,
            fenced=record.fenced,
            registered_at=offset,
        )
        self._brokers[record.broker_id] = after
        delta._note_broker(record.broker_id, before, after)

    def _replay_fencing(
        self,
        broker_id: int,
        broker_epoch: int,
        fenced: bool,
        record: MetadataRecord,
        delta: MetadataDelta,
    ) -> None:
        # ClusterControlManager.replayRegistrationChange: the broker must be registered with
        # exactly this epoch; a change to the state the broker is already in is a no-op.
        before = self._brokers.get(broker_id)
        if before is None:
            raise MetadataApplyError(f"cannot apply {record!r}: broker {broker_id} not registered")
        if before.broker_epoch != broker_epoch:
            raise MetadataApplyError(
                f"cannot apply {record!r}: broker {broker_id} is registered with epoch "
                f"{before.broker_epoch}, not {broker_epoch}"
            )
        if before.fenced == fenced:
            return
        after = BrokerRegistration(
            broker_id=before.broker_id,
            incarnation_id=before.incarnation_id,
            broker_epoch=before.broker_epoch,
            endpoints=before.endpoints,
            rack=before.rack,
            fenced=fenced,
            registered_at=before.registered_at,
        )
        self._brokers[broker_id] = after
        delta._note_broker(broker_id, before, after)

    def _replay_topic(self, record: Topic, delta: MetadataDelta) -> None:
        if not record.name or not record.topic_id:
            raise MetadataApplyError(f"cannot apply {record!r}: empty topic name or id")
        if record.name in self._topic_ids_by_name:
            raise MetadataApplyError(f"cannot apply {record!r}: topic name already exists")
        if record.topic_id in self._topics:
            raise MetadataApplyError(f"cannot apply {record!r}: topic id already exists")
        after = TopicImage(record.topic_id, record.name, dict(record.configs))
        self._put_topic(record.topic_id, after)
        delta._note_topic(record.topic_id, None, after)

    def _replay_partition(self, record: Partition, delta: MetadataDelta) -> None:
        topic = self._topics.get(record.topic_id)
        if topic is None:
            raise MetadataApplyError(f"cannot apply {record!r}: unknown topic id")
        tp = TopicIdPartition(record.topic_id, record.partition)
        if record.partition in self._partitions[record.topic_id]:
            raise MetadataApplyError(f"cannot apply {record!r}: partition already exists")
        after = PartitionState.from_record(record)
        reason = partition_state_error(after)
        if reason is not None:
            raise MetadataApplyError(f"cannot apply {record!r}: {reason}")
        self._put_partition(tp, None, after)
        delta._note_partition(tp, topic.name, None, after)

    def _replay_partition_change(self, record: PartitionChange, delta: MetadataDelta) -> None:
        topic = self._topics.get(record.topic_id)
        if topic is None:
            raise MetadataApplyError(f"cannot apply {record!r}: unknown topic id")
        before = self._partitions[record.topic_id].get(record.partition)
        if before is None:
            raise MetadataApplyError(f"cannot apply {record!r}: unknown partition")
        if record.expected_partition_epoch != before.partition_epoch:
            raise MetadataApplyError(
                f"cannot apply {record!r}: stale change, the partition epoch is "
                f"{before.partition_epoch}, not {record.expected_partition_epoch}"
            )
        if record.leader < NO_LEADER_CHANGE:
            raise MetadataApplyError(f"cannot apply {record!r}: invalid leader {record.leader}")
        after = before.merge(record)
        reason = partition_state_error(after)
        if reason is not None:
            raise MetadataApplyError(f"cannot apply {record!r}: {reason}")
        self._put_partition(before.tp, before, after)
        delta._note_partition(before.tp, topic.name, before, after)

    def _replay_remove_topic(self, record: RemoveTopic, delta: MetadataDelta) -> None:
        before = self._topics.get(record.topic_id)
        if before is None:
            raise MetadataApplyError(f"cannot apply {record!r}: unknown topic id")
        for state in self.partitions_of(record.topic_id):
            self._put_partition(state.tp, state, None)
            delta._note_partition(state.tp, before.name, state, None)
        self._put_topic(record.topic_id, None)
        delta._note_topic(record.topic_id, before, None)

    def _replay_config(self, record: Config, delta: MetadataDelta) -> None:
        def updated(configs: Mapping[str, str]) -> dict[str, str]:
            result = dict(configs)
            if record.value is None:
                result.pop(record.key, None)
            else:
                result[record.key] = record.value
            return result

        if not record.key:
            raise MetadataApplyError(f"cannot apply {record!r}: empty config key")
        if record.resource_type == ConfigResourceType.TOPIC:
            topic_id = self._topic_ids_by_name.get(record.resource_name)
            if topic_id is None:
                raise MetadataApplyError(f"cannot apply {record!r}: unknown topic")
            before_topic = self._topics[topic_id]
            after_topic = TopicImage(topic_id, before_topic.name, updated(before_topic.configs))
            self._put_topic(topic_id, after_topic)
            delta._note_topic(topic_id, before_topic, after_topic)
            return
        if record.resource_type == ConfigResourceType.BROKER:
            # "" is the cluster-wide default; otherwise a broker id (it need not be registered).
            name = record.resource_name
            if name and not (name.isascii() and name.isdigit()):
                raise MetadataApplyError(
                    f"cannot apply {record!r}: a broker config resource is '' or a broker id"
                )
        elif record.resource_type == ConfigResourceType.GROUP:
            if not record.resource_name:
                raise MetadataApplyError(f"cannot apply {record!r}: empty group id")
        else:
            raise MetadataApplyError(
                f"cannot apply {record!r}: unsupported config resource type {record.resource_type}"
            )
        resource = ConfigResource(record.resource_type, record.resource_name)
        before = self._configs.get(resource)
        after = updated(before or {})
        self._put_config(resource, after or None)
        delta._note_config(resource, before, after or None)

    def _replay_cluster_id(self, record: ClusterId, delta: MetadataDelta) -> None:
        if not record.cluster_id:
            raise MetadataApplyError(f"cannot apply {record!r}: empty cluster id")
        if self._cluster_id == record.cluster_id:
            return
        if self._cluster_id is not None:
            raise MetadataApplyError(
                f"cannot apply {record!r}: the cluster id is already {self._cluster_id!r}"
            )
        self._cluster_id = record.cluster_id
        delta._note_cluster_id(None, record.cluster_id)

    # ---------------------------------------------------------------- mutation primitives

    def _put_topic(self, topic_id: str, topic: TopicImage | None) -> None:
        old = self._topics.get(topic_id)
        if old is not None and self._topic_ids_by_name.get(old.name) == topic_id:
            # Only its own entry: undoing a batch that removed two topics and gave one's id
            # the other's name, the name is the other topic's again by now (its entry lost,
            # ``topic_by_name`` missed it and a snapshot, which walks the names, dropped it).
            del self._topic_ids_by_name[old.name]
        if topic is None:
            self._topics.pop(topic_id, None)
            parts = self._partitions.pop(topic_id, {})
            assert not parts, f"topic {topic_id} removed with partitions {sorted(parts)}"
        else:
            self._topics[topic_id] = topic
            self._topic_ids_by_name[topic.name] = topic_id
            self._partitions.setdefault(topic_id, {})

    def _put_partition(
        self, tp: TopicIdPartition, old: PartitionState | None, new: PartitionState | None
    ) -> None:
        assert self.partition(tp.topic_id, tp.partition) == old, (tp, old)
        if old is not None:
            _unindex(self._led_by, old.leader, tp)
            for b in old.isr:
                _unindex(self._isr_members, b, tp)
            for b in old.elr:
                _unindex(self._elr_members, b, tp)
        if new is None:
            del self._partitions[tp.topic_id][tp.partition]
        else:
            self._partitions[tp.topic_id][tp.partition] = new
            self._led_by.setdefault(new.leader, set()).add(tp)
            for b in new.isr:
                self._isr_members.setdefault(b, set()).add(tp)
            for b in new.elr:
                self._elr_members.setdefault(b, set()).add(tp)

    def _put_config(self, resource: ConfigResource, configs: Mapping[str, str] | None) -> None:
        if configs is None:
            self._configs.pop(resource, None)
        else:
            self._configs[resource] = configs

    def _revert(self, delta: MetadataDelta) -> None:
        """Undo a partly applied batch: put every entity back to its ``before`` value."""
        # Partitions first (they need their topic), then topics, in reverse of creation order.
        for tp, change in delta.partitions.items():
            current = self.partition(tp.topic_id, tp.partition)
            if change.before is not None and tp.topic_id not in self._partitions:
                self._partitions[tp.topic_id] = {}
            if current is not None:
                self._put_partition(tp, current, None)
            if change.before is not None:
                self._put_partition(tp, None, change.before)
        # Topics newest first: a batch may remove a topic and create another with its name.
        for topic_id, topic_change in reversed(list(delta.topics.items())):
            if topic_change.before is None:
                assert not self._partitions.get(topic_id), topic_id
            self._put_topic(topic_id, topic_change.before)
        for broker_id, broker_change in delta.brokers.items():
            if broker_change.before is None:
                self._brokers.pop(broker_id, None)
            else:
                self._brokers[broker_id] = broker_change.before
        for resource, config_change in delta.configs.items():
            self._put_config(resource, config_change.before)
        if delta.cluster_id is not None:
            self._cluster_id = delta.cluster_id.before
        self._last_offset = delta.prev_offset


def _unindex(index: dict[int, set[TopicIdPartition]], broker_id: int, tp: TopicIdPartition) -> None:
    members = index[broker_id]
    members.discard(tp)
    if not members:
        del index[broker_id]


def diff(old: MetadataImage, new: MetadataImage) -> MetadataDelta:
    """The delta that turns ``old`` into ``new`` (used when a snapshot replaces an image)."""
    delta = MetadataDelta(prev_offset=old.last_offset, offset=new.last_offset)
    if old.cluster_id != new.cluster_id and new.cluster_id is not None:
        delta.cluster_id = Change(old.cluster_id, new.cluster_id)
    for broker_id in sorted(old.brokers.keys() | new.brokers.keys()):
        before, after = old.brokers.get(broker_id), new.brokers.get(broker_id)
        if before != after:
            delta.brokers[broker_id] = Change(before, after)
    for topic_id in sorted(old.topics.keys() | new.topics.keys()):
        before_topic, after_topic = old.topics.get(topic_id), new.topics.get(topic_id)
        named = after_topic if after_topic is not None else before_topic
        assert named is not None
        if before_topic != after_topic:
            delta.topics[topic_id] = Change(before_topic, after_topic)
            delta.topic_names[topic_id] = named.name
        before_parts = {s.partition: s for s in old.partitions_of(topic_id)}
        after_parts = {s.partition: s for s in new.partitions_of(topic_id)}
        for partition in sorted(before_parts.keys() | after_parts.keys()):
            before_state, after_state = before_parts.get(partition), after_parts.get(partition)
            if before_state != after_state:
                tp = TopicIdPartition(topic_id, partition)
                delta.partitions[tp] = Change(before_state, after_state)
                delta.topic_names[topic_id] = named.name
    old_resources = set(old._configs)
    new_resources = set(new._configs)
    for resource in sorted(old_resources | new_resources):
        before_configs = old._configs.get(resource)
        after_configs = new._configs.get(resource)
        if before_configs != after_configs:
            delta.configs[resource] = Change(before_configs, after_configs)
    return delta


# -------------------------------------------------------------------- role changes


@dataclass(frozen=True, slots=True)
class BecomeLeader:
    """This broker now leads ``tp`` in ``leader_epoch`` (Kafka's ``makeLeader``/``onElection``)."""

    tp: TopicIdPartition
    topic_name: str
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class BecomeFollower:
    """This broker follows ``leader`` for ``tp`` in ``leader_epoch`` (``makeFollower``).

    ``leader`` may be ``NO_LEADER`` (-1): the partition is offline; a former leader must resign
    (Kafka's ``onResignation``) and a follower stops fetching.
    """

    tp: TopicIdPartition
    topic_name: str
    leader: int
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class StopReplica:
    """This broker no longer hosts ``tp`` (topic deleted or replica removed): stop and delete it."""

    tp: TopicIdPartition
    topic_name: str


RoleChange = BecomeLeader | BecomeFollower | StopReplica


def role_changes(delta: MetadataDelta, local_broker_id: int) -> list[RoleChange]:
    """The local broker's instructions for ``delta``, once per leader epoch.

    Follows Kafka's ``TopicDelta.localChanges``: replicas that went away are stopped (first),
    then partitions the broker now leads, then partitions it now follows; each group sorted by
    (topic id, partition). Unlike Kafka, which reports a partition on every partition-epoch
    change (ISR changes included), an instruction is emitted only when the broker's role or the
    leader epoch changes, so applying consecutive deltas yields each (partition, leader epoch)
    at most once. Partition-epoch-only changes (ISR, ELR) are in ``delta.partitions``.
    """
    stops: list[RoleChange] = []
    leaders: list[RoleChange] = []
    followers: list[RoleChange] = []
    for tp in sorted(delta.partitions):
        change = delta.partitions[tp]
        before, after = change.before, change.after
        name = delta.topic_names[tp.topic_id]
        was_replica = before is not None and local_broker_id in before.replicas
        if after is None or local_broker_id not in after.replicas:
            if was_replica:
                stops.append(StopReplica(tp, name))
            continue
        # A leader change always bumps the leader epoch (PartitionState.merge), so "new role"
        # is "newly a replica or a new leader epoch".
        if was_replica and before is not None and before.leader_epoch == after.leader_epoch:
            continue
        if after.leader == local_broker_id:
            leaders.append(BecomeLeader(tp, name, after.leader_epoch, after.partition_epoch))
        else:
            followers.append(
                BecomeFollower(tp, name, after.leader, after.leader_epoch, after.partition_epoch)
            )
    return stops + leaders + followers
