"""The log engine: Kafka's on-disk format for partitions.

Record batches (``format``), segments with their sparse offset and time indexes (``segment``,
``index``), the partition log with retention, compaction and truncation (``log``), checkpoint
files (``checkpoint``), leader-epoch caches (``epoch``), crash recovery and the ``LogManager``
that owns one data directory (``manager``).

Knows nothing of groups or Raft. May import only the standard library and ``crc32c``.
``format`` is pure: no I/O, no clock.
"""
