"""``kcoord pipeline generate``: payment events at a steady rate, keyed by account.

Produces ``--rate`` events per second for ``--duration`` seconds with an idempotent producer
(acks=all), paced in 100 ms slices; ``--malformed-ratio`` mixes in malformed events (one kind
of ``events.MALFORMED`` after another) for the job's dead-letter queue. Prints one JSON line:
how many events were produced, valid and malformed. With ``--events-out FILE`` it also writes
every acknowledged valid event (JSON lines), the input of a reference computation.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from kcoord.node.clock import SYSTEM_CLOCK, Clock
from kcoord.pipeline.events import MALFORMED, encode_payment, make_payment

SLICE_MS = 100
FLUSH_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class GenerateResult:
    produced: int
    valid: int
    malformed: int


def generate(
    bootstrap_servers: str,
    topic: str,
    *,
    rate: int,
    duration_s: float,
    accounts: int = 20,
    malformed_ratio: float = 0.0,
    seed: int = 0,
    events_out: Path | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> GenerateResult:
    assert rate > 0 and duration_s >= 0 and 0.0 <= malformed_ratio <= 1.0
    rng = random.Random(seed)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "partitioner": "murmur2_random",  # a key's partition as a Java producer picks it
            "log_level": 4,
        }
    )
    errors: list[str] = []
    acked_valid: list[bytes] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    def delivered_valid(error: Any, message: Any) -> None:
        delivered(error, message)
        if error is None:
            acked_valid.append(message.value())

    total = round(rate * duration_s)
    start_ms = clock.monotonic_ms()
    valid = malformed = 0
    for seq in range(total):
        # Pace: event ``seq`` is due at start + seq / rate seconds.
        due_ms = start_ms + seq * 1000 // rate
        while (wait_ms := due_ms - clock.monotonic_ms()) > 0:
            producer.poll(min(wait_ms, SLICE_MS) / 1000)
        if rng.random() < malformed_ratio:
            value = MALFORMED[malformed % len(MALFORMED)]
            producer.produce(topic, key=b"malformed", value=value, on_delivery=delivered)
            malformed += 1
        else:
            payment = make_payment(seq, rng, clock.now_ms(), accounts)
            producer.produce(
                topic,
                key=payment.account.encode(),
                value=encode_payment(payment),
                on_delivery=delivered_valid,
            )
            valid += 1
        producer.poll(0)
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors or remaining:
        raise KafkaException(f"{len(errors)} failed, {remaining} unacknowledged: {errors[:3]}")
    if events_out is not None:
        events_out.write_bytes(b"".join(v + b"\n" for v in acked_valid))
    return GenerateResult(produced=valid + malformed, valid=valid, malformed=malformed)


def result_json(result: GenerateResult) -> str:
    return json.dumps(
        {"produced": result.produced, "valid": result.valid, "malformed": result.malformed}
    )
