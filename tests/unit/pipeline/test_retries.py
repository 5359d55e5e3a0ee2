"""``retrying``: a leader's retriable answers are asked again, anything else is raised."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from kcoord.pipeline.retries import retrying


def call_after(codes: list[int], result: str = "done") -> Callable[[], str]:
    """A call that raises each of ``codes`` in turn (taking it off), then answers."""

    def call() -> str:
        if codes:
            raise KafkaException(KafkaError(codes.pop(0)))
        return result

    return call


def test_retriable_answers_are_asked_again() -> None:
    codes = [KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE]
    codes.append(KafkaError.NOT_LEADER_FOR_PARTITION)
    assert retrying(call_after(codes), "test", 5.0) == "done"
    assert codes == []
    # librdkafka's own while a leader is down or moving (the query ended on the first).
    codes = [KafkaError._NOENT, KafkaError._TRANSPORT, KafkaError._TIMED_OUT]
    assert retrying(call_after(codes), "test", 5.0) == "done"


def test_other_errors_and_the_deadline_raise() -> None:
    codes = [KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.OFFSET_NOT_AVAILABLE]
    with pytest.raises(KafkaException) as refused:
        retrying(call_after(codes), "test", 5.0)
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert codes == [KafkaError.OFFSET_NOT_AVAILABLE]  # not asked again
    codes = [KafkaError.OFFSET_NOT_AVAILABLE] * 100
    with pytest.raises(KafkaException) as late:
        retrying(call_after(codes), "test", 0.25)
    assert late.value.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE
    assert 95 <= len(codes) < 100  # asked a few times, every 100 ms, then given up
