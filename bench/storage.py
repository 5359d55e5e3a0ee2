"""Storage engine benchmark: ``make bench-storage``.

Measures, in one run on this machine:

- ``Log.append_as_leader`` MB/s and batches/s for 100 B and 1 KiB records in batches of 1 and
  100, A/B-interleaved in 2 MiB slices with raw sequential writes (``os.write`` of 1 MiB
  chunks, and for context of one batch's size per call; no fsync on either side: the log
  fsyncs on roll and close), reported as the median over 2 MiB slices of the ratio to the raw
  figure measured back to back (target: >= 0.5 for batches of 100);
- random read-by-offset latency p50/p99 (index lookup alone, and lookup + read + CRC check of
  one batch; target p99 < 200 us);
- recovery MB/s: ``Log.open`` of an unflushed log of ``--recovery-mib`` (default 1024) with no
  recovery point, every batch CRC-checked and the indexes rebuilt (target >= 200 MB/s);
- compaction MB/s over a log of keyed records;
- the same cleaning on a worker thread, as a node's cleaner runs it: its MB/s and how late the
  event loop wakes meanwhile (p50/p99/max of a 1 ms sleep's lag), without and with the cleaner
  handing the GIL over after every batch.

Prints a table and writes ``bench/results/storage.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcoord.node.log_maintenance import hand_over_the_gil
from kcoord.storage import format as fmt
from kcoord.storage.config import LogConfig
from kcoord.storage.log import Log

MIB = 1024 * 1024
# The records' base timestamp, and the clock every append is given: Kafka 4.0's default
# message.timestamp.after.max.ms refuses records more than an hour ahead of the leader's clock.
NOW_MS = 1_700_000_000_000
SLICE_BYTES = 2 * MIB


def _records(n: int, size: int, rng: random.Random, keys: int | None = None) -> list[fmt.Record]:
    return [
        fmt.Record(
            i,
            NOW_MS + i,
            (f"key-{rng.randrange(keys)}".encode() if keys else None),
            rng.randbytes(size),
        )
        for i in range(n)
    ]


def append_case(
    directory: Path, record_size: int, batch_records: int, total_bytes: int, rng: random.Random
) -> dict[str, Any]:
    """Log appends A/B-interleaved with raw writes, so both see the same disk conditions.

    Alternating slices of ``SLICE_BYTES``: raw ``os.write`` of 1 MiB chunks to one file, raw
    writes of one batch's size to another, and ``append_as_leader`` of the same bytes to the
    log. Each side's time is summed over its slices.
    """
    # A few distinct batches, reused: the broker receives prebuilt batches from producers.
    batches = [fmt.build_batch(_records(batch_records, record_size, rng)) for _ in range(16)]
    batch_bytes = len(batches[0])
    per_slice = max(1, SLICE_BYTES // batch_bytes)
    slices = max(1, total_bytes // (per_slice * batch_bytes))
    log_dir = directory / f"append-{record_size}-{batch_records}"
    lg = Log.open(log_dir, LogConfig())
    chunk = os.urandom(MIB)
    raw_fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    same_fd = os.open(directory / "same.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    append_s = raw_s = same_s = 0.0
    raw_bytes = 0
    ratios: list[float] = []
    same_ratios: list[float] = []
    i = 0
    for _ in range(slices):
        t0 = time.perf_counter()
        written = 0
        while written < per_slice * batch_bytes:
            written += os.write(raw_fd, chunk)
        t1 = time.perf_counter()
        for _ in range(per_slice):
            os.write(same_fd, batches[i % 16])
            i += 1
        t2 = time.perf_counter()
        for _ in range(per_slice):
            lg.append_as_leader(batches[i % 16], leader_epoch=0, now_ms=NOW_MS)
            i += 1
        t3 = time.perf_counter()
        raw_s += t1 - t0
        same_s += t2 - t1
        append_s += t3 - t2
        raw_bytes += written
        slice_bytes = per_slice * batch_bytes
        ratios.append((slice_bytes / (t3 - t2)) / (written / (t1 - t0)))
        same_ratios.append((t2 - t1) / (t3 - t2))
    count = slices * per_slice
    os.close(raw_fd)
    os.close(same_fd)
    lg.close()
    shutil.rmtree(log_dir)
    (directory / "raw.bin").unlink()
    (directory / "same.bin").unlink()
    mb_s = count * batch_bytes / MIB / append_s
    raw = raw_bytes / MIB / raw_s
    same = count * batch_bytes / MIB / same_s
    return {
        "record_bytes": record_size,
        "records_per_batch": batch_records,
        "batch_bytes": batch_bytes,
        "batches": count,
        "mb_s": mb_s,
        "batches_s": count / append_s,
        "records_s": count * batch_records / append_s,
        "raw_sequential_write_mb_s": raw,
        # The figure: the median over slices of (append MB/s / raw MB/s) measured back to back,
        # robust to the kernel's writeback bursts that hit one side of a slice.
        "ratio_to_raw": statistics.median(ratios),
        "ratio_to_raw_p10_p90": [
            statistics.quantiles(ratios, n=10)[0],
            statistics.quantiles(ratios, n=10)[-1],
        ]
        if len(ratios) >= 2
        else [ratios[0], ratios[0]],
        "ratio_of_totals": mb_s / raw,
        "raw_same_size_write_mb_s": same,
        "ratio_to_raw_same_size": statistics.median(same_ratios),
    }


def build_log(directory: Path, total_bytes: int, rng: random.Random) -> Log:
    """A log of 100-record batches of 100 B records (about 13 KiB each), unflushed."""
    batches = [fmt.build_batch(_records(100, 100, rng)) for _ in range(16)]
    lg = Log.open(directory, LogConfig(segment_bytes=256 * MIB))
    i = 0
    while lg.size_bytes < total_bytes:
        lg.append_as_leader(batches[i % 16], leader_epoch=0, now_ms=NOW_MS)
        i += 1
    return lg


def _percentiles_us(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2] * 1e6,
        "p99_us": samples[int(len(samples) * 0.99)] * 1e6,
        "max_us": samples[-1] * 1e6,
        "mean_us": statistics.fmean(samples) * 1e6,
    }


def read_latency(lg: Log, lookups: int, rng: random.Random) -> dict[str, Any]:
    end = lg.log_end_offset
    lookup: list[float] = []
    read: list[float] = []
    for _ in range(lookups):
        offset = rng.randrange(end)
        t0 = time.perf_counter()
        seg = lg.segments[lg._segment_index_for(offset)]
        found = seg.translate_offset(offset)
        t1 = time.perf_counter()
        data = lg.read(offset, 1)
        t2 = time.perf_counter()
        assert found is not None and not data.empty
        lookup.append(t1 - t0)
        read.append(t2 - t1)
    return {"lookups": lookups, "lookup": _percentiles_us(lookup), "read": _percentiles_us(read)}


def recovery_mb_s(directory: Path, total_bytes: int, rng: random.Random) -> dict[str, float]:
    lg = build_log(directory, total_bytes, rng)
    size = lg.size_bytes
    end = lg.log_end_offset
    for seg in lg.segments:
        seg.close()  # no clean shutdown, no recovery point: everything is recovered
    start = time.perf_counter()
    recovered = Log.open(directory, LogConfig(segment_bytes=256 * MIB), recovery_point=0)
    elapsed = time.perf_counter() - start
    assert recovered.log_end_offset == end, (recovered.log_end_offset, end)
    recovered.close()
    shutil.rmtree(directory)
    return {"bytes": size, "seconds": elapsed, "mb_s": size / MIB / elapsed}


def compacted_log(directory: Path, total_bytes: int, rng: random.Random) -> Log:
    """A compacted log of keyed 100 B records, rolled: all of it is cleanable. The keys are
    drawn from 20,000, but the 64 batches repeat, so about 5,500 distinct keys stay."""
    config = LogConfig(segment_bytes=16 * MIB, cleanup_policy=frozenset({"compact"}))
    lg = Log.open(directory, config)
    batches = [fmt.build_batch(_records(100, 100, rng, keys=20_000)) for _ in range(64)]
    i = 0
    while lg.size_bytes < total_bytes:
        lg.append_as_leader(batches[i % 64], leader_epoch=0, now_ms=NOW_MS)
        i += 1
    lg.roll()
    return lg


def compaction_mb_s(directory: Path, total_bytes: int, rng: random.Random) -> dict[str, float]:
    lg = compacted_log(directory, total_bytes, rng)
    start = time.perf_counter()
    stats = lg.compact(now_ms=0)
    elapsed = time.perf_counter() - start
    lg.close()
    shutil.rmtree(directory)
    return {
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "records_read": stats.records_read,
        "records_kept": stats.records_kept,
        "seconds": elapsed,
        "mb_s": stats.bytes_read / MIB / elapsed,
    }


def background_cleaning(
    directory: Path, total_bytes: int, rng: random.Random, *, hand_over: bool
) -> dict[str, float]:
    """Clean a log on a worker thread, as a node's cleaner does, while a task on the event loop
    sleeps 1 ms at a time: how late the loop wakes (its lag) while the thread works, with and
    without the cleaner handing the GIL over after every batch (``hand_over_the_gil``)."""
    lg = compacted_log(directory, total_bytes, rng)
    plan = lg.plan_cleaning(0)
    assert plan is not None

    async def measure() -> tuple[list[float], float]:
        lags: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                before = time.perf_counter()
                await asyncio.sleep(0.001)  # the tick being measured
                lags.append((time.perf_counter() - before - 0.001) * 1e3)

        ticking = asyncio.create_task(ticker())
        start = time.perf_counter()
        pause: Callable[[], object] = hand_over_the_gil if hand_over else (lambda: None)
        result = await asyncio.to_thread(lg.clean, plan, pause)
        elapsed = time.perf_counter() - start
        done.set()
        await ticking
        assert lg.swap_cleaned(result) is not None
        return lags, elapsed

    lags, elapsed = asyncio.run(measure())
    read = sum(seg.size for seg in plan.segments)
    lg.close()
    shutil.rmtree(directory)
    cuts = statistics.quantiles(lags, n=100)
    return {
        "hand_over_the_gil": hand_over,
        "mb_s": read / MIB / elapsed,
        "loop_lag_p50_ms": cuts[49],
        "loop_lag_p99_ms": cuts[98],
        "loop_lag_max_ms": max(lags),
        "ticks": len(lags),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--append-mib", type=int, default=256, help="bytes per append case")
    parser.add_argument("--recovery-mib", type=int, default=1024)
    parser.add_argument("--compaction-mib", type=int, default=64)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results/storage.json"))
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"seed={seed}")
    scratch = Path(tempfile.mkdtemp(prefix="kcoord-bench-", dir=args.dir))
    try:
        appends = []
        raws = []
        for record_size in (100, 1024):
            for batch_records in (1, 100):
                total = args.append_mib * MIB if batch_records > 1 else args.append_mib * MIB // 8
                case = append_case(scratch, record_size, batch_records, total, rng)
                raws.append(case["raw_sequential_write_mb_s"])
                appends.append(case)
                print(
                    f"append {record_size:5d} B x {batch_records:3d}: {case['mb_s']:8.1f} MB/s "
                    f"{case['batches_s']:10.0f} batches/s  raw {raws[-1]:7.1f} MB/s  "
                    f"ratio {case['ratio_to_raw']:.2f} "
                    f"(to same-size raw writes {case['ratio_to_raw_same_size']:.2f})"
                )
        raw = statistics.median(raws)
        lookup_log = build_log(scratch / "lookup", min(256, args.recovery_mib) * MIB, rng)
        latency = read_latency(lookup_log, args.lookups, rng)
        lookup_log.close()
        shutil.rmtree(scratch / "lookup")
        print(
            f"offset lookup p50 {latency['lookup']['p50_us']:.1f} us "
            f"p99 {latency['lookup']['p99_us']:.1f} us; lookup+read p50 "
            f"{latency['read']['p50_us']:.1f} us p99 {latency['read']['p99_us']:.1f} us"
        )
        recovery = recovery_mb_s(scratch / "recovery", args.recovery_mib * MIB, rng)
        print(f"recovery: {recovery['mb_s']:8.1f} MB/s over {recovery['bytes'] / MIB:.0f} MiB")
        compaction = compaction_mb_s(scratch / "compaction", args.compaction_mib * MIB, rng)
        print(
            f"compaction: {compaction['mb_s']:8.1f} MB/s ({compaction['records_kept']} of "
            f"{compaction['records_read']} records kept)"
        )
        background = []
        for hand_over in (False, True):
            case = background_cleaning(
                scratch / "background", args.compaction_mib * MIB, rng, hand_over=hand_over
            )
            background.append(case)
            print(
                f"cleaning on a thread{' (GIL handed over)' if hand_over else ''}: "
                f"{case['mb_s']:6.1f} MB/s; event loop lag p50 {case['loop_lag_p50_ms']:.2f} ms "
                f"p99 {case['loop_lag_p99_ms']:.2f} ms max {case['loop_lag_max_ms']:.0f} ms"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    batch100 = [c for c in appends if c["records_per_batch"] == 100]
    targets = {
        "append_100_record_batches_ratio_min": min(c["ratio_to_raw"] for c in batch100),
        "append_ratio_target": 0.5,
        "recovery_mb_s": recovery["mb_s"],
        "recovery_target_mb_s": 200.0,
        "lookup_p99_us": latency["lookup"]["p99_us"],
        "lookup_p99_target_us": 200.0,
    }
    met = {
        "append": targets["append_100_record_batches_ratio_min"] >= 0.5,
        "recovery": recovery["mb_s"] >= 200.0,
        "lookup": latency["lookup"]["p99_us"] < 200.0,
    }
    result = {
        "benchmark": "storage",
        "seed": seed,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "raw_sequential_write_mb_s": raw,
        "append": appends,
        "read_latency": latency,
        "recovery": recovery,
        "compaction": compaction,
        "background_cleaning": background,
        "targets": targets,
        "targets_met": met,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"targets met: {met}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
