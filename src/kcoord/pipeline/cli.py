"""``kcoord pipeline ...``: the example pipeline's commands.

  kcoord pipeline generate --topic payments --rate N --duration S [--malformed-ratio R]
  kcoord pipeline run payments-totals [--master local[2]] [--checkpoint DIR] [--output DIR]
                                      [--available-now] [--timeout S]
  kcoord pipeline run offsets-audit [--master local[2]] [--window S] [--json]

``--bootstrap-server`` defaults to the local cluster of ``make up`` (127.0.0.1:9092).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from kcoord.node.clock import SYSTEM_CLOCK

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _generate(args: argparse.Namespace) -> int:
    from kcoord.pipeline.generate import generate, result_json

    result = generate(
        args.bootstrap_server,
        args.topic,
        rate=args.rate,
        duration_s=args.duration,
        accounts=args.accounts,
        malformed_ratio=args.malformed_ratio,
        seed=args.seed,
        events_out=args.events_out,
    )
    print(result_json(result), flush=True)
    return 0


def _payments(args: argparse.Namespace) -> int:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql.streaming.query import StreamingQuery

    from kcoord.pipeline.payments import PaymentsConfig, run_available_now, start, wait_in_steps
    from kcoord.pipeline.session import build_session

    config = PaymentsConfig(
        bootstrap_servers=args.bootstrap_server,
        checkpoint=args.checkpoint,
        output=args.output,
        source_topic=args.topic,
        totals_topic=args.totals_topic,
        dlq_topic=args.dlq_topic,
        window=args.window,
        watermark=args.watermark,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        trigger_interval=args.trigger_interval,
    )
    spark = build_session("kcoord payments-totals", args.master)
    queries: list[StreamingQuery] = []

    # Ctrl-C or SIGTERM stops the queries, and a streaming run ends as its --timeout would.
    # The handler only asks: the main thread is in the middle of a call into Spark, and the
    # handler's own call broke it (a traceback each, exit 1). PySpark's JVM ignores SIGINT.
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()
        # A second one is not asked: a stop of the queries or of Spark that hangs is cut.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    timeout_s = math.ceil(args.timeout) if args.timeout else None  # Spark's: whole seconds
    try:
        if args.available_now:
            print(
                json.dumps({"available_now": True, "checkpoint": str(args.checkpoint)}), flush=True
            )
            queries = run_available_now(spark, config, timeout_s, stop)
        else:
            queries = start(spark, config)
            print(
                json.dumps(
                    {"started": [q.name for q in queries], "checkpoint": str(args.checkpoint)}
                ),
                flush=True,
            )
            # Any query ending (a failure of the dead-letter one too) ends the run: waiting on
            # the first alone left the others' failures unseen while the process ran on.
            with contextlib.suppress(StreamingQueryException):  # reported below, per query
                wait_in_steps(spark.streams.awaitAnyTermination, timeout_s, stop)
        unfinished = [q.name for q in queries if q.isActive] if args.available_now else []
        for q in queries:
            q.stop()
        failed = [q for q in queries if q.exception() is not None]
        for name in unfinished:
            if stop.is_set():
                print(f"query {name} was stopped before it finished", file=sys.stderr)
            else:
                print(f"query {name} did not finish within --timeout", file=sys.stderr)
        for q in failed:
            print(f"query {q.name} failed: {_cause(q.exception())}", file=sys.stderr)
        print(
            json.dumps(
                {q.name: q.lastProgress["batchId"] if q.lastProgress else None for q in queries}
            ),
            flush=True,
        )
        return 1 if failed or unfinished else 0
    finally:
        spark.stop()


def _cause(error: object) -> str:
    """A failed query's error without the plan Spark appends to it (which buries the cause)."""
    text = str(error)
    return text.split("=== Streaming Query ===", maxsplit=1)[0].strip()


def _audit(args: argparse.Namespace) -> int:
    from kcoord.pipeline.audit import Status, report_json, report_text
    from kcoord.pipeline.offsets_audit import run_audit
    from kcoord.pipeline.session import build_session

    spark = build_session("kcoord offsets-audit", args.master)
    try:
        reports = run_audit(
            spark,
            args.bootstrap_server,
            now_ms=SYSTEM_CLOCK.now_ms(),
            window_ms=round(args.window * 1000),
            max_samples=args.samples,
        )
    finally:
        spark.stop()
    print(json.dumps(report_json(reports), indent=2) if args.json else report_text(reports))
    # A check's exit status: 1 when some group is worse than OK, for scripts and cron.
    return 1 if any(r.status != Status.OK for r in reports) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kcoord pipeline", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="produce JSON payment events at a steady rate")
    gen.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    gen.add_argument("--topic", default="payments")
    gen.add_argument("--rate", type=int, required=True, help="events per second")
    gen.add_argument("--duration", type=float, required=True, help="seconds")
    gen.add_argument("--accounts", type=int, default=20)
    gen.add_argument("--malformed-ratio", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--events-out", type=Path, help="write the acknowledged valid events here")
    gen.set_defaults(func=_generate)

    run = sub.add_parser("run", help="run a pipeline job")
    jobs = run.add_subparsers(dest="job", required=True)
    pay = jobs.add_parser("payments-totals", help="payment totals per account and window")
    pay.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    pay.add_argument("--master", default="local[2]", help="any Spark master URL")
    pay.add_argument("--checkpoint", type=Path, default=Path(".kcoord/pipeline/checkpoint"))
    pay.add_argument("--output", type=Path, default=Path(".kcoord/pipeline/payments-totals"))
    pay.add_argument("--topic", default="payments")
    pay.add_argument("--totals-topic", default="payments-totals")
    pay.add_argument("--dlq-topic", default="payments-dlq")
    pay.add_argument("--window", default="1 minute")
    pay.add_argument("--watermark", default="10 minutes")
    pay.add_argument("--max-offsets-per-trigger", type=int)
    pay.add_argument("--trigger-interval", default="2 seconds")
    pay.add_argument(
        "--available-now", action="store_true", help="process what is there, then exit"
    )
    pay.add_argument("--timeout", type=float, help="stop after this many seconds")
    pay.set_defaults(func=_payments)

    audit = jobs.add_parser("offsets-audit", help="commit rates and lag status per group")
    audit.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    audit.add_argument("--master", default="local[2]")
    audit.add_argument("--window", type=float, default=600.0, help="seconds")
    audit.add_argument("--samples", type=int, default=10, help="commits per partition window")
    audit.add_argument("--json", action="store_true")
    audit.set_defaults(func=_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
