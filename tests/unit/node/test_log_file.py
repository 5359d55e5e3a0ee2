"""A node's log file rolls by size, keeps a bounded number of files, and the interpreter's own
output (a traceback, a print to standard error) follows the current file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

MAX_BYTES = 2000
BACKUPS = 2

# Run in a child: the module points the process's standard output and error at the file.
CHILD = textwrap.dedent(
    """
    import logging, sys
    from pathlib import Path
    from kcoord.node import log_file

    path = Path(sys.argv[1])
    log_file.configure(path, logging.INFO, "%(levelname)s %(message)s", {max_bytes}, {backups})
    log = logging.getLogger("child")
    for i in range(200):
        log.info("line %03d %s", i, "x" * 40)
        if i == 100:
            print("a print to stderr after some rolls", file=sys.stderr)
    name = b"k\\xff".decode("utf-8", "surrogateescape")
    log.warning("a name decoded with surrogateescape: %s", name)
    # A roll whose reopen fails once (no room for the new file): the next record reopens it,
    # and the standard streams follow it there too.
    real_open = logging.FileHandler._open
    failures = [OSError(28, "No space left on device")]

    def failing_open(self):
        if failures:
            raise failures.pop()
        return real_open(self)

    logging.FileHandler._open = failing_open
    i = 0
    while failures:  # up to the roll that fails
        log.info("before %03d %s", i, "y" * 40)
        i += 1
    for i in range(3):  # a few lines into the reopened file: no roll puts things right
        log.info("after %03d %s", i, "y" * 40)
    print("a print to stdout at the end")
    raise RuntimeError("the uncaught end")
    """
).format(max_bytes=MAX_BYTES, backups=BACKUPS)


def test_rolls_by_size_and_std_streams_follow(tmp_path: Path) -> None:
    path = tmp_path / "node.log"
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == result.stderr == ""  # all of it went to the file
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["node.log", "node.log.1", "node.log.2"]
    for name in files:
        # Bounded: a roll happens before a line would take the file past the size; what the
        # interpreter writes itself (a traceback, logging's report of its failed reopen) may
        # go past it.
        text = (tmp_path / name).read_text()
        if name != "node.log" and "Traceback" not in text:
            assert len(text.encode()) <= MAX_BYTES
    current = path.read_text()
    assert "after 002" in current
    everything = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "a name decoded with surrogateescape: k\\udcff" in everything
    assert "No space left on device" in everything  # the failed reopen was reached
    assert "a print to stdout at the end" in current
    assert "RuntimeError: the uncaught end" in current
    rolled = (tmp_path / "node.log.1").read_text() + (tmp_path / "node.log.2").read_text()
    assert "the uncaught end" not in rolled


def test_a_log_file_without_room_is_refused(tmp_path: Path) -> None:
    config, data = tmp_path / "node.toml", tmp_path / "data"
    config.write_text(
        f'"node.id" = 1\n"controller.quorum.voters" = "1@127.0.0.1:9094"\n"data.dir" = "{data}"\n'
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kcoord.node.cli",
            "node",
            "--config",
            str(config),
            "--log-file",
            str(tmp_path / "node.log"),
            "--log-file-backups",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert "cannot log to" in result.stderr
    assert not data.exists()  # refused before the node touched anything
