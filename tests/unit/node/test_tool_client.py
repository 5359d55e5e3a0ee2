"""The operator commands' Kafka client without a cluster: a scripted transport answers each
request, a fake clock advances with every backoff. Retries of coordinator and leader errors,
the deadline, and bootstrap failures; then ``kcoord topics``' pure parts."""

from __future__ import annotations

import argparse
import json
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kcoord.errors import Errors
from kcoord.node.config import Endpoint
from kcoord.node.kafka.client import NoAnswerError
from kcoord.node.tool_client import (
    CREATE_TOPICS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    LATEST_TIMESTAMP,
    LIST_OFFSETS,
    METADATA,
    PartitionMetadata,
    ToolClient,
    ToolError,
    TopicMetadata,
    TopicPartition,
    resolve_bootstrap,
)
from kcoord.node.topics_tool import describe_lines, parse_configs

Answer = Callable[[Endpoint, Mapping[str, Any]], Any]


class FakeClock:
    def __init__(self) -> None:
        self.ms = 0

    def now_ms(self) -> int:
        return self.ms

    def monotonic_ms(self) -> int:
        return self.ms

    def sleep(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


class ScriptedClient(ToolClient):
    """Answers each api with the next function of its script (the last one repeats)."""

    def __init__(self, script: dict[tuple[int, int], list[Answer]], timeout_ms: int = 1000):
        self.clock = FakeClock()
        super().__init__(
            [Endpoint("127.0.0.1", 9092), Endpoint("127.0.0.1", 9102)],
            timeout_ms=timeout_ms,
            clock=self.clock,
            sleep=self.clock.sleep,
        )
        self.script = script
        self.sent: list[tuple[tuple[int, int], str]] = []

    def send(self, endpoint: Endpoint, api: tuple[int, int], values: Mapping[str, Any]) -> Any:
        self.sent.append((api, str(endpoint)))
        answers = self.script[api]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return answer(endpoint, values)


def refused(_endpoint: Endpoint, _values: Mapping[str, Any]) -> Any:
    raise ConnectionRefusedError(111, "Connection refused")


def metadata(leader: int) -> Answer:
    brokers = [
        SimpleNamespace(node_id=i, host="127.0.0.1", port=9092 + 10 * (i - 1)) for i in (1, 2, 3)
    ]
    partition = SimpleNamespace(
        partition_index=0,
        leader_id=leader,
        leader_epoch=1,
        replica_nodes=(1, 2, 3),
        isr_nodes=(1, 2, 3),
        error_code=0,
    )
    topic = SimpleNamespace(
        name="orders", topic_id=None, is_internal=False, error_code=0, partitions=[partition]
    )
    body = SimpleNamespace(brokers=brokers, cluster_id="c", controller_id=1, topics=[topic])
    return lambda _e, _v: body


def coordinator(node_id: int, error: Errors = Errors.NONE) -> Answer:
    body = SimpleNamespace(
        error_code=error,
        error_message=None,
        node_id=node_id,
        host="127.0.0.1",
        port=9092 + 10 * (node_id - 1),
    )
    return lambda _e, _v: body


def described(error: Errors) -> Answer:
    return lambda _e, _v: SimpleNamespace(groups=[SimpleNamespace(group_id="g", error_code=error)])


def offsets(error: Errors, offset: int = 42) -> Answer:
    partition = SimpleNamespace(partition_index=0, error_code=error, offset=offset)
    return lambda _e, _v: SimpleNamespace(
        topics=[SimpleNamespace(name="orders", partitions=[partition])]
    )


def group_error(body: Any) -> int:
    return int(body.groups[0].error_code)


def test_coordinator_errors_find_the_coordinator_again_and_retry() -> None:
    client = ScriptedClient(
        {
            FIND_COORDINATOR: [coordinator(1), coordinator(2)],
            DESCRIBE_GROUPS: [described(Errors.NOT_COORDINATOR), described(Errors.NONE)],
        }
    )
    found, body = client.group_request("g", DESCRIBE_GROUPS, {}, group_error)
    assert found.node_id == 2 and group_error(body) == Errors.NONE
    # The second DescribeGroups went to the new coordinator's address.
    assert [s for s in client.sent if s[0] == DESCRIBE_GROUPS][-1][1] == "127.0.0.1:9102"


def test_retries_stop_at_the_deadline_naming_the_last_failure() -> None:
    client = ScriptedClient(
        {FIND_COORDINATOR: [coordinator(-1, Errors.COORDINATOR_NOT_AVAILABLE)]}, timeout_ms=500
    )
    with pytest.raises(ToolError) as e:
        client.find_coordinator("g")
    assert str(e.value) == (
        "timed out after 500 ms finding the coordinator of group 'g': "
        "FindCoordinator: COORDINATOR_NOT_AVAILABLE"
    )
    assert 500 <= client.clock.ms <= 600


def test_other_group_errors_are_the_callers() -> None:
    client = ScriptedClient(
        {
            FIND_COORDINATOR: [coordinator(1)],
            DESCRIBE_GROUPS: [described(Errors.GROUP_AUTHORIZATION_FAILED)],
        }
    )
    _, body = client.group_request("g", DESCRIBE_GROUPS, {}, group_error)
    assert group_error(body) == Errors.GROUP_AUTHORIZATION_FAILED
    assert client.clock.ms == 0


def test_no_bootstrap_server_answering_fails_at_once() -> None:
    client = ScriptedClient({METADATA: [refused]})
    with pytest.raises(ToolError) as e:
        client.metadata(None)
    assert str(e.value) == (
        "cannot connect to any bootstrap server: 127.0.0.1:9092 (Connection refused), "
        "127.0.0.1:9102 (Connection refused)"
    )
    assert client.clock.ms == 0


def test_a_bootstrap_server_that_took_the_request_and_did_not_answer_is_not_passed_over() -> None:
    """It may have carried the request out: a CreateTopics sent on to the next server would
    then report TOPIC_ALREADY_EXISTS for the topic the first one made."""
    sent: list[int] = []

    def silent(endpoint: Endpoint, values: Mapping[str, Any]) -> Any:
        sent.append(endpoint.port)
        raise NoAnswerError(f"no answer from {endpoint} within 2 s")

    client = ScriptedClient({METADATA: [silent]})
    with pytest.raises(ToolError) as e:
        client.metadata(None)
    assert str(e.value) == (
        "bootstrap server 127.0.0.1:9092 took the request and did not answer within 1000 ms; "
        "it may have been carried out"
    )
    assert sent == [9092]


def test_a_broker_that_took_the_request_and_did_not_answer_says_it_may_be_done() -> None:
    """A request to a group's coordinator or a partition's leader that got no answer may
    have been carried out (an OffsetCommit of a reset): the timeout said only "timed out",
    and an operator who ran a --shift-by again shifted the group twice. (review helper-222)"""

    def silent(endpoint: Endpoint, values: Mapping[str, Any]) -> Any:
        raise NoAnswerError(f"no answer from {endpoint} within 2 s")

    client = ScriptedClient({METADATA: [metadata(1)], LIST_OFFSETS: [silent]})
    with pytest.raises(ToolError, match="took the request and did not answer in time; it may"):
        client.list_offsets([TopicPartition("orders", 0)], LATEST_TIMESTAMP)


def test_the_next_bootstrap_server_answers_when_the_first_is_down() -> None:
    def only_second(endpoint: Endpoint, values: Mapping[str, Any]) -> Any:
        if endpoint.port == 9092:
            refused(endpoint, values)
        return metadata(1)(endpoint, values)

    client = ScriptedClient({METADATA: [only_second]})
    assert sorted(client.metadata(None).brokers) == [1, 2, 3]


def test_list_offsets_follows_a_leader_change() -> None:
    client = ScriptedClient(
        {
            METADATA: [metadata(1), metadata(3)],
            LIST_OFFSETS: [offsets(Errors.NOT_LEADER_OR_FOLLOWER), offsets(Errors.NONE)],
        }
    )
    assert client.list_offsets([TopicPartition("orders", 0)], LATEST_TIMESTAMP) == {
        TopicPartition("orders", 0): 42
    }
    assert [s[1] for s in client.sent if s[0] == LIST_OFFSETS] == [
        "127.0.0.1:9092",
        "127.0.0.1:9112",
    ]


def test_list_offsets_leaves_out_partitions_without_a_leader() -> None:
    client = ScriptedClient({METADATA: [metadata(-1)]})
    assert client.list_offsets([TopicPartition("orders", 0)], LATEST_TIMESTAMP) == {}
    assert client.clock.ms == 0


def test_list_offsets_fails_on_errors_that_do_not_pass() -> None:
    client = ScriptedClient(
        {METADATA: [metadata(1)], LIST_OFFSETS: [offsets(Errors.TOPIC_AUTHORIZATION_FAILED)]}
    )
    with pytest.raises(ToolError, match="ListOffsets for orders-0: TOPIC_AUTHORIZATION_FAILED"):
        client.list_offsets([TopicPartition("orders", 0)], LATEST_TIMESTAMP)


def test_default_bootstrap_is_the_local_clusters(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="no --bootstrap-server given and no cluster state in"):
        resolve_bootstrap(None, tmp_path)
    node = {
        "host": "127.0.0.1",
        "rpc_port": 1,
        "quorum_port": 2,
        "admin_port": 3,
        "directory": str(tmp_path),
    }
    state = {
        "data_dir": str(tmp_path),
        "nodes": [
            {**node, "node_id": 1, "kafka_port": 19092},
            {**node, "node_id": 2, "kafka_port": 19102},
        ],
    }
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    assert [str(e) for e in resolve_bootstrap(None, tmp_path)] == [
        "127.0.0.1:19092",
        "127.0.0.1:19102",
    ]
    assert [str(e) for e in resolve_bootstrap("h:1, [::1]:2", tmp_path)] == ["h:1", "[::1]:2"]
    with pytest.raises(ToolError, match="invalid --bootstrap-server 'h'"):
        resolve_bootstrap("h", tmp_path)


# -- kcoord topics -----------------------------------------------------------------------------


def test_topic_description_lines() -> None:
    topic = TopicMetadata(
        name="orders",
        topic_id="hkHG8G6ZQZ2tS-Fe-jcB2g",
        is_internal=False,
        error_code=0,
        partitions=(
            PartitionMetadata(0, 3, 0, (3, 1, 2), (3, 1), 0),
            PartitionMetadata(1, -1, 0, (1, 3, 2), (), 0),
        ),
    )
    assert describe_lines(topic, [("retention.ms", "1000"), ("cleanup.policy", "compact")]) == [
        "Topic: orders\tTopicId: hkHG8G6ZQZ2tS-Fe-jcB2g\tPartitionCount: 2\tReplicationFactor: 3"
        "\tConfigs: retention.ms=1000,cleanup.policy=compact",
        "\tTopic: orders\tPartition: 0\tLeader: 3\tReplicas: 3,1,2\tIsr: 3,1",
        "\tTopic: orders\tPartition: 1\tLeader: none\tReplicas: 1,3,2\tIsr: ",
    ]


def test_topic_configs_are_key_value_pairs() -> None:
    assert parse_configs(["retention.ms = 1000", "cleanup.policy=compact"]) == [
        ("retention.ms", "1000"),
        ("cleanup.policy", "compact"),
    ]
    assert parse_configs(None) == []
    # Java's split drops trailing empty strings: "k=" is one piece, "k=v=" is k=v.
    assert parse_configs(["retention.ms=1", "segment.ms=2=", "retention.ms=3"]) == [
        ("retention.ms", "3"),
        ("segment.ms", "2"),
    ]
    for bad in ("retention.ms", "a=b=c", "=1", "retention.ms=", "retention.ms = "):
        with pytest.raises(ToolError, match='format "key=val"'):
            parse_configs([bad])


def test_a_value_past_its_fields_range_is_a_tool_error_and_nothing_is_sent() -> None:
    """``--partitions 3000000000`` does not fit CreateTopics' int32: a clear error, not a
    traceback (the encoding fails before any connection: port 1 is never dialled)."""
    client = ToolClient([Endpoint("127.0.0.1", 1)], timeout_ms=1000)
    values = {
        "topics": [
            {
                "name": "t",
                "num_partitions": 3_000_000_000,
                "replication_factor": 1,
                "assignments": [],
                "configs": [],
            }
        ],
        "timeout": 1000,
        "validate_only": False,
    }
    with pytest.raises(ToolError, match="does not fit"):
        client.send_any(CREATE_TOPICS, values)


def test_a_timeout_past_int32_is_refused_before_anything_is_sent() -> None:
    """Requests carry the timeout as an int32, and a socket cannot wait 10^14 ms either."""
    from kcoord.node.tool_client import client_from_args

    for bad in (0, 2**31, 10**14):
        args = SimpleNamespace(timeout_ms=bad, bootstrap_server="127.0.0.1:1", data_dir=".")
        with pytest.raises(ToolError, match="--timeout-ms must be between 1 and 2147483647"):
            client_from_args(args)  # type: ignore[arg-type]
    args = SimpleNamespace(timeout_ms=2**31 - 1, bootstrap_server="127.0.0.1:1", data_dir=".")
    assert client_from_args(args).timeout_ms == 2**31 - 1  # type: ignore[arg-type]


def test_an_answer_that_does_not_decode_is_a_tool_error_not_a_traceback() -> None:
    """kio's BufferUnderflow got past the tool's error handling: a full stack trace instead of
    the one-line message and exit 1 the README promises."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
                conn.recv(size, socket.MSG_WAITALL)
                body = struct.pack(">i", 1) + b"\x00\x07garbage"
                conn.sendall(struct.pack(">i", len(body)) + body)

    server = threading.Thread(target=answer_garbage, daemon=True)
    server.start()
    client = ToolClient([Endpoint("127.0.0.1", port)], timeout_ms=5000)
    with pytest.raises(ToolError, match=r"not decode as Metadata v12.*may have been carried out"):
        client.metadata(None)
    server.join(5)
    assert not server.is_alive()


def test_topic_describe_reports_only_the_partitions_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--under-replicated-partitions`` and the other report options of kafka-topics.sh
    were missing (argparse refused them). Each prints only its partitions, without the
    topic's line (TopicCommand's DescribeOptions)."""
    from kcoord.node import topics_tool
    from kcoord.node.tool_client import API_VERSIONS, DESCRIBE_CONFIGS

    def partition(index: int, leader: int, isr: tuple[int, ...]) -> SimpleNamespace:
        return SimpleNamespace(
            partition_index=index,
            leader_id=leader,
            leader_epoch=1,
            replica_nodes=(1, 2, 3),
            isr_nodes=isr,
            error_code=0,
        )

    brokers = [SimpleNamespace(node_id=i, host="127.0.0.1", port=9092 + i) for i in (1, 2)]
    topic = SimpleNamespace(
        name="orders",
        topic_id=None,
        is_internal=False,
        error_code=0,
        partitions=[
            partition(0, 1, (1, 2, 3)),  # healthy
            partition(1, 2, (2, 1)),  # one replica out of the ISR: at min ISR (2)
            partition(2, 3, (3,)),  # led by broker 3, which is not live; under min ISR
            partition(3, -1, (1,)),  # no leader
        ],
    )
    body = SimpleNamespace(brokers=brokers, cluster_id="c", controller_id=1, topics=[topic])
    versions = SimpleNamespace(
        error_code=0,
        api_keys=[SimpleNamespace(api_key=DESCRIBE_CONFIGS[0], min_version=0, max_version=4)],
    )
    min_isr = SimpleNamespace(name="min.insync.replicas", value="2")
    configs = SimpleNamespace(
        results=[SimpleNamespace(error_code=0, resource_name="orders", configs=[min_isr])]
    )
    client = ScriptedClient(
        {
            METADATA: [lambda _e, _v: body],
            API_VERSIONS: [lambda _e, _v: versions],
            DESCRIBE_CONFIGS: [lambda _e, _v: configs],
        }
    )
    expected = {
        "under_replicated_partitions": [1, 2, 3],
        "unavailable_partitions": [2, 3],
        "under_min_isr_partitions": [2, 3],
        "at_min_isr_partitions": [1],
    }
    for report, partitions in expected.items():
        args = SimpleNamespace(
            topic=["orders"], exclude_internal=False, if_exists=False, **{report: True}
        )
        assert topics_tool._describe(client, args) == 0  # type: ignore[arg-type]
        lines = capsys.readouterr().out.splitlines()
        assert [int(line.split("\tPartition: ")[1].split("\t")[0]) for line in lines] == (
            partitions
        ), report
        assert all(line.startswith("\tTopic: orders\tPartition: ") for line in lines)
    parser = argparse.ArgumentParser()
    topics_tool.add_parser(parser.add_subparsers(), Path("."))
    with pytest.raises(SystemExit):  # one report option at a time, as Kafka's
        parser.parse_args(
            ["topics", "describe", "--under-replicated-partitions", "--unavailable-partitions"]
        )
