"""The answer to a request whose handler failed unexpectedly (Kafka's ``getErrorResponse``).

Kafka's ``KafkaApis.handle`` catches whatever a handler throws and answers the request with
its API's error response (``RequestHandlerHelper.handleError``): the error code of the
exception, UNKNOWN_SERVER_ERROR for an unexpected one and without its message
(``ApiError.fromThrowable`` keeps the details out of the answer), set where the response
carries one. It closes the connection only when there is no response to send (an acks=0
produce). A client then fails that request alone, with a non-retriable error, instead of
reconnecting and sending it again, for ever if the failure is deterministic, and the
requests it pipelined behind it keep their answers.

An API whose response has a top-level ``error_code`` gets it set, and nothing else. The others
(Produce, ListOffsets, Metadata, OffsetCommit...) carry their errors per entry: the answer
names every entry the request named, each with the error, as each API's
``getErrorResponse`` builds it (``_MIRRORS``). An API in neither case gets None, and its
connection is closed as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka import codec


@dataclass(frozen=True, slots=True)
class _Mirror:
    """A response list built from a request list: one entry per request entry, carrying the
    error. ``keys`` copies request fields into the entry (response name -> request name), or,
    when the request's entries are plain values (group ids, partition numbers), names the
    response field that takes each; ``inner`` does the same one level down."""

    response: str
    request: str
    keys: Mapping[str, str] | str
    inner: tuple[_Mirror, ...] = ()


def _topics(response: str, request: str, name: str, *inner: _Mirror) -> _Mirror:
    """Topic entries, named as the request names them (by name, by id, or both)."""
    return _Mirror(response, request, {name: name, "topic_id": "topic_id"}, inner)


def _partitions(response: str, request: str, keys: Mapping[str, str] | str) -> _Mirror:
    return _Mirror(response, request, keys)


_RESOURCE: Final = {"resource_type": "resource_type", "resource_name": "resource_name"}
# topics[name, partitions[partition_index]] in the request and the response alike.
_TOPIC_PARTITIONS: Final = _topics(
    "topics",
    "topics",
    "name",
    _partitions("partitions", "partitions", {"partition_index": "partition_index"}),
)

# By api key: the response lists an error answer fills (an empty tuple: none, the answer
# names nothing, as Kafka's DescribeLogDirs v0-2 error response).
_MIRRORS: Final[Mapping[int, tuple[_Mirror, ...]]] = {
    0: (  # Produce
        _topics(
            "responses",
            "topic_data",
            "name",
            _partitions("partition_responses", "partition_data", {"index": "index"}),
        ),
    ),
    1: (  # Fetch v4-6 (v7+ has a top-level error)
        _topics(
            "responses",
            "topics",
            "topic",
            _partitions("partitions", "partitions", {"partition_index": "partition"}),
        ),
    ),
    2: (_TOPIC_PARTITIONS,),  # ListOffsets
    3: (_topics("topics", "topics", "name"),),  # Metadata
    8: (_TOPIC_PARTITIONS,),  # OffsetCommit
    9: (  # OffsetFetch v1 (per partition) and v8+ (per group)
        _topics(
            "topics",
            "topics",
            "name",
            _partitions("partitions", "partition_indexes", "partition_index"),
        ),
        _Mirror("groups", "groups", {"group_id": "group_id"}),
    ),
    10: (_Mirror("coordinators", "coordinator_keys", "key"),),  # FindCoordinator v4+
    15: (_Mirror("groups", "groups", "group_id"),),  # DescribeGroups
    19: (_Mirror("topics", "topics", {"name": "name"}),),  # CreateTopics
    20: (  # DeleteTopics: by name before v6, by name or id from v6
        _Mirror("responses", "topic_names", "name"),
        _Mirror("responses", "topics", {"name": "name", "topic_id": "topic_id"}),
    ),
    21: (_TOPIC_PARTITIONS,),  # DeleteRecords
    23: (  # OffsetForLeaderEpoch
        _topics(
            "topics",
            "topics",
            "topic",
            _partitions("partitions", "partitions", {"partition": "partition"}),
        ),
    ),
    30: (_Mirror("results", "creations", {}),),  # CreateAcls
    31: (_Mirror("filter_results", "filters", {}),),  # DeleteAcls
    32: (_Mirror("results", "resources", _RESOURCE),),  # DescribeConfigs
    33: (_Mirror("responses", "resources", _RESOURCE),),  # AlterConfigs
    35: (),  # DescribeLogDirs v1-2
    37: (_Mirror("results", "topics", {"name": "name"}),),  # CreatePartitions
    42: (_Mirror("results", "groups_names", "group_id"),),  # DeleteGroups
    43: (  # ElectLeaders v0
        _topics(
            "replica_election_results",
            "topic_partitions",
            "topic",
            _partitions("partition_result", "partitions", "partition_id"),
        ),
    ),
    44: (_Mirror("responses", "resources", _RESOURCE),),  # IncrementalAlterConfigs
    61: (  # DescribeProducers
        _topics(
            "topics",
            "topics",
            "name",
            _partitions("partitions", "partition_indexes", "partition_index"),
        ),
    ),
    69: (_Mirror("groups", "group_ids", "group_id"),),  # ConsumerGroupDescribe
    75: (_topics("topics", "topics", "name"),),  # DescribeTopicPartitions
}


def _mirrored(mirror: _Mirror, request: Any, error: int) -> list[dict[str, Any]]:
    entries = []
    for item in getattr(request, mirror.request, None) or ():
        if isinstance(mirror.keys, str):
            entry: dict[str, Any] = {mirror.keys: item}
        else:
            entry = {
                ours: getattr(item, theirs)
                for ours, theirs in mirror.keys.items()
                if hasattr(item, theirs)
            }
        entry["error_code"] = error
        for inner in mirror.inner:
            entry[inner.response] = _mirrored(inner, item, error)
        entries.append(entry)
    return entries


def error_response(
    api_key: int, version: int, request: Any, error: int = Errors.UNKNOWN_SERVER_ERROR
) -> dict[str, Any] | None:
    """The values of the answer to ``request`` that fails with ``error``, for
    ``codec.build_response``; None if the API has no way to say it (see the docstring)."""
    fields = codec.response_field_names(api_key, version)
    if "error_code" in fields:
        return {"error_code": error}
    mirrors = _MIRRORS.get(api_key)
    if mirrors is None:
        return None
    values: dict[str, Any] = {}
    for mirror in mirrors:
        if mirror.response in fields and hasattr(request, mirror.request):
            values[mirror.response] = _mirrored(mirror, request, error)
    return values
