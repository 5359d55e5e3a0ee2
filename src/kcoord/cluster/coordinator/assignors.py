"""Server-side partition assignors of the KIP-848 consumer group protocol. Pure.

The coordinator computes a consumer group's target assignment itself (KIP-848): when the group
epoch moves past the target assignment epoch, the group state machine calls
``ASSIGNORS[name].assign(members, topics)`` and writes the result as the new target assignment.
Every replica of the shard recomputes the same target from the same records, so an assignor is a
pure, deterministic function: no I/O, no clock, no randomness, and nothing depends on dict
insertion or set iteration order. Members are ordered by member id, topics by topic id, and the
result is built in those orders.

Inputs and outputs
------------------
``members`` maps a member id to its ``MemberSubscription``: the topic ids it subscribes to and
its partitions in the *current target* assignment (the stickiness input). ``topics`` maps a topic
id to its partition count. A subscribed topic that is not in ``topics`` (deleted, or not created
yet) or has no partitions is ignored; Kafka's assignors throw ``PartitionAssignorException``
instead, because Kafka resolves subscriptions against the metadata image before calling them.
The result has every member, with ``{}`` when it gets nothing, and never an empty partition set.
Current partitions that are no longer valid (topic unsubscribed or gone, partition number out of
range, partition already claimed by a member earlier in member-id order) are dropped. Rack ids
are accepted and ignored (no rack awareness).

uniform (Kafka's ``UniformAssignor``, the default)
-------------------------------------------------
Balance first, then stickiness. Two builders, chosen as Kafka chooses them: the homogeneous one
when every member subscribes to the same (existing, non-empty) topics, else the heterogeneous one.

Homogeneous (Kafka's ``UniformHomogeneousAssignmentBuilder``). With P partitions over N members,
``q, r = divmod(P, N)``: every member gets a quota of q, and r members get q + 1. As Kafka since
KAFKA-18688 ("fix uniform homogeneous assignor stability"), the r extra slots go first to members
that already hold more than q valid partitions (in member-id order), then to the others in
member-id order, so that an already balanced assignment does not move. Each member keeps its
current partitions up to its quota (lowest topic id and partition first); the partitions left
over, sorted by (topic id, partition), fill the members below quota in member-id order, each
taking a contiguous run. This keeps the largest number of partitions any balanced assignment can
keep: ``sum(min(c_i, q)) + min(r, #{i: c_i > q})`` for current counts ``c_i``. In particular, when
a member joins a balanced group only partitions the new member receives move, and when a member
leaves only its own partitions move.

Heterogeneous (Kafka's ``UniformHeterogeneousAssignmentBuilder`` as reworked in KAFKA-17710):

1. Every member keeps all its valid current partitions.
2. The unassigned partitions are handed out topic by topic, each to the subscriber of its topic
   with the fewest partitions in total (ties: member-id order). Topics go in Kafka's order: most
   partitions per subscriber first, then fewer subscribers first, then topic id.
3. Balancing, in the same topic order, over the topics with two or more subscribers: while the
   most loaded subscriber that owns a partition of the topic has at least two partitions more
   than the least loaded subscriber, one partition of the topic moves from the former to the
   latter (ties: most loaded is the last in member-id order, least loaded the first). The
   partition given away is one the member did not own in ``current`` if it has one, else its
   highest-numbered. Passes over the topics repeat until one moves nothing.

After step 3 the result satisfies Kafka's definition of balance for heterogeneous subscriptions:
for each topic, no subscriber owning a partition of it has two partitions more than another
subscriber of it. That can still be short of what the subscriptions allow (Kafka's javadoc shows
9/10/11 where 10/10/10 exists: member 3 gives member 2 a partition of the second topic, and
member 2 gives member 1 one of the first). Kafka stops there, and also caps step 3 at 16
passes; we go on:

4. While some member can reach a member with at least two partitions fewer through a chain
   "owns a partition of a topic the next member subscribes to", each member on the chain gives
   one such partition to the next (the source loses one, the target gains one, the others stay
   level). Sources go from the most loaded; the target is the least loaded reachable member,
   over the fewest hops. Given-away partitions are chosen as in step 3.

A chain of one hop is a step-3 move. When no chain is left, the assignment minimises the largest
member load, and in fact the sum of the squared loads (and every other Lp norm of the loads): it
is an optimal semi-matching (Harvey, Ladner, Lovasz and Tamir, "Semi-matchings for bipartite
graphs and load balancing", 2003: optimal if and only if there is no such "cost-reducing path").
So the balance is the best the subscriptions allow, and an already optimal current assignment
does not move. Steps 3 and 4 always end: every move or chain takes one partition from a member
with ``a`` partitions to one with ``b <= a - 2``, which lowers the sum of the squared loads by
``2 * (a - b - 1) >= 2``, and that sum cannot go below zero.

range (Kafka's ``RangeAssignor`` for KIP-848, as rewritten in KAFKA-16944)
-------------------------------------------------------------------------
Per topic, the subscribers in order (see below) get contiguous ranges: with P partitions over N
subscribers, the first ``P % N`` get ``P // N + 1`` partitions and the others ``P // N``. When
members subscribe to the same topics and the topics have equal partition counts, each member gets
the same partition numbers of every topic (co-partitioning, for joins). Like Kafka's since
KAFKA-16944 (3.9), it is not sticky: it does not read ``current``, and a member joining or
leaving shifts the ranges behind it. (The server-side range assignor of Kafka 3.5-3.8 kept a
member's lowest current partitions up to its quota; KAFKA-16944 dropped that.) As in Kafka's,
static members come first, by instance id, then the others by member id: a static member
restarted under a new member id keeps its ranges, and nobody else's move.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from typing import Final, Protocol, TypeAlias

__all__ = [
    "ASSIGNORS",
    "ASSIGNOR_CLASS_NAMES",
    "DEFAULT_ASSIGNOR",
    "DEFAULT_ASSIGNORS",
    "Assignment",
    "MemberSubscription",
    "PartitionAssignor",
    "RangeAssignor",
    "UniformAssignor",
]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What the assignor knows of one member (Kafka's ``MemberSubscriptionAndAssignmentImpl``)."""

    subscribed_topic_ids: frozenset[str]  # topic ids (Kafka Uuid strings)
    current: Mapping[str, frozenset[int]]  # topic id -> partitions in its current target assignment
    rack_id: str | None = None  # accepted, ignored: no rack-aware assignment
    instance_id: str | None = None  # a static member's group.instance.id


# member id -> topic id -> partitions
Assignment: TypeAlias = dict[str, dict[str, frozenset[int]]]

NO_OWNER: Final = -1


class PartitionAssignor(Protocol):
    """Kafka's ``ConsumerGroupPartitionAssignor``: a named, pure target-assignment function."""

    name: str

    def assign(
        self, members: Mapping[str, MemberSubscription], topics: Mapping[str, int]
    ) -> Assignment:
        """The target assignment of every member in ``members``.

        ``topics`` maps each existing subscribed topic id to its partition count.
        """
        ...


class UniformAssignor:
    """Sticky and balanced (Kafka's ``UniformAssignor``); see the module docstring."""

    name: str = "uniform"

    def assign(
        self, members: Mapping[str, MemberSubscription], topics: Mapping[str, int]
    ) -> Assignment:
        member_ids = sorted(members)
        subscriptions = [
            _existing_topics(members[m].subscribed_topic_ids, topics) for m in member_ids
        ]
        if not member_ids:
            return {}
        if all(s == subscriptions[0] for s in subscriptions):
            return _UniformHomogeneous(member_ids, subscriptions[0], members, topics).build()
        return _UniformHeterogeneous(member_ids, subscriptions, members, topics).build()


class RangeAssignor:
    """Contiguous ranges per topic (Kafka's ``RangeAssignor``); see the module docstring."""

    name: str = "range"

    def assign(
        self, members: Mapping[str, MemberSubscription], topics: Mapping[str, int]
    ) -> Assignment:
        member_ids = sorted(members, key=lambda m: _range_order(m, members[m]))
        subscribers: dict[str, list[str]] = {}
        for member_id in member_ids:  # that order within each topic's list
            for topic_id in _existing_topics(members[member_id].subscribed_topic_ids, topics):
                subscribers.setdefault(topic_id, []).append(member_id)

        assignment: Assignment = {member_id: {} for member_id in member_ids}
        for topic_id in sorted(subscribers):  # topic-id order within each member's dict
            topic_subscribers = subscribers[topic_id]
            quota, extra = divmod(topics[topic_id], len(topic_subscribers))
            start = 0
            for index, member_id in enumerate(topic_subscribers):
                end = start + quota + (1 if index < extra else 0)
                if end > start:
                    assignment[member_id][topic_id] = frozenset(range(start, end))
                start = end
            assert start == topics[topic_id]
        return assignment


def _range_order(member_id: str, subscription: MemberSubscription) -> tuple[int, str]:
    """Static members first, by instance id, then the others by member id."""
    if subscription.instance_id is not None:
        return (0, subscription.instance_id)
    return (1, member_id)


def _existing_topics(subscribed: frozenset[str], topics: Mapping[str, int]) -> frozenset[str]:
    """The subscribed topics that exist and have partitions (the others are ignored)."""
    return frozenset(t for t in subscribed if topics.get(t, 0) > 0)


def _valid_current(
    subscription: MemberSubscription, subscribed: frozenset[str], topics: Mapping[str, int]
) -> list[tuple[str, int]]:
    """A member's current partitions that it may keep, sorted by (topic id, partition)."""
    return [
        (topic_id, partition)
        for topic_id in sorted(subscription.current)
        if topic_id in subscribed
        for partition in sorted(subscription.current[topic_id])
        if 0 <= partition < topics[topic_id]
    ]


class _UniformHomogeneous:
    """Kafka's ``UniformHomogeneousAssignmentBuilder``: quotas, keep up to quota, fill."""

    def __init__(
        self,
        member_ids: list[str],
        subscribed: frozenset[str],
        members: Mapping[str, MemberSubscription],
        topics: Mapping[str, int],
    ) -> None:
        self.member_ids = member_ids
        self.topic_ids = sorted(subscribed)
        self.members = members
        self.topics = topics
        self.subscribed = subscribed

    def build(self) -> Assignment:
        member_count = len(self.member_ids)
        total_partitions = sum(self.topics[t] for t in self.topic_ids)
        quota_min, extra = divmod(total_partitions, member_count)

        # Candidates to keep: valid current partitions, each claimed by the first member (in
        # member-id order) that holds it, in case the input target was not disjoint.
        claimed: set[tuple[str, int]] = set()
        candidates: list[list[tuple[str, int]]] = []
        for member_id in self.member_ids:
            mine = [
                tp
                for tp in _valid_current(self.members[member_id], self.subscribed, self.topics)
                if tp not in claimed
            ]
            claimed.update(mine)
            candidates.append(mine)

        # The extra slots go first to members that can fill them with partitions they own
        # (KAFKA-18688): that is what keeps the most partitions in place.
        quotas = [quota_min] * member_count
        for can_fill in (True, False):
            for index in range(member_count):
                if extra == 0:
                    break
                if quotas[index] == quota_min and (len(candidates[index]) > quota_min) == can_fill:
                    quotas[index] += 1
                    extra -= 1
        assert extra == 0

        kept = [candidates[i][: quotas[i]] for i in range(member_count)]
        kept_set = {tp for mine in kept for tp in mine}
        unassigned = [
            (topic_id, partition)
            for topic_id in self.topic_ids
            for partition in range(self.topics[topic_id])
            if (topic_id, partition) not in kept_set
        ]

        next_unassigned = 0
        assignment: Assignment = {}
        for index, member_id in enumerate(self.member_ids):
            wanted = quotas[index] - len(kept[index])
            mine = kept[index] + unassigned[next_unassigned : next_unassigned + wanted]
            next_unassigned += wanted
            assert len(mine) == quotas[index]
            assignment[member_id] = _by_topic(mine)
        assert next_unassigned == len(unassigned)
        return assignment


class _UniformHeterogeneous:
    """Kafka's ``UniformHeterogeneousAssignmentBuilder``: keep, hand out, then balance.

    Members are indices into ``member_ids`` (sorted), so that ties break in member-id order.
    ``owners[t][p]`` is the member that owns partition ``p`` of topic ``t`` in the target being
    built (``NO_OWNER`` until handed out), ``previous[t][p]`` its owner in the valid input, and
    ``loads[i]`` the number of partitions member ``i`` owns.
    """

    def __init__(
        self,
        member_ids: list[str],
        subscriptions: list[frozenset[str]],
        members: Mapping[str, MemberSubscription],
        topics: Mapping[str, int],
    ) -> None:
        self.member_ids = member_ids
        self.loads = [0] * len(member_ids)
        self.subscribers: dict[str, list[int]] = {}
        for index, subscribed in enumerate(subscriptions):
            for topic_id in subscribed:
                self.subscribers.setdefault(topic_id, []).append(index)  # ascending indices
        self.topics = topics
        self.owners = {t: [NO_OWNER] * topics[t] for t in self.subscribers}

        # Step 1: every member keeps its valid current partitions.
        for index, member_id in enumerate(member_ids):
            for topic_id, partition in _valid_current(
                members[member_id], subscriptions[index], topics
            ):
                if self.owners[topic_id][partition] == NO_OWNER:
                    self.owners[topic_id][partition] = index
                    self.loads[index] += 1
        self.previous = {t: list(owners) for t, owners in self.owners.items()}
        # Step 4's view of owners: per member, topic id -> number of its partitions it owns.
        self.owned: list[dict[str, int]] = []

        # Kafka's topic order: partitions per subscriber descending, subscriber count ascending,
        # topic id ascending. Exact fractions, so that equal ratios tie.
        self.topic_order = sorted(
            self.subscribers,
            key=lambda t: (
                -Fraction(topics[t], len(self.subscribers[t])),
                len(self.subscribers[t]),
                t,
            ),
        )

    def build(self) -> Assignment:
        self._assign_unassigned()
        self._balance()
        self._remove_cost_reducing_paths()
        return self._result()

    def _assign_unassigned(self) -> None:
        """Step 2: each unassigned partition to its topic's least loaded subscriber."""
        for topic_id in self.topic_order:
            owners = self.owners[topic_id]
            least_loaded = [(self.loads[i], i) for i in self.subscribers[topic_id]]
            heapq.heapify(least_loaded)
            for partition, owner in enumerate(owners):
                if owner != NO_OWNER:
                    continue
                load, index = heapq.heappop(least_loaded)
                owners[partition] = index
                self.loads[index] = load + 1
                heapq.heappush(least_loaded, (load + 1, index))

    def _balance(self) -> None:
        """Step 3: passes over the topics until one moves nothing (see the module docstring)."""
        topic_ids = [t for t in self.topic_order if len(self.subscribers[t]) >= 2]
        moved = True
        while moved:
            moved = False
            for topic_id in topic_ids:
                moved = self._balance_topic(topic_id) or moved

    def _balance_topic(self, topic_id: str) -> bool:
        subscribers = self.subscribers[topic_id]
        loads = self.loads
        if max(loads[i] for i in subscribers) - min(loads[i] for i in subscribers) <= 1:
            return False

        # Per subscriber, its partitions of this topic, split into those it owned in the input
        # (sticky) and the others (fresh), each ascending. A member gives away its highest fresh
        # partition first, then its highest sticky one: moving a fresh one costs no stickiness.
        owners = self.owners[topic_id]
        previous = self.previous[topic_id]
        sticky: dict[int, list[int]] = {i: [] for i in subscribers}
        fresh: dict[int, list[int]] = {i: [] for i in subscribers}
        for partition, owner in enumerate(owners):
            (sticky if previous[partition] == owner else fresh)[owner].append(partition)

        moved = False
        while True:
            least = min(subscribers, key=lambda i: (loads[i], i))
            most = max(
                (i for i in subscribers if sticky[i] or fresh[i]),
                key=lambda i: (loads[i], i),
            )
            if loads[most] - loads[least] <= 1:
                return moved
            partition = fresh[most].pop() if fresh[most] else sticky[most].pop()
            insort(sticky[least] if previous[partition] == least else fresh[least], partition)
            owners[partition] = least
            loads[most] -= 1
            loads[least] += 1
            moved = True

    def _remove_cost_reducing_paths(self) -> None:
        """Step 4: shift partitions along cost-reducing paths until there are none."""
        self.owned = [{} for _ in self.member_ids]
        for topic_id, owners in self.owners.items():
            for owner in owners:
                self.owned[owner][topic_id] = self.owned[owner].get(topic_id, 0) + 1
        while (path := self._find_cost_reducing_path()) is not None:
            self._shift_along(path)

    def _find_cost_reducing_path(self) -> list[tuple[int, str]] | None:
        """A path ``[(source, ""), (x1, t1), ..., (target, tk)]`` where each member owns a
        partition of the next hop's topic, which the next member subscribes to, and the target
        has at least two partitions fewer than the source; None when there is none.

        Sources are tried from the most loaded (ties: last in member-id order, as in step 3). A
        breadth-first search finds the least loaded member reachable (ties: fewest hops, then
        member-id order). Reachability is transitive, so when a source has no such path, no
        member it reaches with a load not above its own has one either: those are not searched
        again.
        """
        loads = self.loads
        settled = [False] * len(loads)
        for source in sorted(range(len(loads)), key=lambda i: (-loads[i], -i)):
            if settled[source]:
                continue
            hops: dict[int, tuple[int, str, int]] = {source: (source, "", 0)}  # via, topic, hops
            queue = deque([source])
            best = (loads[source], 0, source)
            while queue:
                member = queue.popleft()
                distance = hops[member][2] + 1
                for topic_id in sorted(self.owned[member]):
                    for subscriber in self.subscribers[topic_id]:
                        if subscriber not in hops:
                            hops[subscriber] = (member, topic_id, distance)
                            queue.append(subscriber)
                            best = min(best, (loads[subscriber], distance, subscriber))
            target = best[2]
            if loads[source] - loads[target] >= 2:
                path: list[tuple[int, str]] = []
                member = target
                while member != source:
                    via, topic_id, _ = hops[member]
                    path.append((member, topic_id))
                    member = via
                path.append((source, ""))
                path.reverse()
                return path
            for member in hops:
                if loads[member] <= loads[source]:
                    settled[member] = True
        return None

    def _shift_along(self, path: list[tuple[int, str]]) -> None:
        """Each member on the path gives one partition of the next hop's topic to the next
        member: the source loses one, the target gains one, the others stay level."""
        for (giver, _), (taker, topic_id) in pairwise(path):
            owners = self.owners[topic_id]
            previous = self.previous[topic_id]
            # As in step 3: a partition the giver did not own before first, highest first.
            candidates = [p for p, owner in enumerate(owners) if owner == giver]
            partition = max(candidates, key=lambda p: (previous[p] != giver, p))
            owners[partition] = taker
            self.owned[giver][topic_id] -= 1
            if self.owned[giver][topic_id] == 0:
                del self.owned[giver][topic_id]
            self.owned[taker][topic_id] = self.owned[taker].get(topic_id, 0) + 1
        self.loads[path[0][0]] -= 1
        self.loads[path[-1][0]] += 1

    def _result(self) -> Assignment:
        per_member: list[dict[str, list[int]]] = [{} for _ in self.member_ids]
        for topic_id in sorted(self.owners):
            for partition, owner in enumerate(self.owners[topic_id]):
                assert owner != NO_OWNER
                per_member[owner].setdefault(topic_id, []).append(partition)
        return {
            member_id: {t: frozenset(ps) for t, ps in per_member[index].items()}
            for index, member_id in enumerate(self.member_ids)
        }


def _by_topic(partitions: list[tuple[str, int]]) -> dict[str, frozenset[int]]:
    """(topic id, partition) pairs as topic id -> partitions, in topic-id order."""
    grouped: dict[str, set[int]] = {}
    for topic_id, partition in sorted(partitions):
        grouped.setdefault(topic_id, set()).add(partition)
    return {t: frozenset(ps) for t, ps in grouped.items()}


DEFAULT_ASSIGNOR: Final = "uniform"

# The built-in assignors by name. group.consumer.assignors (GroupConfig.consumer_assignors)
# chooses among them, by name or by Kafka's class name; its first is the default.
ASSIGNORS: dict[str, PartitionAssignor] = {
    assignor.name: assignor for assignor in (UniformAssignor(), RangeAssignor())
}
assert DEFAULT_ASSIGNOR in ASSIGNORS
DEFAULT_ASSIGNORS: Final = (DEFAULT_ASSIGNOR, "range")
ASSIGNOR_CLASS_NAMES: Final = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}
