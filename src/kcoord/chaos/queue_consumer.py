"""A consumer for the chaos queue workload (Jepsen's Kafka queue test), in its own process.

Usage: ``python -m kcoord.chaos.queue_consumer '<json config>'`` with ``bootstrap``, ``topic``,
``name``, ``mode`` (``assign``: every partition assigned by hand, positions kept by the client;
``subscribe``: a member of ``group``, committing after each poll) and ``final`` (read every
partition from the start to its current end, report it, exit). confluent-kafka.

Reports one JSON object per line: ``{"event": "assign" | "subscribe", "partitions": [...]}``
when its partitions change (for a subscriber, at each rebalance, with its generation), and
``{"event": "polled", "records": [[partition, offset, value], ...], "generation": g,
"final": bool}`` for each non-empty poll.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from kcoord.chaos import client_signals
from kcoord.chaos.member import CGMD_MAGIC, cgmd_generation

POLL_TIMEOUT_S = 0.2
FINAL_DEADLINE_S = 60.0
PARTITIONS_DEADLINE_S = 30.0
WATERMARK_RETRY_S = 0.2


def emit(event: str, **fields: Any) -> None:
    # When it happened, on the clock every process of the host shares (see member.py).
    sys.stdout.write(json.dumps({"event": event, "at": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def _generation(consumer: Any) -> int:
    """The generation of the consumer's group metadata, -1 outside a group."""
    raw = consumer.consumer_group_metadata()
    data = raw if isinstance(raw, bytes) else bytes(raw)
    return cgmd_generation(data) if data.startswith(CGMD_MAGIC) else -1


def _partitions(consumer: Any, topic: str, deadline_s: float) -> list[int]:
    """The topic's partitions, asked again while the node that answers does not show them
    yet: a node that has not applied the topic's creation answers UNKNOWN_TOPIC_OR_PARTITION
    without partitions, and a member assigned none read nothing for the whole run (seed
    4366: the run failed waiting for it to read)."""
    deadline = time.monotonic() + deadline_s
    while True:
        metadata = consumer.list_topics(topic, timeout=deadline_s)
        found = metadata.topics.get(topic)
        if found is not None and found.partitions:
            return sorted(found.partitions)
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{topic} has no partitions after {deadline_s:.0f} s")
        time.sleep(0.2)  # a metadata refresh's back-off; the deadline bounds the wait


def main() -> None:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    cfg = json.loads(sys.argv[1])
    stopping = client_signals.install()
    mode = cfg.get("mode", "assign")
    final = bool(cfg.get("final"))
    consumer = Consumer(
        {
            "bootstrap.servers": cfg["bootstrap"],
            "client.id": cfg["name"],
            "group.id": cfg.get("group") or f"{cfg['name']}-unused",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "enable.partition.eof": True,
            "topic.metadata.refresh.interval.ms": 3000,
        }
    )
    partitions = _partitions(consumer, cfg["topic"], PARTITIONS_DEADLINE_S)
    ends: dict[int, int] = {}
    if mode == "assign" or final:
        consumer.assign([TopicPartition(cfg["topic"], p, 0) for p in partitions])
        emit("assign", partitions=partitions)
        if final:
            for p in partitions:
                ends[p] = _high_watermark(consumer, TopicPartition(cfg["topic"], p))
    else:

        def on_assign(c: Any, tps: list[Any]) -> None:
            emit(
                "subscribe",
                partitions=sorted(tp.partition for tp in c.assignment()),
                generation=_generation(c),
            )

        consumer.subscribe([cfg["topic"]], on_assign=on_assign, on_revoke=on_assign)
    positions: dict[int, int] = {}
    deadline = time.monotonic() + FINAL_DEADLINE_S
    while not stopping.is_set():
        if final and (
            all(positions.get(p, 0) >= ends[p] for p in partitions) or time.monotonic() > deadline
        ):
            break
        messages = consumer.consume(num_messages=500, timeout=POLL_TIMEOUT_S)
        records = []
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    emit("error", error=str(error))
                continue
            p, o = int(m.partition() or 0), int(m.offset() or 0)
            records.append([p, o, (m.value() or b"").decode()])
            positions[p] = o + 1
        if not records:
            continue
        emit("polled", records=records, generation=_generation(consumer), final=final)
        if mode == "subscribe" and not final:
            try:
                consumer.commit(asynchronous=False)
            except Exception as e:
                emit("error", error=f"commit: {e}")
    consumer.close()
    emit("closed", positions={str(p): o for p, o in positions.items()})


def _high_watermark(consumer: Any, tp: Any) -> int:
    """The partition's end, asked again while it fails (a leader that moved just after the
    heal answers NOT_LEADER_FOR_PARTITION), until the final poll's deadline."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + FINAL_DEADLINE_S
    while True:
        try:
            _, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(high)
        except KafkaException as e:
            if time.monotonic() > deadline:
                raise
            emit("error", error=f"watermarks of partition {tp.partition}: {e}")
            time.sleep(WATERMARK_RETRY_S)  # backoff before asking again


if __name__ == "__main__":
    main()
