"""The ``__consumer_offsets`` record codec: golden bytes, round trips, errors, dump-log output.

Golden vectors are written out by hand from Kafka's JSON schemas (see the codec's docstring), so
a byte-order, field-order or length-prefix mistake fails here rather than in a Kafka tool. Two
of them are checked against real ``kafka-dump-log.sh --offsets-decoder`` output (record sizes
and the printed line).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.cluster.coordinator.records import (
    ClassicMemberMetadata,
    ClassicProtocol,
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    CoordinatorKey,
    CoordinatorRecord,
    CoordinatorRecordError,
    CoordinatorValue,
    CorruptCoordinatorRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    PartitionMetadata,
    RecordDecoder,
    TopicMetadata,
    TopicPartitions,
    UnknownRecordTypeError,
    decode_key,
    decode_record,
    encode_key,
    encode_record,
    encode_value,
    format_offsets_record,
    uuid_str,
    value_version_written,
)


def h(text: str) -> bytes:
    """Hex with spaces and ``|`` separators allowed, for readable golden vectors."""
    return bytes.fromhex(text.replace("|", " "))


def s16(text: str) -> str:
    """A classic string: int16 length, then UTF-8, as hex."""
    raw = text.encode()
    return f"{len(raw):04x} {raw.hex()}"


def c16(text: str) -> str:
    """A compact string (short ones only): one varint byte, length + 1, then UTF-8, as hex."""
    raw = text.encode()
    assert len(raw) < 127
    return f"{len(raw) + 1:02x} {raw.hex()}"


TOPIC_ID = bytes(range(1, 17))
TOPIC_ID_HEX = TOPIC_ID.hex()

# --------------------------------------------------------------------------------------------
# Golden vectors


def test_offset_commit_key_v1_golden() -> None:
    key = OffsetCommitKey(group_id="my-group", topic="my-topic", partition=0x01020304)
    expected = h(f"0001 | {s16('my-group')} | {s16('my-topic')} | 01020304")
    assert encode_key(key) == expected
    assert decode_key(expected) == key


def test_offset_commit_key_size_matches_a_real_kafka_dump() -> None:
    # kafka-dump-log.sh printed "keySize: 26" for group my-group, topic my-topic (Strimzi docs).
    key = OffsetCommitKey(group_id="my-group", topic="my-topic", partition=0)
    assert len(encode_key(key)) == 26


def test_legacy_offset_commit_key_type_0_reads_as_offset_commit_key() -> None:
    legacy = h(f"0000 | {s16('g')} | {s16('t')} | 00000007")
    key = decode_key(legacy)
    assert key == OffsetCommitKey(group_id="g", topic="t", partition=7)
    # Kafka never writes type 0 again; neither do we.
    assert encode_key(key)[:2] == h("0001")


def test_offset_commit_value_v3_golden() -> None:
    value = OffsetCommitValue(
        offset=0x0102030405060708,
        leader_epoch=5,
        metadata="md",
        commit_timestamp_ms=0x11223344556677,
    )
    expected = h(f"0003 | 0102030405060708 | 00000005 | {s16('md')} | 0011223344556677")
    assert encode_value(value) == expected  # Kafka writes v3 when there is no expiry
    assert decode_record(encode_key(_OC_KEY), expected).value == value


def test_offset_commit_value_v3_size_matches_a_real_kafka_dump() -> None:
    # "valueSize: 24" for offset 1, leaderEpoch 0, metadata "" in the same dump.
    value = OffsetCommitValue(offset=1, leader_epoch=0, metadata="", commit_timestamp_ms=1)
    assert len(encode_value(value)) == 24


def test_offset_commit_value_v1_golden_carries_the_expiry() -> None:
    value = OffsetCommitValue(
        offset=7, leader_epoch=9, metadata="", commit_timestamp_ms=100, expire_timestamp_ms=200
    )
    # v1 has no leader epoch: Kafka drops it (ignorable field) and so do we.
    expected = h("0001 | 0000000000000007 | 0000 | 0000000000000064 | 00000000000000c8")
    assert encode_value(value) == expected
    decoded = decode_record(encode_key(_OC_KEY), expected).value
    assert decoded == dataclasses.replace(value, leader_epoch=-1)


def test_offset_commit_value_v4_flexible_golden() -> None:
    value = OffsetCommitValue(offset=1, leader_epoch=-1, metadata="", commit_timestamp_ms=2)
    # compact string "" is varint 1; the record ends with an empty tagged-field section (00).
    expected = h("0004 | 0000000000000001 | ffffffff | 01 | 0000000000000002 | 00")
    assert encode_value(value, version=4) == expected
    assert decode_record(encode_key(_OC_KEY), expected).value == value


def test_offset_commit_value_v4_skips_unknown_tagged_fields() -> None:
    # Newer Kafka adds tagged fields (e.g. a topic id) to v4; an older reader skips them.
    with_tag = h(
        f"0004 | 0000000000000001 | ffffffff | 01 | 0000000000000002 | 01 00 10 {TOPIC_ID_HEX}"
    )
    value = decode_record(encode_key(_OC_KEY), with_tag).value
    assert value == OffsetCommitValue(offset=1, metadata="", commit_timestamp_ms=2)


def test_group_metadata_key_v2_golden() -> None:
    key = GroupMetadataKey(group_id="g1")
    expected = h("0002 | 0002 6731")
    assert encode_key(key) == expected
    assert decode_key(expected) == key


_ONE_MEMBER_GROUP = GroupMetadataValue(
    protocol_type="consumer",
    generation=1,
    protocol="range",
    leader="m-1",
    current_state_timestamp_ms=0x0A0B0C0D0E,
    members=(
        MemberMetadata(
            member_id="m-1",
            group_instance_id=None,
            client_id="c",
            client_host="/h",
            rebalance_timeout_ms=300_000,
            session_timeout_ms=45_000,
            subscription=b"\x00\x01",
            assignment=b"",
        ),
    ),
)


def test_group_metadata_value_v3_golden_one_member() -> None:
    expected = h(
        "0003"  # version
        f"| {s16('consumer')} | 00000001 | {s16('range')} | {s16('m-1')}"
        "| 000000 0a0b0c0d0e"  # currentStateTimestamp
        "| 00000001"  # one member
        f"| {s16('m-1')} | ffff | {s16('c')} | {s16('/h')}"  # id, null instance id, client
        "| 000493e0 | 0000afc8"  # rebalance 300000, session 45000
        "| 00000002 0001 | 00000000"  # subscription, assignment
    )
    assert encode_value(_ONE_MEMBER_GROUP) == expected
    assert decode_record(encode_key(GroupMetadataKey(group_id="g")), expected).value == (
        _ONE_MEMBER_GROUP
    )


def test_group_metadata_value_v4_flexible_golden() -> None:
    value = GroupMetadataValue(
        protocol_type="",
        generation=0,
        protocol=None,
        leader=None,
        current_state_timestamp_ms=-1,
        members=(
            MemberMetadata(
                member_id="m",
                group_instance_id="i",
                client_id="",
                client_host="",
                rebalance_timeout_ms=1,
                session_timeout_ms=2,
                subscription=b"\xaa",
                assignment=b"",
            ),
        ),
    )
    expected = h(
        "0004 | 01 | 00000000 | 00 | 00 | ffffffffffffffff"  # "", gen 0, null, null, -1
        "| 02"  # one member (count + 1)
        "| 02 6d | 02 69 | 01 | 01 | 00000001 | 00000002 | 02 aa | 01 | 00"  # member + its tags
        "| 00"  # top-level tags
    )
    assert encode_value(value, version=4) == expected
    assert decode_record(encode_key(GroupMetadataKey(group_id="g")), expected).value == value


def test_consumer_group_metadata_value_golden_with_and_without_metadata_hash() -> None:
    key = encode_key(ConsumerGroupMetadataKey(group_id="g"))
    assert key == h(f"0003 | {s16('g')}")
    plain = ConsumerGroupMetadataValue(epoch=5)
    assert encode_value(plain) == h("0000 | 00000005 | 00")
    hashed = ConsumerGroupMetadataValue(epoch=5, metadata_hash=1)
    hashed_bytes = h("0000 | 00000005 | 01 00 08 0000000000000001")  # 1 tag: tag 0, 8 bytes
    assert encode_value(hashed) == hashed_bytes
    assert decode_record(key, hashed_bytes).value == hashed
    # An unknown tag (KIP-1282's CreationTimeMs is tag 1) is skipped.
    with_creation_time = h("0000 | 00000005 | 02 00 08 0000000000000001 01 08 00000000000003e8")
    assert decode_record(key, with_creation_time).value == hashed


def test_consumer_group_member_metadata_value_golden_with_classic_member_metadata() -> None:
    value = ConsumerGroupMemberMetadataValue(
        instance_id=None,
        rack_id=None,
        client_id="c",
        client_host="h",
        subscribed_topic_names=("t",),
        subscribed_topic_regex=None,
        rebalance_timeout_ms=-1,
        server_assignor="uniform",
        classic_member_metadata=ClassicMemberMetadata(
            session_timeout_ms=45_000,
            supported_protocols=(ClassicProtocol(name="range", metadata=b"\x01"),),
        ),
    )
    expected = h(
        f"0000 | 00 | 00 | {c16('c')} | {c16('h')} | 02 {c16('t')} | 00 | ffffffff"
        f"| {c16('uniform')}"
        "| 01 00 10"  # one tagged field: tag 0, 16 bytes
        f"| 01 | 0000afc8 | 02 {c16('range')} 02 01 00 | 00"  # marker 1 (present), the struct
    )
    assert encode_value(value) == expected
    key = encode_key(ConsumerGroupMemberMetadataKey(group_id="g", member_id="m"))
    assert key == h(f"0005 | {s16('g')} | {s16('m')}")
    assert decode_record(key, expected).value == value
    # A tag whose marker says null reads as null.
    null_tag = expected[: -len(h("01 00 10")) - 16] + h("01 00 01 00")
    assert decode_record(key, null_tag).value == dataclasses.replace(
        value, classic_member_metadata=None
    )


def test_consumer_group_current_member_assignment_value_golden() -> None:
    value = ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=3,
        previous_member_epoch=2,
        state=0,
        assigned_partitions=(TopicPartitions(topic_id=TOPIC_ID, partitions=(0, 1)),),
        partitions_pending_revocation=(),
    )
    expected = h(
        f"0000 | 00000003 | 00000002 | 00 | 02 {TOPIC_ID_HEX} 03 00000000 00000001 00 | 01 | 00"
    )
    assert encode_value(value) == expected
    key = encode_key(ConsumerGroupCurrentMemberAssignmentKey(group_id="g", member_id="m"))
    assert key[:2] == h("0008")
    assert decode_record(key, expected).value == value


def test_current_member_assignment_epochs_are_the_topics_tagged_field_0() -> None:
    """KIP-1251 (Kafka 4.3): ``AssignmentEpochs``, a nullable int32 array aligned with the
    topic's partitions, is tagged field 0 of each TopicPartitions struct; a record without it
    (an older writer's) reads as None. Epochs not aligned with the partitions are refused
    by the writer."""
    with_epochs = TopicPartitions(topic_id=TOPIC_ID, partitions=(0, 1), assignment_epochs=(2, 3))
    value = ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=3,
        previous_member_epoch=2,
        state=0,
        assigned_partitions=(with_epochs,),
        partitions_pending_revocation=(),
    )
    topic = f"{TOPIC_ID_HEX} 03 00000000 00000001"
    expected = h(
        f"0000 | 00000003 | 00000002 | 00 | 02 {topic}"
        "| 01 00 09 03 00000002 00000003"  # one tag: 0, 9 bytes: a compact array of 2
        "| 01 | 00"
    )
    assert encode_value(value) == expected
    key = encode_key(ConsumerGroupCurrentMemberAssignmentKey(group_id="g", member_id="m"))
    assert decode_record(key, expected).value == value
    legacy = h(f"0000 | 00000003 | 00000002 | 00 | 02 {topic} 00 | 01 | 00")
    got = decode_record(key, legacy).value
    assert isinstance(got, ConsumerGroupCurrentMemberAssignmentValue)
    assert got.assigned_partitions[0].assignment_epochs is None
    null_tag = h(f"0000 | 00000003 | 00000002 | 00 | 02 {topic} 01 00 01 00 | 01 | 00")
    assert decode_record(key, null_tag).value == got
    # Not one per partition: read as written (the replay falls back to the record's epoch,
    # as Kafka's Utils.assignmentFromTopicPartitions does), never written.
    short = h(f"0000 | 00000003 | 00000002 | 00 | 02 {topic} 01 00 05 02 00000002 | 01 | 00")
    got = decode_record(key, short).value
    assert isinstance(got, ConsumerGroupCurrentMemberAssignmentValue)
    assert got.assigned_partitions[0].assignment_epochs == (2,)
    with pytest.raises(ValueError, match="1 epochs for 2 partitions"):
        encode_value(
            dataclasses.replace(
                value,
                assigned_partitions=(dataclasses.replace(with_epochs, assignment_epochs=(2,)),),
            )
        )
    assert format_offsets_record(key, expected).endswith(
        '"assignedPartitions":[{"topicId":"'
        + uuid_str(TOPIC_ID)
        + '","partitions":[0,1],"assignmentEpochs":[2,3]}],"partitionsPendingRevocation":[]}}'
    )


def test_kip_848_keys_use_their_record_types() -> None:
    keys: list[tuple[CoordinatorKey, int]] = [
        (ConsumerGroupMetadataKey(group_id="g"), 3),
        (ConsumerGroupPartitionMetadataKey(group_id="g"), 4),
        (ConsumerGroupMemberMetadataKey(group_id="g", member_id="m"), 5),
        (ConsumerGroupTargetAssignmentMetadataKey(group_id="g"), 6),
        (ConsumerGroupTargetAssignmentMemberKey(group_id="g", member_id="m"), 7),
        (ConsumerGroupCurrentMemberAssignmentKey(group_id="g", member_id="m"), 8),
    ]
    for key, record_type in keys:
        assert encode_key(key)[:2] == record_type.to_bytes(2, "big")


# --------------------------------------------------------------------------------------------
# Versions written


def test_value_versions_written_are_kafkas() -> None:
    no_expiry = OffsetCommitValue(offset=1, commit_timestamp_ms=1)
    with_expiry = dataclasses.replace(no_expiry, expire_timestamp_ms=5)
    assert value_version_written(no_expiry) == 3
    assert value_version_written(with_expiry) == 1
    assert value_version_written(_ONE_MEMBER_GROUP) == 3
    assert value_version_written(ConsumerGroupMetadataValue(epoch=1)) == 0
    for value in (no_expiry, with_expiry, _ONE_MEMBER_GROUP):
        assert encode_value(value)[:2] == value_version_written(value).to_bytes(2, "big")


# --------------------------------------------------------------------------------------------
# Round trips (hypothesis)

i8 = st.integers(-(2**7), 2**7 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=12)
blobs = st.binary(max_size=12)
topic_ids = st.binary(min_size=16, max_size=16)


def tuples(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(strategy, max_size=3).map(tuple)


topic_partitions = st.builds(TopicPartitions, topic_id=topic_ids, partitions=tuples(i32))
# A current assignment's: with the assignment epochs of its partitions (KIP-1251) or without.
owned_partitions = st.builds(
    lambda topic_id, pairs, written: TopicPartitions(
        topic_id=topic_id,
        partitions=tuple(p for p, _ in pairs),
        assignment_epochs=tuple(e for _, e in pairs) if written else None,
    ),
    topic_ids,
    tuples(st.tuples(i32, i32)),
    st.booleans(),
)

KEYS: st.SearchStrategy[CoordinatorKey] = st.one_of(
    st.builds(OffsetCommitKey, group_id=text, topic=text, partition=i32),
    st.builds(GroupMetadataKey, group_id=text),
    st.builds(ConsumerGroupMetadataKey, group_id=text),
    st.builds(ConsumerGroupPartitionMetadataKey, group_id=text),
    st.builds(ConsumerGroupMemberMetadataKey, group_id=text, member_id=text),
    st.builds(ConsumerGroupTargetAssignmentMetadataKey, group_id=text),
    st.builds(ConsumerGroupTargetAssignmentMemberKey, group_id=text, member_id=text),
    st.builds(ConsumerGroupCurrentMemberAssignmentKey, group_id=text, member_id=text),
)

OFFSET_COMMIT_VALUES = st.builds(
    OffsetCommitValue,
    offset=i64,
    leader_epoch=i32,
    metadata=text,
    commit_timestamp_ms=i64,
    # -1 is "no expiry" on the wire, so it cannot round-trip as a number.
    expire_timestamp_ms=st.none() | i64.filter(lambda n: n != -1),
)
GROUP_METADATA_VALUES = st.builds(
    GroupMetadataValue,
    protocol_type=text,
    generation=i32,
    protocol=st.none() | text,
    leader=st.none() | text,
    current_state_timestamp_ms=i64,
    members=tuples(
        st.builds(
            MemberMetadata,
            member_id=text,
            group_instance_id=st.none() | text,
            client_id=text,
            client_host=text,
            rebalance_timeout_ms=i32,
            session_timeout_ms=i32,
            subscription=blobs,
            assignment=blobs,
        )
    ),
)
KIP_848_VALUES: st.SearchStrategy[CoordinatorValue] = st.one_of(
    st.builds(ConsumerGroupMetadataValue, epoch=i32, metadata_hash=i64),
    st.builds(
        ConsumerGroupPartitionMetadataValue,
        topics=tuples(
            st.builds(
                TopicMetadata,
                topic_id=topic_ids,
                topic_name=text,
                num_partitions=i32,
                partition_metadata=tuples(
                    st.builds(PartitionMetadata, partition=i32, racks=tuples(text))
                ),
            )
        ),
    ),
    st.builds(
        ConsumerGroupMemberMetadataValue,
        instance_id=st.none() | text,
        rack_id=st.none() | text,
        client_id=text,
        client_host=text,
        subscribed_topic_names=tuples(text),
        subscribed_topic_regex=st.none() | text,
        rebalance_timeout_ms=i32,
        server_assignor=st.none() | text,
        classic_member_metadata=st.none()
        | st.builds(
            ClassicMemberMetadata,
            session_timeout_ms=i32,
            supported_protocols=tuples(st.builds(ClassicProtocol, name=text, metadata=blobs)),
        ),
    ),
    st.builds(ConsumerGroupTargetAssignmentMetadataValue, assignment_epoch=i32),
    st.builds(ConsumerGroupTargetAssignmentMemberValue, topic_partitions=tuples(topic_partitions)),
    st.builds(
        ConsumerGroupCurrentMemberAssignmentValue,
        member_epoch=i32,
        previous_member_epoch=i32,
        state=i8,
        assigned_partitions=tuples(owned_partitions),
        partitions_pending_revocation=tuples(owned_partitions),
    ),
)

_OC_KEY = OffsetCommitKey(group_id="g", topic="t", partition=0)
_KEY_FOR_VALUE: dict[type[Any], CoordinatorKey] = {
    OffsetCommitValue: _OC_KEY,
    GroupMetadataValue: GroupMetadataKey(group_id="g"),
    ConsumerGroupMetadataValue: ConsumerGroupMetadataKey(group_id="g"),
    ConsumerGroupPartitionMetadataValue: ConsumerGroupPartitionMetadataKey(group_id="g"),
    ConsumerGroupMemberMetadataValue: ConsumerGroupMemberMetadataKey(group_id="g", member_id="m"),
    ConsumerGroupTargetAssignmentMetadataValue: ConsumerGroupTargetAssignmentMetadataKey(
        group_id="g"
    ),
    ConsumerGroupTargetAssignmentMemberValue: ConsumerGroupTargetAssignmentMemberKey(
        group_id="g", member_id="m"
    ),
    ConsumerGroupCurrentMemberAssignmentValue: ConsumerGroupCurrentMemberAssignmentKey(
        group_id="g", member_id="m"
    ),
}


def projected(value: CoordinatorValue, version: int) -> CoordinatorValue:
    """What survives writing ``value`` at ``version``: fields the version lacks read as defaults."""
    if isinstance(value, OffsetCommitValue):
        return dataclasses.replace(
            value,
            leader_epoch=value.leader_epoch if version >= 3 else -1,
            expire_timestamp_ms=value.expire_timestamp_ms if version == 1 else None,
        )
    if isinstance(value, GroupMetadataValue):
        return dataclasses.replace(
            value,
            current_state_timestamp_ms=value.current_state_timestamp_ms if version >= 2 else -1,
            members=tuple(
                dataclasses.replace(
                    m,
                    group_instance_id=m.group_instance_id if version >= 3 else None,
                    rebalance_timeout_ms=m.rebalance_timeout_ms if version >= 1 else -1,
                )
                for m in value.members
            ),
        )
    return value


def round_trip(value: CoordinatorValue, version: int | None) -> CoordinatorValue | None:
    key = _KEY_FOR_VALUE[type(value)]
    return decode_record(encode_key(key), encode_value(value, version=version)).value


@given(KEYS)
def test_every_key_round_trips(key: CoordinatorKey) -> None:
    assert decode_key(encode_key(key)) == key
    assert decode_record(encode_key(key), None) == CoordinatorRecord(key, None)


@given(OFFSET_COMMIT_VALUES, st.sampled_from([None, 0, 1, 2, 3, 4]))
def test_offset_commit_value_round_trips_at_every_version(
    value: OffsetCommitValue, version: int | None
) -> None:
    written = value_version_written(value) if version is None else version
    assert round_trip(value, version) == projected(value, written)


@given(GROUP_METADATA_VALUES, st.sampled_from([None, 0, 1, 2, 3, 4]))
def test_group_metadata_value_round_trips_at_every_version(
    value: GroupMetadataValue, version: int | None
) -> None:
    written = value_version_written(value) if version is None else version
    assert round_trip(value, version) == projected(value, written)


@given(KIP_848_VALUES)
def test_kip_848_values_round_trip(value: CoordinatorValue) -> None:
    assert round_trip(value, None) == value


@given(st.one_of(OFFSET_COMMIT_VALUES, GROUP_METADATA_VALUES, KIP_848_VALUES))
def test_encode_record_matches_encode_key_and_value(value: CoordinatorValue) -> None:
    key = _KEY_FOR_VALUE[type(value)]
    assert encode_record(CoordinatorRecord(key, value)) == (encode_key(key), encode_value(value))
    assert encode_record(CoordinatorRecord(key, None)) == (encode_key(key), None)


@given(st.one_of(OFFSET_COMMIT_VALUES, GROUP_METADATA_VALUES, KIP_848_VALUES), st.booleans())
def test_the_replay_decoder_agrees_with_decode_record(value: CoordinatorValue, tomb: bool) -> None:
    decoder = RecordDecoder()
    key, data = encode_record(CoordinatorRecord(_KEY_FOR_VALUE[type(value)], value))
    data = None if tomb else data
    for _ in range(2):  # the second time from the key cache
        assert decoder.decode(key, data) == decode_record(key, data)


@given(KEYS)
def test_the_replay_decoders_keys_agree_with_decode_key(key: CoordinatorKey) -> None:
    decoder = RecordDecoder()
    for _ in range(2):  # the second time from the key cache
        assert decoder.decode(encode_key(key), None).key == key


@given(
    st.builds(OffsetCommitKey, group_id=st.text(), topic=st.text(), partition=st.integers(0, 9)),
    OFFSET_COMMIT_VALUES,
)
def test_the_replay_decoders_offset_commit_fields_agree_with_decode(
    key: OffsetCommitKey, value: OffsetCommitValue
) -> None:
    decoder = RecordDecoder()
    key_bytes, data = encode_key(key), encode_value(value)
    fields = decoder.offset_commit(key_bytes, data)
    if value_version_written(value) != 3:
        assert fields is None  # what Kafka writes is version 3; the rest goes through decode
        return
    assert fields is not None
    decoded = decode_record(key_bytes, data)
    assert (
        OffsetCommitKey(group_id=fields.group_id, topic=fields.topic, partition=fields.partition)
        == decoded.key
    )
    assert decoded.value == OffsetCommitValue(
        offset=fields.offset,
        leader_epoch=fields.leader_epoch,
        metadata=fields.metadata,
        commit_timestamp_ms=fields.commit_timestamp_ms,
    )
    assert decoder.offset_commit(key_bytes, None) is None  # a tombstone has no fields
    other = encode_key(GroupMetadataKey(group_id=key.group_id))
    assert decoder.offset_commit(other, data) is None  # not an OffsetCommit key


def test_the_replay_decoders_key_fast_path_refuses_what_the_schema_refuses() -> None:
    key = encode_key(OffsetCommitKey(group_id="g", topic="t", partition=0))
    assert key[:2] == b"\x00\x01"
    bad_keys = (
        key[:-1],  # truncated partition
        key + b"\x00",  # trailing byte
        key[:2] + b"\xff\xff" + key[4:],  # a null group id
        key[:4] + b"\xff" + key[5:],  # a group id that is not UTF-8
        key[:2] + b"\x00\x40" + key[4:],  # a group id longer than the key
    )
    value = encode_value(OffsetCommitValue(offset=5, commit_timestamp_ms=1))
    for bad in bad_keys:
        with pytest.raises(CorruptCoordinatorRecordError):
            RecordDecoder().decode(bad, None)
        with pytest.raises(CorruptCoordinatorRecordError):
            RecordDecoder().offset_commit(bad, value)


def test_the_replay_decoders_fast_path_refuses_what_the_schema_refuses() -> None:
    decoder = RecordDecoder()
    key, data = encode_record(
        CoordinatorRecord(
            OffsetCommitKey(group_id="g", topic="t", partition=0),
            OffsetCommitValue(offset=5, metadata="m", commit_timestamp_ms=1),
        )
    )
    assert data is not None and data[:2] == b"\x00\x03"
    for bad in (data[:-1], data + b"\x00", data[:16] + b"\xff" + data[17:]):
        with pytest.raises(CorruptCoordinatorRecordError):
            decoder.decode(key, bad)


# --------------------------------------------------------------------------------------------
# Malformed bytes


@settings(max_examples=50)
@given(
    st.one_of(OFFSET_COMMIT_VALUES, GROUP_METADATA_VALUES, KIP_848_VALUES),
    st.sampled_from([None, 0, 4]),
)
def test_every_truncation_and_any_trailing_byte_is_corrupt(
    value: CoordinatorValue, version: int | None
) -> None:
    if not isinstance(value, OffsetCommitValue | GroupMetadataValue):
        version = None
    key = encode_key(_KEY_FOR_VALUE[type(value)])
    data = encode_value(value, version=version)
    for cut in range(len(data)):
        with pytest.raises(CorruptCoordinatorRecordError):
            decode_record(key, data[:cut])
    with pytest.raises(CorruptCoordinatorRecordError, match="trailing"):
        decode_record(key, data + b"\x00")
    for cut in range(len(key)):
        with pytest.raises(CorruptCoordinatorRecordError):
            decode_record(key[:cut], data)


@given(st.binary(max_size=40), st.none() | st.binary(max_size=60))
def test_garbage_raises_only_coordinator_record_errors(key: bytes, value: bytes | None) -> None:
    with contextlib.suppress(CoordinatorRecordError):
        decode_record(key, value)
    format_offsets_record(key, value)  # never raises


@given(
    st.one_of(OFFSET_COMMIT_VALUES, GROUP_METADATA_VALUES, KIP_848_VALUES),
    st.sampled_from([None, 4]),
    st.data(),
)
def test_a_flipped_byte_decodes_or_raises_only_coordinator_record_errors(
    value: CoordinatorValue, version: int | None, data: st.DataObject
) -> None:
    if not isinstance(value, OffsetCommitValue | GroupMetadataValue):
        version = None
    key = encode_key(_KEY_FOR_VALUE[type(value)])
    encoded = bytearray(encode_value(value, version=version))
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CoordinatorRecordError):
        decode_record(key, bytes(encoded))
    format_offsets_record(key, bytes(encoded))


def test_truncated_value_names_the_schema_and_the_problem() -> None:
    data = encode_value(OffsetCommitValue(offset=1, commit_timestamp_ms=2))
    with pytest.raises(CorruptCoordinatorRecordError, match=r"OffsetCommitValue version 3.*trunc"):
        decode_record(encode_key(_OC_KEY), data[:-1])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (h("00"), "could not read OffsetCommitValue version"),
        (h("0005 0000000000000001"), r"unsupported OffsetCommitValue version 5 \(readable: 0-4\)"),
        (h("ffff"), "unsupported OffsetCommitValue version -1"),
        # metadata length -1: a null in a non-nullable string
        (h("0003 0000000000000001 00000000 ffff 0000000000000000"), "metadata.*null"),
        # metadata length 0x8000
        (h("0003 0000000000000001 00000000 8000"), "metadata.*invalid string length"),
        # metadata is not UTF-8
        (h("0003 0000000000000001 00000000 0001 ff 0000000000000000"), "metadata.*UTF-8"),
    ],
)
def test_malformed_offset_commit_values(value: bytes, message: str) -> None:
    with pytest.raises(CorruptCoordinatorRecordError, match=message):
        decode_record(encode_key(_OC_KEY), value)


def test_huge_array_count_is_refused_before_allocating() -> None:
    value = h(f"0003 | {s16('')} | 00000000 | ffff | ffff | 0000000000000000 | 7fffffff")
    with pytest.raises(CorruptCoordinatorRecordError, match="members: array of 2147483647"):
        decode_record(encode_key(GroupMetadataKey(group_id="g")), value)


def test_out_of_order_tags_are_corrupt() -> None:
    value = h("0000 | 00000005 | 02 01 00 00 00")
    with pytest.raises(CorruptCoordinatorRecordError, match="tag 0 after tag 1"):
        decode_record(encode_key(ConsumerGroupMetadataKey(group_id="g")), value)


def test_overlong_varint_is_corrupt() -> None:
    value = h("0000 | 00000005 | ffffffffff01")
    with pytest.raises(CorruptCoordinatorRecordError, match="longer than 32 bits"):
        decode_record(encode_key(ConsumerGroupMetadataKey(group_id="g")), value)


@pytest.mark.parametrize("record_type", [9, 15, 16, 100, -1])
def test_unknown_record_type_is_its_own_error(record_type: int) -> None:
    key = record_type.to_bytes(2, "big", signed=True) + h(s16("g"))
    for value in (None, h("0000 00000001 00")):
        with pytest.raises(UnknownRecordTypeError) as info:
            decode_record(key, value)
        assert info.value.record_type == record_type
        assert not isinstance(info.value, CorruptCoordinatorRecordError)


@pytest.mark.parametrize("key", [b"", b"\x00"])
def test_key_too_short_for_a_record_type_is_corrupt(key: bytes) -> None:
    with pytest.raises(CorruptCoordinatorRecordError, match="record type"):
        decode_record(key, None)


# --------------------------------------------------------------------------------------------
# Encoding errors and record invariants


def test_tombstone() -> None:
    record = decode_record(encode_key(_OC_KEY), None)
    assert record == CoordinatorRecord(_OC_KEY, None)
    assert record.is_tombstone


def test_a_record_pairs_each_key_with_its_own_value_type() -> None:
    with pytest.raises(TypeError, match="OffsetCommitKey takes a OffsetCommitValue"):
        CoordinatorRecord(_OC_KEY, ConsumerGroupMetadataValue(epoch=1))


@pytest.mark.parametrize(
    ("value", "version", "message"),
    [
        (OffsetCommitValue(offset=1, commit_timestamp_ms=1), 5, "no version 5"),
        (ConsumerGroupMetadataValue(epoch=1), 1, "no version 1"),
        (OffsetCommitValue(offset=2**63, commit_timestamp_ms=1), None, "offset.*int64"),
        (OffsetCommitValue(offset=1, metadata="x" * 32768, commit_timestamp_ms=1), None, "long"),
        (OffsetCommitValue(offset=1, metadata="\ud800", commit_timestamp_ms=1), None, "UTF-8"),
        (
            ConsumerGroupTargetAssignmentMemberValue(
                topic_partitions=(TopicPartitions(topic_id=b"short"),)
            ),
            None,
            "uuid is 16 bytes",
        ),
        (
            ConsumerGroupCurrentMemberAssignmentValue(
                member_epoch=1, previous_member_epoch=0, state=128
            ),
            None,
            "State.*int8",
        ),
    ],
)
def test_unencodable_values_raise_value_error(
    value: CoordinatorValue, version: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        encode_value(value, version=version)


def test_longest_string_kafka_allows_still_encodes() -> None:
    value = OffsetCommitValue(offset=1, metadata="x" * 32767, commit_timestamp_ms=1)
    assert round_trip(value, None) == value


# --------------------------------------------------------------------------------------------
# kafka-dump-log.sh --offsets-decoder


def test_format_offset_commit_like_kafka_dump_log() -> None:
    # Verbatim from a Kafka 3.8 `kafka-dump-log.sh --offsets-decoder` run (Strimzi docs).
    key = encode_key(OffsetCommitKey(group_id="my-group", topic="my-topic", partition=0))
    value = encode_value(
        OffsetCommitValue(offset=1, leader_epoch=0, metadata="", commit_timestamp_ms=1725536760740)
    )
    assert format_offsets_record(key, value) == (
        'key: {"type":"1","data":{"group":"my-group","topic":"my-topic","partition":0}} '
        'payload: {"version":"3","data":{"offset":1,"leaderEpoch":0,"metadata":"",'
        '"commitTimestamp":1725536760740}}'
    )


def _consumer_subscription_v3(topics: list[str]) -> bytes:
    # ConsumerProtocolSubscription v3: topics, userData null, ownedPartitions [],
    # generationId -1, rackId null.
    out = "0003" + f"{len(topics):08x}" + "".join(s16(t) for t in topics)
    return h(out + "ffffffff | 00000000 | ffffffff | ffff")


def _consumer_assignment_v3(topic: str, partitions: list[int]) -> bytes:
    out = "0003 00000001" + s16(topic) + f"{len(partitions):08x}"
    return h(out + "".join(f"{p:08x}" for p in partitions) + "ffffffff")


def test_format_group_metadata_like_kafka_dump_log() -> None:
    # The group of a console consumer, as a real `kafka-dump-log.sh --offsets-decoder` printed it
    # ("keySize: 11 valueSize: 247").
    member_id = "console-consumer-e33d37af-ded5-41c1-aeb3-05d12b5df4bf"
    group = GroupMetadataValue(
        protocol_type="consumer",
        generation=1,
        protocol="range",
        leader=member_id,
        current_state_timestamp_ms=1785773250437,
        members=(
            MemberMetadata(
                member_id=member_id,
                group_instance_id=None,
                client_id="console-consumer",
                client_host="/127.0.0.1",
                rebalance_timeout_ms=300000,
                session_timeout_ms=45000,
                subscription=_consumer_subscription_v3(["test"]),
                assignment=_consumer_assignment_v3("test", [0, 1]),
            ),
        ),
    )
    key = encode_key(GroupMetadataKey(group_id="group01"))
    value = encode_value(group)
    assert (len(key), len(value)) == (11, 247)
    assert format_offsets_record(key, value) == (
        'key: {"type":"2","data":{"group":"group01"}} payload: {"version":"3","data":'
        '{"protocolType":"consumer","generation":1,"protocol":"range",'
        f'"leader":"{member_id}","currentStateTimestamp":1785773250437,"members":['
        f'{{"memberId":"{member_id}","groupInstanceId":null,"clientId":"console-consumer",'
        '"clientHost":"/127.0.0.1","rebalanceTimeout":300000,"sessionTimeout":45000,'
        '"subscription":{"topics":["test"],"userData":null,"ownedPartitions":[],'
        '"generationId":-1,"rackId":null},"assignment":{"assignedPartitions":'
        '[{"topic":"test","partitions":[0,1]}],"userData":null}}]}}'
    )


def test_format_keeps_undecodable_or_non_consumer_protocol_bytes_as_base64() -> None:
    connect = dataclasses.replace(_ONE_MEMBER_GROUP, protocol_type="connect")
    key = encode_key(GroupMetadataKey(group_id="g"))
    assert '"subscription":"AAE=","assignment":""' in format_offsets_record(
        key, encode_value(connect)
    )
    # protocolType "consumer" but bytes that are no ConsumerProtocol message: kept as they are.
    assert '"subscription":"AAE=","assignment":""' in format_offsets_record(
        key, encode_value(_ONE_MEMBER_GROUP)
    )


def test_format_tombstone_and_legacy_key() -> None:
    legacy = h(f"0000 | {s16('g')} | {s16('t')} | 00000001")
    assert format_offsets_record(legacy, None) == (
        'key: {"type":"0","data":{"group":"g","topic":"t","partition":1}} payload: <DELETE>'
    )


def test_format_v1_offset_commit_shows_expire_timestamp_and_no_leader_epoch() -> None:
    value = OffsetCommitValue(offset=5, metadata="m", commit_timestamp_ms=1, expire_timestamp_ms=2)
    assert format_offsets_record(encode_key(_OC_KEY), encode_value(value)).endswith(
        'payload: {"version":"1","data":{"offset":5,"metadata":"m","commitTimestamp":1,'
        '"expireTimestamp":2}}'
    )


def test_format_kip_848_record_prints_topic_ids_as_kafka_does() -> None:
    key = encode_key(ConsumerGroupTargetAssignmentMemberKey(group_id="g", member_id="m"))
    value = encode_value(
        ConsumerGroupTargetAssignmentMemberValue(
            topic_partitions=(TopicPartitions(topic_id=bytes(range(16)), partitions=(3,)),)
        )
    )
    # Uuid.toString(): URL-safe base64, no padding.
    assert format_offsets_record(key, value) == (
        'key: {"type":"7","data":{"groupId":"g","memberId":"m"}} payload: {"version":"0",'
        '"data":{"topicPartitions":[{"topicId":"AAECAwQFBgcICQoLDA0ODw","partitions":[3]}]}}'
    )


def test_format_errors_like_kafka_dump_log() -> None:
    unknown = h(f"0009 | {s16('g')}")
    assert format_offsets_record(unknown, None, offset=7) == (
        "key: Unknown record type 9 at offset 7, skipping."
    )
    corrupt = format_offsets_record(encode_key(_OC_KEY), h("0003 00"), offset=8)
    assert corrupt.startswith("key: Error at offset 8, skipping. could not read OffsetCommitValue")
    assert format_offsets_record(None, b"x", offset=9) == (
        "Failed to decode message at offset 9 (message had a missing key)"
    )
