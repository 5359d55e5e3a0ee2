"""Group -> ``__consumer_offsets`` partition, exactly as Kafka computes it. Pure.

Kafka's ``GroupCoordinatorService.topicPartitionFor`` (and the older Scala
``GroupMetadataManager.partitionFor``) maps a group to
``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions``. Every client and every broker
must agree on this, so both halves are reproduced bit for bit:

* ``String.hashCode()`` is ``s[0]*31^(n-1) + ... + s[n-1]`` over the string's UTF-16 code units
  (a character outside the BMP counts as its two surrogates), in wrapping signed 32-bit
  arithmetic.
* ``Utils.abs(n)`` is ``Math.abs(n)`` except that ``Integer.MIN_VALUE`` maps to 0 (``Math.abs``
  would return MIN_VALUE itself). It is *not* ``n & 0x7fffffff`` (that is ``Utils.toPositive``,
  used by the producer's partitioner): for -5 the one gives 5, the other 2147483643.
"""

from __future__ import annotations

import functools
from typing import Final

_INT32_MIN: Final = -(1 << 31)
_UINT32_MASK: Final = 0xFFFFFFFF


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()``: a signed 32-bit int."""
    # Every group request routes its group id, and a busy node sees the same ids over and over
    # (Java caches the hash in the String). Only short ids are kept: bounded memory whatever
    # the clients send.
    if len(s) <= _CACHED_MAX_CHARS:
        return _cached_hash(s)
    return _hash(s)


_CACHED_MAX_CHARS: Final = 255


@functools.lru_cache(maxsize=4096)
def _cached_hash(s: str) -> int:
    return _hash(s)


def _hash(s: str) -> int:
    # "surrogatepass" lets a lone surrogate (possible in a Python str, as in a Java String)
    # count as the one code unit it is.
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & _UINT32_MASK
    return h - (1 << 32) if h > 0x7FFFFFFF else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs`` for a signed 32-bit ``n``: ``abs(n)``, but MIN_VALUE -> 0."""
    assert _INT32_MIN <= n < -_INT32_MIN, f"{n} is not a signed 32-bit int"
    return 0 if n == _INT32_MIN else abs(n)


def partition_for(group_id: str, num_partitions: int) -> int:
    """The ``__consumer_offsets`` partition whose leader coordinates ``group_id``."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return kafka_abs(java_string_hash(group_id)) % num_partitions
