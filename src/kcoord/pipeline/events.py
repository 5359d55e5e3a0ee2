"""Payment events: the generator's JSON, the job's validation, and a plain-Python reference of
the job's totals. Pure: no I/O, time and randomness are arguments.

An event is one JSON object, keyed by its account (so an account's events share a partition):

  {"id": "p-17", "account": "acct-03", "amount": 12.34, "currency": "EUR",
   "timestamp": 1767225600123}

``amount`` is a JSON number, positive, with at most two decimals (read as a ``Decimal``, so
totals are exact); ``currency`` an ISO 4217 code (three capital letters); ``timestamp`` the
event time in epoch milliseconds. Anything else is malformed, and ``parse_payment`` says why.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final

FIELDS = ("id", "account", "amount", "currency", "timestamp")
CURRENCIES = ("EUR", "USD", "GBP")
# Spark's decimal(18, 2) for an amount; a window's total is Spark's sum of them, decimal(28, 2):
# cast back to (18, 2), about 10^4 near-maximum payments in one window overflowed it, which
# Spark 4's ANSI mode fails (the batch, at every replay).
AMOUNT_PRECISION = 18
AMOUNT_SCALE = 2
TOTAL_PRECISION = AMOUNT_PRECISION + 10
# Spark keeps timestamps in microseconds (an int64): a larger one failed the whole batch, and
# every restart replayed it, instead of going to the dead-letter topic. A window's end is its
# start plus its length, so a year of room is left below the limit (Spark 4's ANSI mode failed
# the window of an event near it, at every replay, too).
MAX_TIMESTAMP_MS: Final = (2**63 - 1) // 1000 - 366 * 24 * 60 * 60 * 1000
# How far an event's time may run ahead of its record's own timestamp (the producer's clock,
# or the broker's for LogAppendTime): Kafka's message.timestamp.after.max.ms default (KIP-937).
# One later event moved the job's watermark past every real event for good: all their windows
# were then dropped as late, and nothing said so.
MAX_AHEAD_OF_RECORD_MS: Final = 60 * 60 * 1000
MAX_AMOUNT = Decimal(10) ** (AMOUNT_PRECISION - AMOUNT_SCALE - 4)  # room for sums


@dataclass(frozen=True, slots=True)
class Payment:
    id: str
    account: str
    amount: Decimal
    currency: str
    timestamp_ms: int


def parse_payment(value: bytes | None, record_timestamp_ms: int | None = None) -> Payment | str:
    """The payment in ``value``, or the reason it is malformed (for the dead-letter queue).
    With the record's own timestamp, an event time more than ``MAX_AHEAD_OF_RECORD_MS`` after
    it is malformed too."""
    if value is None:
        return "no value (null record)"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "value is not UTF-8"
    try:
        obj = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except (json.JSONDecodeError, InvalidOperation) as e:
        return f"value is not JSON: {e.msg if isinstance(e, json.JSONDecodeError) else e}"
    if not isinstance(obj, dict):
        return "value is not a JSON object"
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        return f"missing field {missing[0]!r}"
    for name in ("id", "account"):
        if not isinstance(obj[name], str) or not obj[name]:
            return f"field {name!r} must be a non-empty string"
    amount = obj["amount"]
    if (
        not isinstance(amount, Decimal)
        or not amount.is_finite()
        or amount <= 0
        or amount >= MAX_AMOUNT
        or amount != amount.quantize(Decimal(1).scaleb(-AMOUNT_SCALE))
    ):
        return "field 'amount' must be a positive number with at most 2 decimals"
    currency = obj["currency"]
    if not (
        isinstance(currency, str)
        and len(currency) == 3
        and currency.isascii()
        and currency.isalpha()
        and currency.isupper()
    ):
        return "field 'currency' must be a 3-letter ISO 4217 code"
    ts = obj["timestamp"]
    if (
        not isinstance(ts, Decimal)
        or ts != ts.to_integral_value()
        or not 0 <= ts <= MAX_TIMESTAMP_MS
    ):
        return "field 'timestamp' must be epoch milliseconds"
    if (
        record_timestamp_ms is not None
        and record_timestamp_ms >= 0
        and ts > record_timestamp_ms + MAX_AHEAD_OF_RECORD_MS
    ):
        return (
            f"field 'timestamp' is more than {MAX_AHEAD_OF_RECORD_MS // 60_000} minutes after "
            f"the record's own ({record_timestamp_ms})"
        )
    return Payment(
        id=obj["id"],
        account=obj["account"],
        amount=amount.quantize(Decimal(1).scaleb(-AMOUNT_SCALE)),
        currency=currency,
        timestamp_ms=int(ts),
    )


def encode_payment(payment: Payment) -> bytes:
    return json.dumps(
        {
            "id": payment.id,
            "account": payment.account,
            "amount": float(payment.amount),
            "currency": payment.currency,
            "timestamp": payment.timestamp_ms,
        },
        separators=(",", ":"),
    ).encode()


def make_payment(seq: int, rng: random.Random, now_ms: int, accounts: int) -> Payment:
    account = rng.randrange(accounts)
    return Payment(
        id=f"p-{seq}",
        account=f"acct-{account:03d}",
        amount=Decimal(rng.randrange(1, 100_000)).scaleb(-AMOUNT_SCALE),
        # One currency per account, so an account's totals are in one currency.
        currency=CURRENCIES[account % len(CURRENCIES)],
        timestamp_ms=now_ms,
    )


# Malformed events the generator mixes in (``--malformed-ratio``), one per kind in turn.
MALFORMED: tuple[bytes, ...] = (
    b'{"id": "x", "account": "acct-000", "amount": 1.00',
    b'{"id": "x", "amount": 3.5, "currency": "EUR", "timestamp": 0}',
    b'{"id": "x", "account": "acct-000", "amount": -4, "currency": "EUR", "timestamp": 0}',
    b'{"id": "x", "account": "acct-000", "amount": 1, "currency": "euro", "timestamp": 0}',
    b"\xff\xfe not utf-8",
    b"[1, 2, 3]",
)


@dataclass(frozen=True, slots=True)
class Total:
    total: Decimal
    payments: int


TotalsKey = tuple[str, str, int]  # account, currency, window start (epoch ms)


def window_start_ms(timestamp_ms: int, window_ms: int) -> int:
    """Spark's tumbling ``window(col, duration)``: windows aligned to the epoch."""
    return timestamp_ms - timestamp_ms % window_ms


def reference_totals(payments: Iterable[Payment], window_ms: int) -> dict[TotalsKey, Total]:
    """What the payments job must report: per account, currency and event-time window, the
    sum of the amounts and the number of payments (no event is late in the tests)."""
    sums: dict[TotalsKey, Decimal] = defaultdict(Decimal)
    counts: dict[TotalsKey, int] = defaultdict(int)
    for p in payments:
        key = (p.account, p.currency, window_start_ms(p.timestamp_ms, window_ms))
        sums[key] += p.amount
        counts[key] += 1
    return {key: Total(sums[key], counts[key]) for key in sums}
