"""Group -> ``__consumer_offsets`` partition must match Kafka exactly, or clients go elsewhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcoord.cluster.routing import java_string_hash, kafka_abs, partition_for

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("ab", 97 * 31 + 98),
        ("hello", 99162322),  # the classic Java example
        # Well-known strings whose hashCode() is Integer.MIN_VALUE.
        ("polygenelubricants", INT32_MIN),
        ("GydZG_", INT32_MIN),
        ("DESIGNING WORKHOUSES", INT32_MIN),
        # U+1F600 is two UTF-16 code units, 0xD83D 0xDE00: 0xD83D * 31 + 0xDE00.
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
        ("a\U0001f600", (97 * 31 + 0xD83D) * 31 + 0xDE00),
        ("\u00e9", 0xE9),  # one BMP code unit, not its two UTF-8 bytes
        ("\ud800", 0xD800),  # a lone surrogate counts as itself
        ("my-group", -1906497762),
    ],
)
def test_java_string_hash(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected


@given(
    st.text(alphabet=st.characters(max_codepoint=0xFFFF), max_size=30)
    | st.text(alphabet=st.characters(max_codepoint=0xFFFF), min_size=250, max_size=300)
)
def test_java_string_hash_is_the_polynomial_mod_2_32_for_bmp_strings(s: str) -> None:
    # The closed form s[0]*31^(n-1) + ... + s[n-1], then two's-complement wrap to 32 bits;
    # long ids too (they are not cached), twice (the second from the cache if short).
    n = len(s)
    total = sum(ord(c) * 31 ** (n - 1 - i) for i, c in enumerate(s)) % 2**32
    expected = total - 2**32 if total >= 2**31 else total
    assert java_string_hash(s) == expected
    assert java_string_hash(s) == expected
    assert INT32_MIN <= expected <= INT32_MAX


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, 0), (5, 5), (-5, 5), (INT32_MAX, INT32_MAX), (-INT32_MAX, INT32_MAX), (INT32_MIN, 0)],
)
def test_kafka_abs(n: int, expected: int) -> None:
    assert kafka_abs(n) == expected


@pytest.mark.parametrize(
    ("group_id", "expected"),
    [
        # Seen in real logs: Strimzi's docs dump group "my-group" from __consumer_offsets-12,
        # and a console consumer's "group01" lived in __consumer_offsets-42 (50 partitions).
        # "my-group" hashes negative: n & 0x7fffffff would give 36, not 12.
        ("my-group", 12),
        ("group01", 42),
        ("", 0),
        ("a", 97 % 50),
        ("hello", 99162322 % 50),
        ("polygenelubricants", 0),  # MIN_VALUE -> 0
    ],
)
def test_partition_for_50_partitions(group_id: str, expected: int) -> None:
    assert partition_for(group_id, 50) == expected


@given(st.text(max_size=30), st.integers(1, 1000))
def test_partition_for_is_in_range(group_id: str, num_partitions: int) -> None:
    assert 0 <= partition_for(group_id, num_partitions) < num_partitions


def test_partition_for_rejects_no_partitions() -> None:
    with pytest.raises(ValueError, match="positive"):
        partition_for("g", 0)
