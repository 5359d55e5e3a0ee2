"""What a node does when its data directory fails: it halts (Kafka's ``LogDirFailureChannel``).

A write to the data directory that raises ``OSError`` -- a full disk (ENOSPC), an I/O error
(EIO), a file system remounted read-only, too many open files -- means the node can no longer
keep what it acknowledges. Kafka hands such an ``IOException`` to its ``LogDirFailureChannel``;
``LogManager.handleLogDirFailure`` then stops serving the directory's logs, and when no log
directory is left (a node has one) it logs "Shutdown broker because all log dirs in ... have
failed" and halts the JVM with exit code 1, without a controlled shutdown.

kcoord does the same (``fail``): it logs Kafka's two lines and leaves at once with exit code 1.
Going on would be worse: a leader whose appends fail keeps its partitions unavailable, since
the controller sees a live broker and moves nothing; a follower that cannot append stays out
of the ISR; and a clean shutdown would write checkpoints over a directory that failed. After
the halt the controller fences the node when its broker session expires and other replicas
take its leaderships; a producer's retries reach them, and idempotence (``storage/
producer_state``) keeps a retry of a batch that did replicate from being appended twice. A
torn batch the halt leaves at a log's end is cut off by recovery when the node is started
again, once the disk has room.

A read of a partition's log that raises ``OSError`` halts the node too (``LocalLog.read``'s
``maybeHandleIOException``; ``ReplicaManager._reading``), as does the replay that loads a group
coordinator shard, whose groups are otherwise served by no one until another replica leads.
A corrupt batch is never a directory failure: it answers ``KAFKA_STORAGE_ERROR`` for its
partition alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

EXIT_CODE: Final = 1  # Kafka's Exit.halt(1)


class LogDirFailureChannel:
    """Reports a failed data directory; see the module docstring.

    ``halt`` is ``os._exit`` on a node. ``None`` (unit tests of the parts that report) only
    logs and returns, so the caller goes on to answer its error.
    """

    def __init__(
        self, log_dir: Path | str, halt: Callable[[int], object] | None = os._exit
    ) -> None:
        self.log_dir = str(log_dir)
        self.halt = halt

    def fail(self, what: str, error: OSError) -> None:
        """``what`` failed with ``error``: halt (``LogManager.handleLogDirFailure``)."""
        log.warning("Stopping serving logs in dir %s (%s: %s)", self.log_dir, what, error)
        log.critical("Shutdown node because all log dirs in %s have failed", self.log_dir)
        if self.halt is None:
            return
        for handler in logging.getLogger().handlers:
            handler.flush()  # os._exit does not flush; the lines above are the operator's clue
        self.halt(EXIT_CODE)
