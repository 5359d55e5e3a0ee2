"""The metadata quorum on pysyncobj: the only module that imports it.

Theory of operation
-------------------
pysyncobj runs Raft in its own thread (``autoTick``). Every voter listed in
``controller.quorum.voters`` is a pysyncobj node; the Raft leader is the active controller
(KIP-631), the Raft term is the controller epoch, and the Raft log index of a command is its
**metadata offset**.

There is one kind of replicated command: a batch of metadata records, encoded by us as
``b"\\x00" + msgpack([FORMAT_VERSION, controller epoch, [record bytes, ...]])`` (record bytes
from ``records.encode``). The records of one batch apply atomically
(``MetadataImage.apply_batch``), like a KRaft record batch, so a topic and its partitions
appear together. A batch applies only in the Raft term it names: pysyncobj hands a command
proposed on a voter that is not the leader to the leader, which appends it in its own term, so
a deposed controller that has not noticed yet (its duties run on the image it last had) would
have its decisions committed by its successor; KRaft's leader appends only its own records, in
its epoch. Such a batch is skipped on every voter alike (``_apply_command_bytes``).

We bypass pysyncobj's ``@replicated`` decorator because it pickles the call: commands reach the
journal as our bytes, and ``_apply_command_bytes`` decodes them with our codec. pysyncobj's
transport still pickles its own messages between voters, and unpickled whatever reached the
quorum port: one frame from anyone who could connect ran code in the node. Its messages are
plain data (dicts, lists, tuples, strings, numbers; at its pickle protocol 2, bytes come as
``_codecs.encode`` except the empty string, which is ``__builtin__.bytes`` called with nothing,
and sets as ``__builtin__.set``), so ``_PlainDataPickle`` replaces the ``pickle`` its transport
and its ``SyncObj`` call: its own ``dumps``, and a ``loads`` that resolves no other global (and
lets ``bytes`` make only the empty string: ``bytes(n)`` would allocate whatever a frame asked
for). A frame naming any other is refused (logged; pysyncobj closes that connection) before
anything runs. The empty string is not rare: it is the last part of every snapshot the leader
sends to a voter that is behind its log start, so refusing it kept such a voter out of the
quorum for good. The port is still unauthenticated, so it must only be reachable by the voters
(bind it to a private address), as with any pysyncobj deployment.

Applying never raises: a batch that does not decode or does not fit the image is logged and
skipped, and since every voter applies the same bytes in the same order, every voter skips it
the same way. The thread keeps its own ``MetadataImage`` (the state pysyncobj snapshots) and
hands every committed batch to the ``QuorumListener`` in offset order; the node hands those on
to its event loop with ``loop.call_soon_threadsafe`` and applies them to its own image there.
The event loop never blocks on Raft: ``propose`` only enqueues.

Files, in ``<data>/__cluster_metadata/``: ``journal`` (pysyncobj's file journal of raw command
bytes) and ``snapshot`` (written by ``_write_snapshot``: msgpack of the image as records plus the
two Raft entries pysyncobj keeps with it, under a CRC-32C since version 2), written to a
temporary file and renamed into place. The Raft thread only copies the image; a writer thread
encodes and syncs it (``_serialize_in_background``), as Kafka's ``SnapshotGenerator`` writes
from an immutable image off the Raft IO thread: written on the Raft thread, a snapshot of
50,000 partitions sent no AppendEntries for 1.3 s, and the followers elected another leader
every few minutes. A snapshot that does not load (damaged, or written by a
newer build) halts the node, as a Kafka controller's fatal fault handler does: pysyncobj only
logged it, and the voter then applied nothing, ever, though it could lead the quorum.
pysyncobj synced none of them; ``_DurableJournal`` syncs the journal before a voter sends any
message (so before it acknowledges an entry or votes), the term and vote before they are used,
and a snapshot before the journal is trimmed to it, as KRaft flushes its log.

A voter takes an AppendEntries as Raft's receiver rule says, deleting log entries only from
the first one that conflicts with the leader's; pysyncobj's handler deletes every entry after
``prevLogIdx``, equal ones too, so a leader's resend from an older index (after a connection
reset) made voters drop entries they had acknowledged and applied.
``_MetadataSyncObj._without_entries_we_hold`` rewrites the message before pysyncobj sees it.
pysyncobj's follower also set its commit index to min(leader's commit index, its log end) on
the parts of a snapshot, which verify nothing of its log: a deposed leader so applied entries
it had appended but never committed. Those parts carry no higher commit index than the
voter's now (``_snapshot_part_committing_nothing``). And it installed a snapshot that ended
before its own commit index (sent after a stale reply), forgetting committed entries, or at an
entry it held, dropping the acknowledged entries after it; such a snapshot is ignored
(``_stale_snapshot_ignored``), as etcd's raft and Raft's InstallSnapshot rule do.

Elections: pysyncobj's voter raised its term whenever its election timer ran out, also cut off
from the others, and on its return deposed a working leader. It now asks first (pre-vote,
KIP-996: ``_pre_vote_or_elect``) and stands only once a majority would vote for it; a voter
that heard from its leader lately refuses. A voter whose term is above the leader's answers
its AppendEntries with that term (``_tell_newer_term``), as Kafka's does, so it is never left
out. These are messages of our own between voters: a voter of an older build ignores them.

Its election deadline is on pysyncobj's own clock (``CLOCK_MONOTONIC_RAW``), so the pre-vote
reads and sets it on that clock (``raft_clock``): ``time.monotonic`` (``CLOCK_MONOTONIC``) is
slewed by NTP, and the two drift apart by every correction; by more than an election timeout,
a follower dropped its leader on every tick, or pysyncobj stood before the pre-vote asked.

Timing: pysyncobj's defaults suit a LAN database, not a controller. ``leaderFallbackTimeout``
(default 30 s) is how long an isolated leader keeps believing it leads; we use 1.5 s, under the
3 s broker session timeout, so an isolated controller steps down before it could fence anyone.
``connectionRetryTime`` (5 s) becomes 1 s so a restarted voter is reconnected quickly.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hmac
import io
import logging
import math
import os
import pickle
import reprlib
import secrets
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol

import crc32c
import msgpack  # type: ignore[import-untyped, unused-ignore]
import pysyncobj.config
import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport
from pysyncobj.utility import TcpUtility, UtilityException

from kcoord.raft import records as rec
from kcoord.raft.image import MetadataApplyError, MetadataImage
from kcoord.storage import checkpoint

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: [1, [record bytes...]], without the epoch (still read)
_REGULAR = b"\x00"  # pysyncobj's _COMMAND_TYPE.REGULAR
SNAPSHOT_VERSION = 2  # 1: the body alone, without the CRC-32C (still read)
SNAPSHOT_FILE = "snapshot"
_SNAPSHOT_WRITING_SUFFIX: Final = ".writing"  # the writer thread's file, until it is renamed
SNAPSHOT_WRITER_JOIN_S: Final = 5.0
HALT_EXIT_CODE = 1
STATUS_READS = 3  # status(): tries at reading the leadership and term of one moment, and the status


def _empty_bytes(*args: object) -> bytes:
    if args:
        raise pickle.UnpicklingError("bytes(...) with arguments is not plain data")
    return b""


# What pysyncobj's own messages need resolved at its pickle protocol 2 (see the docstring).
# Protocol 2 names Python 2's module for builtins; find_class sees that name.
_PLAIN_DATA_GLOBALS: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): codecs.encode,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("__builtin__", "bytes"): _empty_bytes,
}


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN_DATA_GLOBALS:
            return _PLAIN_DATA_GLOBALS[module, name]
        log.warning("quorum: refused a message that names %s.%s (not plain data)", module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


class _PlainDataPickle:
    """The ``pickle`` pysyncobj's transport and SyncObj see (see the module docstring)."""

    dumps = staticmethod(pysyncobj.pickle.dumps)

    @staticmethod
    def loads(data: bytes) -> Any:
        return _PlainDataUnpickler(io.BytesIO(data)).load()


pysyncobj.tcp_connection.pickle = _PlainDataPickle
pysyncobj.syncobj.pickle = _PlainDataPickle


# The most a message on the quorum port may take, framed and inflated (the RPC port's frame
# limit): pysyncobj sends an entry past 64 KiB in parts when it goes alone, and a metadata
# batch (at most MAX_PARTITIONS_PER_REQUEST partitions) is a few MiB; ``propose`` refuses a
# larger one, which no voter would take. pysyncobj itself bounded neither: a frame may
# claim 2 GiB, read into a buffer it copied whole on every read (128 MiB so sent held the
# Raft thread for minutes), and 509 KiB of zlib inflated to 1 GiB.
MAX_QUORUM_MESSAGE_BYTES = 64 * 1024 * 1024


class BatchTooLargeError(ValueError):
    """A metadata batch too large for any voter to take: refused by ``propose`` at once, and
    it would be refused again however often the same decision is retried."""


# The most parts one entry comes in: pysyncobj cuts it in appendEntriesBatchSizeBytes (64 KiB),
# so an entry of MAX_QUORUM_MESSAGE_BYTES is 1024; empty parts, which pysyncobj never sends,
# counted nothing against the byte bound.
MAX_ENTRY_PARTS = 4096
# A quorum listener that keeps failing (see _VotersOnlyTransport) is said once a minute.
LISTENER_FAILURE_LOG_EVERY_S = 60.0
_FRAME_SIZE = struct.Struct("i")  # pysyncobj's length prefix, native order


class _BoundedZlib:
    """The ``zlib`` pysyncobj's transport sees: inflating stops past the bound (an error,
    which closes that connection)."""

    compress = staticmethod(zlib.compress)

    @staticmethod
    def decompress(data: bytes) -> bytes:
        inflater = zlib.decompressobj()
        inflated = inflater.decompress(data, MAX_QUORUM_MESSAGE_BYTES + 1)
        if len(inflated) > MAX_QUORUM_MESSAGE_BYTES or not inflater.eof:
            log.warning(
                "quorum: closing a connection whose message inflates past %d bytes or is cut",
                MAX_QUORUM_MESSAGE_BYTES,
            )
            raise ValueError("quorum message too large when inflated, or truncated")
        return inflated


def _read_bounded(conn: Any) -> bool:
    """pysyncobj's ``TcpConnection.__processRead`` (one ``recv`` into the read buffer; whether
    to read again), into a ``bytearray`` (pysyncobj added to ``bytes``, copying the whole
    buffer at every read) and refusing a frame that claims more than
    ``MAX_QUORUM_MESSAGE_BYTES`` (logged, that connection closed). Once a message's worth is
    buffered it stops, so that what is buffered is parsed (and the next frame's size checked)
    before more is read."""
    try:
        incoming = conn._TcpConnection__socket.recv(conn._TcpConnection__recvBufferSize)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            conn.disconnect()
        return False
    if conn._TcpConnection__socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or not incoming:
        conn.disconnect()
        return False
    buffer = conn._TcpConnection__readBuffer
    if not isinstance(buffer, bytearray):
        buffer = conn._TcpConnection__readBuffer = bytearray(buffer)
    buffer += incoming
    if len(buffer) >= _FRAME_SIZE.size:
        (claimed,) = _FRAME_SIZE.unpack_from(buffer)
        if not 0 <= claimed <= MAX_QUORUM_MESSAGE_BYTES:
            log.warning(
                "quorum: closing a connection whose message claims %d bytes (at most %d)",
                claimed,
                MAX_QUORUM_MESSAGE_BYTES,
            )
            conn.disconnect()
            return False
        if len(buffer) >= _FRAME_SIZE.size + claimed:
            return False  # a whole message: parsed before more is read
    return True


pysyncobj.tcp_connection.zlib = _BoundedZlib
pysyncobj.tcp_connection.TcpConnection._TcpConnection__processRead = _read_bounded


class _ClosingSerializer(pysyncobj.serializer.Serializer):  # type: ignore[misc]
    """pysyncobj 0.3.17 forgets, without closing it, the snapshot file it sent a voter once the
    last part is out; this closes it then (the transmissions dict is name-mangled)."""

    def getTransmissionData(self, transmission_id: Any) -> Any:  # noqa: N802 (pysyncobj's)
        transmission = self._Serializer__transmissions.get(transmission_id)
        data = super().getTransmissionData(transmission_id)
        if transmission is not None and transmission_id not in self._Serializer__transmissions:
            file = transmission.get("file")
            if file is not None:
                file.close()
        return data

    def setTransmissionData(self, data: Any) -> bool:  # noqa: N802 (pysyncobj's)
        """A part of the snapshot the leader sends; the last one's file is synced before
        pysyncobj renames it over the snapshot (which it did unsynced: a power loss could
        leave an empty snapshot behind a journal already trimmed to it)."""
        if (
            self._Serializer__fileName is None
            or not isinstance(data, list | tuple)
            or len(data) != 3
            or not data[2]
        ):
            return bool(super().setTransmissionData(data))
        part, is_first, _ = data
        if not super().setTransmissionData((part, is_first, False)):
            file = self._Serializer__incomingTransmissionFile
            if file is not None:
                try:
                    file.flush()
                    os.fsync(file.fileno())
                except OSError as e:
                    _halt_on_storage_error("syncing a snapshot from the leader", e)
        return bool(super().setTransmissionData((b"", False, True)))

    def forget_transmissions(self) -> None:
        """Close and forget the snapshots being sent: a new one is in place (pysyncobj does
        this itself on a serialization's success only when it has no serializeChecker)."""
        transmissions = self._Serializer__transmissions
        for transmission in transmissions.values():
            file = transmission.get("file")
            if file is not None:
                file.close()
        transmissions.clear()

    def drop_incoming(self) -> None:
        """Forget the snapshot a voter is receiving (its parts so far, in a temporary file)."""
        file: io.BufferedWriter | None
        file = self._Serializer__incomingTransmissionFile  # type: ignore[has-type]
        self._Serializer__incomingTransmissionFile = None
        if file is not None:
            file.close()
            with contextlib.suppress(OSError):
                Path(file.name).unlink()


pysyncobj.syncobj.Serializer = _ClosingSerializer


class QuorumListener(Protocol):
    """Called from the Raft thread; implementations must only hand work to their own thread."""

    def on_committed(self, offset: int, records: list[rec.MetadataRecord]) -> None: ...

    def on_snapshot_loaded(
        self, offset: int, records: list[rec.MetadataRecord], image: MetadataImage
    ) -> None:
        """``image``: the snapshot's image, parsed, the listener's own (a copy)."""

    def on_state_changed(self) -> None: ...


@dataclass(frozen=True, slots=True)
class QuorumTiming:
    raft_min_timeout_s: float = 0.4
    raft_max_timeout_s: float = 1.4
    append_entries_period_s: float = 0.1
    leader_fallback_timeout_s: float = 1.5
    connection_retry_s: float = 1.0
    connection_timeout_s: float = 2.0
    log_compaction_min_entries: int = 5000
    log_compaction_min_time_s: float = 300


@dataclass(frozen=True, slots=True)
class Voter:
    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    node_id: int
    is_leader: bool
    leader_id: int | None
    epoch: int
    commit_index: int
    last_applied: int
    log_size: int
    # For the leader: each other voter's match index (the offset it has replicated).
    follower_match_index: dict[int, int] = field(default_factory=dict)
    # The voters this node is connected to.
    connected: frozenset[int] = frozenset()


# The utility commands a connection may send instead of naming itself: ``transfer`` is how
# ``MetadataQuorum.resign`` hands the leadership on, ``status`` is read-only. Membership and
# code-version changes are not ours to take from a socket (membership is fixed by config).
# Each ends with the secret of the process that runs the voter (``utility_secret``), which
# only it knows: a stranger on the port moved the leadership at will.
_UTILITY_COMMANDS = frozenset({"status", "transfer"})


def _halt_on_storage_error(what: str, error: OSError) -> NoReturn:
    """A sync of the metadata log failed: halt. After a failed fsync the kernel may have
    dropped the dirty pages and reports the error once, so a retry "succeeds" without the
    data; a voter going on would acknowledge entries it does not hold (Kafka halts when its
    metadata log directory fails)."""
    _halt("quorum: %s failed (%s): halting", what, error)


def _halt_on_snapshot_error(error: BaseException) -> NoReturn:
    """A metadata snapshot did not load: halt (Kafka's controller stops on its fatal fault
    handler when it cannot load a snapshot). pysyncobj logs the error and goes on with a
    state that applies nothing: the voter's image stays empty, its broker stays fenced, and
    as the quorum's leader it never activates a controller."""
    _halt("quorum: the metadata snapshot cannot be loaded (%s): halting", error)


def _halt_on_apply_error(offset: int, error: BaseException) -> NoReturn:
    """A committed batch raised something other than the refusals the image reports (a replay
    bug): halt, as Kafka's raft IO thread and controller replay go to their fatal fault
    handler. Raised out of pysyncobj's tick, the same entry was retried every tick and the
    rest of the tick skipped (no proposals, no AppendEntries, no socket polling): every voter
    applies the same entry, so the whole quorum wedged with its processes up."""
    _halt("quorum: applying metadata offset %d failed: halting", offset, exc_info=error)


def _halt(message: str, *args: object, exc_info: BaseException | None = None) -> NoReturn:
    """Log ``message`` as critical, flush the log, and exit at once with HALT_EXIT_CODE."""
    log.critical(message, *args, exc_info=exc_info)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(HALT_EXIT_CODE)


def _fsync_file_and_directory(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    checkpoint.fsync_dir(Path(path).parent)


class _DurableMetaStorer(pysyncobj.journal.MetaStorer):  # type: ignore[misc]
    """pysyncobj's store of the current term and vote, made durable before it returns.

    pysyncobj writes them to a temporary file and renames it, with no fsync: a voter that
    lost power after granting a vote could come back without it and vote again in the same
    term, electing two leaders (Raft's persistent state; Kafka's ``FileQuorumStateStore``
    syncs its ``quorum-state`` file)."""

    def storeMeta(self, meta: Any) -> None:  # noqa: N802 (pysyncobj's)
        try:
            checkpoint.write_bytes_atomically(Path(self.getPath()), pysyncobj.journal.dumps(meta))
        except OSError as e:
            _halt_on_storage_error("storing the term and vote", e)

    def getMeta(self) -> dict[str, Any]:  # noqa: N802 (pysyncobj's)
        """The stored term and vote; none for a new voter (no file). A file that does not
        load halts the node: pysyncobj's own reader took it for no file, and the voter came
        back at its last entry's term with no vote, free to vote again in a term it had
        voted in (two leaders in one term). Kafka's ``FileQuorumStateStore`` fails the
        start-up when its ``quorum-state`` does not read."""
        path = Path(self.getPath())
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            _halt_on_storage_error("reading the term and vote", e)
        try:
            meta = _PlainDataPickle.loads(data)
        except Exception as e:  # pickle raises any kind on bad bytes
            _halt("quorum: the term and vote in %s do not load (%r): halting", path, e)
        if not _valid_meta(meta):
            _halt("quorum: the term and vote in %s are not valid (%r): halting", path, meta)
        return dict(meta)


def _valid_meta(meta: object) -> bool:
    """pysyncobj's ``{"currentTerm": int, "votedForNodeId": str | None,
    "raftCommitIndex": int}``, any of them absent."""
    if not isinstance(meta, dict) or not set(meta) <= _META_KEYS:
        return False
    voted = meta.get("votedForNodeId")
    return all(_is_count(meta.get(key, 0)) for key in ("currentTerm", "raftCommitIndex")) and (
        voted is None or isinstance(voted, str)
    )


_META_KEYS: Final = frozenset({"currentTerm", "votedForNodeId", "raftCommitIndex"})


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_RECORD_HEAD = struct.Struct("<I")
_RECORD_IDS = struct.Struct("<QQ")
_RECORD_CRC = struct.Struct("<I")
# pysyncobj's journal header: name (24 bytes), version (8), format version (4), end (4).
_FORMAT_VERSION_OFFSET = pysyncobj.journal.NAME_SIZE + pysyncobj.journal.VERSION_SIZE
# pysyncobj's format is 1; 2 is its records each followed by a CRC-32C, without which a record
# torn by a power loss (some of its pages on disk) could load as a valid one and be applied.
JOURNAL_FORMAT_VERSION = 2


def _journal_header(end: int | None) -> bytes:
    """pysyncobj's header with this format's version, and ``end`` (None: no record)."""
    pj = pysyncobj.journal
    name = pj.APP_NAME + b"\0" * (pj.NAME_SIZE - len(pj.APP_NAME))
    version = pj.APP_VERSION + b"\0" * (pj.VERSION_SIZE - len(pj.APP_VERSION))
    last = pj.FIRST_RECORD_OFFSET if end is None else end
    header: bytes = name + version + struct.pack("<II", JOURNAL_FORMAT_VERSION, last)
    return header


def _record(command: bytes, index: int, term: int) -> bytes:
    body: bytes = _RECORD_IDS.pack(index, term) + pysyncobj.journal.to_bytes(command)
    data = body + _RECORD_CRC.pack(crc32c.crc32c(body))
    size = _RECORD_HEAD.pack(len(data))
    return size + data + size


class _DurableJournal(pysyncobj.journal.FileJournal):  # type: ignore[misc]
    """pysyncobj's file journal (its layout, with a CRC-32C after each record: format 2),
    durable before anything it holds is relied on, and never loaded torn.

    - **Synced before it is relied on.** pysyncobj writes its journal through a memory map
      and never syncs it, so an entry a voter acknowledged (and the leader counted towards a
      commit) could be lost with the machine's power: a committed entry could end up on a
      minority. KRaft flushes its log before a follower acknowledges or the leader counts
      its own entries. Here every message a voter sends waits for the journal to be synced
      (``_VotersOnlyTransport.send``): an AppendEntries reply, a vote or the leader's own
      AppendEntries leaves only once the entries it speaks of are on disk, and a leader
      counts a follower only after its own entries went out, so after they were synced.
      Heartbeats that change nothing cost nothing.
    - **Trimmed by replacing the file.** pysyncobj trims by rewriting the kept entries over
      the old ones in place; a power loss in the middle left a journal of old and new pages
      that loads entries out of order. A trim (``clear``, ``deleteEntriesTo``) writes the kept
      entries to a new file, syncs it and renames it over the journal, and only after the
      snapshot it trims to is synced, so the trim is never on disk without its snapshot. A
      follower's truncation of its tail (``deleteEntriesFrom``) keeps the entries appended
      again unchanged as they are on disk, and zeroes and syncs the others before anything
      is written over them: none is left for a torn append to bring back.
    - **Loaded with checks.** An append torn by a power loss (the header's end offset on disk
      before the records or the file's growth, a record partly on disk) is dropped at load,
      from the first record whose sizes, checksum, index or term do not check out: it was
      never acknowledged (nothing is sent before a sync).

    Any I/O error while syncing halts the node (``_halt_on_storage_error``).
    """

    def __init__(self, journal_file: str, snapshot_file: str) -> None:
        # FileJournal.__init__, with its loading loop replaced by _load's checks.
        self._path = journal_file
        self._snapshot_file = snapshot_file
        self._dirty = True  # pysyncobj may have written it unsynced before a crash
        # Entries dropped but not yet zeroed on disk, and where they ended (deleteEntriesFrom).
        self._pending: list[tuple[bytes, int, int]] = []
        self._pending_end = 0
        self._FileJournal__metaStorer = _DurableMetaStorer(journal_file + ".meta")
        self._FileJournal__meta = self._FileJournal__metaStorer.getMeta()
        self._FileJournal__metaSaved = True
        self._FileJournal__journalFile = pysyncobj.journal.ResizableFile(
            journal_file, defaultContent=_journal_header(None)
        )
        self._FileJournal__journal, self._FileJournal__currentOffset = self._load()

    def _load(self) -> tuple[list[tuple[bytes, int, int]], int]:
        """The journal's entries, up to the first record that does not check out: its sizes
        (within the file as it is, not only as the header says), its checksum, its index and
        term following the one before. Those after it were never acknowledged (nothing is
        sent before a sync). A journal of pysyncobj's own format (no checksums) is read as
        it is, then rewritten in this one."""
        pj = pysyncobj.journal
        file = self._FileJournal__journalFile
        if not any(file.read(0, pj.FIRST_RECORD_OFFSET)):
            # A new journal whose header never reached the disk (power lost after its file
            # grew): it held nothing that was acknowledged (nothing is sent unsynced).
            log.warning("quorum: the journal's header is all zeros: starting it empty")
            self._rewrite([])
            return [], self._FileJournal__currentOffset
        version = _RECORD_HEAD.unpack(file.read(_FORMAT_VERSION_OFFSET, 4))[0]
        if version not in (pj.JOURNAL_FORMAT_VERSION, JOURNAL_FORMAT_VERSION):
            # Read as pysyncobj's unchecked format, each record's CRC became part of its
            # command (every batch skipped as undecodable), and the rewrite below gave the
            # damaged records valid CRCs: this voter's image drifted from the others'.
            file._destroy()
            _halt(
                "quorum: the journal %s has format version %d (this build reads %d and %d): "
                "its header is damaged; halting",
                self._path,
                version,
                pj.JOURNAL_FORMAT_VERSION,
                JOURNAL_FORMAT_VERSION,
            )
        checked = version == JOURNAL_FORMAT_VERSION
        file_size = os.path.getsize(self._path)
        end = min(_RECORD_HEAD.unpack(file.read(pj.LAST_RECORD_OFFSET_OFFSET, 4))[0], file_size)
        entries: list[tuple[bytes, int, int]] = []
        offset = pj.FIRST_RECORD_OFFSET
        overhead = _RECORD_IDS.size + (_RECORD_CRC.size if checked else 0)
        while offset + 4 <= end:
            size = _RECORD_HEAD.unpack(file.read(offset, 4))[0]
            if size < overhead or offset + size + 8 > end:
                break
            data = bytes(file.read(offset + 4, size))
            if _RECORD_HEAD.unpack(file.read(offset + 4 + size, 4))[0] != size:
                break
            if checked:
                data, crc = data[: -_RECORD_CRC.size], data[-_RECORD_CRC.size :]
                if _RECORD_CRC.unpack(crc)[0] != crc32c.crc32c(data):
                    break
            index, term = _RECORD_IDS.unpack(data[: _RECORD_IDS.size])
            if entries and (index != entries[-1][1] + 1 or term < entries[-1][2]):
                break
            entries.append((data[_RECORD_IDS.size :], index, term))
            offset += size + 8
        declared = _RECORD_HEAD.unpack(file.read(pj.LAST_RECORD_OFFSET_OFFSET, 4))[0]
        if offset != declared:
            log.warning(
                "quorum: the journal's records check out up to byte %d, its header says %d: "
                "dropped the torn tail after entry %s (never acknowledged: nothing is sent "
                "unsynced)",
                offset,
                declared,
                entries[-1][1] if entries else None,
            )
        if offset != declared or not checked:
            self._rewrite(entries)
            offset = self._FileJournal__currentOffset
        return entries, offset

    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._pending:
            old_command, old_idx, old_term = self._pending[0]
            if (old_idx, old_term) == (idx, term) and bytes(old_command) == bytes(command):
                # Appended again unchanged: kept as it is on disk (see deleteEntriesFrom).
                size = len(_record(*self._pending[0]))
                self._FileJournal__journal.append(self._pending.pop(0))
                self._FileJournal__currentOffset += size
                return
            self._settle()
        # FileJournal.add, each record with a CRC-32C of its index, term and command.
        self._FileJournal__journal.append((command, idx, term))
        record = _record(command, idx, term)
        self._FileJournal__journalFile.write(self._FileJournal__currentOffset, record)
        self._FileJournal__currentOffset += len(record)
        self._FileJournal__setLastRecordOffset(self._FileJournal__currentOffset)
        self._dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 (pysyncobj's)
        # pysyncobj drops a follower's entries from its leader's previous one on whenever an
        # AppendEntries overlaps its tail, conflicting or not (a resend after a late reply),
        # then appends the leader's. Done in place, that was unsafe both ways: written over
        # at once, a power loss tearing the appends could leave an old entry followed by a
        # new one, each checking out, loaded as a log the leader never had (Raft's log
        # matching broken; KRaft truncates its segment file); made durable at once, the same
        # entries appended again, already acknowledged, were lost in between. So the drop is
        # pending: the entries appended again unchanged are kept as they are on disk, and the
        # rest are zeroed and synced (``_settle``) before anything else is written over them
        # or any message leaves (``sync``), as pysyncobj's own truncation leaves them. Until
        # then the file holds the log as last synced, which no message has contradicted.
        # Only pysyncobj's thread settles: reads (``len``, ``[]``) see the entries in memory,
        # and the event loop's ``status()`` reads them; a settle from there zeroed an entry
        # appended again while ``add`` was between its list and its file offset.
        self._settle()
        journal = self._FileJournal__journal
        dropped = journal[entryFrom:]
        if not dropped:
            return
        del journal[entryFrom:]
        self._pending_end = self._FileJournal__currentOffset
        self._FileJournal__currentOffset -= sum(len(_record(*entry)) for entry in dropped)
        self._pending = dropped

    def _settle(self) -> None:
        """Make a pending drop real: the dropped entries not appended again are zeroed and the
        header's end lowered, synced before anything is written over them."""
        if not self._pending:
            return
        start = self._FileJournal__currentOffset
        self._FileJournal__journalFile.write(start, bytes(self._pending_end - start))
        self._FileJournal__setLastRecordOffset(start)
        self._pending = []
        self._dirty = True
        self.sync()

    def clear(self) -> None:
        self._trim_to([])

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803 (pysyncobj's)
        self._trim_to(self._FileJournal__journal[entryTo:])

    def _trim_to(self, kept: list[tuple[bytes, int, int]]) -> None:
        # pysyncobj trims only after renaming a snapshot into place: that one first.
        if os.path.exists(self._snapshot_file):
            try:
                _fsync_file_and_directory(self._snapshot_file)
            except OSError as e:
                _halt_on_storage_error("syncing the metadata snapshot", e)
        self._rewrite(kept)
        self._FileJournal__journal = list(kept)

    def _rewrite(self, entries: list[tuple[bytes, int, int]]) -> None:
        """Replace the journal file by one holding ``entries``, synced, in one rename."""
        pj = pysyncobj.journal
        records = b"".join(_record(command, index, term) for command, index, term in entries)
        end = pj.FIRST_RECORD_OFFSET + len(records)
        header = _journal_header(end)
        try:
            checkpoint.write_bytes_atomically(Path(self._path), header + records)
            self._FileJournal__journalFile._destroy()  # the old file's map
            self._FileJournal__journalFile = pj.ResizableFile(self._path)
        except OSError as e:
            _halt_on_storage_error("rewriting the metadata journal", e)
        self._FileJournal__currentOffset = end
        self._pending = []  # the file holds none of them
        self._dirty = False

    def sync(self) -> None:
        """Make every change so far durable (the map's pages, through msync)."""
        self._settle()
        if not self._dirty:
            return
        try:
            self.flush()
        except OSError as e:
            _halt_on_storage_error("syncing the metadata journal", e)
        self._dirty = False


def _create_journal(journal_file: str | None) -> Any:
    # pysyncobj's SyncObj makes its journal with the module's createJournal (replaced below).
    if journal_file is None:
        return pysyncobj.journal.MemoryJournal()
    snapshot_file = os.path.join(os.path.dirname(journal_file), SNAPSHOT_FILE)
    return _DurableJournal(journal_file, snapshot_file)


pysyncobj.syncobj.createJournal = _create_journal


# A quorum port that cannot be bound is reported on the first try and then every this many.
BIND_REPORT_EVERY = 30


class _VotersOnlyTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's transport, taking on its port only what a voter or our own tools send.

    An incoming connection's first message must name a voter that connects to this one (its
    ``host:port``; of two voters, the one with the greater address connects) or be one of
    ``_UTILITY_COMMANDS`` with the voter's own secret. pysyncobj itself looks the message up
    in a dict, so a list or a dict raised out of its tick ("unhashable type") and the rest of
    that tick's Raft work was skipped; it also took ``readonly`` (a non-voting replica that
    receives the whole log and whose messages are treated as a node's), which this cluster
    never runs. Anything else now
    closes that connection alone, as Kafka's ``SocketServer`` closes one that sends garbage.
    Each end of a voters' connection then names its cluster (``CLUSTER_ID``) before any Raft
    message, the one that dials right after its address, the other once it has taken that
    address; ``_MetadataSyncObj`` closes the connection on another cluster's id, as KRaft's
    ``KafkaRaftClient`` refuses a Vote, BeginQuorumEpoch or Fetch with one
    (INCONSISTENT_CLUSTER_ID): a voter of another cluster, by a wrong
    ``controller.quorum.voters`` or a copied data directory, took part in this quorum's
    elections and could replace its log with the other cluster's. A voter of an older build
    sends no such message and ignores it (so a rolling upgrade keeps its quorum).
    A voter's new connection closes the one it replaces, which pysyncobj left open.
    A failed bind closes its socket: pysyncobj's ``TcpServer.bind`` kept it and made a new one
    on the next try (every ``bindRetryTime``), leaving one open socket per try to the garbage
    collector while the port stayed taken.
    """

    _ready: bool  # pysyncobj's: the server is listening
    _destroyed = False
    _relisten_at: float | None = None  # when to bind again after the listener failed
    _relisten_tries = 0
    _relistened_at = -math.inf
    _listener_failed_logged_at = -math.inf

    def send(self, node: Any, message: Any) -> bool:
        # Nothing leaves before the journal entries it may speak of are durable.
        self._syncObj.sync_journal()
        return bool(super().send(node, message))

    def _createServer(self) -> None:  # noqa: N802
        super()._createServer()
        bind = self._server.bind

        def bind_or_say_why() -> None:
            # pysyncobj retries a failed bind every bindRetryTime without a word, and a voter
            # without its port never stands for election: say why, on the first failure and
            # then every BIND_REPORT_EVERY tries. ``MetadataQuorum.start`` fails on a port it
            # cannot bind (``_check_can_listen``), as Kafka does; this is for one taken in
            # between.
            try:
                bind()
            except OSError as e:
                if self._bindAttempts % BIND_REPORT_EVERY == 0:
                    log.warning(
                        "quorum: cannot listen on %s (try %d): %s; trying again every %.0f s",
                        self._syncObj.conf.bindAddress or self._selfNode.address,
                        self._bindAttempts + 1,
                        e,
                        self._syncObj.conf.bindRetryTime,
                    )
                raise

        self._server.bind = bind_or_say_why
        unbind = self._server.unbind

        def unbind_and_listen_again() -> None:
            # pysyncobj's server closes its socket on an accept() error (EMFILE, ENFILE,
            # ENOBUFS) or a poll error, and its transport, still counting itself bound, never
            # listened again: the voter took no connection until restarted. It binds again
            # at its next tick, then every bindRetryTime while that fails (Kafka's Acceptor
            # logs and goes on). The transport stays ready meanwhile: pysyncobj runs no Raft
            # at all while it is not (no heartbeat, no election), and a leader so paused for
            # a second was voted out.
            unbind()
            if self._ready and not self._destroyed and self._relisten_at is None:
                now = raft_clock()
                if now - self._listener_failed_logged_at >= LISTENER_FAILURE_LOG_EVERY_S:
                    self._listener_failed_logged_at = now
                    log.warning(
                        "quorum: the listener on %s failed (accepting a connection); listening "
                        "again",
                        self._syncObj.conf.bindAddress or self._selfNode.address,
                    )
                # At once, but not within bindRetryTime of the last time (accept may fail
                # again at once: out of file descriptors while a peer keeps connecting).
                self._relisten_at = max(now, self._relistened_at + self._syncObj.conf.bindRetryTime)

        self._server.unbind = unbind_and_listen_again
        self._bind_raw, self._unbind_raw = bind, unbind

    def _onTick(self) -> None:  # noqa: N802 (pysyncobj's)
        if (
            self._relisten_at is not None
            and not self._destroyed
            and raft_clock() >= (self._relisten_at)
        ):
            self._relisten()
        super()._onTick()

    def _relisten(self) -> None:
        """Listen again after the listener failed (see ``_createServer``); the transport stays
        ready all along, so Raft goes on over the connections it has."""
        address = self._syncObj.conf.bindAddress or self._selfNode.address
        try:
            self._bind_raw()
        except OSError as e:
            self._unbind_raw()  # the socket the failed bind made
            self._relisten_tries += 1
            if self._relisten_tries % BIND_REPORT_EVERY == 1:
                log.warning(
                    "quorum: cannot listen on %s again (try %d): %s; trying every %.0f s",
                    address,
                    self._relisten_tries,
                    e,
                    self._syncObj.conf.bindRetryTime,
                )
            self._relisten_at = raft_clock() + self._syncObj.conf.bindRetryTime
            return
        log.debug("quorum: listening on %s again", address)
        self._relisten_at, self._relisten_tries = None, 0
        self._relistened_at = raft_clock()

    def destroy(self) -> None:
        self._destroyed = True
        super().destroy()

    def _maybeBind(self) -> None:  # noqa: N802
        try:
            super()._maybeBind()
        finally:
            if not self._ready and self._server is not None:
                self._server.unbind()

    def _sendSelfAddress(self, conn: Any) -> None:  # noqa: N802
        super()._sendSelfAddress(conn)
        conn.send(self._syncObj.cluster_id_message())

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:  # noqa: N802
        if self._syncObj.encryptor and not conn.sendRandKey:
            super()._onIncomingMessageReceived(conn, message)
            return
        if isinstance(message, list):
            command = message[0] if message else None
            acceptable = (
                isinstance(command, str)
                and command in _UTILITY_COMMANDS
                and len(message) >= 2
                and isinstance(message[-1], str)
                and hmac.compare_digest(  # as bytes: a str compared must be ASCII, or it raises
                    message[-1].encode("utf-8", "surrogatepass"),
                    self._syncObj.utility_secret.encode(),
                )
            )
            if acceptable:
                message = message[:-1]  # pysyncobj's command, as it takes it
        else:
            acceptable = (
                isinstance(message, str)
                and message in self._nodeAddrToNode
                # Between two voters only the greater address connects (_shouldConnect): one
                # naming a voter this node connects to itself is never that voter. pysyncobj
                # put it in place of the outgoing connection and reconnected with it, without
                # sending this node's address, so the voter closed every retry.
                and not self._shouldConnect(self._nodeAddrToNode[message])
            )
        if not acceptable:
            conn.disconnect()
            self._unknownConnections.discard(conn)
            log.warning(
                "quorum: closing a connection whose first message is neither a voter that "
                "connects to this one nor a utility command we take: %s",
                # Bounded in depth (a list nested 2,000 deep made repr raise RecursionError,
                # out of the tick), and without the secret a utility command tried.
                reprlib.repr(message[:1] if isinstance(message, list) else message),
            )
            return
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
        replaced = self._connections.get(node) if node is not None else None
        super()._onIncomingMessageReceived(conn, message)
        if node is not None:
            conn.send(self._syncObj.cluster_id_message())  # before any Raft message of ours
        if replaced is not None and replaced is not conn:
            # pysyncobj puts the new connection in the old one's place and forgets the old
            # one open (a voter that reconnected after a half-open link, or a stranger that
            # names it); the voter on the other end sees it close and reconnects.
            replaced.disconnect()


# Our own messages between voters: a pre-vote and its answer (see _pre_vote_or_elect).
PRE_VOTE = "kcoord_pre_vote"
# Why an election stands when none of the reasons _pre_vote_or_elect allows does (the term log).
_STANDING_UNASKED: Final = "no pre-vote (a bug)"
PRE_VOTE_RESPONSE = "kcoord_pre_vote_response"
NEWER_TERM = "kcoord_newer_term"  # to a leader of an older term (see _tell_newer_term)
CLUSTER_ID = "kcoord_cluster_id"  # each end's first message (see _VotersOnlyTransport)
# A voter of another cluster that keeps dialling is named once a minute, not every second.
CLUSTER_MISMATCH_LOG_EVERY_S = 60.0
# pysyncobj's _RAFT_STATE.
_FOLLOWER, _CANDIDATE, _LEADER = 0, 1, 2


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value


# The fields of pysyncobj 0.3.17's Raft messages that its handler reads as numbers, and the
# greatest each may be: a term is the controller epoch, an int32 in Kafka's protocol (KRaft's
# epochs); a log index is a metadata offset, an int64. A term of 2**64 once taken (a message
# any peer naming a voter could send) was stored in the journal's meta, where a leader could
# not then write its entries (the journal packs terms in 64 bits): the quorum never committed
# again, across restarts.
MAX_TERM = 2**31 - 1
MAX_INDEX = 2**63 - 1
_NUMERIC_FIELDS = {
    "term": MAX_TERM,
    "last_log_term": MAX_TERM,
    "prevLogTerm": MAX_TERM,
    "last_log_index": MAX_INDEX,
    "commit_index": MAX_INDEX,
    "prevLogIdx": MAX_INDEX,
    "next_node_idx": MAX_INDEX,
}


def _malformed(message: Any) -> str | None:
    """Why pysyncobj's handler would raise on this Raft message, or None; or why it must not
    take it (a number out of its range)."""
    if not isinstance(message, dict):
        return f"a {type(message).__name__}, not a dict"
    if not isinstance(message.get("type"), str):
        return "no message type"
    for name, greatest in _NUMERIC_FIELDS.items():
        value = message.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} is a {type(value).__name__}"
        if not 0 <= value <= greatest:
            return f"{name} {value} is outside 0..{greatest}"
    if "entries" in message:
        if not isinstance(message["entries"], list):
            return "entries is not a list"
        return _bad_entries(message["entries"])
    return None


def _bad_entries(entries: list[Any]) -> str | None:
    """Why these log entries (command, index, term) are not to be taken, or None: their
    numbers are bounded as the messages' (an entry's term of 2**64 reached the journal,
    which raised out of the tick with the entry taken in memory and not on disk)."""
    for entry in entries:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            return "an entry that is not (command, index, term)"
        for name, value, greatest in (("index", entry[1], MAX_INDEX), ("term", entry[2], MAX_TERM)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= greatest:
                return f"an entry whose {name} is {value!r}"
    return None


def _check_can_listen(host: str, port: int) -> None:
    """``OSError`` naming the quorum listener if its address cannot be bound now (taken by
    another process, or not this host's): pysyncobj would retry the bind for ever and the node
    would run without ever joining the quorum. Kafka fails its start on a port it cannot bind,
    as this node does on its Kafka and RPC ports. Bound with ``SO_REUSEADDR``, as pysyncobj
    binds it, on the address the node gives it (its ``quorum.listener``), then let go for it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            probe.listen(1)
        except OSError as e:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise OSError(
                e.errno, f"cannot listen on the quorum listener {address}: {e.strerror}"
            ) from e


class _MetadataSyncObj(SyncObj):  # type: ignore[misc]
    """SyncObj whose regular commands are our metadata batches, never pickled calls."""

    def __init__(
        self, quorum: MetadataQuorum, self_node: str, partners: list[str], conf: SyncObjConf
    ) -> None:
        self._quorum = quorum
        self.utility_secret = secrets.token_hex(16)  # see _UTILITY_COMMANDS
        self._cluster_mismatch_logged: dict[str, float] = {}  # per voter address
        self._parts: list[bytes] = []  # of an entry sent in parts (see _assembled)
        self._parts_bytes = 0
        self._parts_sender: tuple[Any, Any] | None = None  # (node, term) of those parts
        self._snapshot_parts: list[bytes] | None = None  # see _stale_snapshot_ignored
        self._snapshot_sender: tuple[Any, Any] | None = None
        # (term, index): this log holds that term's leader's entries up to the index, as it
        # acknowledged to it (see _without_entries_we_hold).
        self._leader_prefix: tuple[int, int] = (-1, 0)
        self._pending_prefix: tuple[int, int] | None = None  # once pysyncobj takes the message
        # Pre-vote (KIP-996; see _pre_vote_or_elect): the open round, the voters that granted
        # it, a round won for the election it lets start, and when the leader was last heard.
        self._pre_vote_round = 0
        self._pre_vote_term: int | None = None
        self._pre_votes: set[Any] = set()
        self._pre_vote_won: int | None = None  # the term the won round proposed
        # What may move the term now, for the log: the message being handled (its type and
        # sender, formatted only if the term moves), or why this tick's election stands.
        self._term_message: tuple[Any, Any] | None = None
        self._standing_because = _STANDING_UNASKED
        self._leader_heard_at = -math.inf
        super().__init__(self_node, partners, conf, transportClass=_VotersOnlyTransport)
        # pysyncobj starts its own buffer of parts as a str; _assembled keeps it empty bytes.
        self._SyncObj__recvTransmission = b""
        first = self._SyncObj__raftLog[0][1]
        if first > 1 and conf.fullDumpFile and not os.path.isfile(conf.fullDumpFile):
            # The journal is trimmed only after the snapshot it trims to is synced, so the
            # file was removed since. pysyncobj, finding no snapshot, starts applying at
            # entry 2, which the journal no longer holds: the voter applied nothing, ever,
            # and as the leader never activated a controller, with nothing logged.
            self.destroy()
            _halt(
                "quorum: the journal starts at entry %d but the snapshot %s it was trimmed "
                "to is missing: halting",
                first,
                conf.fullDumpFile,
            )

    def sync_journal(self) -> None:
        journal = self._SyncObj__raftLog
        if isinstance(journal, _DurableJournal):
            journal.sync()

    # pysyncobj calls ``self.__doApplyCommand`` for every committed entry; inside SyncObj the
    # name is mangled to ``_SyncObj__doApplyCommand``, so defining that name here overrides it.
    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:  # noqa: N802
        # A lone voter commits what it appended without sending anything: durable first.
        self.sync_journal()
        if command[:1] == _REGULAR:
            # raftLastApplied is incremented after the apply: this entry is the next one.
            offset = int(self.raftLastApplied) + 1
            term = int(self._SyncObj__getEntries(offset, 1)[0][2])
            return self._quorum._apply_command_bytes(offset, bytes(command[1:]), term)
        return SyncObj._SyncObj__doApplyCommand(self, command)

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802
        """Apply nothing before the snapshot is loaded. pysyncobj applies the journal on every
        tick while its port is not bound yet, and loads the snapshot only at its first tick
        with the port bound: a voter restarted with a journal not yet trimmed to its snapshot
        (killed between the two) and its port briefly taken applied entries from the start,
        then the older snapshot over them, then the entries after it again: the image and
        the roles derived from it went back and forth, and batches were applied twice."""
        if self._SyncObj__needLoadDumpFile:
            return False
        # Whether AppendEntries should go out now (the new commit index, to the followers).
        return bool(SyncObj._SyncObj__applyLogEntries(self))

    def _SyncObj__setCurrentTerm(self, term: int, voted_for: Any) -> None:  # noqa: N802
        """pysyncobj's, and a line in the log when the term moves, with what moved it: an
        election no one expected (a voter back from isolation deposing the leader) is read
        off the nodes' logs afterwards."""
        old = self._SyncObj__raftCurrentTerm
        SyncObj._SyncObj__setCurrentTerm(self, term, voted_for)
        if term == old:
            return
        if self._term_message is None:
            cause = f"this voter stands for election: {self._standing_because}"
        else:
            kind, node = self._term_message
            # Any type a peer sent: not str() of it (an int of 5,000 digits raises).
            named = kind[:40] if isinstance(kind, str) else type(kind).__name__
            cause = f"{named!r} from {getattr(node, 'address', '?')}"
        log.info("quorum: term %d -> %d (%s)", old, term, cause)

    # Every message from another voter, on the Raft thread (the same mangling).
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        self._term_message = (message.get("type") if isinstance(message, dict) else None, node)
        try:
            self._on_message(node, message)
        finally:
            self._term_message = None

    def _on_message(self, node: Any, message: Any) -> None:
        why = _malformed(message)
        self._pending_prefix = None  # what an earlier message that failed left is not taken
        if why is None:
            try:
                if message.get("type") == CLUSTER_ID:
                    self._check_cluster_id(node, message)
                    return
                if message.get("type") in (PRE_VOTE, PRE_VOTE_RESPONSE, NEWER_TERM):
                    self._on_election_message(node, message)
                    return
                if message.get("type") == "append_entries":
                    if message.get("term", -1) < self._SyncObj__raftCurrentTerm:
                        self._tell_newer_term(node)  # and pysyncobj ignores it
                    if "transmission" in message:
                        message = self._assembled(node, message)
                        if (bad := _bad_entries(message.get("entries", []))) is not None:
                            raise ValueError(bad)
                    message = self._without_entries_we_hold(message)
                    message = self._stale_snapshot_ignored(node, message)
                    message = self._snapshot_part_committing_nothing(message)
                SyncObj._SyncObj__onMessageReceived(self, node, message)
                if self._pending_prefix is not None:
                    self._leader_prefix, self._pending_prefix = self._pending_prefix, None
                if message.get("type") == "append_entries" and self._SyncObj__raftLeader == node:
                    self._leader_heard_at = raft_clock()  # a leader of our term or newer
                    # It leads: a round still open would stand against it on late grants
                    # (etcd's pre-candidate and Kafka's ProspectiveState follow it again).
                    self._pre_vote_term = self._pre_vote_won = None
                return
            except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
                # A field missing or of another shape than pysyncobj's own messages have.
                why = f"a {message.get('type')} it could not take ({e!r})"
        # pysyncobj's handler would have raised out of its tick and skipped the rest of the
        # tick's Raft work for every voter; only this connection goes (the voter reconnects).
        log.warning("quorum: closing the connection of %s, which sent %s", node, why)
        self._disconnect(node)

    def _disconnect(self, node: Any) -> None:
        """Close ``node``'s connection alone (the voter reconnects)."""
        conn = self._SyncObj__transport._connections.get(node)
        if conn is not None:
            conn.disconnect()

    def cluster_id_message(self) -> dict[str, Any]:
        """What each end of a voters' connection sends first (see _VotersOnlyTransport)."""
        return {"type": CLUSTER_ID, "cluster_id": self._quorum.cluster_id}

    def _check_cluster_id(self, node: Any, message: dict[str, Any]) -> None:
        """A voter's cluster (see _VotersOnlyTransport): another one closes the connection."""
        ours, theirs = self._quorum.cluster_id, message.get("cluster_id")
        if theirs == ours:
            return
        now = raft_clock()
        address = str(node.address)
        if now - self._cluster_mismatch_logged.get(address, -math.inf) >= (
            CLUSTER_MISMATCH_LOG_EVERY_S
        ):
            self._cluster_mismatch_logged[address] = now
            log.warning(
                "quorum: closing the connection of voter %s of cluster %.80r: this voter is of "
                "cluster %r (INCONSISTENT_CLUSTER_ID; check controller.quorum.voters and "
                "cluster.id)",
                address,
                theirs,
                ours,
            )
        self._disconnect(node)

    # pysyncobj's ticking thread calls this; it starts an election on its own tick.
    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803 (pysyncobj's)
        if self._pre_vote_or_elect():
            try:
                SyncObj._onTick(self, timeToWait)
            finally:
                self._standing_because = _STANDING_UNASKED
            return
        # pysyncobj reads its clock again for its own look at the deadline, later: a deadline
        # that fell between the two readings (the thread switched out for a GIL interval, or
        # more on a loaded machine) let it stand with no pre-vote. An isolated voter so raised
        # its term, and on its return deposed the working leader (the isolation test in CI:
        # the controller epoch went 2 -> 4 within 100 ms of the heal). The deadline is out of
        # its reach for the tick, and put back unless the tick set a new one.
        held: float = self._SyncObj__raftElectionDeadline  # type: ignore[has-type]
        self._SyncObj__raftElectionDeadline = math.inf
        try:
            SyncObj._onTick(self, timeToWait)
        finally:
            if self._SyncObj__raftElectionDeadline == math.inf:
                self._SyncObj__raftElectionDeadline = held

    def _pre_vote_or_elect(self) -> bool:
        """Run a pre-vote round where pysyncobj would start an election (KIP-996, Raft
        thesis 9.6), and let the election start only once a majority granted it. Returns
        whether pysyncobj may stand on this tick: a round won, a leadership transfer, or a
        lone voter.

        pysyncobj's voter raised its term whenever its election timer ran out: a voter cut
        off from the others (its links still counted as connected: a firewall, a pause) went
        on raising it, and once back its RequestVote at that term deposed the working leader,
        one more controller election for nothing (the isolation test: a voter back at term 4
        deposed the leader of term 3, and the quorum settled at term 6).
        A pre-vote asks, at the term the election would take, whether a voter would vote, and
        changes nothing on either side. A leadership transfer (TimeoutNow) is not asked for.
        """
        due = (
            self._SyncObj__raftState in (_FOLLOWER, _CANDIDATE)
            and self._SyncObj__selfNode is not None
            and self._SyncObj__otherNodes
            and self._SyncObj__transport.ready
            and self._SyncObj__raftElectionDeadline < raft_clock()
            and self._SyncObj__connectedToAnyone()
            and not self._SyncObj__transferInProgress
        )
        term = self._SyncObj__raftCurrentTerm
        if not due or self._pre_vote_won == term + 1:
            won = self._pre_vote_won == term + 1
            self._pre_vote_won = None
            # Nothing due, or pysyncobj elects on this tick.
            if won:
                self._standing_because = "a majority granted its pre-vote"
            elif self._SyncObj__transferInProgress:
                self._standing_because = "the leader handed it the leadership (TimeoutNow)"
            elif not self._SyncObj__otherNodes:
                self._standing_because = "the only voter"
            else:
                return False
            return True
        self._SyncObj__raftElectionDeadline = raft_clock() + self._SyncObj__generateRaftTimeout()
        if self._SyncObj__needLoadDumpFile:
            return False  # pysyncobj loads the snapshot on this tick: ask with the log it leaves
        if self._SyncObj__raftLeader is not None:  # type: ignore[has-type]
            # As pysyncobj does when it stands: its leader is gone (Kafka's ProspectiveState).
            self._SyncObj__raftLeader = None
            self._SyncObj__onLeaderChanged()
        self._pre_vote_round += 1
        self._pre_vote_term = term + 1
        self._pre_votes = {self._SyncObj__selfNode}
        for other in self._SyncObj__otherNodes:
            self._SyncObj__transport.send(
                other,
                {
                    "type": PRE_VOTE,
                    "round": self._pre_vote_round,
                    "term": term + 1,
                    "last_log_index": self._SyncObj__getCurrentLogIndex(),
                    "last_log_term": self._SyncObj__getCurrentLogTerm(),
                },
            )
        return False

    def _tell_newer_term(self, node: Any) -> None:
        """Answer a leader of an older term with ours. A voter whose term is above the
        leader's ignores its AppendEntries, and with pre-vote no longer forces its term on the
        others with a RequestVote: it would stay out for good (a candidate cut off right after
        its pre-vote won, while the leader came back). The leader steps down and the quorum
        elects again, as Kafka's leader resigns on a response of a higher epoch (and etcd's
        leader on a MsgAppResp of a higher term): the one election pre-vote cannot spare."""
        self._SyncObj__transport.send(
            node, {"type": NEWER_TERM, "term": self._SyncObj__raftCurrentTerm}
        )

    def _take_newer_term(self, term: int) -> None:
        """As pysyncobj takes a RequestVote's higher term: a follower, no leader, no vote."""
        if term <= self._SyncObj__raftCurrentTerm:
            return
        self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_FOLLOWER)
        self._SyncObj__raftLeader = None
        self._pre_vote_term = None

    def _on_election_message(self, node: Any, message: dict[str, Any]) -> None:
        term = self._SyncObj__raftCurrentTerm
        if message["type"] == PRE_VOTE:
            proposed, round_ = _int(message["term"]), _int(message["round"])
            last_term, last_index = _int(message["last_log_term"]), _int(message["last_log_index"])
            ours = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
            granted = (
                proposed > term
                and self._SyncObj__raftState != _LEADER
                # Kafka's FollowerState refuses while it fetches from its leader; here, while
                # the leader was heard from within the shortest election timeout.
                and raft_clock() - self._leader_heard_at >= self._SyncObj__conf.raftMinTimeout
                and (last_term, last_index) >= ours  # Raft's "at least as up to date"
            )
            self._SyncObj__transport.send(
                node,
                {
                    "type": PRE_VOTE_RESPONSE,
                    "round": round_,
                    "proposed": proposed,
                    "term": term,
                    "granted": granted,
                },
            )
            return
        if message["type"] == NEWER_TERM:
            self._take_newer_term(_int(message["term"]))
            return
        answered_term, granted = _int(message["term"]), message["granted"]
        if not isinstance(granted, bool):
            raise TypeError(f"granted is {granted!r}")
        if answered_term > term:
            # A voter left at a higher term (by an election it lost) refuses every round at
            # or below it: take its term, and ask above it next time.
            self._take_newer_term(answered_term)
            return
        if (
            not granted
            or _int(message["round"]) != self._pre_vote_round
            or _int(message["proposed"]) != self._pre_vote_term
            or self._pre_vote_term != term + 1
        ):
            return
        self._pre_votes.add(node)
        if len(self._pre_votes) * 2 > len(self._SyncObj__otherNodes) + 1:
            log.info(
                "quorum: pre-vote for term %d granted by %d of %d voters: standing",
                term + 1,
                len(self._pre_votes),
                len(self._SyncObj__otherNodes) + 1,
            )
            self._pre_vote_won, self._pre_vote_term = term + 1, None
            self._SyncObj__raftElectionDeadline = 0  # pysyncobj stands on its next tick

    def _assembled(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """One part of an entry sent in parts, as pysyncobj should have taken it.

        pysyncobj's leader sends an entry of ``appendEntriesBatchSizeBytes`` or more (a topic
        with thousands of partitions) in parts: "start", "process"..., "finish". It labels a
        part "finish" by the length of the entry's command, not of the pickled entry it cuts,
        so when the last cut falls in the pickle's own bytes the part before the last is
        labelled "finish" as well. pysyncobj's follower then fails to load it: an
        UnpicklingError ("pickle data was truncated") out of its tick, which skips the rest of
        that tick; only the real last part completed the entry. The parts are put together
        here instead: a "finish" whose data does not load yet counts as a "process", and the
        one that completes the entry goes on as a plain AppendEntries of that entry (through
        ``_without_entries_we_hold`` too). pysyncobj still answers "start" and "process" as
        before, with its own buffer left empty. The parts are those of one sender in one
        term: a part from anyone else completes nothing.
        """
        if message.get("term", -1) < self._SyncObj__raftCurrentTerm:
            return message  # a deposed leader's: pysyncobj ignores it
        kind = message["transmission"]
        data = message.get("data")
        if not isinstance(data, bytes | bytearray):
            data = b""  # not a part pysyncobj sends (and bytes(n) would allocate n bytes)
        data = bytes(data)
        if kind == "start":
            self._parts, self._parts_bytes = [data], len(data)
            self._parts_sender = (node, message.get("term"))
        elif not self._same_sender(self._parts_sender, node, message):
            # Not a part of the entry being put together (another voter led in between):
            # it completes nothing.
            return {**message, "transmission": "process", "data": b""}
        else:
            self._parts.append(data)
            self._parts_bytes += len(data)
        if self._parts_bytes > MAX_QUORUM_MESSAGE_BYTES or len(self._parts) > MAX_ENTRY_PARTS:
            self._parts, self._parts_bytes = [], 0
            raise ValueError(
                f"an entry in parts past {MAX_QUORUM_MESSAGE_BYTES} bytes or "
                f"{MAX_ENTRY_PARTS} parts"
            )
        if kind != "finish":
            return {**message, "data": b""}
        try:
            entry = _PlainDataPickle.loads(b"".join(self._parts))
        except (pickle.UnpicklingError, EOFError):
            return {**message, "transmission": "process", "data": b""}
        self._parts = []
        self._SyncObj__recvTransmission = b""
        plain = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        return {**plain, "entries": [entry]}

    @staticmethod
    def _same_sender(started: tuple[Any, Any] | None, node: Any, message: dict[str, Any]) -> bool:
        """Whether a part continues what ``started`` (the node and term of the first part)
        began: the same voter (pysyncobj's nodes compare by address), in that term or a
        later one (re-elected, it goes on with the same transfer)."""
        if started is None:
            return False
        first_node, first_term = started
        term = message.get("term")
        return bool(first_node == node and isinstance(term, int) and term >= first_term)

    def _without_entries_we_hold(self, message: dict[str, Any]) -> dict[str, Any]:
        """An AppendEntries as Raft's receiver rule wants it handled.

        pysyncobj's follower deletes every entry after ``prevLogIdx`` before it appends the
        leader's, also entries equal to the leader's. A leader resending from an older index
        (after a connection reset, or a stale reply) so made a voter drop entries it had
        acknowledged, even applied ("truncating already-applied log entries ... state machine
        may have diverged"); when the resend did not carry them all again, a committed entry
        could be left on fewer voters than a majority. Raft deletes only from the first
        *conflicting* entry (same index, another term). So the message is rewritten first:

        - the leader's entries this log already holds (same index and term) are dropped and
          ``prevLogIdx`` moves past them: pysyncobj then deletes only from a conflict on;
        - when it holds them all, ``prevLogIdx`` moves on to this log's end or its commit
          index, whichever is lower: committed entries are the leader's too (Raft's leader
          completeness), so nothing committed is deleted; then on past the entries of the
          leader's own term that follow (only it wrote entries of its term), and only entries
          known to be neither the leader's nor committed still go (as Raft leaves them until a
          conflict; pysyncobj computes the commit index from the log's end, so they must go);
          and on past every entry this voter acknowledged to the same leader before (a
          leader never changes an entry of its log, and it counts this voter for them: a
          short resend after entries of an older term deleted the leader's own later ones).

        A message whose ``prevLogIdx`` this log does not match is left alone (pysyncobj
        refuses it), as are a deposed leader's (an older term: pysyncobj ignores it),
        snapshots and the parts of an entry sent in parts (the assembled entry is not).
        """
        prev = message.get("prevLogIdx")
        entries = message.get("entries")
        if prev is None or entries is None or "transmission" in message:
            return message
        if message.get("term", -1) < self._SyncObj__raftCurrentTerm:
            return message  # a deposed leader's: pysyncobj ignores it
        ours = self._SyncObj__getEntries(prev, 1)
        if not ours or ours[0][2] != message.get("prevLogTerm"):
            return message
        term = int(message["term"])  # present: an older or missing one returned above
        known_term, known_index = self._leader_prefix
        acknowledged = known_index if known_term == term else 0
        # Once pysyncobj has taken it, this log holds the leader's entries up to the last sent.
        self._pending_prefix = (term, max(acknowledged, entries[-1][1] if entries else prev))
        held = 0
        for entry in entries:
            mine = self._SyncObj__getEntries(entry[1], 1)
            if not mine or mine[0][2] != entry[2]:
                break
            held += 1
        last_verified = entries[held - 1][1] if held else prev
        if held == len(entries):
            end = self._SyncObj__getCurrentLogIndex()
            last_verified = max(
                last_verified, min(end, self._SyncObj__raftCommitIndex), min(end, acknowledged)
            )
            # Entries of the sender's own term that follow are its too (one leader a term,
            # and the Log Matching property): a resend that carries fewer entries than this
            # voter acknowledged (a stale reply moved the leader back, a message is capped in
            # size) deleted the rest, which the leader still counted on this voter.
            while last_verified < end:
                following = self._SyncObj__getEntries(last_verified + 1, 1)
                if not following or following[0][2] != term:
                    break
                last_verified += 1
        if last_verified == prev:
            return message
        applied = self._SyncObj__raftLastApplied
        if prev < applied:  # pysyncobj alone: "truncating already-applied log entries"
            log.info(
                "kept entries %d-%d that the leader sent again (applied up to %d)",
                prev + 1,
                last_verified,
                applied,
            )
        return {
            **message,
            "prevLogIdx": last_verified,
            "prevLogTerm": self._SyncObj__getEntries(last_verified, 1)[0][2],
            "entries": list(entries[held:]),
        }

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802, N803
        """Load the snapshot at start-up with the journal trimmed to it first.

        pysyncobj renames a new snapshot into place in one tick and trims the journal to it
        in a later one. A voter killed in between found at start-up a journal that did not
        begin at the snapshot's entries, and cleared it all: the entries after the snapshot,
        acknowledged to the leader, were gone. When the journal holds the snapshot's last two
        entries, the trim the voter missed is done now, and pysyncobj keeps the rest.
        """
        if not clearJournal:
            self._trim_journal_to_snapshot()
        self._quorum.snapshot_error = None
        super()._SyncObj__loadDumpFile(clearJournal)
        if self._quorum.snapshot_error is not None:
            _halt_on_snapshot_error(self._quorum.snapshot_error)

    def _trim_journal_to_snapshot(self) -> None:
        try:
            with open(self._SyncObj__conf.fullDumpFile, "rb") as f:
                snapshot = _parse_snapshot(f.read())
        except (OSError, *_SNAPSHOT_ERRORS):
            return  # pysyncobj's own load reports it
        last, before = snapshot.last, snapshot.before
        before_index = before[1]
        journal = self._SyncObj__raftLog
        if len(journal) < 2:
            return
        at = before_index - journal[0][1]
        if at <= 0 or at + 1 >= len(journal):
            return
        if tuple(journal[at]) == before and tuple(journal[at + 1]) == last:
            log.info("quorum: trimmed the journal to the snapshot ending at entry %d", last[1])
            journal.deleteEntriesTo(at)

    def _stale_snapshot_ignored(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """A part of the leader's snapshot, or nothing of it when the whole snapshot ends at an
        entry this voter has committed already, or holds (same index and term).

        pysyncobj's leader sends its snapshot to a voter whose next index is at or below its
        log start, which a stale reply can make so while the voter is already past the
        snapshot (its replies are pipelined: a "reset" from when it was behind arrives after
        the leader compacted). pysyncobj's follower installs whatever snapshot it gets: it
        drops its journal and steps its state back to the snapshot (a chaos run logged
        "raftCommitIndex (21) exceeds journal end (20)"), so it forgot committed entries until
        the leader sent them again, and could meanwhile have voted for a candidate lacking
        them; the node's image stepped back a batch, its roles with it. Raft keeps the entries
        after a snapshot's last one when it holds that entry, and etcd's raft ignores a
        snapshot at or below its commit index (``raft.restore``); so does this. The leader
        already moved this voter's next index past the snapshot when it sent the last part,
        and its next AppendEntries goes on from there.

        A snapshot ending at an entry this log holds, past its commit index (the voter has
        not heard of the commit yet), is ignored too, as Raft's InstallSnapshot says ("if an
        existing log entry has the same index and term as the snapshot's last included entry,
        retain log entries following it"): pysyncobj dropped the entries after it, which the
        voter had acknowledged and the leader may have counted towards a commit. By Log
        Matching the log agrees with the leader's up to there; the leader's next
        AppendEntries starts right after the snapshot, and the commit index it carries lets
        the voter apply from its own log. The parts are gathered per sender and term: a part
        of another leader's snapshot, or one whose start was missed, is dropped.
        """
        part = message.get("serialized")
        if "prevLogIdx" in message or not isinstance(part, list | tuple) or len(part) != 3:
            return message
        if message.get("term", -1) < self._SyncObj__raftCurrentTerm:
            return message  # a deposed leader's: pysyncobj ignores it
        data, is_first, is_last = part
        if not isinstance(data, bytes | bytearray):
            return message
        if is_first:
            self._snapshot_parts = []
            self._snapshot_sender = (node, message.get("term"))
        elif self._snapshot_parts is None or not self._same_sender(
            self._snapshot_sender, node, message
        ):
            # The start was missed, or it is another leader's: pysyncobj, which joins
            # whatever comes, would append it to the snapshot it is putting together.
            return {k: v for k, v in message.items() if k != "serialized"}
        self._snapshot_parts.append(bytes(data))
        if not is_last:
            return message
        data, self._snapshot_parts = b"".join(self._snapshot_parts), None
        try:
            snapshot = _parse_snapshot(data)
        except _SNAPSHOT_ERRORS as e:
            # pysyncobj would rename it over the snapshot, fail to load it (logging that
            # alone), and still answer success with its own log end, which the leader would
            # take for a match.
            log.warning("quorum: refused the leader's snapshot: it does not load (%r)", e)
            self._SyncObj__serializer.drop_incoming()
            return {k: v for k, v in message.items() if k != "serialized"}
        _, last, last_term = snapshot.last
        # The applied index too: after a snapshot is installed it is past the commit index
        # (see _snapshot_part_committing_nothing), and an older snapshot stepped it back.
        committed = max(self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied)
        if last <= committed:
            why = f"committed up to {committed} here"
        else:
            ours = self._SyncObj__getEntries(last, 1)
            if not ours or ours[0][2] != last_term:
                # Installed next, and read at once: parsed here already (2.5 s for 50,000
                # partitions, on the Raft thread), it is not parsed again.
                self._quorum._received_snapshot = (data, snapshot)
                return message
            why = "this log holds that entry"
        log.info("quorum: ignored the leader's snapshot ending at entry %d: %s", last, why)
        self._SyncObj__serializer.drop_incoming()
        return {k: v for k, v in message.items() if k != "serialized"}

    def _snapshot_part_committing_nothing(self, message: dict[str, Any]) -> dict[str, Any]:
        """A part of the leader's snapshot (an AppendEntries without ``prevLogIdx``: its
        ``serialized`` is a part or None while the leader has none ready), its commit index no
        higher than ours.

        pysyncobj's follower sets its commit index to min(leader's commit index, its own log
        end) after every AppendEntries, also after these, which say nothing about whether its
        log matches the leader's: a voter holding entries a deposed leader appended but never
        committed (its own, when it was that leader) so counted them committed and applied
        them. A chaos run (seed 30, queue workload, all nemeses) caught it: node 1, leader
        cut off from node 2, proposed fencing 2 and shrinking ISRs to [1, 3]; node 2 was
        elected meanwhile, led chaos-queue-4 and node 3 truncated to it; when node 1 took the
        new leader's snapshot, the first part made it apply its own ISR [1, 3], and as leader
        of chaos-queue-4 it acknowledged six acks=all records that node 3 had already
        dropped. Raft lets a follower commit only entries it verified against the leader's
        log. Once the snapshot is installed the commit index may trail what it applied until
        the leader's next AppendEntries, which verifies the log and raises it.
        """
        if "prevLogIdx" in message:
            return message
        ours = self._SyncObj__raftCommitIndex
        if message.get("commit_index", -1) <= ours:
            return message
        return {**message, "commit_index": ours}


class MetadataQuorum:
    def __init__(
        self,
        node_id: int,
        voters: Sequence[Voter],
        data_dir: Path,
        listener: QuorumListener,
        *,
        cluster_id: str,
        bind_host: str | None = None,
        bind_port: int | None = None,
        timing: QuorumTiming | None = None,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.voters = {v.node_id: v for v in voters}
        if node_id not in self.voters:
            raise ValueError(f"node {node_id} is not among the voters {sorted(self.voters)}")
        self._id_by_address = {v.address: v.node_id for v in voters}
        self.directory = data_dir / "__cluster_metadata"
        self.listener = listener
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.timing = timing or QuorumTiming()
        # Owned by the Raft thread (the snapshot writer takes a copy of it there).
        self.image = MetadataImage()
        # The background snapshot write: pysyncobj asks its state (``_snapshot_state``).
        self._snapshot_status = pysyncobj.config.SERIALIZER_STATE.NOT_SERIALIZING
        self._snapshot_writer: threading.Thread | None = None
        # The writer's file, synced, and where it goes: renamed on the Raft thread.
        self._snapshot_written: tuple[str, str] | None = None
        # Whether a snapshot was loaded (a leader's installed) since the write began.
        self._snapshot_installed = False
        # The leader's snapshot just received, with its bytes, as parsed on arrival (Raft
        # thread; see _stale_snapshot_ignored).
        self._received_snapshot: tuple[bytes, _Snapshot] | None = None
        self.skipped_batches = 0
        self._sync: _MetadataSyncObj | None = None
        # Why the last snapshot load failed (set by _read_snapshot; pysyncobj swallows it).
        self.snapshot_error: BaseException | None = None
        self._lock = threading.Lock()

    # -----------------------------------------------------------------------------------------
    # Lifecycle.

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # a write a stop or crash interrupted
            (self.directory / (SNAPSHOT_FILE + _SNAPSHOT_WRITING_SUFFIX)).unlink()
        me = self.voters[self.node_id]
        t = self.timing
        bind = None
        if self.bind_host is not None or self.bind_port is not None:
            bind = f"{self.bind_host or me.host}:{self.bind_port or me.port}"
        conf = SyncObjConf(
            autoTick=True,
            useFork=False,
            appendEntriesUseBatch=False,
            raftMinTimeout=t.raft_min_timeout_s,
            raftMaxTimeout=t.raft_max_timeout_s,
            appendEntriesPeriod=t.append_entries_period_s,
            leaderFallbackTimeout=t.leader_fallback_timeout_s,
            connectionRetryTime=t.connection_retry_s,
            connectionTimeout=t.connection_timeout_s,
            logCompactionMinEntries=t.log_compaction_min_entries,
            logCompactionMinTime=t.log_compaction_min_time_s,
            journalFile=str(self.directory / "journal"),
            fullDumpFile=str(self.directory / SNAPSHOT_FILE),
            serializer=self._serialize_in_background,
            serializeChecker=self._snapshot_state,
            deserializer=self._read_snapshot,
            onStateChanged=lambda _old, _new: self.listener.on_state_changed(),
            bindAddress=bind,
            dynamicMembershipChange=False,
        )
        _check_can_listen(self.bind_host or me.host, self.bind_port or me.port)
        partners = [v.address for v in self.voters.values() if v.node_id != self.node_id]
        self._sync = _MetadataSyncObj(self, me.address, partners, conf)

    def resign(self, timeout_s: float) -> bool:
        """Hand the leadership to the most caught-up connected voter, for a clean stop: Kafka's
        ``KafkaRaftClient`` sends EndQuorumEpoch when a leader shuts down (KIP-595) so that the
        others elect at once rather than after an election timeout; pysyncobj's equivalent is
        Raft's TimeoutNow, asked for through its utility command (which runs it on the Raft
        thread). True once another voter leads or this one never led. Blocks: call it from a
        worker thread."""
        deadline = time.monotonic() + timeout_s
        while (status := self.status()).is_leader:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not status.connected:
                return False
            with contextlib.suppress(UtilityException):
                TcpUtility(timeout=min(remaining, 1.0)).executeCommand(
                    self._utility_address(), ["transfer", "", self._utility_secret()]
                )
            time.sleep(0.05)  # polling pysyncobj's state for the new term
        return True

    def _utility_secret(self) -> str:
        sync = self._sync
        return sync.utility_secret if sync is not None else ""

    def _utility_address(self) -> str:
        me = self.voters[self.node_id]
        host = self.bind_host if self.bind_host not in (None, "", "0.0.0.0", "::") else me.host
        return f"{host}:{self.bind_port or me.port}"

    def stop(self) -> None:
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.destroy_synchronous()
        writer = self._snapshot_writer
        if writer is not None:
            # Its file is never put in place now (the Raft thread does that): waited for
            # only so as not to leave it writing, not for ever on a hung disk.
            writer.join(SNAPSHOT_WRITER_JOIN_S)

    # -----------------------------------------------------------------------------------------
    # Proposing.

    def propose(
        self,
        records: Sequence[rec.MetadataRecord],
        on_done: Callable[[int | None, str | None], None],
        *,
        epoch: int,
    ) -> None:
        """Enqueue a batch decided by the controller of ``epoch`` (the Raft term it leads in);
        ``on_done(offset, None)`` or ``on_done(None, reason)`` from the Raft thread once
        committed or refused (also when committed in another term, and so skipped). Never
        blocks. Raises ``BatchTooLargeError`` for a batch no voter would take."""
        payload = _REGULAR + encode_batch(records, epoch)
        if len(payload) > MAX_QUORUM_MESSAGE_BYTES // 2:
            # Framed for a voter, with pickle's and the message's own bytes, it could pass
            # the bound every voter holds messages to, and the quorum would stop at it.
            # Raised, not reported as not committed: the controller took that for a lost
            # leadership and decided it again, and again, until the client's timeout.
            raise BatchTooLargeError(f"a metadata batch of {len(payload)} bytes is too large")
        sync = self._sync
        if sync is None:
            on_done(None, "quorum is stopped")
            return

        def callback(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS and isinstance(result, int) and result >= 0:
                on_done(result, None)
            elif error == FAIL_REASON.SUCCESS:
                on_done(None, "batch was committed but skipped (see the node log)")
            else:
                on_done(None, _FAIL_REASONS.get(error, f"pysyncobj error {error}"))

        sync._applyCommand(payload, callback)

    # -----------------------------------------------------------------------------------------
    # Applying (Raft thread).

    def _apply_command_bytes(self, offset: int, payload: bytes, term: int) -> int:
        """Apply one committed batch, appended in Raft term ``term``; never raises (it halts
        on an error no node could skip alike). Returns the offset, or -1 if skipped."""
        try:
            return self._apply_batch(offset, payload, term)
        except Exception as e:
            _halt_on_apply_error(offset, e)

    def _apply_batch(self, offset: int, payload: bytes, term: int) -> int:
        try:
            epoch, records = decode_batch(payload)
        except rec.MetadataRecordError as e:
            self.skipped_batches += 1
            log.error("metadata offset %d: undecodable batch skipped: %s", offset, e)
            return -1
        if epoch is not None and epoch != term:
            self.skipped_batches += 1
            log.warning(
                "metadata offset %d: a batch of controller epoch %d, appended in epoch %d (a "
                "deposed controller's, handed on to the leader), skipped",
                offset,
                epoch,
                term,
            )
            return -1
        try:
            self.image.apply_batch(offset, records)
        except MetadataApplyError as e:
            self.skipped_batches += 1
            log.warning("metadata offset %d: batch refused by the image, skipped: %s", offset, e)
            return -1
        try:
            self.listener.on_committed(offset, records)
        except Exception:  # the listener is the node's; it must not stop Raft
            log.exception("metadata listener failed at offset %d", offset)
        return offset

    def _serialize_in_background(self, filename: str, raft_data: tuple[Any, Any, Any]) -> None:
        """pysyncobj's serializer, on the Raft thread: copy the image (O(partitions), 12 ms
        for 50,000) and leave its encoding and sync to a writer thread. The Raft thread
        renames the written file into place (``_snapshot_state``), where it also installs a
        leader's snapshot, so the two never cross: renamed by the writer, an older snapshot
        of this voter's own replaced one just installed from the leader, and the voter lost
        entries it had acknowledged at its next start. Only once it is in place does
        pysyncobj trim the journal. pysyncobj renames ``filename`` (its temporary name)
        itself once this returns: there is none (an old one is removed), so that rename
        fails, ignored."""
        states = pysyncobj.config.SERIALIZER_STATE
        final = filename.removesuffix(".tmp")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(filename)  # an interrupted write's: pysyncobj would put it in place
            image = self.image.copy()
            self._snapshot_installed = False
            self._snapshot_written = None
            self._snapshot_status = states.SERIALIZING

            def write() -> None:
                writing = final + _SNAPSHOT_WRITING_SUFFIX
                try:
                    self._write_snapshot(writing, raft_data, image)
                except Exception:
                    log.exception("writing the metadata snapshot at offset %d", image.last_offset)
                    self._snapshot_status = states.FAILED
                else:
                    self._snapshot_written = (writing, final)

            self._snapshot_writer = threading.Thread(
                target=write, name=f"kcoord-snapshot-{self.node_id}", daemon=True
            )
            self._snapshot_writer.start()
        except Exception:
            log.exception("starting the metadata snapshot")
            self._snapshot_status = states.FAILED

    def _snapshot_state(self) -> int:
        """pysyncobj's ``serializeChecker``, on the Raft thread: SUCCESS once the written
        snapshot is renamed into place (FAILED if it failed, or if a leader's snapshot was
        installed meanwhile: this one is older), said once; then not serializing."""
        states = pysyncobj.config.SERIALIZER_STATE
        written = self._snapshot_written  # set once by the writer, as it ends
        if written is not None:
            self._snapshot_written = None
            writing, final = written
            if self._snapshot_installed:
                log.info("metadata snapshot discarded: a newer one came from the leader")
                with contextlib.suppress(OSError):
                    os.unlink(writing)
                self._snapshot_status = states.FAILED
            else:
                try:
                    os.replace(writing, final)
                except OSError:
                    log.exception("putting the metadata snapshot in place")
                    self._snapshot_status = states.FAILED
                else:
                    self._snapshot_status = states.SUCCESS
                    sync = self._sync
                    if sync is not None:  # what pysyncobj does itself without a checker
                        sync._SyncObj__serializer.forget_transmissions()
        status: int = self._snapshot_status
        if status in (states.SUCCESS, states.FAILED):
            self._snapshot_status = states.NOT_SERIALIZING
        return status

    def _write_snapshot(
        self, filename: str, raft_data: tuple[Any, Any, Any], image: MetadataImage | None = None
    ) -> None:
        """Write a snapshot of ``image`` (default: this voter's) to ``filename``, synced."""
        image = self.image if image is None else image
        entry1, entry0, cluster = raft_data
        body = {
            "version": SNAPSHOT_VERSION,
            "offset": image.last_offset,
            "records": [rec.encode(r) for r in image.to_records()],
            "entries": [list(entry1), list(entry0)],
            "cluster": sorted(node.address for node in cluster),
        }
        packed = msgpack.packb(body, use_bin_type=True)
        with open(filename, "wb") as f:
            f.write(msgpack.packb({"crc32c": crc32c.crc32c(packed), "body": packed}))
            # Synced before pysyncobj renames it into place, and trims the journal to it.
            f.flush()
            os.fsync(f.fileno())

    def _read_snapshot(self, filename: str) -> tuple[Any, Any, Any]:
        received, self._received_snapshot = self._received_snapshot, None
        try:
            with open(filename, "rb") as f:
                data = f.read()
            if received is not None and received[0] == data:
                snapshot = received[1]  # the leader's, parsed as it arrived
            else:
                snapshot = _parse_snapshot(data)
        except (OSError, *_SNAPSHOT_ERRORS) as e:
            # For _SyncObj__loadDumpFile, which halts the node: pysyncobj swallows it.
            self.snapshot_error = e
            raise ValueError(f"{filename}: {e}") from e
        self.image = snapshot.image
        self._snapshot_installed = True  # a write under way is older: not put in place
        try:
            # A copy (12 ms at 50,000 partitions) for the listener: rebuilding it from the
            # records took the node's event loop 0.65 s.
            self.listener.on_snapshot_loaded(
                snapshot.offset, snapshot.records, snapshot.image.copy()
            )
        except Exception:
            log.exception("metadata listener failed loading the snapshot at %d", snapshot.offset)
        return snapshot.last, snapshot.before, snapshot.cluster

    # -----------------------------------------------------------------------------------------
    # Status (any thread: plain reads of values pysyncobj replaces atomically).

    def status(self) -> QuorumStatus:
        sync = self._sync
        if sync is None:
            return QuorumStatus(self.node_id, False, None, 0, 0, 0, 0)
        # Read between two reads of the term, again if it moved (pysyncobj's thread changes
        # them under us): a leader flag of one term with the next term's number let a deposed
        # leader propose in the new term. (review helper-207)
        for _ in range(STATUS_READS):
            term = int(sync._getTerm())
            leader = sync._getLeader()
            is_leader = bool(sync._isLeader())
            if int(sync._getTerm()) == term:
                break
        else:
            is_leader = False  # the term kept moving: no leadership to act on
        leader_id = None if leader is None else self._id_by_address.get(leader.address)
        raw: dict[str, Any] = {}
        for _ in range(STATUS_READS):
            try:
                raw = sync.getStatus()
                break
            except RuntimeError:
                # It iterates pysyncobj's match and next indexes, which the Raft thread fills
                # when this voter first leads: "dictionary changed size during iteration"
                # failed the node's start, a hand-over or a Metadata answer. Read again.
                continue
        match: dict[int, int] = {}
        connected: set[int] = set()
        for address, node_id in self._id_by_address.items():
            if node_id == self.node_id:
                continue
            if is_leader and f"match_idx_server_{address}" in raw:
                match[node_id] = int(raw[f"match_idx_server_{address}"])
            if raw.get(f"partner_node_status_server_{address}") == 2:  # CONNECTED
                connected.add(node_id)
        return QuorumStatus(
            node_id=self.node_id,
            is_leader=is_leader,
            leader_id=leader_id,
            epoch=term,
            commit_index=int(sync.raftCommitIndex),
            last_applied=int(sync.raftLastApplied),
            log_size=int(raw.get("log_len", 0)),
            follower_match_index=match,
            connected=frozenset(connected),
        )


_FAIL_REASONS = {
    FAIL_REASON.QUEUE_FULL: "queue full",
    FAIL_REASON.MISSING_LEADER: "no leader",
    FAIL_REASON.DISCARDED: "discarded by a new leader",
    FAIL_REASON.NOT_LEADER: "not leader",
    FAIL_REASON.LEADER_CHANGED: "leader changed",
    FAIL_REASON.REQUEST_DENIED: "request denied",
}


@dataclass(frozen=True)
class _Snapshot:
    """A snapshot written by ``_write_snapshot``, parsed."""

    offset: int
    records: list[rec.MetadataRecord]
    image: MetadataImage
    last: tuple[Any, ...]  # the last Raft entry it covers, as pysyncobj's journal holds it
    before: tuple[Any, ...]  # the one before
    cluster: set[TCPNode]


_SNAPSHOT_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    msgpack.UnpackException,
    rec.MetadataRecordError,
    MetadataApplyError,
)


def _parse_snapshot(data: bytes) -> _Snapshot:
    """The one reader of a snapshot's bytes; raises one of ``_SNAPSHOT_ERRORS`` if they are
    not one this build can load."""
    body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if isinstance(body, dict) and set(body) == {"crc32c", "body"}:
        packed = body["body"]
        if not isinstance(packed, bytes) or crc32c.crc32c(packed) != body["crc32c"]:
            raise ValueError("its CRC-32C does not match: the file is damaged")
        body = msgpack.unpackb(packed, raw=False, strict_map_key=False)
        if not isinstance(body, dict) or body.get("version") != SNAPSHOT_VERSION:
            raise ValueError("not a kcoord metadata snapshot of a version this build reads")
    elif not isinstance(body, dict) or body.get("version") != 1:
        raise ValueError("not a kcoord metadata snapshot of a version this build reads")
    offset = body["offset"]
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueError(f"its offset is not an integer: {offset!r}")
    records = [rec.decode(r) for r in body["records"]]
    last, before = (tuple(e) for e in body["entries"])
    if not (isinstance(last[1], int) and isinstance(before[1], int)):
        raise ValueError("its Raft entries have no integer indexes")
    if not isinstance(body["cluster"], list) or not all(
        isinstance(address, str) for address in body["cluster"]
    ):
        raise ValueError("its voters are not a list of addresses")
    return _Snapshot(
        offset,
        records,
        MetadataImage.from_records(offset, records),
        last,
        before,
        {TCPNode(address) for address in body["cluster"]},
    )


def encode_batch(records: Sequence[rec.MetadataRecord], epoch: int) -> bytes:
    packed: bytes = msgpack.packb(
        [FORMAT_VERSION, epoch, [rec.encode(r) for r in records]], use_bin_type=True
    )
    return packed


def decode_batch(payload: bytes) -> tuple[int | None, list[rec.MetadataRecord]]:
    """The controller epoch (None in a version 1 batch) and the records of a batch."""
    try:
        body = msgpack.unpackb(payload, raw=False)
    except Exception as e:
        raise rec.MetadataRecordError(f"metadata batch is not msgpack: {e}") from e
    epoch: int | None = None
    if isinstance(body, list) and len(body) == 3 and body[0] == FORMAT_VERSION:
        epoch, items = body[1], body[2]
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise rec.MetadataRecordError("metadata batch epoch is not an integer")
    elif isinstance(body, list) and len(body) == 2 and body[0] == 1:
        items = body[1]
    else:
        raise rec.MetadataRecordError(
            "metadata batch is not [version 2, epoch, [record bytes...]] "
            "or [version 1, [record bytes...]]"
        )
    if not isinstance(items, list) or not all(isinstance(b, bytes) for b in items):
        raise rec.MetadataRecordError("metadata batch records are not a list of bytes")
    return epoch, [rec.decode(b) for b in items]
