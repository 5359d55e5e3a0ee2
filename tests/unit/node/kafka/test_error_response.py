"""Error answers to requests whose handler failed (node/kafka/error_response.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kcoord.errors import Errors
from kcoord.node.kafka import codec
from kcoord.node.kafka.error_response import error_response
from tests.unit.node.kafka.test_codec import ALL_VERSIONS, GROUP_VERSIONS
from tests.unit.node.kafka.wire import decode_response

UNKNOWN = Errors.UNKNOWN_SERVER_ERROR


def answer(api_key: int, version: int, request: dict[str, Any]) -> Any:
    values = error_response(api_key, version, codec.build_request(api_key, version, request))
    assert values is not None
    frame = codec.encode_response(7, codec.build_response(api_key, version, values))
    correlation_id, body = decode_response(api_key, version, frame[4:])
    assert correlation_id == 7
    return body


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS + GROUP_VERSIONS)
def test_every_served_api_has_an_error_answer(api_key: int, version: int) -> None:
    body = answer(api_key, version, {})
    if "error_code" in codec.response_field_names(api_key, version):
        assert body.error_code == UNKNOWN


def test_entries_are_answered_as_the_request_named_them() -> None:
    produce = answer(
        0,
        9,
        {
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {"name": "a", "partition_data": [{"index": 0, "records": None}]},
                {"name": "b", "partition_data": [{"index": 3}, {"index": 5}]},
            ],
        },
    )
    assert [
        (t.name, [(p.index, p.error_code) for p in t.partition_responses])
        for t in produce.responses
    ] == [("a", [(0, UNKNOWN)]), ("b", [(3, UNKNOWN), (5, UNKNOWN)])]
    commit = answer(
        8,
        8,
        {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": 2}]}]},
    )
    assert [
        (t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in commit.topics
    ] == [("t", [(2, UNKNOWN)])]
    fetched = answer(9, 8, {"groups": [{"group_id": "g1"}, {"group_id": "g2"}]})
    assert [(g.group_id, g.error_code) for g in fetched.groups] == [
        ("g1", UNKNOWN),
        ("g2", UNKNOWN),
    ]
    described = answer(15, 5, {"groups": ["g1"]})
    assert [(g.group_id, g.error_code) for g in described.groups] == [("g1", UNKNOWN)]
    metadata = answer(3, 12, {"topics": [{"name": "t"}]})
    assert [(t.name, t.error_code) for t in metadata.topics] == [("t", UNKNOWN)]
    assert answer(3, 12, {"topics": None}).topics == ()  # all topics: none named
    configs = answer(
        32,
        4,
        {"resources": [{"resource_type": 2, "resource_name": "t", "configuration_keys": None}]},
    )
    assert [(r.resource_type, r.resource_name, r.error_code) for r in configs.results] == [
        (2, "t", UNKNOWN)
    ]
    producers = answer(61, 0, {"topics": [{"name": "t", "partition_indexes": [1, 4]}]})
    assert [(p.partition_index, p.error_code) for p in producers.topics[0].partitions] == [
        (1, UNKNOWN),
        (4, UNKNOWN),
    ]


def test_an_api_without_a_way_to_say_it_gets_none() -> None:
    """AddPartitionsToTxn v3 (not served) answers per topic, which the table does not know:
    its connection would be closed, as before."""
    assert "error_code" not in codec.response_field_names(24, 3)
    assert error_response(24, 3, codec.build_request(24, 3, {})) is None
