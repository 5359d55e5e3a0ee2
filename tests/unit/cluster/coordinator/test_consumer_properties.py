"""Property test: random KIP-848 consumers against the pure shard, seeded.

The clients behave as the Java ``AsyncKafkaConsumer`` and librdkafka do with what they were
last told: they keep the epoch of the last answer and send only the fields that changed;
they apply an assignment later, revoking first (sometimes reporting the smaller set before
they take the rest); an answer is sometimes lost (the next request is then a full one at the
old epoch) or a request is retried after a timeout (only the second answer is seen);
FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID make a client drop its partitions and join again
under its member id; UNRELEASED_INSTANCE_ID and FENCED_INSTANCE_ID are fatal (the process
starts again with a new member id). Dynamic members leave with epoch -1, static ones with -2
(and come back under their instance id); a second process of a static member starts while
the first one stalls; clients crash, unsubscribe, change subscriptions (by name or by
regular expression) and assignors; topics grow, go and come back; the partition fails over
(its log replayed, compacted or not); time passes, so session and rebalance timeouts fire.

Checked after every step: no partition is owned by two clients the coordinator still counts
as members, and the coordinator's own view is disjoint (Kafka's
``ConsumerGroup.addPartitionEpochs`` throws otherwise); a member's answered epochs never go
down; every error is one Kafka's ``consumerGroupHeartbeat`` gives for that kind of request; a
failover loads the group as it was. At the end, once every client left alive behaves and
time passes, the group is Stable (Empty with no client) with no member left over, and every
subscribed partition is owned by exactly one client.

One race is the protocol's own, not checked: a client whose answer is lost reports owning
less, the coordinator frees what it did not report at once (Kafka's
``CurrentAssignmentBuilder`` revokes only what a member says it owns), and a client that then
finished taking an older assignment would own it twice. The clients here drop an assignment
they have not taken when an answer is lost.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from kcoord.cluster.coordinator.consumer import ConsumerGroup
from kcoord.cluster.coordinator.records import uuid_str
from kcoord.cluster.coordinator.shard import GroupConfig
from kcoord.cluster.coordinator.types import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    DeleteGroupsResponse,
)
from kcoord.errors import Errors
from tests.unit.cluster.coordinator.harness import ShardContext, short_consumer_timing
from tests.unit.cluster.coordinator.test_consumer import send_heartbeat

SESSION_MS = 10_000
REBALANCE_MS = 5_000
SEEDS = range(32)
STEPS = 300

Partition = tuple[str, int]  # (topic id, partition)

E = Errors
# What consumerGroupHeartbeat can answer each kind of request here (no ACLs, no bad fields),
# by (kind, static member).
ALLOWED: dict[tuple[str, bool], frozenset[Errors]] = {
    ("join", False): frozenset({E.NONE}),
    ("join", True): frozenset({E.NONE, E.UNRELEASED_INSTANCE_ID}),
    ("beat", False): frozenset(
        {E.NONE, E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID, E.GROUP_ID_NOT_FOUND}
    ),
    ("beat", True): frozenset(
        {
            E.NONE,
            E.FENCED_MEMBER_EPOCH,
            E.UNKNOWN_MEMBER_ID,
            E.FENCED_INSTANCE_ID,
            E.GROUP_ID_NOT_FOUND,
        }
    ),
    ("leave", False): frozenset({E.NONE, E.UNKNOWN_MEMBER_ID, E.GROUP_ID_NOT_FOUND}),
    ("leave", True): frozenset(
        {E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.GROUP_ID_NOT_FOUND}
    ),
}


@dataclass
class Client:
    """One consumer process (``incarnation``: how many times it started again)."""

    name: str
    instance_id: str | None
    regex: str | None = None
    subscription: tuple[str, ...] = ("t1", "t2")
    assignor: str | None = None
    incarnation: int = 0
    down_until: int | None = None  # the process is not running
    stalled_until: int = 0  # running, but sends nothing (a long GC, a cut network)
    epoch: int = 0
    joined: bool = False  # False: the next heartbeat joins (epoch 0)
    owned: set[Partition] = field(default_factory=set)
    target: set[Partition] | None = None  # the last assignment answered, not yet taken
    full: bool = True  # the next heartbeat sends every field
    sent: dict[str, object] = field(default_factory=dict)  # fields as last sent and answered

    @property
    def member_id(self) -> str:
        return f"{self.name}-{self.incarnation}"

    def forget(self) -> None:
        """Its partitions lost; it joins again under the same member id."""
        self.epoch, self.joined, self.full = 0, False, True
        self.owned, self.target, self.sent = set(), None, {}

    def start_again(self) -> None:
        """A new process: a new member id (the client makes it, KIP-1082)."""
        self.incarnation += 1
        self.forget()


def as_wire(owned: set[Partition]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    by_topic: dict[str, list[int]] = {}
    for topic_id, partition in owned:
        by_topic.setdefault(topic_id, []).append(partition)
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items()))


def from_wire(assignment: tuple[tuple[str, tuple[int, ...]], ...]) -> set[Partition]:
    return {(topic_id, p) for topic_id, partitions in assignment for p in partitions}


class Model:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ctx = ShardContext(GroupConfig(consumer_timing=short_consumer_timing(SESSION_MS)))
        self.topics: dict[str, tuple[str, int]] = {
            "t1": (uuid_str(bytes([1]) * 16), 4),
            "t2": (uuid_str(bytes([2]) * 16), 3),
        }
        self.topic_ids = 10
        names = ["a", "b", "c", "s", "u", "d", "v"][: self.rng.randint(3, 7)]
        self.clients = [
            Client(
                name,
                f"i-{name}" if name in "suv" else None,
                regex="t[12]" if name == "c" else None,
                assignor=self.rng.choice([None, None, "uniform", "range"]),
            )
            for name in names
        ]
        self.compacted_failovers = self.rng.random() < 0.5
        self.max_epochs: dict[str, int] = {}
        self.trace: list[str] = []

    # -- the coordinator ---------------------------------------------------------------------

    def group(self) -> ConsumerGroup | None:
        return self.ctx.shard.consumer_groups.get("g")

    def send(self, client: Client, kind: str, **fields: Any) -> ConsumerGroupHeartbeatResponse:
        request = ConsumerGroupHeartbeatRequest(
            group_id="g", member_id=client.member_id, instance_id=client.instance_id, **fields
        )
        answer = send_heartbeat(self.ctx, request, dict(self.topics))
        self.note(f"{client.member_id} {kind} {fields} -> {answer}")
        allowed = ALLOWED[kind, client.instance_id is not None]
        assert answer.error_code in allowed, self.failure(f"{answer.error_code.name} to a {kind}")
        if answer.error_code is E.NONE and answer.member_epoch >= 0:
            last = self.max_epochs.get(client.member_id, -1)
            assert answer.member_epoch >= last, self.failure(f"epoch down from {last}")
            self.max_epochs[client.member_id] = answer.member_epoch
        return answer

    def note(self, line: str) -> None:
        self.trace.append(f"t={self.ctx.now_ms} {line}")

    def failure(self, what: str) -> str:
        return "\n".join([what, *self.trace[-30:]])

    def check_owners(self) -> None:
        group = self.group()
        members = group.members if group is not None else {}
        owners: dict[Partition, str] = {}
        for client in self.clients:
            if client.down_until is None and client.member_id in members:
                for partition in client.owned:
                    other = owners.setdefault(partition, client.member_id)
                    assert other == client.member_id, self.failure(f"{partition}: {other} too")
        held: dict[Partition, str] = {}
        for member in members.values():
            for partitions in (member.assigned, member.pending_revocation):
                for topic_id, indexes in partitions.items():
                    for p in indexes:
                        other = held.setdefault((topic_id, p), member.member_id)
                        assert other == member.member_id, self.failure(
                            f"coordinator: {(topic_id, p)} held by {other} and {member.member_id}"
                        )

    # -- what clients do ---------------------------------------------------------------------

    def heartbeat(self, client: Client, *, lost: bool = False, retried: bool = False) -> None:
        if not client.joined:
            kind = "join"
            fields: dict[str, Any] = {
                "member_epoch": 0,
                "rebalance_timeout_ms": REBALANCE_MS,
                "subscribed_topic_names": None if client.regex else client.subscription,
                "subscribed_topic_regex": client.regex,
                "server_assignor": client.assignor,
                "topic_partitions": (),
            }
        else:
            kind = "beat"
            now = {
                "subscribed_topic_names": None if client.regex else client.subscription,
                "subscribed_topic_regex": client.regex,
                "server_assignor": client.assignor,
                "topic_partitions": as_wire(client.owned),
            }
            fields = {
                "member_epoch": client.epoch,
                "rebalance_timeout_ms": REBALANCE_MS if client.full else -1,
                # The Java client sends what changed since the last answered request.
                **{
                    k: v if client.full or client.sent.get(k) != v else None for k, v in now.items()
                },
            }
        answer = self.send(client, kind, **fields)
        if retried:
            # Its answer timed out: Java and librdkafka send it again, in full, at once.
            client.full, client.sent = True, {}
            self.heartbeat(client)
            return
        if lost:
            client.full, client.sent, client.target = True, {}, None
            return
        if answer.error_code is E.NONE:
            client.joined, client.full, client.epoch = True, False, answer.member_epoch
            client.sent.update({k: v for k, v in fields.items() if v is not None})
            assert answer.member_epoch >= 1, self.failure("a join answered no epoch")
            if answer.assignment is not None:
                target = from_wire(answer.assignment)
                client.target = None if target == client.owned else target
        elif answer.error_code in (E.UNRELEASED_INSTANCE_ID, E.FENCED_INSTANCE_ID):
            client.start_again()
            client.down_until = self.ctx.now_ms + self.rng.choice([0, 2000, 12_000])
        else:  # fenced, unknown member, no group: its partitions lost, it joins again
            client.forget()

    def take_assignment(self, client: Client, *, revoke_only: bool) -> None:
        if client.target is None:
            return
        if revoke_only and client.owned - client.target:
            client.owned &= client.target  # onPartitionsRevoked ran; the rest comes later
            return
        client.owned, client.target = set(client.target), None

    def leave(self, client: Client, epoch: int) -> None:
        client.owned = set()  # a closing consumer revokes everything first
        self.send(client, "leave", member_epoch=epoch, topic_partitions=())
        client.start_again()
        client.down_until = self.ctx.now_ms + self.rng.choice([0, 0, 1000, 3000, 12_000])

    def unsubscribe(self, client: Client) -> None:
        """``unsubscribe()``: everything revoked, a leave (-2 for a static member, or -1 when
        its poll timer expired), the member id kept for a later ``subscribe()``."""
        epoch = -2 if client.instance_id is not None and self.rng.random() < 0.6 else -1
        client.owned = set()
        self.send(client, "leave", member_epoch=epoch, topic_partitions=())
        client.forget()
        client.stalled_until = self.ctx.now_ms + self.rng.choice([0, 500, 3000])

    def start_twin(self, client: Client) -> None:
        """A second process of a static member starts while the first one stalls."""
        name = client.name + "z"
        if client.instance_id is None or any(c.name == name for c in self.clients):
            return
        twin = Client(name, client.instance_id, regex=client.regex)
        twin.subscription = client.subscription
        self.clients.append(twin)
        client.stalled_until = self.ctx.now_ms + self.rng.choice([3000, 11_000, 15_000])

    def subscribe(self, client: Client) -> None:
        if client.regex:
            client.regex = self.rng.choice(["t[12]", "t.*", "t3", "t[13]", "x.*"])
        else:
            client.subscription = self.rng.choice(
                [("t1",), ("t2",), ("t1", "t2"), ("t1", "t2", "t3")]
            )
        if self.rng.random() < 0.3:
            # Owning less than it reported is safe: it may drop what it no longer wants.
            wanted = {self.topics[n][0] for n in self.subscribed(client)}
            client.owned = {tp for tp in client.owned if tp[0] in wanted}

    def subscribed(self, client: Client) -> list[str]:
        if client.regex is not None:
            return [n for n in self.topics if re.fullmatch(client.regex, n)]
        return [n for n in client.subscription if n in self.topics]

    # -- what happens around them ------------------------------------------------------------

    def advance(self, ms: int) -> None:
        for key, _deadline, _step in self.ctx.sleep(ms):
            self.note(f"timer {key}")
        for client in self.clients:
            if client.down_until is not None and client.down_until <= self.ctx.now_ms:
                client.down_until = None

    def change_topics(self) -> None:
        roll = self.rng.random()
        name = self.rng.choice(sorted(self.topics))
        topic_id, partitions = self.topics[name]
        if roll < 0.5 and partitions < 8:
            self.topics[name] = (topic_id, partitions + 1)
        elif roll < 0.7 and len(self.topics) > 1:
            del self.topics[name]
        else:
            for name in ("t1", "t2", "t3"):
                if name not in self.topics:
                    self.topic_ids += 1
                    new_id = uuid_str(bytes([self.topic_ids % 256]) * 16)
                    self.topics[name] = (new_id, self.rng.randint(1, 4))
                    break

    def fail_over(self) -> None:
        def view(group: ConsumerGroup | None) -> object:
            if group is None:
                return None
            return (
                group.group_epoch,
                group.assignment_epoch,
                dict(group.members),
                dict(group.targets),
                dict(group.subscribed_topics),
            )

        before = view(self.group())
        compacted = self.compacted_failovers and self.rng.random() < 0.5
        self.ctx = self.ctx.failover(compacted=compacted)
        assert view(self.group()) == before, self.failure("the failover loaded another group")

    def delete_group(self) -> None:
        group = self.group()
        if group is not None and not group.members:
            _token, step = self.ctx.delete_groups()
            assert isinstance(step.responses[0][1], DeleteGroupsResponse)
            self.max_epochs.clear()  # a new group of the id starts again at epoch 1

    def step(self) -> None:
        rng = self.rng
        now = self.ctx.now_ms
        alive = [c for c in self.clients if c.down_until is None and c.stalled_until <= now]
        roll = rng.random()
        if not alive or roll < 0.10:
            self.advance(rng.choice([50, 200, 500, 1000]))
            return
        client = rng.choice(alive)
        if roll < 0.55:
            luck = rng.random()
            self.heartbeat(client, lost=luck < 0.08, retried=0.08 <= luck < 0.13)
        elif roll < 0.72:
            self.take_assignment(client, revoke_only=rng.random() < 0.3)
        elif roll < 0.74 and client.joined:
            self.leave(client, -1)
        elif roll < 0.77 and client.joined and client.instance_id is not None:
            self.leave(client, -2)
        elif 0.77 <= roll < 0.785:
            client.start_again()  # it crashed: no leave
            client.down_until = now + rng.choice([0, 1000, 5000, 12_000])
        elif 0.785 <= roll < 0.795 and client.joined:
            self.unsubscribe(client)
        elif 0.795 <= roll < 0.80:
            self.start_twin(client)
        elif 0.80 <= roll < 0.82:
            self.subscribe(client)
        elif 0.82 <= roll < 0.845:
            self.change_topics()
        elif 0.845 <= roll < 0.86:
            self.fail_over()
        elif 0.86 <= roll < 0.865:
            self.delete_group()
        elif 0.865 <= roll < 0.875:
            client.assignor = rng.choice([None, "uniform", "range"])
        elif 0.875 <= roll < 0.89:
            client.stalled_until = now + rng.choice([3000, 6000, 11_000])
        else:
            self.advance(rng.choice([100, 300, 700]))

    def settle(self) -> None:
        """Every client left running behaves (some never start again) while time passes:
        members of the gone time out, the rest converge."""
        gone_for_good = self.rng.random() < 0.3
        for client in self.clients:
            client.stalled_until = 0
            if client.down_until is not None:
                client.down_until = 1 << 62 if gone_for_good else None
        for _ in range(61):
            for client in self.clients:
                if client.down_until is None:  # a fatal error may stop one for a while
                    self.heartbeat(client)
                    self.take_assignment(client, revoke_only=False)
                    self.check_owners()
                    self.advance(150)
            self.advance(250)
        running = [c for c in self.clients if c.down_until is None]
        group = self.group()
        if group is None:
            assert not running, self.failure("no group for the running clients")
            return
        left_over = set(group.members) - {c.member_id for c in running}
        assert not left_over, self.failure(f"members left over: {left_over}")
        wanted = {
            (self.topics[name][0], p)
            for client in running
            for name in self.subscribed(client)
            for p in range(self.topics[name][1])
        }
        owned = [tp for client in running for tp in client.owned]
        assert sorted(owned) == sorted(wanted), self.failure(f"owned {owned}, wanted {wanted}")
        assert group.state == ("Stable" if running else "Empty"), self.failure(group.state)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_consumers_keep_the_invariants(seed: int) -> None:
    print(f"seed {seed}")
    model = Model(seed)
    for _ in range(STEPS):
        model.step()
        model.check_owners()
    model.settle()
