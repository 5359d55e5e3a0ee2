"""One consumer-group member in its own process, for the chaos suite's groups workload and
``tests/integration/test_groups.py``.

Usage: ``python -m kcoord.chaos.member '<json config>'``; the config's keys:

- ``client``: ``kafka-python``, ``aiokafka`` or ``confluent-kafka``;
- ``bootstrap``, ``group``, ``topic``, ``name`` (the client id);
- ``assignor``: ``range``, ``roundrobin`` or ``cooperative-sticky``;
- ``instance_id``: the group instance id of a static member (KIP-345), or null;
- ``group_protocol``: ``consumer`` for the KIP-848 protocol (confluent-kafka only; the member
  epoch is then reported as the generation), else the classic protocol;
- ``session_timeout_ms``, ``heartbeat_interval_ms``, ``metadata_max_age_ms``,
  ``max_poll_interval_ms`` (the rebalance timeout of the classic protocol);
- ``debug``: the client's whole log at DEBUG on stderr (otherwise INFO, plus the group
  protocol's trace at DEBUG).

The member subscribes to the topic, reads from the earliest offset where the group has no
committed one, and commits synchronously after it has processed (reported) each batch. SIGTERM
stops it cleanly (the client's close: a dynamic member leaves the group, a static one does not);
the tests SIGKILL it to simulate a crash.

Everything it sees goes to stdout, one JSON object per line, in the order it happened, each
with ``"at"``: this host's monotonic clock (``time.monotonic()``, Linux's ``CLOCK_MONOTONIC``,
one for every process of the host) when it was emitted, which orders the reports of different
members (the runner reads each member's output on a thread of its own, so the times it records
them at do not). The wall clock did, and a step of it (NTP) during a run could order a
revocation after the next owner's assignment, or the other way round:

- ``{"event": "started"}`` once the consumer is subscribed;
- ``{"event": "assigned" | "revoked" | "lost", "partitions": [...], "generation": g,
  "member_id": m}`` from the client's rebalance callbacks (the partitions of the callback:
  under cooperative-sticky only those that move);
- ``{"event": "assignment", "generation": g, "member_id": m, "protocol": p,
  "partitions": [...]}`` every time the member's full, settled assignment (or generation)
  changes: the state the tests check for validity;
- ``{"event": "records", "records": [[partition, offset, value], ...], "generation": g,
  "member_id": m}`` once processed; the commit that follows names the next offset and
  (kafka-python, confluent-kafka) the leader epoch of the last record, as the Java consumer
  does;
- ``{"event": "committing", "offsets": {partition: next offset}, "generation": g,
  "member_id": m}`` as the commit is sent, then ``{"event": "committed", ...}`` (same fields)
  once it is acknowledged, or ``{"event": "commit_failed", "error": ..., ...}`` if it is not
  (the outcome of a failed commit is unknown: it may have been written);
- ``{"event": "reading_committed", "partitions": [...], "generation": g, "member_id": m}``
  and then ``{"event": "read_committed", "offsets": {partition: committed}, ...}`` (or
  ``read_committed_failed``): a kafka-python member reads the group's committed offsets of
  its partitions (OffsetFetch) before its first commit of each generation. kafka-python
  3.0.12 keeps a partition's position through an eager rebalance when it gets the partition
  back (``SubscriptionState.assign_from_subscribed``), even after another member consumed and
  committed past it meanwhile, and then commits below that member's commit; the read shows
  whether the coordinator still had the higher offset (the checkers tell the two apart);
- ``{"event": "error", "error": ..., "fatal": bool}``: a fatal one ends the process;
- ``{"event": "closed"}`` after a clean stop.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from kcoord.chaos import client_signals

POLL_TIMEOUT_S = 0.2
# kafka-python 3.0.12 can wedge a member for good when poll() times out just as its SyncGroup
# answer arrives: the member has the answer (DEBUG "Received SyncGroup response") but never
# applies the assignment, stops heartbeating and never rejoins once expelled. A longer poll
# makes that race rare: a join then almost always completes within one poll.
KAFKA_PYTHON_POLL_TIMEOUT_S = 1.0
CLOSE_TIMEOUT_S = 10.0
# A loop that has not come round for this long writes every thread's stack to stderr (once per
# stall): a member stuck inside its client (a poll that never returns) shows where, while it
# is stuck. A slow but legitimate call (a commit waiting out its request timeout) writes one
# stack and goes on.
STALL_DUMP_S = 30.0

_emit_lock = threading.Lock()


def loop_came_round() -> None:
    """Called once per turn of a member's loop: re-arms the stall dump (``STALL_DUMP_S``)."""
    faulthandler.dump_traceback_later(STALL_DUMP_S, exit=False)


def emit(event: str, **fields: Any) -> None:
    with _emit_lock:
        sys.stdout.write(json.dumps({"event": event, "at": time.monotonic(), **fields}) + "\n")
        sys.stdout.flush()


class Reporter:
    """Reports the settled assignment each time it changes."""

    def __init__(self) -> None:
        self.last: tuple[int, str, str, tuple[int, ...]] | None = None

    def maybe_report(
        self, generation: int, member_id: str, protocol: str, partitions: set[int]
    ) -> None:
        state = (generation, member_id, protocol, tuple(sorted(partitions)))
        if state != self.last:
            self.last = state
            emit(
                "assignment",
                generation=generation,
                member_id=member_id,
                protocol=protocol,
                partitions=list(state[3]),
            )


# -- kafka-python ----------------------------------------------------------------------------


def run_kafka_python(cfg: dict[str, Any]) -> None:
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.errors import KafkaConnectionError
    from kafka.structs import MemberState, OffsetAndMetadata

    assignors = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
    }
    stopping = client_signals.install()
    consumer = KafkaConsumer(
        bootstrap_servers=cfg["bootstrap"],
        client_id=cfg["name"],
        group_id=cfg["group"],
        group_instance_id=cfg["instance_id"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=cfg["session_timeout_ms"],
        heartbeat_interval_ms=cfg["heartbeat_interval_ms"],
        max_poll_interval_ms=cfg["max_poll_interval_ms"],
        metadata_max_age_ms=cfg["metadata_max_age_ms"],
        partition_assignment_strategy=[assignors[cfg["assignor"]]],
    )

    def ident() -> dict[str, Any]:
        md = consumer.group_metadata()
        return {"generation": md.generation_id, "member_id": md.member_id}

    def names(tps: Any) -> list[int]:
        return sorted(tp.partition for tp in tps)

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            emit("revoked", partitions=names(revoked), **ident())

        def on_partitions_assigned(self, assigned: Any) -> None:
            emit("assigned", partitions=names(assigned), **ident())

        def on_partitions_lost(self, lost: Any) -> None:
            emit("lost", partitions=names(lost), **ident())

    def read_committed(who: dict[str, Any]) -> None:
        """The group's committed offsets of this member's partitions, as the coordinator has
        them (see the module docstring: ``read_committed``)."""
        tps = sorted(consumer.assignment(), key=lambda tp: tp.partition)
        emit("reading_committed", partitions=names(tps), **who)
        try:
            offsets = {tp.partition: consumer.committed(tp) for tp in tps}
        except Exception as e:
            emit("read_committed_failed", error=f"{type(e).__name__}: {e}", **who)
            return
        found = {p: o for p, o in offsets.items() if o is not None}
        emit("read_committed", partitions=names(tps), offsets=found, **who)

    reporter = Reporter()
    consumer.subscribe([cfg["topic"]], listener=Listener())
    emit("started")
    read_in_generation = -1
    try:
        while not stopping.is_set():
            loop_came_round()
            try:
                batches = consumer.poll(timeout_ms=int(KAFKA_PYTHON_POLL_TIMEOUT_S * 1000))
            except KafkaConnectionError as e:
                # kafka-python 3.0.12 can raise a failed connection to a node just killed
                # (its FindCoordinator to that node) out of poll(); retriable, as any client
                # application would take it: poll again.
                emit("error", error=f"{type(e).__name__}: {e}", fatal=False)
                continue
            # The join runs on the client's IO thread: read the assignment between two equal
            # Stable snapshots of the membership so that both belong to one generation.
            md = consumer.group_metadata()
            partitions = {tp.partition for tp in consumer.assignment()}
            if (
                md.state == MemberState.STABLE
                and md.generation_id > 0
                and consumer.group_metadata() == md
            ):
                reporter.maybe_report(
                    md.generation_id,
                    md.member_id,
                    consumer._coordinator._generation.protocol or "",
                    partitions,
                )
            if not batches:
                continue
            records = [
                [tp.partition, r.offset, r.value.decode()] for tp, rs in batches.items() for r in rs
            ]
            who = ident()
            emit("records", records=records, **who)
            if who["generation"] != read_in_generation:
                read_in_generation = who["generation"]
                read_committed(who)
            # With the leader epoch of the last record, as the Java consumer commits (KIP-320).
            offsets = {
                tp: OffsetAndMetadata(rs[-1].offset + 1, "", rs[-1].leader_epoch)
                for tp, rs in batches.items()
            }
            plain = {tp.partition: o.offset for tp, o in offsets.items()}
            emit("committing", offsets=plain, **who)
            try:
                consumer.commit(offsets)
            except Exception as e:
                emit("commit_failed", error=f"{type(e).__name__}: {e}", offsets=plain, **who)
                if type(e).__name__ == "FencedInstanceIdError":
                    raise
            else:
                emit("committed", offsets=plain, **who)
    except Exception as e:
        emit("error", error=f"{type(e).__name__}: {e}", fatal=True)
        consumer.close(autocommit=False, timeout_ms=int(CLOSE_TIMEOUT_S * 1000))
        sys.exit(3)
    consumer.close(autocommit=False, timeout_ms=int(CLOSE_TIMEOUT_S * 1000))
    emit("closed")


# -- aiokafka --------------------------------------------------------------------------------


async def run_aiokafka(cfg: dict[str, Any]) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.structs import OffsetAndMetadata

    if cfg["assignor"] == "cooperative-sticky":
        emit("error", error="aiokafka has no cooperative rebalancing", fatal=True)
        sys.exit(2)
    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    client_signals.dump_stacks_on_sigusr1()
    stopping = asyncio.Event()  # set on the loop, not in a signal handler: no lock to wait for
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cfg["bootstrap"],
        client_id=cfg["name"],
        group_id=cfg["group"],
        group_instance_id=cfg["instance_id"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=cfg["session_timeout_ms"],
        heartbeat_interval_ms=cfg["heartbeat_interval_ms"],
        max_poll_interval_ms=cfg["max_poll_interval_ms"],
        rebalance_timeout_ms=cfg["max_poll_interval_ms"],
        metadata_max_age_ms=cfg["metadata_max_age_ms"],
        partition_assignment_strategy=(assignors[cfg["assignor"]],),
    )

    def ident() -> dict[str, Any]:
        coordinator = consumer._coordinator
        return {"generation": coordinator.generation, "member_id": coordinator.member_id}

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            emit("revoked", partitions=sorted(tp.partition for tp in revoked), **ident())

        def on_partitions_assigned(self, assigned: Any) -> None:
            emit("assigned", partitions=sorted(tp.partition for tp in assigned), **ident())

    await consumer.start()
    reporter = Reporter()
    consumer.subscribe([cfg["topic"]], listener=Listener())
    emit("started")
    try:
        while not stopping.is_set():
            loop_came_round()
            batches = await consumer.getmany(timeout_ms=int(POLL_TIMEOUT_S * 1000))
            # aiokafka takes the new generation from the JoinGroup answer but keeps the previous
            # assignment until the SyncGroup answer replaces it (its subscription only marks a
            # reassignment in progress, from the join's start to that answer); read both only
            # outside that window, or the old partitions are reported under the new generation
            # (chaos seed 37, groups, partitions: a SyncGroup delayed 8 s by a cut showed
            # "generation 4: [3, 4, 5]" beside the real generation 4's [4, 5], a split-ownership
            # the coordinator's log does not have).
            subscription = consumer._subscription.subscription
            coordinator = consumer._coordinator
            if (
                subscription is not None
                and subscription.assignment is not None
                and not consumer._subscription.reassignment_in_progress
                and coordinator.generation > 0
            ):
                reporter.maybe_report(
                    coordinator.generation,
                    coordinator.member_id,
                    cfg["assignor"],  # the only one it offers, so the one chosen
                    {tp.partition for tp in subscription.assignment.tps},
                )
            if not batches:
                continue
            records = [
                [tp.partition, r.offset, r.value.decode()] for tp, rs in batches.items() for r in rs
            ]
            who = ident()
            emit("records", records=records, **who)
            offsets = {tp: OffsetAndMetadata(rs[-1].offset + 1, "") for tp, rs in batches.items()}
            plain = {tp.partition: o.offset for tp, o in offsets.items()}
            emit("committing", offsets=plain, **who)
            try:
                await consumer.commit(offsets)
            except Exception as e:
                emit("commit_failed", error=f"{type(e).__name__}: {e}", offsets=plain, **who)
            else:
                emit("committed", offsets=plain, **who)
    except Exception as e:
        emit("error", error=f"{type(e).__name__}: {e}", fatal=True)
        await asyncio.wait_for(consumer.stop(), CLOSE_TIMEOUT_S)
        sys.exit(3)
    await asyncio.wait_for(consumer.stop(), CLOSE_TIMEOUT_S)
    emit("closed")


# -- confluent-kafka -------------------------------------------------------------------------


# librdkafka (2.16) answers a commit refused for the membership (the member was removed
# while cut off) by putting its next heartbeat a second off, and every such refusal puts it
# off again: committing every poll, a KIP-848 member never sent the heartbeat that would
# have made it rejoin, and kept partitions the group had given away for three minutes
# (make chaos, groups-partition seed 2). The member pauses its commits that long after one.
COMMIT_PAUSE_AFTER_FENCING_S: Final = 2.0
# UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH.
MEMBERSHIP_ERROR_CODES: Final = frozenset({25, 22, 110, 113})


def _membership_error(error: Any) -> bool:
    """Whether ``error`` (a confluent-kafka KafkaError, or anything) refuses the membership."""
    code = getattr(error, "code", None)
    return callable(code) and code() in MEMBERSHIP_ERROR_CODES


CGMD_MAGIC: Final = b"CGMDv2:"


def cgmd_generation(cgmd: bytes) -> int:
    """The generation in librdkafka's serialized consumer group metadata
    (``rd_kafka_consumer_group_metadata_write``: ``"CGMDv2:"``, then the generation id as a
    native int32, then the NUL-terminated group id, member id, ...)."""
    assert cgmd.startswith(CGMD_MAGIC), cgmd[:16]
    (generation,) = struct.unpack_from("=i", cgmd, len(CGMD_MAGIC))
    return int(generation)


def run_confluent(cfg: dict[str, Any]) -> None:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    stopping = client_signals.install()
    fatal: list[Any] = []

    def on_error(error: Any) -> None:
        # librdkafka reports a fatal error (e.g. FENCED_INSTANCE_ID) to the error callback as
        # _FATAL, the original error in its text.
        is_fatal = bool(error.fatal()) or error.code() == KafkaError._FATAL
        emit("error", error=f"{error.name()}: {error.str()}", fatal=is_fatal)
        if is_fatal:
            fatal.append(error)

    conf: dict[str, Any] = {
        "bootstrap.servers": cfg["bootstrap"],
        "client.id": cfg["name"],
        "group.id": cfg["group"],
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": cfg["session_timeout_ms"],
        "heartbeat.interval.ms": cfg["heartbeat_interval_ms"],
        "max.poll.interval.ms": cfg["max_poll_interval_ms"],
        "topic.metadata.refresh.interval.ms": cfg["metadata_max_age_ms"],
        "metadata.max.age.ms": cfg["metadata_max_age_ms"] * 3,
        "partition.assignment.strategy": cfg["assignor"],
        "error_cb": on_error,
    }
    if cfg["instance_id"] is not None:
        conf["group.instance.id"] = cfg["instance_id"]
    consumer_protocol = cfg.get("group_protocol") == "consumer"
    if consumer_protocol:
        # KIP-848: the broker assigns and times sessions; these are broker configs there.
        conf["group.protocol"] = "consumer"
        # librdkafka's own trace of the group protocol (heartbeats, reconciliation: a few
        # lines a heartbeat), as the other clients' group traces are always kept: a KIP-848
        # member stuck inside librdkafka left no word of what it was waiting for. With its
        # fetches and offset resets ("fetch", "topic"): a member given a partition back at
        # its committed offset 580 delivered offsets 0-499 of it at once (chaos seed 4216),
        # and the trace could not tell a stale fetch queue from a reset.
        conf["debug"] = "cgrp,fetch,topic"
        for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
            conf.pop(key)
    consumer = Consumer(conf)
    # The generation of the last assignment callback: librdkafka bumps its generation at the
    # JoinGroup answer, before the assignment of that generation reaches the application.
    settled: dict[str, int] = {"generation": -1}

    def ident() -> dict[str, Any]:
        generation = cgmd_generation(consumer.consumer_group_metadata())
        return {"generation": generation, "member_id": consumer.memberid()}

    def on_assign(c: Any, partitions: list[Any]) -> None:
        info = ident()
        settled["generation"] = info["generation"]
        emit("assigned", partitions=sorted(tp.partition for tp in partitions), **info)

    def on_revoke(c: Any, partitions: list[Any]) -> None:
        settled["generation"] = -1
        emit("revoked", partitions=sorted(tp.partition for tp in partitions), **ident())

    def on_lost(c: Any, partitions: list[Any]) -> None:
        settled["generation"] = -1
        emit("lost", partitions=sorted(tp.partition for tp in partitions), **ident())

    reporter = Reporter()
    consumer.subscribe([cfg["topic"]], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("started")
    commits_paused_until = 0.0  # see COMMIT_PAUSE_AFTER_FENCING_S
    try:
        while not stopping.is_set() and not fatal:
            loop_came_round()
            messages = consumer.consume(num_messages=500, timeout=POLL_TIMEOUT_S)
            if consumer_protocol:
                # The member epoch is the "generation"; the group is settled when every
                # member reports the group's assignment epoch.
                epoch = ident()["generation"]
                if epoch > 0:
                    reporter.maybe_report(
                        epoch,
                        consumer.memberid(),
                        "consumer",
                        {tp.partition for tp in consumer.assignment()},
                    )
            elif settled["generation"] > 0:
                reporter.maybe_report(
                    settled["generation"],
                    consumer.memberid(),
                    cfg["assignor"],  # the only one it offers, so the one chosen
                    {tp.partition for tp in consumer.assignment()},
                )
            records = []
            last: dict[int, tuple[int, int | None]] = {}  # partition -> offset, leader epoch
            for m in messages:
                error = m.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        on_error(error)
                    continue
                partition, offset = int(m.partition() or 0), int(m.offset() or 0)
                records.append([partition, offset, (m.value() or b"").decode()])
                last[partition] = (offset, m.leader_epoch())
            if not records:
                continue
            who = ident()
            emit("records", records=records, **who)
            # With the leader epoch of the last record, as the Java consumer commits (KIP-320).
            offsets = [
                TopicPartition(cfg["topic"], p, o + 1, leader_epoch=e) for p, (o, e) in last.items()
            ]
            plain = {tp.partition: tp.offset for tp in offsets}
            if time.monotonic() < commits_paused_until:
                continue  # processed, not committed: the next commit covers these records
            emit("committing", offsets=plain, **who)
            try:
                result = consumer.commit(offsets=offsets, asynchronous=False)
            except Exception as e:
                emit("commit_failed", error=f"{type(e).__name__}: {e}", offsets=plain, **who)
                if _membership_error(e.args[0] if e.args else None):
                    commits_paused_until = time.monotonic() + COMMIT_PAUSE_AFTER_FENCING_S
                continue
            failed = [tp for tp in result if tp.error is not None]
            if failed:
                emit("commit_failed", error=str(failed[0].error), offsets=plain, **who)
                if _membership_error(failed[0].error):
                    commits_paused_until = time.monotonic() + COMMIT_PAUSE_AFTER_FENCING_S
            else:
                emit("committed", offsets={tp.partition: tp.offset for tp in result}, **who)
    except Exception as e:
        emit("error", error=f"{type(e).__name__}: {e}", fatal=True)
        sys.exit(3)
    if fatal:
        consumer.close()
        sys.exit(3)
    consumer.close()
    emit("closed")


def main() -> None:
    cfg = json.loads(sys.argv[1])
    # The client's own log goes to stderr, which the tests keep for a failure's report.
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if cfg.get("debug") else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The group protocol's own trace (JoinGroup, SyncGroup, Heartbeat: a few lines a second)
    # always, for the report of a failed test.
    for name in ("kafka.coordinator", "aiokafka.consumer.group_coordinator"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    if not cfg.get("debug"):
        # It logs every need_rejoin() check at DEBUG, several per poll.
        logging.getLogger("kafka.coordinator.consumer").setLevel(logging.INFO)
    runners: dict[str, Callable[[dict[str, Any]], Any]] = {
        "kafka-python": run_kafka_python,
        "aiokafka": lambda c: asyncio.run(run_aiokafka(c)),
        "confluent-kafka": run_confluent,
    }
    runners[cfg["client"]](cfg)


if __name__ == "__main__":
    main()
