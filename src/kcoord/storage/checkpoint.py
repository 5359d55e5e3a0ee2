"""Checkpoint files, in Kafka's text formats, written atomically.

Offset checkpoints (``CheckpointFile``/``OffsetCheckpointFile`` in Kafka), one per data
directory: ``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint`` (high
watermarks), ``log-start-offset-checkpoint`` and ``cleaner-offset-checkpoint`` (where each
compacted log's dirty part starts, Kafka's ``LogCleanerManager``)::

    0                      <- version
    2                      <- number of entries
    orders 0 1234          <- topic, partition, offset; separated by single spaces
    __consumer_offsets 7 0

``leader-epoch-checkpoint`` (``LeaderEpochCheckpointFile``), one per partition directory::

    0
    2
    0 0                    <- leader epoch, start offset
    3 1500

``partition.metadata`` (``PartitionMetadataFile``), one per partition directory::

    version: 0
    topic_id: <22-character URL-safe base64 UUID>

Every file is written to ``<name>.tmp``, fsynced, renamed over the old one and the directory
fsynced, so a crash leaves either the old or the new content, never a mix. A file that cannot be
parsed raises ``CheckpointError`` naming the file and line; callers decide how to repair.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

VERSION = 0

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"

TopicPartition = tuple[str, int]
T = TypeVar("T")


class CheckpointError(ValueError):
    """A checkpoint file that does not parse."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write a temporary file, fsync it, rename it over ``path``, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _write_entries(path: Path, lines: Iterable[str]) -> None:
    body = list(lines)
    write_atomically(path, f"{VERSION}\n{len(body)}\n" + "".join(f"{line}\n" for line in body))


def _read_entries(path: Path, parse: Callable[[list[str]], T]) -> list[T]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text") from e
    lines = text.splitlines()
    if len(lines) < 2:
        raise CheckpointError(f"{path}: missing version or entry count")
    if lines[0].strip() != str(VERSION):
        raise CheckpointError(f"{path}: unsupported version {lines[0]!r}")
    try:
        count = int(lines[1])
    except ValueError as e:
        raise CheckpointError(f"{path}: bad entry count {lines[1]!r}") from e
    entries = lines[2:]
    if count < 0 or len(entries) != count:
        raise CheckpointError(f"{path}: expected {count} entries, found {len(entries)}")
    out: list[T] = []
    for n, line in enumerate(entries, start=3):
        try:
            out.append(parse(line.split(" ")))
        except (ValueError, IndexError) as e:
            raise CheckpointError(f"{path}:{n}: malformed entry {line!r}") from e
    return out


def write_offsets(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    _write_entries(path, (f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())))


def _parse_offset_entry(fields: list[str]) -> tuple[TopicPartition, int]:
    if len(fields) != 3:
        raise ValueError("expected 'topic partition offset'")
    topic, partition, offset = fields[0], int(fields[1]), int(fields[2])
    if not topic or partition < 0 or offset < 0:
        raise ValueError("empty topic or negative number")
    return (topic, partition), offset


def read_offsets(path: Path) -> dict[TopicPartition, int]:
    """The offsets in ``path``; an absent file is an empty checkpoint."""
    if not path.exists():
        return {}
    return dict(_read_entries(path, _parse_offset_entry))


def write_leader_epochs(path: Path, entries: Iterable[tuple[int, int]]) -> None:
    _write_entries(path, (f"{epoch} {offset}" for epoch, offset in entries))


def _parse_epoch_entry(fields: list[str]) -> tuple[int, int]:
    if len(fields) != 2:
        raise ValueError("expected 'epoch start_offset'")
    epoch, offset = int(fields[0]), int(fields[1])
    if epoch < 0 or offset < 0:
        raise ValueError("negative epoch or offset")
    return epoch, offset


def read_leader_epochs(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    entries = _read_entries(path, _parse_epoch_entry)
    for (e1, o1), (e2, o2) in itertools.pairwise(entries):
        if e2 <= e1 or o2 < o1:
            raise CheckpointError(f"{path}: epochs must increase, found {e1} {o1} then {e2} {o2}")
    return entries


def write_partition_metadata(path: Path, topic_id: str) -> None:
    write_atomically(path, f"version: {VERSION}\ntopic_id: {topic_id}\n")


def read_partition_metadata(path: Path) -> str | None:
    """The topic id in ``path``, or None when the file is absent."""
    if not path.exists():
        return None
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            raise CheckpointError(f"{path}: malformed line {line!r}")
        fields[key.strip()] = value.strip()
    if fields.get("version") != str(VERSION) or not fields.get("topic_id"):
        raise CheckpointError(f"{path}: need 'version: 0' and a topic_id")
    return fields["topic_id"]
