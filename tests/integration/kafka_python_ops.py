"""kafka-python in a process of its own, for ``test_operator_cli.py``: the test process stays
free of the client's sockets and threads (an in-process client leaves a socket to the garbage
collector now and then, which pytest turns into an error).

Usage: ``python -m tests.integration.kafka_python_ops '<json>'``; ``op`` is one of

- ``produce``: ``counts`` {partition: n} records to ``topic``, record i of a partition with
  timestamp ``base_timestamp_ms + 1000 * i``, acks=all; prints "null";
- ``commit``: ``offsets`` {partition: offset} for ``group`` as a consumer without a
  subscription (generation -1); prints "null";
- ``committed``: prints {partition: offset or null} of ``group`` for ``partitions``;
- ``delete_offsets``: deletes ``group``'s committed offsets of ``partitions`` [[topic,
  partition], ...] with the admin client's ``delete_group_offsets`` (OffsetDelete); prints
  {"topic:partition": error class name} or, for a group error, {"error": its class name};
- ``member``: subscribes to ``topic`` in ``group`` as ``client_id``, polls until it has
  ``partitions`` partitions, commits ``offsets`` as that member, prints "assigned", then keeps
  polling until its stdin closes, and closes the consumer (leaving the group).

Every answer is one JSON line on stdout; errors go to stderr with a non-zero exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import sys
import time
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

DEADLINE_S = 30.0
POLL_MS = 200
# A member joining polls this long at a time: kafka-python 3.0.12 drops a join round whose
# SyncGroup answer comes after the poll that sent it has timed out, when a rejoin the
# metadata caused has already cleared need_rejoin() (Java's rejoinNeededOrPending() also
# counts the pending join): the member stayed unassigned, its answer received and unread.
JOIN_POLL_MS = 2000


def _offsets(topic: str, offsets: dict[str, int]) -> dict[TopicPartition, OffsetAndMetadata]:
    return {TopicPartition(topic, int(p)): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}


def produce(cmd: dict[str, Any]) -> Any:
    producer = KafkaProducer(bootstrap_servers=cmd["bootstrap"], acks="all")
    try:
        futures = [
            producer.send(
                cmd["topic"],
                b"x",
                partition=int(partition),
                timestamp_ms=cmd["base_timestamp_ms"] + 1000 * i,
            )
            for partition, count in cmd["counts"].items()
            for i in range(count)
        ]
        producer.flush(timeout=DEADLINE_S)
        for future in futures:
            future.get(timeout=DEADLINE_S)
    finally:
        producer.close(timeout=10)
    return None


def commit(cmd: dict[str, Any]) -> Any:
    consumer = KafkaConsumer(
        bootstrap_servers=cmd["bootstrap"], group_id=cmd["group"], enable_auto_commit=False
    )
    try:
        consumer.commit(_offsets(cmd["topic"], cmd["offsets"]))
    finally:
        consumer.close()
    return None


def committed(cmd: dict[str, Any]) -> Any:
    consumer = KafkaConsumer(
        bootstrap_servers=cmd["bootstrap"], group_id=cmd["group"], enable_auto_commit=False
    )
    try:
        return {
            str(p): consumer.committed(TopicPartition(cmd["topic"], p)) for p in cmd["partitions"]
        }
    finally:
        consumer.close()


def delete_offsets(cmd: dict[str, Any]) -> Any:
    admin = KafkaAdminClient(bootstrap_servers=cmd["bootstrap"])
    try:
        partitions = [TopicPartition(t, p) for t, p in cmd["partitions"]]
        try:
            results = admin.delete_group_offsets(cmd["group"], partitions)
        except KafkaError as e:
            return {"error": type(e).__name__}
        return {f"{tp.topic}:{tp.partition}": error.__name__ for tp, error in results.items()}
    finally:
        admin.close()


def member(cmd: dict[str, Any]) -> Any:
    # The client's own account of its joins and coordinator look-ups, for the test's failure
    # message (a member once got no assignment in 30 s with two test workers running).
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    consumer = KafkaConsumer(
        bootstrap_servers=cmd["bootstrap"],
        group_id=cmd["group"],
        client_id=cmd["client_id"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        # The topic's partitions known before it joins: it joins once, not a second time when
        # they arrive (the rejoin that meets the client's bug, see JOIN_POLL_MS).
        while True:
            with contextlib.suppress(KafkaError):  # a failed metadata request: asked again
                if consumer.partitions_for_topic(cmd["topic"]):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metadata for {cmd['topic']}")
        consumer.subscribe([cmd["topic"]])
        while len(consumer.assignment()) < cmd["partitions"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"assigned only {sorted(consumer.assignment())}")
            consumer.poll(timeout_ms=JOIN_POLL_MS)
        consumer.commit(_offsets(cmd["topic"], cmd["offsets"]))
        print(json.dumps("assigned"), flush=True)
        # Stay in the group (poll, so the consumer keeps its assignment) until stdin closes.
        while not select.select([sys.stdin], [], [], POLL_MS / 1000)[0]:
            consumer.poll(timeout_ms=0)
        sys.stdin.read()
    finally:
        consumer.close()
    return "closed"


def main() -> None:
    cmd = json.loads(sys.argv[1])
    ops = {
        "produce": produce,
        "commit": commit,
        "committed": committed,
        "delete_offsets": delete_offsets,
        "member": member,
    }
    print(json.dumps(ops[cmd["op"]](cmd)), flush=True)


if __name__ == "__main__":
    main()
