"""Consumer groups with real, unmodified clients on a real 3-node kcoord cluster.

For each of kafka-python, aiokafka and confluent-kafka, every group member is its own process
(``kcoord.chaos.member``, shared with the chaos suite) that reports, one JSON line at a time,
what its client tells it: the assignment it settled on with its generation and member id, the
callbacks' revocations, the records it processed and the commits the coordinator acknowledged.
A group's assignment is *valid* when every live member reports the same generation, their
partitions are disjoint and cover the topic, and each member owns at least one (six partitions,
at most three members: every assignor gives each one some). The tests:

1. a group of three consumes every message exactly once, commits after processing, and a
   restarted group resumes from the committed offsets (new messages only);
2. and 3. with each assignor (range and roundrobin: eager; cooperative-sticky where the client
   has it), a member joins and another leaves, and the group ends valid after each step; eager
   members give up everything at a rebalance, cooperative ones never what they keep (KIP-429);
4. CreatePartitions on the subscribed topic: the new partitions are assigned (and consumed)
   after the clients' metadata refresh;
5. a SIGKILLed member's partitions move to the others once its session timeout expires, not
   before;
6. static members (KIP-345): a member bounced with the same group.instance.id gets its
   partitions back in the same generation and nobody else rebalances; a second process with a
   live member's instance id replaces it, and the old one is fenced (FENCED_INSTANCE_ID);
7. SIGKILL of the node coordinating the group while its members run: the group's
   ``__consumer_offsets`` partition fails over to a follower that answers OffsetFetch with every
   acknowledged commit; the members carry on; the node restarts and takes its leadership back
   with the commits made meanwhile; no acknowledged message is lost and none is read twice.

The shared cluster sets ``group.initial.rebalance.delay.ms`` to 0 (faster joins); a second one
with Kafka's defaults checks the default delay (3000 ms). Skipped, with the reason: what a
client lacks (aiokafka: cooperative rebalancing; a group instance id in its Heartbeat and
OffsetCommit). Every member is killed at the end of its test; a failed wait prints each member's
last events and the tail of its client's log (which always has the group protocol's trace).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kcoord.cluster.routing import partition_for
from kcoord.node import launcher
from kcoord.raft.controller import OFFSETS_TOPIC_NAME
from tests.integration.cluster import LocalCluster, wait_for
from tests.integration.test_kafka_clients import run_client

pytestmark = pytest.mark.integration

CLIENTS = ("kafka-python", "aiokafka", "confluent-kafka")
ASSIGNORS = ("range", "roundrobin", "cooperative-sticky")
EAGER = ("range", "roundrobin")
MEMBER_MODULE = "kcoord.chaos.member"

PARTITIONS = 6
GROUP_OPERATIONS = ["ALTER_CONFIGS", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ"]
SESSION_TIMEOUT_MS = 6_000  # group.min.session.timeout.ms: the shortest a member may ask for
STATIC_SESSION_TIMEOUT_MS = 60_000  # long enough that a bounce never expires the member
# For members while their coordinator moves: librdkafka leaves the group by itself after a
# session timeout without a successful heartbeat, and on a loaded machine (two test workers)
# a move has taken 6 s. Kafka's default session.timeout.ms is 45 s (KIP-735).
FAILOVER_SESSION_TIMEOUT_MS = 30_000
HEARTBEAT_INTERVAL_MS = 500
MAX_POLL_INTERVAL_MS = 30_000  # the classic protocol's rebalance timeout
METADATA_MAX_AGE_MS = 5_000
FAST_METADATA_MAX_AGE_MS = 1_000
DEFAULT_INITIAL_REBALANCE_DELAY_MS = 3_000  # Kafka's group.initial.rebalance.delay.ms
DEADLINE_S = 45.0
STOP_TIMEOUT_S = 20.0

# How each client says FENCED_INSTANCE_ID (error 82); librdkafka raises it as a fatal error
# (_FATAL) whose text is the one it has for error 82.
FENCED = {
    "kafka-python": "FencedInstanceIdError",
    "confluent-kafka": "Static consumer fenced by other consumer with same group.instance.id",
}

FAST_OVERRIDES = {"group.initial.rebalance.delay.ms": 0}


# -- member processes ------------------------------------------------------------------------


class Member:
    """One ``kcoord.chaos.member`` process and the events it reported, stamped on arrival."""

    def __init__(self, name: str, cfg: dict[str, Any], log_dir: Path) -> None:
        self.name = name
        self.cfg = cfg
        self.stderr_path = log_dir / f"{name}.stderr"
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", MEMBER_MODULE, json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "noise", "line": line}
            event["_at"] = time.monotonic()
            with self._lock:
                self._events.append(event)

    def events(self, *kinds: str, since: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events[since:] if not kinds or e["event"] in kinds]

    def mark(self) -> int:
        """The position of the next event, for ``events(since=...)``."""
        with self._lock:
            return len(self._events)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def assignment(self) -> dict[str, Any] | None:
        reports = self.events("assignment")
        return reports[-1] if reports else None

    def records(self) -> list[tuple[int, int, str]]:
        return [(p, o, v) for e in self.events("records") for p, o, v in e["records"]]

    def committed(self) -> dict[int, int]:
        """The highest acknowledged commit per partition."""
        out: dict[int, int] = {}
        for e in self.events("committed"):
            for p, o in e["offsets"].items():
                out[int(p)] = max(out.get(int(p), -1), o)
        return out

    def kill(self) -> None:
        if self.alive:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT_S)
        self._reader.join(STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """A clean stop (the client's close): it must report ``closed`` and exit 0."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT_S)
        finally:
            self.kill()
        assert rc == 0 and self.events("closed"), f"{self.name} did not stop cleanly\n{self}"

    def stacks(self, deadline_s: float = 3.0) -> str:
        """Every thread's stack of a live member (``kcoord.chaos.member`` dumps them to
        stderr on SIGUSR1), for the report of a member stuck without an assignment."""
        if not self.alive:
            return ""
        start = self.stderr_path.stat().st_size
        os.kill(self.proc.pid, signal.SIGUSR1)

        seen = [-1]

        def dumped() -> str | None:
            # faulthandler writes the current thread last; done once the file stops growing.
            with open(self.stderr_path, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
            done = "Current thread 0x" in text and len(text) == seen[0]
            seen[0] = len(text)
            return text if done else None

        try:
            found: str = wait_for(dumped, f"{self.name}'s stacks", deadline_s)
        except AssertionError:
            return f"--- {self.name}: no stacks within {deadline_s:.0f} s"
        threads = [line for line in found.splitlines() if line.strip()]
        return "\n".join([f"--- {self.name} threads:", *threads])

    def __str__(self) -> str:
        state = "alive" if self.alive else f"exit {self.proc.returncode}"
        shown = [
            {k: v for k, v in e.items() if k != "_at"}
            for e in self.events()
            if e["event"] != "records"
        ][-12:]
        try:
            stderr = self.stderr_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            stderr = []
        return "\n".join(
            [f"--- member {self.name} ({state}):", *map(json.dumps, shown), "  stderr:", *stderr]
        )


@dataclass
class Spawner:
    """Starts the members of one test and kills whatever is left of them at its end."""

    bootstrap: str
    log_dir: Path
    started: list[Member]

    def __call__(
        self,
        client: str,
        group: str,
        topic: str,
        name: str,
        *,
        assignor: str = "range",
        instance_id: str | None = None,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        metadata_max_age_ms: int = METADATA_MAX_AGE_MS,
        group_protocol: str | None = None,
    ) -> Member:
        cfg = {
            "client": client,
            "bootstrap": self.bootstrap,
            "group": group,
            "topic": topic,
            "name": name,
            "assignor": assignor,
            "instance_id": instance_id,
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            # librdkafka wants it at least the session timeout.
            "max_poll_interval_ms": max(MAX_POLL_INTERVAL_MS, session_timeout_ms),
            "metadata_max_age_ms": metadata_max_age_ms,
            "debug": bool(os.environ.get("GROUP_MEMBER_DEBUG")),
            "group_protocol": group_protocol,
        }
        member = Member(name, cfg, self.log_dir)
        self.started.append(member)
        return member

    def report(self) -> str:
        members = [str(m) for m in self.started]
        return "\n".join([*members, *(m.stacks() for m in self.started if m.alive)])

    def close(self) -> None:
        """Kill every member: one that cannot be killed leaves the others killed all the same."""
        first_error: Exception | None = None
        for member in self.started:
            try:
                member.kill()
            except Exception as e:  # a TimeoutExpired of one member's wait
                first_error = first_error or e
        if first_error is not None:
            raise first_error


@dataclass(frozen=True)
class Settled:
    """A valid assignment, as the members reported it."""

    generation: int
    owned: dict[str, frozenset[int]]  # member name -> partitions
    member_ids: dict[str, str]  # member name -> member id


def settled(members: list[Member], partitions: int) -> Settled | None:
    """The members' common, valid assignment, or None if they have none right now."""
    if not all(m.alive for m in members):
        return None
    reports = {m.name: m.assignment() for m in members}
    if any(r is None for r in reports.values()):
        return None
    generations = {r["generation"] for r in reports.values() if r is not None}
    owned = {name: frozenset(r["partitions"]) for name, r in reports.items() if r is not None}
    ids = {name: r["member_id"] for name, r in reports.items() if r is not None}
    if len(generations) != 1 or len(set(ids.values())) != len(members):
        return None
    if sum(len(p) for p in owned.values()) != partitions:
        return None  # overlapping or missing partitions
    if frozenset().union(*owned.values()) != frozenset(range(partitions)):
        return None
    if not all(owned.values()):
        return None
    return Settled(generations.pop(), owned, ids)


def wait_settled(
    spawn: Spawner,
    members: list[Member],
    partitions: int = PARTITIONS,
    *,
    after: Settled | None = None,
    deadline_s: float = DEADLINE_S,
) -> Settled:
    """Wait for a valid assignment (of a later generation than ``after``, if given)."""

    def check() -> Settled | None:
        s = settled(members, partitions)
        if s is None or (after is not None and s.generation <= after.generation):
            return None
        return s

    result: Settled = wait_until(spawn, check, "a valid assignment", members, deadline_s)
    return result


class _Died:
    """What a wait's condition answers when a member it needs has exited (truthy: it ends
    the wait at once instead of at the deadline)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names


def wait_until(
    spawn: Spawner,
    condition: Callable[[], Any],
    what: str,
    members: list[Member],
    deadline_s: float = DEADLINE_S,
) -> Any:
    """``wait_for`` that reports every member on failure, and fails as soon as one of
    ``members`` (those the condition needs) has exited."""

    def check() -> Any:
        dead = [m.name for m in members if not m.alive]
        return _Died(dead) if dead else condition()

    try:
        result = wait_for(check, what, deadline_s)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{spawn.report()}") from None
    if isinstance(result, _Died):
        raise AssertionError(f"{result.names} exited waiting for {what}\n{spawn.report()}")
    return result


def rebalance_events(member: Member, since: int) -> list[dict[str, Any]]:
    return member.events("assigned", "revoked", "lost", since=since)


def revoked(member: Member, since: int = 0) -> set[int]:
    """Every partition the member gave up (revoked or lost) since the mark."""
    return {p for e in member.events("revoked", "lost", since=since) for p in e["partitions"]}


# -- the data side ---------------------------------------------------------------------------

Acked = list[tuple[int, int, str]]  # partition, offset, value of every acknowledged message


def create_topic(client: str, bootstrap: str, topic: str) -> None:
    run_client(
        client,
        {
            "op": "create_topic",
            "bootstrap": bootstrap,
            "topic": topic,
            "partitions": PARTITIONS,
            "replication_factor": 3,
        },
    )


def produce(client: str, bootstrap: str, topic: str, count: int, prefix: str) -> Acked:
    """``count`` messages keyed by their values (so spread over the partitions)."""
    raw = run_client(
        client,
        {"op": "produce", "bootstrap": bootstrap, "topic": topic, "count": count, "prefix": prefix},
    )
    assert len(raw) == count
    return [(int(p), int(o), str(v)) for p, o, _, v in raw]


def committed_offsets(client: str, bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """OffsetFetch through the client's admin API, tried again while it fails (a coordinator
    that is restarting or loading its shard)."""

    def fetch() -> tuple[dict[int, int]]:
        raw = run_client(
            client, {"op": "committed", "bootstrap": bootstrap, "group": group, "topic": topic}
        )
        return ({int(p): int(o) for p, o in raw.items()},)  # truthy even when empty

    (offsets,) = wait_for(fetch, f"OffsetFetch of {group}", DEADLINE_S)
    return dict(offsets)


def end_offsets(acked: Acked) -> dict[int, int]:
    ends: dict[int, int] = {}
    for p, o, _ in acked:
        ends[p] = max(ends.get(p, 0), o + 1)
    return ends


def consumed(members: list[Member]) -> list[tuple[int, int, str]]:
    return [r for m in members for r in m.records()]


def group_committed(members: list[Member]) -> dict[int, int]:
    out: dict[int, int] = {}
    for m in members:
        for p, o in m.committed().items():
            out[p] = max(out.get(p, -1), o)
    return out


def wait_consumed(spawn: Spawner, members: list[Member], acked: Acked) -> None:
    """Until every acknowledged message has been processed by some member."""
    wanted = {v for _, _, v in acked}
    wait_until(
        spawn,
        lambda: wanted <= {v for _, _, v in consumed(members)},
        f"{len(wanted)} messages consumed",
        members,
    )


def check_exactly_once(acked: Acked, records: list[tuple[int, int, str]]) -> None:
    """Every acknowledged message was processed once, at the partition and offset it was
    acknowledged with, and nothing else was."""
    where = {v: (p, o) for p, o, v in acked}
    counts = Counter(v for _, _, v in records)
    duplicated = sorted(v for v, n in counts.items() if n > 1)
    seen = {v: sorted((p, o) for p, o, w in records if w == v) for v in duplicated[:5]}
    assert not duplicated, f"{len(duplicated)} messages consumed twice: " + ", ".join(
        f"{v} acked at {where.get(v)} read at {at}" for v, at in seen.items()
    )
    assert set(counts) == set(where), f"unexpected: {sorted(set(counts) - set(where))[:5]}"
    for p, o, v in records:
        assert where[v] == (p, o), f"{v} read at {(p, o)}, acknowledged at {where[v]}"


def coordinator_agrees(client: str, bootstrap: str, group: str, members: list[Member]) -> bool:
    """DescribeGroups says Stable, with the members and partitions the members report."""
    now = settled(members, PARTITIONS)
    described = run_client(
        client, {"op": "describe_group", "bootstrap": bootstrap, "group": group, "topic": group}
    )
    # No authorizer: every group operation (AclEntry.supportedOperations of Kafka 4); aiokafka
    # cannot read them (see its client script).
    if client != "aiokafka":
        assert described["operations"] == GROUP_OPERATIONS, described["operations"]
    return (
        now is not None
        and described["state"].lower() == "stable"
        and {m["member_id"]: frozenset(m["partitions"]) for m in described["members"]}
        == {now.member_ids[name]: owned for name, owned in now.owned.items()}
    )


# -- clusters --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("groups"), overrides=FAST_OVERRIDES) as c:
        yield c


@pytest.fixture(scope="module")
def default_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Kafka's defaults, among them a 3000 ms initial rebalance delay."""
    with LocalCluster(tmp_path_factory.mktemp("groups-defaults")) as c:
        yield c


@pytest.fixture(autouse=True)
def _nodes_back_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A node a failed test left down is started again before the next test."""
    yield
    for name in ("cluster", "default_cluster"):
        if name in request.fixturenames:
            request.getfixturevalue(name).revive()


def bootstrap_of(cluster: LocalCluster) -> str:
    assert cluster.state is not None
    return cluster.state.bootstrap_servers


@pytest.fixture
def spawn(cluster: LocalCluster, tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(bootstrap_of(cluster), tmp_path, [])
    try:
        yield spawner
    finally:
        spawner.close()


@pytest.fixture
def spawn_defaults(default_cluster: LocalCluster, tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(bootstrap_of(default_cluster), tmp_path, [])
    try:
        yield spawner
    finally:
        spawner.close()


# -- 1. consume, commit, resume --------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_group_consumes_every_message_once_and_resumes_from_its_commits(
    cluster: LocalCluster, spawn: Spawner, client: str
) -> None:
    bootstrap = bootstrap_of(cluster)
    topic = group = f"resume-{client}"
    create_topic(client, bootstrap, topic)
    first = [spawn(client, group, topic, f"first-{i}") for i in range(3)]
    s = wait_settled(spawn, first)
    # The coordinator's view (DescribeGroups through the client's admin) is the members'.
    wait_until(
        spawn, lambda: coordinator_agrees(client, bootstrap, group, first), "DescribeGroups", first
    )

    acked = produce(client, bootstrap, topic, 300, "before")
    assert {p for p, _, _ in acked} == set(range(PARTITIONS))
    wait_consumed(spawn, first, acked)
    check_exactly_once(acked, consumed(first))
    for m in first:
        # Each member read only the partitions it owned.
        assert {p for p, _, _ in m.records()} <= s.owned[m.name], m.name
    ends = end_offsets(acked)
    wait_until(
        spawn, lambda: group_committed(first) == ends, "commits up to every end offset", first
    )
    # The coordinator's answer to OffsetFetch is what it acknowledged to the members.
    assert committed_offsets(client, bootstrap, group, topic) == ends

    for m in first:
        m.stop()
    more = produce(client, bootstrap, topic, 120, "after")
    second = [spawn(client, group, topic, f"second-{i}") for i in range(3)]
    wait_settled(spawn, second)
    wait_consumed(spawn, second, more)
    # Only the new messages: nothing committed before the restart is read again.
    check_exactly_once(more, consumed(second))
    wait_until(
        spawn,
        lambda: group_committed(second) == end_offsets(acked + more),
        "the new commits",
        second,
    )


# -- 2 and 3. assignors, members joining and leaving -----------------------------------------


@pytest.mark.parametrize("assignor", ASSIGNORS)
@pytest.mark.parametrize("client", CLIENTS)
def test_members_join_and_leave_with_each_assignor(
    cluster: LocalCluster, spawn: Spawner, client: str, assignor: str
) -> None:
    if client == "aiokafka" and assignor == "cooperative-sticky":
        pytest.skip("aiokafka has no cooperative rebalancing (KIP-429), only eager assignors")
    bootstrap = bootstrap_of(cluster)
    topic = group = f"members-{client}-{assignor}"
    create_topic(client, bootstrap, topic)
    a, b = (spawn(client, group, topic, name, assignor=assignor) for name in ("a", "b"))
    before_join = wait_settled(spawn, [a, b])
    marks = {m.name: m.mark() for m in (a, b)}

    c = spawn(client, group, topic, "c", assignor=assignor)
    after_join = wait_settled(spawn, [a, b, c], after=before_join)
    for m in (a, b):
        check_revocations(assignor, m, before_join, after_join, marks[m.name])
    marks = {m.name: m.mark() for m in (b, c)}

    a.stop()  # a dynamic member leaves the group on close (LeaveGroup)
    after_leave = wait_settled(spawn, [b, c], after=after_join)
    for m in (b, c):
        check_revocations(assignor, m, after_join, after_leave, marks[m.name])
    for m in (a, b, c):
        protocols = {e["protocol"] for e in m.events("assignment")}
        assert protocols == {assignor}, (m.name, protocols)


def check_revocations(
    assignor: str, member: Member, before: Settled, after: Settled, since: int
) -> None:
    """What the member gave up between two valid assignments. Eager: everything it owned
    (it rejoins with nothing); cooperative (KIP-429): only what moved to someone else."""
    owned_before, owned_after = before.owned[member.name], after.owned[member.name]
    given_up = revoked(member, since)
    if assignor in EAGER:
        assert given_up >= owned_before, (member.name, sorted(given_up), sorted(owned_before))
    else:
        kept = owned_before & owned_after
        assert not given_up & kept, (member.name, "revoked what it kept", sorted(given_up & kept))
        assert given_up >= owned_before - owned_after, (member.name, sorted(given_up))


# -- 4. CreatePartitions ---------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_new_partitions_are_assigned_after_a_metadata_refresh(
    cluster: LocalCluster, spawn: Spawner, client: str
) -> None:
    bootstrap = bootstrap_of(cluster)
    topic = group = f"grow-{client}"
    create_topic(client, bootstrap, topic)
    members = [
        spawn(client, group, topic, f"m{i}", metadata_max_age_ms=FAST_METADATA_MAX_AGE_MS)
        for i in range(3)
    ]
    before = wait_settled(spawn, members)
    grown = PARTITIONS + 3
    run_client(
        client,
        {"op": "create_partitions", "bootstrap": bootstrap, "topic": topic, "partitions": grown},
    )
    wait_settled(spawn, members, grown, after=before)
    acked = produce(client, bootstrap, topic, 90, "grown")
    assert {p for p, _, _ in acked} == set(range(grown)), "keys spread over the new partitions"
    wait_consumed(spawn, members, acked)
    check_exactly_once(acked, consumed(members))


# -- 5. a crashed member ---------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_killed_members_partitions_move_after_its_session_timeout(
    cluster: LocalCluster, spawn: Spawner, client: str
) -> None:
    bootstrap = bootstrap_of(cluster)
    topic = group = f"crash-{client}"
    create_topic(client, bootstrap, topic)
    victim, *survivors = (spawn(client, group, topic, f"m{i}") for i in range(3))
    before = wait_settled(spawn, [victim, *survivors])

    killed_at = time.monotonic()  # before kill(), which waits for the exit and the reader
    victim.kill()  # no LeaveGroup: only the session timeout tells the coordinator
    after = wait_settled(spawn, survivors, after=before)
    # The first survivor callback of the rebalance: nothing moves before the coordinator
    # expires the victim, at its last heartbeat (about one interval before the kill, later
    # than that on a loaded machine: a second's room) plus the session timeout.
    moved_at = min(
        e["_at"]
        for m in survivors
        for e in m.events("revoked", "assigned", "lost")
        if e["_at"] > killed_at
    )
    earliest_s = (SESSION_TIMEOUT_MS - HEARTBEAT_INTERVAL_MS) / 1000
    assert moved_at - killed_at >= earliest_s - 1.0, moved_at - killed_at
    taken = frozenset().union(*(after.owned[m.name] for m in survivors))
    assert before.owned[victim.name] <= taken


# -- 6. static membership --------------------------------------------------------------------


def static_group(spawn: Spawner, client: str, prefix: str) -> tuple[str, Callable[..., Member]]:
    """A topic for a group of static members, and how to start one."""
    bootstrap = spawn.bootstrap
    topic = group = f"{prefix}-{client}"
    create_topic(client, bootstrap, topic)

    def static(name: str, instance: str) -> Member:
        return spawn(
            client,
            group,
            topic,
            name,
            instance_id=f"{group}-{instance}",
            session_timeout_ms=STATIC_SESSION_TIMEOUT_MS,
        )

    return topic, static


@pytest.mark.parametrize("client", CLIENTS)
def test_a_bounced_static_member_gets_its_partitions_back_without_a_rebalance(
    cluster: LocalCluster, spawn: Spawner, client: str
) -> None:
    bootstrap = bootstrap_of(cluster)
    topic, static = static_group(spawn, client, "bounce")
    group = topic
    a, b, c = (static(i, i) for i in "abc")
    s = wait_settled(spawn, [a, b, c])

    # Bounce a: a crash and a quick restart with the same group.instance.id. The coordinator
    # swaps the member id and answers with a's assignment in the same generation (KIP-345).
    marks = {m.name: m.mark() for m in (b, c)}
    a.kill()
    a2 = static("a2", "a")
    bounced = wait_settled(spawn, [a2, b, c])
    assert bounced.generation == s.generation
    assert bounced.owned["a2"] == s.owned["a"]
    assert all(bounced.owned[n] == s.owned[n] for n in "bc")
    assert bounced.member_ids["a2"] != s.member_ids["a"]
    # Evidence that the group stayed put: every member consumes and commits after the bounce,
    # which takes several heartbeat intervals; had the bounce started a rebalance, b and c would
    # have been told at their next heartbeat and rejoined.
    acked = produce(client, bootstrap, topic, 60, "bounced")
    wait_consumed(spawn, [a2, b, c], acked)
    check_exactly_once(acked, consumed([a2, b, c]))
    wait_until(
        spawn, lambda: group_committed([a2, b, c]) == end_offsets(acked), "commits", [a2, b, c]
    )
    for m in (b, c):
        assert not rebalance_events(m, marks[m.name]), (m.name, rebalance_events(m, 0))
        report = m.assignment()
        assert report is not None and report["generation"] == s.generation
    # The coordinator's view (DescribeGroups through kafka-python's admin: aiokafka's stops at
    # v3, which has no group instance ids).
    described = run_client(
        "kafka-python",
        {"op": "describe_group", "bootstrap": bootstrap, "group": group, "topic": topic},
    )
    assert described["state"] == "Stable"
    by_instance = {m["instance_id"]: m for m in described["members"]}
    assert by_instance[f"{group}-a"]["member_id"] == bounced.member_ids["a2"]
    assert by_instance[f"{group}-a"]["partitions"] == sorted(s.owned["a"])


@pytest.mark.parametrize("client", CLIENTS)
def test_a_duplicate_static_member_takes_over_and_the_old_one_is_fenced(
    cluster: LocalCluster, spawn: Spawner, client: str
) -> None:
    if client == "aiokafka":
        pytest.skip(
            "aiokafka 0.14 sends Heartbeat v1 and OffsetCommit v3, without the group instance "
            "id: the coordinator can only answer UNKNOWN_MEMBER_ID (as Kafka does), and the old "
            "process rejoins with its instance id and takes the place back, over and over"
        )
    bootstrap = bootstrap_of(cluster)
    topic, static = static_group(spawn, client, "duplicate")
    a, b, c = (static(i, i) for i in "abc")
    s = wait_settled(spawn, [a, b, c])

    # A second process with b's instance id takes b's place: same generation, b's partitions,
    # no rebalance. b's member id is fenced (FENCED_INSTANCE_ID) at its next heartbeat or
    # commit: librdkafka raises it as a fatal error at once; kafka-python 3 logs it from its
    # heartbeat thread and raises it from the next commit.
    marks = {m.name: m.mark() for m in (a, b, c)}
    dup = static("b-dup", "b")
    replaced = wait_settled(spawn, [a, dup, c])
    assert replaced.generation == s.generation
    assert replaced.owned["b-dup"] == s.owned["b"]
    acked = produce(client, bootstrap, topic, 60, "duplicate")
    wait_until(spawn, lambda: not b.alive, "the old b to stop", [a, dup, c])
    errors = [e["error"] for e in b.events("error", "commit_failed", since=marks["b"])]
    assert any(FENCED[client] in e for e in errors), str(b)
    assert not b.events("committed", since=marks["b"]), "a fenced member committed"
    # The group, without b, reads everything once from b's last commits.
    wait_consumed(spawn, [a, dup, c], acked)
    check_exactly_once(acked, consumed([a, dup, c]))
    wait_until(
        spawn, lambda: group_committed([a, dup, c]) == end_offsets(acked), "commits", [a, dup, c]
    )
    for m in (a, c):
        assert not rebalance_events(m, marks[m.name]), (m.name, rebalance_events(m, 0))


# -- 7. the coordinator killed and restarted ------------------------------------------------


def coordinator_of(cluster: LocalCluster, client: str, group: str, topic: str) -> int:
    """The group's coordinator as the client's FindCoordinator says, checked against the leader
    of the group's ``__consumer_offsets`` partition in the metadata."""
    described = run_client(
        client,
        {
            "op": "describe_group",
            "bootstrap": bootstrap_of(cluster),
            "group": group,
            "topic": topic,
        },
    )
    leader = offsets_leader(cluster, group, cluster.alive_ids())
    assert leader is not None and described["coordinator"] == leader, (described, leader)
    return leader


def offsets_leader(cluster: LocalCluster, group: str, among: list[int]) -> int | None:
    """The leader of the group's ``__consumer_offsets`` partition, as the controller among
    ``among`` has it (None while there is no agreed controller)."""
    controller = cluster.controller_id(among)
    if controller is None:
        return None
    partitions = cluster.describe(controller, topics=True)["topics"][OFFSETS_TOPIC_NAME]
    index = partition_for(group, len(partitions["partitions"]))
    (state,) = [p for p in partitions["partitions"] if p["partition"] == index]
    return int(state["leader"])


def broker_epoch(cluster: LocalCluster, node_id: int) -> int:
    view = cluster.describe(next(i for i in cluster.alive_ids() if i != node_id))
    return int(view["brokers"][str(node_id)]["epoch"])


def wait_restarted(cluster: LocalCluster, node_id: int, old_epoch: int, topics: list[str]) -> None:
    """Until the restarted node has registered again (a new broker epoch), is unfenced, and
    every partition of ``topics`` has a leader."""

    def back() -> bool:
        controller = cluster.controller_id()
        if controller is None:
            return False
        view = cluster.describe(controller, topics=True)
        broker = view["brokers"][str(node_id)]
        return (
            broker["epoch"] != old_epoch
            and not broker["fenced"]
            and all(p["leader"] >= 0 for t in topics for p in view["topics"][t]["partitions"])
        )

    wait_for(back, f"node {node_id} registered again and every partition led", DEADLINE_S)


def group_on(cluster: LocalCluster, prefix: str, node_id: int) -> str:
    """A group id whose ``__consumer_offsets`` partition node ``node_id`` leads."""
    alive = cluster.alive_ids()
    for i in range(1000):
        if offsets_leader(cluster, f"{prefix}-{i}", alive) == node_id:
            return f"{prefix}-{i}"
    raise AssertionError(f"no group id with prefix {prefix} coordinated by node {node_id}")


def check_commits_never_regress(members: list[Member]) -> None:
    """Without a rebalance each partition has one owner: its acknowledged commits only grow."""
    last: dict[int, tuple[str, int]] = {}
    for m in members:
        for event in m.events("committed"):
            for p, o in event["offsets"].items():
                owner, before = last.get(int(p), (m.name, -1))
                assert owner == m.name, f"partition {p} committed by {owner} and {m.name}"
                assert o >= before, f"{m.name} committed {o} for partition {p} after {before}"
                last[int(p)] = (m.name, o)


@pytest.mark.parametrize("client", CLIENTS)
def test_committed_offsets_survive_the_loss_and_restart_of_the_coordinator(
    cluster: LocalCluster, spawn: Spawner, client: str
) -> None:
    """SIGKILL the node coordinating the group while its members run: the group's offsets
    partition fails over to a follower (a hot standby), which answers with every acknowledged
    commit; the members carry on there without a rebalance (DESIGN section 7: a stable group,
    and a static one, need none); the node comes back, takes its leadership back (preferred
    leader) with the commits made meanwhile, again without a rebalance. No acknowledged message
    is lost or read twice."""
    bootstrap = bootstrap_of(cluster)
    topic = group = f"coordinator-{client}"
    create_topic(client, bootstrap, topic)
    members = [
        spawn(client, group, topic, f"m{i}", session_timeout_ms=FAILOVER_SESSION_TIMEOUT_MS)
        for i in range(3)
    ]
    wait_settled(spawn, members)
    coordinator = coordinator_of(cluster, client, group, topic)
    # Clients with static membership (KIP-345) also run a static group on the same node.
    static_members: list[Member] = []
    static_topic = static_group_id = ""
    if client in FENCED:
        static_group_id = group_on(cluster, f"static-coordinator-{client}", coordinator)
        static_topic = static_group_id
        create_topic(client, bootstrap, static_topic)
        static_members = [
            spawn(
                client,
                static_group_id,
                static_topic,
                f"s{i}",
                instance_id=f"{static_group_id}-{i}",
                session_timeout_ms=STATIC_SESSION_TIMEOUT_MS,
            )
            for i in range(2)
        ]
        wait_settled(spawn, static_members)
    everyone = members + static_members
    acked = produce(client, bootstrap, topic, 200, "before")
    static_acked = produce(client, bootstrap, static_topic, 60, "s-before") if static_topic else []
    wait_consumed(spawn, members, acked)
    wait_consumed(spawn, static_members, static_acked)
    wait_until(spawn, lambda: group_committed(members) == end_offsets(acked), "commits", members)
    wait_until(
        spawn,
        lambda: group_committed(static_members) == end_offsets(static_acked),
        "the static group's commits",
        static_members,
    )
    acknowledged = group_committed(members)
    marks = {m.name: m.mark() for m in everyone}

    epoch = broker_epoch(cluster, coordinator)
    cluster.kill(coordinator)
    survivors = [n for n in cluster.alive_ids() if n != coordinator]
    wait_for(
        lambda: offsets_leader(cluster, group, survivors) in survivors,
        "the group's offsets partition led by a follower",
        DEADLINE_S,
    )
    assert committed_offsets(client, bootstrap, group, topic) == acknowledged
    if static_topic:
        assert committed_offsets(
            client, bootstrap, static_group_id, static_topic
        ) == group_committed(static_members)

    during = produce(client, bootstrap, topic, 100, "during")
    static_during = produce(client, bootstrap, static_topic, 30, "s-during") if static_topic else []
    wait_consumed(spawn, members, during)
    wait_consumed(spawn, static_members, static_during)
    wait_until(
        spawn,
        lambda: group_committed(members) == end_offsets(acked + during),
        "commits",
        members,
    )
    acknowledged = group_committed(members)

    cluster.start(coordinator)
    wait_restarted(cluster, coordinator, epoch, [topic, OFFSETS_TOPIC_NAME])
    wait_for(
        lambda: offsets_leader(cluster, group, cluster.alive_ids()) == coordinator,
        f"node {coordinator} coordinating the group again",
        DEADLINE_S,
    )
    # It reloaded the group's shard from its log, caught up with what the follower took.
    assert committed_offsets(client, bootstrap, group, topic) == acknowledged

    after = produce(client, bootstrap, topic, 100, "after")
    static_after = produce(client, bootstrap, static_topic, 30, "s-after") if static_topic else []
    wait_consumed(spawn, members, after)
    wait_consumed(spawn, static_members, static_after)
    check_exactly_once(acked + during + after, consumed(members))
    check_exactly_once(static_acked + static_during + static_after, consumed(static_members))
    wait_until(
        spawn,
        lambda: group_committed(members) == end_offsets(acked + during + after),
        "the last commits",
        members,
    )
    wait_until(
        spawn,
        lambda: (
            group_committed(static_members)
            == end_offsets(static_acked + static_during + static_after)
        ),
        "the static group's last commits",
        static_members,
    )
    assert all(m.alive for m in everyone), spawn.report()
    for m in everyone:
        assert not rebalance_events(m, marks[m.name]), (m.name, rebalance_events(m, 0))
    check_commits_never_regress(members)
    check_commits_never_regress(static_members)


def test_a_rolling_restart_loses_no_commit_and_causes_no_rebalance(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    """Every node restarted in turn (SIGTERM, start, back in every ISR) while a group consumes
    and commits: nothing acknowledged is lost or read twice, no commit regresses, every commit
    acknowledged before a node stops is served while it is down, and the group never
    rebalances, though its coordinator moves (its node is stopped in turn like the others)."""
    client = "confluent-kafka"
    bootstrap = bootstrap_of(cluster)
    topic = group = "rolling-restart"
    create_topic(client, bootstrap, topic)
    members = [
        spawn(client, group, topic, f"m{i}", session_timeout_ms=FAILOVER_SESSION_TIMEOUT_MS)
        for i in range(3)
    ]
    wait_settled(spawn, members)
    acked = produce(client, bootstrap, topic, 60, "start")
    wait_consumed(spawn, members, acked)
    marks = {m.name: m.mark() for m in members}
    for node_id in sorted(cluster.alive_ids()):
        epoch = broker_epoch(cluster, node_id)
        before = group_committed(members)  # acknowledged to the members
        launcher.stop_node(cluster.node(node_id))  # SIGTERM: a clean shutdown
        acked += produce(client, bootstrap, topic, 30, f"without-{node_id}")
        served = committed_offsets(client, bootstrap, group, topic)
        assert before and all(served.get(p, -1) >= o for p, o in before.items()), (
            f"node {node_id} down: {served} lost commits acknowledged before: {before}"
        )
        cluster.start(node_id)
        wait_restarted(cluster, node_id, epoch, [topic, OFFSETS_TOPIC_NAME])
        wait_for(
            lambda: all_in_sync(cluster, [topic, OFFSETS_TOPIC_NAME]),
            f"node {node_id} back in every ISR",
            DEADLINE_S,
        )
        acked += produce(client, bootstrap, topic, 30, f"with-{node_id}")
        wait_consumed(spawn, members, acked)
    wait_until(
        spawn, lambda: group_committed(members) == end_offsets(acked), "the last commits", members
    )
    check_exactly_once(acked, consumed(members))
    assert committed_offsets(client, bootstrap, group, topic) == end_offsets(acked)
    for m in members:
        assert not rebalance_events(m, marks[m.name]), (m.name, rebalance_events(m, 0))
    check_commits_never_regress(members)


def all_in_sync(cluster: LocalCluster, topics: list[str]) -> bool:
    controller = cluster.controller_id()
    if controller is None:
        return False
    view = cluster.describe(controller, topics=True)["topics"]
    return all(
        sorted(p["isr"]) == sorted(p["replicas"]) and p["leader"] >= 0
        for t in topics
        for p in view[t]["partitions"]
    )


# -- Kafka's defaults ------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_the_default_initial_rebalance_delay_gathers_the_first_members(
    default_cluster: LocalCluster, spawn_defaults: Spawner, client: str
) -> None:
    """group.initial.rebalance.delay.ms (3000 ms): members that arrive within the delay of a
    new group's first join are all in its first generation; nobody rebalances."""
    spawn = spawn_defaults
    bootstrap = bootstrap_of(default_cluster)
    topic = group = f"delay-{client}"
    create_topic(client, bootstrap, topic)
    members = [spawn(client, group, topic, f"m{i}") for i in range(3)]
    s = wait_settled(spawn, members)
    assert s.generation == 1
    for m in members:
        assert [e["generation"] for e in m.events("assignment")] == [1], str(m)
        assert not revoked(m), str(m)
    first_started = min(e["_at"] for m in members for e in m.events("started"))
    first_assigned = min(e["_at"] for m in members for e in m.events("assignment"))
    # Each time is when the test's reader thread got the line: half a second's room for a
    # "started" read late.
    assert first_assigned - first_started >= DEFAULT_INITIAL_REBALANCE_DELAY_MS / 1000 - 0.5
