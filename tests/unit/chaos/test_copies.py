"""Reading who wrote each copy of a twice-written value from the nodes' log files."""

from __future__ import annotations

from pathlib import Path

from kcoord.chaos.copies import copies_in_logs
from kcoord.storage import format as fmt


def batch(base: int, values: list[str], *, pid: int, epoch: int, seq: int) -> bytes:
    records = [fmt.Record(base + i, 1_000, b"k", v.encode()) for i, v in enumerate(values)]
    return fmt.build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def write_segment(data_dir: Path, partition_dir: str, base: int, *batches: bytes) -> Path:
    directory = data_dir / partition_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{base:020d}.log"
    path.write_bytes(b"".join(batches))
    return path


def test_a_value_at_two_offsets_is_reported_with_each_copys_producer_session(
    tmp_path: Path,
) -> None:
    node1, node2 = tmp_path / "node-1", tmp_path / "node-2"
    first = batch(0, ["p-0", "p-1"], pid=7, epoch=0, seq=0)
    resent = batch(2, ["p-1", "p-2"], pid=7, epoch=1, seq=0)  # librdkafka's resend of "p-1"
    write_segment(node1, "chaos-queue-0", 0, first)
    write_segment(node1, "chaos-queue-0", 2, resent)
    write_segment(node2, "chaos-queue-0", 0, first, resent)  # another replica: one segment
    write_segment(node1, "other-0", 0, first, first)  # not the workload's topic

    found = copies_in_logs([node1, node2, tmp_path / "missing"], ["chaos-queue"])

    assert found == [
        {
            "topic": "chaos-queue",
            "partition": 0,
            "value": "p-1",
            "copies": [
                {"offset": 1, "producer_id": 7, "producer_epoch": 0, "sequence": 1},
                {"offset": 2, "producer_id": 7, "producer_epoch": 1, "sequence": 0},
            ],
        }
    ]


def test_a_torn_tail_ends_the_scan_and_control_batches_are_skipped(tmp_path: Path) -> None:
    markers = [  # two control records with one value: not a value written twice
        fmt.build_control_batch(
            fmt.ControlType.COMMIT,
            offset=offset,
            timestamp=1_000,
            producer_id=7,
            producer_epoch=0,
            coordinator_epoch=0,
        )
        for offset in (2, 3)
    ]
    torn = batch(4, ["p-0"], pid=7, epoch=1, seq=0)
    write_segment(
        tmp_path,
        "q-1",
        0,
        batch(0, ["p-0", "p-1"], pid=7, epoch=0, seq=0),
        *markers,
        torn[: len(torn) - 5],  # a node killed mid-write
    )

    assert copies_in_logs([tmp_path], ["q"]) == []
