"""Payment events: what the generator writes parses back; each malformed kind has its reason;
the reference totals use Spark's epoch-aligned windows and exact decimals."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from kcoord.pipeline.events import (
    MALFORMED,
    MAX_AHEAD_OF_RECORD_MS,
    MAX_TIMESTAMP_MS,
    Payment,
    encode_payment,
    make_payment,
    parse_payment,
    reference_totals,
    window_start_ms,
)


def test_generated_events_parse_back() -> None:
    rng = random.Random(3)
    for seq in range(200):
        payment = make_payment(seq, rng, 1_700_000_000_000 + seq, accounts=7)
        assert parse_payment(encode_payment(payment)) == payment


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "no value (null record)"),
        (b"\xff", "value is not UTF-8"),
        (b'{"id": 1', "value is not JSON"),
        (b"[1]", "value is not a JSON object"),
        (b'{"id": "a"}', "missing field 'account'"),
        (b'{"id": "", "account": "x", "amount": 1, "currency": "EUR", "timestamp": 1}', "'id'"),
        (b'{"id": "a", "account": "x", "amount": 0, "currency": "EUR", "timestamp": 1}', "amount"),
        (
            b'{"id": "a", "account": "x", "amount": 1.001, "currency": "EUR", "timestamp": 1}',
            "amount",
        ),
        (
            b'{"id": "a", "account": "x", "amount": "1", "currency": "EUR", "timestamp": 1}',
            "amount",
        ),
        (
            b'{"id": "a", "account": "x", "amount": 1, "currency": "eur", "timestamp": 1}',
            "currency",
        ),
        (
            b'{"id": "a", "account": "x", "amount": 1, "currency": "EUR", "timestamp": 1.5}',
            "timestamp",
        ),
        (
            b'{"id": "a", "account": "x", "amount": 1, "currency": "EUR", "timestamp": -1}',
            "timestamp",
        ),
        (  # beyond Spark's microsecond timestamps: it failed the batch, over and over
            b'{"id": "a", "account": "x", "amount": 1, "currency": "EUR", '
            b'"timestamp": 4611686018427387904}',
            "timestamp",
        ),
    ],
)
def test_malformed_events_say_why(value: bytes | None, reason: str) -> None:
    result = parse_payment(value)
    assert isinstance(result, str)
    assert reason in result


def _event(timestamp_ms: int) -> bytes:
    return encode_payment(Payment("a", "x", Decimal("1.00"), "EUR", timestamp_ms))


def test_an_event_time_whose_window_would_overflow_is_malformed() -> None:
    """A window's end is its start plus its length, in Spark's int64 microseconds: an event
    near the limit failed the batch (ARITHMETIC_OVERFLOW) at every replay."""
    assert isinstance(parse_payment(_event(MAX_TIMESTAMP_MS)), Payment)
    assert isinstance(parse_payment(_event(9_223_372_036_800_000)), str)
    assert (MAX_TIMESTAMP_MS + 366 * 24 * 3600 * 1000) * 1000 <= 2**63 - 1


def test_an_event_time_far_ahead_of_its_record_is_malformed() -> None:
    """One event from the far future (microseconds sent as milliseconds) moved the job's
    watermark past every real event for good; checked against the record's own timestamp,
    with Kafka's message.timestamp.after.max.ms tolerance."""
    record_ms = 1_767_225_600_000
    ahead = record_ms + MAX_AHEAD_OF_RECORD_MS
    assert isinstance(parse_payment(_event(ahead), record_ms), Payment)
    reason = parse_payment(_event(ahead + 1), record_ms)
    assert isinstance(reason, str) and "after the record's own" in reason
    assert isinstance(parse_payment(_event(1_767_225_600_123_000), record_ms), str)
    assert isinstance(parse_payment(_event(ahead + 1)), Payment)  # no record time: not checked
    assert isinstance(parse_payment(_event(ahead + 1), -1), Payment)


def test_every_generator_malformed_kind_is_rejected() -> None:
    assert all(isinstance(parse_payment(v), str) for v in MALFORMED)


def test_reference_totals_per_account_currency_and_window() -> None:
    def pay(account: str, amount: str, ts: int) -> Payment:
        return Payment(f"{account}-{ts}", account, Decimal(amount), "EUR", ts)

    events = [
        pay("a", "0.10", 59_999),
        pay("a", "0.20", 1),
        pay("a", "1.00", 60_000),
        pay("b", "2", 5),
    ]
    assert window_start_ms(60_000, 60_000) == 60_000
    totals = reference_totals(events, 60_000)
    assert {k: (t.total, t.payments) for k, t in totals.items()} == {
        ("a", "EUR", 0): (Decimal("0.30"), 2),
        ("a", "EUR", 60_000): (Decimal("1.00"), 1),
        ("b", "EUR", 0): (Decimal("2"), 1),
    }
