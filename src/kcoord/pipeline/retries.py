"""Retrying the offset lookups librdkafka hands back at the first retriable answer.

The admin client's ``list_offsets`` and a consumer's ``get_watermark_offsets`` and
``offsets_for_times`` raise a partition leader's retriable errors at once: OFFSET_NOT_AVAILABLE,
which a Kafka broker (kcoord too) answers while a new leader's high watermark is below the
start of its epoch, and LEADER_NOT_AVAILABLE / NOT_LEADER_FOR_PARTITION around a leader change.
Kafka's Java client retries them (its ``OffsetFetcher`` and the admin client's
``ListOffsetsHandler`` treat them as retriable); ``retrying`` does the same, every
``retry.backoff.ms`` (100, Kafka's default) until a deadline, and raises anything else at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, TypeVar

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRIABLE_CODES: Final = frozenset(
    {
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        # librdkafka's own while a leader is down or moving: no leader in its metadata yet
        # ("No leaders found"), a connection lost or timed out. A query failed on the first
        # of them (Spark's source asks again, fetchOffset.numRetries).
        KafkaError._NOENT,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)
RETRY_BACKOFF_S: Final = 0.1
# The answers that say a partition is not there (its topic deleted): the broker's, or
# librdkafka's own when its metadata no longer has it.
GONE_CODES: Final = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC}
)


def error_code(error: object) -> int | None:
    """The code of a KafkaError, or of the one a KafkaException carries."""
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else None
    return error.code() if isinstance(error, KafkaError) else None


def is_retriable(e: KafkaException) -> bool:
    return error_code(e) in RETRIABLE_CODES


def is_gone(e: KafkaException) -> bool:
    return error_code(e) in GONE_CODES


def retrying(call: Callable[[], T], what: str, deadline_s: float) -> T:
    """``call()``, again after each retriable KafkaException until ``deadline_s`` have passed
    (then the last one is raised)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except KafkaException as e:
            if not is_retriable(e) or time.monotonic() + RETRY_BACKOFF_S > deadline:
                raise
            log.info("%s: %s; asking again", what, e)
        time.sleep(RETRY_BACKOFF_S)  # retry.backoff.ms before asking again
