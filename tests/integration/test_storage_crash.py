"""Crash recovery: a writer process is SIGKILLed at random points; nothing acknowledged is lost."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kcoord.storage import format as fmt
from kcoord.storage.manager import LogManager
from tests.integration.crash_writer import CONFIG

KILLS = 24


@pytest.mark.integration
def test_sigkill_never_loses_an_acknowledged_batch(tmp_path: Path) -> None:
    seed = int(os.environ.get("TEST_SEED", random.randrange(2**32)))
    print(f"seed={seed} (replay with TEST_SEED={seed})")
    rng = random.Random(seed)
    acked: dict[int, tuple[int, int]] = {}  # first offset -> (last offset, crc)
    root = Path(__file__).resolve().parents[2]
    for round_ in range(KILLS):
        with subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.crash_writer",
                str(tmp_path),
                str(rng.randrange(2**31)),
            ],
            stdout=subprocess.PIPE,
            cwd=root,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            try:
                assert proc.stdout.readline() == "ready\n"
                for _ in range(rng.randint(0, 400)):
                    first, last, crc = map(int, proc.stdout.readline().split())
                    acked[first] = (last, crc)
            finally:
                proc.send_signal(signal.SIGKILL)
                # Lines already written before the kill were acknowledged as well.
                for line in proc.stdout:
                    parts = line.split()
                    if len(parts) == 3:
                        first, last, crc = map(int, parts)
                        acked[first] = (last, crc)
        mgr = LogManager(tmp_path, CONFIG)
        mgr.open()
        lg = mgr.logs[("crash", 0)]
        found: dict[int, tuple[int, int]] = {}
        for seg in lg.segments:
            raw = seg.read_at(0, seg.size)
            end = 0
            for pos, header in fmt.iter_headers(raw):  # raises unless the log ends on a batch
                assert fmt.is_crc_valid(raw, pos, header)
                found[header.base_offset] = (header.last_offset, header.crc)
                end = pos + header.size
            assert end == seg.size == len(raw)
        missing = {k: v for k, v in acked.items() if found.get(k) != v}
        assert not missing, f"round {round_}, seed {seed}: lost acknowledged batches {missing}"
        # A writer killed before its first append leaves an empty log.
        assert lg.log_end_offset == max((last for last, _ in found.values()), default=-1) + 1
        if round_ % 3 == 0:
            mgr.shutdown()  # sometimes a clean stop between crashes
        else:
            mgr.close()
    assert len(acked) > KILLS
