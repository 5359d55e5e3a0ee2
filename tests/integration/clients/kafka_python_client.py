"""kafka-python speaking to a kcoord cluster; see README.md in this directory."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

DEADLINE_S = 60.0
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


@contextmanager
def _admin(cmd: dict[str, Any]) -> Iterator[KafkaAdminClient]:
    """An admin client of ``cmd``'s cluster, closed after the block."""
    admin = KafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    try:
        yield admin
    finally:
        admin.close()


def create_topic(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        admin.create_topics(
            [NewTopic(cmd["topic"], cmd["partitions"], cmd["replication_factor"])],
            timeout_ms=30_000,
        )
    return "created"


def produce(cmd: dict[str, Any]) -> Any:
    # kafka-python 2.1+ defaults to enable_idempotence=True and acks=all (KIP-679).
    producer = KafkaProducer(
        bootstrap_servers=cmd["bootstrap"],
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=30_000,
    )
    try:
        futures = [
            (
                value,
                producer.send(cmd["topic"], key=value.encode(), value=value.encode()),
            )
            for value in (f"{cmd['prefix']}-{i}" for i in range(cmd["count"]))
        ]
        producer.flush(timeout=DEADLINE_S)
        out = []
        for value, future in futures:
            md = future.get(timeout=DEADLINE_S)
            out.append([md.partition, md.offset, md.timestamp, value])
    finally:
        producer.close(timeout=10)
    return out


def consume(cmd: dict[str, Any]) -> Any:
    consumer = KafkaConsumer(
        bootstrap_servers=cmd["bootstrap"], group_id=None, enable_auto_commit=False
    )
    try:
        tps = [TopicPartition(cmd["topic"], p) for p in cmd["partitions"]]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < cmd["expect"] and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out.extend([tp.partition, r.offset, r.timestamp, r.value.decode()] for r in records)
    finally:
        consumer.close()
    return out


def offsets(cmd: dict[str, Any]) -> Any:
    consumer = KafkaConsumer(bootstrap_servers=cmd["bootstrap"], group_id=None)
    try:
        tps = {p: TopicPartition(cmd["topic"], p) for p in cmd["partitions"]}
        earliest = consumer.beginning_offsets(list(tps.values()))
        latest = consumer.end_offsets(list(tps.values()))
        found = consumer.offsets_for_times({tps[int(p)]: ts for p, ts in cmd["timestamps"].items()})
    finally:
        consumer.close()
    return {
        "earliest": {tp.partition: o for tp, o in earliest.items()},
        "latest": {tp.partition: o for tp, o in latest.items()},
        "by_time": {tp.partition: (None if o is None else o.offset) for tp, o in found.items()},
    }


def leaders(cmd: dict[str, Any]) -> Any:
    consumer = KafkaConsumer(bootstrap_servers=cmd["bootstrap"], group_id=None)
    try:
        consumer.topics()  # a metadata request for every topic
        cluster = consumer._client.cluster
        return {
            p: cluster.leader_for_partition(TopicPartition(cmd["topic"], p))
            for p in sorted(cluster.partitions_for_topic(cmd["topic"]) or ())
        }
    finally:
        consumer.close()


def create_partitions(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        admin.create_partitions({cmd["topic"]: cmd["partitions"]}, timeout_ms=30_000)
    return "created"


def committed(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        offsets = admin.list_group_offsets({cmd["group"]: None})[cmd["group"]]
    return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == cmd["topic"]}


def describe_group(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        coordinator = admin._manager.run(admin._find_coordinator_id, cmd["group"])
        group = admin.describe_groups(
            [cmd["group"]], group_coordinator_id=coordinator, include_authorized_operations=True
        )
        group = group[cmd["group"]]
    members = []
    for m in group["members"]:
        assignment = m["member_assignment"] or {"assigned_partitions": []}
        partitions = [
            p
            for tps in assignment["assigned_partitions"]
            if tps["topic"] == cmd["topic"]
            for p in tps["partitions"]
        ]
        members.append(
            {
                "member_id": m["member_id"],
                "instance_id": m["group_instance_id"],
                "partitions": sorted(partitions),
            }
        )
    return {
        "coordinator": coordinator,
        "state": group["group_state"],
        "members": members,
        "operations": sorted(group["authorized_operations"]),
    }


def describe_configs(cmd: dict[str, Any]) -> Any:
    kind = ConfigResourceType.TOPIC if cmd["resource"] == "topic" else ConfigResourceType.BROKER
    with _admin(cmd) as admin:
        result = admin.describe_configs([ConfigResource(kind, cmd["name"])], config_filter="all")
    (by_name,) = result.values()  # {"topic" or "broker": {name: {key: entry}}}
    entries = by_name[cmd["name"]]
    return {key: [e["value"], e["config_source"]] for key, e in entries.items()}


def alter_configs(cmd: dict[str, Any]) -> Any:
    """The legacy AlterConfigs, to which kafka-python adds the topic's other own configs."""
    with _admin(cmd) as admin:
        result = admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, cmd["topic"], configs=cmd["configs"])],
            incremental=False,
        )
    outcome = result["topic"][cmd["topic"]]
    return {"error": 0} if outcome == "OK" else {"error": outcome}


def delete_records(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        result = admin.delete_records(
            {TopicPartition(cmd["topic"], int(p)): o for p, o in cmd["offsets"].items()},
            timeout_ms=30_000,
        )
    return {tp.partition: answer["low_watermark"] for tp, answer in result.items()}


def elect_leaders(cmd: dict[str, Any]) -> Any:
    """A preferred election for ``partitions`` (null: every partition) -> {partition: error}."""
    partitions = cmd["partitions"]
    with _admin(cmd) as admin:
        response = admin.elect_leaders(
            0, None if partitions is None else {cmd["topic"]: partitions}, raise_errors=False
        )
    return {
        p.partition_id: p.error_code
        for r in response.replica_election_results
        if r.topic == cmd["topic"]
        for p in r.partition_result
    }


def describe_log_dirs(cmd: dict[str, Any]) -> Any:
    """Every broker's log dirs -> {broker: {partition: size}} for ``topic``."""
    with _admin(cmd) as admin:
        answers = admin.describe_log_dirs()
    return {
        answer["broker"]: {
            p["partition_index"]: p["partition_size"]
            for d in answer["log_dirs"]
            for t in d["topics"]
            if t["name"] == cmd["topic"]
            for p in t["partitions"]
        }
        for answer in answers
    }


def acls(cmd: dict[str, Any]) -> Any:
    """Describe, create and delete an ACL -> the error class name of each answer."""
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.errors import KafkaError

    pattern = ResourcePattern(ResourceType.TOPIC, cmd["topic"], ACLResourcePatternType.LITERAL)
    acl = ACL("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW, pattern)
    match = ACLFilter(
        "User:alice",
        "*",
        ACLOperation.ANY,
        ACLPermissionType.ANY,
        ResourcePatternFilter(ResourceType.TOPIC, cmd["topic"], ACLResourcePatternType.LITERAL),
    )
    answers: dict[str, Any] = {}
    with _admin(cmd) as admin:
        try:
            admin.describe_acls(match)
            answers["describe"] = "NoError"
        except KafkaError as e:
            answers["describe"] = [type(e).__name__, str(e)]
        created = admin.create_acls([acl])
        answers["create"] = [error.__name__ for error in created["failed"]]  # error classes
        deleted = admin.delete_acls([match])
        answers["delete"] = [error.__name__ for _, _, error in deleted]
    return answers


def timestamps(cmd: dict[str, Any]) -> Any:
    """As aiokafka_client.timestamps. Without idempotence (the other two clients' default):
    kafka-python 3.0's idempotent producer takes any batch refused for good as fatal and fails
    every later send (``TransactionManager.classify_batch_error``), where Java's goes on."""
    from kafka.errors import KafkaError

    producer = KafkaProducer(
        bootstrap_servers=cmd["bootstrap"], acks="all", enable_idempotence=False
    )
    produced: list[Any] = []
    try:
        for ts in cmd["timestamps"]:
            try:
                md = producer.send(cmd["topic"], b"v", partition=0, timestamp_ms=ts).get(
                    timeout=DEADLINE_S
                )
            except KafkaError as e:
                produced.append([type(e).__name__, None])
            else:
                produced.append([None, md.timestamp])
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=cmd["bootstrap"], group_id=None)
    try:
        tp = TopicPartition(cmd["topic"], 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        consumed: list[Any] = []
        expect = sum(1 for error, _ in produced if error is None)
        deadline = time.monotonic() + DEADLINE_S
        while len(consumed) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                consumed.extend(
                    [r.offset, TIMESTAMP_TYPES[r.timestamp_type], r.timestamp] for r in records
                )
    finally:
        consumer.close()
    return {"produced": produced, "consumed": consumed}


def transactions(cmd: dict[str, Any]) -> Any:
    """init_transactions() of a transactional producer -> [error class name, message]."""
    from kafka.errors import KafkaError

    producer = KafkaProducer(
        bootstrap_servers=cmd["bootstrap"],
        transactional_id=cmd["transactional_id"],
        max_block_ms=int(cmd["timeout_s"] * 1000),
    )
    try:
        producer.init_transactions()
    except KafkaError as e:
        return [type(e).__name__, str(e)]
    finally:
        producer.close(timeout=5)
    return "NONE"


def describe_cluster(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        described = admin.describe_cluster()
    operations = described.get("authorized_operations")  # names, from DescribeCluster
    return {
        "cluster_id": described["cluster_id"],
        "controller": described["controller_id"],
        "brokers": sorted([b["broker_id"], b["host"], b["port"]] for b in described["brokers"]),
        "operations": None if operations is None else sorted(operations),
    }


def describe_features(cmd: dict[str, Any]) -> Any:
    with _admin(cmd) as admin:
        return admin.describe_features()


def describe_topic_partitions(cmd: dict[str, Any]) -> Any:
    """Every partition of the topic, a page of ``limit`` partitions at a time (KIP-966)."""
    partitions: list[list[Any]] = []
    pages = 0
    cursor = None
    with _admin(cmd) as admin:
        while True:
            page = admin.describe_topic_partitions(
                [cmd["topic"]], response_partition_limit=cmd["limit"], cursor=cursor
            )
            pages += 1
            for topic in page["topics"]:
                assert topic["error_code"] == 0, topic
                for p in topic["partitions"]:
                    partitions.append(
                        [
                            p["partition_index"],
                            p["leader_id"],
                            sorted(p["isr_nodes"]),
                            p["eligible_leader_replicas"],
                        ]
                    )
            cursor = page["next_cursor"]
            if cursor is None:
                break
    return {"pages": pages, "partitions": partitions}


def describe_producers(cmd: dict[str, Any]) -> Any:
    """``{partition: [[producer id, epoch, last sequence], ...]}`` at each partition's leader."""
    with _admin(cmd) as admin:
        states = admin.describe_producers(
            [TopicPartition(cmd["topic"], p) for p in cmd["partitions"]]
        )
    return {
        str(tp.partition): [
            [p.producer_id, p.producer_epoch, p.last_sequence] for p in state.active_producers
        ]
        for tp, state in states.items()
    }


def list_transactions(cmd: dict[str, Any]) -> Any:
    """ListTransactions at every broker, and kafka-transactions.sh's --find-hanging."""
    with _admin(cmd) as admin:
        listed = admin.list_transactions()
        hanging = admin.find_hanging_transactions()
    return {
        "listed": {str(node): [str(t) for t in found] for node, found in listed.items()},
        "hanging": [str(t) for t in hanging],
    }


def main() -> None:
    cmd = json.loads(sys.argv[1])
    ops = {
        "create_topic": create_topic,
        "produce": produce,
        "consume": consume,
        "offsets": offsets,
        "leaders": leaders,
        "create_partitions": create_partitions,
        "committed": committed,
        "describe_group": describe_group,
        "describe_cluster": describe_cluster,
        "describe_features": describe_features,
        "describe_producers": describe_producers,
        "list_transactions": list_transactions,
        "describe_topic_partitions": describe_topic_partitions,
        "describe_configs": describe_configs,
        "alter_configs": alter_configs,
        "delete_records": delete_records,
        "elect_leaders": elect_leaders,
        "describe_log_dirs": describe_log_dirs,
        "acls": acls,
        "transactions": transactions,
        "timestamps": timestamps,
    }
    print(json.dumps(ops[cmd["op"]](cmd)), flush=True)


if __name__ == "__main__":
    main()
