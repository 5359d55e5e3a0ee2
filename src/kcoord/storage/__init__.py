"""The log engine: Kafka's on-disk format for partitions.

Record batches (``format``), segments with their sparse offset and time indexes (``segment``,
``index``), the partition log with retention, compaction and truncation (``log``), checkpoint
files (``checkpoint``), leader-epoch caches (``epoch``), crash recovery and the ``LogManager``
that owns one data directory (``manager``).

Also the idempotent producers' state per partition (``producer_state``). Knows nothing of groups
or Raft. May import the standard library, ``crc32c``, ``cramjam`` and ``kcoord.errors``.
``format`` and ``producer_state`` are pure: no I/O, no clock.
"""
