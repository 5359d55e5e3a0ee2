"""``kcoord topics``' ``--topic``: Kafka's ``IncludeList`` regular expression, as
``kafka-topics.sh --describe`` and ``--delete`` read it."""

from __future__ import annotations

import pytest

from kcoord.node.tool_client import ToolError, TopicMetadata
from kcoord.node.topics_tool import matching_topics

TOPICS = {
    name: TopicMetadata(name, "id", name.startswith("__"), 0, ())
    for name in ("orders", "orders.v2", "ordersXv2", "payments", "__consumer_offsets")
}


@pytest.mark.parametrize(
    ("patterns", "exclude_internal", "expected"),
    [
        (["orders"], False, ["orders"]),  # a whole name, not a prefix
        (["orders.*"], False, ["orders", "orders.v2", "ordersXv2"]),
        (["orders.v2"], False, ["orders.v2", "ordersXv2"]),  # '.' is any character, as Kafka's
        (["orders,payments"], False, ["orders", "payments"]),  # a comma is '|'
        ([" 'pay.*' "], False, ["payments"]),  # quotes and spaces dropped
        (["payments", "orders", "payments"], False, ["orders", "payments"]),  # each once, sorted
        ([".*"], True, ["orders", "orders.v2", "ordersXv2", "payments"]),
        (["__.*"], False, ["__consumer_offsets"]),
    ],
)
def test_topic_patterns_match_whole_names(
    patterns: list[str], exclude_internal: bool, expected: list[str]
) -> None:
    assert matching_topics(patterns, TOPICS, exclude_internal) == expected


@pytest.mark.parametrize(
    ("patterns", "exclude_internal", "message"),
    [
        (["orders", "refunds"], False, "Topic 'refunds' does not exist as expected"),
        (["order"], False, "Topic 'order' does not exist as expected"),
        (["__consumer_offsets"], True, "Topic '__consumer_offsets' does not exist as expected"),
        (["orders("], False, "--topic 'orders(' is not a regular expression"),
    ],
)
def test_a_pattern_matching_no_topic_is_an_error(
    patterns: list[str], exclude_internal: bool, message: str
) -> None:
    """TopicCommand.ensureTopicExists: nothing matched is an error, not an empty answer; nor is
    a pattern that does not compile a traceback."""
    with pytest.raises(ToolError, match=message.replace("(", r"\(")):
        matching_topics(patterns, TOPICS, exclude_internal)


def test_without_patterns_every_topic_matches_and_if_exists_forgives_none() -> None:
    assert matching_topics(None, TOPICS, True) == ["orders", "orders.v2", "ordersXv2", "payments"]
    assert matching_topics(["refunds", "pay.*"], TOPICS, False, if_exists=True) == ["payments"]
