"""Which producer wrote each copy of a value written twice: read from the nodes' logs.

The queue checker's ``duplicate`` is one value at two offsets of a partition. The history says
where, not who: a broker that appended a retried batch twice, and an idempotent producer that
resent the value under a new producer id or epoch, look alike there. The broker deduplicates
within one (producer id, epoch) only; librdkafka bumps its epoch and resends, under new
sequences, batches it saw fail after they were written (librdkafka issue #4953, chaos/README.md).

After a run the runner stops the nodes and reads every replica of the workload's topics from
their data directories (``copies_in_logs``): for each value some replica holds at two or more
offsets, the producer id, epoch and sequence of every copy, as one ``log-copies`` event per
value. ``check_queue`` tells the two cases apart with them. Only local clusters have the
directories; a run without these events counts every duplicate as the broker's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kcoord.storage import format as fmt
from kcoord.storage.log import parse_partition_dir
from kcoord.storage.segment import LOG_SUFFIX

log = logging.getLogger(__name__)


def copies_in_logs(data_dirs: Iterable[Path], topics: Iterable[str]) -> list[dict[str, Any]]:
    """One ``{"topic", "partition", "value", "copies": [{"offset", "producer_id",
    "producer_epoch", "sequence"}]}`` per value that a replica of ``topics`` holds at two or
    more offsets, copies in offset order. Records without a value are ignored; a torn or corrupt
    tail (a node killed mid-write) ends its segment's scan."""
    wanted = set(topics)
    # (topic, partition, value) -> offset -> copy; a value is keyed once per offset across
    # replicas (they agree below the high watermark, and the checker only asks about values
    # it saw at two offsets).
    found: dict[tuple[str, int, str], dict[int, dict[str, int]]] = defaultdict(dict)
    for data_dir in data_dirs:
        for topic, partition, directory in _partition_dirs(data_dir, wanted):
            replica: dict[str, dict[int, dict[str, int]]] = defaultdict(dict)
            for offset, value, copy in _records(directory):
                replica[value][offset] = copy
            for value, at in replica.items():
                if len(at) > 1:
                    found[(topic, partition, value)].update(at)
    return [
        {
            "topic": topic,
            "partition": partition,
            "value": value,
            "copies": [{"offset": o, **at[o]} for o in sorted(at)],
        }
        for (topic, partition, value), at in sorted(found.items())
    ]


def _partition_dirs(data_dir: Path, topics: set[str]) -> Iterator[tuple[str, int, Path]]:
    if not data_dir.is_dir():
        return
    for directory in sorted(data_dir.iterdir()):
        tp = parse_partition_dir(directory.name)
        if tp is not None and tp[0] in topics and directory.is_dir():
            yield tp[0], tp[1], directory


def _records(directory: Path) -> Iterator[tuple[int, str, dict[str, int]]]:
    for segment in sorted(directory.glob("*" + LOG_SUFFIX)):
        buf = segment.read_bytes()
        valid = fmt.scan_valid_prefix(buf)
        if valid.error is not None:
            log.info("%s: read up to position %d: %s", segment, valid.valid_bytes, valid.error)
        for pos, header in valid.headers:
            if header.is_control:
                continue
            try:
                records = fmt.decode_key_values(buf, pos)
            except fmt.RecordFormatError as e:
                log.info("%s: batch at position %d unreadable: %s", segment, pos, e)
                continue
            for offset, _key, value in records:
                if value is None:
                    continue
                copy = {
                    "producer_id": header.producer_id,
                    "producer_epoch": header.producer_epoch,
                    "sequence": (
                        fmt.NO_SEQUENCE
                        if header.base_sequence == fmt.NO_SEQUENCE
                        else (header.base_sequence + offset - header.base_offset) % 2**31
                    ),
                }
                yield offset, value.decode(errors="replace"), copy
