"""Pure cluster logic: group coordinator shards, offsets, assignors, replication state, routing.

Everything here is synchronous and does no I/O: time arrives as ``now_ms`` arguments and ids
from an injected source. May import ``storage.format`` and ``raft`` records, never ``node``.
"""
