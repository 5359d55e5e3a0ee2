"""Producer ids for InitProducerId, allocated by each node alone (Kafka's ``ProducerIdManager``).

Kafka's brokers lease blocks of producer ids from the controller (KIP-730). A kcoord node
allocates them itself, so InitProducerId never waits on the metadata quorum, and ids of
different nodes never collide by construction::

    producer id = node bits << 48 | counter        (a non-negative int64)

- node bits: the node id, 15 bits (node ids 0..32767; a larger id is taken modulo 2^15, and
  the node config refuses voters whose ids are equal modulo 2^15, every node being a voter).
- counter: 48 bits, never reused by the node. It is reserved in blocks of ``block_size``: the
  end of the current block is written to ``<data dir>/producer-id-block`` (atomically, fsynced)
  before any id of the block is handed out, and a restarted node continues after it, so a crash
  skips at most one block. The counter also never starts below ``16 * wall-clock ms``, which
  keeps ids unique if the data directory is lost, as long as a node handed out fewer than 16
  ids per millisecond on average (the 48 bits last until the year 2527 at that rate).

The file holds two lines: the format version (0) and the end of the reserved block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from kcoord.storage import checkpoint

log = logging.getLogger(__name__)

FILE_NAME: Final = "producer-id-block"
NODE_BITS: Final = 15
COUNTER_BITS: Final = 48
IDS_PER_MS: Final = 16
DEFAULT_BLOCK_SIZE: Final = 1000
_VERSION: Final = 0


class ProducerIdsExhaustedError(Exception):
    pass


class ProducerIdManager:
    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        now_ms: Callable[[], int],
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        assert node_id >= 0 and block_size > 0
        if node_id >= 1 << NODE_BITS:
            log.warning(
                "node id %d does not fit the %d bits of producer ids: ids may collide with node %d",
                node_id,
                NODE_BITS,
                node_id % (1 << NODE_BITS),
            )
        self.prefix = (node_id % (1 << NODE_BITS)) << COUNTER_BITS
        self.path = data_dir / FILE_NAME
        self.block_size = block_size
        self._next = max(self._read_block_end(), now_ms() * IDS_PER_MS)
        self._block_end = self._next  # nothing reserved in this incarnation yet

    def _read_block_end(self) -> int:
        try:
            lines = self.path.read_text().split()
        except FileNotFoundError:
            return 0
        except OSError as e:
            log.warning("cannot read %s, producer ids restart from the clock: %s", self.path, e)
            return 0
        if len(lines) != 2 or lines[0] != str(_VERSION) or not lines[1].isdigit():
            log.warning("ignoring malformed %s: producer ids restart from the clock", self.path)
            return 0
        return int(lines[1])

    def next_id(self) -> int:
        """A producer id no node of the cluster has handed out before."""
        if self._next >= self._block_end:
            end = self._next + self.block_size
            if end > 1 << COUNTER_BITS:
                raise ProducerIdsExhaustedError(f"the {COUNTER_BITS}-bit counter is exhausted")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.write_atomically(self.path, f"{_VERSION}\n{end}\n")
            self._block_end = end
        counter = self._next
        self._next += 1
        assert counter < self._block_end
        return self.prefix | counter
