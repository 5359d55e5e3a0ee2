"""A writer that appends batches to a log forever, printing each acknowledged append.

Run by ``test_storage_crash.py``, which SIGKILLs it at random points. Each line printed is
``first_offset last_offset crc``, written only after ``append_as_leader`` returned.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from kcoord.storage import format as fmt
from kcoord.storage.config import LogConfig
from kcoord.storage.manager import LogManager

CONFIG = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=512)


def main() -> None:
    data_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    mgr = LogManager(data_dir, CONFIG)
    mgr.open()
    lg = mgr.get_or_create_log(("crash", 0), CONFIG)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    n = 0
    while True:
        count = rng.randint(1, 20)
        records = [
            fmt.Record(i, 1_000 + i, rng.randbytes(8), rng.randbytes(rng.randint(0, 3000)))
            for i in range(count)
        ]
        batch = fmt.build_batch(records)
        info = lg.append_as_leader(batch, leader_epoch=seed, now_ms=0)
        # The CRC does not cover the base offset and epoch the log rewrote.
        out.write(f"{info.first_offset} {info.last_offset} {fmt.parse_header(batch).crc}\n")
        out.flush()
        n += 1
        if n % 50 == 0:
            mgr.checkpoint_recovery_points()


if __name__ == "__main__":
    main()
