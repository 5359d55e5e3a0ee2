"""aiokafka speaking to a kcoord cluster; see README.md in this directory."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.coordinator.protocol import ConsumerProtocol

DEADLINE_S = 60.0
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


async def create_topic(cmd: dict[str, Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(cmd["topic"], cmd["partitions"], cmd["replication_factor"])],
            timeout_ms=30_000,
        )
    finally:
        await admin.close()
    return "created"


async def produce(cmd: dict[str, Any]) -> Any:
    producer = AIOKafkaProducer(
        bootstrap_servers=cmd["bootstrap"],
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=30_000,
    )
    await producer.start()
    try:
        futures = []
        for i in range(cmd["count"]):
            value = f"{cmd['prefix']}-{i}"
            futures.append(
                (value, await producer.send(cmd["topic"], value.encode(), key=value.encode()))
            )
        out = []
        for value, future in futures:
            md = await asyncio.wait_for(future, DEADLINE_S)
            out.append([md.partition, md.offset, md.timestamp, value])
    finally:
        await producer.stop()
    return out


async def consume(cmd: dict[str, Any]) -> Any:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cmd["bootstrap"], group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(cmd["topic"], p) for p in cmd["partitions"]]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < cmd["expect"] and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                out.extend([tp.partition, r.offset, r.timestamp, r.value.decode()] for r in records)
    finally:
        await consumer.stop()
    return out


async def offsets(cmd: dict[str, Any]) -> Any:
    consumer = AIOKafkaConsumer(bootstrap_servers=cmd["bootstrap"], group_id=None)
    await consumer.start()
    try:
        tps = {p: TopicPartition(cmd["topic"], p) for p in cmd["partitions"]}
        earliest = await consumer.beginning_offsets(list(tps.values()))
        latest = await consumer.end_offsets(list(tps.values()))
        found = await consumer.offsets_for_times(
            {tps[int(p)]: ts for p, ts in cmd["timestamps"].items()}
        )
    finally:
        await consumer.stop()
    return {
        "earliest": {tp.partition: o for tp, o in earliest.items()},
        "latest": {tp.partition: o for tp, o in latest.items()},
        "by_time": {tp.partition: (None if o is None else o.offset) for tp, o in found.items()},
    }


async def leaders(cmd: dict[str, Any]) -> Any:
    consumer = AIOKafkaConsumer(bootstrap_servers=cmd["bootstrap"], group_id=None)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        return {
            p: cluster.leader_for_partition(TopicPartition(cmd["topic"], p))
            for p in sorted(cluster.partitions_for_topic(cmd["topic"]) or ())
        }
    finally:
        await consumer.stop()


async def create_partitions(cmd: dict[str, Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_partitions(
            {cmd["topic"]: NewPartitions(total_count=cmd["partitions"])}, timeout_ms=30_000
        )
    finally:
        await admin.close()
    return "created"


async def committed(cmd: dict[str, Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(cmd["group"])
    finally:
        await admin.close()
    return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == cmd["topic"]}


async def describe_group(cmd: dict[str, Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        coordinator = await admin.find_coordinator(cmd["group"])
        (response,) = await admin.describe_consumer_groups(
            [cmd["group"]], group_coordinator_id=coordinator
        )
    finally:
        await admin.close()
    (group,) = response.groups
    _error, _group_id, state, _protocol_type, _protocol, raw_members = group[:6]
    members = []
    for raw in raw_members:
        member_id, instance_id = raw[0], raw[1] if len(raw) == 6 else None
        assignment = raw[-1]
        partitions: list[int] = []
        if assignment:
            decoded = ConsumerProtocol.ASSIGNMENT.decode(assignment)
            partitions = [p for t, ps in decoded.assignment for p in ps if t == cmd["topic"]]
        members.append(
            {"member_id": member_id, "instance_id": instance_id, "partitions": sorted(partitions)}
        )
    # aiokafka 0.14 reads its DescribeGroups v3 answer with the v2 schema (its v3 request names
    # DescribeGroupsResponse_v2), which drops the authorized operations: none to report.
    return {"coordinator": coordinator, "state": state, "members": members, "operations": None}


async def describe_cluster(cmd: dict[str, Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        described = await admin.describe_cluster()
    finally:
        await admin.close()
    return {
        "cluster_id": described["cluster_id"],
        "controller": described["controller_id"],
        "brokers": sorted([b["node_id"], b["host"], b["port"]] for b in described["brokers"]),
        "operations": None,  # aiokafka asks Metadata, without them
    }


# DescribeConfigsResponse ConfigSource codes.
SOURCES = {
    1: "DYNAMIC_TOPIC_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}


async def describe_configs(cmd: dict[str, Any]) -> Any:
    kind = ConfigResourceType.TOPIC if cmd["resource"] == "topic" else ConfigResourceType.BROKER
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(kind, cmd["name"])])
    finally:
        await admin.close()
    ((error, message, _type, _name, entries),) = response.resources
    if error:
        raise RuntimeError(f"DescribeConfigs error {error}: {message}")
    return {e[0]: [e[1], SOURCES.get(e[3], str(e[3]))] for e in entries}


async def alter_configs(cmd: dict[str, Any]) -> Any:
    """The legacy AlterConfigs: ``configs`` become the topic's whole set."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        (response,) = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, cmd["topic"], configs=cmd["configs"])]
        )
    finally:
        await admin.close()
    ((error, message, *_),) = response.resources
    return {"error": error, "message": message}


async def transactions(cmd: dict[str, Any]) -> Any:
    """start() of a transactional producer (it finds its coordinator and gets a producer id)
    -> [error class name, message]."""
    from aiokafka.errors import KafkaError

    producer = AIOKafkaProducer(
        bootstrap_servers=cmd["bootstrap"], transactional_id=cmd["transactional_id"]
    )
    try:
        await asyncio.wait_for(producer.start(), cmd["timeout_s"])
    except KafkaError as e:
        return [type(e).__name__, str(e)]
    finally:
        await producer.stop()
    return "NONE"


async def timestamps(cmd: dict[str, Any]) -> Any:
    """One record per timestamp to partition 0, each awaited, then the partition read back
    -> {"produced": [[error name or null, timestamp], ...], "consumed": [[offset, timestamp
    type, timestamp], ...]}."""
    from aiokafka.errors import KafkaError

    producer = AIOKafkaProducer(bootstrap_servers=cmd["bootstrap"], acks="all")
    await producer.start()
    produced: list[Any] = []
    try:
        for ts in cmd["timestamps"]:
            try:
                md = await producer.send_and_wait(cmd["topic"], b"v", partition=0, timestamp_ms=ts)
            except KafkaError as e:
                produced.append([type(e).__name__, None])
            else:
                produced.append([None, md.timestamp])
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=cmd["bootstrap"], group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(cmd["topic"], 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        consumed: list[Any] = []
        expect = sum(1 for error, _ in produced if error is None)
        deadline = time.monotonic() + DEADLINE_S
        while len(consumed) < expect and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                consumed.extend(
                    [r.offset, TIMESTAMP_TYPES[r.timestamp_type], r.timestamp] for r in records
                )
    finally:
        await consumer.stop()
    return {"produced": produced, "consumed": consumed}


async def delete_records(cmd: dict[str, Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=cmd["bootstrap"], request_timeout_ms=30_000)
    await admin.start()
    try:
        result = await admin.delete_records(
            {
                TopicPartition(cmd["topic"], int(p)): RecordsToDelete(o)
                for p, o in cmd["offsets"].items()
            },
            timeout_ms=30_000,
        )
    finally:
        await admin.close()
    return {tp.partition: low_watermark for tp, low_watermark in result.items()}


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
        "delete_records": delete_records,
        "transactions": transactions,
        "timestamps": timestamps,
    }
    print(json.dumps(asyncio.run(ops[cmd["op"]](cmd))), flush=True)


if __name__ == "__main__":
    main()
