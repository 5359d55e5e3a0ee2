"""``kcoord dump-log`` on real segment files, run as the installed console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from kcoord.cluster.coordinator.records import (
    OffsetCommitKey,
    OffsetCommitValue,
    encode_key,
    encode_value,
)
from kcoord.storage import format as fmt
from kcoord.storage import producer_snapshot
from kcoord.storage.config import LogConfig
from kcoord.storage.producer_state import ProducerStateManager
from tests.unit.storage.helpers import batch, open_log


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("kcoord", path=str(Path(sys.executable).parent))
    assert exe is not None, "the kcoord console script is installed with the project"
    return subprocess.run([exe, "dump-log", *args], capture_output=True, text=True, check=False)


def test_dump_log_prints_batches_records_and_indexes(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(index_interval_bytes=100))
    for i in range(5):
        lg.append_as_leader(batch(2, key=None, value=f"hello{i}".encode() * 20), 4, now_ms=0)
    lg.close()
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    result = _run(str(seg), "--print-data-log")
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {seg}"
    batch_lines = [line for line in lines if line.startswith("baseOffset:")]
    assert len(batch_lines) == 5
    assert batch_lines[1].startswith("baseOffset: 2 lastOffset: 3 count: 2 ")
    assert "partitionLeaderEpoch: 4 " in batch_lines[0]
    assert batch_lines[0].endswith("isvalid: true")
    assert "compresscodec: none" in batch_lines[0]
    record_lines = [line for line in lines if line.startswith("| offset:")]
    assert record_lines[2].startswith("| offset: 2 CreateTime: 1000 keySize: -1 valueSize: 120 ")
    assert record_lines[2].endswith("payload: " + "hello1" * 20)
    index = _run(str(seg.with_suffix(".index")), str(seg.with_suffix(".timeindex")))
    assert index.returncode == 0
    assert "offset: 1 position: 0" not in index.stdout
    assert any(
        line.startswith("offset: ") and "position: " in line for line in index.stdout.splitlines()
    )
    assert "timestamp: 1001 offset: 1" in index.stdout


def test_dump_log_offsets_decoder(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "__consumer_offsets-0")
    key = encode_key(OffsetCommitKey(group_id="g", topic="orders", partition=3))
    value = encode_value(OffsetCommitValue(offset=42, commit_timestamp_ms=7))
    lg.append_as_leader(fmt.build_batch([fmt.Record(0, 7, key, value)]), 0, now_ms=0)
    lg.append_as_leader(fmt.build_batch([fmt.Record(0, 8, key, None)]), 0, now_ms=0)
    lg.close()
    seg = tmp_path / "__consumer_offsets-0" / "00000000000000000000.log"
    out = _run(str(seg), "--offsets-decoder").stdout
    assert 'key: {"type":"1","data":{"group":"g","topic":"orders","partition":3}}' in out
    assert '"offset":42' in out
    assert "payload: <DELETE>" in out


def test_dump_log_reports_corruption_and_exits_nonzero(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    for _ in range(3):
        lg.append_as_leader(batch(1, value=b"x" * 100), 0, now_ms=0)
    lg.close()
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x01
    seg.write_bytes(bytes(data) + b"\x00\x01\x02")
    result = _run(str(seg), "--print-data-log")
    assert result.returncode == 1
    assert "isvalid: false" in result.stdout
    # Its position in the file, not in the bytes read there (it said "position 0").
    assert (
        f"Found 3 invalid bytes at the end of {seg.name}: truncated batch header at position "
        f"{len(data)}: 3 of {fmt.HEADER_SIZE} bytes"
    ) in result.stdout
    missing = _run(str(tmp_path / "nope.log"))
    assert missing.returncode == 1 and "Cannot read" in missing.stdout


def test_dump_log_into_a_pipe_closed_early_stops_quietly(tmp_path: Path) -> None:
    """``kcoord dump-log ... | head``: the closed pipe was reported as the file being
    unreadable ("Cannot read ...: Broken pipe"), and writing that failed again into a
    traceback. It stops quietly, as kafka-dump-log.sh does."""
    lg = open_log(tmp_path / "t-0")
    for i in range(2000):
        lg.append_as_leader(batch(1, key=None, value=f"v{i}".encode() * 50), 0, now_ms=0)
    lg.close()
    exe = shutil.which("kcoord", path=str(Path(sys.executable).parent))
    assert exe is not None
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    proc = subprocess.Popen(
        [exe, "dump-log", str(seg), "--print-data-log"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"Dumping ")
    proc.stdout.close()  # as head does once it has its lines
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1
    assert stderr == ""


def test_dump_log_prints_a_producer_snapshot_as_kafka_does(tmp_path: Path) -> None:
    """``DumpLogSegments.dumpProducerIdSnapshot``: one producer a line, with its last batch;
    a damaged file is said so and the exit code is 1."""
    state = ProducerStateManager()
    header = fmt.parse_header(
        fmt.build_batch(
            [fmt.Record(i, 5_000, None, b"v") for i in range(3)],
            producer_id=12,
            producer_epoch=1,
            base_sequence=4,
        ),
        0,
    )
    state.update([header._replace(base_offset=20)])
    producer_snapshot.write(tmp_path, 23, state, keep_from=0)
    path = producer_snapshot.path_of(tmp_path, 23)
    result = _run(str(path))
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[1] == (
        "producerId: 12 producerEpoch: 1 coordinatorEpoch: -1 currentTxnFirstOffset: "
        "OptionalLong.empty lastTimestamp: 5000 firstSequence: 4 lastSequence: 6 "
        "lastOffset: 22 offsetDelta: 2 timestamp: 5000"
    )
    path.write_bytes(path.read_bytes()[:-1])
    damaged = _run(str(path))
    assert damaged.returncode == 1
    assert "Corrupt producer snapshot" in damaged.stdout


def test_dump_log_prints_keys_and_leaves_null_values_out(tmp_path: Path) -> None:
    """``DecoderMessageParser``: ``key: K`` when the record has one, ``payload: V`` only when
    it has a value (a tombstone printed "payload: null", and keys were never printed);
    ``--deep-iteration`` prints the records' metadata alone; a transaction marker shows its
    coordinator epoch."""
    lg = open_log(tmp_path / "t-0")
    lg.append_as_leader(batch(2, keys=[b"k1", b"k2"], values=[b"v1", None]), 0, now_ms=0)
    lg.append_as_leader(
        fmt.build_control_batch(
            fmt.ControlType.COMMIT,
            offset=0,
            timestamp=5,
            producer_id=7,
            producer_epoch=0,
            coordinator_epoch=3,
        ),
        0,
        now_ms=0,
    )
    lg.close()
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    data = _run(str(seg), "--print-data-log")
    assert data.returncode == 0, data.stdout + data.stderr
    records = [line for line in data.stdout.splitlines() if line.startswith("| offset:")]
    assert records[0].endswith("headerKeys: [] key: k1 payload: v1")
    assert records[1].endswith("headerKeys: [] key: k2")
    assert records[2].endswith("headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 3")
    deep = _run(str(seg), "--deep-iteration").stdout.splitlines()
    assert [line for line in deep if line.startswith("| offset:")] == [
        r[: r.index(" key:")] if " key:" in r else r for r in records
    ]
    batches_only = _run(str(seg)).stdout
    assert "| offset:" not in batches_only


def test_dump_log_checks_each_index_entry_against_its_segment(tmp_path: Path) -> None:
    """``dumpIndex``/``dumpTimeIndex``: only the order of the entries was checked, so an index
    pointing at the wrong batches dumped with exit code 0."""
    lg = open_log(tmp_path / "t-0", LogConfig(index_interval_bytes=1))
    for i in range(3):
        lg.append_as_leader(batch(2, timestamp=1_000 + 10 * i), 0, now_ms=0)
    lg.close()
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    index, time_index = seg.with_suffix(".index"), seg.with_suffix(".timeindex")
    sound = _run(str(index), str(time_index))
    assert sound.returncode == 0, sound.stdout + sound.stderr
    assert sound.stderr == ""
    assert "offset: 3 position: " in sound.stdout and "timestamp: 1021 offset: 5" in sound.stdout

    entries = bytearray(index.read_bytes())
    entries[4:8], entries[12:16] = entries[12:16], entries[4:8]  # two positions swapped
    index.write_bytes(bytes(entries))
    times = bytearray(time_index.read_bytes())
    times[12:20] = (999_999).to_bytes(8, "big")  # the second entry's timestamp
    time_index.write_bytes(bytes(times))
    broken = _run(str(index), str(time_index))
    assert broken.returncode == 1
    assert broken.stderr.splitlines() == [
        f"Mismatches in :{index}",
        "  Index offset: 5, log offset: 3",
        "  Index offset: 3, log offset: 5",
        f"Found timestamp mismatch in :{time_index}",
        "  Index timestamp: 999999, log timestamp: 1021",
    ]


def test_dump_log_skips_the_other_files_of_a_partition_directory(tmp_path: Path) -> None:
    """``dump-log part/*`` exited 1 for the checkpoint and partition.metadata files every
    partition directory has; Kafka's tool says it ignores them, on stderr, and goes on."""
    lg = open_log(tmp_path / "t-0")
    lg.append_as_leader(batch(1), 0, now_ms=0)
    lg.close()
    other = tmp_path / "t-0" / "leader-epoch-checkpoint"
    other.write_text("0\n0\n")
    result = _run(str(tmp_path / "t-0" / "00000000000000000000.log"), str(other))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == f"Ignoring unknown file {other}\n"
