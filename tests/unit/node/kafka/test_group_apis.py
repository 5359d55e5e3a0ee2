"""The group APIs' answers when the coordinator runtime cannot serve a shard (no cluster: a
runtime stand-in raises what the real one raises)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kcoord.cluster.coordinator.consumer import TopicsSnapshot
from kcoord.cluster.coordinator.shard import GroupConfig
from kcoord.cluster.coordinator.types import (
    ConsumerGroupDescribeResponse,
    DescribedConsumerGroup,
    DescribedConsumerGroupMember,
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
    OffsetFetchResponse,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
)
from kcoord.errors import Errors
from kcoord.node.kafka import codec
from kcoord.node.kafka.apis import PARTITIONS_PER_SLICE, ApiRegistry, Deferred, Request
from kcoord.node.kafka.context import BrokerContext
from kcoord.node.kafka.groups import (
    CONSUMER_GROUP_DESCRIBE_KEY,
    CONSUMER_GROUP_HEARTBEAT_KEY,
    DELETE_GROUPS_KEY,
    DESCRIBE_GROUPS_KEY,
    HEARTBEAT_KEY,
    JOIN_GROUP_KEY,
    LIST_GROUPS_KEY,
    OFFSET_DELETE_KEY,
    OFFSET_FETCH_KEY,
    GroupApi,
)
from kcoord.node.runtime import CoordinatorError, CoordinatorRuntime
from kcoord.raft import records as rec
from kcoord.raft.image import MetadataImage
from tests.unit.node.kafka.test_codec import GROUP_ADVERTISED


class _Runtime:
    """Every shard of this node is loading; ``list_groups`` answers from ``shards``."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards
        self.config = GroupConfig()

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        raise CoordinatorError(Errors.COORDINATOR_LOAD_IN_PROGRESS)

    def list_groups(self, request: Any) -> list[asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for shard in self.shards:
            future: asyncio.Future[Any] = loop.create_future()
            if isinstance(shard, Exception):
                future.set_exception(shard)
            else:
                future.set_result(shard)
            futures.append(future)
        return futures


def _api(runtime: _Runtime) -> GroupApi:
    """The group APIs on ``runtime``, with a broker context holding an empty image."""
    context = SimpleNamespace(image=MetadataImage())
    return GroupApi(cast(BrokerContext, context), cast(CoordinatorRuntime, runtime))


def _request(api_key: int, version: int, values: dict[str, Any]) -> Request:
    body = codec.build_request(api_key, version, values)
    return Request(codec.RequestHeader(api_key, version, 1, "c"), body)


def _heartbeat_request(**fields: Any) -> Request:
    """A ConsumerGroupHeartbeat v0: a new member's first, with ``fields`` in its place."""
    values: dict[str, Any] = {
        "group_id": "g",
        "member_id": "",
        "member_epoch": 0,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": 1000,
        "subscribed_topic_names": None,
        "server_assignor": None,
        "topic_partitions": [],
    }
    return _request(CONSUMER_GROUP_HEARTBEAT_KEY, 0, values | fields)


async def _answer(result: Any) -> Any:
    return await result.awaitable if isinstance(result, Deferred) else result


def test_a_heartbeat_to_a_loading_shard_is_answered_none() -> None:
    """GroupCoordinatorService.heartbeat: "the group is still loading, so blindly respond";
    the Java client has no branch for COORDINATOR_LOAD_IN_PROGRESS in a heartbeat answer."""

    async def scenario() -> None:
        request = _request(
            HEARTBEAT_KEY,
            4,
            {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None},
        )
        answer = await _answer(await _api(_Runtime([])).handle_heartbeat(request))
        assert answer["error_code"] is Errors.NONE

    asyncio.run(scenario())


def test_list_groups_answers_a_shards_failure_instead_of_leaving_its_groups_out() -> None:
    """A shard that timed out (COORDINATOR_NOT_AVAILABLE) made its groups vanish from the list
    with no error; only one that moved away (NOT_COORDINATOR) is skipped, as in Kafka's
    GroupCoordinatorService.listGroups. The shards after a failed one are awaited too: their
    failures were never retrieved, an error asyncio logged for each."""
    unretrieved: list[str] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: unretrieved.append(context["message"])
        )
        request = _request(LIST_GROUPS_KEY, 4, {"states_filter": []})
        moved = CoordinatorError(Errors.NOT_COORDINATOR)
        answer = await _answer(await _api(_Runtime([moved])).handle_list_groups(request))
        assert (answer["error_code"], answer["groups"]) == (Errors.NONE, [])
        failed = CoordinatorError(Errors.COORDINATOR_NOT_AVAILABLE)
        shards = [moved, failed, CoordinatorError(Errors.REQUEST_TIMED_OUT)]
        answer = await _answer(await _api(_Runtime(shards)).handle_list_groups(request))
        assert answer["error_code"] is Errors.COORDINATOR_NOT_AVAILABLE

    asyncio.run(scenario())
    gc.collect()  # the futures, held by the failures' tracebacks until the scenario ends
    assert unretrieved == []


class _CountingRuntime(_Runtime):
    """Every shard is loading; each submit notes the loop's tick it came at."""

    def __init__(self) -> None:
        super().__init__([])
        self.ticks = 0
        self.seen: list[int] = []

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        self.seen.append(self.ticks)
        return super().submit(group_id, call, replay_only=replay_only)

    async def tick(self) -> None:
        """Counts the loop's turns, as the other connections' work would take them."""
        while True:
            self.ticks += 1
            await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("api_key", "empty_ids"),
    [
        (DESCRIBE_GROUPS_KEY, False),
        (OFFSET_FETCH_KEY, False),
        (DELETE_GROUPS_KEY, False),
        (CONSUMER_GROUP_DESCRIBE_KEY, False),
        (CONSUMER_GROUP_DESCRIBE_KEY, True),
    ],
)
def test_a_request_naming_many_groups_lets_the_loop_run_as_it_goes(
    api_key: int, empty_ids: bool
) -> None:
    """DescribeGroups, OffsetFetch v8+, DeleteGroups and ConsumerGroupDescribe call the
    coordinator a slice of groups at a time: a DescribeGroups of 300,000 group ids held the
    loop for 21 s (the node missed its heartbeats), a DeleteGroups of 50,000 for a second, and
    a ConsumerGroupDescribe of a million empty ids (each answered at once, INVALID_GROUP_ID)
    for 4 s. Every group is still answered, in request order, and every group's call is made
    before the handler returns: the reader runs the next request's handler only then, so a
    request pipelined behind this one (an OffsetCommit to the last group) reaches its shard
    after, not between two slices."""
    count = 3 * PARTITIONS_PER_SLICE + 7
    ids = ["" if empty_ids else f"g{i}" for i in range(count)]

    async def scenario() -> None:
        runtime = _CountingRuntime()

        task = asyncio.create_task(runtime.tick())
        if api_key == DESCRIBE_GROUPS_KEY:
            request = _request(api_key, 5, {"groups": ids, "include_authorized_operations": False})
        elif api_key == DELETE_GROUPS_KEY:
            request = _request(api_key, 2, {"groups_names": ids})
        elif api_key == CONSUMER_GROUP_DESCRIBE_KEY:
            body = {"group_ids": ids, "include_authorized_operations": False}
            request = _request(api_key, 0, body)
        else:
            groups = [
                {"group_id": g, "member_id": None, "member_epoch": -1, "topics": None} for g in ids
            ]
            request = _request(api_key, 9, {"groups": groups, "require_stable": False})
        started = runtime.ticks
        result = await getattr(_api(runtime), _HANDLERS[api_key])(request)
        submitted = len(runtime.seen)
        answer = await _answer(result)
        ticks = runtime.ticks - started
        task.cancel()
        groups = answer["results" if api_key == DELETE_GROUPS_KEY else "groups"]
        assert [g["group_id"] for g in groups] == ids
        if empty_ids:  # nothing reaches the coordinator: the loop still ran in between
            assert runtime.seen == [] and ticks >= count // PARTITIONS_PER_SLICE
            return
        assert max(Counter(runtime.seen).values()) <= PARTITIONS_PER_SLICE
        assert submitted == len(runtime.seen) == count

    asyncio.run(scenario())


class _FetchingRuntime(_CountingRuntime):
    """The shard too: every partition asked for answers its index times ten."""

    def committed_fetch(self, group_id: str, member_id: str | None) -> None:
        return None

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        self.seen.append(self.ticks)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(call(self, 0, 0))
        return future

    def handle_offset_fetch(self, token: int, req: Any, now: int, committed: Any) -> Any:
        if req.group_id == "fenced":
            return OffsetFetchResponse(group_id="fenced", error_code=Errors.STALE_MEMBER_EPOCH)
        return OffsetFetchResponse(
            group_id=req.group_id,
            topics=tuple(
                OffsetFetchResponseTopic(
                    name=tp.name,
                    partitions=tuple(
                        OffsetFetchResponsePartition(partition_index=i, committed_offset=i * 10)
                        for i in tp.partition_indexes
                    ),
                )
                for tp in req.topics
            ),
        )


@pytest.mark.parametrize("version", [7, 9])
def test_an_offset_fetch_of_many_partitions_of_one_group_lets_the_loop_run(version: int) -> None:
    """One group naming many partitions was one shard call walking them all, and its answer
    counted two entries, built on the loop: a million partitions held every connection for
    10 s. The group's partitions are read in pieces of ``PARTITIONS_PER_SLICE``, the loop
    running between them, and answered as one group, in request order."""
    count = 3 * PARTITIONS_PER_SLICE + 7
    topics = [
        {"name": "a", "partition_indexes": list(range(count - 10))},
        {"name": "b", "partition_indexes": []},
        {"name": "c", "partition_indexes": list(range(10))},
    ]

    async def scenario() -> None:
        runtime = _FetchingRuntime()

        task = asyncio.create_task(runtime.tick())
        if version >= 8:
            groups = [
                {"group_id": g, "member_id": None, "member_epoch": -1, "topics": topics}
                for g in ("g", "fenced")
            ]
            groups.append({"group_id": "none", "member_id": None, "member_epoch": -1})
            groups[-1]["topics"] = []
            request = _request(
                OFFSET_FETCH_KEY, version, {"groups": groups, "require_stable": False}
            )
        else:
            values = {"group_id": "g", "topics": topics, "require_stable": False}
            request = _request(OFFSET_FETCH_KEY, version, values)
        answer = await _answer(await _api(runtime).handle_offset_fetch(request))
        task.cancel()
        calls = 2 * 4 + 1 if version >= 8 else 4
        assert len(runtime.seen) == calls and len(set(runtime.seen)) >= calls // 2
        group = answer["groups"][0] if version >= 8 else answer
        assert group["error_code"] is Errors.NONE
        assert [
            (t["name"], [(p["partition_index"], p["committed_offset"]) for p in t["partitions"]])
            for t in group["topics"]
        ] == [
            ("a", [(i, i * 10) for i in range(count - 10)]),
            ("b", []),
            ("c", [(i, i * 10) for i in range(10)]),
        ]
        if version >= 8:
            fenced = answer["groups"][1]
            assert (fenced["group_id"], fenced["error_code"], list(fenced["topics"])) == (
                "fenced",
                Errors.STALE_MEMBER_EPOCH,
                [],
            )
            none = answer["groups"][2]
            assert (none["group_id"], none["error_code"], list(none["topics"])) == (
                "none",
                Errors.NONE,
                [],
            )

    asyncio.run(scenario())


class _PendingRuntime(_Runtime):
    """Every shard takes its calls and answers none yet."""

    def __init__(self) -> None:
        super().__init__([])
        self.futures: list[asyncio.Future[Any]] = []

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future


@pytest.mark.parametrize("cancelled", ["making the calls", "awaiting the answers"])
def test_a_request_naming_many_groups_whose_connection_closes_leaves_nothing_unawaited(
    cancelled: str,
) -> None:
    """The connection closes (the handler or its answer is cancelled) part way through a
    DeleteGroups of three slices: every answer already asked for is closed, not left a
    coroutine never awaited (a RuntimeWarning each, an error in the test run)."""
    count = 3 * PARTITIONS_PER_SLICE
    request = _request(DELETE_GROUPS_KEY, 2, {"groups_names": [f"g{i}" for i in range(count)]})

    async def scenario() -> None:
        runtime = _PendingRuntime()
        handler = asyncio.create_task(_api(runtime).handle_delete_groups(request))
        if cancelled == "making the calls":
            while len(runtime.futures) <= PARTITIONS_PER_SLICE:
                await asyncio.sleep(0)
            handler.cancel()
            with pytest.raises(asyncio.CancelledError):
                await handler
            assert len(runtime.futures) < count
            return
        answer = asyncio.create_task(_answer(await handler))
        await asyncio.sleep(0)  # it awaits the first group's answer
        assert len(runtime.futures) == count and not answer.done()
        answer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await answer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


_HANDLERS = {
    DESCRIBE_GROUPS_KEY: "handle_describe_groups",
    OFFSET_FETCH_KEY: "handle_offset_fetch",
    DELETE_GROUPS_KEY: "handle_delete_groups",
    CONSUMER_GROUP_DESCRIBE_KEY: "handle_consumer_group_describe",
}


def test_bad_join_and_consumer_heartbeat_requests_are_answered_before_routing() -> None:
    """GroupCoordinatorService checks a JoinGroup's session timeout and a
    ConsumerGroupHeartbeat's fields before it routes the request: every node answers the
    error, also one whose shard is loading (which answered COORDINATOR_LOAD_IN_PROGRESS, the
    real error only once loaded)."""

    async def scenario() -> None:
        api = _api(_Runtime([]))
        # No metadata here: routed, a request gets the loading shard's answer, not a crash.
        api._topics_view = lambda: TopicsSnapshot({}, 0)  # type: ignore[method-assign]
        join = _request(
            JOIN_GROUP_KEY,
            5,
            {
                "group_id": "g",
                "session_timeout": 1,  # below group.min.session.timeout.ms
                "rebalance_timeout": 1000,
                "member_id": "",
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocols": [],
            },
        )
        answer = await _answer(await api.handle_join_group(join))
        assert answer["error_code"] is Errors.INVALID_SESSION_TIMEOUT
        heartbeat = _request(
            CONSUMER_GROUP_HEARTBEAT_KEY,
            0,
            {
                "group_id": "g",
                "member_id": "m",
                "member_epoch": -3,
                "instance_id": None,
                "rack_id": None,
                "rebalance_timeout": -1,
                "subscribed_topic_names": None,
                "server_assignor": None,
                "topic_partitions": None,
            },
        )
        answer = await _answer(await api.handle_consumer_group_heartbeat(heartbeat))
        assert answer["error_code"] is Errors.INVALID_REQUEST
        assert answer["error_message"] == "MemberEpoch -3 is invalid."

    asyncio.run(scenario())


@pytest.mark.parametrize(("version", "protocol_name"), [(6, ""), (9, None)])
def test_a_join_the_runtime_fails_is_answered_its_error_alone(
    version: int, protocol_name: str | None
) -> None:
    """GroupCoordinatorService.joinGroup answers a failed operation (a loading shard) with the
    error alone: the request's member id was echoed. An empty protocol name goes out as null
    from v7 (JoinGroupResponse's constructor): it went out as "" from every version."""

    async def scenario() -> None:
        api = _api(_Runtime([]))
        api._topics_view = lambda: TopicsSnapshot({}, 0)  # type: ignore[method-assign]
        values: dict[str, Any] = {
            "group_id": "g",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "m-1",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [],
        }
        if version >= 8:
            values["reason"] = None
        answer = await _answer(
            await api.handle_join_group(_request(JOIN_GROUP_KEY, version, values))
        )
        assert answer["error_code"] is Errors.COORDINATOR_LOAD_IN_PROGRESS
        assert (answer["member_id"], answer["protocol_name"]) == ("", protocol_name)
        # The group id is checked before routing: that answer names the member.
        values["group_id"] = ""
        answer = await _answer(
            await api.handle_join_group(_request(JOIN_GROUP_KEY, version, values))
        )
        assert answer["error_code"] is Errors.INVALID_GROUP_ID
        assert (answer["member_id"], answer["protocol_name"]) == ("m-1", protocol_name)

    asyncio.run(scenario())


class _FlagsRuntime(_Runtime):
    """Every shard is loading; each submit notes its ``replay_only``."""

    def __init__(self) -> None:
        super().__init__([])
        self.flags: list[bool] = []

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        self.flags.append(replay_only)
        return super().submit(group_id, call, replay_only=replay_only)


@pytest.mark.parametrize(
    ("api_key", "version", "values", "read"),
    [
        (OFFSET_FETCH_KEY, 5, {"group_id": "g", "topics": None, "require_stable": False}, True),
        (DESCRIBE_GROUPS_KEY, 5, {"groups": ["g"], "include_authorized_operations": False}, True),
        (
            CONSUMER_GROUP_DESCRIBE_KEY,
            0,
            {"group_ids": ["g"], "include_authorized_operations": False},
            True,
        ),
        (DELETE_GROUPS_KEY, 2, {"groups_names": ["g"]}, True),
        (
            OFFSET_DELETE_KEY,
            0,
            {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]},
            True,
        ),
        (
            HEARTBEAT_KEY,
            3,
            {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None},
            False,
        ),
    ],
)
def test_reads_fail_alone_when_their_shard_call_raises(
    api_key: int, version: int, values: dict[str, Any], read: bool
) -> None:
    """Kafka's read operations (OffsetFetch, DescribeGroups, ConsumerGroupDescribe) change
    nothing: one that raises fails alone. They went to the shard as calls that may have changed
    a group, and a raising one reloaded every group of the partition, at each retry. So do
    DeleteGroups and OffsetDelete, which change it through their tombstones alone: one whose
    write the log refused (too many tombstones for a batch) reloaded the partition."""

    async def scenario() -> None:
        runtime = _FlagsRuntime()
        api = _api(runtime)
        api._topics_view = lambda: TopicsSnapshot({}, 0)  # type: ignore[method-assign]
        handler = {
            OFFSET_FETCH_KEY: api.handle_offset_fetch,
            DESCRIBE_GROUPS_KEY: api.handle_describe_groups,
            CONSUMER_GROUP_DESCRIBE_KEY: api.handle_consumer_group_describe,
            HEARTBEAT_KEY: api.handle_heartbeat,
            DELETE_GROUPS_KEY: api.handle_delete_groups,
            OFFSET_DELETE_KEY: api.handle_offset_delete,
        }[api_key]
        await _answer(await handler(_request(api_key, version, values)))
        assert runtime.flags == [read]

    asyncio.run(scenario())


def test_delete_groups_deletes_each_group_named_once() -> None:
    """KafkaApis.handleDeleteGroupsRequest takes the distinct group ids: a group named twice
    is deleted and answered once. Sent twice to its shard, the second delete answered
    GROUP_ID_NOT_FOUND after the first (found by a review)."""

    async def scenario() -> None:
        runtime = _FlagsRuntime()
        request = _request(DELETE_GROUPS_KEY, 2, {"groups_names": ["g", "h", "g"]})
        answer = await _answer(await _api(runtime).handle_delete_groups(request))
        assert [r["group_id"] for r in answer["results"]] == ["g", "h"]
        assert len(runtime.flags) == 2, "one call to the shard a group"

    asyncio.run(scenario())


class _UnavailableRuntime(_Runtime):
    """Every shard's write timed out: COORDINATOR_NOT_AVAILABLE."""

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        raise CoordinatorError(Errors.COORDINATOR_NOT_AVAILABLE)


@pytest.mark.parametrize("version", [1, 5, 7, 8, 9])
def test_offset_fetch_answers_not_coordinator_for_an_unavailable_coordinator(version: int) -> None:
    """Clients before 3.9 do not retry COORDINATOR_NOT_AVAILABLE on OffsetFetch (a consumer
    failed at start-up or after a rebalance): Kafka answers NOT_COORDINATOR instead, which they
    retry after finding the coordinator again (GroupCoordinatorService's
    handleOffsetFetchException). From v2 on, for the group alone, with no partitions; before
    v2, which has no group error, on each partition named, at offset -1
    (OffsetFetchResponse.groupError: every partition carried it at every version)."""
    topics = [{"name": "t", "partition_indexes": [0, 1]}]
    if version >= 8:
        values: dict[str, Any] = {
            "groups": [
                {"group_id": "g", "topics": topics}
                | ({"member_id": None, "member_epoch": -1} if version >= 9 else {})
            ],
            "require_stable": False,
        }
    else:
        values = {"group_id": "g", "topics": topics, "require_stable": False}

    async def scenario() -> None:
        request = _request(OFFSET_FETCH_KEY, version, values)
        answer = await _answer(await _api(_UnavailableRuntime([])).handle_offset_fetch(request))
        group = answer["groups"][0] if version >= 8 else answer
        assert group["error_code"] is Errors.NOT_COORDINATOR
        partitions = [p for topic in group["topics"] for p in topic["partitions"]]
        if version >= 2:
            assert partitions == []
        else:
            assert [(p["error_code"], p["committed_offset"]) for p in partitions] == [
                (Errors.NOT_COORDINATOR, -1)
            ] * 2

    asyncio.run(scenario())


def test_without_the_consumer_protocol_its_apis_answer_unsupported_version() -> None:
    """group.coordinator.rebalance.protocols without consumer: ConsumerGroupHeartbeat and
    every group of a ConsumerGroupDescribe are UNSUPPORTED_VERSION before anything else is
    looked at (KafkaApis.isConsumerGroupProtocolEnabled), the empty group id included."""

    async def scenario() -> None:
        runtime = _Runtime([])
        runtime.config = GroupConfig(rebalance_protocols=("classic",))
        heartbeat = _heartbeat_request(group_id="g", subscribed_topic_names=["t"])
        answer = await _answer(await _api(runtime).handle_consumer_group_heartbeat(heartbeat))
        assert answer["error_code"] is Errors.UNSUPPORTED_VERSION
        describe = _request(
            CONSUMER_GROUP_DESCRIBE_KEY,
            0,
            {"group_ids": ["g", ""], "include_authorized_operations": False},
        )
        answer = await _answer(await _api(runtime).handle_consumer_group_describe(describe))
        assert [(g["group_id"], g["error_code"]) for g in answer["groups"]] == [
            ("g", Errors.UNSUPPORTED_VERSION),
            ("", Errors.UNSUPPORTED_VERSION),
        ]

    asyncio.run(scenario())


class _DescribingRuntime(_Runtime):
    """Its shard describes ``group``, whatever the call."""

    def __init__(self, group: DescribedConsumerGroup) -> None:
        super().__init__([])
        self.group = group

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(ConsumerGroupDescribeResponse(groups=(self.group,)))
        return future


def test_a_consumer_group_describe_leaves_out_a_deleted_topic() -> None:
    """ConsumerGroupMember.topicPartitionsFromMap leaves out a topic the metadata no longer
    has (a member's assignment names it until its next heartbeat); kcoord described it with
    an empty name, which an admin client takes for a topic named ""."""
    gone = "AAAAAAAAAAAAAAAAAAAAAQ"  # no topic of the (empty) image
    member = DescribedConsumerGroupMember(
        member_id="m",
        instance_id=None,
        rack_id=None,
        member_epoch=3,
        client_id="c",
        client_host="/127.0.0.1",
        subscribed_topic_names=("t",),
        subscribed_topic_regex=None,
        assignment=((gone, (0, 1)),),
        target_assignment=((gone, (0, 1)),),
    )
    group = DescribedConsumerGroup(group_id="g", group_state="Stable", members=(member,))

    async def scenario() -> None:
        describe = _request(
            CONSUMER_GROUP_DESCRIBE_KEY,
            0,
            {"group_ids": ["g"], "include_authorized_operations": False},
        )
        runtime = _DescribingRuntime(group)
        answer = await _answer(await _api(runtime).handle_consumer_group_describe(describe))
        (described,) = answer["groups"][0]["members"]
        assert described["assignment"]["topic_partitions"] == []
        assert described["target_assignment"]["topic_partitions"] == []

    asyncio.run(scenario())


def test_the_group_apis_serve_the_versions_the_codec_tests_round_trip() -> None:
    registry = ApiRegistry()
    _api(_Runtime([])).register(registry.register)
    assert {k: v for k, v in registry.versions.items() if k != 18} == GROUP_ADVERTISED


class _DeletingRuntime(_Runtime):
    """A shard that deletes every offset asked for: one answer per topic entry, in order."""

    def submit(self, group_id: str, call: Any, *, replay_only: bool = False) -> Any:
        class Shard:
            def handle_offset_delete(self, token: int, req: Any, now: int) -> Any:
                return OffsetDeleteResponse(
                    topics=tuple(
                        OffsetDeleteResponseTopic(
                            name=topic.name,
                            partitions=tuple(
                                OffsetDeleteResponsePartition(partition_index=p.partition_index)
                                for p in topic.partitions
                            ),
                        )
                        for topic in req.topics
                    )
                )

        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(call(Shard(), 1, 0))
        return future


def test_offset_delete_answers_every_partition_of_a_topic_named_twice() -> None:
    """A topic listed twice (a client writing an unsorted partition list): the shard's two
    answers for it raised AttributeError after the tombstones were written (UNKNOWN_SERVER_ERROR
    for offsets already gone), and of a topic missing from the metadata only the last entry's
    partitions were answered. Every partition gets its answer, under one entry per topic, as
    ``OffsetDeleteResponse.Builder.merge`` (found by a review, helper-249)."""
    topic_id = "TTTTTTTTTTTTTTTTTTTTTg"
    image = MetadataImage.from_records(
        1,
        [rec.Topic("t", topic_id, {})]
        + [
            rec.Partition(topic_id, p, (1,), (1,), leader=1, leader_epoch=0, partition_epoch=0)
            for p in (0, 1)
        ],
    )
    api = GroupApi(
        cast(BrokerContext, SimpleNamespace(image=image)),
        cast(CoordinatorRuntime, _DeletingRuntime([])),
    )
    values = {
        "group_id": "g",
        "topics": [
            {"name": "nope", "partitions": [{"partition_index": 0}]},
            {"name": "t", "partitions": [{"partition_index": 0}]},
            {"name": "nope", "partitions": [{"partition_index": 1}]},
            {"name": "t", "partitions": [{"partition_index": 7}, {"partition_index": 1}]},
        ],
    }

    async def scenario(values: dict[str, Any]) -> Any:
        return await _answer(await api.handle_offset_delete(_request(OFFSET_DELETE_KEY, 0, values)))

    # With nothing of KafkaApis' own, the coordinator's answer as it is (Builder.merge).
    known_only = {
        "group_id": "g",
        "topics": [
            {"name": "t", "partitions": [{"partition_index": 0}]},
            {"name": "t", "partitions": [{"partition_index": 1}]},
        ],
    }
    answer = asyncio.run(scenario(known_only))
    assert [(t["name"], len(t["partitions"])) for t in answer["topics"]] == [("t", 1), ("t", 1)]
    answer = asyncio.run(scenario(values))
    assert answer["error_code"] is Errors.NONE
    got = {
        topic["name"]: sorted((p["partition_index"], p["error_code"]) for p in topic["partitions"])
        for topic in answer["topics"]
    }
    assert len(answer["topics"]) == 2
    assert got == {
        "nope": [(0, Errors.UNKNOWN_TOPIC_OR_PARTITION), (1, Errors.UNKNOWN_TOPIC_OR_PARTITION)],
        "t": [(0, Errors.NONE), (1, Errors.NONE), (7, Errors.UNKNOWN_TOPIC_OR_PARTITION)],
    }


def test_a_heartbeat_refused_before_routing_carries_no_member_id() -> None:
    """GroupCoordinatorService answers a ConsumerGroupHeartbeat that fails its checks with
    the error code and message only: the member id was echoed back."""

    async def scenario() -> Any:
        heartbeat = _heartbeat_request(
            group_id="", member_id="AAAAAAAAAAAAAAAAAAAAAA", member_epoch=1, topic_partitions=None
        )
        return await _answer(await _api(_Runtime([])).handle_consumer_group_heartbeat(heartbeat))

    answer = asyncio.run(scenario())
    assert answer["error_code"] is Errors.INVALID_REQUEST
    assert answer["member_id"] is None
