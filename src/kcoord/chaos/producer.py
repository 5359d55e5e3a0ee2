"""A producer in its own process for the chaos workloads: unique values, acks=all, idempotent.

Usage: ``python -m kcoord.chaos.producer '<json config>'`` with ``bootstrap``, ``topic``,
``name`` (the client id and the values' prefix), ``rate`` (sends per second), ``keys`` (how
many distinct keys the values are spread over) and optionally ``count`` (stop after that many).
confluent-kafka (librdkafka) with ``enable.idempotence=true`` and ``acks=all``.

It reports one JSON object per line on stdout:

- ``{"event": "send", "key": k, "value": v}`` before a value is handed to the client;
- ``{"event": "sent", "key": k, "value": v, "partition": p, "offset": o}`` when the broker
  acknowledged it (``o`` is null when librdkafka acknowledged it implicitly: a later batch of
  this producer succeeded, so this one was written, at an offset the client never learnt);
- ``{"event": "send_failed", "key": k, "value": v, "error": e}`` when the client gave up: the
  outcome is unknown (a timed-out write may still have been appended);
- ``{"event": "closed"}`` after SIGTERM and a flush.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from kcoord.chaos import client_signals

FLUSH_TIMEOUT_S = 30.0


def emit(event: str, **fields: Any) -> None:
    # When it happened, on the clock every process of the host shares (see member.py).
    sys.stdout.write(json.dumps({"event": event, "at": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def main() -> None:
    from confluent_kafka import Producer

    cfg = json.loads(sys.argv[1])
    stopping = client_signals.install()
    producer = Producer(
        {
            "bootstrap.servers": cfg["bootstrap"],
            "client.id": cfg["name"],
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 30_000,
            "retry.backoff.ms": 100,
            # The idempotence state machine (PID, epoch bumps, drains) on stderr, which the
            # run keeps: why a value was written twice is in there.
            "debug": "eos",
        }
    )

    def report(err: Any, msg: Any) -> None:
        key = (msg.key() or b"").decode()
        value = (msg.value() or b"").decode()
        if err is not None:
            emit("send_failed", key=key, value=value, error=str(err))
        else:
            emit("sent", key=key, value=value, partition=msg.partition(), offset=msg.offset())

    interval = 1.0 / max(cfg.get("rate", 50), 1)
    keys = max(cfg.get("keys", 16), 1)
    count = cfg.get("count")
    n = 0
    next_at = time.monotonic()
    while not stopping.is_set() and (count is None or n < count):
        key, value = f"k{n % keys}", f"{cfg['name']}-{n}"
        emit("send", key=key, value=value)
        while True:
            try:
                producer.produce(cfg["topic"], value.encode(), key.encode(), on_delivery=report)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
        n += 1
        producer.poll(0)
        next_at += interval
        stopping.wait(max(0.0, next_at - time.monotonic()))  # the send rate, or a stop
    producer.flush(FLUSH_TIMEOUT_S)
    emit("closed")


if __name__ == "__main__":
    main()
