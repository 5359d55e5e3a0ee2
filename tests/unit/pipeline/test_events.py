"""Payment events: what the generator writes parses back; each malformed kind has its reason;
the reference totals use Spark's epoch-aligned windows and exact decimals."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from kcoord.pipeline.events import (
    MALFORMED,
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
