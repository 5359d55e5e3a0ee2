"""MetadataImage replay, deltas, refusals, snapshots and role changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcoord.raft.image import (
    BecomeFollower,
    BecomeLeader,
    BrokerRegistration,
    Change,
    ConfigResource,
    MetadataApplyError,
    MetadataImage,
    PartitionState,
    StopReplica,
    TopicIdPartition,
    TopicImage,
    diff,
    role_changes,
)
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

T1 = "T1-aaaaaaaaaaaaaaaaaaa"
T2 = "T2-bbbbbbbbbbbbbbbbbbb"
TP0 = TopicIdPartition(T1, 0)
TP1 = TopicIdPartition(T1, 1)


def register(broker_id: int, epoch: int = 10, *, fenced: bool = False) -> RegisterBroker:
    return RegisterBroker(
        broker_id=broker_id,
        incarnation_id=f"inc-{broker_id}-{epoch}",
        broker_epoch=epoch,
        endpoints={"kafka": f"127.0.0.{broker_id}:9092", "rpc": f"127.0.0.{broker_id}:9093"},
        fenced=fenced,
    )


def base_records() -> list[MetadataRecord]:
    """Cluster c1, unfenced brokers 1-3, topic "orders" (T1) with two partitions of RF 3."""
    return [
        ClusterId("c1"),
        register(1),
        register(2),
        register(3),
        Topic("orders", T1, {"min.insync.replicas": "2"}),
        Partition(T1, 0, (1, 2, 3), (1, 2, 3), 1, 0, 0),
        Partition(T1, 1, (2, 3, 1), (2, 3, 1), 2, 0, 0),
    ]


def base_image() -> MetadataImage:
    image = MetadataImage()
    for offset, record in enumerate(base_records()):
        image.apply(offset, record)
    return image


def state(image: MetadataImage, tp: TopicIdPartition) -> PartitionState:
    result = image.partition(tp.topic_id, tp.partition)
    assert result is not None
    return result


# ------------------------------------------------------------------ replay


def test_empty_image() -> None:
    image = MetadataImage()
    assert image.cluster_id is None
    assert image.last_offset == -1
    assert not image.brokers
    assert not image.topics
    assert image.partition_count() == 0
    assert image.to_records() == []


def test_replay_builds_the_image() -> None:
    image = base_image()
    assert image.cluster_id == "c1"
    assert image.last_offset == 6
    assert image.broker(2) == BrokerRegistration(
        broker_id=2,
        incarnation_id="inc-2-10",
        broker_epoch=10,
        endpoints={"kafka": "127.0.0.2:9092", "rpc": "127.0.0.2:9093"},
        rack=None,
        fenced=False,
    )
    assert image.topic(T1) == TopicImage(T1, "orders", {"min.insync.replicas": "2"})
    assert image.topic_by_name("orders") == image.topic(T1)
    assert image.topic_by_name("nope") is None
    assert image.partitions_of(T1) == [
        PartitionState(T1, 0, (1, 2, 3), (1, 2, 3), 1, 0, 0),
        PartitionState(T1, 1, (2, 3, 1), (2, 3, 1), 2, 0, 0),
    ]
    assert image.partitions_of(T2) == []
    assert [s.partition for s in image.partitions_led_by(1)] == [0]
    assert [s.partition for s in image.partitions_led_by(2)] == [1]
    assert image.partitions_led_by(3) == []
    assert image.leader_counts() == {1: 1, 2: 1}
    assert [s.partition for s in image.partitions_with_isr_member(3)] == [0, 1]
    assert image.unfenced_broker_ids() == [1, 2, 3]
    assert not image.is_fenced(1)
    assert image.is_fenced(99)


def test_register_broker_delta_and_fencing() -> None:
    image = base_image()
    delta = image.apply(7, FenceBroker(2, 10))
    before = image.broker(2)
    assert before is not None and before.fenced
    assert delta.prev_offset == 6 and delta.offset == 7
    assert list(delta.brokers) == [2]
    assert delta.brokers[2].before is not None and not delta.brokers[2].before.fenced
    assert delta.brokers[2].after == before
    assert image.is_fenced(2)
    assert image.unfenced_broker_ids() == [1, 3]
    # Fencing a fenced broker is a no-op, as in ClusterControlManager.
    assert image.apply(8, FenceBroker(2, 10)).is_empty()
    image.apply(9, UnfenceBroker(2, 10))
    assert not image.is_fenced(2)


def test_reregistration_needs_a_higher_epoch() -> None:
    image = base_image()
    delta = image.apply(7, register(2, epoch=11, fenced=True))
    assert delta.brokers[2] == Change(
        BrokerRegistration(2, "inc-2-10", 10, register(2).endpoints, None, False),
        BrokerRegistration(2, "inc-2-11", 11, register(2).endpoints, None, True),
    )
    assert image.broker(2) == delta.brokers[2].after
    for stale_epoch in (11, 10):
        copy = image.copy()
        with pytest.raises(MetadataApplyError, match="a registration must bring a higher epoch"):
            image.apply(8, register(2, epoch=stale_epoch))
        assert image == copy


def test_partition_change_bumps_epochs_like_kafka() -> None:
    image = base_image()
    # ISR only: partition epoch +1, leader epoch unchanged.
    image.apply(7, PartitionChange(T1, 0, 0, isr=(1, 2)))
    assert state(image, TP0) == PartitionState(T1, 0, (1, 2, 3), (1, 2), 1, 0, 1)
    # New leader: both epochs +1.
    image.apply(8, PartitionChange(T1, 0, 1, leader=2, isr=(2,)))
    assert state(image, TP0) == PartitionState(T1, 0, (1, 2, 3), (2,), 2, 1, 2)
    # Same leader written again: still a new leader epoch (Kafka forces bumps that way).
    image.apply(9, PartitionChange(T1, 0, 2, leader=2))
    assert state(image, TP0) == PartitionState(T1, 0, (1, 2, 3), (2,), 2, 2, 3)
    # No leader.
    image.apply(
        10, PartitionChange(T1, 0, 3, leader=NO_LEADER, isr=(), elr=(2,), last_known_elr=(2,))
    )
    assert state(image, TP0) == PartitionState(T1, 0, (1, 2, 3), (), NO_LEADER, 3, 4, (2,), (2,))
    assert image.leaderless() == {TP0}
    assert [s.partition for s in image.partitions_with_elr_member(2)] == [0]
    assert image.partitions_with_isr_member(2) == [state(image, TP1)]


def test_config_records() -> None:
    image = base_image()
    delta = image.apply(7, Config(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000"))
    topic = image.topic(T1)
    assert topic is not None
    assert topic.configs == {"min.insync.replicas": "2", "retention.ms": "1000"}
    assert delta.topics[T1] == Change(TopicImage(T1, "orders", {"min.insync.replicas": "2"}), topic)
    image.apply(8, Config(ConfigResourceType.TOPIC, "orders", "min.insync.replicas", None))
    assert image.topic(T1) == TopicImage(T1, "orders", {"retention.ms": "1000"})

    cluster = ConfigResource(ConfigResourceType.BROKER, "")
    delta = image.apply(9, Config(ConfigResourceType.BROKER, "", "min.insync.replicas", "2"))
    assert image.resource_configs(cluster) == {"min.insync.replicas": "2"}
    assert delta.configs[cluster] == Change(None, {"min.insync.replicas": "2"})
    image.apply(10, Config(ConfigResourceType.BROKER, "3", "x", "y"))
    image.apply(11, Config(ConfigResourceType.GROUP, "g1", "consumer.session.timeout.ms", "45000"))
    delta = image.apply(12, Config(ConfigResourceType.BROKER, "", "min.insync.replicas", None))
    assert image.resource_configs(cluster) == {}
    assert delta.configs[cluster] == Change({"min.insync.replicas": "2"}, None)


def test_remove_topic_removes_its_partitions() -> None:
    image = base_image()
    delta = image.apply(7, RemoveTopic(T1))
    assert image.topic(T1) is None
    assert image.topic_by_name("orders") is None
    assert image.partition_count() == 0
    assert image.partitions_led_by(1) == []
    assert image.partitions_with_isr_member(3) == []
    assert set(delta.partitions) == {TP0, TP1}
    assert all(c.after is None for c in delta.partitions.values())
    assert delta.topic_names == {T1: "orders"}
    # The name is free again.
    image.apply(8, Topic("orders", T2))
    assert image.topic_by_name("orders") == TopicImage(T2, "orders", {})


def test_noop_and_cluster_id() -> None:
    image = base_image()
    delta = image.apply(7, NoOp())
    assert delta.is_empty()
    assert image.last_offset == 7
    assert image.apply(8, ClusterId("c1")).is_empty()
    copy = image.copy()
    with pytest.raises(MetadataApplyError, match="the cluster id is already 'c1'"):
        image.apply(9, ClusterId("c2"))
    assert image == copy


def test_records_of_one_batch_share_an_offset() -> None:
    image = base_image()
    image.apply(7, NoOp())
    image.apply(7, FenceBroker(1, 10))
    assert image.last_offset == 7
    with pytest.raises(MetadataApplyError, match="offsets must not go back"):
        image.apply(6, NoOp())


# ------------------------------------------------------------------ out-of-contract records


OUT_OF_CONTRACT: list[tuple[MetadataRecord, str]] = [
    (Partition(T2, 0, (1,), (1,), 1, 0, 0), "unknown topic id"),
    (Partition(T1, 0, (1,), (1,), 1, 0, 0), "partition already exists"),
    (Partition(T1, 2, (1, 2), (1, 3), 1, 0, 0), r"ISR \[1, 3\] is not a subset of replicas"),
    (Partition(T1, 2, (1, 1), (1,), 1, 0, 0), "are not distinct broker ids"),
    (Partition(T1, 2, (), (), -1, 0, 0), "no replicas"),
    (Partition(T1, 2, (1, 2), (1,), 2, 0, 0), r"leader 2 is not in ISR \[1\]"),
    (Partition(T1, 2, (1, 2), (1,), 1, 0, 0, elr=(1,)), "overlap"),
    (Partition(T1, 2, (1, 2), (1,), 1, -1, 0), "negative epoch"),
    (Partition(T1, -1, (1,), (1,), 1, 0, 0), "negative partition id"),
    (PartitionChange(T1, 0, 5, isr=(1,)), "stale change, the partition epoch is 0, not 5"),
    (PartitionChange(T1, 9, 0, isr=(1,)), "unknown partition"),
    (PartitionChange(T2, 0, 0, isr=(1,)), "unknown topic id"),
    (PartitionChange(T1, 0, 0, isr=(1, 4)), "is not a subset of replicas"),
    (PartitionChange(T1, 0, 0, isr=(2, 3)), r"leader 1 is not in ISR \[2, 3\]"),
    (PartitionChange(T1, 0, 0, leader=4), "leader 4 is not in ISR"),
    (PartitionChange(T1, 0, 0, leader=-3), "invalid leader -3"),
    (PartitionChange(T1, 0, 0, elr=(1,)), "overlap"),
    (PartitionChange(T1, 0, 0, isr=(1, 1)), "has duplicates"),
    (Topic("orders", T2), "topic name already exists"),
    (Topic("other", T1), "topic id already exists"),
    (Topic("", T2), "empty topic name or id"),
    (RemoveTopic(T2), "unknown topic id"),
    (FenceBroker(4, 10), "broker 4 not registered"),
    (FenceBroker(1, 9), "registered with epoch 10, not 9"),
    (UnfenceBroker(1, 11), "registered with epoch 10, not 11"),
    (register(1, epoch=10), "must bring a higher epoch"),
    (RegisterBroker(-1, "i", 1, {}), "broker id and epoch must be >= 0"),
    (RegisterBroker(5, "", 1, {}), "incarnation id non-empty"),
    (Config(ConfigResourceType.TOPIC, "nope", "k", "v"), "unknown topic"),
    (Config(ConfigResourceType.BROKER, "b1", "k", "v"), "is '' or a broker id"),
    (Config(ConfigResourceType.GROUP, "", "k", "v"), "empty group id"),
    (Config(8, "x", "k", "v"), "unsupported config resource type 8"),
    (Config(ConfigResourceType.BROKER, "", "", "v"), "empty config key"),
    (ClusterId(""), "empty cluster id"),
]


@pytest.mark.parametrize(("record", "reason"), OUT_OF_CONTRACT, ids=lambda v: str(v)[:40])
def test_out_of_contract_record_is_refused_and_changes_nothing(
    record: MetadataRecord, reason: str
) -> None:
    image = base_image()
    copy = image.copy()
    with pytest.raises(MetadataApplyError, match=reason):
        image.apply(7, record)
    assert image == copy
    assert image.last_offset == 6
    # The indexes were not touched either.
    assert [s.partition for s in image.partitions_led_by(1)] == [0]
    assert [s.partition for s in image.partitions_with_isr_member(3)] == [0, 1]


def test_batch_is_all_or_nothing() -> None:
    image = base_image()
    copy = image.copy()
    batch: list[MetadataRecord] = [
        PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)),
        FenceBroker(1, 10),
        Config(ConfigResourceType.TOPIC, "orders", "x", "y"),
        Topic("payments", T2),
        Partition(T2, 0, (3,), (3,), 3, 0, 0),
        Config(ConfigResourceType.BROKER, "", "k", "v"),
        PartitionChange(T1, 0, 0, isr=(2,)),  # stale: computed before the first change
    ]
    with pytest.raises(MetadataApplyError, match="stale change"):
        image.apply_batch(7, batch)
    assert image == copy
    assert image.topic_by_name("payments") is None
    assert [s.partition for s in image.partitions_led_by(1)] == [0]
    assert image.partitions_led_by(3) == []
    assert image.leader_counts() == {1: 1, 2: 1}
    # The same batch without the stale record applies.
    delta = image.apply_batch(7, batch[:-1])
    assert state(image, TP0).leader == 2
    assert image.is_fenced(1)
    assert set(delta.partitions) == {TP0, TopicIdPartition(T2, 0)}


def test_batch_revert_restores_a_removed_topic_whose_name_was_reused() -> None:
    image = base_image()
    copy = image.copy()
    batch: list[MetadataRecord] = [
        RemoveTopic(T1),
        Topic("orders", T2),
        Partition(T2, 0, (1,), (1,), 1, 0, 0),
        NoOp(),
        ClusterId("other"),  # refused
    ]
    with pytest.raises(MetadataApplyError):
        image.apply_batch(7, batch)
    assert image == copy
    assert image.topic_by_name("orders") == copy.topic(T1)
    assert [s.partition for s in image.partitions_led_by(2)] == [1]


def test_batch_revert_restores_names_when_a_removed_id_took_another_removed_name() -> None:
    """A refused batch removing topics a (id 2) and b (id 1), then giving id 2 the name b:
    undone newest first, id 1 got b back, then restoring id 2 deleted the name entry of its
    current name, b, by then id 1's. ``topic_by_name("b")`` missed, a second b was accepted
    and a snapshot, which walks the names, dropped id 1 (found by two reviews)."""
    image = MetadataImage()
    image.apply_batch(
        1,
        [
            ClusterId("c"),
            Topic("a", T2),
            Partition(T2, 0, (1,), (1,), 1, 0, 0),
            Topic("b", T1),
            Partition(T1, 0, (1,), (1,), 1, 0, 0),
        ],
    )
    copy = image.copy()
    refused: list[MetadataRecord] = [
        PartitionChange(T2, 0, 0, leader=NO_LEADER, isr=()),
        RemoveTopic(T2),
        RemoveTopic(T1),
        Topic("b", T2),
        ClusterId("other"),  # refused
    ]
    with pytest.raises(MetadataApplyError):
        image.apply_batch(2, refused)
    assert image == copy
    b = image.topic_by_name("b")
    assert b is not None and b.topic_id == T1
    snapshot = MetadataImage.from_records(image.last_offset, image.to_records())
    assert snapshot == image


def test_a_snapshot_of_an_image_without_records_reloads_at_its_offset() -> None:
    """An image of NoOps alone (before the cluster id committed) has no records: replayed
    from its snapshot, it stood at -1, a step behind (found by a review)."""
    image = MetadataImage()
    image.apply_batch(3, [NoOp()])
    assert image.to_records() == [] and image.last_offset == 3
    assert MetadataImage.from_records(image.last_offset, image.to_records()) == image


def test_batch_delta_keeps_first_before_and_last_after() -> None:
    image = base_image()
    delta = image.apply_batch(
        7,
        [
            PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)),
            PartitionChange(T1, 0, 1, leader=3, isr=(3,)),
            FenceBroker(1, 10),
            UnfenceBroker(1, 10),
        ],
    )
    assert delta.partitions[TP0] == Change(
        PartitionState(T1, 0, (1, 2, 3), (1, 2, 3), 1, 0, 0),
        PartitionState(T1, 0, (1, 2, 3), (3,), 3, 2, 2),
    )
    assert delta.brokers[1].before == delta.brokers[1].after


# ------------------------------------------------------------------ snapshots


def test_snapshot_round_trip() -> None:
    image = base_image()
    image.apply_batch(
        7,
        [
            FenceBroker(3, 10),
            PartitionChange(T1, 1, 0, isr=(2, 1)),
            Config(ConfigResourceType.BROKER, "", "unclean.leader.election.enable", "false"),
            Config(ConfigResourceType.GROUP, "g", "k", "v"),
            Topic("payments", T2, {"cleanup.policy": "compact"}),
            Partition(T2, 0, (3, 1), (1,), NO_LEADER, 4, 9, (), (3,)),
        ],
    )
    records = image.to_records()
    rebuilt = MetadataImage.from_records(image.last_offset, records)
    assert rebuilt == image
    assert rebuilt.to_records() == records
    assert rebuilt.leaderless() == image.leaderless() == {TopicIdPartition(T2, 0)}
    assert rebuilt.is_fenced(3)
    assert MetadataImage.from_records(image.last_offset + 1, records) != image


def test_load_snapshot_replaces_contents_and_returns_the_difference() -> None:
    old = base_image()
    newer = base_image()
    newer.apply_batch(
        7,
        [
            PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)),
            Topic("payments", T2),
            Partition(T2, 0, (3,), (3,), 3, 0, 0),
        ],
    )
    delta = old.load_snapshot(newer.last_offset, newer.to_records())
    assert old == newer
    assert delta.prev_offset == 6 and delta.offset == 7
    assert set(delta.partitions) == {TP0, TopicIdPartition(T2, 0)}
    assert set(delta.topics) == {T2}
    assert role_changes(delta, 2) == [
        BecomeLeader(TP0, "orders", leader_epoch=1, partition_epoch=1),
    ]
    assert diff(old, newer).is_empty()


def test_load_snapshot_that_does_not_replay_keeps_the_image() -> None:
    image = base_image()
    copy = image.copy()
    with pytest.raises(MetadataApplyError):
        image.load_snapshot(20, [Partition(T2, 0, (1,), (1,), 1, 0, 0)])
    assert image == copy


@st.composite
def images(draw: st.DrawFn) -> MetadataImage:
    """A random, consistent image built by replaying records."""
    image = MetadataImage()
    offset = 0
    broker_ids = draw(st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True))
    records: list[MetadataRecord] = [ClusterId("c")] if draw(st.booleans()) else []
    for b in broker_ids:
        records.append(register(b, epoch=draw(st.integers(0, 100)), fenced=draw(st.booleans())))
    for t in range(draw(st.integers(0, 3))):
        topic_id = f"topic-id-{t}"
        configs = draw(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.text(max_size=3)))
        records.append(Topic(f"topic-{t}", topic_id, configs))
        for p in range(draw(st.integers(0, 4))):
            replicas = tuple(draw(st.permutations(broker_ids)))[
                : draw(st.integers(1, len(broker_ids)))
            ]
            isr = tuple(r for r in replicas if draw(st.booleans()))
            rest = [r for r in replicas if r not in isr]
            elr = tuple(r for r in rest if draw(st.booleans()))
            has_leader = draw(st.booleans())
            leader = draw(st.sampled_from(isr)) if isr and has_leader else NO_LEADER
            last_known = tuple(r for r in replicas if draw(st.booleans()))
            epochs = draw(st.tuples(st.integers(0, 50), st.integers(0, 50)))
            records.append(Partition(topic_id, p, replicas, isr, leader, *epochs, elr, last_known))
    for key in draw(st.lists(st.sampled_from(["x", "y"]), max_size=2)):
        records.append(Config(ConfigResourceType.BROKER, "", key, "1"))
    for record in records:
        offset += draw(st.integers(0, 2))
        image.apply(offset, record)
    return image


@given(images())
def test_snapshot_rebuilds_an_equal_image(image: MetadataImage) -> None:
    rebuilt = MetadataImage.from_records(max(image.last_offset, 0), image.to_records())
    if image.last_offset >= 0:
        assert rebuilt == image
    # Index-backed helpers agree with a brute-force scan.
    for b in range(-1, 10):
        assert rebuilt.partitions_led_by(b) == sorted(
            (s for s in image.all_partitions() if s.leader == b), key=lambda s: s.tp
        )
        assert rebuilt.partitions_with_isr_member(b) == sorted(
            (s for s in image.all_partitions() if b in s.isr), key=lambda s: s.tp
        )
        assert rebuilt.partitions_with_elr_member(b) == sorted(
            (s for s in image.all_partitions() if b in s.elr), key=lambda s: s.tp
        )


@given(images())
def test_copy_is_independent(image: MetadataImage) -> None:
    copy = image.copy()
    assert copy == image
    copy.apply(max(image.last_offset, 0) + 1, ClusterId("c") if image.cluster_id else NoOp())
    if image.brokers:
        broker = min(image.brokers.values(), key=lambda b: b.broker_id)
        copy.apply(copy.last_offset, register(broker.broker_id, epoch=broker.broker_epoch + 1))
        assert copy.broker(broker.broker_id) != image.broker(broker.broker_id)
    assert copy.last_offset != image.last_offset


# ------------------------------------------------------------------ role changes


def test_new_partitions_make_leaders_and_followers() -> None:
    image = base_image()
    delta = image.apply_batch(7, [Topic("payments", T2), Partition(T2, 0, (3, 1), (3, 1), 3, 0, 0)])
    tp = TopicIdPartition(T2, 0)
    assert role_changes(delta, 3) == [BecomeLeader(tp, "payments", 0, 0)]
    assert role_changes(delta, 1) == [BecomeFollower(tp, "payments", 3, 0, 0)]
    assert role_changes(delta, 2) == []


def test_leader_change_is_reported_once_per_leader_epoch() -> None:
    image = base_image()
    # Broker 1 loses leadership of partition 0 to broker 2.
    delta = image.apply(7, PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)))
    assert role_changes(delta, 2) == [BecomeLeader(TP0, "orders", 1, 1)]
    assert role_changes(delta, 1) == [BecomeFollower(TP0, "orders", 2, 1, 1)]
    assert role_changes(delta, 3) == [BecomeFollower(TP0, "orders", 2, 1, 1)]
    # An ISR change without a new leader epoch is no role change for anyone.
    delta = image.apply(8, PartitionChange(T1, 0, 1, isr=(2, 3, 1)))
    assert [role_changes(delta, b) for b in (1, 2, 3)] == [[], [], []]
    # The same leader with a bumped leader epoch is reported again.
    delta = image.apply(9, PartitionChange(T1, 0, 2, leader=2))
    assert role_changes(delta, 2) == [BecomeLeader(TP0, "orders", 2, 3)]
    assert role_changes(delta, 1) == [BecomeFollower(TP0, "orders", 2, 2, 3)]


def test_losing_the_leader_tells_everyone_there_is_none() -> None:
    image = base_image()
    delta = image.apply(7, PartitionChange(T1, 0, 0, leader=NO_LEADER, isr=(1,)))
    for b in (1, 2, 3):
        assert role_changes(delta, b) == [BecomeFollower(TP0, "orders", NO_LEADER, 1, 1)]


def test_a_batch_reports_only_the_final_leader_epoch() -> None:
    image = base_image()
    delta = image.apply_batch(
        7,
        [
            PartitionChange(T1, 0, 0, leader=2, isr=(2, 3)),
            PartitionChange(T1, 0, 1, leader=3, isr=(3,)),
        ],
    )
    assert role_changes(delta, 3) == [BecomeLeader(TP0, "orders", 2, 2)]
    assert role_changes(delta, 2) == [BecomeFollower(TP0, "orders", 3, 2, 2)]


def test_stop_replica_on_topic_removal_and_replica_removal() -> None:
    image = base_image()
    delta = image.apply(7, PartitionChange(T1, 1, 0, replicas=(2, 3), isr=(2, 3)))
    assert role_changes(delta, 1) == [StopReplica(TP1, "orders")]
    assert role_changes(delta, 2) == []
    delta = image.apply(8, RemoveTopic(T1))
    assert role_changes(delta, 1) == [StopReplica(TP0, "orders")]
    assert role_changes(delta, 2) == [StopReplica(TP0, "orders"), StopReplica(TP1, "orders")]
    assert role_changes(delta, 9) == []


def test_role_change_order_is_stops_then_leaders_then_followers() -> None:
    image = base_image()
    delta = image.apply_batch(
        7,
        [
            PartitionChange(T1, 0, 0, leader=3, isr=(3,)),  # 2 now follows 3
            PartitionChange(T1, 1, 0, replicas=(3, 1), isr=(3, 1), leader=3),  # 2 removed
            Topic("payments", T2),
            Partition(T2, 0, (2,), (2,), 2, 0, 0),  # 2 leads
        ],
    )
    assert role_changes(delta, 2) == [
        StopReplica(TP1, "orders"),
        BecomeLeader(TopicIdPartition(T2, 0), "payments", 0, 0),
        BecomeFollower(TP0, "orders", 3, 1, 1),
    ]


@given(st.lists(st.sampled_from([1, 2, 3, NO_LEADER]), max_size=12), st.sampled_from([1, 2, 3]))
def test_each_leader_epoch_is_reported_at_most_once(
    leaders: list[int], local_broker_id: int
) -> None:
    image = base_image()
    seen: list[tuple[TopicIdPartition, int]] = []
    offset = 7
    for leader in leaders:
        current = state(image, TP0)
        isr = (1, 2, 3) if leader == NO_LEADER else (leader,)
        delta = image.apply(offset, PartitionChange(T1, 0, current.partition_epoch, leader, isr))
        offset += 1
        for change in role_changes(delta, local_broker_id):
            assert isinstance(change, BecomeLeader | BecomeFollower)
            seen.append((change.tp, change.leader_epoch))
            if isinstance(change, BecomeLeader):
                assert leader == local_broker_id
            else:
                assert change.leader == leader
    assert len(seen) == len(set(seen)) == len(leaders)
