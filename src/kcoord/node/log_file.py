"""A node's log file, rolled by size: ``kcoord node --log-file``.

Kafka writes ``server.log`` through a log4j rolling appender; the local cluster's nodes write
``node-<id>/node.log`` the same way, rolled to ``node.log.1`` (the newest) to ``node.log.N``
once it passes a size, the oldest dropped. The interpreter's own output (an uncaught
traceback, ``faulthandler``, a stray print) goes to standard output and error, which follow the
current file: after every roll they are pointed at the new one, so nothing lands in a file
already rolled away, and nothing is written past the bound but those lines.
"""

from __future__ import annotations

import contextlib
import io
import logging
import logging.handlers
import os
import sys
from pathlib import Path

# log4j 1's RollingFileAppender bounds a file by MaxFileSize and keeps MaxBackupIndex files;
# Kafka's shipped configuration rolls server.log by the hour and keeps every file. Here a
# node's logs take at most (1 + backups) x max bytes.
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5


class _RollingFile(logging.handlers.RotatingFileHandler):
    """A size-rolled file that standard output and error follow (see the module docstring)."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        # backslashreplace, as standard error writes them: a name decoded with surrogateescape
        # (a record header key, a file name of the data directory) must not lose its line.
        super().__init__(
            path,
            maxBytes=max_bytes,
            backupCount=backups,
            encoding="utf-8",
            errors="backslashreplace",
        )

    def _open(self) -> io.TextIOWrapper:
        # Every (re)open, in the constructor, a roll, or an emit after a failed roll.
        stream = super()._open()
        for std in (sys.stdout, sys.stderr):
            if std is not None:
                with contextlib.suppress(OSError, ValueError):
                    std.flush()
        fd = stream.fileno()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        return stream


def configure(path: Path, level: int, fmt: str, max_bytes: int, backups: int) -> None:
    """Log to ``path``, rolled at ``max_bytes`` with ``backups`` older files kept."""
    if max_bytes <= 0 or backups < 1:
        raise ValueError("the log file needs a positive size and at least one backup")
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = _RollingFile(path, max_bytes, backups)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(handler)
