"""Workloads: real Kafka clients in their own processes, their reports turned into a history.

Every client process (``kcoord.chaos.member``, ``kcoord.chaos.producer``,
``kcoord.chaos.queue_consumer``) prints one JSON object per line; a reader thread per process
turns each into a history event (``kcoord.chaos.history``) as it arrives:

================  ==========================================================================
client report     history event (process = the client's name)
================  ==========================================================================
records           ``consume`` ok, with group, member id and generation
committing        ``commit`` invoke
committed         ``commit`` ok
commit_failed     ``commit`` info (the outcome of a failed commit is unknown)
assignment        ``assignment`` info: the member's settled assignment changed
assigned/revoked  ``assigned`` / ``revoked`` / ``lost`` info: the rebalance callbacks
send              ``send`` invoke
sent              ``send`` ok with partition and offset
send_failed       ``send`` info
polled            ``poll`` ok (queue workload)
================  ==========================================================================

The **groups** workload: one producer (acks=all, idempotent) and two consumer groups on one
topic: ``<prefix>-dynamic``, dynamic members with an eager assignor (range), one member per
client library (confluent-kafka, kafka-python, aiokafka); ``<prefix>-static``, static
members (KIP-345) with the cooperative-sticky assignor (confluent-kafka, kafka-python); and
``<prefix>-kip848``, two confluent-kafka members on the KIP-848 consumer protocol. Members
commit after processing. A killed member (the ``clients`` nemesis) is replaced: a static one by
a process with the same instance id, a dynamic one by a new member.

The **queue** workload (Jepsen's Kafka queue test): producers send unique values per key;
consumers poll, half with a manual assignment of every partition and half subscribed to a
group; after healing, final polls read every partition to its end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcoord.chaos.history import PROCESS_EXIT_F, PROCESS_KILL_F, UNRECORDED_REPORT_F, History
from kcoord.cluster.routing import partition_for
from kcoord.node.kafka.client import call_once
from kcoord.node.runtime import OFFSETS_TOPIC

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 20.0
# After SIGUSR1, how long a stuck client gets to write its stacks before SIGKILL.
STACK_DUMP_WAIT_S = 1.0
SESSION_TIMEOUT_MS = 6_000
STATIC_SESSION_TIMEOUT_MS = 30_000
HEARTBEAT_INTERVAL_MS = 500
MAX_POLL_INTERVAL_MS = 30_000
METADATA_MAX_AGE_MS = 3_000


class ClientProcess:
    """One client process and the thread that turns its reports into history events."""

    def __init__(
        self,
        name: str,
        module: str,
        cfg: dict[str, Any],
        log_dir: Path,
        on_event: Callable[[ClientProcess, dict[str, Any]], None],
        *,
        history: History,
    ) -> None:
        self.name = name
        self.module = module
        self.cfg = cfg
        self.on_event = on_event
        self.history = history
        self.stderr_path = log_dir / f"{name}.stderr"
        self.events = 0
        self.ending = False  # the runner or the nemesis stops it: its exit is no finding
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        with stdout:  # closed at the end of the output: a run may start many clients
            for line in stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    if not line.endswith(b"\n"):
                        continue  # the last line, cut by a kill: the report was never made
                    # A whole line that is not a report may have been one (an acknowledgement
                    # lost): said in the history, as below.
                    self.history.add(
                        self.name,
                        "info",
                        UNRECORDED_REPORT_F,
                        {"error": f"not JSON: {line[:200]!r}"},
                    )
                    continue
                self.events += 1
                try:
                    self.on_event(self, event)
                except Exception as e:
                    log.exception("%s: cannot record %r", self.name, event)
                    # Said in the history: a lost acknowledgement must fail the run, not
                    # turn into an unknown outcome (check_progress).
                    self.history.add(
                        self.name, "info", UNRECORDED_REPORT_F, {"error": repr(e)[:200]}
                    )
        # The end of its output: it exited, or is about to. A member that gave up (a fatal
        # client error, a crash) would otherwise go unnoticed: the final checks look at the
        # members still alive, and the group rebalances without it.
        returncode = self.proc.wait()
        if not self.ending:
            self.history.add(self.name, "info", PROCESS_EXIT_F, {"returncode": returncode})

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.ending = True
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=5)

    def stop(self) -> None:
        """SIGTERM and wait for a clean close; SIGKILL after the timeout."""
        self.ending = True
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s did not stop in %.0f s: killing it (its threads' stacks: %s)",
                    self.name,
                    STOP_TIMEOUT_S,
                    self.stderr_path,
                )
                # Every client writes its threads' stacks to stderr on SIGUSR1 (faulthandler):
                # where it is stuck, for the report.
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(STACK_DUMP_WAIT_S)
        self.kill()


def _offsets(raw: dict[str, Any]) -> dict[str, int]:
    return {str(p): int(o) for p, o in raw.items()}


@dataclass
class GroupsWorkload:
    """Producers and consumer groups on one topic (see the module docstring)."""

    bootstrap: str
    history: History
    log_dir: Path
    prefix: str = "chaos"
    partitions: int = 6
    rate: int = 40
    clients: tuple[str, ...] = ("confluent-kafka", "kafka-python", "aiokafka")
    processes: dict[str, ClientProcess] = field(default_factory=dict)
    _counter: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def topic(self) -> str:
        return f"{self.prefix}-groups"

    def groups(self) -> list[str]:
        return [f"{self.prefix}-dynamic", f"{self.prefix}-static", f"{self.prefix}-kip848"]

    # -- processes ------------------------------------------------------------------------------

    def _member_cfg(
        self, group: str, client: str, name: str, static: bool, protocol: str | None = None
    ) -> dict[str, Any]:
        session = STATIC_SESSION_TIMEOUT_MS if static else SESSION_TIMEOUT_MS
        return {
            "group_protocol": protocol,
            "client": client,
            "bootstrap": self.bootstrap,
            "group": group,
            "topic": self.topic,
            "name": name,
            "assignor": "cooperative-sticky" if static else "range",
            "instance_id": f"{group}-{name}" if static else None,
            "session_timeout_ms": session,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            "max_poll_interval_ms": max(MAX_POLL_INTERVAL_MS, session),
            "metadata_max_age_ms": METADATA_MAX_AGE_MS,
        }

    def _spawn(self, name: str, module: str, cfg: dict[str, Any]) -> ClientProcess:
        proc = ClientProcess(name, module, cfg, self.log_dir, self._on_event, history=self.history)
        self.processes[name] = proc
        self.history.add(name, "info", "process-start", {"module": module, "cfg": cfg})
        return proc

    def start(self) -> None:
        create_topic(self.bootstrap, self.topic, self.partitions)
        dynamic, static, kip848 = self.groups()
        self._spawn(
            "producer-0",
            "kcoord.chaos.producer",
            {"bootstrap": self.bootstrap, "topic": self.topic, "name": "p0", "rate": self.rate},
        )
        for i, client in enumerate(self.clients):
            name = f"dyn-{i}"
            self._spawn(name, "kcoord.chaos.member", self._member_cfg(dynamic, client, name, False))
        for i, client in enumerate(c for c in self.clients if c != "aiokafka"):
            name = f"static-{i}"
            self._spawn(name, "kcoord.chaos.member", self._member_cfg(static, client, name, True))
        if "confluent-kafka" in self.clients:
            for i in range(2):
                name = f"kip848-{i}"
                cfg = self._member_cfg(kip848, "confluent-kafka", name, False, "consumer")
                self._spawn(name, "kcoord.chaos.member", cfg)

    def kill_client(self, rng: random.Random) -> str | None:
        """The ``clients`` nemesis: SIGKILL a member ``rng`` picks and start its replacement."""
        members = sorted(n for n, p in self.processes.items() if p.alive and "producer" not in n)
        if not members:
            return None
        name = rng.choice(members)
        proc = self.processes[name]
        proc.kill()
        self.history.add(name, "info", PROCESS_KILL_F, {})
        cfg = dict(proc.cfg)
        if cfg.get("instance_id"):
            replacement = name  # the same static member, back under its instance id
        else:
            self._counter += 1
            replacement = f"{name}.{self._counter}"
            cfg["name"] = replacement
        self._spawn(replacement, proc.module, cfg)
        return name

    def members(self) -> list[ClientProcess]:
        return [p for n, p in self.processes.items() if p.alive and "producer" not in n]

    def stop_producers(self) -> None:
        for name, proc in list(self.processes.items()):
            if "producer" in name:
                proc.stop()

    def stop(self) -> None:
        for proc in list(self.processes.values()):
            proc.stop()

    def kill_all(self) -> None:
        for proc in list(self.processes.values()):
            proc.kill()

    # -- reports -> history -----------------------------------------------------------------

    def _on_event(self, proc: ClientProcess, event: dict[str, Any]) -> None:
        kind = event.get("event")
        cfg = proc.cfg
        who = {
            "group": cfg.get("group"),
            "topic": cfg.get("topic"),
            "member": proc.name,
            "member_id": event.get("member_id"),
            "generation": event.get("generation"),
            # Which protocol's generation it is (the checkers fence classic ones alone).
            "group_protocol": cfg.get("group_protocol") or "classic",
        }
        # Each report at the time its client stamped it: read on a thread per client, the
        # time the runner got it ordered commits of two clients the other way round (a
        # review's probe: a commit acknowledged last, read back, was taken for one
        # overwritten: a false lost commit), and held reads to acknowledgements late.
        when = self.history.time_at(event.get("at"))

        def add(process: str, type_: str, f: str, value: dict[str, Any]) -> None:
            self.history.add(process, type_, f, value, time=when)

        if kind == "records":
            add(proc.name, "ok", "consume", {**who, "records": event["records"]})
        elif kind == "committing":
            add(proc.name, "invoke", "commit", {**who, "offsets": _offsets(event["offsets"])})
        elif kind == "committed":
            add(proc.name, "ok", "commit", {**who, "offsets": _offsets(event["offsets"])})
        elif kind == "commit_failed":
            offsets = _offsets(event.get("offsets") or {})
            add(
                proc.name,
                "info",
                "commit",
                {**who, "offsets": offsets, "error": event.get("error")},
            )
        elif kind == "reading_committed":
            add(proc.name, "invoke", "committed", {**who, "partitions": event["partitions"]})
        elif kind == "read_committed":
            value = {**who, "partitions": event["partitions"], "offsets": event["offsets"]}
            add(proc.name, "ok", "committed", value)
        elif kind == "read_committed_failed":
            add(proc.name, "fail", "committed", {**who, "error": event.get("error")})
        elif kind == "assignment":
            add(proc.name, "info", "assignment", {**who, "partitions": event["partitions"]})
        elif kind in ("assigned", "revoked", "lost"):
            value = {**who, "partitions": event["partitions"], "at": event.get("at")}
            add(proc.name, "info", kind, value)
        elif kind == "send":
            add(proc.name, "invoke", "send", _send(cfg, event))
        elif kind == "sent":
            add(proc.name, "ok", "send", _send(cfg, event))
        elif kind == "send_failed":
            add(proc.name, "info", "send", {**_send(cfg, event), "error": event.get("error")})
        elif kind == "polled":
            add(
                proc.name,
                "ok",
                "final-poll" if event.get("final") else "poll",
                {
                    "member": proc.name,
                    "topic": cfg.get("topic"),
                    "mode": cfg.get("mode"),
                    "generation": event.get("generation"),
                    "records": event["records"],
                },
            )
        elif kind in ("assign", "subscribe"):
            add(
                proc.name,
                "info",
                kind,
                {"member": proc.name, "partitions": event.get("partitions")},
            )
        elif kind == "error":
            add(
                proc.name,
                "info",
                "client-error",
                {**who, "error": event.get("error"), "fatal": bool(event.get("fatal"))},
            )
        elif kind not in ("started", "closed"):
            # Recorded as an unrecorded report by _read: a misspelt acknowledgement must fail
            # the run, not vanish.
            raise ValueError(f"unknown event {kind!r}")


def _send(cfg: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = {
        "topic": cfg.get("topic"),
        "key": event["key"],
        "value": event["value"],
    }
    if "partition" in event:
        value["partition"] = event["partition"]
        value["offset"] = event["offset"]
    return value


# ---------------------------------------------------------------------------------------------
# Admin operations, in the runner's process, with kcoord's own blocking wire client: the
# runner reads while the network is cut, and librdkafka's AdminClient has aborted the whole
# process there (an assertion in rd_kafka_enq_once_del_source_return).

METADATA, OFFSET_FETCH, FIND_COORDINATOR, DESCRIBE_GROUPS, CREATE_TOPICS = 3, 9, 10, 15, 19
CONSUMER_GROUP_DESCRIBE = 69
GROUP_ID_NOT_FOUND = 69  # the error code (Errors.GROUP_ID_NOT_FOUND)
ADMIN_TIMEOUT_S = 5.0


def _endpoints(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        out.append((host, int(port)))
    return out


def _first_answer(bootstrap: str, api_key: int, version: int, values: dict[str, Any]) -> Any:
    """The first node's answer, trying each bootstrap node in a random order."""
    endpoints = _endpoints(bootstrap)
    random.shuffle(endpoints)  # spread reads over the nodes (not part of the seeded schedule)
    error: Exception | None = None
    for host, port in endpoints:
        try:
            return call_once(host, port, api_key, version, values, timeout_s=ADMIN_TIMEOUT_S)
        except (OSError, ConnectionError) as e:
            error = e
    raise ConnectionError(f"no node of {bootstrap} answered: {error}")


def _coordinator(bootstrap: str, group: str) -> tuple[str, int]:
    found = _first_answer(bootstrap, FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
    if int(found.error_code) != 0:
        raise ConnectionError(f"FindCoordinator({group}): error {found.error_code}")
    return str(found.host), int(found.port)


def create_topic(bootstrap: str, topic: str, partitions: int, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            created = _first_answer(
                bootstrap,
                CREATE_TOPICS,
                7,
                {
                    "topics": [
                        {
                            "name": topic,
                            "num_partitions": partitions,
                            "replication_factor": 3,
                            "configs": [{"name": "min.insync.replicas", "value": "2"}],
                        }
                    ],
                    "timeout": 30_000,
                },
            )
            code = int(created.topics[0].error_code)
            if code in (0, 36):  # NONE, TOPIC_ALREADY_EXISTS
                return
            error: str = f"error code {code}"
        except (OSError, ConnectionError) as e:
            error = str(e)
        if time.monotonic() > end:
            raise RuntimeError(f"cannot create {topic}: {error}")
        time.sleep(0.5)  # a retry backoff: the cluster may still be electing leaders


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int, timeout_s: float = ADMIN_TIMEOUT_S
) -> dict[str, int]:
    """The group's committed offsets (FindCoordinator, then OffsetFetch); raises on an error."""
    return read_committed(bootstrap, group, topic, partitions, timeout_s)[0]


def read_committed(
    bootstrap: str, group: str, topic: str, partitions: int, timeout_s: float = ADMIN_TIMEOUT_S
) -> tuple[dict[str, int], tuple[str, int]]:
    """``committed_offsets``, and the coordinator that answered (host, port)."""
    host, port = _coordinator(bootstrap, group)
    fetched = call_once(
        host,
        port,
        OFFSET_FETCH,
        7,
        {
            "group_id": group,
            "topics": [{"name": topic, "partition_indexes": list(range(partitions))}],
            "require_stable": False,
        },
        timeout_s=timeout_s,
    )
    if int(fetched.error_code) != 0:
        raise ConnectionError(f"OffsetFetch({group}): error {fetched.error_code}")
    out: dict[str, int] = {}
    for t in fetched.topics:
        for p in t.partitions:
            if int(p.error_code) != 0:
                raise ConnectionError(f"OffsetFetch({group}): partition error {p.error_code}")
            if int(p.committed_offset) >= 0:
                out[str(p.partition_index)] = int(p.committed_offset)
    return out, (host, port)


# A node's view of a partition's leadership: (leader id, leader epoch).
Leadership = tuple[int, int]


def offsets_leadership(
    bootstrap: str, group: str, timeout_s: float
) -> dict[tuple[str, int], Leadership | None]:
    """Each node's view of the leadership of ``group``'s ``__consumer_offsets`` partition, as
    its Metadata answer says (None: no answer within ``timeout_s``, or an error)."""
    views: dict[tuple[str, int], Leadership | None] = {}
    for host, port in _endpoints(bootstrap):
        view: Leadership | None = None
        try:
            md = call_once(
                host,
                port,
                METADATA,
                9,
                {"topics": [{"name": OFFSETS_TOPIC}], "allow_auto_topic_creation": False},
                timeout_s=timeout_s,
            )
        except (OSError, ConnectionError):
            md = None
        for t in md.topics if md is not None else ():
            if str(t.name) != OFFSETS_TOPIC or int(t.error_code) != 0 or not t.partitions:
                continue
            index = partition_for(group, len(t.partitions))
            for p in t.partitions:
                if int(p.partition_index) == index and int(p.error_code) == 0:
                    view = (int(p.leader_id), int(p.leader_epoch))
        views[(host, port)] = view
    return views


def answered_by_a_deposed_coordinator(
    own: Leadership | None, known_before: Leadership | None
) -> bool:
    """A read answered by a node already deposed when the read was sent: some node showed a
    later leader epoch of the group's partition, with another leader, before the read was
    sent (``known_before``) than the answering node's own view, asked after it answered
    (``own``, so at least the epoch it answered in). Such a node has not learnt it yet (cut
    off from the controller) and goes on serving the state it had, as a deposed Kafka
    coordinator does until it resigns. Not when the later epoch was learnt only after the
    read (the answering node may have been the coordinator then), nor when it names the same
    leader (an epoch bumped for it again). Before, every other node had to name one other
    coordinator (seed 4055); one that did not answer, cut off by the next fault, held a
    deposed node's read to commits it never saw (``make chaos``, groups-reset seed 1)."""
    if own is None or known_before is None:
        return False
    return known_before[1] > own[1] and known_before[0] != own[0]


def describe_group(bootstrap: str, group: str) -> dict[str, Any]:
    """ConsumerGroupDescribe for a KIP-848 group, else DescribeGroups (as the Java admin
    client does: GROUP_ID_NOT_FOUND from the first means a classic group)."""
    host, port = _coordinator(bootstrap, group)
    described = call_once(
        host,
        port,
        CONSUMER_GROUP_DESCRIBE,
        0,
        {"group_ids": [group], "include_authorized_operations": False},
        timeout_s=ADMIN_TIMEOUT_S,
    )
    g = described.groups[0]
    if int(g.error_code) == GROUP_ID_NOT_FOUND:
        described = call_once(
            host, port, DESCRIBE_GROUPS, 5, {"groups": [group]}, timeout_s=ADMIN_TIMEOUT_S
        )
        g = described.groups[0]
    if int(g.error_code) != 0:
        raise ConnectionError(f"describing {group}: error {g.error_code}")
    return {
        "group": group,
        "state": str(g.group_state),
        "members": sorted(str(m.member_id) for m in g.members),
        "coordinator": f"{host}:{port}",
    }


@dataclass
class QueueWorkload(GroupsWorkload):
    """Jepsen's queue: producers of unique values, consumers by assignment and by group."""

    consumers: int = 4

    @property
    def topic(self) -> str:
        return f"{self.prefix}-queue"

    def groups(self) -> list[str]:
        return [f"{self.prefix}-queue"]

    def start(self) -> None:
        create_topic(self.bootstrap, self.topic, self.partitions)
        for i in range(2):
            self._spawn(
                f"producer-{i}",
                "kcoord.chaos.producer",
                {
                    "bootstrap": self.bootstrap,
                    "topic": self.topic,
                    "name": f"p{i}",
                    "rate": max(1, self.rate // 2),
                },
            )
        for i in range(self.consumers):
            mode = "assign" if i % 2 == 0 else "subscribe"
            name = f"{mode}-{i}"
            self._spawn(name, "kcoord.chaos.queue_consumer", self._consumer_cfg(name, mode))

    def _consumer_cfg(self, name: str, mode: str, *, final: bool = False) -> dict[str, Any]:
        return {
            "bootstrap": self.bootstrap,
            "topic": self.topic,
            "name": name,
            "mode": mode,
            "group": self.groups()[0] if mode == "subscribe" else None,
            "final": final,
        }

    def final_poll(self, timeout_s: float = 90.0) -> None:
        """Read every partition from the start to its end in a fresh consumer."""
        proc = self._spawn(
            "final-poll",
            "kcoord.chaos.queue_consumer",
            self._consumer_cfg("final", "assign", final=True),
        )
        proc.ending = True  # it ends by itself once it has read everything
        try:
            code = proc.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the final poll did not finish in %.0f s", timeout_s)
        else:
            if code != 0:
                # Its stderr (work/clients/final-poll.stderr) says why; the queue checker
                # then finds every acknowledged value unseen.
                log.warning("the final poll failed (exit code %d): see final-poll.stderr", code)
        proc.kill()
