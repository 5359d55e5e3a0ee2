"""confluent-kafka (librdkafka) speaking to a kcoord cluster; see README.md here."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    ConsumerGroupTopicPartitions,
    ElectionType,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# The package re-exports these without declaring it; mypy --strict wants their own modules.
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewPartitions, NewTopic

DEADLINE_S = 60.0
TIMESTAMP_TYPES = {TIMESTAMP_CREATE_TIME: "CreateTime", TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}


def create_topic(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    futures = admin.create_topics(
        [
            NewTopic(
                cmd["topic"],
                cmd["partitions"],
                cmd["replication_factor"],
                config=cmd.get("configs") or {},
            )
        ],
        operation_timeout=30,
    )
    for future in futures.values():
        try:
            future.result(timeout=DEADLINE_S)
        except KafkaException as e:
            if not cmd.get("expect_error"):
                raise
            return {"error": e.args[0].code(), "message": e.args[0].str()}
    return "created"


# librdkafka sends GROUP as Kafka's ConfigResource type 32 (KIP-848 group configs).
_RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "broker": ResourceType.BROKER,
    "group": ResourceType.GROUP,
}


def describe_configs(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    resource = ConfigResource(_RESOURCE_TYPES[cmd["resource"]], cmd["name"])
    entries = admin.describe_configs([resource])[resource].result(timeout=DEADLINE_S)
    return {name: [entry.value, _source_name(entry.source)] for name, entry in entries.items()}


def _source_name(source: int) -> str:
    return ConfigSource(source).name


def alter_configs(cmd: dict[str, Any]) -> Any:
    """IncrementalAlterConfigs with ``ops`` [[key, "SET"|"DELETE"|"APPEND"|"SUBTRACT", value]]
    on ``topic``, or on ``group`` (its KIP-848 group configs)."""
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    kind = "group" if "group" in cmd else "topic"
    resource = ConfigResource(
        _RESOURCE_TYPES[kind],
        cmd[kind],
        incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType[op])
            for key, op, value in cmd["ops"]
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        try:
            future.result(timeout=DEADLINE_S)
        except KafkaException as e:
            return {"error": e.args[0].code(), "message": e.args[0].str()}
    return {"error": 0}


def delete_records(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    futures = admin.delete_records(
        [TopicPartition(cmd["topic"], int(p), o) for p, o in cmd["offsets"].items()],
        operation_timeout=30,
    )
    return {
        tp.partition: future.result(timeout=DEADLINE_S).low_watermark
        for tp, future in futures.items()
    }


def elect_leaders(cmd: dict[str, Any]) -> Any:
    """A preferred election for ``partitions`` (null: every partition) -> {partition: error}."""
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    partitions = cmd["partitions"]
    future = admin.elect_leaders(
        ElectionType.PREFERRED,
        None if partitions is None else [TopicPartition(cmd["topic"], p) for p in partitions],
    )
    return {
        tp.partition: 0 if error is None else error.code()
        for tp, error in future.result(timeout=DEADLINE_S).items()
        if tp.topic == cmd["topic"]
    }


def acls(cmd: dict[str, Any]) -> Any:
    """Describe, create and delete an ACL -> the error name of each answer."""
    from confluent_kafka.admin._acl import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
    )
    from confluent_kafka.admin._resource import ResourcePatternType

    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    binding = AclBinding(
        ResourceType.TOPIC,
        cmd["topic"],
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    match = AclBindingFilter(
        ResourceType.TOPIC,
        cmd["topic"],
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.ANY,
        AclPermissionType.ANY,
    )

    def error_of(future: Any) -> Any:
        try:
            future.result(timeout=30)
        except KafkaException as e:
            return [e.args[0].name(), e.args[0].str()]
        return "NONE"

    return {
        "describe": error_of(admin.describe_acls(match)),
        "create": error_of(admin.create_acls([binding])[binding]),
        "delete": error_of(admin.delete_acls([match])[match]),
    }


def transactions(cmd: dict[str, Any]) -> Any:
    """init_transactions() of a transactional producer -> [error name, message, fatal]."""
    producer = Producer(
        {"bootstrap.servers": cmd["bootstrap"], "transactional.id": cmd["transactional_id"]}
    )
    try:
        producer.init_transactions(cmd["timeout_s"])
    except KafkaException as e:
        error = e.args[0]
        return [error.name(), error.str(), error.fatal()]
    return "NONE"


def produce_one(cmd: dict[str, Any]) -> Any:
    """One keyed record of ``size`` bytes to ``partition``; the delivery error's code, or 0."""
    producer = Producer({"bootstrap.servers": cmd["bootstrap"], "acks": "all"})
    errors: list[Any] = []
    producer.produce(
        cmd["topic"],
        key=b"k",
        value=b"x" * cmd["size"],
        partition=cmd["partition"],
        on_delivery=lambda error, _: errors.append(error),
    )
    producer.flush(DEADLINE_S)
    if not errors:
        raise KafkaException("no delivery report")
    return 0 if errors[0] is None else errors[0].code()


def timestamps(cmd: dict[str, Any]) -> Any:
    """As aiokafka_client.timestamps; errors by librdkafka's name."""
    producer = Producer({"bootstrap.servers": cmd["bootstrap"], "acks": "all"})
    produced: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        produced.append([error.name(), None] if error else [None, message.timestamp()[1]])

    for ts in cmd["timestamps"]:
        producer.produce(cmd["topic"], b"v", partition=0, timestamp=ts, on_delivery=delivered)
        if producer.flush(DEADLINE_S):
            raise KafkaException("a record was not delivered in time")
    consumer = consumer_for(cmd)
    try:
        consumer.assign([TopicPartition(cmd["topic"], 0, OFFSET_BEGINNING)])
        consumed: list[Any] = []
        expect = sum(1 for error, _ in produced if error is None)
        deadline = time.monotonic() + DEADLINE_S
        while len(consumed) < expect and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.5):
                if message.error():
                    raise KafkaException(message.error())
                kind, ts = message.timestamp()
                consumed.append([message.offset(), TIMESTAMP_TYPES[kind], ts])
    finally:
        consumer.close()
    return {"produced": produced, "consumed": consumed}


def produce(cmd: dict[str, Any]) -> Any:
    producer = Producer(
        {
            "bootstrap.servers": cmd["bootstrap"],
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    out: list[Any] = []
    errors: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(str(error))
            return
        out.append(
            [
                message.partition(),
                message.offset(),
                message.timestamp()[1],
                message.value().decode(),
            ]
        )

    for i in range(cmd["count"]):
        value = f"{cmd['prefix']}-{i}"
        producer.produce(
            cmd["topic"], key=value.encode(), value=value.encode(), on_delivery=delivered
        )
        producer.poll(0)
    remaining = producer.flush(DEADLINE_S)
    if errors or remaining:
        raise KafkaException(f"{len(errors)} failed, {remaining} unsent: {errors[:3]}")
    return out


def consumer_for(cmd: dict[str, Any]) -> Consumer:
    # librdkafka insists on a group.id even for manual assignment; nothing is committed.
    return Consumer(
        {
            "bootstrap.servers": cmd["bootstrap"],
            "group.id": "kcoord-tests-unused",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )


def consume(cmd: dict[str, Any]) -> Any:
    consumer = consumer_for(cmd)
    try:
        consumer.assign(
            [TopicPartition(cmd["topic"], p, OFFSET_BEGINNING) for p in cmd["partitions"]]
        )
        out: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < cmd["expect"] and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.5):
                if message.error():
                    raise KafkaException(message.error())
                out.append(
                    [
                        message.partition(),
                        message.offset(),
                        message.timestamp()[1],
                        (message.value() or b"").decode(),
                    ]
                )
    finally:
        consumer.close()
    return out


def offsets(cmd: dict[str, Any]) -> Any:
    consumer = consumer_for(cmd)
    try:
        earliest, latest = {}, {}
        for p in cmd["partitions"]:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(cmd["topic"], p), timeout=30, cached=False
            )
            earliest[p], latest[p] = low, high
        found = consumer.offsets_for_times(
            [TopicPartition(cmd["topic"], int(p), ts) for p, ts in cmd["timestamps"].items()],
            timeout=30,
        )
    finally:
        consumer.close()
    return {
        "earliest": earliest,
        "latest": latest,
        "by_time": {tp.partition: (None if tp.offset < 0 else tp.offset) for tp in found},
    }


def leaders(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    metadata = admin.list_topics(topic=cmd["topic"], timeout=30)
    topic = metadata.topics[cmd["topic"]]
    if topic.error is not None:
        raise KafkaException(topic.error)
    return {p: part.leader for p, part in sorted(topic.partitions.items())}


def create_partitions(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    futures = admin.create_partitions(
        [NewPartitions(cmd["topic"], cmd["partitions"])], operation_timeout=30
    )
    for future in futures.values():
        future.result(timeout=DEADLINE_S)
    return "created"


def committed(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(cmd["group"])])
    result = futures[cmd["group"]].result(timeout=DEADLINE_S)
    return {
        tp.partition: tp.offset for tp in result.topic_partitions or () if tp.topic == cmd["topic"]
    }


def describe_group(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    described = admin.describe_consumer_groups([cmd["group"]], include_authorized_operations=True)
    group = described[cmd["group"]].result(timeout=DEADLINE_S)
    members = [
        {
            "member_id": m.member_id,
            "instance_id": m.group_instance_id,
            "partitions": sorted(
                tp.partition
                for tp in (m.assignment.topic_partitions if m.assignment else ())
                if tp.topic == cmd["topic"]
            ),
        }
        for m in group.members
    ]
    state = group.state.name if hasattr(group.state, "name") else str(group.state)
    operations = sorted(op.name for op in group.authorized_operations or ())
    return {
        "coordinator": group.coordinator.id,
        "type": group.type.name,  # CONSUMER from ConsumerGroupDescribe, CLASSIC otherwise
        "state": state,
        "members": members,
        "operations": operations,
    }


def describe_cluster(cmd: dict[str, Any]) -> Any:
    admin = AdminClient({"bootstrap.servers": cmd["bootstrap"]})
    described = admin.describe_cluster(include_authorized_operations=True).result(
        timeout=DEADLINE_S
    )
    operations = described.authorized_operations
    return {
        "cluster_id": described.cluster_id,
        "controller": described.controller.id if described.controller else None,
        "brokers": sorted([n.id, n.host, n.port] for n in described.nodes),
        "operations": None if operations is None else sorted(op.name for op in operations),
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
        "describe_configs": describe_configs,
        "alter_configs": alter_configs,
        "produce_one": produce_one,
        "delete_records": delete_records,
        "elect_leaders": elect_leaders,
        "acls": acls,
        "transactions": transactions,
        "timestamps": timestamps,
    }
    print(json.dumps(ops[cmd["op"]](cmd)), flush=True)


if __name__ == "__main__":
    main()
