"""The active controller's decisions: pure functions from (image, request, now) to records.

Theory of operation
-------------------
The Raft leader of the metadata quorum is the active controller (KIP-631). It decides; the log
records its decisions; every node (the controller included) replays them into its
``MetadataImage``. This module is the deciding part, following Kafka's ``QuorumController``,
``ClusterControlManager``, ``ReplicationControlManager``, ``PartitionChangeBuilder``,
``BrokerHeartbeatManager`` and ``StripedReplicaPlacer``:

- Every decision takes the current (committed) image and, where time matters, ``now_ms``, and
  returns a ``ControllerResult(records, response)``: the records to propose as one atomic batch
  and the reply for the caller. Nothing here mutates the image; the image changes only when the
  records are committed and replayed.
- The only state of its own is soft state (``BrokerHeartbeatManager``): last heartbeat time and
  reported metadata offset per broker, and recently proposed fencing transitions. It is not in
  the log. After a controller failover, the new active controller starts with fresh soft state,
  counting every broker's session from its activation ("we may take some extra time to fence
  brokers", ``BrokerHeartbeatManager`` javadoc).
- Decisions that touch several partitions compute each change on top of the previous ones
  (``_Working``), so one batch may change the same partition twice. Each ``PartitionChange``
  carries the partition epoch it was computed from; if two decisions race on the same
  committed image, replay refuses the later one on every node (see ``records.py``). The node
  should run decisions one at a time and propose the next only after the previous batch is
  applied (as Kafka's single-threaded ``QuorumController`` does); the epoch check keeps
  races harmless when it does not.

Broker lifecycle (``ClusterControlManager``, ``BrokerHeartbeatManager``):

- ``register_broker``: a new incarnation gets a new broker epoch, ``last_offset + 1`` of the
  image (Kafka uses the offset the ``RegisterBrokerRecord`` will be written at; ours is that
  offset if nothing else is in flight, and never more than it), and always above the broker's
  previous epoch. It starts fenced. The same incarnation registering again (a retried request)
  gets its current epoch back and writes nothing. Another incarnation of a broker id whose
  session is still valid is refused with ``DUPLICATE_BROKER_REGISTRATION``. When a new
  incarnation replaces an old one, the old one is first removed from every ISR and its
  leaderships moved, like a fenced broker (``ReplicationControlManager.handleBrokerShutdown``).
- ``broker_heartbeat``: refreshes the session; a fenced broker is unfenced once its metadata
  offset reaches its broker epoch, i.e. it has replayed everything that was committed when its
  registration was decided (``calculateNextBrokerState``: ``currentMetadataOffset >=
  registerBrokerRecordOffset``; the broker epoch is a lower bound of that offset).
  ``want_fence`` fences; ``want_shut_down`` fences (moving leaderships away, a simple controlled
  shutdown) and answers ``should_shut_down`` once the broker is fenced and has replayed the log
  past the fencing.
- ``fence_stale_brokers``: fences every unfenced broker without a heartbeat for more than
  ``broker_session_timeout_ms`` (``BrokerHeartbeatTracker.isExpired``: expired when
  ``last_contact + timeout < now``), in one result or in parts of a bounded size, each on the
  image with the one before applied: the whole decision took a second of the node's event
  loop at 50,000 partitions.

Partitions (``ReplicationControlManager``, ``PartitionChangeBuilder``):

- ``create_topic`` places replicas with ``place_replicas``: each partition's leader is the
  unfenced broker leading the fewest partitions in the whole cluster (existing topics
  included), ties broken by fewest replicas and then round-robin from the previous leader, so
  leader counts of unfenced brokers differ by at most one after placement if they did before;
  the second replica, which takes over when the leader fails, is chosen so that leader counts
  stay within one after any single broker fails; the other followers go to the brokers with
  the fewest replicas, unfenced first, striped after the leader (``StripedReplicaPlacer``).
  The ISR is the unfenced replicas.
- ``create_partitions`` adds partitions to a topic with the same placement (or a manual
  assignment), keeping its replication factor.
- ``create_offsets_topic``: ``__consumer_offsets`` with ``offsets_topic_num_partitions``
  partitions and replication factor ``min(offsets_topic_replication_factor, registered
  brokers)``.
- Fencing a broker removes it from every ISR and elects new leaders where it led
  (``handleBrokerFenced``); unfencing elects it where a partition has no leader and it is
  eligible (``handleBrokerUnfenced``). Election (``build_partition_change``): a live ISR
  member (the current leader if still valid, else the first in replica order); if the ISR is
  empty, a live ELR member (KIP-966); never a replica outside the ISR/ELR unless the topic (or
  cluster) config ``unclean.leader.election.enable`` is true. Every leader change bumps the
  leader epoch and every change the partition epoch (``PartitionState.merge``).
- KIP-966 in a simple form, with ``eligible_leader_replicas_enabled``: when the ISR shrinks
  below the effective ``min.insync.replicas`` (``min(config, replication factor)``), the
  replicas leaving it join the ELR; once the ISR is back at min ISR the ELR is cleared; the ISR
  may become empty (without ELR the last ISR member stays in the ISR of a leaderless
  partition, as in Kafka). ``last_known_elr`` keeps the last leader when the ISR first
  empties (Kafka's "last known leader" mode). Deviation from Kafka: Kafka's balanced recovery
  elects that last known leader even without unclean election; kcoord elects it only when
  unclean leader election is enabled. Removing a restarted broker from the ELR on an unclean
  shutdown (KIP-966 ``PreviousBrokerEpoch``) is off unless
  ``unclean_shutdown_detection_enabled``: a SIGKILLed process loses no written data (the page
  cache survives it), so only a machine crash can make a restart unclean. A broker that
  registers from an empty data directory (``storage_lost``: a new or wiped disk) is removed
  from the ISR and ELR whatever that setting: its replicas hold nothing.
- ``alter_partition`` validates an ISR change requested by a partition leader
  (``ReplicationControlManager.alterPartition``/``validateAlterPartitionData``).
- ``alter_configs`` changes a topic's configs (IncrementalAlterConfigs and the legacy
  AlterConfigs, ``ConfigurationControlManager``); topic configs are validated with
  ``storage.config``'s definitions when a topic is created and whenever they change.
- ``elect_leaders`` is the ElectLeaders API (KIP-460): a preferred election, or an unclean
  one for a partition without a leader.
- ``elect_unclean_leaders`` (periodic) elects a leader for leaderless partitions whose topic
  allows unclean election, so turning the config on takes effect without a broker change.
- ``elect_preferred_leaders`` moves leadership back to the first replica where it is a live ISR
  member (Kafka's auto leader rebalance, ``maybeBalancePartitionLeaders``), e.g. after a fenced
  broker came back and rejoined the ISR.

Pure: no I/O, no clock, no randomness (ids and time are arguments).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Final, Generic, NamedTuple, TypeVar

from kcoord.errors import Errors
from kcoord.raft.image import (
    ConfigResource,
    MetadataImage,
    PartitionState,
    TopicIdPartition,
    TopicImage,
    partition_state_error,
)
from kcoord.raft.records import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    ClusterId,
    Config,
    ConfigResourceType,
    FenceBroker,
    MetadataRecord,
    Partition,
    PartitionChange,
    RegisterBroker,
    RemoveTopic,
    Topic,
    UnfenceBroker,
)
from kcoord.storage.config import (
    INTERNAL_SEGMENT_BYTES,
    SEGMENT_BYTES_MIN,
    TOPIC_CONFIGS,
    TOPIC_CONFIGS_BY_BROKER_NAME,
    ConfigType,
    cluster_topic_defaults,
    parse_min_insync_replicas,
    topic_config_error,
)

T = TypeVar("T")
Item = TypeVar("Item")

OFFSETS_TOPIC_NAME: Final = "__consumer_offsets"
CLUSTER_METADATA_TOPIC_NAME: Final = "__cluster_metadata"  # the quorum's own log
# Kafka's QuorumController.MAX_RECORDS_PER_USER_OP: partitions one request may add.
MAX_PARTITIONS_PER_REQUEST: Final = 10_000
MIN_INSYNC_REPLICAS_CONFIG: Final = "min.insync.replicas"
# The cluster-level dynamic defaults (Kafka's default broker resource, ``--entity-default``).
CLUSTER_CONFIGS: Final = ConfigResource(ConfigResourceType.BROKER, "")
UNCLEAN_LEADER_ELECTION_ENABLE_CONFIG: Final = "unclean.leader.election.enable"
# Kafka's Topic.MAX_NAME_LENGTH and legal characters (Topic.validate).
_TOPIC_NAME_MAX_LENGTH: Final = 249
_TOPIC_NAME_CHARS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Controller settings; where Kafka has the same config, the name is Kafka's with
    underscores for dots."""

    # Fence a broker without a heartbeat for this long (Kafka's default is 9000 ms; kcoord
    # detects failures faster, DESIGN.md section 8).
    broker_session_timeout_ms: int = 3000
    # Do not propose the same fence/unfence of a broker again for this long while the first
    # proposal may still be in flight.
    fencing_proposal_backoff_ms: int = 1000
    num_partitions: int = 1  # num.partitions, for topics created without a partition count
    default_replication_factor: int = 1  # default.replication.factor
    min_insync_replicas: int = 1  # min.insync.replicas, when neither topic nor cluster says
    unclean_leader_election_enable: bool = False
    eligible_leader_replicas_enabled: bool = True  # eligible.leader.replicas.version=1
    unclean_shutdown_detection_enabled: bool = False
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    # Why a group's configs (KIP-848 group configs: name -> value, the whole resulting set)
    # would be refused, or None; the node passes the coordinator's check with its bounds, as
    # Kafka's QuorumController is given its ConfigurationValidator. None: GROUP resources
    # cannot be altered.
    group_config_error: Callable[[Mapping[str, str | None]], str | None] | None = None


@dataclass(frozen=True)
class ControllerResult(Generic[T]):
    """Records to propose as one atomic batch, and the reply (Kafka's ``ControllerResult``)."""

    records: tuple[MetadataRecord, ...]
    response: T


# ------------------------------------------------------------------------ requests, replies


@dataclass(frozen=True, slots=True)
class BrokerRegistrationRequest:
    """Kafka's ``BrokerRegistrationRequest`` (apiKey 62), as kcoord needs it.

    ``cluster_id`` None skips the cluster id check. ``previous_broker_epoch`` is the epoch the
    broker held when it last shut down cleanly, or -1 (KIP-966). ``storage_lost``: the broker
    started on an empty data directory (kcoord's; a new or wiped disk), so a restart of a known
    broker is unclean whether or not unclean shutdowns are otherwise detected.
    """

    broker_id: int
    incarnation_id: str
    endpoints: Mapping[str, str]
    rack: str | None = None
    cluster_id: str | None = None
    previous_broker_epoch: int = -1
    storage_lost: bool = False


@dataclass(frozen=True, slots=True)
class BrokerRegistrationReply:
    error: Errors
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatRequest:
    """Kafka's ``BrokerHeartbeatRequest`` (apiKey 63)."""

    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False
    # The replicas whose logs the broker cannot serve (they failed to load: a corrupt file),
    # as (topic id, partition). Kafka's broker reports whole offline log directories (KIP-858
    # ``OfflineLogDirs``) and the controller finds their replicas by topic id; a kcoord node
    # has one directory and keeps serving its other partitions, so it names them, by the id
    # of the topic each log was created for: never a topic re-created under the name.
    offline_replicas: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatReply:
    """Kafka's ``BrokerHeartbeatResponse``; ``is_fenced`` is the state once the records apply."""

    error: Errors
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False


class BrokerState(NamedTuple):
    """An ISR member in an AlterPartition request; epoch -1 skips the epoch check (KIP-841)."""

    broker_id: int
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AlterPartitionItem:
    """One partition of an AlterPartition request (Kafka's ``PartitionData``)."""

    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[BrokerState, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    """Kafka's ``AlterPartitionRequest`` (apiKey 56), sent by partition leaders."""

    broker_id: int
    broker_epoch: int
    partitions: tuple[AlterPartitionItem, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    """The outcome for one partition; on success, the partition state after the change."""

    topic_id: str
    partition: int
    error: Errors
    leader: int = NO_LEADER
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterPartitionResponse:
    error: Errors
    partitions: tuple[AlterPartitionResult, ...] = ()


@dataclass(frozen=True, slots=True)
class CreateTopicResult:
    error: Errors
    message: str = ""
    topic_id: str = ""
    num_partitions: int = -1
    replication_factor: int = -1


@dataclass(frozen=True, slots=True)
class NewTopic:
    """One topic of a CreateTopics request (``CreatableTopic``); -1 takes the default."""

    name: str
    topic_id: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str | None] | None = None
    # (partition index, replicas) of a manual assignment (``CreatableReplicaAssignment``).
    assignments: Sequence[tuple[int, Sequence[int]]] = ()


@dataclass(frozen=True, slots=True)
class ElectionResult:
    """One partition's outcome of ElectLeaders (``ElectLeadersResponse.PartitionResult``)."""

    topic: str
    partition: int
    error: Errors


class ConfigOp(IntEnum):
    """IncrementalAlterConfigs' ``config_operation`` (Kafka's ``AlterConfigOp.OpType``)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


_CONFIG_OPS: Final = frozenset(int(op) for op in ConfigOp)


@dataclass(frozen=True, slots=True)
class AlterConfigsResult:
    """The outcome of altering one resource's configs (``AlterConfigsResourceResponse``)."""

    error: Errors
    message: str = ""


@dataclass(frozen=True, slots=True)
class CreatePartitionsResult:
    """The outcome of adding partitions to one topic (Kafka's ``CreatePartitionsTopicResult``)."""

    error: Errors
    message: str = ""


@dataclass(frozen=True, slots=True)
class NewPartitions:
    """One topic of a CreatePartitions request (``CreatePartitionsTopic``)."""

    name: str
    count: int
    assignments: Sequence[Sequence[int]] | None = None


# ------------------------------------------------------------------------ soft state


@dataclass(slots=True)
class _BrokerSession:
    broker_epoch: int
    last_contact_ms: int
    metadata_offset: int = -1
    # Offset from which the broker, fenced for a controlled shutdown, may shut down.
    controlled_shutdown_offset: int | None = None


class BrokerHeartbeatManager:
    """Soft state about broker heartbeats (Kafka's ``BrokerHeartbeatManager`` and
    ``BrokerHeartbeatTracker``); lives only on the active controller, never in the log.

    A session is keyed by (broker id, broker epoch). A broker this controller has not heard
    from since it became active is counted as last heard at ``activated_at_ms`` for fencing,
    but has no valid session for duplicate-registration checks (as in Kafka, where an unknown
    session is not valid).
    """

    __slots__ = ("_activated_at_ms", "_proposed", "_sessions", "session_timeout_ms")

    def __init__(self, session_timeout_ms: int, activated_at_ms: int) -> None:
        assert session_timeout_ms > 0, session_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self._activated_at_ms = activated_at_ms
        self._sessions: dict[int, _BrokerSession] = {}
        # broker id -> (broker epoch, fenced, proposed at ms) of the last fencing transition
        # proposed, to avoid proposing it again while it is in flight.
        self._proposed: dict[int, tuple[int, bool, int]] = {}

    def touch(
        self, broker_id: int, broker_epoch: int, now_ms: int, metadata_offset: int = -1
    ) -> None:
        """Record a heartbeat (or registration) from this broker incarnation at ``now_ms``."""
        session = self._sessions.get(broker_id)
        if session is None or session.broker_epoch != broker_epoch:
            self._sessions[broker_id] = _BrokerSession(broker_epoch, now_ms, metadata_offset)
            return
        session.last_contact_ms = max(session.last_contact_ms, now_ms)
        session.metadata_offset = max(session.metadata_offset, metadata_offset)

    def last_contact_ms(self, broker_id: int, broker_epoch: int) -> int | None:
        session = self._sessions.get(broker_id)
        if session is None or session.broker_epoch != broker_epoch:
            return None
        return session.last_contact_ms

    def metadata_offset(self, broker_id: int, broker_epoch: int) -> int:
        """The last metadata offset this broker incarnation reported, or -1."""
        session = self._sessions.get(broker_id)
        if session is None or session.broker_epoch != broker_epoch:
            return -1
        return session.metadata_offset

    def has_valid_session(self, broker_id: int, broker_epoch: int, now_ms: int) -> bool:
        last = self.last_contact_ms(broker_id, broker_epoch)
        return last is not None and not self._expired(last, now_ms)

    def is_expired(self, broker_id: int, broker_epoch: int, now_ms: int) -> bool:
        """True if the session timed out; counts from activation when never heard from."""
        last = self.last_contact_ms(broker_id, broker_epoch)
        return self._expired(self._activated_at_ms if last is None else last, now_ms)

    def _expired(self, last_contact_ms: int, now_ms: int) -> bool:
        # BrokerHeartbeatTracker.isExpired: strictly more than the timeout has passed.
        return last_contact_ms + self.session_timeout_ms < now_ms

    def controlled_shutdown_offset(self, broker_id: int, broker_epoch: int) -> int | None:
        session = self._sessions.get(broker_id)
        if session is None or session.broker_epoch != broker_epoch:
            return None
        return session.controlled_shutdown_offset

    def lowest_active_offset(self, image: MetadataImage) -> float:
        """The least metadata offset the unfenced brokers not shutting down last reported
        (Kafka's ``BrokerHeartbeatManager.lowestActiveOffset``); infinite when there are none.
        One not heard from since this controller's activation counts as -1: Kafka registers
        every broker at activation with offset -1 (``BrokerHeartbeatManager.register``), so a
        controlled shutdown asked right after a failover waits for the others to report past
        its fencing, as it would have before (it was granted at once)."""
        lowest = math.inf
        for broker_id in image.unfenced_broker_ids():
            session = self._sessions.get(broker_id)
            if session is None or session.broker_epoch != image.brokers[broker_id].broker_epoch:
                lowest = min(lowest, -1)
            elif session.controlled_shutdown_offset is None:
                lowest = min(lowest, session.metadata_offset)
        return lowest

    def set_controlled_shutdown_offset(
        self, broker_id: int, broker_epoch: int, offset: int
    ) -> None:
        session = self._sessions.get(broker_id)
        assert session is not None and session.broker_epoch == broker_epoch, broker_id
        if session.controlled_shutdown_offset is None:
            session.controlled_shutdown_offset = offset

    def controlled_shutdowns_written_up_to(self, offset: int) -> None:
        """The records of every controlled shutdown under way are written up to ``offset``
        (Kafka's ``maybeUpdateControlledShutdownOffset``, given a write's last offset): a
        write in batches, or one abandoned that a controller deciding again put behind its
        own batch. A broker goes once the others have replayed that far."""
        for session in self._sessions.values():
            if session.controlled_shutdown_offset is not None:
                session.controlled_shutdown_offset = max(session.controlled_shutdown_offset, offset)

    def recently_proposed(
        self, broker_id: int, broker_epoch: int, fenced: bool, now_ms: int, backoff_ms: int
    ) -> bool:
        proposed = self._proposed.get(broker_id)
        if proposed is None:
            return False
        epoch, was_fenced, at_ms = proposed
        return epoch == broker_epoch and was_fenced == fenced and now_ms - at_ms < backoff_ms

    def note_proposed(self, broker_id: int, broker_epoch: int, fenced: bool, now_ms: int) -> None:
        self._proposed[broker_id] = (broker_epoch, fenced, now_ms)


# ------------------------------------------------------------------------ placement


class UsableBroker(NamedTuple):
    """A registered broker as placement sees it (Kafka's ``UsableBroker``, without rack)."""

    broker_id: int
    fenced: bool


class PlacementError(Exception):
    """Replicas cannot be placed; ``error`` is the Kafka error code to answer."""

    def __init__(self, error: Errors, message: str) -> None:
        super().__init__(message)
        self.error = error


def place_replicas(
    brokers: Iterable[UsableBroker],
    num_partitions: int,
    replication_factor: int,
    *,
    leader_counts: Mapping[int, int] | None = None,
    replica_counts: Mapping[int, int] | None = None,
    successor_counts: Mapping[tuple[int, int], int] | None = None,
) -> list[tuple[int, ...]]:
    """Choose the replicas of ``num_partitions`` new partitions; the first is the leader.

    ``leader_counts`` and ``replica_counts`` are the partitions each broker already leads and
    hosts; ``successor_counts[(a, b)]`` how many partitions have ``a`` first and ``b`` second
    in their replica list (all empty by default).

    - Leaders (first pass): an unfenced broker with the fewest leaders, then the fewest
      replicas, then the next in round-robin order after the previous leader. So the leader
      counts of unfenced brokers never spread further apart, and end at most one apart if they
      started so.
    - Second replica, the successor (second pass): when a broker fails, the first live ISR
      member of each partition it led takes over, normally the second replica. For each
      partition of leader ``a``, the successor is the broker ``b`` with the smallest
      ``final leader count of b + successor_counts[(a, b)]`` (water-filling), so that after
      any one broker fails the survivors' leader counts stay within one of each other.
    - Other followers: the brokers with the fewest replicas.

    Followers prefer unfenced brokers; ties go round-robin from an offset that advances with
    each partition the leader gets (``StripedReplicaPlacer``'s stripes). Balancing failover
    comes first: with two replicas per partition the replica counts may spread by a few.
    Constraints as in ``StripedReplicaPlacer``: at most one replica per broker, the leader
    unfenced. Deterministic: the same inputs give the same placement.
    """
    by_id = {b.broker_id: b for b in brokers}
    ring = sorted(by_id)
    if replication_factor <= 0:
        raise PlacementError(
            Errors.INVALID_REPLICATION_FACTOR,
            f"Invalid replication factor {replication_factor}: the replication factor must be "
            "positive.",
        )
    if num_partitions <= 0:
        raise PlacementError(
            Errors.INVALID_PARTITIONS,
            f"Invalid number of partitions {num_partitions}: it must be positive.",
        )
    if replication_factor > len(ring):
        raise PlacementError(
            Errors.INVALID_REPLICATION_FACTOR,
            f"The target replication factor of {replication_factor} cannot be reached because "
            f"only {len(ring)} broker(s) are registered.",
        )
    unfenced = [b for b in ring if not by_id[b].fenced]
    if not unfenced:
        raise PlacementError(Errors.INVALID_REPLICATION_FACTOR, "All brokers are currently fenced.")
    leaders = {b: (leader_counts or {}).get(b, 0) for b in ring}
    replicas = {b: (replica_counts or {}).get(b, 0) for b in ring}
    successors = dict(successor_counts or {})
    position = {b: i for i, b in enumerate(ring)}
    n = len(ring)

    # Pass 1: the leaders, round-robin over the least loaded unfenced brokers.
    chosen_leaders: list[int] = []
    cursor = 0
    for _ in range(num_partitions):
        leader = min(unfenced, key=lambda b: (leaders[b], replicas[b], (position[b] - cursor) % n))
        chosen_leaders.append(leader)
        leaders[leader] += 1
        replicas[leader] += 1
        cursor = (position[leader] + 1) % n

    # Pass 2: the followers. ``leaders`` now holds the final leader counts.
    placements: list[tuple[int, ...]] = []
    led_so_far: dict[int, int] = {}
    for leader in chosen_leaders:
        start = position[leader] + 1
        shift = led_so_far.get(leader, 0)
        led_so_far[leader] = shift + 1

        def stripe(b: int, start: int = start, shift: int = shift) -> int:
            # Ring order after the leader, rotated by how many partitions the leader got.
            return ((position[b] - start) % n - shift) % (n - 1)

        chosen = [leader]
        others = [b for b in ring if b != leader]
        if replication_factor > 1:
            # If the leader fails, the successor takes this partition over: water-fill, so
            # that every survivor ends up leading about as many partitions as the others.
            successor = min(
                others,
                key=lambda b: (
                    by_id[b].fenced,
                    leaders[b] + successors.get((leader, b), 0),
                    replicas[b],
                    stripe(b),
                ),
            )
            successors[(leader, successor)] = successors.get((leader, successor), 0) + 1
            chosen.append(successor)
            others.remove(successor)
            others.sort(key=lambda b: (by_id[b].fenced, replicas[b], stripe(b)))
            chosen.extend(others[: replication_factor - 2])
        for b in chosen[1:]:
            replicas[b] += 1
        placements.append(tuple(chosen))
    return placements


# ------------------------------------------------------------------------ elections


_INT32_MAX: Final = (1 << 31) - 1


class Election(Enum):
    """Kafka's ``PartitionChangeBuilder.Election``."""

    PREFERRED = "preferred"  # the first replica if it is eligible, else as ONLINE
    ONLINE = "online"  # keep the leader if eligible, else the first eligible ISR/ELR member
    UNCLEAN = "unclean"  # as ONLINE, then any live replica (may lose committed data)


def build_partition_change(
    partition: PartitionState,
    *,
    is_acceptable_leader: Callable[[int], bool],
    min_isr: int,
    elr_enabled: bool,
    election: Election = Election.ONLINE,
    target_isr: Sequence[int] | None = None,
    unclean_shutdown_replicas: Collection[int] = (),
    lost_log_replicas: Collection[int] = (),
    offline_replicas: Collection[int] = (),
) -> PartitionChange | None:
    """The change that moves ``partition`` to ``target_isr`` (default: unchanged) and gives it
    an eligible leader, or None if nothing changes (Kafka's ``PartitionChangeBuilder.build``).

    Steps, in Kafka's order: recompute the ELR from the target ISR (KIP-966); elect a leader;
    an ELR leader makes the ISR just itself, an unclean one too (and clears the ELR); set the
    ISR (it may be empty only with ELR); remember the last known leader when the ISR empties.
    ``is_acceptable_leader`` says whether a broker is alive (unfenced) and allowed to lead;
    ``offline_replicas`` lead in no election, clean or unclean (their brokers report the log
    offline: Kafka's ``LeaderAcceptor`` asks ``hasOnlineDir``); neither they nor
    ``lost_log_replicas`` (back on an empty disk, or reporting the log offline) are kept as
    the last known leader. An unclean shutdown alone (``unclean_shutdown_replicas``) takes a
    replica out of the ELR, not out of being the last known leader, as in Kafka.
    """
    isr = tuple(partition.isr if target_isr is None else target_isr)
    elr = partition.elr
    if elr_enabled:
        # maybePopulateTargetElr: below min ISR, replicas that leave the ISR stay eligible.
        if len(isr) >= min_isr:
            elr = ()
        else:
            candidates = set(partition.elr) | set(partition.isr)
            elr = tuple(
                r
                for r in partition.replicas
                if r in candidates and r not in isr and r not in unclean_shutdown_replicas
            )

    acceptable = is_acceptable_leader
    if offline_replicas:

        def acceptable(replica: int) -> bool:
            return replica not in offline_replicas and is_acceptable_leader(replica)

    leader, unclean = _elect_leader(
        partition, isr, elr, election, acceptable, elr_enabled=elr_enabled
    )
    record_leader = NO_LEADER_CHANGE
    record_isr: tuple[int, ...] | None = None
    if leader != partition.leader:
        if leader in elr:
            isr = (leader,)
            elr = tuple(r for r in elr if r != leader)
        record_leader = leader
        if unclean:
            # An unclean election forcibly makes the ISR just the new leader (data loss).
            record_isr = (leader,)

    # maybeUpdateRecordElr: an unclean election, or ELR being off, clears the ELR.
    if record_isr is not None or not elr_enabled:
        elr = ()
    record_elr = elr if elr != partition.elr else None

    # Without ELR the ISR never becomes empty: the last member stays (leaderless partition).
    if record_isr is None and (isr or elr_enabled) and isr != partition.isr:
        record_isr = isr

    # maybeUpdateLastKnownLeader ("last known leader" mode of KIP-966).
    # A replica whose log is lost or offline is never remembered, and is forgotten: Kafka's
    # unclean election takes the last known leader only if its ``LeaderAcceptor`` finds the
    # replica's directory online, and an empty or missing log elected there lost every
    # record, where another replica lost at most a tail.
    record_last_known_elr: tuple[int, ...] | None = None
    if elr_enabled:
        lost = {*lost_log_replicas, *offline_replicas}
        if (
            record_isr == ()
            and partition.leader != NO_LEADER
            and partition.leader not in lost
            and partition.last_known_elr != (partition.leader,)
        ):
            record_last_known_elr = (partition.leader,)
        elif partition.last_known_elr and (
            record_leader >= 0
            or NO_LEADER not in (partition.leader, record_leader)
            or any(r in lost for r in partition.last_known_elr)
        ):
            record_last_known_elr = ()

    if (
        record_leader == NO_LEADER_CHANGE
        and record_isr is None
        and record_elr is None
        and record_last_known_elr is None
    ):
        return None
    return PartitionChange(
        topic_id=partition.topic_id,
        partition=partition.partition,
        expected_partition_epoch=partition.partition_epoch,
        leader=record_leader,
        isr=record_isr,
        elr=record_elr,
        last_known_elr=record_last_known_elr,
    )


def _elect_leader(
    partition: PartitionState,
    isr: tuple[int, ...],
    elr: tuple[int, ...],
    election: Election,
    is_acceptable_leader: Callable[[int], bool],
    *,
    elr_enabled: bool,
) -> tuple[int, bool]:
    """(leader, unclean) following ``PartitionChangeBuilder.electLeader``."""

    def is_valid(replica: int) -> bool:
        # isValidNewLeader: an ISR member, or an ELR member when the ISR is empty; alive.
        eligible = replica in isr or (not isr and replica in elr)
        return eligible and is_acceptable_leader(replica)

    if election is Election.PREFERRED and is_valid(partition.preferred_leader):
        return partition.preferred_leader, False
    if partition.leader != NO_LEADER and is_valid(partition.leader):
        return partition.leader, False
    for replica in partition.replicas:
        if is_valid(replica):
            return replica, False
    if election is Election.UNCLEAN:
        # Kafka tries the last known leader first (balanced recovery) whatever the election
        # type; kcoord does so only when unclean election is allowed.
        last_known = partition.last_known_elr
        if (
            elr_enabled
            and not isr
            and not elr
            and len(last_known) == 1
            and is_acceptable_leader(last_known[0])
        ):
            return last_known[0], True
        for replica in partition.replicas:
            if is_acceptable_leader(replica):
                return replica, True
    return NO_LEADER, False


class _Working:
    """The image plus the changes of the decision being built (never written to the image)."""

    __slots__ = ("_fenced", "_partitions", "image")

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self._partitions: dict[TopicIdPartition, PartitionState] = {}
        self._fenced: dict[int, bool] = {}

    def partition(self, tp: TopicIdPartition) -> PartitionState:
        state = self._partitions.get(tp)
        if state is None:
            state = self.image.partition(tp.topic_id, tp.partition)
            assert state is not None, tp
        return state

    def is_unfenced(self, broker_id: int) -> bool:
        if broker_id in self._fenced:
            return not self._fenced[broker_id]
        return not self.image.is_fenced(broker_id)

    def set_fenced(self, broker_id: int, fenced: bool) -> None:
        self._fenced[broker_id] = fenced

    def change(self, change: PartitionChange) -> PartitionState:
        tp = TopicIdPartition(change.topic_id, change.partition)
        before = self.partition(tp)
        assert change.expected_partition_epoch == before.partition_epoch, (change, before)
        after = before.merge(change)
        reason = partition_state_error(after)
        assert reason is None, (reason, change, before)
        self._partitions[tp] = after
        return after

    def with_isr_member(self, broker_id: int) -> list[TopicIdPartition]:
        """The partitions whose ISR has the broker, sorted: ``partitions_where`` for it,
        without looking up every state of the image first."""
        changed = [tp for tp, state in self._partitions.items() if broker_id in state.isr]
        return sorted(
            (self.image.isr_memberships(broker_id) - self._partitions.keys()) | {*changed}
        )

    def leaderless_hosted_by(self, broker_id: int) -> list[TopicIdPartition]:
        """The partitions without a leader that have the broker among their replicas, sorted:
        ``partitions_where`` for them, sorting only those that match."""
        tps = self.image.leaderless() | self._partitions.keys()
        return sorted(
            tp
            for tp in tps
            if (state := self.partition(tp)).leader == NO_LEADER and broker_id in state.replicas
        )

    def partitions_where(
        self, candidates: Iterable[PartitionState], predicate: Callable[[PartitionState], bool]
    ) -> list[TopicIdPartition]:
        """Partitions among ``candidates`` (from the image) and the changed ones that match."""
        tps = {state.tp for state in candidates} | self._partitions.keys()
        return sorted(tp for tp in tps if predicate(self.partition(tp)))


def _offline_but_eligible(
    image: MetadataImage, request: BrokerHeartbeatRequest
) -> list[TopicIdPartition]:
    """The partitions the heartbeat reports offline whose ISR or ELR still has its broker."""
    eligible = set()
    for topic_id, index in request.offline_replicas:
        state = image.partition(topic_id, index)
        if state is not None and (request.broker_id in state.isr or request.broker_id in state.elr):
            eligible.add(state.tp)
    return sorted(eligible)


# ------------------------------------------------------------------------ the controller


class Controller:
    """The active controller's decisions and soft state; see the module docstring.

    Create one when this node becomes the active controller (``activated_at_ms`` from the
    monotonic clock) and drop it when it stops being active.
    """

    __slots__ = ("_offline_reports", "config", "heartbeats")

    def __init__(self, config: ControllerConfig, activated_at_ms: int) -> None:
        self.config = config
        self.heartbeats = BrokerHeartbeatManager(config.broker_session_timeout_ms, activated_at_ms)
        # Soft state: the partitions each broker's latest heartbeat reports offline (its logs
        # that failed), until it registers again. Kafka's image records each replica's log
        # directory and each broker's online ones, and elects no replica on an offline one;
        # here no election chooses them: an unclean one chose such a replica again after each
        # heartbeat took it out, for as long as it stayed first in replica order. A new
        # controller learns them from the next heartbeats.
        self._offline_reports: dict[int, frozenset[TopicIdPartition]] = {}

    # ---------------------------------------------------------------- cluster id

    def maybe_write_cluster_id(
        self, image: MetadataImage, cluster_id: str
    ) -> ControllerResult[str]:
        """Write the cluster id if the image has none; the reply is the cluster's id."""
        assert cluster_id, "empty cluster id"
        if image.cluster_id is not None:
            return ControllerResult((), image.cluster_id)
        return ControllerResult((ClusterId(cluster_id),), cluster_id)

    # ---------------------------------------------------------------- brokers

    def _note_offline(self, request: BrokerHeartbeatRequest) -> None:
        """Keep what a (current) broker's heartbeat reports offline; see ``__init__``."""
        if request.offline_replicas:
            self._offline_reports[request.broker_id] = frozenset(
                TopicIdPartition(t, p) for t, p in request.offline_replicas
            )
        else:
            self._offline_reports.pop(request.broker_id, None)

    def _offline_replicas(self, tp: TopicIdPartition) -> tuple[int, ...]:
        """The brokers whose latest heartbeat reports ``tp``'s log offline."""
        if not self._offline_reports:
            return ()
        return tuple(b for b, tps in self._offline_reports.items() if tp in tps)

    def register_broker(
        self, image: MetadataImage, request: BrokerRegistrationRequest, now_ms: int
    ) -> ControllerResult[BrokerRegistrationReply]:
        """Handle a BrokerRegistration (``ClusterControlManager.registerBroker``)."""
        if (
            request.cluster_id is not None
            and image.cluster_id is not None
            and request.cluster_id != image.cluster_id
        ):
            return ControllerResult((), BrokerRegistrationReply(Errors.INCONSISTENT_CLUSTER_ID))
        if not 0 <= request.broker_id <= _INT32_MAX or not request.incarnation_id:
            # An id is an int32 on Kafka's wire: a larger one, registered, made every
            # Metadata answer listing it fail to encode.
            return ControllerResult((), BrokerRegistrationReply(Errors.INVALID_REQUEST))
        existing = image.broker(request.broker_id)
        if existing is not None and existing.incarnation_id == request.incarnation_id:
            # The same incarnation again (its reply was lost): idempotent.
            self.heartbeats.touch(request.broker_id, existing.broker_epoch, now_ms)
            return ControllerResult((), BrokerRegistrationReply(Errors.NONE, existing.broker_epoch))
        if existing is not None and self.heartbeats.has_valid_session(
            existing.broker_id, existing.broker_epoch, now_ms
        ):
            # Another live process holds this broker id.
            return ControllerResult(
                (), BrokerRegistrationReply(Errors.DUPLICATE_BROKER_REGISTRATION)
            )
        broker_epoch = image.last_offset + 1
        if existing is not None:
            broker_epoch = max(broker_epoch, existing.broker_epoch + 1)
        records: list[MetadataRecord] = []
        self._offline_reports.pop(request.broker_id, None)  # a new process loads its logs again
        if existing is not None:
            clean = request.previous_broker_epoch == existing.broker_epoch
            self._handle_broker_shutdown(
                _Working(image),
                existing.broker_id,
                clean,
                records,
                storage_lost=request.storage_lost,
            )
        records.append(
            RegisterBroker(
                broker_id=request.broker_id,
                incarnation_id=request.incarnation_id,
                broker_epoch=broker_epoch,
                endpoints=dict(request.endpoints),
                rack=request.rack,
                fenced=True,
            )
        )
        self.heartbeats.touch(request.broker_id, broker_epoch, now_ms)
        return ControllerResult(tuple(records), BrokerRegistrationReply(Errors.NONE, broker_epoch))

    def track_broker_heartbeat(
        self, image: MetadataImage, broker_id: int, broker_epoch: int, now_ms: int
    ) -> None:
        """Note a heartbeat's contact time as it arrives, before it waits its turn behind other
        controller work (Kafka's ``ClusterControlManager.trackBrokerHeartbeat``, which
        ``QuorumController.processBrokerHeartbeat`` calls outside the controller thread): a
        controller busy with, say, a CreateTopics waiting for its records then fences no broker
        whose heartbeat is queued."""
        registration = image.broker(broker_id)
        if registration is not None and registration.broker_epoch == broker_epoch:
            self.heartbeats.touch(broker_id, broker_epoch, now_ms)

    def steady_broker_heartbeat(
        self, image: MetadataImage, request: BrokerHeartbeatRequest, now_ms: int
    ) -> BrokerHeartbeatReply | None:
        """The answer to a heartbeat that can write nothing: a registered broker that does
        not want to shut down and is unfenced, or fenced and not yet caught up or wanting to
        stay fenced (a starting node until it has published its image: Kafka's
        ``calculateNextBrokerState`` keeps it FENCED with no record). Exactly what
        ``broker_heartbeat`` answers it, without its turn behind other decisions: a starting
        node's heartbeats timed out behind a long CreateTopics, and its listener stayed shut
        (review helper-279). None for every other heartbeat (it may write or decide:
        ``broker_heartbeat``)."""
        if request.want_shut_down:
            return None
        registration = image.broker(request.broker_id)
        if registration is None or registration.broker_epoch != request.broker_epoch:
            return None
        if request.want_fence and not registration.fenced:
            return None  # to be fenced
        self._note_offline(request)
        offset = request.current_metadata_offset
        caught_up = offset >= registration.caught_up_offset
        if registration.fenced and caught_up and not request.want_fence:
            return None  # due to be unfenced
        if not registration.fenced and _offline_but_eligible(image, request):
            return None  # to leave those ISRs and ELRs
        self.heartbeats.touch(registration.broker_id, registration.broker_epoch, now_ms, offset)
        return BrokerHeartbeatReply(Errors.NONE, caught_up, registration.fenced)

    def broker_heartbeat(
        self,
        current_image: Callable[[], MetadataImage],
        request: BrokerHeartbeatRequest,
        now_ms: int,
        *,
        max_changes: int | None = None,
    ) -> Iterator[ControllerResult[BrokerHeartbeatReply]]:
        """Handle a BrokerHeartbeat (``processBrokerHeartbeat``, ``calculateNextBrokerState``).
        Every result carries the same reply; more than one only where the heartbeat fences or
        unfences its broker, in parts as ``fence_stale_brokers`` (the caller applies each
        before it asks for the next, holding off every other decision)."""
        image = current_image()
        registration = image.broker(request.broker_id)
        if registration is None or registration.broker_epoch != request.broker_epoch:
            yield ControllerResult((), BrokerHeartbeatReply(Errors.STALE_BROKER_EPOCH))
            return
        broker_id, broker_epoch = registration.broker_id, registration.broker_epoch
        self._note_offline(request)
        offset = request.current_metadata_offset
        self.heartbeats.touch(broker_id, broker_epoch, now_ms, offset)
        caught_up = offset >= registration.caught_up_offset
        backoff_ms = self.config.fencing_proposal_backoff_ms
        if registration.fenced:
            if request.want_shut_down:
                # Kafka's calculateNextBrokerState: once every active broker has replayed the
                # records that moved its leaderships away, so that the new leaders serve
                # before the old one goes.
                shutdown_offset = self.heartbeats.controlled_shutdown_offset(
                    broker_id, broker_epoch
                )
                may_shut_down = (
                    shutdown_offset is None
                    or self.heartbeats.lowest_active_offset(image) >= shutdown_offset
                )
                yield ControllerResult(
                    (), BrokerHeartbeatReply(Errors.NONE, caught_up, True, may_shut_down)
                )
                return
            if request.want_fence or not caught_up:
                yield ControllerResult((), BrokerHeartbeatReply(Errors.NONE, caught_up, True))
                return
            reply = BrokerHeartbeatReply(Errors.NONE, True, False)
            if self.heartbeats.recently_proposed(
                broker_id, broker_epoch, False, now_ms, backoff_ms
            ):
                yield ControllerResult((), reply)
                return
            self.heartbeats.note_proposed(broker_id, broker_epoch, False, now_ms)
            offline = {TopicIdPartition(t, p) for t, p in request.offline_replicas}
            for part in self._unfence_parts(
                current_image, broker_id, broker_epoch, max_changes, offline
            ):
                yield ControllerResult(tuple(part), reply)
            return
        if request.want_fence or request.want_shut_down:
            reply = BrokerHeartbeatReply(Errors.NONE, caught_up, True, False)
            if request.want_shut_down:
                # The broker may go once the active brokers have replayed past the records
                # fencing it (the caller raises this offset to where they were written).
                self.heartbeats.set_controlled_shutdown_offset(
                    broker_id, broker_epoch, image.last_offset + 1
                )
            if self.heartbeats.recently_proposed(broker_id, broker_epoch, True, now_ms, backoff_ms):
                yield ControllerResult((), reply)
                return
            self.heartbeats.note_proposed(broker_id, broker_epoch, True, now_ms)
            parts = self._fence_parts(current_image, _Working(image), broker_id, max_changes)
            for part, _ in parts:
                yield ControllerResult(tuple(part), reply)
            return
        records: list[MetadataRecord] = []
        self._handle_offline_replicas(_Working(image), request, records)
        yield ControllerResult(tuple(records), BrokerHeartbeatReply(Errors.NONE, caught_up, False))

    def _handle_offline_replicas(
        self, working: _Working, request: BrokerHeartbeatRequest, records: list[MetadataRecord]
    ) -> None:
        """The broker leaves the ISR (and leadership) of the partitions whose logs it reports
        offline, as ``ReplicationControlManager.handleDirectoriesOffline`` does for the
        replicas of an offline log directory: a new leader is elected from the rest of the
        ISR. It leaves their ELR too: Kafka keeps such a replica there but never elects it
        (its ``LeaderAcceptor`` asks ``hasOnlineDir``); the image here does not record offline
        logs, and an ELR member is elected once the ISR empties, by a broker that would refuse
        to host the log (a log that failed to load may also come back shorter). Those it is
        in neither of are left alone, so a report repeated at every heartbeat proposes nothing
        more once that change is applied."""
        eligible = _offline_but_eligible(working.image, request)
        self._generate_leader_and_isr_updates(
            working,
            eligible,
            records,
            broker_with_unclean_shutdown=request.broker_id,
            log_lost=True,
        )

    def fence_stale_brokers(
        self,
        current_image: Callable[[], MetadataImage],
        now_ms: int,
        *,
        max_changes: int | None = None,
    ) -> Iterator[ControllerResult[tuple[int, ...]]]:
        """Fence the unfenced brokers whose session expired, in results that change at most
        ``max_changes`` partitions each (None: one result); a reply lists the brokers its
        result fences. The caller applies each result before it asks for the next, which is decided
        on ``current_image()``; nothing else may change the image between them: a broker's
        partitions are chosen when its first part is decided (Kafka's ``handleBrokerFenced``
        decides them all at once). A broker is fenced by the result that changes the last of
        its partitions, after them, as there."""
        assert max_changes is None or max_changes > 0, max_changes
        image = current_image()
        working = _Working(image)
        records: list[MetadataRecord] = []
        fenced: list[int] = []
        backoff_ms = self.config.fencing_proposal_backoff_ms
        for broker_id in image.unfenced_broker_ids():
            epoch = image.brokers[broker_id].broker_epoch
            if not self.heartbeats.is_expired(broker_id, epoch, now_ms):
                continue
            if self.heartbeats.recently_proposed(broker_id, epoch, True, now_ms, backoff_ms):
                continue
            if max_changes is not None and records:
                yield ControllerResult(tuple(records), tuple(fenced))
                records, fenced = [], []
                working = _Working(current_image())
            for part, last in self._fence_parts(current_image, working, broker_id, max_changes):
                records.extend(part)
                if not last:
                    yield ControllerResult(tuple(records), tuple(fenced))
                    records, fenced = [], []
            self.heartbeats.note_proposed(broker_id, epoch, True, now_ms)
            fenced.append(broker_id)
        yield ControllerResult(tuple(records), tuple(fenced))

    def _fence_parts(
        self,
        current_image: Callable[[], MetadataImage],
        working: _Working,
        broker_id: int,
        max_changes: int | None,
    ) -> Iterator[tuple[list[MetadataRecord], bool]]:
        """The records fencing a broker (``ReplicationControlManager.handleBrokerFenced``: it
        leaves every ISR, then FenceBroker), in parts of at most ``max_changes`` partition
        changes (None: one part), each with whether it is the last, which ends with the
        FenceBroker. The first is decided on ``working``; the broker's partitions are chosen
        there, and each later part is decided on ``current_image()``, the one before applied."""
        registration = working.image.broker(broker_id)
        assert registration is not None, broker_id
        working.set_fenced(broker_id, True)
        in_isr = working.with_isr_member(broker_id)
        step = max_changes or max(len(in_isr), 1)
        records: list[MetadataRecord] = []
        for start in range(0, len(in_isr), step):
            if start:
                yield records, False
                records = []
                working = _Working(current_image())
                working.set_fenced(broker_id, True)
            self._generate_leader_and_isr_updates(
                working, in_isr[start : start + step], records, broker_to_remove=broker_id
            )
        records.append(FenceBroker(broker_id, registration.broker_epoch))
        yield records, True

    def _unfence_parts(
        self,
        current_image: Callable[[], MetadataImage],
        broker_id: int,
        broker_epoch: int,
        max_changes: int | None,
        offline: Collection[TopicIdPartition] = (),
    ) -> Iterator[list[MetadataRecord]]:
        """The records unfencing a broker (``ReplicationControlManager.handleBrokerUnfenced``:
        UnfenceBroker, then it is elected where a partition it hosts has no leader), in parts
        as ``_fence_parts``; the first, with the UnfenceBroker, holds at most ``max_changes``
        elections too (a whole cluster back after an outage has every partition
        leaderless). Not where its heartbeat reports the log ``offline``: Kafka elects a
        replica only on a log directory its registration lists online (``hasOnlineDir``); the
        next heartbeat takes it out of that ISR or ELR (``_handle_offline_replicas``)."""
        working = _Working(current_image())
        records: list[MetadataRecord] = [UnfenceBroker(broker_id, broker_epoch)]
        working.set_fenced(broker_id, False)
        leaderless = [tp for tp in working.leaderless_hosted_by(broker_id) if tp not in offline]
        step = max_changes or max(len(leaderless), 1)
        for start in range(0, len(leaderless), step):
            if start:
                yield records
                records = []
                working = _Working(current_image())
            self._generate_leader_and_isr_updates(
                working, leaderless[start : start + step], records, broker_to_add=broker_id
            )
        yield records

    def _handle_broker_shutdown(
        self,
        working: _Working,
        broker_id: int,
        clean: bool,
        records: list[MetadataRecord],
        *,
        storage_lost: bool = False,
    ) -> None:
        # ReplicationControlManager.handleBrokerShutdown, run when a new incarnation registers.
        if self.config.eligible_leader_replicas_enabled and (
            storage_lost or (self.config.unclean_shutdown_detection_enabled and not clean)
        ):
            # The old incarnation may have lost its unflushed tail: not eligible any more.
            # Back on an empty disk, not the last known leader either, which the image does
            # not index: every partition is looked at, once per such registration (a rare
            # event), or an unclean election could still choose its empty log.
            candidates = [
                *working.image.partitions_with_isr_member(broker_id),
                *working.image.partitions_with_elr_member(broker_id),
            ]
            if storage_lost:
                candidates += [
                    s for s in working.image.all_partitions() if broker_id in s.last_known_elr
                ]
            in_isr_or_elr = working.partitions_where(
                candidates,
                lambda s: (
                    broker_id in s.isr
                    or broker_id in s.elr
                    or (storage_lost and broker_id in s.last_known_elr)
                ),
            )
            self._generate_leader_and_isr_updates(
                working,
                in_isr_or_elr,
                records,
                broker_with_unclean_shutdown=broker_id,
                log_lost=storage_lost,
            )
        else:
            working.set_fenced(broker_id, True)
            in_isr = working.partitions_where(
                working.image.partitions_with_isr_member(broker_id), lambda s: broker_id in s.isr
            )
            self._generate_leader_and_isr_updates(
                working, in_isr, records, broker_to_remove=broker_id
            )

    def _generate_leader_and_isr_updates(
        self,
        working: _Working,
        partitions: Iterable[TopicIdPartition],
        records: list[MetadataRecord],
        *,
        broker_to_remove: int = NO_LEADER,
        broker_to_add: int = NO_LEADER,
        broker_with_unclean_shutdown: int = NO_LEADER,
        log_lost: bool = False,
    ) -> None:
        # ReplicationControlManager.generateLeaderAndIsrUpdates; ``log_lost``: the broker
        # with the unclean shutdown lost its logs (an empty disk, or logs reported offline).
        removed = {b for b in (broker_to_remove, broker_with_unclean_shutdown) if b != NO_LEADER}

        def is_acceptable_leader(replica: int) -> bool:
            if replica in removed:
                return False
            return replica == broker_to_add or working.is_unfenced(replica)

        unclean_shutdown = (
            () if broker_with_unclean_shutdown == NO_LEADER else (broker_with_unclean_shutdown,)
        )
        lost_logs = unclean_shutdown if log_lost else ()
        for tp in partitions:
            state = working.partition(tp)
            change = build_partition_change(
                state,
                is_acceptable_leader=is_acceptable_leader,
                min_isr=self._min_isr(working.image, state),
                elr_enabled=self.config.eligible_leader_replicas_enabled,
                election=self._online_election(working.image, state.topic_id),
                target_isr=[r for r in state.isr if r not in removed],
                unclean_shutdown_replicas=unclean_shutdown,
                lost_log_replicas=lost_logs,
                offline_replicas=self._offline_replicas(tp),
            )
            if change is not None:
                working.change(change)
                records.append(change)

    # ---------------------------------------------------------------- topics

    def create_topics(
        self, image: MetadataImage, topics: Sequence[NewTopic]
    ) -> ControllerResult[tuple[CreateTopicResult, ...]]:
        """``ReplicationControlManager.createTopics``: every topic as ``create_topic``, in
        one atomic batch (``atomic_of``). The request's partitions together (-1 counting
        the default) may not exceed ``MAX_PARTITIONS_PER_REQUEST``, or every topic is
        refused (``validateTotalNumberOfPartitions``)."""
        total = sum(
            len(t.assignments)
            if t.assignments
            else self.config.num_partitions
            if t.num_partitions == -1
            else max(t.num_partitions, 0)
            for t in topics
        )
        if total > MAX_PARTITIONS_PER_REQUEST:
            refused = CreateTopicResult(
                Errors.POLICY_VIOLATION, "Excessively large number of partitions per request."
            )
            return ControllerResult((), tuple(refused for _ in topics))
        index = PlacementIndex(image)
        return atomic_of(
            image,
            topics,
            lambda scratch, t: self.create_topic(
                scratch,
                t.name,
                t.topic_id,
                num_partitions=t.num_partitions,
                replication_factor=t.replication_factor,
                configs=t.configs,
                assignments=t.assignments,
                index=index,
            ),
        )

    def create_topic(
        self,
        image: MetadataImage,
        name: str,
        topic_id: str,
        *,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str | None] | None = None,
        assignments: Sequence[tuple[int, Sequence[int]]] = (),
        index: PlacementIndex | None = None,
    ) -> ControllerResult[CreateTopicResult]:
        """Create a topic with placed replicas (``ReplicationControlManager.createTopic``).

        -1 for ``num_partitions`` or ``replication_factor`` takes the configured default.
        ``assignments`` (partition index, replicas) places them by hand instead: both must
        then be -1, and each partition's leader is its first live replica. ``index``: the
        request's ``PlacementIndex`` of ``image``, which this topic then joins.
        """
        if index is None:
            index = PlacementIndex(image)
        topic_configs = dict(configs or {})
        name_error = topic_name_error(name)
        if name_error is not None:
            return _create_topic_error(Errors.INVALID_TOPIC_EXCEPTION, name_error)
        if name == CLUSTER_METADATA_TOPIC_NAME:
            # ControllerApis.createTopics. Here, not only in the CreateTopics handler: a
            # Metadata request's auto-creation comes straight to the controller.
            return _create_topic_error(
                Errors.INVALID_REQUEST,
                f"Creation of internal topic {CLUSTER_METADATA_TOPIC_NAME} is prohibited.",
            )
        if image.topic_by_name(name) is not None:
            return _create_topic_error(
                Errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists."
            )
        other = index.collision(name)
        if other is not None:
            # Topic.hasCollision: '.' and '_' name the same metric (validateNewTopicNames).
            return _create_topic_error(
                Errors.INVALID_TOPIC_EXCEPTION,
                f"Topic '{name}' collides with existing topic: {other}",
            )
        if not topic_id or image.topic(topic_id) is not None:
            return _create_topic_error(
                Errors.INVALID_REQUEST, f"Topic id {topic_id!r} is empty or already in use."
            )
        config_error = _topic_config_error(image, topic_configs)
        if config_error is not None:
            return _create_topic_error(Errors.INVALID_CONFIG, config_error)
        placements: Sequence[tuple[int, ...]]
        if assignments:
            manual = _manual_placements(image, num_partitions, replication_factor, assignments)
            if isinstance(manual, tuple):
                return _create_topic_error(*manual)
            placements = manual
            num_partitions, replication_factor = len(placements), len(placements[0])
        else:
            if num_partitions == -1:
                num_partitions = self.config.num_partitions
            if replication_factor == -1:
                replication_factor = self.config.default_replication_factor
            try:
                placements = index.place(image, num_partitions, replication_factor)
            except PlacementError as e:
                return _create_topic_error(e.error, str(e))
        index.add(name, placements)
        valid_configs = {k: v for k, v in topic_configs.items() if v is not None}
        records: list[MetadataRecord] = [Topic(name, topic_id, valid_configs)]
        for partition, replicas in enumerate(placements):
            # The ISR is the live replicas, the leader the first of them (placement puts a
            # live one first; a manual assignment has one at least).
            isr = tuple(r for r in replicas if not image.is_fenced(r))
            assert isr, (replicas, isr)
            records.append(
                Partition(
                    topic_id=topic_id,
                    partition=partition,
                    replicas=replicas,
                    isr=isr,
                    leader=isr[0],
                    leader_epoch=0,
                    partition_epoch=0,
                )
            )
        return ControllerResult(
            tuple(records),
            CreateTopicResult(Errors.NONE, "", topic_id, num_partitions, replication_factor),
        )

    def create_offsets_topic(
        self, image: MetadataImage, topic_id: str
    ) -> ControllerResult[CreateTopicResult]:
        """Create ``__consumer_offsets`` (``offsets.topic.num.partitions`` partitions, replication
        factor ``min(offsets.topic.replication.factor, registered brokers)``), with the configs
        of Kafka's ``GroupCoordinator.groupMetadataTopicConfigs`` and a min ISR of 2 for three
        or more replicas (DESIGN.md section 5).
        """
        replication_factor = min(self.config.offsets_topic_replication_factor, len(image.brokers))
        segment_bytes = self.config.offsets_topic_segment_bytes
        configs = {
            "cleanup.policy": "compact",
            "compression.type": "producer",
            # Below KIP-1030's minimum of segment.bytes (tests roll small segments) as the
            # internal config that has none.
            (
                "segment.bytes" if segment_bytes >= SEGMENT_BYTES_MIN else INTERNAL_SEGMENT_BYTES
            ): str(segment_bytes),
            MIN_INSYNC_REPLICAS_CONFIG: str(max(1, min(2, replication_factor - 1))),
        }
        return self.create_topic(
            image,
            OFFSETS_TOPIC_NAME,
            topic_id,
            num_partitions=self.config.offsets_topic_num_partitions,
            replication_factor=max(replication_factor, 0),
            configs=configs,
        )

    def create_partitions_of(
        self, image: MetadataImage, topics: Sequence[NewPartitions]
    ) -> ControllerResult[tuple[CreatePartitionsResult, ...]]:
        """Every topic as ``create_partitions``, in one atomic batch (``atomic_of``). The
        partitions the request adds together may not exceed ``MAX_PARTITIONS_PER_REQUEST``, or
        every topic is refused: Kafka bounds the records of one request (a ``BoundedList``;
        ``EventHandlerExceptionInfo`` makes its overflow a POLICY_VIOLATION for the whole
        request). Counted before anything is placed, over the topics that exist and grow; Kafka
        counts the records of those that pass every check."""
        adding = 0
        for t in topics:
            topic = image.topic_by_name(t.name)
            if topic is not None and t.name != OFFSETS_TOPIC_NAME:
                adding += max(t.count - len(image.partitions_of(topic.topic_id)), 0)
        if adding > MAX_PARTITIONS_PER_REQUEST:
            refused = CreatePartitionsResult(
                Errors.POLICY_VIOLATION, "Unable to perform excessively large batch operation."
            )
            return ControllerResult((), tuple(refused for _ in topics))
        index = PlacementIndex(image)
        return atomic_of(
            image,
            topics,
            lambda scratch, t: self.create_partitions(
                scratch, t.name, t.count, t.assignments, index=index
            ),
        )

    def create_partitions(
        self,
        image: MetadataImage,
        name: str,
        count: int,
        assignments: Sequence[Sequence[int]] | None = None,
        *,
        index: PlacementIndex | None = None,
    ) -> ControllerResult[CreatePartitionsResult]:
        """Grow ``name`` to ``count`` partitions (``ReplicationControlManager.createPartitions``).

        New partitions keep the replication factor of the existing ones and are placed like a
        new topic's, balanced against every partition in the cluster, unless ``assignments``
        gives the replicas of each new partition (validated as Kafka's
        ``validateManualPartitionAssignment``). The leader is the first live replica and the
        ISR the live replicas. Unlike Kafka, ``__consumer_offsets`` cannot grow: its partition
        count maps every group to its coordinator, and changing it would move every group.
        """
        topic = image.topic_by_name(name)
        if topic is None:
            return _create_partitions_error(Errors.UNKNOWN_TOPIC_OR_PARTITION, "")
        existing = image.partitions_of(topic.topic_id)
        current = len(existing)
        if name == OFFSETS_TOPIC_NAME:
            return _create_partitions_error(
                Errors.INVALID_PARTITIONS,
                f"The number of partitions of {OFFSETS_TOPIC_NAME} cannot change: it maps "
                "every group to its coordinator.",
            )
        if count == current:
            return _create_partitions_error(
                Errors.INVALID_PARTITIONS, f"Topic already has {current} partition(s)."
            )
        if count < current:
            return _create_partitions_error(
                Errors.INVALID_PARTITIONS,
                f"The topic {name} currently has {current} partition(s); {count} would not be "
                "an increase.",
            )
        additional = count - current
        if additional > MAX_PARTITIONS_PER_REQUEST:  # create_partitions_of refuses the request
            return _create_partitions_error(
                Errors.POLICY_VIOLATION, "Unable to perform excessively large batch operation."
            )
        if assignments is not None and len(assignments) != additional:
            return _create_partitions_error(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"Attempted to add {additional} additional partition(s), but only "
                f"{len(assignments)} assignment(s) were specified.",
            )
        if not existing:
            return _create_partitions_error(
                Errors.UNKNOWN_SERVER_ERROR,
                f"Invalid state: topic {name} appears to have no partitions.",
            )
        replication_factor = len(existing[0].replicas)
        if index is None:
            index = PlacementIndex(image)
        if assignments is None:
            try:
                placements = index.place(image, additional, replication_factor)
            except PlacementError as e:
                return _create_partitions_error(e.error, str(e))
        else:
            placements = []
            for i, replicas in enumerate(assignments):
                error = _manual_assignment_error(image, replicas, replication_factor)
                if error is None and all(image.is_fenced(r) for r in replicas):
                    error = (
                        "All brokers specified in the manual partition assignment for "
                        f"partition {current + i} are fenced or in controlled shutdown."
                    )
                if error is not None:
                    return _create_partitions_error(Errors.INVALID_REPLICA_ASSIGNMENT, error)
                placements.append(tuple(replicas))
        index.add(None, placements)
        records: list[MetadataRecord] = []
        for i, replicas in enumerate(placements):
            isr = tuple(r for r in replicas if not image.is_fenced(r))
            assert isr, (replicas, "placement always picks a live leader")
            records.append(
                Partition(
                    topic_id=topic.topic_id,
                    partition=current + i,
                    replicas=replicas,
                    isr=isr,
                    leader=isr[0],
                    leader_epoch=0,
                    partition_epoch=0,
                )
            )
        return ControllerResult(tuple(records), CreatePartitionsResult(Errors.NONE))

    def delete_topic(self, image: MetadataImage, topic_id: str) -> ControllerResult[Errors]:
        """Delete a topic (``ReplicationControlManager.deleteTopic``).

        Never ``__consumer_offsets``, which holds every group's state and coordinator routing
        (a deviation: KRaft Kafka's ControllerApis.deleteTopics would delete it): refused
        here, not only by the Kafka listener's handler, since a peer's DeleteTopics RPC
        reaches the controller directly."""
        topic = image.topic(topic_id)
        if topic is None:
            return ControllerResult((), Errors.UNKNOWN_TOPIC_ID)
        if topic.name == OFFSETS_TOPIC_NAME:
            return ControllerResult((), Errors.INVALID_REQUEST)
        return ControllerResult((RemoveTopic(topic_id),), Errors.NONE)

    # ---------------------------------------------------------------- ISR changes, elections

    def alter_partition(
        self, image: MetadataImage, request: AlterPartitionRequest
    ) -> ControllerResult[AlterPartitionResponse]:
        """Validate and apply ISR changes asked by a partition leader
        (``ReplicationControlManager.alterPartition``)."""
        registration = image.broker(request.broker_id)
        if registration is None or registration.broker_epoch != request.broker_epoch:
            # ClusterControlManager.checkBrokerEpoch.
            return ControllerResult((), AlterPartitionResponse(Errors.STALE_BROKER_EPOCH))
        working = _Working(image)
        records: list[MetadataRecord] = []
        results: list[AlterPartitionResult] = []
        for item in request.partitions:
            error = self._alter_partition_error(working, request.broker_id, item)
            if error is not Errors.NONE:
                results.append(AlterPartitionResult(item.topic_id, item.partition, error))
                continue
            tp = TopicIdPartition(item.topic_id, item.partition)
            state = working.partition(tp)
            change = build_partition_change(
                state,
                is_acceptable_leader=working.is_unfenced,
                min_isr=self._min_isr(image, state),
                elr_enabled=self.config.eligible_leader_replicas_enabled,
                election=self._online_election(image, state.topic_id),
                target_isr=[member.broker_id for member in item.new_isr],
                offline_replicas=self._offline_replicas(tp),
            )
            if change is not None:
                state = working.change(change)
                records.append(change)
            if state.leader != request.broker_id:
                # The change moved leadership (cannot happen while the requester is a live ISR
                # member; kept for parity with Kafka).
                results.append(
                    AlterPartitionResult(item.topic_id, item.partition, Errors.NEW_LEADER_ELECTED)
                )
                continue
            results.append(
                AlterPartitionResult(
                    item.topic_id,
                    item.partition,
                    Errors.NONE,
                    state.leader,
                    state.leader_epoch,
                    state.partition_epoch,
                    state.isr,
                )
            )
        return ControllerResult(tuple(records), AlterPartitionResponse(Errors.NONE, tuple(results)))

    def _alter_partition_error(
        self, working: _Working, broker_id: int, item: AlterPartitionItem
    ) -> Errors:
        # validateAlterPartitionData, check by check.
        if working.image.topic(item.topic_id) is None:
            return Errors.UNKNOWN_TOPIC_ID
        if working.image.partition(item.topic_id, item.partition) is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION
        state = working.partition(TopicIdPartition(item.topic_id, item.partition))
        if item.leader_epoch > state.leader_epoch or item.partition_epoch > state.partition_epoch:
            # The leader knows a newer state than this controller: we are probably not the
            # active controller any more; the leader retries and finds the right one.
            return Errors.NOT_CONTROLLER
        if item.leader_epoch < state.leader_epoch:
            return Errors.FENCED_LEADER_EPOCH
        if broker_id != state.leader:
            # Kafka answers INVALID_REQUEST here; NOT_LEADER_OR_FOLLOWER tells the sender why.
            return Errors.NOT_LEADER_OR_FOLLOWER
        if item.partition_epoch < state.partition_epoch:
            return Errors.INVALID_UPDATE_VERSION
        new_isr = [member.broker_id for member in item.new_isr]
        if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(state.replicas):
            # Kafka answers INVALID_REQUEST (Replicas.validateIsr); kcoord counts a replica
            # outside the replica set as ineligible.
            return Errors.INELIGIBLE_REPLICA
        if state.leader not in new_isr:
            return Errors.INVALID_REQUEST
        for member in item.new_isr:
            # ineligibleReplicasForIsr: unregistered, fenced, or another broker epoch (KIP-841).
            registration = working.image.broker(member.broker_id)
            if (
                registration is None
                or not working.is_unfenced(member.broker_id)
                or member.broker_epoch not in (-1, registration.broker_epoch)
            ):
                return Errors.INELIGIBLE_REPLICA
        return Errors.NONE

    def elect_preferred_leaders(
        self, image: MetadataImage, max_elections: int = 1000
    ) -> ControllerResult[tuple[TopicIdPartition, ...]]:
        """Move leadership to the preferred (first) replica wherever it is a live ISR member
        (Kafka's ``maybeBalancePartitionLeaders``, at most ``max_elections`` per batch)."""

        def elect(state: PartitionState, working: _Working) -> PartitionChange | None:
            preferred = state.preferred_leader
            if state.leader == preferred or preferred not in state.isr:
                return None
            if not working.is_unfenced(preferred):
                return None
            change = build_partition_change(
                state,
                is_acceptable_leader=working.is_unfenced,
                min_isr=self._min_isr(image, state),
                elr_enabled=self.config.eligible_leader_replicas_enabled,
                election=Election.PREFERRED,
                offline_replicas=self._offline_replicas(state.tp),
            )
            if change is None or change.leader != preferred:
                return None  # the preferred replica reports its log offline
            return change

        return self._elect_each(image, max_elections, elect)

    def elect_unclean_leaders(
        self, image: MetadataImage, max_elections: int = 1000
    ) -> ControllerResult[tuple[TopicIdPartition, ...]]:
        """Elect a leader, from any live replica, for each leaderless partition of a topic
        that allows unclean election (Kafka's periodic ``maybeElectUncleanLeaders``). A
        partition left leaderless while the config was off gets a leader once it is turned
        on; an election happens otherwise only when a broker's state changes."""

        def elect(state: PartitionState, working: _Working) -> PartitionChange | None:
            if state.leader != NO_LEADER:
                return None
            if self._online_election(image, state.topic_id) is not Election.UNCLEAN:
                return None
            error, change = self._elect_one(image, working, Election.UNCLEAN, state)
            return change if error is Errors.NONE else None

        return self._elect_each(image, max_elections, elect)

    @staticmethod
    def _elect_each(
        image: MetadataImage,
        max_elections: int,
        elect: Callable[[PartitionState, _Working], PartitionChange | None],
    ) -> ControllerResult[tuple[TopicIdPartition, ...]]:
        """A periodic election's pass: ``elect`` each partition in order, at most
        ``max_elections`` changes a batch (Kafka's ``maxElectionsPerImbalance``)."""
        working = _Working(image)
        records: list[MetadataRecord] = []
        elected: list[TopicIdPartition] = []
        for state in sorted(image.all_partitions(), key=lambda s: s.tp):
            if len(elected) >= max_elections:
                break
            change = elect(state, working)
            if change is not None:
                working.change(change)
                records.append(change)
                elected.append(state.tp)
        return ControllerResult(tuple(records), tuple(elected))

    def elect_leaders(
        self,
        image: MetadataImage,
        election: Election,
        partitions: Sequence[tuple[str, int]] | None,
    ) -> ControllerResult[tuple[ElectionResult, ...]]:
        """The ElectLeaders API (KIP-460, ``ReplicationControlManager.electLeaders``):
        PREFERRED moves leadership to the first replica, UNCLEAN elects a leader for a
        partition without one, from any live replica. ``partitions`` None means every
        partition, and then partitions that need no election are left out of the answer."""
        assert election in (Election.PREFERRED, Election.UNCLEAN), election
        every = partitions is None
        if partitions is None:
            partitions = [
                (topic.name, state.partition)
                for topic in sorted(image.topics.values(), key=lambda t: t.name)
                for state in image.partitions_of(topic.topic_id)
            ]
        working = _Working(image)
        records: list[MetadataRecord] = []
        results: list[ElectionResult] = []
        for name, index in partitions:
            topic = image.topic_by_name(name)
            state = None if topic is None else image.partition(topic.topic_id, index)
            if state is None:
                error = Errors.UNKNOWN_TOPIC_OR_PARTITION
            else:
                error, change = self._elect_one(image, working, election, state)
                if change is not None:
                    working.change(change)
                    records.append(change)
            if not (every and error is Errors.ELECTION_NOT_NEEDED):
                results.append(ElectionResult(name, index, error))
        return ControllerResult(tuple(records), tuple(results))

    def _elect_one(
        self, image: MetadataImage, working: _Working, election: Election, state: PartitionState
    ) -> tuple[Errors, PartitionChange | None]:
        state = working.partition(state.tp)
        if (election is Election.PREFERRED and state.leader == state.preferred_leader) or (
            election is Election.UNCLEAN and state.leader != NO_LEADER
        ):
            return Errors.ELECTION_NOT_NEEDED, None
        change = build_partition_change(
            state,
            is_acceptable_leader=working.is_unfenced,
            min_isr=self._min_isr(image, state),
            elr_enabled=self.config.eligible_leader_replicas_enabled,
            election=election,
            offline_replicas=self._offline_replicas(state.tp),
        )
        if change is None or change.leader == NO_LEADER_CHANGE:
            if election is Election.PREFERRED:
                return Errors.PREFERRED_LEADER_NOT_AVAILABLE, None
            return Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE, None
        return Errors.NONE, change

    # ---------------------------------------------------------------- configs

    def alter_configs(
        self,
        image: MetadataImage,
        resource_type: int,
        resource_name: str,
        ops: Sequence[tuple[str, int, str | None]],
        *,
        incremental: bool,
    ) -> ControllerResult[AlterConfigsResult]:
        """Change one resource's configs (``ConfigurationControlManager``).

        ``ops`` are ``(key, ConfigOp, value)``. ``incremental`` is IncrementalAlterConfigs: each
        op changes one key, APPEND and SUBTRACT only LIST keys (starting from the default when
        the key is not set). Otherwise it is the legacy AlterConfigs: the ops' SETs become the
        whole set, every other key is deleted. The resulting set is validated as a whole, and
        one ``Config`` record is written per changed key. kcoord alters topic configs, the
        cluster-level defaults of topic configs (BROKER resource "", ``_alter_cluster_configs``)
        and, given ``ControllerConfig.group_config_error``, group configs.
        """
        keys = [key for key, _, _ in ops]
        if len(set(keys)) != len(keys):
            return _alter_error(Errors.INVALID_REQUEST, "Error due to duplicate config keys")
        for _, op, _ in ops:
            if op not in _CONFIG_OPS:
                return _alter_error(Errors.INVALID_REQUEST, f"Unknown operations type {op}")
        # ConfigAdminManager.preprocess, before the resource is looked at.
        nulls = [key for key, op, value in ops if op != ConfigOp.DELETE and value is None]
        if nulls:
            return _alter_error(
                Errors.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}"
            )
        if resource_type == ConfigResourceType.GROUP and self.config.group_config_error:
            return self._alter_group_configs(image, resource_name, ops, incremental=incremental)
        if resource_type == ConfigResourceType.BROKER and resource_name == "":
            return self._alter_cluster_configs(image, ops, incremental=incremental)
        if resource_type != ConfigResourceType.TOPIC:
            return _alter_error(
                Errors.INVALID_REQUEST,
                "kcoord alters topic configs, group configs and the cluster-level defaults "
                "of topic configs (the broker resource named '', --entity-default), not configs "
                f"of resource type {resource_type}"
                + (f" named {resource_name!r}" if resource_name else ""),
            )
        # ControllerConfigurationValidator: the name first, then the values, then whether the
        # topic exists.
        if not resource_name:
            return _alter_error(Errors.INVALID_REQUEST, "Default topic resources are not allowed.")
        name_error = topic_name_error(resource_name)
        if name_error is not None:
            return _alter_error(Errors.INVALID_TOPIC_EXCEPTION, name_error)
        topic = image.topic_by_name(resource_name)
        result = _alter(
            ConfigResourceType.TOPIC,
            resource_name,
            {} if topic is None else topic.configs,
            ops,
            incremental=incremental,
            list_default=_topic_list_default,
            config_error=lambda configs: _topic_config_error(image, configs),
        )
        if topic is None:
            # ConfigurationControlManager.validateAlterConfig: the values are checked before
            # whether the topic exists.
            if result.response.error is not Errors.NONE:
                return result
            return _alter_error(
                Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{resource_name}' does not exist."
            )
        if self.config.eligible_leader_replicas_enabled and _changes_min_isr(result.records):
            # ConfigurationControlManager.createClearElrRecordsAsNeeded (KAFKA-16540): the ELR
            # was kept under the old min ISR; under a lower one the leader commits with fewer
            # replicas than it holds, and an ELR member elected later would lack those records.
            clear_elr = _clear_elr(image.partitions_of(topic.topic_id))
            result = ControllerResult((*result.records, *clear_elr), result.response)
        return result

    def _alter_cluster_configs(
        self,
        image: MetadataImage,
        ops: Sequence[tuple[str, int, str | None]],
        *,
        incremental: bool,
    ) -> ControllerResult[AlterConfigsResult]:
        """The cluster-level dynamic defaults (BROKER resource "", ``kafka-configs
        --entity-type brokers --entity-default``): the broker synonyms of topic configs
        (``log.retention.ms``, ``log.cleanup.policy``, ``min.insync.replicas`` ...), each the
        default of every topic without its own, read by every node and the controller after
        a topic's own and before their config files (Kafka's ``DynamicLogConfig``). Values are
        checked as the topic config's, and refused as Kafka's broker refuses a dynamic broker
        config (``ConfigAdminManager``: INVALID_REQUEST, KAFKA-13609, naming the broker key);
        the two compaction lags must not contradict each other (a check Kafka's
        ``DynamicLogConfig`` does not make: each topic without its own would take both). While
        ELR is on ``min.insync.replicas`` may be changed but not removed, and any change of it
        clears every partition's ELR (ConfigurationControlManager's
        ``DISALLOWED_CLUSTER_MIN_ISR_REMOVAL_ERROR`` and ``createClearElrRecordsAsNeeded``,
        KAFKA-16540): without the record each node would fall back to its own config file."""
        # Removing a key is always allowed: one another build wrote, unknown here, included.
        set_keys = {key for key, op, _ in ops if op != ConfigOp.DELETE}
        others = sorted(set_keys - TOPIC_CONFIGS_BY_BROKER_NAME.keys())
        if others:
            # DynamicBrokerConfig.validateConfigs (INVALID_REQUEST).
            return _alter_error(
                Errors.INVALID_REQUEST,
                f"Cannot update these configs dynamically: {', '.join(others)} (kcoord's "
                "cluster-level dynamic configs are the broker synonyms of topic configs, such "
                "as log.retention.ms)",
            )

        if incremental:
            for key, op, _ in ops:
                if (
                    op in (ConfigOp.APPEND, ConfigOp.SUBTRACT)
                    and _cluster_list_default(key) is None
                ):
                    # ConfigAdminManager.prepareIncrementalConfigs.
                    return _alter_error(
                        Errors.INVALID_REQUEST,
                        f"Config value {ConfigOp(op).name.lower()} is not allowed for config "
                        f"key: {key}",
                    )

        def config_error(configs: Mapping[str, str | None]) -> str | None:
            # Keys unknown here (another build's) are left as they are, not checked.
            known = {k: v for k, v in configs.items() if k in TOPIC_CONFIGS_BY_BROKER_NAME}
            for key, value in known.items():
                name = TOPIC_CONFIGS_BY_BROKER_NAME[key].name
                error = topic_config_error({name: value})
                if error is not None:  # the broker key named, as Kafka's message does
                    return error.replace(f"configuration {name}:", f"configuration {key}:", 1)
            retention = known.get("log.retention.ms")
            if retention is not None and int(retention) == 0:
                # KafkaConfig.validateValues, which a dynamic broker config goes through; a
                # topic's own retention.ms may be 0, not the default of every topic.
                return "log.retention.ms must be unlimited (-1) or, greater than or equal to 1"
            return topic_config_error(
                {TOPIC_CONFIGS_BY_BROKER_NAME[k].name: v for k, v in known.items()}
            )

        current = image.resource_configs(CLUSTER_CONFIGS)
        result = _alter(
            ConfigResourceType.BROKER,
            "",
            current,
            ops,
            incremental=incremental,
            list_default=_cluster_list_default,
            config_error=config_error,
        )
        if result.response.error is Errors.INVALID_CONFIG:
            return _alter_error(Errors.INVALID_REQUEST, result.response.message)
        if not self.config.eligible_leader_replicas_enabled or not _changes_min_isr(result.records):
            return result
        if any(
            isinstance(r, Config) and r.key == MIN_INSYNC_REPLICAS_CONFIG and r.value is None
            for r in result.records
        ):
            return _alter_error(
                Errors.INVALID_CONFIG,
                f"Cluster-level {MIN_INSYNC_REPLICAS_CONFIG} cannot be removed while ELR is "
                "enabled.",
            )
        clear_elr = _clear_elr(image.all_partitions())
        return ControllerResult((*result.records, *clear_elr), result.response)

    def elr_safety_records(self, image: MetadataImage) -> ControllerResult[int | None]:
        """Pin this controller's ``min.insync.replicas`` as the cluster-level config when the
        log has none (KIP-966, ``ConfigurationControlManager.maybeGenerateElrSafetyRecords``);
        the reply is the value pinned, or None. Every leader and every controller reads the
        cluster-level value before its own file's, so the ELR a controller keeps and the ISR
        a leader commits with are judged by one min ISR: with each falling back to its own
        file, a controller whose file said 2 kept an ELR that a leader whose file said 1 had
        committed without, and elected it cleanly after the leader died. Written before
        anything else a new controller decides; it clears every ELR kept until then, as any
        change of the cluster-level value does."""
        if not self.config.eligible_leader_replicas_enabled:
            return ControllerResult((), None)
        if MIN_INSYNC_REPLICAS_CONFIG in image.resource_configs(CLUSTER_CONFIGS):
            return ControllerResult((), None)
        value = self.config.min_insync_replicas
        pin = Config(ConfigResourceType.BROKER, "", MIN_INSYNC_REPLICAS_CONFIG, str(value))
        return ControllerResult((pin, *_clear_elr(image.all_partitions())), value)

    def _alter_group_configs(
        self,
        image: MetadataImage,
        group_id: str,
        ops: Sequence[tuple[str, int, str | None]],
        *,
        incremental: bool,
    ) -> ControllerResult[AlterConfigsResult]:
        """A GROUP resource (KIP-848 group configs; ``ControllerConfigurationValidator``): the
        group need not exist; no group config is a LIST, so APPEND and SUBTRACT are refused."""
        assert self.config.group_config_error is not None
        if not group_id:
            return _alter_error(Errors.INVALID_REQUEST, "Default group resources are not allowed.")
        return _alter(
            ConfigResourceType.GROUP,
            group_id,
            image.resource_configs(ConfigResource(ConfigResourceType.GROUP, group_id)),
            ops,
            incremental=incremental,
            list_default=lambda key: None,
            config_error=self.config.group_config_error,
        )

    def _config_value(self, image: MetadataImage, topic: TopicImage | None, key: str) -> str | None:
        # Topic config, else the cluster-wide dynamic default (broker resource "", under the
        # broker synonym's name).
        if topic is not None and key in topic.configs:
            return topic.configs[key]
        broker_key = TOPIC_CONFIGS[key].broker_synonym or key
        return image.resource_configs(CLUSTER_CONFIGS).get(broker_key)

    def _min_isr(self, image: MetadataImage, state: PartitionState) -> int:
        # ReplicationControlManager.getTopicEffectiveMinIsr: never above the replication factor.
        raw = self._config_value(image, image.topic(state.topic_id), MIN_INSYNC_REPLICAS_CONFIG)
        value = None if raw is None else parse_min_insync_replicas(raw)
        min_isr = self.config.min_insync_replicas if value is None else value
        return max(1, min(min_isr, len(state.replicas)))

    def _online_election(self, image: MetadataImage, topic_id: str) -> Election:
        raw = self._config_value(
            image, image.topic(topic_id), UNCLEAN_LEADER_ELECTION_ENABLE_CONFIG
        )
        unclean = (
            self.config.unclean_leader_election_enable
            if raw is None
            else raw.strip().lower() == "true"  # ConfigDef.parseType trims
        )
        return Election.UNCLEAN if unclean else Election.ONLINE


def atomic_of(
    image: MetadataImage,
    items: Sequence[Item],
    decide: Callable[[MetadataImage, Item], ControllerResult[T]],
) -> ControllerResult[tuple[T, ...]]:
    """The decisions of one request (``ControllerResult.atomicOf``): each item is decided on
    the image as the earlier items left it, and their records form one batch, committed whole
    or not at all. Proposed item by item, a lost leadership left the first items committed,
    and the client's retry of the request was told they already existed (or did not)."""
    scratch = image.copy() if len(items) > 1 else image
    records: list[MetadataRecord] = []
    responses: list[T] = []
    for i, item in enumerate(items):
        result = decide(scratch, item)
        if result.records and i < len(items) - 1:
            scratch.apply_batch(scratch.last_offset + 1, result.records)
        records.extend(result.records)
        responses.append(result.response)
    return ControllerResult(tuple(records), tuple(responses))


def _create_topic_error(error: Errors, message: str) -> ControllerResult[CreateTopicResult]:
    return ControllerResult((), CreateTopicResult(error, message))


def _create_partitions_error(
    error: Errors, message: str
) -> ControllerResult[CreatePartitionsResult]:
    return ControllerResult((), CreatePartitionsResult(error, message))


class PlacementIndex:
    """What placing replicas and checking new topic names need of an image: how many replicas
    each broker hosts, how many partitions have each (first, second) replica pair, and the
    topic names by collision key. Built once for a request and kept up as its topics are
    created and grow (``add``), as Kafka's controller keeps such indexes up as it goes
    (``ReplicationControlManager.topicsWithCollisionChars``): rebuilt from every partition and
    topic of the cluster for each topic, one CreateTopics of 10,000 topics held the node's
    event loop for 11 s, every client of the node waiting (found by an audit)."""

    __slots__ = ("_collisions", "_replica_counts", "_successor_counts")

    def __init__(self, image: MetadataImage) -> None:
        self._replica_counts: dict[int, int] = {}
        self._successor_counts: dict[tuple[int, int], int] = {}
        self._collisions: dict[str, str] = {}
        for state in image.all_partitions():
            self._count(state.replicas)
        for topic in image.topics.values():
            if "." in topic.name or "_" in topic.name:
                self._collisions.setdefault(_collision_key(topic.name), topic.name)

    def _count(self, replicas: Sequence[int]) -> None:
        for replica in replicas:
            self._replica_counts[replica] = self._replica_counts.get(replica, 0) + 1
        if len(replicas) > 1:
            pair = (replicas[0], replicas[1])
            self._successor_counts[pair] = self._successor_counts.get(pair, 0) + 1

    def collision(self, name: str) -> str | None:
        """The existing topic ``name`` collides with (Topic.hasCollision), if any."""
        if "." not in name and "_" not in name:
            return None
        return self._collisions.get(_collision_key(name))

    def place(
        self, image: MetadataImage, num_partitions: int, replication_factor: int
    ) -> list[tuple[int, ...]]:
        """``place_replicas`` balanced against every partition of ``image``, which this
        index is of."""
        return place_replicas(
            [UsableBroker(b.broker_id, b.fenced) for b in image.brokers.values()],
            num_partitions,
            replication_factor,
            leader_counts=image.leader_counts(),
            replica_counts=self._replica_counts,
            successor_counts=self._successor_counts,
        )

    def add(self, name: str | None, placements: Sequence[Sequence[int]]) -> None:
        """A topic created as ``name`` (None: partitions added to one) with these replicas."""
        for replicas in placements:
            self._count(replicas)
        if name is not None and ("." in name or "_" in name):
            self._collisions.setdefault(_collision_key(name), name)


def _manual_placements(
    image: MetadataImage,
    num_partitions: int,
    replication_factor: int,
    assignments: Sequence[tuple[int, Sequence[int]]],
) -> list[tuple[int, ...]] | tuple[Errors, str]:
    """A CreateTopics manual assignment's replicas by partition, or its error
    (``ReplicationControlManager.createTopic``)."""
    if replication_factor != -1:
        return (
            Errors.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not set "
            "to -1.",
        )
    if num_partitions != -1:
        return (
            Errors.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        )
    by_index: dict[int, tuple[int, ...]] = {}
    for index, replicas in assignments:
        if index in by_index:
            return (
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"Found multiple manual partition assignments for partition {index}",
            )
        first = next(iter(by_index.values()), None)
        error = _manual_assignment_error(
            image, replicas, len(replicas) if first is None else len(first)
        )
        if error is None and all(image.is_fenced(r) for r in replicas):
            error = (
                "All brokers specified in the manual partition assignment for partition "
                f"{index} are fenced or in controlled shutdown."
            )
        if error is not None:
            return Errors.INVALID_REPLICA_ASSIGNMENT, error
        by_index[index] = tuple(replicas)
    if sorted(by_index) != list(range(len(by_index))):
        return (
            Errors.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        )
    return [by_index[i] for i in range(len(by_index))]


def _manual_assignment_error(
    image: MetadataImage, replicas: Sequence[int], replication_factor: int
) -> str | None:
    # ReplicationControlManager.validateManualPartitionAssignment.
    if not replicas:
        return "The manual partition assignment includes an empty replica list."
    seen: set[int] = set()
    for broker_id in sorted(replicas):
        if image.broker(broker_id) is None:
            return (
                f"The manual partition assignment includes broker {broker_id}, but no such "
                "broker is registered."
            )
        if broker_id in seen:
            return (
                f"The manual partition assignment includes the broker {broker_id} more than once."
            )
        seen.add(broker_id)
    if len(replicas) != replication_factor:
        return (
            f"The manual partition assignment includes a partition with {len(replicas)} "
            f"replica(s), but this is not consistent with previous partitions, which have "
            f"{replication_factor} replica(s)."
        )
    return None


def _collision_key(name: str) -> str:
    return name.replace(".", "_")


def topic_name_error(name: str) -> str | None:
    # Kafka's Topic.validate.
    if not name:
        return "Topic name is illegal, it can't be empty."
    if name in (".", ".."):
        return 'Topic name cannot be "." or "..".'
    if len(name) > _TOPIC_NAME_MAX_LENGTH:
        return (
            f"Topic name is illegal, it can't be longer than {_TOPIC_NAME_MAX_LENGTH} characters."
        )
    if not set(name) <= _TOPIC_NAME_CHARS:
        return (
            f"Topic name {name!r} is illegal, it contains a character other than ASCII "
            "alphanumerics, '.', '_' and '-'."
        )
    return None


def _alter_error(error: Errors, message: str) -> ControllerResult[AlterConfigsResult]:
    return ControllerResult((), AlterConfigsResult(error, message))


def _topic_list_default(key: str) -> str | None:
    definition = TOPIC_CONFIGS.get(key)
    return definition.default if definition and definition.type is ConfigType.LIST else None


_COMPACTION_LAGS: Final = ("min.compaction.lag.ms", "max.compaction.lag.ms")


def _topic_config_error(image: MetadataImage, configs: Mapping[str, str | None]) -> str | None:
    """``topic_config_error``, the two compaction lags checked over the cluster-level defaults
    too: a topic's min above the cluster's max contradicts as two of its own do (Kafka's
    ``LogConfig.validate`` merges the broker's log configs under the topic's)."""
    error = topic_config_error(configs)
    if error is not None:
        return error
    defaults = cluster_topic_defaults(image.resource_configs(CLUSTER_CONFIGS))
    lags = {k: v for k, v in {**defaults, **configs}.items() if k in _COMPACTION_LAGS}
    return topic_config_error(lags) if lags.keys() - configs.keys() else None


def _cluster_list_default(key: str) -> str | None:
    definition = TOPIC_CONFIGS_BY_BROKER_NAME.get(key)
    return None if definition is None else _topic_list_default(definition.name)


def _changes_min_isr(records: Iterable[MetadataRecord]) -> bool:
    return any(isinstance(r, Config) and r.key == MIN_INSYNC_REPLICAS_CONFIG for r in records)


def _clear_elr(states: Iterable[PartitionState]) -> list[PartitionChange]:
    """Records emptying the ELR and last known ELR of those of ``states`` that have one."""
    return [
        PartitionChange(
            state.topic_id,
            state.partition,
            expected_partition_epoch=state.partition_epoch,
            elr=(),
            last_known_elr=(),
        )
        for state in states
        if state.elr or state.last_known_elr
    ]


def _alter(
    resource_type: ConfigResourceType,
    name: str,
    current: Mapping[str, str],
    ops: Sequence[tuple[str, int, str | None]],
    *,
    incremental: bool,
    list_default: Callable[[str], str | None],
    config_error: Callable[[Mapping[str, str | None]], str | None],
) -> ControllerResult[AlterConfigsResult]:
    """One resource's ops applied to its ``current`` configs (see ``alter_configs``), the
    result checked by ``config_error`` as a whole; a ``Config`` record per changed key.
    ``list_default(key)`` is the default of a LIST key, None for a key of another type (which
    APPEND and SUBTRACT refuse)."""
    updated: dict[str, str | None] = dict(current) if incremental else {}
    for key, op, value in ops:
        if op == ConfigOp.SET or not incremental:
            updated[key] = value
        elif op == ConfigOp.DELETE:
            updated.pop(key, None)
        else:
            default = list_default(key)
            if default is None:
                return _alter_error(
                    Errors.INVALID_CONFIG,
                    f"Can't {ConfigOp(op).name} to key {key} because its type is not LIST.",
                )
            items = [p for p in current.get(key, default).split(",") if p]
            # ConfigurationControlManager.incrementalAlterConfigResource: an item is added
            # unless there, and SUBTRACT removes one copy of each item it names.
            for item in (value or "").split(","):
                if op == ConfigOp.APPEND and item not in items:
                    items.append(item)
                elif op == ConfigOp.SUBTRACT and item in items:
                    items.remove(item)
            updated[key] = ",".join(items)
    error = config_error(updated)
    if error is not None:
        return _alter_error(Errors.INVALID_CONFIG, error)
    records: list[MetadataRecord] = [
        Config(resource_type, name, key, updated.get(key))
        for key in sorted(set(current) | set(updated))
        if current.get(key) != updated.get(key)
    ]
    return ControllerResult(tuple(records), AlterConfigsResult(Errors.NONE))
