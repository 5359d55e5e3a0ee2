"""Metadata records (KIP-631) and their explicit, versioned msgpack codec.

Theory of operation
-------------------
The metadata log is a sequence of records; replaying it in order into a ``MetadataImage``
(``raft/image.py``) gives every node the same cluster metadata. The records follow KIP-631's
metadata records (``metadata/src/main/resources/common/metadata/*.json`` in Kafka), cut down to
what kcoord needs:

=================  ========  ===========================================================
record             type id   meaning
=================  ========  ===========================================================
RegisterBroker     0         a broker (one incarnation of a node) joins; starts fenced
Topic              2         a topic is created: name, topic id, its configs
Partition          3         a partition of a topic is created, with its full state
Config             4         a config key is set (or deleted, value None) on a resource
PartitionChange    5         a delta on one partition (leader, ISR, ELR, replicas)
FenceBroker        6         a broker is fenced (no heartbeat within the session timeout)
UnfenceBroker      7         a broker is unfenced (it caught up with the metadata log)
RemoveTopic        9         a topic and all its partitions are deleted
NoOp               20        nothing; advances the metadata offset (liveness of the log)
ClusterId          29        the cluster id, written once by the first active controller
=================  ========  ===========================================================

The type ids are Kafka's ``apiKey`` of the same record (``ClusterIdRecord`` is apiKey 29 in
Kafka's ``metadata`` module); the cluster id is part of the replicated image and of every
snapshot, and each node also records it in its data directory's ``meta.properties``
(``storage/meta_properties.py``) to refuse another cluster's directory at start.

Deviations from Kafka, on purpose:

- ``Topic`` carries the topic's configs (Kafka writes a ``TopicRecord`` followed by one
  ``ConfigRecord`` per key); a topic is created by one record instead of many.
- ``PartitionChange`` carries ``expected_partition_epoch``: the partition epoch the change was
  computed against. ``MetadataImage.apply`` refuses a change whose expected epoch is not the
  partition's current epoch (compare-and-set). Kafka needs no such field because its
  controller applies its own uncommitted records before deciding again; kcoord's controller
  decides on the committed image, so two decisions may race and the later one must lose
  cleanly, identically on every node.
- ``PartitionChange`` has no new epochs: replaying it bumps ``partition_epoch`` by one, and
  ``leader_epoch`` by one when ``leader`` is not ``NO_LEADER_CHANGE`` (Kafka's
  ``PartitionRegistration.merge``).

Wire format
-----------
``encode(record)`` is a msgpack array ``[type_id, version, field_1, field_2, ...]``. The field
order is written down per (type id, version) in ``_SCHEMAS`` below -- it does not depend on the
order of the dataclass fields, and nothing is pickled. Field kinds:

- ``int``: a msgpack integer (booleans refused);
- ``bool``: a msgpack boolean;
- ``str`` / ``str?``: a msgpack string, or nil for the optional kind;
- ``ints`` / ``ints?``: an array of integers (a tuple in Python), or nil for the optional kind;
- ``strmap``: a map of string to string, encoded with sorted keys so the bytes are canonical.

``decode(data)`` checks the array shape, the type id, the version and every field's kind, and
raises ``MetadataRecordError`` (one exception class, with a message naming the problem) on
anything else: unknown type id, unsupported version, wrong field count or kind, bytes that are
not msgpack, or trailing bytes. Every record type is at version 0. A new field means a new
version with its own schema; decoding an old version must keep working, filling the new field
with its default.

Semantic checks (does the topic exist, is the ISR a subset of the replicas, ...) are not the
codec's job: ``MetadataImage.apply`` does them.

Pure: no I/O; imports only the standard library and msgpack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum, IntEnum
from typing import Any, Final

import msgpack  # type: ignore[import-untyped, unused-ignore]

# Kafka's ``LeaderConstants``: a PartitionChange leader of -2 leaves the leader alone; a
# leader of -1 means the partition has no leader.
NO_LEADER: Final = -1
NO_LEADER_CHANGE: Final = -2


class MetadataRecordError(ValueError):
    """A metadata record could not be encoded or decoded; the message names the problem."""


class ConfigResourceType(IntEnum):
    """Kafka's ``ConfigResource.Type`` codes for the resources a ``Config`` record may name."""

    TOPIC = 2
    BROKER = 4  # resource name "" is the cluster-wide default, else a broker id in decimal
    GROUP = 32


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker registration (Kafka's ``RegisterBrokerRecord``).

    ``broker_epoch`` is chosen by the controller and is higher than any earlier epoch of the
    same broker id. ``endpoints`` maps a listener name (``kafka``, ``rpc``, ``quorum``,
    ``admin``) to its advertised ``host:port``. A new registration is always fenced; a snapshot
    writes the broker's current fencing state.
    """

    broker_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: Mapping[str, str]
    rack: str | None = None
    fenced: bool = True


@dataclass(frozen=True, slots=True)
class FenceBroker:
    """Fence a broker (Kafka's ``FenceBrokerRecord``): it may lead nothing."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBroker:
    """Unfence a broker (Kafka's ``UnfenceBrokerRecord``): it may lead partitions again."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class Topic:
    """Create a topic (Kafka's ``TopicRecord`` plus its ``ConfigRecord``s).

    ``topic_id`` is chosen by the caller (a Kafka-style 22-character base64 uuid, or uuid text).
    """

    name: str
    topic_id: str
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Partition:
    """Create a partition with its full state (Kafka's ``PartitionRecord``).

    ``elr`` are the eligible leader replicas and ``last_known_elr`` the last known ELR members
    (KIP-966). ``leader`` is ``NO_LEADER`` (-1) when the partition has no leader.
    """

    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A delta on one partition (Kafka's ``PartitionChangeRecord``).

    ``None`` fields are unchanged. ``leader`` is ``NO_LEADER_CHANGE`` (-2) to keep the leader,
    ``NO_LEADER`` (-1) for no leader, else the new leader's broker id; any value but -2 bumps the
    leader epoch (so setting the same leader forces a new leader epoch). Every change bumps the
    partition epoch. ``expected_partition_epoch`` is the partition epoch the change was computed
    from; replay refuses the change if the partition has moved on.
    """

    topic_id: str
    partition: int
    expected_partition_epoch: int
    leader: int = NO_LEADER_CHANGE
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    elr: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RemoveTopic:
    """Delete a topic and all its partitions (Kafka's ``RemoveTopicRecord``)."""

    topic_id: str


@dataclass(frozen=True, slots=True)
class Config:
    """Set (or delete, when ``value`` is None) one config key (Kafka's ``ConfigRecord``).

    ``resource_type`` is a ``ConfigResourceType`` code; for topics ``resource_name`` is the topic
    name.
    """

    resource_type: int
    resource_name: str
    key: str
    value: str | None


@dataclass(frozen=True, slots=True)
class NoOp:
    """Nothing (Kafka's ``NoOpRecord``); advances the metadata offset."""


@dataclass(frozen=True, slots=True)
class ClusterId:
    """The cluster id (Kafka's ``ClusterIdRecord``), written once when the cluster is formed."""

    cluster_id: str


MetadataRecord = (
    RegisterBroker
    | FenceBroker
    | UnfenceBroker
    | Topic
    | Partition
    | PartitionChange
    | RemoveTopic
    | Config
    | NoOp
    | ClusterId
)


class _Kind(Enum):
    INT = "int"
    BOOL = "bool"
    STR = "str"
    OPT_STR = "str?"
    INTS = "ints"
    OPT_INTS = "ints?"
    STR_MAP = "strmap"


_Schema = tuple[tuple[str, _Kind], ...]

# (type id, version) -> field order. Never reorder or edit a published schema: add a version.
_SCHEMAS: Final[dict[tuple[int, int], _Schema]] = {
    (0, 0): (
        ("broker_id", _Kind.INT),
        ("incarnation_id", _Kind.STR),
        ("broker_epoch", _Kind.INT),
        ("endpoints", _Kind.STR_MAP),
        ("rack", _Kind.OPT_STR),
        ("fenced", _Kind.BOOL),
    ),
    (2, 0): (
        ("name", _Kind.STR),
        ("topic_id", _Kind.STR),
        ("configs", _Kind.STR_MAP),
    ),
    (3, 0): (
        ("topic_id", _Kind.STR),
        ("partition", _Kind.INT),
        ("replicas", _Kind.INTS),
        ("isr", _Kind.INTS),
        ("leader", _Kind.INT),
        ("leader_epoch", _Kind.INT),
        ("partition_epoch", _Kind.INT),
        ("elr", _Kind.INTS),
        ("last_known_elr", _Kind.INTS),
    ),
    (4, 0): (
        ("resource_type", _Kind.INT),
        ("resource_name", _Kind.STR),
        ("key", _Kind.STR),
        ("value", _Kind.OPT_STR),
    ),
    (5, 0): (
        ("topic_id", _Kind.STR),
        ("partition", _Kind.INT),
        ("expected_partition_epoch", _Kind.INT),
        ("leader", _Kind.INT),
        ("isr", _Kind.OPT_INTS),
        ("replicas", _Kind.OPT_INTS),
        ("elr", _Kind.OPT_INTS),
        ("last_known_elr", _Kind.OPT_INTS),
    ),
    (6, 0): (
        ("broker_id", _Kind.INT),
        ("broker_epoch", _Kind.INT),
    ),
    (7, 0): (
        ("broker_id", _Kind.INT),
        ("broker_epoch", _Kind.INT),
    ),
    (9, 0): (("topic_id", _Kind.STR),),
    (20, 0): (),
    (29, 0): (("cluster_id", _Kind.STR),),
}

_TYPE_IDS: Final[dict[type[Any], int]] = {
    RegisterBroker: 0,
    Topic: 2,
    Partition: 3,
    Config: 4,
    PartitionChange: 5,
    FenceBroker: 6,
    UnfenceBroker: 7,
    RemoveTopic: 9,
    NoOp: 20,
    ClusterId: 29,
}
_CLASSES: Final[dict[int, type[Any]]] = {type_id: cls for cls, type_id in _TYPE_IDS.items()}

# The version ``encode`` writes for each type id.
_CURRENT_VERSIONS: Final[dict[int, int]] = dict.fromkeys(_CLASSES, 0)

# int64, Kafka's widest integer field (broker epochs, offsets).
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1


def record_type_id(record: MetadataRecord) -> int:
    """The type id ``encode`` writes for ``record``."""
    try:
        return _TYPE_IDS[type(record)]
    except KeyError:
        raise MetadataRecordError(f"not a metadata record: {type(record).__name__}") from None


def current_schema(cls: type[Any]) -> tuple[str, ...]:
    """The field names ``encode`` writes for records of class ``cls``, in wire order."""
    type_id = _TYPE_IDS[cls]
    return tuple(name for name, _ in _SCHEMAS[(type_id, _CURRENT_VERSIONS[type_id])])


def encode(record: MetadataRecord) -> bytes:
    """Encode ``record`` as ``[type_id, version, field...]`` in msgpack.

    Raises ``MetadataRecordError`` if a field does not have its schema's kind.
    """
    type_id = record_type_id(record)
    version = _CURRENT_VERSIONS[type_id]
    name = type(record).__name__
    payload: list[Any] = [type_id, version]
    for field_name, kind in _SCHEMAS[(type_id, version)]:
        payload.append(_encode_field(name, field_name, kind, getattr(record, field_name)))
    packed = msgpack.packb(payload, use_bin_type=True)
    assert isinstance(packed, bytes)
    return packed


def decode(data: bytes) -> MetadataRecord:
    """Decode bytes written by ``encode``; raises ``MetadataRecordError`` if they are not one."""
    try:
        payload = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise MetadataRecordError(f"malformed metadata record: not msgpack ({e})") from e
    if not isinstance(payload, list) or len(payload) < 2:
        raise MetadataRecordError(
            "malformed metadata record: expected an array [type_id, version, fields...], "
            f"got {type(payload).__name__}"
        )
    type_id, version = payload[0], payload[1]
    if not _is_int(type_id) or not _is_int(version):
        raise MetadataRecordError(
            f"malformed metadata record: type id and version must be integers, got "
            f"{type_id!r} and {version!r}"
        )
    cls = _CLASSES.get(type_id)
    if cls is None:
        raise MetadataRecordError(f"unknown metadata record type id {type_id}")
    schema = _SCHEMAS.get((type_id, version))
    if schema is None:
        supported = sorted(v for (t, v) in _SCHEMAS if t == type_id)
        raise MetadataRecordError(
            f"unsupported version {version} of metadata record {cls.__name__} "
            f"(type id {type_id}); this node reads versions {supported}"
        )
    values = payload[2:]
    if len(values) != len(schema):
        raise MetadataRecordError(
            f"malformed metadata record {cls.__name__} v{version}: expected {len(schema)} "
            f"fields, got {len(values)}"
        )
    kwargs = {
        field_name: _decode_field(cls.__name__, field_name, kind, value)
        for (field_name, kind), value in zip(schema, values, strict=True)
    }
    record: MetadataRecord = cls(**kwargs)
    return record


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_in_range(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _INT_MIN <= value <= _INT_MAX


def _is_str_map(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _is_ints(value: object) -> bool:
    return isinstance(value, tuple | list) and all(_is_int_in_range(v) for v in value)


def _check_kind(record_name: str, field_name: str, kind: _Kind, value: object) -> None:
    if kind is _Kind.INT:
        ok = _is_int_in_range(value)
    elif kind is _Kind.BOOL:
        ok = isinstance(value, bool)
    elif kind is _Kind.STR:
        ok = isinstance(value, str)
    elif kind is _Kind.OPT_STR:
        ok = value is None or isinstance(value, str)
    elif kind is _Kind.INTS:
        ok = _is_ints(value)
    elif kind is _Kind.OPT_INTS:
        ok = value is None or _is_ints(value)
    else:
        assert kind is _Kind.STR_MAP, kind
        ok = _is_str_map(value)
    if not ok:
        raise MetadataRecordError(
            f"metadata record {record_name}: field {field_name} must be {kind.value}, got {value!r}"
        )


def _encode_field(record_name: str, field_name: str, kind: _Kind, value: object) -> object:
    _check_kind(record_name, field_name, kind, value)
    if isinstance(value, tuple | list):
        return list(value)
    if isinstance(value, Mapping):
        return {k: value[k] for k in sorted(value)}
    return value


def _decode_field(record_name: str, field_name: str, kind: _Kind, value: object) -> object:
    _check_kind(record_name, field_name, kind, value)
    # After _check_kind, a list is an ``ints`` value and a dict a ``strmap`` one.
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _check_schemas_cover_fields() -> None:
    # The schema of the current version must name every dataclass field exactly once, so a
    # field added to a record without a new schema version fails at import, not in production.
    for cls, type_id in _TYPE_IDS.items():
        schema_names = sorted(current_schema(cls))
        field_names = sorted(f.name for f in fields(cls))
        assert schema_names == field_names, (cls.__name__, type_id, schema_names, field_names)


_check_schemas_cover_fields()
