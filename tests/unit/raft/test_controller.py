"""Controller decisions: registration, heartbeats, fencing, placement, elections, AlterPartition.

Every decision goes through ``Cluster.decide``, which checks that the decision did not touch the
image, and its records are committed with ``apply_batch``, so every test also checks that the
controller only proposes records the image accepts. Time is a plain integer.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.errors import Errors
from kcoord.raft.controller import (
    CLUSTER_CONFIGS,
    OFFSETS_TOPIC_NAME,
    AlterConfigsResult,
    AlterPartitionItem,
    AlterPartitionRequest,
    AlterPartitionResponse,
    AlterPartitionResult,
    BrokerHeartbeatReply,
    BrokerHeartbeatRequest,
    BrokerRegistrationReply,
    BrokerRegistrationRequest,
    BrokerState,
    ConfigOp,
    Controller,
    ControllerConfig,
    ControllerResult,
    CreatePartitionsResult,
    CreateTopicResult,
    Election,
    NewPartitions,
    NewTopic,
    PlacementError,
    UsableBroker,
    build_partition_change,
    place_replicas,
)
from kcoord.raft.image import MetadataDelta, MetadataImage, PartitionState, TopicIdPartition
from kcoord.raft.records import (
    NO_LEADER,
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

R = TypeVar("R")
T1 = "T1-aaaaaaaaaaaaaaaaaaa"
T2 = "T2-bbbbbbbbbbbbbbbbbbb"
OFFSETS_ID = "OFFSETS-cccccccccccccc"
SESSION_MS = 3000


def endpoints(broker_id: int) -> dict[str, str]:
    host = f"127.0.0.{broker_id}"
    return {
        "kafka": f"{host}:9092",
        "rpc": f"{host}:9093",
        "quorum": f"{host}:9094",
        "admin": f"{host}:8080",
    }


class Cluster:
    """An image, an active controller, and a log: decide, then commit the records."""

    def __init__(self, config: ControllerConfig | None = None, activated_at_ms: int = 0) -> None:
        self.config = config or ControllerConfig()
        self.image = MetadataImage()
        self.controller = Controller(self.config, activated_at_ms)
        self.run(lambda image: self.controller.maybe_write_cluster_id(image, "cluster-1"))

    def decide(
        self, decision: Callable[[MetadataImage], ControllerResult[R]]
    ) -> ControllerResult[R]:
        before = self.image.copy()
        result = decision(self.image)
        assert self.image == before, "a controller decision changed the image"
        return result

    def commit(self, records: tuple[MetadataRecord, ...]) -> MetadataDelta | None:
        if not records:
            return None
        return self.image.apply_batch(self.image.last_offset + 1, records)

    def run(self, decision: Callable[[MetadataImage], ControllerResult[R]]) -> R:
        result = self.decide(decision)
        self.commit(result.records)
        return result.response

    def register(
        self,
        broker_id: int,
        now_ms: int = 0,
        incarnation: str | None = None,
        previous_broker_epoch: int = -1,
        *,
        storage_lost: bool = False,
    ) -> ControllerResult[BrokerRegistrationReply]:
        request = BrokerRegistrationRequest(
            broker_id,
            incarnation or f"inc-{broker_id}",
            endpoints(broker_id),
            cluster_id="cluster-1",
            previous_broker_epoch=previous_broker_epoch,
            storage_lost=storage_lost,
        )
        return self.decide(lambda image: self.controller.register_broker(image, request, now_ms))

    def heartbeat(
        self,
        broker_id: int,
        now_ms: int,
        *,
        offset: int | None = None,
        want_fence: bool = False,
        want_shut_down: bool = False,
        offline: tuple[tuple[str, int], ...] = (),
    ) -> ControllerResult[BrokerHeartbeatReply]:
        request = BrokerHeartbeatRequest(
            broker_id,
            self.epoch(broker_id),
            self.image.last_offset if offset is None else offset,
            want_fence=want_fence,
            want_shut_down=want_shut_down,
            offline_replicas=offline,
        )
        return self.decide(
            lambda image: next(self.controller.broker_heartbeat(lambda: image, request, now_ms))
        )

    def start(self, *broker_ids: int, now_ms: int = 0) -> None:
        """Register the brokers, then unfence each with a caught-up heartbeat."""
        for b in broker_ids:
            registered = self.register(b, now_ms)
            assert registered.response.error is Errors.NONE
            self.commit(registered.records)
        for b in broker_ids:
            beat = self.heartbeat(b, now_ms)
            assert not beat.response.is_fenced
            self.commit(beat.records)

    def epoch(self, broker_id: int) -> int:
        registration = self.image.broker(broker_id)
        assert registration is not None
        return registration.broker_epoch

    def create_topic(
        self,
        name: str,
        topic_id: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str] | None = None,
    ) -> CreateTopicResult:
        return self.run(
            lambda image: self.controller.create_topic(
                image,
                name,
                topic_id,
                num_partitions=partitions,
                replication_factor=replication_factor,
                configs=configs,
            )
        )

    def fence_stale(self, now_ms: int) -> ControllerResult[tuple[int, ...]]:
        """The whole decision, one result (``fence_stale_brokers`` without parts)."""
        return self.decide(
            lambda image: next(self.controller.fence_stale_brokers(lambda: image, now_ms))
        )

    def state(self, topic_id: str, partition: int) -> PartitionState:
        result = self.image.partition(topic_id, partition)
        assert result is not None
        return result

    def alter(
        self,
        broker_id: int,
        topic_id: str,
        partition: int,
        new_isr: tuple[int, ...],
        *,
        leader_epoch: int | None = None,
        partition_epoch: int | None = None,
        broker_epoch: int | None = None,
    ) -> ControllerResult[AlterPartitionResponse]:
        current = self.state(topic_id, partition)
        item = AlterPartitionItem(
            topic_id,
            partition,
            current.leader_epoch if leader_epoch is None else leader_epoch,
            current.partition_epoch if partition_epoch is None else partition_epoch,
            tuple(BrokerState(b, self.epoch(b)) for b in new_isr),
        )
        request = AlterPartitionRequest(
            broker_id, self.epoch(broker_id) if broker_epoch is None else broker_epoch, (item,)
        )
        return self.decide(lambda image: self.controller.alter_partition(image, request))


def three_brokers(config: ControllerConfig | None = None) -> Cluster:
    cluster = Cluster(config)
    cluster.start(1, 2, 3)
    return cluster


# ------------------------------------------------------------------ cluster id


def test_cluster_id_is_written_once() -> None:
    cluster = Cluster()
    assert cluster.image.cluster_id == "cluster-1"
    result = cluster.decide(lambda image: cluster.controller.maybe_write_cluster_id(image, "x"))
    assert result == ControllerResult((), "cluster-1")
    fresh = MetadataImage()
    result = Controller(ControllerConfig(), 0).maybe_write_cluster_id(fresh, "x")
    assert result == ControllerResult((ClusterId("x"),), "x")


# ------------------------------------------------------------------ registration


def test_registration_writes_a_fenced_broker_with_a_new_epoch() -> None:
    cluster = Cluster()
    assert cluster.image.last_offset == 0
    result = cluster.register(1)
    assert result == ControllerResult(
        (RegisterBroker(1, "inc-1", 1, endpoints(1), None, True),),
        BrokerRegistrationReply(Errors.NONE, 1),
    )
    cluster.commit(result.records)
    assert cluster.image.is_fenced(1)


def test_same_incarnation_registering_again_is_idempotent() -> None:
    cluster = Cluster()
    cluster.commit(cluster.register(1).records)
    cluster.commit(cluster.register(2).records)
    assert cluster.register(1, now_ms=100) == ControllerResult(
        (), BrokerRegistrationReply(Errors.NONE, 1)
    )


def test_new_incarnation_is_refused_while_the_old_session_is_valid() -> None:
    cluster = Cluster()
    cluster.start(1)
    cluster.commit(cluster.heartbeat(1, 1000).records)
    for now_ms in (1000, 2500, 1000 + SESSION_MS):
        assert cluster.register(1, now_ms, incarnation="inc-1b") == ControllerResult(
            (), BrokerRegistrationReply(Errors.DUPLICATE_BROKER_REGISTRATION)
        )
    result = cluster.register(1, 1001 + SESSION_MS, incarnation="inc-1b")
    assert result.response.error is Errors.NONE
    assert result.response.broker_epoch > cluster.epoch(1)


def test_registration_epochs_increase() -> None:
    cluster = Cluster()
    epochs: list[int] = []
    now_ms = 0
    for incarnation in range(6):
        result = cluster.register(7, now_ms, incarnation=f"inc-7-{incarnation}")
        assert result.response.error is Errors.NONE
        cluster.commit(result.records)
        epochs.append(cluster.epoch(7))
        assert epochs[-1] == result.response.broker_epoch
        # Other records in between, or none.
        if incarnation % 2:
            cluster.commit(cluster.register(incarnation + 10, now_ms).records)
        now_ms += SESSION_MS + 1
    assert epochs == sorted(set(epochs))
    assert epochs[0] == 1


def test_epoch_stays_above_the_previous_one_even_on_an_old_image() -> None:
    cluster = Cluster()
    cluster.commit(cluster.register(1).records)
    # A registration replayed at a low offset (e.g. from a snapshot taken long ago).
    image = MetadataImage()
    image.apply(0, RegisterBroker(1, "old", 50, {}))
    reply = Controller(ControllerConfig(), 0).register_broker(
        image, BrokerRegistrationRequest(1, "new", {}), 0
    )
    assert reply.response == BrokerRegistrationReply(Errors.NONE, 51)


def test_two_registrations_decided_on_the_same_image_cannot_both_apply() -> None:
    cluster = Cluster()
    first = cluster.register(1, incarnation="a")
    second = Controller(cluster.config, 0).register_broker(
        cluster.image, BrokerRegistrationRequest(1, "b", {}), 0
    )
    cluster.commit(first.records)
    with pytest.raises(Exception, match="must bring a higher epoch"):
        cluster.commit(second.records)
    registration = cluster.image.broker(1)
    assert registration is not None
    assert registration.incarnation_id == "a"


def test_registration_checks_cluster_id_and_request() -> None:
    cluster = Cluster()

    def register(request: BrokerRegistrationRequest) -> ControllerResult[BrokerRegistrationReply]:
        return cluster.decide(lambda image: cluster.controller.register_broker(image, request, 0))

    assert register(BrokerRegistrationRequest(1, "i", {}, cluster_id="other")) == ControllerResult(
        (), BrokerRegistrationReply(Errors.INCONSISTENT_CLUSTER_ID)
    )
    for bad in (BrokerRegistrationRequest(-1, "i", {}), BrokerRegistrationRequest(1, "", {})):
        assert register(bad) == ControllerResult(
            (), BrokerRegistrationReply(Errors.INVALID_REQUEST)
        )


def test_new_incarnation_first_leaves_the_isr_of_the_old_one() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (1, 2, 3), 1, 0, 0)
    # Broker 1 restarts before the controller noticed (no fencing happened).
    result = cluster.register(1, SESSION_MS + 1, incarnation="inc-1b")
    new_epoch = cluster.image.last_offset + 1
    assert result == ControllerResult(
        (
            PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)),
            RegisterBroker(1, "inc-1b", new_epoch, endpoints(1), None, True),
        ),
        BrokerRegistrationReply(Errors.NONE, new_epoch),
    )
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (2, 3), 2, 1, 1)


def test_unclean_restart_leaves_the_elr_when_detection_is_on() -> None:
    config = ControllerConfig(unclean_shutdown_detection_enabled=True, min_insync_replicas=3)
    cluster = three_brokers(config)
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1, 2)).records)
    assert cluster.state(T1, 0).elr == (3,)
    clean_epoch = cluster.epoch(3)
    # A clean restart (the broker proves its last epoch) keeps it eligible...
    clean = cluster.register(3, SESSION_MS + 1, "inc-3b", previous_broker_epoch=clean_epoch)
    assert [r for r in clean.records if isinstance(r, PartitionChange)] == []
    # ... an unclean one does not.
    unclean = cluster.register(3, SESSION_MS + 1, "inc-3b")
    assert unclean.records[0] == PartitionChange(T1, 0, 1, elr=())


def test_a_broker_back_with_an_empty_disk_leaves_the_isr_and_elr() -> None:
    """Detection of unclean shutdowns is off by default (a SIGKILL keeps the page cache), but
    a broker whose data directory was empty when it started (a new or wiped disk) holds
    nothing: kept in the ELR, it was elected once the others were fenced and the leader that
    came back truncated to its empty log."""
    cluster = three_brokers(ControllerConfig(min_insync_replicas=3))
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1, 2)).records)
    assert cluster.state(T1, 0).elr == (3,)
    lost = cluster.register(3, SESSION_MS + 1, "inc-3b", storage_lost=True)
    assert lost.records[0] == PartitionChange(T1, 0, 1, elr=())
    # Without it the restart is taken as clean, as before.
    kept = cluster.register(3, SESSION_MS + 1, "inc-3c")
    assert [r for r in kept.records if isinstance(r, PartitionChange)] == []


# ------------------------------------------------------------------ heartbeats


def test_unfence_only_once_caught_up_with_the_registration() -> None:
    cluster = Cluster()
    result = cluster.register(1)
    cluster.commit(result.records)
    epoch = result.response.broker_epoch
    lagging = cluster.heartbeat(1, 100, offset=epoch - 1)
    assert lagging == ControllerResult((), BrokerHeartbeatReply(Errors.NONE, False, True, False))
    caught_up = cluster.heartbeat(1, 200, offset=epoch)
    assert caught_up == ControllerResult(
        (UnfenceBroker(1, epoch),), BrokerHeartbeatReply(Errors.NONE, True, False, False)
    )
    cluster.commit(caught_up.records)
    assert not cluster.image.is_fenced(1)
    assert cluster.heartbeat(1, 300) == ControllerResult(
        (), BrokerHeartbeatReply(Errors.NONE, True, False, False)
    )
    assert cluster.controller.heartbeats.metadata_offset(1, epoch) == cluster.image.last_offset


def test_caught_up_means_past_the_registrations_own_offset() -> None:
    """The broker epoch is the log end the controller saw when it decided: a write of its own
    still in flight (the KIP-835 NoOp) committed first put the RegisterBroker record one
    offset later, and a broker that had replayed up to its epoch, not its registration, was
    told it was caught up (its initial catch-up then published an image without itself).
    (review helper-207)"""
    cluster = Cluster()
    result = cluster.register(1)
    epoch = result.response.broker_epoch
    cluster.commit((NoOp(),))  # the NoOp proposed before the registration commits first
    cluster.commit(result.records)
    registered_at = cluster.image.last_offset
    assert registered_at == epoch + 1
    for offset in (epoch, registered_at):
        request = BrokerHeartbeatRequest(1, epoch, offset)
        steady = cluster.controller.steady_broker_heartbeat(cluster.image, request, 100)
        beat = cluster.heartbeat(1, 100, offset=offset)
        assert beat.response.is_caught_up is (offset == registered_at), offset
        assert beat.response.is_fenced is (offset != registered_at)
        if offset == epoch:
            assert steady == BrokerHeartbeatReply(Errors.NONE, False, True)
    # A snapshot does not say where the record was: its own offset stands in, later.
    reloaded = MetadataImage.from_records(registered_at + 5, cluster.image.to_records())
    broker = reloaded.broker(1)
    assert broker is not None and broker.caught_up_offset == registered_at + 5


def test_unfence_is_not_proposed_twice_while_in_flight() -> None:
    cluster = Cluster()
    cluster.commit(cluster.register(1).records)
    first = cluster.heartbeat(1, 100)
    assert first.records == (UnfenceBroker(1, 1),)
    # Not committed yet: the next heartbeat does not propose it again...
    second = cluster.heartbeat(1, 600)
    assert second == ControllerResult((), BrokerHeartbeatReply(Errors.NONE, True, False, False))
    # ... unless it got lost and the backoff passed.
    assert cluster.heartbeat(1, 100 + 1000).records == (UnfenceBroker(1, 1),)


def test_heartbeat_with_a_stale_epoch_is_refused() -> None:
    cluster = three_brokers()
    request = BrokerHeartbeatRequest(1, cluster.epoch(1) - 1, 100)
    assert cluster.decide(
        lambda image: next(cluster.controller.broker_heartbeat(lambda: image, request, 0))
    ) == ControllerResult((), BrokerHeartbeatReply(Errors.STALE_BROKER_EPOCH))
    unknown = BrokerHeartbeatRequest(9, 1, 100)
    assert (
        cluster.decide(
            lambda image: next(cluster.controller.broker_heartbeat(lambda: image, unknown, 0))
        ).response.error
        is Errors.STALE_BROKER_EPOCH
    )


def test_want_fence() -> None:
    cluster = three_brokers()
    result = cluster.heartbeat(2, 100, want_fence=True)
    assert result == ControllerResult(
        (FenceBroker(2, cluster.epoch(2)),), BrokerHeartbeatReply(Errors.NONE, True, True, False)
    )
    cluster.commit(result.records)
    # A fenced broker that wants to stay fenced stays fenced.
    assert cluster.heartbeat(2, 200, want_fence=True) == ControllerResult(
        (), BrokerHeartbeatReply(Errors.NONE, True, True, False)
    )


def test_controlled_shutdown_waits_for_the_active_brokers_to_replay_its_fencing() -> None:
    """Kafka's BrokerHeartbeatManager: the broker may go once every active broker (unfenced,
    not shutting down) has reported a metadata offset past the records that moved its
    leaderships, so the new leaders serve first; its own offset does not matter."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    threshold = cluster.image.last_offset + 1
    result = cluster.heartbeat(1, 100, want_shut_down=True)
    assert result == ControllerResult(
        (PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)), FenceBroker(1, cluster.epoch(1))),
        BrokerHeartbeatReply(Errors.NONE, True, True, False),
    )
    cluster.commit(result.records)
    early = cluster.heartbeat(1, 200, offset=threshold + 5, want_shut_down=True)
    assert early.response == BrokerHeartbeatReply(Errors.NONE, True, True, False)
    cluster.heartbeat(2, 210, offset=threshold)  # the new leader has replayed its election
    waiting = cluster.heartbeat(1, 220, offset=threshold, want_shut_down=True)
    assert not waiting.response.should_shut_down  # broker 3 has not
    cluster.heartbeat(3, 230, offset=threshold)
    done = cluster.heartbeat(1, 300, offset=threshold - 1, want_shut_down=True)
    assert done == ControllerResult((), BrokerHeartbeatReply(Errors.NONE, True, True, True))


def test_after_failover_a_controlled_shutdown_waits_for_brokers_not_heard_from_yet() -> None:
    """A new active controller has no heartbeat of the other brokers yet: Kafka counts them at
    offset -1 (BrokerHeartbeatManager.register at activation), so the shutdown waits until
    they report past its fencing; it was granted at the next heartbeat."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    cluster.controller = Controller(cluster.config, activated_at_ms=10_000)
    result = cluster.heartbeat(1, 10_100, want_shut_down=True)
    cluster.commit(result.records)
    threshold = cluster.image.last_offset
    waiting = cluster.heartbeat(1, 10_150, want_shut_down=True)
    assert not waiting.response.should_shut_down
    for broker_id in (2, 3):
        cluster.heartbeat(broker_id, 10_200, offset=threshold)
    assert cluster.heartbeat(1, 10_250, want_shut_down=True).response.should_shut_down


def test_the_last_active_broker_shuts_down_at_once() -> None:
    cluster = three_brokers()
    for broker_id, now_ms in ((2, 100), (3, 110)):
        cluster.commit(cluster.heartbeat(broker_id, now_ms, want_shut_down=True).records)
    cluster.commit(cluster.heartbeat(1, 120, want_shut_down=True).records)
    granted = cluster.heartbeat(1, 130, offset=0, want_shut_down=True)
    assert granted.response.should_shut_down  # no active broker left to wait for


def test_a_fenced_broker_may_shut_down_at_once() -> None:
    cluster = Cluster()
    cluster.commit(cluster.register(1).records)
    assert cluster.heartbeat(1, 0, offset=0, want_shut_down=True).response.should_shut_down


# ------------------------------------------------------------------ fencing


def test_fencing_after_the_session_timeout_not_before() -> None:
    cluster = three_brokers()  # every broker heard from at 0
    cluster.commit(cluster.heartbeat(1, 1000).records)
    cluster.commit(cluster.heartbeat(2, 1000).records)
    assert cluster.fence_stale(SESSION_MS) == ControllerResult((), ())
    result = cluster.fence_stale(SESSION_MS + 1)
    assert result == ControllerResult((FenceBroker(3, cluster.epoch(3)),), (3,))
    cluster.commit(result.records)
    assert cluster.fence_stale(1000 + SESSION_MS) == ControllerResult((), ())
    result = cluster.fence_stale(1001 + SESSION_MS)
    assert result.response == (1, 2)
    assert result.records == (FenceBroker(1, cluster.epoch(1)), FenceBroker(2, cluster.epoch(2)))
    cluster.commit(result.records)
    assert cluster.image.unfenced_broker_ids() == []


def test_a_broker_that_heartbeats_is_never_fenced() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 6, 3)
    fenced_at: dict[int, int] = {}
    for now_ms in range(0, 30_000, 100):
        if now_ms % 500 == 0:
            for b in (1, 2):
                cluster.commit(cluster.heartbeat(b, now_ms).records)
            if now_ms <= 5000:
                cluster.commit(cluster.heartbeat(3, now_ms).records)
        result = cluster.fence_stale(now_ms)
        cluster.commit(result.records)
        for b in result.response:
            fenced_at[b] = now_ms
    assert fenced_at == {3: 5000 + SESSION_MS + 100}
    assert cluster.image.unfenced_broker_ids() == [1, 2]


def test_a_heartbeat_counts_from_its_arrival_not_its_turn() -> None:
    """A heartbeat waiting behind other controller work (a CreateTopics waiting for its
    records) was counted only once handled: a busy controller fenced every broker. Its contact
    time is now taken as it arrives (Kafka's trackBrokerHeartbeat); one from a stale broker
    epoch is not taken."""
    cluster = three_brokers()  # every broker heard from at 0
    for b in (1, 2, 3):
        cluster.controller.track_broker_heartbeat(cluster.image, b, cluster.epoch(b), 2_000)
    cluster.controller.track_broker_heartbeat(cluster.image, 3, cluster.epoch(3) - 1, 4_000)
    assert cluster.fence_stale(2_000 + SESSION_MS) == ControllerResult((), ())
    assert cluster.fence_stale(2_001 + SESSION_MS).response == (1, 2, 3)


@pytest.mark.parametrize("fenced", [False, True])
@pytest.mark.parametrize("caught_up", [False, True])
@pytest.mark.parametrize("want", ["", "fence", "shut_down", "stale_epoch"])
def test_a_steady_heartbeat_gets_what_its_turn_would_give(
    fenced: bool, caught_up: bool, want: str
) -> None:
    """``steady_broker_heartbeat`` answers without the controller's turn only heartbeats that
    write nothing, and answers them exactly as ``broker_heartbeat`` does."""

    def setup() -> tuple[Cluster, BrokerHeartbeatRequest]:
        cluster = three_brokers()
        registered = cluster.register(4, 0)
        cluster.commit(registered.records)
        broker = 4 if fenced else 1
        epoch = cluster.epoch(broker)
        request = BrokerHeartbeatRequest(
            broker,
            epoch - 1 if want == "stale_epoch" else epoch,
            cluster.image.last_offset if caught_up else epoch - 1,
            want_fence=want == "fence",
            want_shut_down=want == "shut_down",
        )
        return cluster, request

    steady_cluster, request = setup()
    steady = steady_cluster.controller.steady_broker_heartbeat(steady_cluster.image, request, 5)
    turn_cluster, request = setup()
    turn = next(turn_cluster.controller.broker_heartbeat(lambda: turn_cluster.image, request, 5))
    if steady is not None:
        assert turn == ControllerResult((), steady)
    else:  # a writing or deciding one
        assert (
            want in ("shut_down", "stale_epoch")
            or (want == "fence" and not fenced)
            or (not want and fenced and caught_up)
        )


def test_after_failover_the_session_timers_start_fresh() -> None:
    cluster = three_brokers()
    # A new active controller at t=10 s knows no heartbeat times.
    cluster.controller = Controller(cluster.config, activated_at_ms=10_000)
    assert cluster.fence_stale(10_000 + SESSION_MS) == ControllerResult((), ())
    cluster.commit(cluster.heartbeat(2, 11_000).records)
    result = cluster.fence_stale(10_001 + SESSION_MS)
    assert result.response == (1, 3)


def test_fencing_is_not_proposed_twice_while_in_flight() -> None:
    cluster = three_brokers()
    assert cluster.fence_stale(SESSION_MS + 1).response == (1, 2, 3)
    assert cluster.fence_stale(SESSION_MS + 2) == ControllerResult((), ())
    assert cluster.fence_stale(SESSION_MS + 1001).response == (1, 2, 3)


def test_fencing_moves_leaderships_and_leaves_the_isr() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 3, 2)
    assert [s.replicas for s in cluster.image.partitions_of(T1)] == [(1, 2), (2, 3), (3, 1)]
    cluster.commit(cluster.heartbeat(2, 1000).records)
    cluster.commit(cluster.heartbeat(3, 1000).records)
    result = cluster.fence_stale(SESSION_MS + 1)
    assert result == ControllerResult(
        (
            PartitionChange(T1, 0, 0, leader=2, isr=(2,)),
            PartitionChange(T1, 2, 0, isr=(3,)),
            FenceBroker(1, cluster.epoch(1)),
        ),
        (1,),
    )
    cluster.commit(result.records)
    assert cluster.image.partitions_led_by(1) == []
    assert cluster.image.partitions_with_isr_member(1) == []


Fenced = ControllerResult[tuple[int, ...]]


def decided_at_once_and_in_parts(
    setup: Callable[[], Cluster],
    decision: Callable[[Cluster, int | None], Iterator[ControllerResult[R]]],
    max_changes: int,
) -> tuple[Cluster, ControllerResult[R], Cluster, list[ControllerResult[R]]]:
    """The same cluster twice: decided at once (one result), and in parts of ``max_changes``,
    each part committed before the next is decided. Both clusters and their results."""
    whole = setup()
    before = whole.image.copy()
    (at_once,) = decision(whole, None)
    assert whole.image == before, "a controller decision changed the image"
    whole.commit(at_once.records)
    parts = setup()
    results = []
    for result in decision(parts, max_changes):
        results.append(result)
        parts.commit(result.records)
    return whole, at_once, parts, results


def fenced_at_once_and_in_parts(
    stale_cluster: Callable[[], Cluster], now_ms: int, max_changes: int
) -> tuple[Cluster, Fenced, Cluster, list[Fenced]]:
    """``fence_stale_brokers`` at once and in parts (``decided_at_once_and_in_parts``)."""
    return decided_at_once_and_in_parts(
        stale_cluster,
        lambda c, most: c.controller.fence_stale_brokers(lambda: c.image, now_ms, max_changes=most),
        max_changes,
    )


@pytest.mark.parametrize("max_changes", [1, 2, 5])
def test_fencing_decided_in_parts_ends_where_fencing_at_once_does(max_changes: int) -> None:
    """In parts of ``max_changes``, each decided on the image with the one before applied, a
    broker fenced by the part that changes the last of its partitions: the end is the image
    one whole decision gives, a partition whose ISR the broker cannot leave (its only
    replica) included."""

    def stale_cluster() -> Cluster:
        cluster = three_brokers()
        cluster.create_topic("t", T1, 7, 3)
        cluster.create_topic("u", T2, 4, 1)
        cluster.commit(cluster.heartbeat(1, 1000).records)  # 2 and 3 go stale
        return cluster

    whole, at_once, parts, results = fenced_at_once_and_in_parts(
        stale_cluster, SESSION_MS + 1, max_changes
    )
    assert at_once.response == (2, 3)
    assert len(results) > 2
    for result in results:
        assert sum(isinstance(r, PartitionChange) for r in result.records) <= max_changes
    assert results[0].response == ()  # broker 2 left some ISRs, not fenced yet
    assert [b for result in results for b in result.response] == [2, 3]
    assert parts.image.unfenced_broker_ids() == whole.image.unfenced_broker_ids() == [1]
    for topic_id in (T1, T2):
        assert parts.image.partitions_of(topic_id) == whole.image.partitions_of(topic_id)


@pytest.mark.parametrize("max_changes", [1, 2])
def test_fencing_in_parts_sees_an_isr_another_brokers_part_moved_it_into(
    max_changes: int,
) -> None:
    """KIP-966: fencing broker 1 elects broker 3 from the ELR into the ISR; broker 3, stale
    too, must then leave that ISR as well. Decided in parts, its partitions are chosen once
    broker 1's parts are applied, and the end is the one whole decision's."""

    def stale_cluster() -> Cluster:
        cluster = three_brokers()
        cluster.create_topic("t", T1, 3, 3, {"min.insync.replicas": "2"})
        cluster.commit(cluster.heartbeat(2, 100, want_fence=True).records)
        cluster.commit(cluster.heartbeat(3, 100, want_fence=True).records)
        cluster.commit(cluster.heartbeat(3, 200).records)  # back, unfenced: in the ELR
        cluster.commit(cluster.heartbeat(2, 200).records)
        cluster.commit(cluster.heartbeat(2, 1000).records)  # 1 and 3 go stale
        assert {(s.isr, s.elr) for s in cluster.image.partitions_of(T1)} == {((1,), (3,))}
        return cluster

    whole, at_once, parts, _ = fenced_at_once_and_in_parts(
        stale_cluster, SESSION_MS + 201, max_changes
    )
    assert at_once.response == (1, 3)
    assert parts.image.partitions_of(T1) == whole.image.partitions_of(T1)
    assert parts.image.unfenced_broker_ids() == whole.image.unfenced_broker_ids() == [2]
    assert all(s.isr == () and s.leader == NO_LEADER for s in parts.image.partitions_of(T1))


def heartbeat_decision(
    broker_id: int, now_ms: int, *, want_fence: bool = False, want_shut_down: bool = False
) -> Callable[[Cluster, int | None], Iterator[ControllerResult[BrokerHeartbeatReply]]]:
    """A caught-up heartbeat of the broker, decided with ``max_changes``."""

    def decision(
        cluster: Cluster, max_changes: int | None
    ) -> Iterator[ControllerResult[BrokerHeartbeatReply]]:
        request = BrokerHeartbeatRequest(
            broker_id,
            cluster.epoch(broker_id),
            cluster.image.last_offset,
            want_fence=want_fence,
            want_shut_down=want_shut_down,
        )
        return cluster.controller.broker_heartbeat(
            lambda: cluster.image, request, now_ms, max_changes=max_changes
        )

    return decision


def two_topics_on_three_brokers() -> Cluster:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 7, 3)
    cluster.create_topic("u", T2, 4, 1)
    return cluster


@pytest.mark.parametrize("want", ["fence", "shut_down"])
@pytest.mark.parametrize("max_changes", [1, 2, 5])
def test_a_heartbeat_fencing_its_broker_in_parts_ends_where_fencing_at_once_does(
    want: str, max_changes: int
) -> None:
    """A broker asking to be fenced or to shut down leaves its ISRs in parts, each decided on
    the image with the one before applied, and is fenced by the last: the end is one whole
    decision's image, and every part answers what the whole does."""
    decision = heartbeat_decision(
        2, 100, want_fence=want == "fence", want_shut_down=want == "shut_down"
    )
    whole, at_once, parts, results = decided_at_once_and_in_parts(
        two_topics_on_three_brokers, decision, max_changes
    )
    assert len(results) > 1
    for result in results:
        assert sum(isinstance(r, PartitionChange) for r in result.records) <= max_changes
        assert (
            result.response
            == at_once.response
            == BrokerHeartbeatReply(Errors.NONE, True, True, False)
        )
    records = [r for result in results for r in result.records]
    assert [r for r in records if not isinstance(r, PartitionChange)] == [
        FenceBroker(2, whole.epoch(2))
    ]
    assert records[-1] == FenceBroker(2, whole.epoch(2))
    assert parts.image.unfenced_broker_ids() == whole.image.unfenced_broker_ids() == [1, 3]
    for topic_id in (T1, T2):
        assert parts.image.partitions_of(topic_id) == whole.image.partitions_of(topic_id)


@pytest.mark.parametrize("max_changes", [1, 2, 5])
def test_a_heartbeat_unfencing_its_broker_in_parts_ends_where_unfencing_at_once_does(
    max_changes: int,
) -> None:
    """A whole cluster back from an outage has every partition leaderless: the first broker
    unfenced is elected in parts, UnfenceBroker first, each part decided on the image with the
    one before applied."""

    def all_fenced() -> Cluster:
        cluster = two_topics_on_three_brokers()
        for b in (1, 2, 3):
            cluster.commit(cluster.heartbeat(b, 100, want_fence=True).records)
        assert all(s.leader == NO_LEADER for s in cluster.image.partitions_of(T1))
        return cluster

    whole, at_once, parts, results = decided_at_once_and_in_parts(
        all_fenced, heartbeat_decision(3, 2_000), max_changes
    )
    assert len(results) > 1
    assert results[0].records[0] == UnfenceBroker(3, whole.epoch(3))
    for result in results:
        assert sum(isinstance(r, PartitionChange) for r in result.records) <= max_changes
        assert result.response == at_once.response == BrokerHeartbeatReply(Errors.NONE, True, False)
    assert parts.image.unfenced_broker_ids() == whole.image.unfenced_broker_ids() == [3]
    for topic_id in (T1, T2):
        assert parts.image.partitions_of(topic_id) == whole.image.partitions_of(topic_id)
    assert any(s.leader == 3 for s in whole.image.partitions_of(T1))


def test_replicas_reported_offline_leave_the_isr_and_their_leadership() -> None:
    """A partition whose log failed to load on its leader stayed led there, unavailable:
    the heartbeat names it, and the controller elects another ISR member
    (ReplicationControlManager.handleDirectoriesOffline, per replica here). Once applied, the
    same report proposes nothing; a report for an unknown partition is ignored."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 3, 2)
    assert [s.replicas for s in cluster.image.partitions_of(T1)] == [(1, 2), (2, 3), (3, 1)]
    offline = ((T1, 0), (T1, 2), (T1, 7), (T2, 0))
    result = cluster.heartbeat(1, 100, offline=offline)
    assert result == ControllerResult(
        (PartitionChange(T1, 0, 0, leader=2, isr=(2,)), PartitionChange(T1, 2, 0, isr=(3,))),
        BrokerHeartbeatReply(Errors.NONE, True, False, False),
    )
    cluster.commit(result.records)
    assert cluster.heartbeat(1, 600, offline=offline).records == ()
    assert not cluster.image.is_fenced(1)  # its other partitions it serves on


def test_a_broker_is_not_elected_on_unfencing_where_it_reports_the_log_offline() -> None:
    """Every broker fenced; the last ISR member comes back with that partition's log failed to
    load. Its unfencing heartbeat elected it there all the same (the offline report was read
    only by an unfenced broker's heartbeat), bumping the leader epoch of a log it refuses to
    host. Kafka elects only on a directory the registration lists online (hasOnlineDir)."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    for b in (1, 2, 3):
        cluster.commit(cluster.heartbeat(b, 100, want_fence=True).records)
    state = cluster.state(T1, 0)
    assert (state.leader, state.isr) == (NO_LEADER, ())
    [last] = state.elr  # KIP-966: the last ISR member, eligible
    result = cluster.heartbeat(last, 2_000, offline=((T1, 0),))
    assert result.records == (UnfenceBroker(last, cluster.epoch(last)),)
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == state
    # Its next heartbeat, unfenced, takes it out of the ELR (as any offline report), and
    # forgets it as the last known leader.
    assert state.last_known_elr == (last,)
    after = cluster.heartbeat(last, 2_500, offline=((T1, 0),))
    assert after.records == (
        PartitionChange(T1, 0, state.partition_epoch, elr=(), last_known_elr=()),
    )


def test_an_offline_report_never_reaches_a_topic_recreated_under_its_name() -> None:
    """A node reports its offline logs by the id of the topic each was created for: a report
    of a deleted topic's log, from a node whose image is behind, leaves the topic re-created
    under the same name alone (by name, it took a healthy leader out of the new ISR)."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 1)
    cluster.commit((RemoveTopic(T1),))
    cluster.create_topic("t", T2, 1, 1)
    before = cluster.state(T2, 0)
    assert cluster.heartbeat(before.leader, 100, offline=((T1, 0),)).records == ()
    assert cluster.state(T2, 0) == before


def test_a_replica_reported_offline_leaves_the_elr_and_is_not_elected() -> None:
    """Below min ISR a replica leaving the ISR joins the ELR; one whose log is offline joined
    it too, and was elected once the ISR emptied, on a broker that refuses to host the log.
    Kafka never elects it (LeaderAcceptor's hasOnlineDir); here it leaves the ELR, and a
    replica already in the ELR when it reports its log offline leaves it as well."""
    cluster = three_brokers(ControllerConfig(min_insync_replicas=2))
    cluster.create_topic("t", T1, 1, 2)
    assert cluster.state(T1, 0).replicas == (1, 2)
    result = cluster.heartbeat(2, 100, offline=((T1, 0),))
    assert result.records == (PartitionChange(T1, 0, 0, isr=(1,)),)
    cluster.commit(result.records)
    fenced = cluster.heartbeat(1, 200, want_fence=True)
    cluster.commit(fenced.records)
    state = cluster.state(T1, 0)
    assert (state.leader, state.isr, state.elr) == (NO_LEADER, (), (1,))
    assert cluster.heartbeat(2, 300, offline=((T1, 0),)).records == ()

    # In the ELR first (the ISR shrank below min ISR), then reported offline.
    cluster.create_topic("u", T2, 1, 3)
    cluster.commit(
        cluster.alter(cluster.state(T2, 0).leader, T2, 0, (cluster.state(T2, 0).leader,)).records
    )
    state = cluster.state(T2, 0)
    member = state.elr[0]
    result = cluster.heartbeat(member, 400, offline=((T2, 0),))
    assert result.records == (
        PartitionChange(
            T2, 0, state.partition_epoch, elr=tuple(r for r in state.elr if r != member)
        ),
    )


def test_no_election_chooses_a_replica_whose_log_its_broker_reports_offline() -> None:
    """Kafka's ``LeaderAcceptor`` elects no replica on an offline directory. Here a broker's
    offline report only took it out of that ISR or ELR: an unclean election chose it again
    (first in replica order) after each heartbeat took it out, and the live replica with the
    log never led (found by a review). The controller now keeps each broker's latest report
    and no election chooses those replicas, until the broker registers again."""
    cluster = three_brokers(ControllerConfig(eligible_leader_replicas_enabled=False))
    cluster.create_topic("t", T1, 1, 3)
    first, second, third = cluster.state(T1, 0).replicas
    cluster.commit(cluster.alter(first, T1, 0, (first,)).records)
    cluster.commit(cluster.heartbeat(first, 100, want_fence=True).records)
    assert cluster.state(T1, 0).leader == NO_LEADER
    assert cluster.heartbeat(second, 200, offline=((T1, 0),)).records == ()

    def elect() -> ControllerResult[Any]:
        return cluster.decide(
            lambda image: cluster.controller.elect_leaders(image, Election.UNCLEAN, [("t", 0)])
        )

    result = elect()
    assert [r.error for r in result.response] == [Errors.NONE]
    (change,) = result.records
    assert isinstance(change, PartitionChange) and change.leader == third
    # A heartbeat with the log back online (no report) makes it electable again.
    cluster.commit(cluster.heartbeat(third, 300, want_fence=True).records)
    assert cluster.state(T1, 0).leader == NO_LEADER
    assert elect().response[0].error is Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE
    cluster.commit(cluster.heartbeat(second, 400).records)
    (change,) = elect().records
    assert isinstance(change, PartitionChange) and change.leader == second


def test_another_brokers_unfencing_elects_no_elr_member_reporting_its_log_offline() -> None:
    """Both replicas fenced, both in the ELR. The first back reports the log offline; the
    second's unfencing then elected the first from the ELR, on a broker that refuses the
    log, until its next heartbeat took it out (found by a review)."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 2, configs={"min.insync.replicas": "2"})
    first, second = cluster.state(T1, 0).replicas
    for b in (second, first):
        cluster.commit(cluster.heartbeat(b, 100, want_fence=True).records)
    assert set(cluster.state(T1, 0).elr) == {first, second}
    cluster.commit(cluster.heartbeat(first, 200, offline=((T1, 0),)).records)
    assert cluster.state(T1, 0).leader == NO_LEADER
    cluster.commit(cluster.heartbeat(second, 300).records)
    assert cluster.state(T1, 0).leader == second


# ------------------------------------------------------------------ elections


def test_election_picks_a_live_isr_member() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1, 3)).records)  # 2 fell behind
    result = cluster.heartbeat(1, 100, want_fence=True)
    assert result.records == (
        PartitionChange(T1, 0, 1, leader=3, isr=(3,)),
        FenceBroker(1, cluster.epoch(1)),
    )
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (3,), 3, 1, 2)


@pytest.mark.parametrize("elr", [True, False], ids=["elr", "no-elr"])
def test_no_unclean_election_by_default(elr: bool) -> None:
    cluster = three_brokers(ControllerConfig(eligible_leader_replicas_enabled=elr))
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    result = cluster.heartbeat(1, 100, want_fence=True)
    if elr:
        # KIP-966: the ISR empties and the fenced last member stays eligible.
        change = PartitionChange(T1, 0, 1, leader=NO_LEADER, isr=(), elr=(1,), last_known_elr=(1,))
        after = PartitionState(T1, 0, (1, 2, 3), (), NO_LEADER, 1, 2, (1,), (1,))
    else:
        # Without ELR the last ISR member stays in the ISR of the leaderless partition.
        change = PartitionChange(T1, 0, 1, leader=NO_LEADER)
        after = PartitionState(T1, 0, (1, 2, 3), (1,), NO_LEADER, 1, 2)
    assert result.records == (change, FenceBroker(1, cluster.epoch(1)))
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == after
    # Brokers 2 and 3 are alive but never become leaders.
    for now_ms in (200, 300):
        for b in (2, 3):
            cluster.commit(cluster.heartbeat(b, now_ms).records)
    assert cluster.state(T1, 0).leader == NO_LEADER


@pytest.mark.parametrize(
    "where", ["topic", "cluster-config-record", "controller-config"], ids=lambda w: w
)
def test_unclean_election_when_configured(where: str) -> None:
    config = ControllerConfig(unclean_leader_election_enable=where == "controller-config")
    cluster = three_brokers(config)
    # A value with blanks around it, as validation accepts it (ConfigDef trims booleans).
    topic_configs = {"unclean.leader.election.enable": " true "} if where == "topic" else {}
    cluster.create_topic("t", T1, 1, 3, topic_configs)
    if where == "cluster-config-record":
        cluster.commit(
            (Config(ConfigResourceType.BROKER, "", "unclean.leader.election.enable", "true"),)
        )
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    result = cluster.heartbeat(1, 100, want_fence=True)
    # Unclean: 2 is elected although not in the ISR; the ISR becomes just 2, the ELR is cleared.
    assert result.records == (
        PartitionChange(T1, 0, 1, leader=2, isr=(2,)),
        FenceBroker(1, cluster.epoch(1)),
    )
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (2,), 2, 1, 2)


def test_topic_config_overrides_an_unclean_cluster_default() -> None:
    cluster = three_brokers(ControllerConfig(unclean_leader_election_enable=True))
    cluster.create_topic("t", T1, 1, 3, {"unclean.leader.election.enable": "false"})
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    result = cluster.heartbeat(1, 100, want_fence=True)
    assert isinstance(result.records[0], PartitionChange)
    assert result.records[0].leader == NO_LEADER


def test_eligible_leader_replicas_kip_966() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3, {"min.insync.replicas": "2"})
    cluster.commit(cluster.heartbeat(2, 100, want_fence=True).records)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (1, 3), 1, 0, 1)
    # The ISR drops below min ISR: 1 leaves it but stays eligible.
    result = cluster.heartbeat(1, 100, want_fence=True)
    assert result.records[0] == PartitionChange(T1, 0, 1, leader=3, isr=(3,), elr=(1,))
    cluster.commit(result.records)
    # The last ISR member goes: no leader, both stay eligible, 3 was the last known leader.
    result = cluster.heartbeat(3, 100, want_fence=True)
    assert result.records[0] == PartitionChange(
        T1, 0, 2, leader=NO_LEADER, isr=(), elr=(1, 3), last_known_elr=(3,)
    )
    cluster.commit(result.records)
    # 2 comes back first: it left the ISR while it was still at min ISR, so it is not eligible.
    result = cluster.heartbeat(2, 200)
    assert result.records == (UnfenceBroker(2, cluster.epoch(2)),)
    cluster.commit(result.records)
    # 1 comes back: elected from the ELR.
    result = cluster.heartbeat(1, 200)
    assert result.records == (
        UnfenceBroker(1, cluster.epoch(1)),
        PartitionChange(T1, 0, 3, leader=1, isr=(1,), elr=(3,), last_known_elr=()),
    )
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (1,), 1, 3, 4, (3,), ())
    # The leader adds 2 back: the ISR is at min ISR again and the ELR is cleared.
    altered = cluster.alter(1, T1, 0, (1, 2))
    assert altered.records == (PartitionChange(T1, 0, 4, isr=(1, 2), elr=()),)


def test_the_last_isr_member_is_reelected_when_it_comes_back() -> None:
    cluster = three_brokers(ControllerConfig(eligible_leader_replicas_enabled=False))
    cluster.create_topic("t", T1, 2, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    assert cluster.state(T1, 0).leader == NO_LEADER
    result = cluster.heartbeat(1, 200)
    assert result.records == (
        UnfenceBroker(1, cluster.epoch(1)),
        PartitionChange(T1, 0, 2, leader=1),
    )
    cluster.commit(result.records)
    replicas = cluster.state(T1, 0).replicas
    assert cluster.state(T1, 0) == PartitionState(T1, 0, replicas, (1,), 1, 2, 3)
    # Partition 1 kept a live leader: the returning broker does not take it.
    assert cluster.state(T1, 1).leader != 1


def test_preferred_leader_election_after_a_broker_returns() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 3, 3)
    led_by_1 = [s.partition for s in cluster.image.partitions_led_by(1)]
    assert led_by_1 == [0]
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    cluster.commit(cluster.heartbeat(1, 200).records)
    # Back and unfenced, but not in the ISR: no preferred election yet.
    assert cluster.run(cluster.controller.elect_preferred_leaders) == ()
    current = cluster.state(T1, 0)
    cluster.commit(cluster.alter(current.leader, T1, 0, (*current.isr, 1)).records)
    result = cluster.decide(cluster.controller.elect_preferred_leaders)
    assert result == ControllerResult(
        (PartitionChange(T1, 0, 2, leader=1),), (TopicIdPartition(T1, 0),)
    )
    cluster.commit(result.records)
    assert cluster.state(T1, 0).leader == 1


def test_elect_leaders_preferred_as_kip_460() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 3, 3)
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    cluster.commit(cluster.heartbeat(1, 200).records)

    def elect(partitions: list[tuple[str, int]] | None) -> ControllerResult[Any]:
        return cluster.decide(
            lambda image: cluster.controller.elect_leaders(image, Election.PREFERRED, partitions)
        )

    # Broker 1 is back but not in partition 0's ISR: its preferred leader is not available.
    wanted = [("t", 0), ("t", 1), ("nope", 0), ("t", 9)]
    result = elect(wanted)
    assert result.records == ()
    assert [(r.topic, r.partition, r.error) for r in result.response] == [
        ("t", 0, Errors.PREFERRED_LEADER_NOT_AVAILABLE),
        ("t", 1, Errors.ELECTION_NOT_NEEDED),
        ("nope", 0, Errors.UNKNOWN_TOPIC_OR_PARTITION),
        ("t", 9, Errors.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    current = cluster.state(T1, 0)
    cluster.commit(cluster.alter(current.leader, T1, 0, (*current.isr, 1)).records)
    # Every partition: only those needing an election are answered.
    result = elect(None)
    assert result.records == (PartitionChange(T1, 0, 2, leader=1),)
    assert [(r.topic, r.partition, r.error) for r in result.response] == [("t", 0, Errors.NONE)]


def test_elect_leaders_unclean_only_where_there_is_no_leader() -> None:
    cluster = three_brokers(ControllerConfig(eligible_leader_replicas_enabled=False))
    cluster.create_topic("t", T1, 2, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)  # partition 0: ISR {1}
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    assert cluster.state(T1, 0).leader == NO_LEADER

    def elect() -> ControllerResult[Any]:
        return cluster.decide(
            lambda image: cluster.controller.elect_leaders(
                image, Election.UNCLEAN, [("t", 0), ("t", 1)]
            )
        )

    result = elect()
    assert [r.error for r in result.response] == [Errors.NONE, Errors.ELECTION_NOT_NEEDED]
    (change,) = result.records
    assert isinstance(change, PartitionChange) and change.leader in (2, 3)
    # With every replica fenced there is nobody to elect.
    for broker in (2, 3):
        cluster.commit(cluster.heartbeat(broker, 100, want_fence=True).records)
    assert elect().response[0].error is Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE


@pytest.mark.parametrize("where", ["topic", "cluster"])
def test_turning_unclean_election_on_elects_leaderless_partitions(where: str) -> None:
    """Kafka's periodic ``maybeElectUncleanLeaders``: a partition left without a leader while
    unclean election was off gets one once the config allows it, with no broker change."""
    cluster = three_brokers(ControllerConfig(eligible_leader_replicas_enabled=False))
    cluster.create_topic("t", T1, 2, 3)
    cluster.create_topic("u", T2, 3, 3)  # stays clean: keeps waiting for its ISR
    (u,) = [p for p in range(3) if cluster.state(T2, p).leader == 1]
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    cluster.commit(cluster.alter(1, T2, u, (1,)).records)
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    assert cluster.state(T1, 0).leader == NO_LEADER == cluster.state(T2, u).leader
    assert cluster.run(cluster.controller.elect_unclean_leaders) == ()
    if where == "topic":
        on = Config(ConfigResourceType.TOPIC, "t", "unclean.leader.election.enable", "true")
        cluster.commit((on,))
    else:
        on = Config(ConfigResourceType.BROKER, "", "unclean.leader.election.enable", "true")
        off = Config(ConfigResourceType.TOPIC, "u", "unclean.leader.election.enable", "false")
        cluster.commit((on, off))
    assert cluster.run(cluster.controller.elect_unclean_leaders) == (TopicIdPartition(T1, 0),)
    assert cluster.state(T1, 0).leader in (2, 3)
    assert cluster.state(T1, 0).isr == (cluster.state(T1, 0).leader,)
    assert cluster.state(T2, u).leader == NO_LEADER
    assert cluster.run(cluster.controller.elect_unclean_leaders) == ()


def test_preferred_leader_election_is_bounded() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 6, 3)
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    cluster.commit(cluster.heartbeat(1, 200).records)
    for state in cluster.image.partitions_of(T1):
        if 1 not in state.isr:
            cluster.commit(
                cluster.alter(state.leader, T1, state.partition, (*state.isr, 1)).records
            )
    result = cluster.decide(lambda image: cluster.controller.elect_preferred_leaders(image, 1))
    assert len(result.response) == 1
    cluster.commit(result.records)
    result = cluster.decide(cluster.controller.elect_preferred_leaders)
    assert len(result.response) == 1
    cluster.commit(result.records)
    assert len(cluster.image.partitions_led_by(1)) == 2


@pytest.mark.parametrize("dead", [1, 2, 3])
def test_failover_spreads_the_offsets_partitions_over_the_survivors(dead: int) -> None:
    cluster = three_brokers()
    assert cluster.run(lambda image: cluster.controller.create_offsets_topic(image, OFFSETS_ID))
    before = cluster.image.leader_counts()
    assert sorted(before.values()) == [16, 17, 17]
    cluster.commit(cluster.heartbeat(dead, 100, want_fence=True).records)
    after = cluster.image.leader_counts()
    assert dead not in after
    assert sum(after.values()) == 50
    assert sorted(after.values()) == [25, 25]


# ------------------------------------------------------------------ AlterPartition


def test_alter_partition_shrinks_the_isr() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    result = cluster.alter(1, T1, 0, (1, 2))
    assert result == ControllerResult(
        (PartitionChange(T1, 0, 0, isr=(1, 2)),),
        AlterPartitionResponse(
            Errors.NONE, (AlterPartitionResult(T1, 0, Errors.NONE, 1, 0, 1, (1, 2)),)
        ),
    )
    cluster.commit(result.records)
    assert cluster.state(T1, 0) == PartitionState(T1, 0, (1, 2, 3), (1, 2), 1, 0, 1)
    # The same ISR again is accepted without a record.
    assert cluster.alter(1, T1, 0, (1, 2)) == ControllerResult(
        (),
        AlterPartitionResponse(
            Errors.NONE, (AlterPartitionResult(T1, 0, Errors.NONE, 1, 0, 1, (1, 2)),)
        ),
    )


def alter_error(result: ControllerResult[AlterPartitionResponse]) -> Errors:
    assert result.records == ()
    assert result.response.error is Errors.NONE
    (partition,) = result.response.partitions
    assert partition.leader == NO_LEADER and partition.isr == ()
    return partition.error


def test_alter_partition_refusals() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    cluster.commit(cluster.heartbeat(1, 200).records)
    current = cluster.state(T1, 0)
    assert current == PartitionState(T1, 0, (1, 2, 3), (2, 3), 2, 1, 1)
    cases: list[tuple[ControllerResult[AlterPartitionResponse], Errors]] = [
        # The old leader, with its old epoch.
        (cluster.alter(1, T1, 0, (1, 2, 3), leader_epoch=0), Errors.FENCED_LEADER_EPOCH),
        # A newer leader epoch than the controller knows.
        (cluster.alter(2, T1, 0, (2, 3), leader_epoch=2), Errors.NOT_CONTROLLER),
        (cluster.alter(2, T1, 0, (2, 3), partition_epoch=2), Errors.NOT_CONTROLLER),
        # Right epoch, not the leader.
        (cluster.alter(3, T1, 0, (2, 3)), Errors.NOT_LEADER_OR_FOLLOWER),
        # The leader with a stale partition epoch.
        (cluster.alter(2, T1, 0, (2,), partition_epoch=0), Errors.INVALID_UPDATE_VERSION),
        # The leader must stay in the ISR.
        (cluster.alter(2, T1, 0, (3,)), Errors.INVALID_REQUEST),
    ]
    for result, error in cases:
        assert alter_error(result) is error, error


def test_alter_partition_refuses_ineligible_replicas() -> None:
    cluster = three_brokers()
    cluster.start(4)
    cluster.create_topic("t", T1, 1, 3)
    assert cluster.state(T1, 0).replicas == (1, 2, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1, 2)).records)

    def item(new_isr: tuple[BrokerState, ...]) -> ControllerResult[AlterPartitionResponse]:
        current = cluster.state(T1, 0)
        request = AlterPartitionRequest(
            1,
            cluster.epoch(1),
            (AlterPartitionItem(T1, 0, current.leader_epoch, current.partition_epoch, new_isr),),
        )
        return cluster.decide(lambda image: cluster.controller.alter_partition(image, request))

    e1, e2, e3 = cluster.epoch(1), cluster.epoch(2), cluster.epoch(3)
    # 4 is a live broker, but not a replica of this partition.
    assert alter_error(item((BrokerState(1, e1), BrokerState(4)))) is Errors.INELIGIBLE_REPLICA
    # Duplicates.
    assert alter_error(item((BrokerState(1, e1), BrokerState(1, e1)))) is Errors.INELIGIBLE_REPLICA
    # A stale broker epoch of a member (KIP-841): it restarted since it caught up.
    stale = BrokerState(3, e3 - 1)
    assert alter_error(item((BrokerState(1, e1), stale))) is Errors.INELIGIBLE_REPLICA
    # A fenced replica.
    cluster.commit(cluster.heartbeat(3, 100, want_fence=True).records)
    assert alter_error(item((BrokerState(1, e1), BrokerState(3)))) is Errors.INELIGIBLE_REPLICA
    # Epoch -1 skips the epoch check; a live replica with its epoch is fine.
    assert item((BrokerState(1), BrokerState(2, e2))).response.partitions[0].error is Errors.NONE


def test_alter_partition_from_a_stale_broker_epoch_or_unknown_partitions() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    stale = cluster.alter(1, T1, 0, (1, 2), broker_epoch=cluster.epoch(1) - 1)
    assert stale == ControllerResult((), AlterPartitionResponse(Errors.STALE_BROKER_EPOCH))
    request = AlterPartitionRequest(
        1,
        cluster.epoch(1),
        (
            AlterPartitionItem(T2, 0, 0, 0, (BrokerState(1),)),
            AlterPartitionItem(T1, 5, 0, 0, (BrokerState(1),)),
        ),
    )
    result = cluster.decide(lambda image: cluster.controller.alter_partition(image, request))
    assert result == ControllerResult(
        (),
        AlterPartitionResponse(
            Errors.NONE,
            (
                AlterPartitionResult(T2, 0, Errors.UNKNOWN_TOPIC_ID),
                AlterPartitionResult(T1, 5, Errors.UNKNOWN_TOPIC_OR_PARTITION),
            ),
        ),
    )


def test_two_changes_to_one_partition_in_one_request() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    e1, e2 = cluster.epoch(1), cluster.epoch(2)
    request = AlterPartitionRequest(
        1,
        e1,
        (
            AlterPartitionItem(T1, 0, 0, 0, (BrokerState(1, e1), BrokerState(2, e2))),
            AlterPartitionItem(T1, 0, 0, 0, (BrokerState(1, e1),)),
        ),
    )
    result = cluster.decide(lambda image: cluster.controller.alter_partition(image, request))
    assert result.records == (PartitionChange(T1, 0, 0, isr=(1, 2)),)
    assert [p.error for p in result.response.partitions] == [
        Errors.NONE,
        Errors.INVALID_UPDATE_VERSION,
    ]
    cluster.commit(result.records)


def test_isr_shrink_below_min_isr_fills_the_elr() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3, {"min.insync.replicas": "2"})
    result = cluster.alter(1, T1, 0, (1,))
    assert result.records == (PartitionChange(T1, 0, 0, isr=(1,), elr=(2, 3)),)
    cluster.commit(result.records)
    result = cluster.alter(1, T1, 0, (1, 3))
    assert result.records == (PartitionChange(T1, 0, 1, isr=(1, 3), elr=()),)


def test_a_change_of_min_isr_clears_the_elr() -> None:
    """ISR (1), ELR (2, 3) under min.insync.replicas=2. Lowered to 1, leader 1 commits alone;
    an ELR kept from before would let 2 or 3 be elected without those records
    (ConfigurationControlManager.createClearElrRecordsAsNeeded, KAFKA-16540)."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 2, 3, {"min.insync.replicas": "2"})
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    state = cluster.image.partition(T1, 0)
    assert state is not None and set(state.elr) == {2, 3}
    result = alter(cluster, [("min.insync.replicas", ConfigOp.SET, "1")])
    assert result.records == (
        Config(TOPIC, "t", "min.insync.replicas", "1"),
        PartitionChange(T1, 0, 1, elr=(), last_known_elr=()),  # partition 1 had no ELR
    )
    cluster.commit(result.records)
    state = cluster.image.partition(T1, 0)
    assert state is not None and (state.isr, state.elr) == ((1,), ())
    # Another key leaves the ELR alone.
    assert alter(cluster, [("retention.ms", ConfigOp.SET, "5")]).records == (
        Config(TOPIC, "t", "retention.ms", "5"),
    )


def test_a_new_controller_pins_its_min_isr_at_the_cluster_level() -> None:
    """Each node fell back to its own file's min.insync.replicas: a controller whose file said
    2 kept an ELR that a leader whose file said 1 committed without, then elected it cleanly
    (ConfigurationControlManager.maybeGenerateElrSafetyRecords writes the cluster-level value
    once; any change of it clears every ELR, KAFKA-16540)."""
    cluster = three_brokers(ControllerConfig(min_insync_replicas=2))
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    state = cluster.image.partition(T1, 0)
    assert state is not None and set(state.elr) == {2, 3}
    pinned = cluster.decide(cluster.controller.elr_safety_records)
    assert pinned.response == 2
    assert pinned.records == (
        Config(ConfigResourceType.BROKER, "", "min.insync.replicas", "2"),
        PartitionChange(T1, 0, 1, elr=(), last_known_elr=()),
    )
    cluster.commit(pinned.records)
    assert cluster.decide(cluster.controller.elr_safety_records).records == ()
    # A controller with another value in its file keeps the pinned one, and so does a leader.
    other = Controller(ControllerConfig(min_insync_replicas=1), activated_at_ms=0)
    assert other.elr_safety_records(cluster.image).records == ()
    assert cluster.image.resource_configs(CLUSTER_CONFIGS) == {"min.insync.replicas": "2"}


def test_the_cluster_level_min_isr_changes_but_is_not_removed() -> None:
    cluster = three_brokers(ControllerConfig(min_insync_replicas=2))
    cluster.commit(cluster.decide(cluster.controller.elr_safety_records).records)
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.alter(1, T1, 0, (1,)).records)
    changed = alter_cluster_defaults(cluster, [("min.insync.replicas", ConfigOp.SET, "1")])
    assert changed.response.error is Errors.NONE
    assert changed.records == (
        Config(ConfigResourceType.BROKER, "", "min.insync.replicas", "1"),
        PartitionChange(T1, 0, 1, elr=(), last_known_elr=()),
    )
    cluster.commit(changed.records)
    delete: list[tuple[str, ConfigOp, str | None]] = [
        ("min.insync.replicas", ConfigOp.DELETE, None)
    ]
    for ops, incremental in ((delete, True), ([], False)):
        removed = alter_cluster_defaults(cluster, ops, incremental=incremental)
        assert removed.records == ()
        assert removed.response == AlterConfigsResult(
            Errors.INVALID_CONFIG,
            "Cluster-level min.insync.replicas cannot be removed while ELR is enabled.",
        )


def test_a_topics_compaction_lags_are_checked_over_the_cluster_level_ones() -> None:
    """Kafka's LogConfig.validate merges the broker's log configs under a topic's: a topic
    whose min.compaction.lag.ms is above the cluster's max.compaction.lag.ms is refused, at
    creation and by an alter, as two contradicting configs of its own are; its own max wins
    over the cluster's."""
    cluster = three_brokers()
    cluster.commit(
        (Config(ConfigResourceType.BROKER, "", "log.cleaner.max.compaction.lag.ms", "1000"),)
    )
    refused = cluster.decide(
        lambda image: cluster.controller.create_topic(
            image, "t", T1, num_partitions=1, replication_factor=1,
            configs={"min.compaction.lag.ms": "5000"},
        )
    )  # fmt: skip
    assert refused.response.error is Errors.INVALID_CONFIG
    assert refused.response.message == (
        "conflict topic config setting min.compaction.lag.ms (5000) > max.compaction.lag.ms (1000)"
    )
    cluster.create_topic(
        "t", T1, 1, 1, {"min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "9000"}
    )
    removed = alter(cluster, [("max.compaction.lag.ms", ConfigOp.DELETE, None)])
    assert removed.response.error is Errors.INVALID_CONFIG
    assert alter(cluster, [("min.compaction.lag.ms", ConfigOp.SET, "500")]).records


def test_a_cluster_level_key_another_build_wrote_neither_blocks_alters_nor_stays() -> None:
    """A cluster-level key this build does not know (written by another, say a later one's
    log.retention.hours) is left unchecked by the alters of the other keys, and may be
    removed; it raised KeyError in every incremental alter of the cluster's defaults."""
    cluster = three_brokers()
    cluster.commit((Config(ConfigResourceType.BROKER, "", "log.retention.hours", "24"),))
    set_one = alter_cluster_defaults(cluster, [("log.retention.ms", ConfigOp.SET, "60000")])
    assert set_one.response.error is Errors.NONE
    cluster.commit(set_one.records)
    removed = alter_cluster_defaults(cluster, [("log.retention.hours", ConfigOp.DELETE, None)])
    assert removed.records == (Config(ConfigResourceType.BROKER, "", "log.retention.hours", None),)
    cluster.commit(removed.records)
    assert cluster.image.resource_configs(CLUSTER_CONFIGS) == {"log.retention.ms": "60000"}


def test_a_cluster_level_retention_of_zero_is_refused_as_a_brokers_would_be() -> None:
    """``log.retention.ms=0`` as the cluster's default was taken as a topic's value (which
    may be 0) and applied to every topic without its own: all their rolled segments went.
    KafkaConfig.validateValues, which a dynamic broker config goes through, refuses it; a
    topic's own retention.ms=0 stays allowed."""
    cluster = three_brokers()
    refused = alter_cluster_defaults(cluster, [("log.retention.ms", ConfigOp.SET, "0")])
    assert refused.response.error is Errors.INVALID_REQUEST and not refused.records
    assert "log.retention.ms must be unlimited (-1)" in refused.response.message
    for value in ("-1", "1"):
        allowed = alter_cluster_defaults(cluster, [("log.retention.ms", ConfigOp.SET, value)])
        assert allowed.response.error is Errors.NONE
    cluster.create_topic("t", T1, 1, 1, {"retention.ms": "0"})


@pytest.mark.parametrize("raw", ["+2", " 2", "2 "])
def test_min_isr_is_read_as_every_leader_reads_it(raw: str) -> None:
    """Kafka's ConfigDef trims and takes a sign; the controller read only bare digits, so with
    "+2" it used its default (1) while leaders used 2, and the two disagreed on the ELR."""
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3, {"min.insync.replicas": raw})
    result = cluster.alter(1, T1, 0, (1,))
    assert result.records == (PartitionChange(T1, 0, 0, isr=(1,), elr=(2, 3)),)


# ------------------------------------------------------------------ topic creation


def test_create_topic_places_replicas_and_leaders_evenly() -> None:
    cluster = three_brokers()
    result = cluster.decide(
        lambda image: cluster.controller.create_topic(
            image,
            "orders",
            T1,
            num_partitions=3,
            replication_factor=2,
            configs={"retention.ms": "1000"},
        )
    )
    assert result == ControllerResult(
        (
            Topic("orders", T1, {"retention.ms": "1000"}),
            Partition(T1, 0, (1, 2), (1, 2), 1, 0, 0),
            Partition(T1, 1, (2, 3), (2, 3), 2, 0, 0),
            Partition(T1, 2, (3, 1), (3, 1), 3, 0, 0),
        ),
        CreateTopicResult(Errors.NONE, "", T1, 3, 2),
    )
    cluster.commit(result.records)
    # The next topic balances against the leaders that exist.
    cluster.create_topic("more", T2, 2, 1)
    assert sorted(cluster.image.leader_counts().values()) == [1, 2, 2]


def test_create_topic_uses_the_defaults() -> None:
    cluster = three_brokers(ControllerConfig(num_partitions=4, default_replication_factor=2))
    assert cluster.create_topic("t", T1, -1, -1) == CreateTopicResult(Errors.NONE, "", T1, 4, 2)
    assert [len(s.replicas) for s in cluster.image.partitions_of(T1)] == [2, 2, 2, 2]


def test_create_topic_with_a_fenced_broker() -> None:
    cluster = three_brokers()
    cluster.commit(cluster.heartbeat(3, 100, want_fence=True).records)
    # A fenced broker still takes replicas (Kafka places them, out of the ISR).
    assert cluster.create_topic("t", T1, 4, 3).error is Errors.NONE
    assert len(cluster.image.partitions_of(T1)) == 4
    for state in cluster.image.partitions_of(T1):
        assert state.leader in (1, 2)
        assert state.replicas[0] == state.leader
        assert state.isr == tuple(r for r in state.replicas if r != 3)
    assert cluster.create_topic("u", T2, 4, 2).error is Errors.NONE
    # Followers go to unfenced brokers first.
    assert len(cluster.image.partitions_of(T2)) == 4
    assert all(3 not in s.replicas for s in cluster.image.partitions_of(T2))


@pytest.mark.parametrize(
    ("name", "topic_id", "partitions", "rf", "configs", "error"),
    [
        ("t", T2, 1, 1, {}, Errors.TOPIC_ALREADY_EXISTS),
        ("u", T1, 1, 1, {}, Errors.INVALID_REQUEST),
        ("u", "", 1, 1, {}, Errors.INVALID_REQUEST),
        ("", T2, 1, 1, {}, Errors.INVALID_TOPIC_EXCEPTION),
        ("..", T2, 1, 1, {}, Errors.INVALID_TOPIC_EXCEPTION),
        ("a/b", T2, 1, 1, {}, Errors.INVALID_TOPIC_EXCEPTION),
        ("x" * 250, T2, 1, 1, {}, Errors.INVALID_TOPIC_EXCEPTION),
        # The quorum's own log: the CreateTopics handler refused it, a Metadata request's
        # auto-creation (which comes here directly) created it.
        ("__cluster_metadata", T2, 1, 1, {}, Errors.INVALID_REQUEST),
        ("u", T2, 0, 1, {}, Errors.INVALID_PARTITIONS),
        ("u", T2, 1, 0, {}, Errors.INVALID_REPLICATION_FACTOR),
        ("u", T2, 1, 4, {}, Errors.INVALID_REPLICATION_FACTOR),
        ("u", T2, 1, 1, {"min.insync.replicas": "0"}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"min.insync.replicas": "two"}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"unclean.leader.election.enable": "yes"}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"retention.ms": "soon"}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"retention.mss": "1"}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"retention.ms": None}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"preallocate": "true"}, Errors.INVALID_CONFIG),
        ("u", T2, 1, 1, {"remote.storage.enable": "true"}, Errors.INVALID_CONFIG),
    ],
)
def test_create_topic_refusals(
    *,
    name: str,
    topic_id: str,
    partitions: int,
    rf: int,
    configs: dict[str, str | None],
    error: Errors,
) -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 1)
    result = cluster.decide(
        lambda image: cluster.controller.create_topic(
            image, name, topic_id, num_partitions=partitions, replication_factor=rf, configs=configs
        )
    )
    assert result.records == ()
    assert result.response.error is error
    assert result.response.message


def test_kafka_4_configs_of_features_kcoord_lacks_take_their_defaults() -> None:
    """A tool writing every default explicitly (tiered storage off, the codecs' levels) got
    INVALID_CONFIG "unknown config" for keys Kafka 4.0 has."""
    cluster = three_brokers()
    defaults = {
        "remote.storage.enable": "false",
        "local.retention.ms": "-2",
        "local.retention.bytes": "-2",
        "remote.log.copy.disable": "false",
        "remote.log.delete.on.disable": "false",
        "compression.gzip.level": "-1",
        "compression.lz4.level": "9",
        "compression.zstd.level": "3",
    }
    result = cluster.decide(
        lambda image: cluster.controller.create_topic(image, "u", T2, configs=defaults)
    )
    assert result.response.error is Errors.NONE, result.response.message


def test_a_topic_name_colliding_with_an_existing_one_is_refused() -> None:
    """Topic.hasCollision: '.' and '_' give the same metric names (validateNewTopicNames)."""
    cluster = three_brokers()
    cluster.create_topic("a.b", T1, 1, 1)
    result = cluster.decide(lambda image: cluster.controller.create_topic(image, "a_b", T2))
    assert result.records == ()
    assert result.response.error is Errors.INVALID_TOPIC_EXCEPTION
    assert result.response.message == "Topic 'a_b' collides with existing topic: a.b"
    created = cluster.decide(lambda image: cluster.controller.create_topic(image, "a-b", T2))
    assert created.response.error is Errors.NONE


def test_a_request_places_its_topics_as_one_at_a_time_would_and_reads_the_cluster_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CreateTopics or CreatePartitions of many topics places each against the cluster as
    the earlier ones left it, exactly as requests of one topic each would, and refuses a name
    colliding with one created earlier in it. It reads the cluster's partitions once: read
    again for each topic, one request of 10,000 topics held the node's loop for 11 s (found by
    an audit)."""
    requested = [
        NewTopic(f"t{i}", f"T{i:021d}", num_partitions=i % 5 + 1, replication_factor=i % 3 + 1)
        for i in range(12)
    ] + [
        NewTopic("a.b", "A" * 22, 2, 2),
        NewTopic("manual", "M" * 22, assignments=[(0, (3, 1)), (1, (3, 2))]),
        NewTopic("a_b", "B" * 22, 1, 1),  # collides with a.b, created just before
        NewTopic("t13", "C" * 22, 4, 2),
    ]
    one_by_one = three_brokers()
    one_by_one.create_topic("x", T1, 5, 3)
    together = three_brokers()
    together.create_topic("x", T1, 5, 3)
    expected = []
    for t in requested:
        result = one_by_one.decide(
            functools.partial(
                one_by_one.controller.create_topic,
                name=t.name,
                topic_id=t.topic_id,
                num_partitions=t.num_partitions,
                replication_factor=t.replication_factor,
                assignments=t.assignments,
            )
        )
        one_by_one.commit(result.records)
        expected.append(result)
    reads = 0
    all_partitions = MetadataImage.all_partitions

    def counted(image: MetadataImage) -> Any:
        nonlocal reads
        reads += 1
        return all_partitions(image)

    monkeypatch.setattr(MetadataImage, "all_partitions", counted)
    batch = together.decide(lambda image: together.controller.create_topics(image, requested))
    assert reads == 1
    assert [r.error for r in batch.response] == [r.response.error for r in expected]
    assert batch.response[-2].error is Errors.INVALID_TOPIC_EXCEPTION
    assert batch.records == tuple(r for e in expected for r in e.records)
    together.commit(batch.records)
    grow = [NewPartitions(f"t{i}", 8) for i in range(6)]
    reads = 0
    grown = together.decide(lambda image: together.controller.create_partitions_of(image, grow))
    assert reads == 1
    monkeypatch.setattr(MetadataImage, "all_partitions", all_partitions)
    for g in grow:
        added = one_by_one.decide(
            functools.partial(one_by_one.controller.create_partitions, name=g.name, count=g.count)
        )
        one_by_one.commit(added.records)
        assert added.response.error is Errors.NONE
    together.commit(grown.records)
    assert sorted(
        (p.topic_id, p.partition, p.replicas) for p in together.image.all_partitions()
    ) == sorted((p.topic_id, p.partition, p.replicas) for p in one_by_one.image.all_partitions())


# ------------------------------------------------------------------ configs

TOPIC = ConfigResourceType.TOPIC


def alter(
    cluster: Cluster,
    ops: list[tuple[str, ConfigOp, str | None]],
    *,
    incremental: bool = True,
    name: str = "t",
    resource_type: int = TOPIC,
) -> ControllerResult[AlterConfigsResult]:
    return cluster.decide(
        lambda image: cluster.controller.alter_configs(
            image,
            resource_type,
            name,
            [(k, int(op), v) for k, op, v in ops],
            incremental=incremental,
        )
    )


def alter_cluster_defaults(
    cluster: Cluster, ops: list[tuple[str, ConfigOp, str | None]], *, incremental: bool = True
) -> ControllerResult[AlterConfigsResult]:
    """``alter`` of the cluster-level defaults (the BROKER resource "")."""
    return alter(
        cluster, ops, incremental=incremental, resource_type=ConfigResourceType.BROKER, name=""
    )


def test_incremental_alter_configs_writes_one_record_per_changed_key() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 1, {"retention.ms": "1000", "cleanup.policy": "compact"})
    result = alter(
        cluster,
        [
            ("retention.ms", ConfigOp.DELETE, None),
            ("max.message.bytes", ConfigOp.SET, "2000"),
            ("cleanup.policy", ConfigOp.APPEND, "delete,compact"),
            ("segment.ms", ConfigOp.DELETE, None),  # not set: nothing to write
        ],
    )
    assert result.response == AlterConfigsResult(Errors.NONE)
    assert set(result.records) == {
        Config(TOPIC, "t", "retention.ms", None),
        Config(TOPIC, "t", "max.message.bytes", "2000"),
        Config(TOPIC, "t", "cleanup.policy", "compact,delete"),
    }
    cluster.commit(result.records)
    topic = cluster.image.topic_by_name("t")
    assert topic is not None
    assert dict(topic.configs) == {"max.message.bytes": "2000", "cleanup.policy": "compact,delete"}
    # SUBTRACT from the list; APPEND to an unset LIST key starts from its default ("delete").
    result = alter(cluster, [("cleanup.policy", ConfigOp.SUBTRACT, "delete")])
    assert result.records == (Config(TOPIC, "t", "cleanup.policy", "compact"),)
    cluster.commit(result.records)
    cluster.create_topic("u", T2, 1, 1)
    result = alter(cluster, [("cleanup.policy", ConfigOp.APPEND, "compact")], name="u")
    assert result.records == (Config(TOPIC, "u", "cleanup.policy", "delete,compact"),)
    cluster.commit(result.records)
    # SUBTRACT down to the empty list: a valid policy (ValidList.in), neither delete nor compact.
    result = alter(cluster, [("cleanup.policy", ConfigOp.SUBTRACT, "delete,compact")], name="u")
    assert result.response == AlterConfigsResult(Errors.NONE)
    assert result.records == (Config(TOPIC, "u", "cleanup.policy", ""),)
    # Setting what is already there writes nothing.
    assert alter(cluster, [("max.message.bytes", ConfigOp.SET, "2000")]).records == ()
    # One copy of an item per item named goes (a SET may store a list with duplicates): every
    # copy went, and "delete,delete" less "delete" left no policy at all. APPEND adds an
    # item named twice once.
    cluster.commit(alter(cluster, [("cleanup.policy", ConfigOp.SET, "delete,delete")]).records)
    result = alter(cluster, [("cleanup.policy", ConfigOp.SUBTRACT, "delete")])
    assert result.records == (Config(TOPIC, "t", "cleanup.policy", "delete"),)
    result = alter(cluster, [("cleanup.policy", ConfigOp.APPEND, "compact,compact")])
    assert result.records == (Config(TOPIC, "t", "cleanup.policy", "delete,delete,compact"),)


def test_legacy_alter_configs_replaces_the_whole_set() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 1, {"retention.ms": "1000", "cleanup.policy": "compact"})
    result = alter(cluster, [("retention.ms", ConfigOp.SET, "2000")], incremental=False)
    assert set(result.records) == {
        Config(TOPIC, "t", "retention.ms", "2000"),
        Config(TOPIC, "t", "cleanup.policy", None),
    }


@pytest.mark.parametrize(
    ("ops", "resource", "error", "message"),
    [
        (
            [("retention.ms", ConfigOp.SET, "1"), ("retention.ms", ConfigOp.DELETE, None)],
            (TOPIC, "t"),
            Errors.INVALID_REQUEST,
            "Error due to duplicate config keys",
        ),
        ([("retention.ms", 7, "1")], (TOPIC, "t"), Errors.INVALID_REQUEST, "Unknown operations"),
        (
            [("retention.ms", ConfigOp.SET, "1")],
            (ConfigResourceType.BROKER, "1"),
            Errors.INVALID_REQUEST,
            "not configs of resource type 4 named '1'",
        ),
        (
            [("log.dirs", ConfigOp.SET, "/tmp/x"), ("retention.ms", ConfigOp.SET, "1")],
            (ConfigResourceType.BROKER, ""),
            Errors.INVALID_REQUEST,
            "Cannot update these configs dynamically: log.dirs, retention.ms",
        ),
        (  # a broker config's value: INVALID_REQUEST naming the broker key (KAFKA-13609)
            [("log.retention.ms", ConfigOp.SET, "-2")],
            (ConfigResourceType.BROKER, ""),
            Errors.INVALID_REQUEST,
            "Invalid value -2 for configuration log.retention.ms: Value must be at least -1",
        ),
        (
            [
                ("log.cleaner.min.compaction.lag.ms", ConfigOp.SET, "10"),
                ("log.cleaner.max.compaction.lag.ms", ConfigOp.SET, "5"),
            ],
            (ConfigResourceType.BROKER, ""),
            Errors.INVALID_REQUEST,
            "min.compaction.lag.ms (10) > max.compaction.lag.ms (5)",
        ),
        (
            [("min.insync.replicas", ConfigOp.SET, "0")],
            (ConfigResourceType.BROKER, ""),
            Errors.INVALID_REQUEST,
            "min.insync.replicas",
        ),
        (
            [("log.retention.ms", ConfigOp.APPEND, "1")],
            (ConfigResourceType.BROKER, ""),
            Errors.INVALID_REQUEST,
            "Config value append is not allowed for config key: log.retention.ms",
        ),
        (
            [("retention.ms", ConfigOp.SET, "1")],
            (TOPIC, "nope"),
            Errors.UNKNOWN_TOPIC_OR_PARTITION,
            "The topic 'nope' does not exist.",
        ),
        (  # the values first (ConfigurationControlManager.validateAlterConfig)
            [("retention.ms", ConfigOp.SET, "x")],
            (TOPIC, "nope"),
            Errors.INVALID_CONFIG,
            "Invalid value x for configuration retention.ms",
        ),
        (
            [("retention.ms", ConfigOp.APPEND, "1")],
            (TOPIC, "t"),
            Errors.INVALID_CONFIG,
            "Can't APPEND to key retention.ms because its type is not LIST.",
        ),
        ([("retention.ms", ConfigOp.SET, "x")], (TOPIC, "t"), Errors.INVALID_CONFIG, "LONG"),
        (
            [("retention.ms", ConfigOp.SET, None), ("cleanup.policy", ConfigOp.APPEND, None)],
            (TOPIC, "t"),
            Errors.INVALID_REQUEST,
            "Null value not supported for : retention.ms, cleanup.policy",
        ),
        (
            [("retention.ms", ConfigOp.SET, "1")],
            (TOPIC, ""),
            Errors.INVALID_REQUEST,
            "Default topic resources are not allowed.",
        ),
        (
            [("retention.ms", ConfigOp.SET, "1")],
            (TOPIC, "bad name!"),
            Errors.INVALID_TOPIC_EXCEPTION,
            "illegal",
        ),
        ([("nope", ConfigOp.SET, "1")], (TOPIC, "t"), Errors.INVALID_CONFIG, "Unknown topic"),
    ],
)
def test_alter_configs_refusals_write_nothing(
    ops: list[tuple[str, ConfigOp, str | None]],
    resource: tuple[int, str],
    error: Errors,
    message: str,
) -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 1)
    result = alter(cluster, ops, resource_type=resource[0], name=resource[1])
    assert result.records == ()
    assert result.response.error is error
    assert message in result.response.message


def test_create_topic_when_all_brokers_are_fenced() -> None:
    cluster = Cluster()
    cluster.commit(cluster.register(1).records)
    result = cluster.decide(
        lambda image: cluster.controller.create_topic(image, "t", T1, num_partitions=1)
    )
    assert result == ControllerResult(
        (),
        CreateTopicResult(Errors.INVALID_REPLICATION_FACTOR, "All brokers are currently fenced."),
    )


@pytest.mark.parametrize(("brokers", "rf"), [(1, 1), (2, 2), (3, 3), (5, 3)])
def test_offsets_topic(brokers: int, rf: int) -> None:
    cluster = Cluster()
    cluster.start(*range(1, brokers + 1))
    response = cluster.run(lambda image: cluster.controller.create_offsets_topic(image, OFFSETS_ID))
    assert response == CreateTopicResult(Errors.NONE, "", OFFSETS_ID, 50, rf)
    topic = cluster.image.topic_by_name(OFFSETS_TOPIC_NAME)
    assert topic is not None
    assert topic.configs == {
        "cleanup.policy": "compact",
        "compression.type": "producer",
        "segment.bytes": "104857600",
        "min.insync.replicas": "2" if rf >= 3 else "1",
    }
    states = cluster.image.partitions_of(OFFSETS_ID)
    assert [s.partition for s in states] == list(range(50))
    assert all(len(set(s.replicas)) == rf and s.isr == s.replicas for s in states)
    leaders = Counter(s.leader for s in states)
    assert set(leaders) == set(range(1, brokers + 1))
    assert max(leaders.values()) - min(leaders.values()) <= 1
    # Created once.
    again = cluster.decide(lambda image: cluster.controller.create_offsets_topic(image, T2))
    assert again.response.error is Errors.TOPIC_ALREADY_EXISTS


def test_offsets_topic_segments_below_the_minimum_are_internal_segment_bytes() -> None:
    """offsets.topic.segment.bytes below segment.bytes' 1 MiB (KIP-1030; tests roll small
    segments of __consumer_offsets) is written as internal.segment.bytes, which has no such
    minimum; the topic was refused and never made."""
    cluster = Cluster(ControllerConfig(offsets_topic_segment_bytes=1024))
    cluster.start(1)
    response = cluster.run(lambda image: cluster.controller.create_offsets_topic(image, OFFSETS_ID))
    assert response.error is Errors.NONE, response
    topic = cluster.image.topic_by_name(OFFSETS_TOPIC_NAME)
    assert topic is not None
    assert topic.configs["internal.segment.bytes"] == "1024"
    assert "segment.bytes" not in topic.configs


def test_offsets_topic_needs_a_broker() -> None:
    cluster = Cluster()
    result = cluster.decide(lambda image: cluster.controller.create_offsets_topic(image, T1))
    assert result.records == ()
    assert result.response.error is Errors.INVALID_REPLICATION_FACTOR


def test_delete_topic() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 2, 2)
    assert cluster.decide(lambda image: cluster.controller.delete_topic(image, T1)) == (
        ControllerResult((RemoveTopic(T1),), Errors.NONE)
    )
    assert cluster.decide(lambda image: cluster.controller.delete_topic(image, T2)) == (
        ControllerResult((), Errors.UNKNOWN_TOPIC_ID)
    )
    # Whoever asks (a peer's RPC skips the Kafka handler's check), never the offsets topic.
    cluster.run(lambda image: cluster.controller.create_offsets_topic(image, OFFSETS_ID))
    assert cluster.decide(lambda image: cluster.controller.delete_topic(image, OFFSETS_ID)) == (
        ControllerResult((), Errors.INVALID_REQUEST)
    )


def test_create_partitions_adds_balanced_partitions_with_the_same_replication_factor() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 2, 2)
    result = cluster.decide(lambda image: cluster.controller.create_partitions(image, "t", 5))
    assert result.response == CreatePartitionsResult(Errors.NONE)
    assert [r.partition for r in result.records if isinstance(r, Partition)] == [2, 3, 4]
    cluster.commit(result.records)
    states = cluster.image.partitions_of(T1)
    assert [s.partition for s in states] == [0, 1, 2, 3, 4]
    for state in states:
        assert len(set(state.replicas)) == 2
        assert state.isr == state.replicas and state.leader == state.replicas[0]
        assert (state.leader_epoch, state.partition_epoch) == (0, 0)
    leaders = Counter(s.leader for s in states)
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders


def test_create_partitions_leader_is_the_first_live_replica() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.heartbeat(3, 100, want_fence=True).records)
    cluster.run(lambda image: cluster.controller.create_partitions(image, "t", 4))
    for state in cluster.image.partitions_of(T1)[1:]:
        assert state.leader in (1, 2)
        assert state.isr == tuple(r for r in state.replicas if r != 3)


def test_create_partitions_with_a_manual_assignment() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 2)
    cluster.commit(cluster.heartbeat(1, 100, want_fence=True).records)
    result = cluster.run(
        lambda image: cluster.controller.create_partitions(image, "t", 3, [[1, 3], [2, 1]])
    )
    assert result == CreatePartitionsResult(Errors.NONE)
    assert cluster.state(T1, 1).replicas == (1, 3)
    assert (cluster.state(T1, 1).leader, cluster.state(T1, 1).isr) == (3, (3,))
    assert (cluster.state(T1, 2).leader, cluster.state(T1, 2).isr) == (2, (2,))


@pytest.mark.parametrize(
    ("name", "count", "assignments", "error", "message"),
    [
        ("nope", 3, None, Errors.UNKNOWN_TOPIC_OR_PARTITION, ""),
        ("t", 2, None, Errors.INVALID_PARTITIONS, "Topic already has 2 partition(s)."),
        (
            "t",
            1,
            None,
            Errors.INVALID_PARTITIONS,
            "The topic t currently has 2 partition(s); 1 would not be an increase.",
        ),
        ("t", 20_003, None, Errors.POLICY_VIOLATION, "excessively large batch operation"),
        (
            "t",
            4,
            [[1, 2]],
            Errors.INVALID_REPLICA_ASSIGNMENT,
            "Attempted to add 2 additional partition(s), but only 1 assignment(s) were",
        ),
        ("t", 3, [[]], Errors.INVALID_REPLICA_ASSIGNMENT, "includes an empty replica list"),
        ("t", 3, [[1, 9]], Errors.INVALID_REPLICA_ASSIGNMENT, "includes broker 9, but no such"),
        ("t", 3, [[2, 2]], Errors.INVALID_REPLICA_ASSIGNMENT, "the broker 2 more than once"),
        ("t", 3, [[1, 2, 3]], Errors.INVALID_REPLICA_ASSIGNMENT, "which have 2 replica(s)"),
        (OFFSETS_TOPIC_NAME, 60, None, Errors.INVALID_PARTITIONS, "cannot change"),
    ],
)
def test_create_partitions_refusals(
    *,
    name: str,
    count: int,
    assignments: list[list[int]] | None,
    error: Errors,
    message: str,
) -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 2, 2)
    cluster.run(lambda image: cluster.controller.create_offsets_topic(image, OFFSETS_ID))
    result = cluster.decide(
        lambda image: cluster.controller.create_partitions(image, name, count, assignments)
    )
    assert result.records == ()
    assert result.response.error is error
    assert message in result.response.message
    assert cluster.image.partition(T1, 2) is None


def test_create_partitions_when_the_replication_factor_cannot_be_met() -> None:
    cluster = three_brokers()
    cluster.create_topic("t", T1, 1, 3)
    cluster.commit(cluster.register(3, 10_000, incarnation="other").records)  # 3 is replaced
    cluster.commit(cluster.heartbeat(1, 10_000, want_fence=True).records)
    cluster.commit(cluster.heartbeat(2, 10_000, want_fence=True).records)
    result = cluster.decide(lambda image: cluster.controller.create_partitions(image, "t", 2))
    assert result.records == ()
    assert result.response.error is Errors.INVALID_REPLICATION_FACTOR
    manual = cluster.decide(
        lambda image: cluster.controller.create_partitions(image, "t", 2, [[1, 2, 3]])
    )
    assert manual.response.error is Errors.INVALID_REPLICA_ASSIGNMENT
    assert "are fenced" in manual.response.message


def test_create_topic_with_a_manual_assignment() -> None:
    """ReplicationControlManager.createTopic's manual branch: the replicas as given, the ISR
    their live brokers, the leader the first of those; the partition count and replication
    factor come from the assignment."""
    cluster = three_brokers()
    cluster.commit(cluster.heartbeat(3, 10_000, want_fence=True).records)
    manual = [(1, [3, 1]), (0, [2, 3])]
    result = cluster.run(
        lambda image: cluster.controller.create_topic(image, "t", T1, assignments=manual)
    )
    assert (result.error, result.num_partitions, result.replication_factor) == (Errors.NONE, 2, 2)
    by_partition = {p: cluster.state(T1, p) for p in (0, 1)}
    assert [(s.replicas, s.isr, s.leader) for s in by_partition.values()] == [
        ((2, 3), (2,), 2),
        ((3, 1), (1,), 1),
    ]


@pytest.mark.parametrize(
    ("num_partitions", "replication_factor", "assignments", "error", "message"),
    [
        (-1, 2, [(0, [1, 2])], Errors.INVALID_REQUEST, "replication factor was not set to -1"),
        (1, -1, [(0, [1, 2])], Errors.INVALID_REQUEST, "numPartitions was not set to -1"),
        (-1, -1, [(0, [1]), (0, [2])], Errors.INVALID_REPLICA_ASSIGNMENT, "multiple manual"),
        (-1, -1, [(0, [])], Errors.INVALID_REPLICA_ASSIGNMENT, "an empty replica list"),
        (-1, -1, [(0, [1, 9])], Errors.INVALID_REPLICA_ASSIGNMENT, "broker 9, but no such"),
        (-1, -1, [(0, [1, 2]), (1, [3])], Errors.INVALID_REPLICA_ASSIGNMENT, "have 2 replica"),
        (-1, -1, [(0, [1]), (2, [2])], Errors.INVALID_REPLICA_ASSIGNMENT, "consecutive 0-based"),
        (-1, -1, [(0, [3])], Errors.INVALID_REPLICA_ASSIGNMENT, "partition 0 are fenced"),
    ],
)
def test_create_topic_manual_assignment_refusals(
    *,
    num_partitions: int,
    replication_factor: int,
    assignments: list[tuple[int, list[int]]],
    error: Errors,
    message: str,
) -> None:
    cluster = three_brokers()
    cluster.commit(cluster.heartbeat(3, 10_000, want_fence=True).records)
    result = cluster.decide(
        lambda image: cluster.controller.create_topic(
            image,
            "t",
            T1,
            num_partitions=num_partitions,
            replication_factor=replication_factor,
            assignments=assignments,
        )
    )
    assert result.records == ()
    assert (result.response.error, message in result.response.message) == (error, True)
    # The name and existence are checked first: an existing topic is TOPIC_ALREADY_EXISTS.
    cluster.create_topic("u", T2, 1, 1)
    again = cluster.decide(
        lambda image: cluster.controller.create_topic(image, "u", T1, assignments=assignments)
    )
    assert again.response.error is Errors.TOPIC_ALREADY_EXISTS


# ------------------------------------------------------------------ placement properties


def test_place_replicas_refusals() -> None:
    live = [UsableBroker(1, False), UsableBroker(2, False)]
    with pytest.raises(PlacementError, match="only 2 broker") as info:
        place_replicas(live, 1, 3)
    assert info.value.error is Errors.INVALID_REPLICATION_FACTOR
    with pytest.raises(PlacementError, match="must be positive"):
        place_replicas(live, 1, -1)
    with pytest.raises(PlacementError, match="number of partitions") as info:
        place_replicas(live, 0, 1)
    assert info.value.error is Errors.INVALID_PARTITIONS
    with pytest.raises(PlacementError, match="All brokers are currently fenced"):
        place_replicas([UsableBroker(1, True)], 1, 1)


def test_placement_uses_fenced_brokers_only_as_followers_and_last() -> None:
    brokers = [UsableBroker(1, False), UsableBroker(2, True), UsableBroker(3, False)]
    placements = place_replicas(brokers, 4, 3)
    assert all(p[0] in (1, 3) and p[2] == 2 for p in placements)
    assert place_replicas(brokers, 4, 2) == [(1, 3), (3, 1), (1, 3), (3, 1)]


@settings(max_examples=60, deadline=None)
@given(
    broker_count=st.integers(1, 7),
    topics=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 7)), min_size=1, max_size=5),
    fenced=st.sets(st.integers(1, 7), max_size=3),
)
def test_leaders_per_broker_differ_by_at_most_one(
    broker_count: int, topics: list[tuple[int, int]], fenced: set[int]
) -> None:
    cluster = Cluster()
    cluster.start(*range(1, broker_count + 1))
    fenced = {b for b in fenced if b <= broker_count}
    if len(fenced) == broker_count:
        fenced.discard(1)
    for b in sorted(fenced):
        cluster.commit(cluster.heartbeat(b, 0, want_fence=True).records)
    live = [b for b in range(1, broker_count + 1) if b not in fenced]
    for index, (partitions, wanted_rf) in enumerate(topics):
        rf = min(wanted_rf, broker_count)
        result = cluster.create_topic(f"topic-{index}", f"id-{index}", partitions, rf)
        assert result.error is Errors.NONE
        states = cluster.image.partitions_of(f"id-{index}")
        assert len(states) == partitions
        for s in states:
            assert len(s.replicas) == len(set(s.replicas)) == rf
            assert s.leader == s.replicas[0] and s.leader in live
            assert s.isr == tuple(r for r in s.replicas if r in live)
        # Across all the cluster's partitions, not just this topic's.
        counts = cluster.image.leader_counts()
        per_broker = [counts.get(b, 0) for b in live]
        assert max(per_broker) - min(per_broker) <= 1, per_broker
        assert set(counts) <= set(live)


@settings(max_examples=80, deadline=None)
@given(
    broker_count=st.integers(2, 7),
    partitions=st.integers(1, 60),
    rf=st.integers(2, 7),
    data=st.data(),
)
def test_after_one_broker_fails_leaders_still_differ_by_at_most_one(
    broker_count: int, partitions: int, rf: int, data: st.DataObject
) -> None:
    rf = min(rf, broker_count)
    placements = place_replicas(
        [UsableBroker(b, False) for b in range(broker_count)], partitions, rf
    )
    dead = data.draw(st.integers(0, broker_count - 1))
    # The second replica is the first live ISR member once the leader is gone.
    leaders = Counter(p[1] if p[0] == dead else p[0] for p in placements)
    per_survivor = [leaders.get(b, 0) for b in range(broker_count) if b != dead]
    assert max(per_survivor) - min(per_survivor) <= 1, leaders


def test_placement_is_deterministic() -> None:
    brokers = [UsableBroker(b, False) for b in (5, 3, 9, 1)]
    assert place_replicas(brokers, 20, 3) == place_replicas(list(reversed(brokers)), 20, 3)


# ------------------------------------------------------------------ PartitionChangeBuilder


def test_build_partition_change_returns_none_when_nothing_changes() -> None:
    state = PartitionState(T1, 0, (1, 2, 3), (1, 2, 3), 1, 4, 7)
    assert (
        build_partition_change(
            state, is_acceptable_leader=lambda b: True, min_isr=2, elr_enabled=True
        )
        is None
    )


def test_build_partition_change_preferred_election() -> None:
    state = PartitionState(T1, 0, (1, 2, 3), (2, 3, 1), 2, 4, 7)
    alive: Callable[[int], bool] = lambda b: True  # noqa: E731
    change = build_partition_change(
        state, is_acceptable_leader=alive, min_isr=1, elr_enabled=True, election=Election.PREFERRED
    )
    assert change == PartitionChange(T1, 0, 7, leader=1)
    # The preferred replica is dead: keep the current leader.
    change = build_partition_change(
        state,
        is_acceptable_leader=lambda b: b != 1,
        min_isr=1,
        elr_enabled=True,
        election=Election.PREFERRED,
    )
    assert change is None


def test_a_replica_that_lost_its_log_is_never_the_last_known_leader() -> None:
    """Kafka elects the last known leader only where its ``LeaderAcceptor`` finds the log
    online. A leader removed for a lost or offline log was remembered anyway, and kept when
    it came back wiped: an unclean election then chose its empty log over a replica holding
    data, and the one with data truncated to nothing (found by a review)."""
    leading = PartitionState(T1, 0, (2, 1), (1,), 1, 1, 1)
    removed = build_partition_change(
        leading,
        is_acceptable_leader=lambda b: b != 1,
        min_isr=2,
        elr_enabled=True,
        target_isr=(),
        unclean_shutdown_replicas=(1,),
        lost_log_replicas=(1,),
    )
    assert removed == PartitionChange(T1, 0, 1, leader=NO_LEADER, isr=())
    remembered = PartitionState(T1, 0, (2, 1), (), NO_LEADER, 2, 2, (), (1,))
    forgotten = build_partition_change(
        remembered,
        is_acceptable_leader=lambda b: b != 1,
        min_isr=2,
        elr_enabled=True,
        unclean_shutdown_replicas=(1,),
        lost_log_replicas=(1,),
    )
    assert forgotten == PartitionChange(T1, 0, 2, last_known_elr=())
    after = remembered.merge(forgotten)
    unclean = build_partition_change(
        after,
        is_acceptable_leader=lambda b: True,
        min_isr=2,
        elr_enabled=True,
        election=Election.UNCLEAN,
    )
    assert unclean is not None and unclean.leader == 2
    # An unclean shutdown alone (its log kept; unclean_shutdown_detection_enabled) leaves
    # the ELR, not being the last known leader, as in Kafka: forgetting it made an unclean
    # election take the first live replica, maybe the least up to date (found by a review).
    kept = build_partition_change(
        leading,
        is_acceptable_leader=lambda b: b != 1,
        min_isr=2,
        elr_enabled=True,
        target_isr=(),
        unclean_shutdown_replicas=(1,),
    )
    assert kept == PartitionChange(T1, 0, 1, leader=NO_LEADER, isr=(), last_known_elr=(1,))
    assert (
        build_partition_change(
            remembered,
            is_acceptable_leader=lambda b: b != 1,
            min_isr=2,
            elr_enabled=True,
            unclean_shutdown_replicas=(1,),
        )
        is None
    )


def test_a_last_known_leader_back_on_an_empty_disk_is_forgotten_though_in_no_isr_or_elr() -> None:
    """After an unclean shutdown (detection on) a replica leaves the ELR but stays the last
    known leader. Back later on an empty disk, its registration only looked at the
    partitions whose ISR or ELR had it, and it stayed the last known leader: an unclean
    election chose its empty log (found by a review)."""
    config = ControllerConfig(unclean_shutdown_detection_enabled=True, min_insync_replicas=2)
    cluster = three_brokers(config)
    cluster.create_topic("t", T1, 1, 2)
    first, second = cluster.state(T1, 0).replicas
    for b in (second, first):
        cluster.commit(cluster.heartbeat(b, 100, want_fence=True).records)
    assert cluster.state(T1, 0).last_known_elr == (first,)
    cluster.commit(cluster.register(first, SESSION_MS + 200, "inc-b").records)  # unclean
    state = cluster.state(T1, 0)
    assert first not in state.elr and state.last_known_elr == (first,)
    cluster.commit(cluster.register(first, 3 * SESSION_MS, "inc-c", storage_lost=True).records)
    assert cluster.state(T1, 0).last_known_elr == ()


def test_build_partition_change_unclean_prefers_the_last_known_leader() -> None:
    state = PartitionState(T1, 0, (1, 2, 3), (), NO_LEADER, 4, 7, (), (3,))
    change = build_partition_change(
        state,
        is_acceptable_leader=lambda b: True,
        min_isr=2,
        elr_enabled=True,
        election=Election.UNCLEAN,
    )
    assert change == PartitionChange(T1, 0, 7, leader=3, isr=(3,), last_known_elr=())
    # Without unclean election nobody is elected.
    assert (
        build_partition_change(
            state, is_acceptable_leader=lambda b: True, min_isr=2, elr_enabled=True
        )
        is None
    )
