"""The metadata record codec: round trips, the exact wire layout, and every refusal."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcoord.raft.records import (
    NO_LEADER_CHANGE,
    ClusterId,
    Config,
    FenceBroker,
    MetadataRecord,
    MetadataRecordError,
    NoOp,
    Partition,
    PartitionChange,
    RegisterBroker,
    RemoveTopic,
    Topic,
    UnfenceBroker,
    current_schema,
    decode,
    encode,
    record_type_id,
)

ALL_RECORD_TYPES: tuple[type[Any], ...] = (
    RegisterBroker,
    FenceBroker,
    UnfenceBroker,
    Topic,
    Partition,
    PartitionChange,
    RemoveTopic,
    Config,
    NoOp,
    ClusterId,
)

int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small_ints = st.integers(min_value=-3, max_value=10_000)
texts = st.text(max_size=30)
int_tuples = st.lists(small_ints, max_size=6).map(tuple)
opt_int_tuples = st.none() | int_tuples
str_maps = st.dictionaries(texts, texts, max_size=5)

RECORDS: dict[type[Any], st.SearchStrategy[Any]] = {
    RegisterBroker: st.builds(
        RegisterBroker,
        broker_id=int64s,
        incarnation_id=texts,
        broker_epoch=int64s,
        endpoints=str_maps,
        rack=st.none() | texts,
        fenced=st.booleans(),
    ),
    FenceBroker: st.builds(FenceBroker, broker_id=int64s, broker_epoch=int64s),
    UnfenceBroker: st.builds(UnfenceBroker, broker_id=int64s, broker_epoch=int64s),
    Topic: st.builds(Topic, name=texts, topic_id=texts, configs=str_maps),
    Partition: st.builds(
        Partition,
        topic_id=texts,
        partition=small_ints,
        replicas=int_tuples,
        isr=int_tuples,
        leader=small_ints,
        leader_epoch=int64s,
        partition_epoch=int64s,
        elr=int_tuples,
        last_known_elr=int_tuples,
    ),
    PartitionChange: st.builds(
        PartitionChange,
        topic_id=texts,
        partition=small_ints,
        expected_partition_epoch=int64s,
        leader=small_ints,
        isr=opt_int_tuples,
        replicas=opt_int_tuples,
        elr=opt_int_tuples,
        last_known_elr=opt_int_tuples,
    ),
    RemoveTopic: st.builds(RemoveTopic, topic_id=texts),
    Config: st.builds(
        Config, resource_type=small_ints, resource_name=texts, key=texts, value=st.none() | texts
    ),
    NoOp: st.just(NoOp()),
    ClusterId: st.builds(ClusterId, cluster_id=texts),
}
any_record: st.SearchStrategy[MetadataRecord] = st.one_of(*RECORDS.values())


def test_every_record_type_has_a_strategy() -> None:
    assert set(RECORDS) == set(ALL_RECORD_TYPES)


@pytest.mark.parametrize("cls", ALL_RECORD_TYPES, ids=lambda c: c.__name__)
def test_round_trip_each_type(cls: type[Any]) -> None:
    @given(RECORDS[cls])
    def check(record: MetadataRecord) -> None:
        data = encode(record)
        decoded = decode(data)
        assert decoded == record
        assert type(decoded) is type(record)
        # Decoding gives tuples and plain dicts back, so re-encoding gives the same bytes.
        assert encode(decoded) == data

    check()


@given(any_record)
def test_round_trip_any(record: MetadataRecord) -> None:
    assert decode(encode(record)) == record


@pytest.mark.parametrize("cls", ALL_RECORD_TYPES, ids=lambda c: c.__name__)
def test_schema_names_every_field_once(cls: type[Any]) -> None:
    schema = current_schema(cls)
    assert len(schema) == len(set(schema))
    assert sorted(schema) == sorted(f.name for f in dataclasses.fields(cls))


def test_type_ids_are_kafkas_api_keys() -> None:
    assert {cls.__name__: record_type_id(next_example(cls)) for cls in ALL_RECORD_TYPES} == {
        "RegisterBroker": 0,
        "Topic": 2,
        "Partition": 3,
        "Config": 4,
        "PartitionChange": 5,
        "FenceBroker": 6,
        "UnfenceBroker": 7,
        "RemoveTopic": 9,
        "NoOp": 20,
        "ClusterId": 29,
    }


def next_example(cls: type[Any]) -> MetadataRecord:
    examples: dict[type[Any], MetadataRecord] = {
        RegisterBroker: RegisterBroker(1, "inc", 5, {"kafka": "h:1"}),
        FenceBroker: FenceBroker(1, 5),
        UnfenceBroker: UnfenceBroker(1, 5),
        Topic: Topic("t", "id"),
        Partition: Partition("id", 0, (1,), (1,), 1, 0, 0),
        PartitionChange: PartitionChange("id", 0, 0),
        RemoveTopic: RemoveTopic("id"),
        Config: Config(2, "t", "k", "v"),
        NoOp: NoOp(),
        ClusterId: ClusterId("c"),
    }
    return examples[cls]


# ------------------------------------------------------------------ exact wire layout


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def test_wire_layout_register_broker() -> None:
    record = RegisterBroker(
        broker_id=3,
        incarnation_id="9f2c",
        broker_epoch=42,
        endpoints={"rpc": "10.0.0.3:9093", "kafka": "10.0.0.3:9092"},
        rack="r1",
        fenced=True,
    )
    layout = unpack(encode(record))
    assert layout == [
        0,
        0,
        3,
        "9f2c",
        42,
        {"kafka": "10.0.0.3:9092", "rpc": "10.0.0.3:9093"},
        "r1",
        True,
    ]
    # Map keys are written sorted, whatever the insertion order.
    assert list(layout[5]) == ["kafka", "rpc"]


def test_wire_layout_partition_and_change() -> None:
    partition = Partition("tid", 7, (1, 2, 3), (1, 2), 1, 4, 9, (3,), ())
    assert unpack(encode(partition)) == [3, 0, "tid", 7, [1, 2, 3], [1, 2], 1, 4, 9, [3], []]
    change = PartitionChange("tid", 7, 9, leader=2, isr=(2,), elr=())
    assert unpack(encode(change)) == [5, 0, "tid", 7, 9, 2, [2], None, [], None]
    assert PartitionChange("tid", 7, 9).leader == NO_LEADER_CHANGE


def test_wire_layout_small_records() -> None:
    assert unpack(encode(FenceBroker(4, 11))) == [6, 0, 4, 11]
    assert unpack(encode(UnfenceBroker(4, 11))) == [7, 0, 4, 11]
    assert unpack(encode(Topic("orders", "AAAAAAAAAAAAAAAAAAAAAA", {"b": "2", "a": "1"}))) == [
        2,
        0,
        "orders",
        "AAAAAAAAAAAAAAAAAAAAAA",
        {"a": "1", "b": "2"},
    ]
    assert unpack(encode(RemoveTopic("x"))) == [9, 0, "x"]
    assert unpack(encode(Config(2, "orders", "retention.ms", None))) == [
        4,
        0,
        2,
        "orders",
        "retention.ms",
        None,
    ]
    assert unpack(encode(NoOp())) == [20, 0]
    assert unpack(encode(ClusterId("c-1"))) == [29, 0, "c-1"]


def test_encoding_is_canonical_for_maps() -> None:
    a = Topic("t", "id", {"x": "1", "y": "2"})
    b = Topic("t", "id", {"y": "2", "x": "1"})
    assert encode(a) == encode(b)


# ------------------------------------------------------------------ refusals


def pack(payload: Any) -> bytes:
    data = msgpack.packb(payload, use_bin_type=True)
    assert isinstance(data, bytes)
    return data


def test_unknown_type_id() -> None:
    with pytest.raises(MetadataRecordError, match="unknown metadata record type id 99"):
        decode(pack([99, 0]))


def test_unsupported_version() -> None:
    with pytest.raises(
        MetadataRecordError, match=r"unsupported version 1 of metadata record FenceBroker"
    ):
        decode(pack([6, 1, 4, 11]))


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x93\x01", b"\xa2\xff\xfe", b"\x81\x01\x02", b"\xdd\xff\xff\xff\xff"],
    ids=["empty", "reserved-byte", "truncated-array", "bad-utf8", "int-map-key", "huge-array"],
)
def test_garbage_bytes(data: bytes) -> None:
    with pytest.raises(MetadataRecordError, match="malformed metadata record: not msgpack"):
        decode(data)


def test_trailing_bytes_refused() -> None:
    with pytest.raises(MetadataRecordError, match="not msgpack"):
        decode(encode(NoOp()) + b"\x00")


def test_not_an_array() -> None:
    with pytest.raises(MetadataRecordError, match="expected an array"):
        decode(pack({"type": 6}))
    with pytest.raises(MetadataRecordError, match="expected an array"):
        decode(pack([6]))


def test_type_id_and_version_must_be_ints() -> None:
    with pytest.raises(MetadataRecordError, match="must be integers"):
        decode(pack(["6", 0, 4, 11]))
    with pytest.raises(MetadataRecordError, match="must be integers"):
        decode(pack([6, True, 4, 11]))


def test_wrong_field_count() -> None:
    with pytest.raises(MetadataRecordError, match="expected 2 fields, got 3"):
        decode(pack([6, 0, 4, 11, 12]))
    with pytest.raises(MetadataRecordError, match="expected 2 fields, got 1"):
        decode(pack([6, 0, 4]))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([6, 0, "4", 11], "FenceBroker: field broker_id must be int"),
        ([6, 0, True, 11], "FenceBroker: field broker_id must be int"),
        ([6, 0, 4, 1.5], "FenceBroker: field broker_epoch must be int"),
        ([9, 0, b"bytes"], "RemoveTopic: field topic_id must be str"),
        ([29, 0, None], "ClusterId: field cluster_id must be str"),
        ([2, 0, "t", "id", {"a": 1}], "Topic: field configs must be strmap"),
        ([2, 0, "t", "id", ["a"]], "Topic: field configs must be strmap"),
        ([3, 0, "t", 0, [1, "2"], [1], 1, 0, 0, [], []], "Partition: field replicas must be ints"),
        ([3, 0, "t", 0, [1], None, 1, 0, 0, [], []], "Partition: field isr must be ints"),
        ([5, 0, "t", 0, 0, -2, "x", None, None, None], "PartitionChange: field isr must be ints?"),
        ([0, 0, 1, "i", 1, {}, None, 1], "RegisterBroker: field fenced must be bool"),
        ([0, 0, 1, "i", 1, {}, 5, True], r"RegisterBroker: field rack must be str\?"),
    ],
)
def test_wrong_field_kind(payload: list[Any], message: str) -> None:
    with pytest.raises(MetadataRecordError, match=message):
        decode(pack(payload))


def test_ext_types_refused() -> None:
    data = msgpack.packb([6, 0, msgpack.ExtType(1, b"x"), 1], use_bin_type=True)
    with pytest.raises(MetadataRecordError, match="field broker_id must be int"):
        decode(data)


def test_encode_refuses_wrong_kinds() -> None:
    with pytest.raises(MetadataRecordError, match="field broker_id must be int"):
        encode(FenceBroker("4", 11))  # type: ignore[arg-type]
    with pytest.raises(MetadataRecordError, match="field broker_epoch must be int"):
        encode(FenceBroker(4, 2**63))
    with pytest.raises(MetadataRecordError, match="field replicas must be ints"):
        encode(Partition("t", 0, (1, True), (1,), 1, 0, 0))
    with pytest.raises(MetadataRecordError, match="not a metadata record: str"):
        encode("NoOp")  # type: ignore[arg-type]


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_the_codec_error(data: bytes) -> None:
    try:
        record = decode(data)
    except MetadataRecordError:
        return
    assert decode(encode(record)) == record


@given(any_record, st.data())
def test_truncated_encodings_are_refused(record: MetadataRecord, data: st.DataObject) -> None:
    encoded = encode(record)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(MetadataRecordError):
        decode(encoded[:cut])
