"""The leader-epoch cache of one partition (KIP-101/279), persisted as ``leader-epoch-checkpoint``.

Each entry says "leader epoch E started at offset O". The leader adds an entry when it appends
the first batch of a new epoch; a follower adds one when it appends a replicated batch whose
partition leader epoch is new. A follower facing a new leader asks for the end offset of its
latest epoch (``end_offset_for``) and truncates there, so no replica keeps a suffix the leader
does not have. Mirrors Kafka's ``LeaderEpochFileCache``.

Invariant: epochs strictly increase and start offsets never decrease.
"""

from __future__ import annotations

from pathlib import Path

from kcoord.storage.checkpoint import read_leader_epochs, write_leader_epochs

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, path: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = path
        self._entries: list[tuple[int, int]] = list(entries or [])
        self._dirty = False
        # Whether the checkpoint file is known to exist (``flush`` writes it once even when
        # nothing changed); not asked of the file system on every flush.
        self._written = False

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache:
        cache = cls(path, read_leader_epochs(path))
        cache._written = path.exists()
        return cache

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``; an older or equal epoch is a no-op."""
        if epoch < 0:
            return
        if self._entries:
            last_epoch, last_offset = self._entries[-1]
            if epoch <= last_epoch:
                return
            # Kafka's assign drops entries whose start offset is at or above the new one: they
            # cover no records (LeaderEpochFileCache.removeConflicting...).
            while self._entries and self._entries[-1][1] >= start_offset:
                self._entries.pop()
            assert not self._entries or self._entries[-1][1] <= start_offset, (last_offset,)
        self._entries.append((epoch, start_offset))
        self._dirty = True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower's OffsetsForLeaderEpoch request.

        Kafka's ``endOffsetFor``: the requested epoch's end is the start of the next higher
        epoch, and the epoch returned is the largest one not above the requested one; the
        latest epoch ends at the log end. An epoch below the first one known gives itself and
        the first one's start (its records may be gone with the log start, and the asker must
        still be able to replicate from there); above the latest, or with no epochs, gives
        (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self.latest_epoch:
            return requested_epoch, log_end_offset
        floor: tuple[int, int] | None = None
        for epoch, start in self._entries:
            if epoch > requested_epoch:
                if floor is None:
                    return requested_epoch, start
                return floor[0], start
            floor = (epoch, start)
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        kept = [(e, o) for e, o in self._entries if o < end_offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self._dirty = True

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below the new log start; the one spanning it starts there."""
        while len(self._entries) > 1 and self._entries[1][1] <= start_offset:
            self._entries.pop(0)
            self._dirty = True
        if self._entries and self._entries[0][1] < start_offset:
            self._entries[0] = (self._entries[0][0], start_offset)
            self._dirty = True

    def clear(self) -> None:
        if self._entries:
            self._entries = []
            self._dirty = True

    def flush(self) -> None:
        # A new log has no epochs and no file: nothing to write, since a missing file reads as
        # no epochs (Kafka's CheckpointFile only creates an empty file then, unsynced).
        if self._dirty or (not self._written and (self._entries or self.path.exists())):
            write_leader_epochs(self.path, self._entries)
            self._dirty = False
            self._written = True
