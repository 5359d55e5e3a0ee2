"""A data directory's identity and its lock: ``meta.properties`` and ``.lock``, as Kafka's.

A node owns its data directory (partition logs and the metadata journal) for as long as it
runs, by an exclusive ``flock`` on ``<data dir>/.lock`` (Kafka's ``LogManager.lockLogDirs``):
a second process given the same directory, by a copied config or a typo, fails to start
instead of both appending to the same logs and journal, each handing out offsets the other
already acknowledged. The lock goes with the process, however it ends.

``meta.properties`` (Kafka's ``MetaProperties``, version 1, Java properties text) records
whose directory it is: ``node.id`` from the first start on, and ``cluster.id`` once the node
has learned it. A start with another ``node.id`` is refused (the node would take every log
assigned to the old id for a stray and delete it), and so is one whose configured
``cluster.id`` is not the stored one (another cluster's directory: its metadata journal would
take over this cluster's quorum). The cluster id itself lives in the replicated metadata
image (``raft/records.py``, ``ClusterId``); the file only remembers it for these checks.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from kcoord.storage import checkpoint

META_PROPERTIES_FILE: Final = "meta.properties"
LOCK_FILE: Final = ".lock"
META_VERSION: Final = "1"
# Files of the directory itself, not data: a directory holding only these holds no data.
IDENTITY_FILES: Final = frozenset({META_PROPERTIES_FILE, LOCK_FILE})


class DataDirError(Exception):
    """The data directory is not this node's to use (locked, or another node's or cluster's)."""


class DataDirLock:
    """An exclusive ``flock`` on ``<data dir>/.lock``, held until ``release`` or exit."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Create the directory if needed and lock it; ``DataDirError`` if another process
        holds it (Kafka's message), ``OSError`` if it cannot be created or opened."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirError(
                f"Failed to acquire lock on file {LOCK_FILE} in {data_dir}. A kcoord node in "
                "another process is using this directory."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` lines; ``#`` and ``!`` start comments (the subset of Java's
    ``Properties`` format that ``meta.properties`` uses)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not a key=value line: {raw!r}")
        out[key.strip()] = value.strip()
    return out


def read_meta_properties(data_dir: Path) -> dict[str, str] | None:
    """The directory's ``meta.properties``, or None if it has none; ``DataDirError`` if it
    cannot be read as one (Kafka refuses to start then too)."""
    path = data_dir / META_PROPERTIES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DataDirError(f"cannot read {path}: {e}") from e
    try:
        props = parse_properties(text)
    except ValueError as e:
        raise DataDirError(f"{path} is not a properties file: {e}") from e
    if props.get("version") != META_VERSION:
        raise DataDirError(f"{path}: unsupported version {props.get('version')!r}")
    return props


def write_meta_properties(data_dir: Path, props: Mapping[str, str]) -> None:
    """Write atomically: a temporary file, fsync, rename, fsync of the directory."""
    lines = ["#", "# Written by kcoord: this directory's node and cluster (do not edit)."]
    lines += [f"{key}={value}" for key, value in sorted(props.items())]
    checkpoint.write_atomically(data_dir / META_PROPERTIES_FILE, "\n".join(lines) + "\n")


def claim(data_dir: Path, node_id: int, cluster_id: str | None) -> str:
    """Check the directory is this node's (Kafka's ``MetaPropertiesEnsemble.verify``) and
    record ``node.id`` if it is new. ``cluster_id`` is the configured one, if any. Returns the
    cluster id, configured or recorded: ``DataDirError`` if there is neither, before anything
    is written (Kafka's broker does not start on a directory ``kafka-storage.sh format`` has
    not given a cluster id; the metadata quorum needs it to refuse another cluster's voters).
    Call with the directory locked."""
    props = read_meta_properties(data_dir)
    if props is None:
        if cluster_id is None:
            raise _no_cluster_id(data_dir)
        props = {"version": META_VERSION, "node.id": str(node_id), "cluster.id": cluster_id}
        write_meta_properties(data_dir, props)
        return cluster_id
    stored_node = props.get("node.id")
    if stored_node != str(node_id):
        raise DataDirError(
            f"Stored node id {stored_node} doesn't match previous node id {node_id} in "
            f"{data_dir / META_PROPERTIES_FILE}. If you moved your data, make sure your "
            "configured node id matches. If you intend to create a new node, you should "
            "remove all data in your data directories."
        )
    stored_cluster = props.get("cluster.id")
    if cluster_id is not None and stored_cluster is not None and stored_cluster != cluster_id:
        raise DataDirError(
            f"Invalid cluster.id in: {data_dir / META_PROPERTIES_FILE}. Expected {cluster_id}, "
            f"but read {stored_cluster}"
        )
    if stored_cluster is None:
        if cluster_id is None:
            raise _no_cluster_id(data_dir)
        write_meta_properties(data_dir, {**props, "cluster.id": cluster_id})
        return cluster_id
    return stored_cluster


def _no_cluster_id(data_dir: Path) -> DataDirError:
    return DataDirError(
        f"No cluster id for {data_dir}: configure cluster.id, the same on every node of the "
        "cluster, as kafka-storage.sh format --cluster-id gives a Kafka broker's directory "
        "its id. `kcoord cluster up` chooses one for a new cluster; a cluster that runs "
        "already names its own in GET /api/v1/cluster on any of its nodes' admin listener"
    )


def check_learned_cluster_id(data_dir: Path, learned: str, configured: str | None) -> None:
    """Remember the cluster id the node learned from the metadata image; ``DataDirError`` if
    it is not the configured one, or the directory already belongs to another cluster."""
    if configured is not None and learned != configured:
        raise DataDirError(
            f"The metadata quorum's cluster id is {learned}, but this node is configured with "
            f"cluster.id {configured}: its controller.quorum.voters or its data directory "
            f"({data_dir}) belong to another cluster"
        )
    props = read_meta_properties(data_dir)
    if props is None:
        raise DataDirError(f"{data_dir / META_PROPERTIES_FILE} is gone")
    stored = props.get("cluster.id")
    if stored == learned:
        return
    if stored is not None:
        raise DataDirError(
            f"Invalid cluster.id in: {data_dir / META_PROPERTIES_FILE}. Expected {learned} "
            f"(the metadata quorum's), but read {stored}"
        )
    write_meta_properties(data_dir, {**props, "cluster.id": learned})
