"""Property test: random clients (two dynamic, two static) send JoinGroup, SyncGroup,
Heartbeat, LeaveGroup and OffsetCommit while time passes and the partition fails over.

The clients behave as Kafka clients do with what they were last told (their member id, the
generation, whether they lead and whom), but pick their next request at random. Checked:

* after every step (``ShardContext``): no token is answered twice; a generation never goes
  down within a shard; Stable and Empty groups are exactly their last GroupMetadata record;
* a Stable group's members all hold assignments of the current generation (the leader writes
  "<generation>:<member>" for each member it was told about, or nothing);
* replaying the log into a fresh shard gives the same groups, records and offsets, and every
  settled (Stable or Empty) group comes back identical;
* every request gets its answer once enough time passes without new requests.

Hypothesis runs derandomized (a fixed seed per test) so that the suite is deterministic; a
failure prints the shortest action list that reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from kcoord.cluster.coordinator.classic import ClassicGroupState
from kcoord.cluster.coordinator.types import (
    HeartbeatResponse,
    JoinGroupResponse,
    SyncGroupResponse,
    Token,
)
from kcoord.errors import Errors
from tests.unit.cluster.coordinator.harness import (
    ShardContext,
    Step,
    persisted_view_of_group,
)

S = ClassicGroupState
PROTOCOL_CHOICES = ((("range", b"r"),), (("range", b"r"), ("rr", b"x")), (("rr", b"x"),))


@dataclass
class Client:
    client_id: str
    instance_id: str | None
    member_id: str = ""
    generation: int = -1
    leads: bool = False
    skip_assignment: bool = False
    members: tuple[str, ...] = ()
    needs_join: bool = True
    synced_generation: int = -1
    waiting: int = 0  # requests parked at the coordinator


Action = tuple[str, int, int]

# What a drawn (roll, a, b) does, by roll: mostly "round" (every client makes its next
# well-behaved move, then a heartbeat interval passes) and "act" (one client does); then
# arbitrary requests and faults. Weights as ranges of a roll in 0-99.
_KINDS = (
    (55, "round"),
    (70, "act"),
    (74, "join"),
    (78, "sync"),
    (81, "heartbeat"),
    (84, "leave"),
    (88, "commit"),
    (96, "sleep"),
    (100, "failover"),
)
_SLEEPS_MS = (100, 500, 1_500, 3_000, 7_000, 16_000)


def to_action(roll: int, a: int, b: int) -> Action:
    kind = next(kind for limit, kind in _KINDS if roll < limit)
    if kind == "round":
        return kind, _SLEEPS_MS[1 + a % 3], b
    if kind == "sleep":
        return kind, _SLEEPS_MS[b], 0
    return kind, a, b if kind in ("act", "join") else b % 2


actions = st.lists(
    st.builds(to_action, st.integers(0, 99), st.integers(0, 3), st.integers(0, 5)),
    min_size=20,
    max_size=80,
)


class World:
    def __init__(self) -> None:
        self.ctx = ShardContext()
        self.clients = [
            Client("c0", None),
            Client("c1", None),
            Client("s2", "i2"),
            Client("s3", "i3"),
        ]
        self.owner: dict[Token, Client] = {}
        self.sync_generation: dict[Token, int] = {}

    def observe(self, step: Step) -> None:
        for token, response in step.responses:
            client = self.owner.pop(token, None)
            if client is None:
                continue
            client.waiting -= 1
            error = response.error_code if hasattr(response, "error_code") else Errors.NONE
            if isinstance(response, JoinGroupResponse):
                if error is Errors.NONE:
                    client.member_id = response.member_id
                    client.generation = response.generation_id
                    client.leads = response.leader == response.member_id
                    client.skip_assignment = response.skip_assignment
                    client.members = tuple(m.member_id for m in response.members)
                    client.needs_join = False
                elif error is Errors.MEMBER_ID_REQUIRED:
                    client.member_id = response.member_id
                elif error is Errors.UNKNOWN_MEMBER_ID:
                    client.member_id, client.generation = "", -1
                if error is not Errors.NONE:
                    client.needs_join = True
            elif isinstance(response, SyncGroupResponse):
                # An assignment answers the generation the member asked about, never another.
                generation = self.sync_generation.pop(token)
                # (A restarted static member keeps the bytes written for its old member id.)
                assert (
                    error is not Errors.NONE
                    or response.assignment == b""
                    or response.assignment.startswith(f"{generation}:".encode())
                ), f"SyncGroup of generation {generation} answered {response.assignment!r}"
                if error is Errors.NONE:
                    client.synced_generation = client.generation
                else:
                    client.needs_join = True
            elif isinstance(response, HeartbeatResponse) and error is not Errors.NONE:
                client.needs_join = True

    def run(self, action: Action) -> None:
        kind, a, b = action
        ctx = self.ctx
        if kind == "sleep":
            for _, _, step in ctx.sleep(a):
                self.observe(step)
            return
        if kind == "round":
            for index in range(len(self.clients)):
                self.run(("act", index, b))
            self.run(("sleep", a, 0))
            return
        if kind == "failover":
            # The old leader's parked requests die with it (the clients time out).
            self.owner.clear()
            self.sync_generation.clear()
            for client in self.clients:
                client.waiting = 0
            self.ctx = ctx.failover()
            return
        client = self.clients[a]
        if kind == "act":
            if client.waiting:
                return
            if client.needs_join:
                kind, b = "join", 1 + 2 * (b % 2)  # the usual protocols, either timeout
            elif client.synced_generation != client.generation:
                kind = "sync"
            else:
                kind = "heartbeat"
        if kind == "join":
            # b: 0-2 a protocol choice, 3 the usual one, 4-5 a restart (new process: no
            # member id) with the usual protocols, 4 as an old client (no SkipAssignment).
            if b >= 4:
                client.member_id = ""
            token, step = ctx.join(
                member_id=client.member_id,
                instance_id=client.instance_id,
                client_id=client.client_id,
                session_timeout_ms=(6_000, 10_000)[b % 2],
                rebalance_timeout_ms=(8_000, 15_000)[b % 2],
                protocols=PROTOCOL_CHOICES[b if b < 3 else 1],
                supports_skip_assignment=b != 4,
            )
        elif kind == "sync":
            assignments: list[tuple[str, bytes]] = []
            if client.leads and not client.skip_assignment:
                assignments = [(m, f"{client.generation}:{m}".encode()) for m in client.members]
            token, step = ctx.sync(
                member_id=client.member_id,
                generation_id=client.generation,
                instance_id=client.instance_id,
                assignments=assignments,
            )
            self.sync_generation[token] = client.generation
        elif kind == "heartbeat":
            token, step = ctx.heartbeat(
                member_id=client.member_id,
                generation_id=client.generation,
                instance_id=client.instance_id,
            )
        elif kind == "leave":
            token, step = ctx.leave([(client.member_id, client.instance_id)])
        else:
            token, step = ctx.commit(
                [("t", b, client.generation)],
                member_id=client.member_id,
                generation_id=client.generation,
                instance_id=client.instance_id,
            )
        self.owner[token] = client
        client.waiting += 1
        self.observe(step)

    def check_assignments(self) -> None:
        """A Stable group's members hold what a leader of this generation wrote for them."""
        group = self.ctx.shard.group("g")
        if group is None or group.state is not S.STABLE:
            return
        prefix = f"{group.generation_id}:".encode()
        for member in group.members.values():
            # A static member keeps the assignment written for its previous member id.
            assert member.assignment == b"" or member.assignment.startswith(prefix), (
                f"member {member.member_id} of generation {group.generation_id} "
                f"holds {member.assignment!r}"
            )


def check_replay_gives_the_same_state(ctx: ShardContext) -> None:
    fresh = ctx.failover()
    assert set(fresh.shard.groups) == set(ctx.shard.groups)
    assert fresh.shard.offsets == ctx.shard.offsets
    for group_id, group in ctx.shard.groups.items():
        loaded = fresh.shard.groups[group_id]
        assert loaded.committed == group.committed
        if group.state in (S.STABLE, S.EMPTY):
            assert loaded.state is group.state
            with_timestamp = group.state is S.EMPTY
            assert persisted_view_of_group(
                loaded, with_timestamp=with_timestamp
            ) == persisted_view_of_group(group, with_timestamp=with_timestamp)
        else:
            expected = S.STABLE if group.committed and group.committed.members else S.EMPTY
            assert loaded.state is expected


@settings(max_examples=400, derandomize=True, deadline=None)
@given(actions)
def test_random_clients_keep_the_invariants(script: list[Action]) -> None:
    world = World()
    stable_generations: set[int] = set()
    for action in script:
        world.run(action)
        world.check_assignments()
        group = world.ctx.shard.group("g")
        if group is not None and group.state is S.STABLE:
            stable_generations.add(group.generation_id)
    # Shown by --hypothesis-show-statistics: how far the random clients got.
    event(f"Stable generations reached: {min(len(stable_generations), 3)}+")
    event(f"records written: {min(len(world.ctx.log) // 5 * 5, 20)}+")
    check_replay_gives_the_same_state(world.ctx)

    # Quiet time, on a shard loaded from the log (its members must time out too) and on this
    # one: every parked request is answered (at the latest when the members' sessions, the
    # new-member join timeout and the rebalance timeouts have all run out).
    loaded = World()
    loaded.ctx = world.ctx.failover()
    for w in (loaded, world):
        for _ in range(4):
            w.run(("sleep", w.ctx.config.new_member_join_timeout_ms, 0))
        assert w.ctx.outstanding == set()
        group = w.ctx.shard.group("g")
        assert group is None or (group.state is S.EMPTY and not group.members)
    check_replay_gives_the_same_state(world.ctx)
