"""Checkers: what a chaos run's history proves about the cluster.

Theory of operation
-------------------

Each checker is a pure function ``check_x(history, **bounds) -> CheckResult``: it reads the
events (``chaos/history.py`` documents the schema), never the cluster, and does no I/O. A result
is ``valid`` when no anomaly was found; ``anomalies`` maps an anomaly's name to at most
``MAX_EXAMPLES`` examples (plain JSON: event indexes, offsets, members), ``stats`` holds counts,
including ``anomaly_counts`` (every occurrence, not only the examples kept). An event a checker
needs but cannot parse is itself an anomaly, ``malformed-event``: a broken workload must not
pass as a healthy cluster.

Real time is ``Event.at`` = ``(time, index)``. "A precedes B" means A's ``at`` is smaller, so
a relation the checkers rely on ("acknowledged before invoked") is one the clients observed.
Outcomes follow Jepsen: ``ok`` happened, ``fail`` did not, ``info`` (or no completion) may have
happened; a checker never condemns the cluster for an ``info`` operation's effect or absence.

``check_offsets`` (groups workload): OffsetCommit durability and sanity
    ``lost-commit``: the final OffsetFetch (``committed``) for (group, topic, partition) is
    below the highest offset an ``ok`` commit acknowledged, or the partition is missing from it;
    or a ``committed`` read the runner made while faults are on returns less than the highest
    offset acknowledged before the read was sent. A commit whose outcome is unknown (``info``,
    or never answered) may be the last applied, and its offset acceptable, until it is
    fenced: by an acknowledged commit of a later classic generation of its group, or by an
    acknowledged commit of its partition sent after the coordinator had surely read it
    (``DELIVERY_SLACK_S`` after the client gave up; after a fault's window, later).
    Proves no acknowledged commit is lost across crashes, failovers and partitions.
    ``regressed-read``: two ``ok`` ``committed`` reads by the runner of one (group, topic,
    partition), A's answer preceding B's invoke, B the final read, B's offset below A's, and
    no commit of B's offset (``ok``, ``info`` or unanswered) that may have been applied after
    A's invoke and before B's answer.
    Proves a committed offset once read stays until something commits over it: a read of a
    state later undone (an uncommitted write served, a log truncated under it) is caught even
    when the commit it saw was never acknowledged.
    ``regressed-commit``: two ``ok`` commits of one (group, topic, partition), A's ``ok``
    preceding B's invoke, and B's offset below A's. Proves the committed offset a client can
    observe never goes back (a stale generation or a truncated log would make it). Not when
    B's member, in B's generation, read the committed offset (``committed`` with
    ``partitions``) after A's ``ok`` and before B's invoke and saw A's or more: the
    coordinator kept A, and the member committed below it from its own stale position
    (kafka-python keeps positions through an eager rebalance). Those are counted in the stats
    (``stale_position_commits``); Kafka's coordinator takes such a commit too.
    ``commit-beyond-consumed``: an ``ok`` commit of offset o by member m on partition p where,
    before the commit was acknowledged, m had not consumed offset o-1 of p (``consume``), and o
    is none of: 0 (the log start), an offset m started consuming p at (a consumed offset whose
    predecessor m had not consumed just before: where its position came from), an offset some
    commit of the group had already attempted (``ok``, ``info`` or unanswered, invoked before
    this one: re-committing a position). Proves members commit only what they processed, so
    the at-least-once chain from producer to committed offset has no hole.
    ``no-final-committed``: acknowledged commits for a (group, topic) but no ``ok`` final
    ``committed`` read: durability cannot be shown, so it is not assumed.
    ``phantom-commit``: a final committed offset above every offset any commit of that
    (group, topic, partition) attempted (``ok``, ``info``, ``fail`` or unanswered): the
    coordinator answered a position nobody sent.
    ``no-member-commit-after-heal``: a group that had acknowledged commits, none of them
    after the last ``heal``. The members consume and commit what was produced before the
    final heal, so a group whose commits all fail after a fault (while the runner's probe, of
    another group, succeeds) is caught.

``check_groups`` (groups workload): group membership and ownership
    ``split-ownership``: two members (different ``member_id`` and different ``member``) report
    the same partition of a topic in ``assignment`` events with the same group and generation.
    Proves at most one owner per partition per generation. Same ``member`` with a new
    ``member_id`` is a static member replaced in place (KIP-345: no rebalance, no generation
    bump, the old id is fenced), one owner that restarted, not two.
    ``unowned-after-heal``: in the final state some partition of a subscribed topic is owned
    by no live member, a live member has no assignment, or the live members' last assignments
    (and the final ``describe``) disagree on the generation. Live members are those of the final
    ``describe``, and their assignments those reported up to it (members stopping afterwards
    rebalance the others); without one, those whose last ``assignment`` follows the last
    ``heal``. Proves
    the group converges to a complete assignment once faults stop.
    ``not-stable-after-heal``: a group's final ``describe`` is missing, its state is not
    ``Stable``, or it came more than ``stable_within_s`` after the last ``heal``.

    A topic's partition count comes from ``partitions_by_topic``, else from a ``topic`` event,
    else from every partition the history mentions for it (assignments, sends, commits).

    ``early-handover`` (KIP-848 members, ``group_protocol`` ``consumer`` in their
    ``process-start``): a member's ``assigned`` callback names a partition another member
    held then and gave up later with a ``revoked`` callback, by the members' own clocks (the
    ``at`` of those events: one host, so one wall clock). The coordinator may hand a
    partition on only once its owner has acknowledged the revocation, which it does after its
    callback; this is what split-ownership cannot see there, as each member's generation is
    its own epoch. A holding that ends otherwise (``lost``: the member was fenced, its
    session timed out; killed; still held at the end) proves nothing and is not compared.

``check_queue`` (queue workload, Jepsen's Kafka test): the data plane
    Per (topic, partition), the *log* is every (offset, value) an ``ok`` send was acknowledged
    at or a poll read; its *version order* is the sorted list of those offsets, so an offset
    nobody wrote or read (a gap Kafka may legally leave) is never "skipped". Polls are ``poll``
    and ``consume`` events (``ok``); ``final-poll`` events count as reads everywhere but are
    exempt from the per-consumer order checks (they start again at offset 0). An ``ok`` send
    without an offset (librdkafka's implicit ack: a later batch of the same idempotent producer
    succeeded, so this one was written, offset unknown) is checked for ``unseen`` only.

    ``inconsistent-offsets``: one offset holds two different values. ``duplicate``: one value
    sits at two offsets of a partition (values are unique per key, and a key has one
    partition), unless the run's ``log-copies`` events (``chaos.copies``: the nodes' logs,
    read after the run) show each copy written by a newer producer session (producer id,
    epoch) than the one before it: the broker deduplicates within one session only, and a
    client that resent the value under a new epoch (librdkafka issue #4953) wrote it twice
    itself. Those are counted in ``stats["client_resends"]`` with examples, not as anomalies;
    copies of one session, or an older session's copy after a newer one's (a fenced producer
    written), stay ``duplicate``.
    ``lost-write``: an ``ok`` send whose value no poll or final poll read, at an offset at or
    below the highest offset read in its partition: someone read past it, so it should have
    been read. ``unseen``: an ``ok`` send whose value no final poll read; when
    ``require_final_poll`` is False and the history has no final polls, this is not checked
    (``stats["unseen_checked"]``). ``lost-read``: under the same condition, a value a poll
    read that no final poll read and no ``ok`` send reported (a send whose outcome was
    unknown counts as written once it was read, as in Jepsen). ``aborted-read``: a value
    was read whose every send attempt ``fail``-ed (Jepsen's aborted read; a workload must
    record ambiguous errors as ``info``). ``unexpected``: a value was read that no send
    attempted (Jepsen's unexpected read: the producers report each value before they send
    it, so it is a record nobody wrote, or one corrupted on the way).
    ``poll-skip`` / ``nonmonotonic-poll``: within one consumer process, a partition's
    consecutive records (in one poll or across polls) are more than one step apart in the
    version order, or not ahead of the previous one. Rebalances and restarts reset the
    expectation: a process's ``assign``, ``subscribe``, ``assignment``, ``process-start`` or
    ``process-kill`` event, a change of the ``generation`` its polls report, and a ``clients``
    nemesis fault naming it reset every partition; an
    ``assigned`` / ``revoked`` / ``lost`` callback resets the partitions it lists (all when it
    lists none). Jepsen keeps the expectation across ``assign`` for partitions still assigned;
    clients differ there (kafka-python drops positions on assign), so this checker does not.
    ``nonmonotonic-send``: one process's ``ok`` sends to a partition, in invoke order, get
    offsets that do not increase. A send's completion is matched to its invoke by value: a
    producer has many in flight, and its delivery reports come in any order.

    The groups workload's members read the producers' records too: its ``records`` result is
    this checker without the final poll, so an acknowledged record that the members read past
    and never saw is a ``lost-write`` there as well.

``check_consumed`` (groups workload): every group reads everything
    ``unconsumed``: an ``ok`` send whose value some group never consumed. Every group of the
    workload subscribes to the whole topic, and the runner stops the producers and waits for
    the members to consume what was acknowledged before it stops them; a group is one that
    consumed anything or that the final phase described with members. This is what shows
    that a group did not skip records (a member starting past its committed offset) or lose
    them in a failover, which the other groups' reads would hide in ``records``.

``check_liveness`` (both workloads)
    ``no-commit-after-heal``: after a ``heal``, no ``ok`` ``commit`` or ``probe-commit``
    within ``commit_within_s``. A history that ends before the bound therefore fails only if
    nothing was acknowledged after the heal at all. Proves the cluster recovers, not only that
    it stays safe while refusing everything. ``no-send-after-heal``: the same for ``ok``
    sends, in a history with sends: the runner's probe commits alone kept a run whose
    producers had died or hung before the faults passing.

``check_progress`` (both workloads): the run did something to check
    ``no-acknowledged-send``: no ``ok`` send at all. ``no-member-commit`` (groups): a group
    whose members started (``process-start``) and none of whose ``commit`` was ``ok`` (the
    runner's own probe does not count): a group whose every commit was refused had nothing
    for ``lost-commit`` to look at. ``unrecorded-report``: a client's report that could not be
    recorded (an acknowledgement may be missing). ``client-exited``: a client process ended
    that neither the nemesis nor the runner stopped (``process-exit``: a fatal client error,
    a crash); the final checks look at the members still alive, and the group rebalanced
    without it. Without these, a run whose producer died at once, whose members never
    committed, or whose members gave up on a wrong answer, passed.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any, Final

from kcoord.chaos.history import (
    FAIL,
    FENCING_WATCH_F,
    INFO,
    INVOKE,
    LOG_COPIES_F,
    OK,
    PROCESS_EXIT_F,
    PROCESS_KILL_F,
    UNRECORDED_REPORT_F,
    Event,
    History,
)

MAX_EXAMPLES: Final = 10
DEFAULT_COMMIT_WITHIN_S: Final = 30.0
DEFAULT_STABLE_WITHIN_S: Final = 60.0

MALFORMED: Final = "malformed-event"
OFFSETS_ANOMALIES: Final = (
    "lost-commit",
    "regressed-commit",
    "commit-beyond-consumed",
    "no-final-committed",
)
GROUPS_ANOMALIES: Final = (
    "split-ownership",
    "unowned-after-heal",
    "not-stable-after-heal",
    "early-handover",
)
QUEUE_ANOMALIES: Final = (
    "lost-write",
    "unseen",
    "duplicate",
    "inconsistent-offsets",
    "poll-skip",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "aborted-read",
    "unexpected",
)
LIVENESS_ANOMALIES: Final = ("no-commit-after-heal", "no-send-after-heal")
FENCING_ANOMALIES: Final = ("false-fencing",)
PROGRESS_ANOMALIES: Final = (
    "no-acknowledged-send",
    "no-member-commit",
    "unrecorded-report",
    "client-exited",
)
WORKLOADS: Final = ("groups", "queue")

# Events that read records, and those that reset a consumer's expected next offset.
POLL_FS: Final = frozenset({"poll", "consume"})
FINAL_POLL_F: Final = "final-poll"
FINAL_PROCESS: Final = "checker"  # the runner's process for its final reads (committed, describe)
REBALANCE_ALL_FS: Final = frozenset(
    {"assign", "subscribe", "assignment", "process-start", "process-kill"}
)
REBALANCE_LISTED_FS: Final = frozenset({"assigned", "revoked", "lost"})
COMMIT_FS: Final = frozenset({"commit", "probe-commit"})
MEMBER_MODULE: Final = "kcoord.chaos.member"  # the groups workload's members (process-start)

_At = tuple[float, int]
_GroupPartition = tuple[str, str | None, int]  # (group, topic, partition)
_TopicPartition = tuple[str, int]
_PARSE_ERRORS: Final = (KeyError, TypeError, ValueError)


@dataclass(frozen=True)
class CheckResult:
    name: str
    valid: bool
    anomalies: dict[str, list[dict[str, Any]]]  # anomaly -> up to MAX_EXAMPLES examples
    stats: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "valid": self.valid,
            "anomalies": self.anomalies,
            "stats": self.stats,
        }


class _Findings:
    """Collects anomalies: every one is counted, the first MAX_EXAMPLES of each are kept."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._examples: dict[str, list[dict[str, Any]]] = {}
        self._counts: dict[str, int] = {}

    def add(self, anomaly: str, example: dict[str, Any]) -> None:
        self._counts[anomaly] = self._counts.get(anomaly, 0) + 1
        examples = self._examples.setdefault(anomaly, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(example)

    def malformed(self, event: Event, error: Exception) -> None:
        self.add(
            MALFORMED,
            {
                "event": event.index,
                "process": event.process,
                "f": event.f,
                "error": f"{type(error).__name__}: {error}",
            },
        )

    def result(self, stats: dict[str, Any]) -> CheckResult:
        return CheckResult(
            name=self.name,
            valid=not self._counts,
            anomalies={name: self._examples[name] for name in sorted(self._examples)},
            stats={**stats, "anomaly_counts": dict(sorted(self._counts.items()))},
        )


# ---------------------------------------------------------------------------------------------
# Parsing helpers (KeyError/TypeError/ValueError on a malformed value)


def _in_time_order(history: History) -> list[Event]:
    return sorted(history.events(), key=lambda event: event.at)


def _member(event: Event) -> str:
    return str(event.value.get("member", event.process))


def _required(value: Mapping[str, Any], key: str) -> str:
    """A field that must be present and not null (JSON null would read as "None")."""
    if value.get(key) is None:
        raise KeyError(key)
    return str(value[key])


def _topic(value: Mapping[str, Any]) -> str | None:
    topic = value.get("topic")
    return None if topic is None else str(topic)


def _offsets(value: Mapping[str, Any]) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in value["offsets"].items()}


def _partitions(value: Mapping[str, Any]) -> frozenset[int]:
    return frozenset(int(partition) for partition in value["partitions"])


def _records(value: Mapping[str, Any]) -> list[tuple[int, int, Any]]:
    return [(int(partition), int(offset), record) for partition, offset, record in value["records"]]


def _freeze(value: Any) -> Hashable:
    """A hashable stand-in for a JSON value (record values may be lists or objects)."""
    if isinstance(value, list):
        return ("list", tuple(_freeze(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _freeze(v)) for k, v in value.items())))
    assert isinstance(value, Hashable)
    return value


def _lone_completions(history: History, f: str) -> list[Event]:
    paired = {done.index for _, done in history.pairs(f) if done is not None}
    return [e for e in history.ops(f) if e.type != INVOKE and e.index not in paired]


# ---------------------------------------------------------------------------------------------
# Offsets


@dataclass(frozen=True)
class _Commit:
    group: str
    topic: str | None
    partition: int
    offset: int
    member: str
    type: str  # completion type; "invoke" when it never completed
    invoke_at: _At | None  # None for a commit recorded only as a completion
    done_at: _At | None  # None when it never completed
    event: Event  # the completion, or the invoke when there is none
    # The classic generation it carries (None: a KIP-848 member's epoch, a commit outside a
    # generation, or a history that does not say which protocol), and when a commit of the
    # same group from a later classic generation was acknowledged: the group had moved past
    # this one's and the coordinator refuses it from then on (ILLEGAL_GENERATION), so it
    # cannot land after. None: no such ack. Not KIP-848 member epochs: kcoord accepts a
    # commit at an older epoch of a member that kept the partition since (KIP-1251).
    classic_generation: int | None = None
    fenced_at: _At | None = None

    @property
    def key(self) -> _GroupPartition:
        return (self.group, self.topic, self.partition)

    def example(self) -> dict[str, Any]:
        return {
            "event": self.event.index,
            "time": self.event.time,
            "member": self.member,
            "member_id": self.event.value.get("member_id"),
            "generation": self.event.value.get("generation"),
            "offset": self.offset,
        }


def _commits(history: History, findings: _Findings) -> list[_Commit]:
    operations: list[tuple[Event | None, Event | None]] = list(history.pairs("commit"))
    operations += [(None, done) for done in _lone_completions(history, "commit")]
    commits: list[_Commit] = []
    for invoke, done in operations:
        event = done if done is not None else invoke
        assert event is not None
        # The completion may repeat the value or carry only the outcome.
        value = {**(invoke.value if invoke else {}), **(done.value if done else {})}
        try:
            group, topic = _required(value, "group"), _topic(value)
            offsets = _offsets(value)
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
            continue
        for partition, offset in offsets.items():
            commits.append(
                _Commit(
                    group=group,
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    member=str(value.get("member", event.process)),
                    type=done.type if done else INVOKE,
                    invoke_at=invoke.at if invoke else None,
                    done_at=done.at if done else None,
                    event=event,
                    classic_generation=_classic_generation(value),
                )
            )
    return _with_delivery(_with_fencing(commits), _fault_windows(history))


# How long after a member gave up on a commit (or was killed with it in flight) the
# coordinator has read it, outside any fault's window: a node under load reads its sockets
# late, not seconds late. Within a window (a partition, a pause, a kill...), the request may
# wait in the network or the node's socket until the heal, and TCP then resends it within the
# time it has been waiting (its retransmissions back off by doubling), plus this slack.
DELIVERY_SLACK_S: Final = 10.0
# Faults that delay no request: their windows extend no delivery.
NO_DELIVERY_DELAY_FAULTS: Final = frozenset({"clients"})


def _fault_windows(history: History) -> list[tuple[float, float]]:
    """[start, heal] of each fault, from the nemesis's invoke of ``start`` to its ``heal``
    (one fault at a time); a fault never healed lasts for ever. Not a ``clients`` fault: it
    kills a client and holds no request anywhere (its replacement starts at once), and its
    window let an unknown commit land some 30 s later, excusing stale reads meanwhile."""
    windows: list[tuple[float, float]] = []
    start: float | None = None
    for event in history:
        if event.process != "nemesis":
            continue
        if event.f == "start" and event.type == INVOKE:
            if event.value.get("fault") in NO_DELIVERY_DELAY_FAULTS:
                continue
            start = event.time if start is None else start
        elif event.f == "start" and event.value.get("skipped"):
            start = None  # no target: no fault, and no heal follows
        elif event.f == "heal" and start is not None:
            windows.append((start, event.time))
            start = None
    if start is not None:
        windows.append((start, math.inf))
    return windows


def _delivered_by(commit: _Commit, windows: list[tuple[float, float]]) -> float:
    """When the coordinator had read ``commit``'s request at the latest, if it ever will: the
    client's giving up (or its sending, for one never answered), extended past each fault
    window it may still be waiting in (see ``DELIVERY_SLACK_S``)."""
    assert commit.invoke_at is not None
    sent = commit.invoke_at[0]
    end = (commit.done_at or commit.invoke_at)[0]
    for start, heal in windows:
        if start <= end + DELIVERY_SLACK_S and heal >= sent:
            end = max(end, heal + (heal - sent))
    return end + DELIVERY_SLACK_S


def _with_delivery(commits: list[_Commit], windows: list[tuple[float, float]]) -> list[_Commit]:
    """Each commit whose outcome is unknown (``info``, or never answered) fenced, too, by the
    first acknowledged commit of its partition sent after it was surely read (``_delivered_by``):
    it was applied before that one, if at all, and that one overwrote it. Fenced only by a
    later classic generation, a KIP-848 member's timed-out commit of offset 13 was taken to
    land at any later time, and the final read of its partition passed at 13 while 540 had
    been acknowledged: a lost commit went unseen."""
    acked: dict[_GroupPartition, list[tuple[float, _At]]] = defaultdict(list)
    for c in commits:
        if c.type == OK and c.invoke_at is not None and c.done_at is not None:
            acked[c.key].append((c.invoke_at[0], c.done_at))
    out = []
    for commit in commits:
        if commit.type in (OK, FAIL) or commit.invoke_at is None:
            out.append(commit)
            continue
        delivered = _delivered_by(commit, windows)
        later = [done for sent, done in acked.get(commit.key, ()) if sent > delivered]
        if later and (commit.fenced_at is None or min(later) < commit.fenced_at):
            commit = replace(commit, fenced_at=min(later))  # noqa: PLW2901
        out.append(commit)
    return out


def _classic_generation(value: dict[str, Any]) -> int | None:
    generation = value.get("generation")
    if value.get("group_protocol") != "classic" or not isinstance(generation, int):
        return None
    return generation if generation >= 0 else None


def _with_fencing(commits: list[_Commit]) -> list[_Commit]:
    """Each classic commit with the time the first acknowledged commit of its group from a
    later generation completed (``_Commit.fenced_at``): a classic generation is the group's.
    Acks sorted by generation with the earliest completion from each on, so each commit is
    one bisection."""
    acks: dict[str, list[tuple[int, _At]]] = defaultdict(list)
    for c in commits:
        if c.type == OK and c.done_at is not None and c.classic_generation is not None:
            acks[c.group].append((c.classic_generation, c.done_at))
    earliest_from: dict[str, tuple[list[int], list[_At]]] = {}
    for group, entries in acks.items():
        entries.sort()
        generations = [g for g, _ in entries]
        suffix: list[_At] = [entries[-1][1]] * len(entries)
        for i in range(len(entries) - 2, -1, -1):
            suffix[i] = min(entries[i][1], suffix[i + 1])
        earliest_from[group] = (generations, suffix)
    fenced = []
    for c in commits:
        found = earliest_from.get(c.group)
        if c.classic_generation is None or found is None:
            fenced.append(c)
            continue
        generations, suffix = found
        i = bisect_right(generations, c.classic_generation)
        fenced.append(replace(c, fenced_at=suffix[i]) if i < len(generations) else c)
    return fenced


def check_offsets(history: History) -> CheckResult:
    """lost-commit, regressed-commit, regressed-read, commit-beyond-consumed,
    no-final-committed, phantom-commit, no-member-commit-after-heal."""
    findings = _Findings("offsets")
    ordered = _in_time_order(history)
    commits = _commits(history, findings)
    acked = [c for c in commits if c.type == OK]

    final = _final_committed(ordered, findings)
    _check_lost_commits(final, commits, findings)
    _check_final_committed(final, commits, findings)
    _check_member_commits_after_heal(history, acked, findings)
    _check_reads_see_acknowledged_commits(history, commits, findings)
    _check_regressed_reads(ordered, history, commits, findings)
    stale = _check_regressed_commits(acked, _member_reads(history, findings), findings)
    _check_commits_beyond_consumed(ordered, commits, acked, findings)

    return findings.result(
        {
            "commits": {
                kind: sum(1 for c in commits if c.type == kind) for kind in (OK, FAIL, INFO, INVOKE)
            },
            "groups": len({c.group for c in commits}),
            "partitions_committed": len({c.key for c in acked}),
            # Lower commits a member's own read shows came from its stale position, not from
            # the coordinator (see _stale_position): counted and shown, not anomalies.
            "stale_position_commits": len(stale),
            "stale_position_examples": stale[:MAX_EXAMPLES],
        }
    )


_FinalCommitted = dict[tuple[str, str | None], tuple[Event, dict[int, int]]]


def _final_committed(ordered: list[Event], findings: _Findings) -> _FinalCommitted:
    """(group, topic) -> the last ``ok`` ``committed`` read of the runner's final reads and its
    offsets. Only the final reads count: a group without one is flagged (no-final-committed),
    never judged by a read made mid-run."""
    final: _FinalCommitted = {}
    for event in ordered:  # the last ok read wins
        if (
            event.f == "committed"
            and event.type == OK
            and event.process == FINAL_PROCESS
            and "partitions" not in event.value
        ):
            # (A member's read names its partitions: not the runner's read of the whole group.)
            try:
                final[(_required(event.value, "group"), _topic(event.value))] = (
                    event,
                    _offsets(event.value),
                )
            except _PARSE_ERRORS as error:
                findings.malformed(event, error)
    return final


def _check_final_committed(
    final: _FinalCommitted, commits: list[_Commit], findings: _Findings
) -> None:
    """``phantom-commit``: a final committed offset above every offset a commit of that
    (group, topic, partition) attempted: the coordinator answered one nobody sent."""
    attempted: dict[_GroupPartition, int] = {}
    for commit in commits:
        attempted[commit.key] = max(attempted.get(commit.key, -1), commit.offset)
    for (group, topic), (read_event, offsets) in sorted(final.items(), key=lambda kv: str(kv[0])):
        for partition, committed in sorted(offsets.items()):
            if committed >= 0 and committed > attempted.get((group, topic, partition), -1):
                findings.add(
                    "phantom-commit",
                    {
                        "group": group,
                        "topic": topic,
                        "partition": partition,
                        "final_committed": committed,
                        "attempted": attempted.get((group, topic, partition)),
                        "final_read_event": read_event.index,
                    },
                )


def _check_member_commits_after_heal(
    history: History, acked: list[_Commit], findings: _Findings
) -> None:
    """``no-member-commit-after-heal``: a group none of whose members' commits was
    acknowledged after the last ``heal``. The runner's probe commits (another group) show
    the coordinators answer; this shows the workload's groups commit again, which the
    members keep doing while they consume what was produced before the final heal."""
    heals = [e.at for e in history.ops("heal")]
    if not heals:
        return
    last_heal = max(heals)
    groups = {c.group for c in acked}
    after = {c.group for c in acked if c.done_at is not None and c.done_at > last_heal}
    for group in sorted(groups - after):
        findings.add("no-member-commit-after-heal", {"group": group})


def _least_a_read_may_see(commits: list[_Commit], sent_at: _At, answered_at: _At) -> _Commit | None:
    """The commit whose offset is the least a read of one partition's committed offset, sent
    at ``sent_at`` and answered at ``answered_at``, may return without an acknowledged commit
    having been lost; None when none was acknowledged before the read was sent.

    The coordinator keeps the last commit it applied, a lower offset included (Kafka's last
    writer wins: a member with a stale position commits below what another committed). Of the
    commits acknowledged before the read was sent, one acknowledged before another of them was
    sent was overwritten; any of the others, or of the commits that may still land (sent
    before the answer and not failed: acknowledged after the read was sent, or never answered,
    or ``info``: a client that gave up has not stopped the coordinator from applying it later),
    may be the last applied. Requiring the highest acknowledged offset flagged a stale
    member's acknowledged lower commit as a lost one.
    """
    acked = [c for c in commits if c.type == OK and c.done_at is not None and c.done_at < sent_at]
    if not acked:
        return None
    sends = [c.invoke_at for c in acked if c.invoke_at is not None]
    last_send = max(sends) if sends else None
    possible = [
        c for c in acked if last_send is None or (c.done_at is not None and c.done_at >= last_send)
    ]
    possible += [
        c
        for c in commits
        if _may_land_after(c, sent_at) and (c.invoke_at is None or c.invoke_at < answered_at)
    ]
    return min(possible, key=lambda c: c.offset)


def _may_land_after(commit: _Commit, at: _At) -> bool:
    """Whether ``commit`` may have been applied after ``at``: not failed, not fenced by then
    (``_Commit.fenced_at``), and acknowledged after it, or never answered, or ``info``. An
    ``info`` commit was otherwise taken to land at any later time: a timed-out commit of a
    low offset made it an acceptable value of every later read of its partition, the final
    one included, and a lost commit passed."""
    if commit.type == FAIL:
        return False
    if commit.type != OK and commit.fenced_at is not None and commit.fenced_at <= at:
        return False
    return commit.type == INFO or commit.done_at is None or commit.done_at >= at


def _commits_by_key(commits: list[_Commit]) -> dict[_GroupPartition, list[_Commit]]:
    by_key: dict[_GroupPartition, list[_Commit]] = defaultdict(list)
    for commit in commits:
        by_key[commit.key].append(commit)
    return by_key


def _check_lost_commits(
    final: _FinalCommitted, commits: list[_Commit], findings: _Findings
) -> None:
    missing_reads: set[tuple[str, str | None]] = set()
    by_key = _commits_by_key(commits)
    for (group, topic, partition), key_commits in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        if not any(c.type == OK for c in key_commits):
            continue
        read = final.get((group, topic))
        if read is None:
            if (group, topic) not in missing_reads:
                missing_reads.add((group, topic))
                findings.add("no-final-committed", {"group": group, "topic": topic})
            continue
        read_event, offsets = read
        least = _least_a_read_may_see(key_commits, read_event.at, read_event.at)
        if least is None:
            continue
        committed = offsets.get(partition)
        if committed is None or committed < least.offset:
            findings.add(
                "lost-commit",
                {
                    "group": group,
                    "topic": topic,
                    "partition": partition,
                    "acknowledged": least.example(),
                    "final_committed": committed,
                    "final_read_event": read_event.index,
                },
            )


def _check_reads_see_acknowledged_commits(
    history: History, commits: list[_Commit], findings: _Findings
) -> None:
    """Every ``committed`` read the runner made while faults were on must return, for each
    partition, at least what ``_least_a_read_may_see`` says (the final read is
    ``_check_lost_commits``'). So must a member's own read of its partitions as a classic
    generation begins (kafka-python's, stamped by its own clock), unless a commit of a later
    generation (or of none known) was sent before it was answered: a member still in a
    generation the group has left may be reading from a coordinator cut off from the
    others, which serves its last committed state (as Kafka's would). Without it, a commit
    acknowledged and then lost on a failover went unseen whenever its partition's next owner
    committed past it before the runner's next read: the final read showed the later commit
    (found by a review)."""
    by_key = _commits_by_key(commits)
    for invoke, done in history.pairs("committed"):
        if done is None or done.type != OK or done.process == FINAL_PROCESS:
            continue
        member_read = "partitions" in done.value
        found = done.value.get("generation")
        generation = found if isinstance(found, int) and not isinstance(found, bool) else None
        if member_read and (done.value.get("group_protocol") != "classic" or generation is None):
            continue
        try:
            group, topic = _required(done.value, "group"), _topic(done.value)
            offsets = _offsets(done.value)
            read_partitions = {int(p) for p in done.value["partitions"]} if member_read else None
        except _PARSE_ERRORS as error:
            findings.malformed(done, error)
            continue
        for (g, t, partition), key_commits in by_key.items():
            if (g, t) != (group, topic):
                continue
            if read_partitions is not None and (
                partition not in read_partitions
                or generation is None
                or _moved_on(key_commits, generation, done.at)
            ):
                continue
            least = _least_a_read_may_see(key_commits, invoke.at, done.at)
            if least is None:
                continue
            seen = offsets.get(partition)
            if seen is None or seen < least.offset:
                findings.add(
                    "lost-commit",
                    {
                        "group": group,
                        "topic": topic,
                        "partition": partition,
                        "acknowledged": least.example(),
                        "read": seen,
                        "read_event": done.index,
                        "reason": (
                            "a member's read as its generation began does not see it"
                            if member_read
                            else "a read sent after the acknowledgement does not see it"
                        ),
                    },
                )


def _moved_on(commits: list[_Commit], generation: int, answered_at: _At) -> bool:
    """Whether a commit of a classic generation after ``generation`` (or of none known) was
    sent before ``answered_at``: the group had moved on, or may have, before the answer."""
    return any(
        (c.classic_generation is None or c.classic_generation > generation)
        and (c.invoke_at is None or c.invoke_at < answered_at)
        for c in commits
    )


@dataclass(frozen=True)
class _OffsetRead:
    """An ``ok`` ``committed`` read of one (group, topic, partition) it found an offset for
    (a read names only those). ``invoke_at`` None: recorded as a completion alone."""

    key: _GroupPartition
    offset: int
    invoke_at: _At | None
    done_at: _At
    event: Event


def _committed_reads(
    ordered: list[Event], history: History, findings: _Findings
) -> list[_OffsetRead]:
    """The runner's reads (while faults are on, and the final one), per partition; not the
    members' (their times are when the runner received their events)."""
    invoked = {done.index: invoke.at for invoke, done in history.pairs("committed") if done}
    reads: list[_OffsetRead] = []
    for event in ordered:
        if event.f != "committed" or event.type != OK or "partitions" in event.value:
            continue
        try:
            group, topic = _required(event.value, "group"), _topic(event.value)
            offsets = _offsets(event.value)
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
            continue
        for partition, offset in sorted(offsets.items()):
            reads.append(
                _OffsetRead(
                    (group, topic, partition), offset, invoked.get(event.index), event.at, event
                )
            )
    return reads


def _check_regressed_reads(
    ordered: list[Event], history: History, commits: list[_Commit], findings: _Findings
) -> None:
    """``regressed-read`` (see the module docstring). B is the final read: made after the
    last heal, once the cluster settled, it comes from the partitions' current leaders. One
    made while faults are on may come from a coordinator cut off from the others that does
    not know it was replaced yet, and serves its last committed state (as Kafka's would), so
    an older value there proves nothing. B's offset needs a commit of it that may have landed
    after the invoke of the latest-sent earlier read that saw more (the state B saw came after
    what that read saw), and was sent before B was answered."""
    by_key: dict[_GroupPartition, list[_OffsetRead]] = defaultdict(list)
    for read in _committed_reads(ordered, history, findings):
        by_key[read.key].append(read)
    commits_by_key = _commits_by_key(commits)
    for key, key_reads in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        by_offset: dict[int, list[_Commit]] = defaultdict(list)
        for commit in commits_by_key.get(key, []):
            by_offset[commit.offset].append(commit)
        for later in key_reads:
            if later.event.process != FINAL_PROCESS or later.invoke_at is None:
                continue  # not the final read, or sent at an unknown time
            higher = [
                r for r in key_reads if r.done_at < later.invoke_at and r.offset > later.offset
            ]
            if not higher:
                continue
            bound = max(higher, key=lambda r: r.invoke_at or _NEVER)
            since = bound.invoke_at or _NEVER
            if any(
                _may_land_after(c, since) and (c.invoke_at is None or c.invoke_at < later.done_at)
                for c in by_offset.get(later.offset, [])
            ):
                continue
            findings.add(
                "regressed-read",
                {
                    "group": key[0],
                    "topic": key[1],
                    "partition": key[2],
                    "earlier_read_event": bound.event.index,
                    "earlier_offset": bound.offset,
                    "read_event": later.event.index,
                    "offset": later.offset,
                },
            )


_NEVER: Final[_At] = (float("-inf"), -1)  # before every event


@dataclass(frozen=True)
class _MemberRead:
    """A member's ``ok`` read of its partitions' committed offsets (``read_committed``)."""

    member: str
    generation: Any
    invoke_at: _At
    done_at: _At
    offsets: dict[int, int]


def _member_reads(history: History, findings: _Findings) -> list[_MemberRead]:
    reads: list[_MemberRead] = []
    for invoke, done in history.pairs("committed"):
        if done is None or done.type != OK or "partitions" not in done.value:
            continue
        try:
            offsets = _offsets(done.value)
        except _PARSE_ERRORS as error:
            findings.malformed(done, error)
            continue
        reads.append(
            _MemberRead(done.process, done.value.get("generation"), invoke.at, done.at, offsets)
        )
    return reads


def _stale_position(earlier: _Commit, later: _Commit, reads: list[_MemberRead]) -> bool:
    """Whether ``later``'s member, in ``later``'s generation, read the committed offset of
    the partition at or above ``earlier``'s after ``earlier`` was acknowledged and before it
    sent ``later``: the coordinator had kept ``earlier`` and served it, and the member then
    committed below it from a position of its own (kafka-python's, kept through an eager
    rebalance). Kafka's coordinator takes such a commit as well (the last writer wins)."""
    generation = later.event.value.get("generation")
    return any(
        read.member == later.member
        and read.generation == generation
        and earlier.done_at is not None
        and later.invoke_at is not None
        and earlier.done_at < read.invoke_at
        and read.done_at < later.invoke_at
        and read.offsets.get(later.partition, -1) >= earlier.offset
        for read in reads
    )


def _check_regressed_commits(
    acked: list[_Commit], reads: list[_MemberRead], findings: _Findings
) -> list[dict[str, Any]]:
    """``regressed-commit`` findings; returns the regressions a member's read attributes to
    its own stale position (``_stale_position``), which are not findings."""
    stale: list[dict[str, Any]] = []
    by_key: dict[_GroupPartition, list[_Commit]] = defaultdict(list)
    for commit in acked:
        by_key[commit.key].append(commit)
    for (group, topic, partition), key_commits in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        # Sweep B in invoke order, keeping the highest offset among commits acknowledged
        # before B's invoke. A commit with no invoke may have been sent at any time: it is
        # never a B (it is concurrent with everything), only an A.
        by_done = sorted(key_commits, key=lambda c: c.done_at or (0.0, 0))
        later = sorted(
            (c for c in key_commits if c.invoke_at is not None),
            key=lambda c: c.invoke_at or (0.0, 0),
        )
        done_i = 0
        highest: _Commit | None = None
        for commit in later:
            assert commit.invoke_at is not None
            while done_i < len(by_done) and (by_done[done_i].done_at or (0.0, 0)) < (
                commit.invoke_at
            ):
                if highest is None or by_done[done_i].offset > highest.offset:
                    highest = by_done[done_i]
                done_i += 1
            if highest is not None and commit.offset < highest.offset:
                example = {
                    "group": group,
                    "topic": topic,
                    "partition": partition,
                    "earlier": highest.example(),
                    "later": commit.example(),
                }
                if _stale_position(highest, commit, reads):
                    stale.append(example)
                else:
                    findings.add("regressed-commit", example)
    return stale


def _check_commits_beyond_consumed(
    ordered: list[Event], commits: list[_Commit], acked: list[_Commit], findings: _Findings
) -> None:
    # (member, group, topic, partition) -> offset -> when first consumed / first started at.
    consumed_at: dict[tuple[str, str, str | None, int], dict[int, _At]] = defaultdict(dict)
    started_at: dict[tuple[str, str, str | None, int], dict[int, _At]] = defaultdict(dict)
    previous: dict[tuple[str, str, str | None, int], int] = {}
    for event in ordered:
        if event.f != "consume" or event.type != OK:
            continue
        try:
            group, topic = _required(event.value, "group"), _topic(event.value)
            records = _records(event.value)
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
            continue
        member = _member(event)
        for partition, offset, _ in records:
            key = (member, group, topic, partition)
            consumed_at[key].setdefault(offset, event.at)
            if previous.get(key) != offset - 1:
                started_at[key].setdefault(offset, event.at)
            previous[key] = offset

    # (group, topic, partition) -> offset -> earliest invoke of a commit that may have stored it.
    attempted_at: dict[_GroupPartition, dict[int, _At]] = defaultdict(dict)
    for commit in commits:
        sent_at = commit.invoke_at or commit.done_at
        if commit.type != FAIL and sent_at is not None:
            seen = attempted_at[commit.key].get(commit.offset)
            if seen is None or sent_at < seen:
                attempted_at[commit.key][commit.offset] = sent_at

    for commit in acked:
        assert commit.done_at is not None
        if commit.offset == 0:
            continue  # the log start: nothing to have consumed
        key = (commit.member, commit.group, commit.topic, commit.partition)
        own_send = commit.invoke_at or commit.done_at
        consumed = consumed_at[key].get(commit.offset - 1)
        started = started_at[key].get(commit.offset)
        attempted = attempted_at[commit.key].get(commit.offset)
        if (
            (consumed is not None and consumed < commit.done_at)
            or (started is not None and started < commit.done_at)
            or (attempted is not None and attempted < own_send)
        ):
            continue
        before = [o for o, at in consumed_at[key].items() if at < commit.done_at]
        findings.add(
            "commit-beyond-consumed",
            {
                "group": commit.group,
                "topic": commit.topic,
                "partition": commit.partition,
                "commit": commit.example(),
                "highest_consumed_before": max(before) if before else None,
            },
        )


# ---------------------------------------------------------------------------------------------
# Groups


@dataclass(frozen=True)
class _Assignment:
    group: str
    topic: str
    member: str
    member_id: str
    generation: int
    partitions: frozenset[int]
    event: Event

    def example(self) -> dict[str, Any]:
        return {
            "event": self.event.index,
            "time": self.event.time,
            "member": self.member,
            "member_id": self.member_id,
            "generation": self.generation,
            "partitions": sorted(self.partitions),
        }


def _assignments(ordered: Iterable[Event], findings: _Findings) -> list[_Assignment]:
    assignments: list[_Assignment] = []
    for event in ordered:
        if event.f != "assignment" or event.type == INVOKE:
            continue
        try:
            assignments.append(
                _Assignment(
                    group=_required(event.value, "group"),
                    topic=_required(event.value, "topic"),
                    member=_member(event),
                    member_id=_required(event.value, "member_id"),
                    generation=int(event.value["generation"]),
                    partitions=_partitions(event.value),
                    event=event,
                )
            )
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
    return assignments


def _topic_partitions(
    ordered: Iterable[Event], partitions_by_topic: Mapping[str, int] | None
) -> tuple[dict[str, frozenset[int]], str]:
    """Each topic's partitions, and where the counts came from (see the module docstring)."""
    if partitions_by_topic is not None:
        return {t: frozenset(range(n)) for t, n in partitions_by_topic.items()}, "bounds"
    declared: dict[str, frozenset[int]] = {}
    seen: dict[str, set[int]] = defaultdict(set)
    for event in ordered:
        value, topic = event.value, _topic(event.value)
        if topic is None:
            continue
        try:
            if event.f == "topic":
                declared[topic] = frozenset(range(int(value["partitions"])))
            elif event.f == "assignment":
                seen[topic] |= _partitions(value)
            elif event.f == "send" and event.type == OK and "partition" in value:
                seen[topic].add(int(value["partition"]))
            elif event.f in ("commit", "committed") and "offsets" in value:
                seen[topic] |= set(_offsets(value))
        except _PARSE_ERRORS:
            continue  # the checker that owns the event reports it
    if declared:
        return declared, "topic-events"
    return {t: frozenset(ps) for t, ps in seen.items()}, "inferred"


def check_groups(
    history: History,
    *,
    stable_within_s: float = DEFAULT_STABLE_WITHIN_S,
    partitions_by_topic: Mapping[str, int] | None = None,
) -> CheckResult:
    """split-ownership, unowned-after-heal, not-stable-after-heal, early-handover."""
    findings = _Findings("groups")
    ordered = _in_time_order(history)
    assignments = _assignments(ordered, findings)
    _check_split_ownership(assignments, findings)
    _check_handover_after_revocation(ordered, findings)

    heals = [e for e in ordered if e.f == "heal"]
    last_heal = heals[-1] if heals else None
    describes: dict[str, Event] = {}
    for event in ordered:
        if event.f == "describe" and event.type == OK:
            if "group" in event.value:
                describes[str(event.value["group"])] = event
            else:
                findings.malformed(event, KeyError("group"))

    topic_partitions, partitions_source = _topic_partitions(ordered, partitions_by_topic)
    groups = sorted({a.group for a in assignments} | set(describes))
    stable_after_heal_s: dict[str, float | None] = {}
    for group in groups:
        describe = describes.get(group)
        _check_stable(group, describe, last_heal, stable_within_s, findings)
        if describe is not None and last_heal is not None:
            stable_after_heal_s[group] = round(describe.time - last_heal.time, 3)
        try:
            _check_final_ownership(
                group,
                assignments=[a for a in assignments if a.group == group],
                describe=describe,
                last_heal=last_heal,
                topic_partitions=topic_partitions,
                findings=findings,
            )
        except _PARSE_ERRORS as error:
            assert describe is not None  # only the describe's fields are parsed there
            findings.malformed(describe, error)

    return findings.result(
        {
            "groups": len(groups),
            "assignments": len(assignments),
            "heals": len(heals),
            "max_generation": {
                group: max((a.generation for a in assignments if a.group == group), default=None)
                for group in groups
            },
            "stable_after_heal_s": stable_after_heal_s,
            "partitions_source": partitions_source,
        }
    )


def _check_split_ownership(assignments: list[_Assignment], findings: _Findings) -> None:
    owners: dict[tuple[str, str, int, int], dict[str, _Assignment]] = defaultdict(dict)
    reported: set[tuple[str, str, int, int]] = set()
    for assignment in assignments:
        for partition in sorted(assignment.partitions):
            key = (assignment.group, assignment.topic, assignment.generation, partition)
            rivals = [
                other
                for other in owners[key].values()
                if other.member_id != assignment.member_id and other.member != assignment.member
            ]
            if rivals and key not in reported:
                reported.add(key)
                findings.add(
                    "split-ownership",
                    {
                        "group": assignment.group,
                        "topic": assignment.topic,
                        "generation": assignment.generation,
                        "partition": partition,
                        "owners": [rivals[0].example(), assignment.example()],
                    },
                )
            owners[key][assignment.member_id] = assignment


def _check_stable(
    group: str,
    describe: Event | None,
    last_heal: Event | None,
    stable_within_s: float,
    findings: _Findings,
) -> None:
    if describe is None:
        findings.add("not-stable-after-heal", {"group": group, "reason": "no final describe"})
        return
    state = describe.value.get("state")
    if state != "Stable":
        findings.add(
            "not-stable-after-heal",
            {"group": group, "reason": "state", "state": state, "event": describe.index},
        )
    if last_heal is not None and describe.time - last_heal.time > stable_within_s:
        findings.add(
            "not-stable-after-heal",
            {
                "group": group,
                "reason": "late",
                "after_heal_s": round(describe.time - last_heal.time, 3),
                "bound_s": stable_within_s,
                "event": describe.index,
            },
        )


def _check_final_ownership(
    group: str,
    *,
    assignments: list[_Assignment],
    describe: Event | None,
    last_heal: Event | None,
    topic_partitions: Mapping[str, frozenset[int]],
    findings: _Findings,
) -> None:
    last: dict[tuple[str, str], _Assignment] = {}  # (topic, member_id) -> last assignment
    for assignment in assignments:  # already in time order
        if describe is not None and assignment.event.at > describe.at:
            break  # the final state is the described one: members then stop and rebalance
        last[(assignment.topic, assignment.member_id)] = assignment
    if describe is not None:
        live = {str(member_id) for member_id in describe.value["members"]}
    else:
        live = {
            member_id
            for (_, member_id), a in last.items()
            if last_heal is None or a.event.at > last_heal.at
        }
    with_assignment = {member_id for (_, member_id) in last}
    for member_id in sorted(live - with_assignment):
        findings.add(
            "unowned-after-heal",
            {"group": group, "reason": "member without assignment", "member_id": member_id},
        )

    for topic in sorted({a.topic for a in assignments}):
        finals = [last[(topic, m)] for m in sorted(live) if (topic, m) in last]
        owned = frozenset().union(*(a.partitions for a in finals))
        expected = topic_partitions.get(topic, owned)
        if expected - owned:
            findings.add(
                "unowned-after-heal",
                {
                    "group": group,
                    "topic": topic,
                    "reason": "unowned partitions",
                    "partitions": sorted(expected - owned),
                    "final_assignments": [a.example() for a in finals],
                },
            )
        generations = {a.member_id: a.generation for a in finals}
        if describe is not None and "generation" in describe.value:
            generations["describe"] = int(describe.value["generation"])
        if len(set(generations.values())) > 1:
            findings.add(
                "unowned-after-heal",
                {
                    "group": group,
                    "topic": topic,
                    "reason": "generation disagreement",
                    "generations": generations,
                },
            )


_HANDOVER_FS: Final = frozenset({"assigned", "revoked", "lost", PROCESS_KILL_F, PROCESS_EXIT_F})
# Two readings of the host's monotonic clock (chaos/member.py), rounded in JSON: closer than
# this is not "before".
_CLOCK_SLACK_S: Final = 0.001


@dataclass(frozen=True)
class _Holding:
    member: str
    since: float  # the member's clock at its assigned callback
    event: int


def _check_handover_after_revocation(ordered: list[Event], findings: _Findings) -> None:
    """``early-handover`` (see the module docstring)."""
    members = {
        e.process
        for e in ordered
        if e.f == "process-start"
        and isinstance(e.value.get("cfg"), dict)
        and e.value["cfg"].get("group_protocol") == "consumer"
    }
    held: dict[tuple[str, _GroupPartition], _Holding] = {}  # (member, partition) -> since
    taken: dict[_GroupPartition, list[_Holding]] = defaultdict(list)  # assigned callbacks
    given_up: list[tuple[_GroupPartition, _Holding, float, int]] = []  # revoked holdings
    for event in ordered:
        if event.process not in members or event.f not in _HANDOVER_FS:
            continue
        if event.f in (PROCESS_KILL_F, PROCESS_EXIT_F):
            for gone in [k for k in held if k[0] == event.process]:
                del held[gone]
            continue
        try:
            at = event.value.get("at")
            if at is None:
                continue  # a history from before members stamped their reports
            at = float(at)
            group, topic = _required(event.value, "group"), _topic(event.value)
            partitions = [int(p) for p in event.value.get("partitions") or []]
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
            continue
        if event.f == "assigned":
            for partition in partitions:
                holding = _Holding(event.process, at, event.index)
                held[(event.process, (group, topic, partition))] = holding
                taken[(group, topic, partition)].append(holding)
            continue
        mine = [k for k in held if k[0] == event.process and k[1][:2] == (group, topic)]
        ending = mine if not partitions else [k for k in mine if k[1][2] in partitions]
        for member_partition in ending:
            holding = held.pop(member_partition)
            if event.f == "revoked":
                given_up.append((member_partition[1], holding, at, event.index))
    for key, holding, revoked_at, revoked_event in given_up:
        for other in taken.get(key, ()):
            if other.member == holding.member:
                continue
            if holding.since < other.since < revoked_at - _CLOCK_SLACK_S:
                group, topic, partition = key
                findings.add(
                    "early-handover",
                    {
                        "group": group,
                        "topic": topic,
                        "partition": partition,
                        "holder": holding.member,
                        "held_since_event": holding.event,
                        "revoked_event": revoked_event,
                        "taker": other.member,
                        "taken_event": other.event,
                        "taken_before_revoked_s": round(revoked_at - other.since, 6),
                    },
                )


# ---------------------------------------------------------------------------------------------
# Queue


@dataclass(frozen=True)
class _Send:
    topic: str
    partition: int
    offset: int | None  # None: acknowledged without an offset (librdkafka's implicit ack)
    value: Any
    process: str
    order_at: _At  # the invoke's, else the completion's
    event: Event  # the ok completion


@dataclass(frozen=True)
class _Read:
    topic: str
    records: list[tuple[int, int, Any]]
    final: bool
    event: Event


def check_queue(history: History, *, require_final_poll: bool = True) -> CheckResult:
    """lost-write, unseen, duplicate, inconsistent-offsets, poll-skip, nonmonotonic-poll,
    nonmonotonic-send, aborted-read."""
    findings = _Findings("queue")
    ordered = _in_time_order(history)
    sends, attempts = _sends(history, findings)
    reads = _reads(ordered, findings)

    # The log: (topic, partition) -> offset -> {frozen value: value}.
    log: dict[_TopicPartition, dict[int, dict[Hashable, Any]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    read_values: dict[_TopicPartition, set[Hashable]] = defaultdict(set)
    final_values: dict[_TopicPartition, set[Hashable]] = defaultdict(set)
    max_read: dict[_TopicPartition, int] = {}
    for send in sends:
        if send.offset is not None:
            log[(send.topic, send.partition)][send.offset][_freeze(send.value)] = send.value
    for read in reads:
        for partition, offset, value in read.records:
            tp = (read.topic, partition)
            log[tp][offset][_freeze(value)] = value
            read_values[tp].add(_freeze(value))
            if read.final:
                final_values[tp].add(_freeze(value))
            max_read[tp] = max(max_read.get(tp, offset), offset)

    resends = _check_log(log, _log_copies(history, findings), findings)
    has_final = any(read.final for read in reads)
    unseen_checked = has_final or require_final_poll
    for send in sends:
        tp, frozen = (send.topic, send.partition), _freeze(send.value)
        example = {
            "topic": send.topic,
            "partition": send.partition,
            "offset": send.offset,
            "value": send.value,
            "send": send.event.index,
        }
        if (
            frozen not in read_values[tp]
            and send.offset is not None
            and send.offset <= max_read.get(tp, -1)
        ):
            findings.add("lost-write", {**example, "max_read_offset": max_read[tp]})
        if unseen_checked and frozen not in final_values[tp]:
            findings.add("unseen", example)
    if unseen_checked:
        # Jepsen counts a send whose outcome is unknown as written once a poll read it: a
        # record a consumer saw is committed, and must still be there at the end.
        reported = {(send.topic, send.partition, _freeze(send.value)) for send in sends}
        for read in reads:
            if read.final:
                continue
            for partition, offset, value in read.records:
                tp, frozen = (read.topic, partition), _freeze(value)
                if frozen not in final_values[tp] and (*tp, frozen) not in reported:
                    reported.add((*tp, frozen))
                    findings.add(
                        "lost-read",
                        {
                            "topic": read.topic,
                            "partition": partition,
                            "offset": offset,
                            "value": value,
                            "read": read.event.index,
                        },
                    )
    _check_aborted_reads(reads, attempts, findings)
    version_order = {
        tp: {o: i for i, o in enumerate(sorted(offsets))} for tp, offsets in log.items()
    }
    _check_poll_order(ordered, reads, version_order, findings)
    _check_send_order(sends, findings)

    return findings.result(
        {
            "sends": {
                kind: sum(1 for types in attempts.values() for t in types if t == kind)
                for kind in (OK, FAIL, INFO, INVOKE)
            },
            "polls": sum(1 for read in reads if not read.final),
            "final_polls": sum(1 for read in reads if read.final),
            "records_read": sum(len(read.records) for read in reads),
            "partitions": len(log),
            "unseen_checked": unseen_checked,
            "client_resends": len(resends),
            "client_resend_examples": resends[:MAX_EXAMPLES],
        }
    )


def _sends(
    history: History, findings: _Findings
) -> tuple[list[_Send], dict[tuple[str, Hashable], list[str]]]:
    """ok sends, and (topic, value) -> outcome of every attempt to send it."""
    operations = _send_operations(history)
    sends: list[_Send] = []
    attempts: dict[tuple[str, Hashable], list[str]] = defaultdict(list)
    for invoke, done in operations:
        event = done if done is not None else invoke
        assert event is not None
        value = {**(invoke.value if invoke else {}), **(done.value if done else {})}
        try:
            topic = _required(value, "topic")
            record = value["value"]
            attempts[(topic, _freeze(record))].append(done.type if done else INVOKE)
            if done is not None and done.type == OK:
                sends.append(
                    _Send(
                        topic=topic,
                        partition=int(value["partition"]),
                        offset=None if value.get("offset") is None else int(value["offset"]),
                        value=record,
                        process=event.process,
                        order_at=invoke.at if invoke else done.at,
                        event=done,
                    )
                )
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
    return sends, attempts


def _send_operations(history: History) -> list[tuple[Event | None, Event | None]]:
    """Each send's invoke and completion, matched by (process, topic, value). A producer has
    many sends in flight and its delivery reports come in any order: ``History.pairs`` matches
    by order, and joined half of a real run's sends to another record's invoke."""
    waiting: dict[tuple[str, Hashable], deque[Event]] = defaultdict(deque)
    operations: list[tuple[Event | None, Event | None]] = []
    for event in history.ops("send"):
        try:
            key = (event.process, _freeze((event.value["topic"], event.value["value"])))
        except _PARSE_ERRORS:
            operations.append((event, None) if event.type == INVOKE else (None, event))
            continue
        if event.type == INVOKE:
            waiting[key].append(event)
            continue
        invokes = waiting.get(key)
        operations.append((invokes.popleft() if invokes else None, event))
    operations += [(invoke, None) for invokes in waiting.values() for invoke in invokes]
    return operations


def _reads(ordered: Iterable[Event], findings: _Findings) -> list[_Read]:
    reads: list[_Read] = []
    for event in ordered:
        final = event.f == FINAL_POLL_F
        if event.type != OK or not (final or event.f in POLL_FS):
            continue
        try:
            topic = _required(event.value, "topic")
            reads.append(_Read(topic, _records(event.value), final, event))
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
    return reads


def _log_copies(
    history: History, findings: _Findings
) -> dict[tuple[str, int, Hashable], dict[int, tuple[int, int]]]:
    """(topic, partition, value) -> offset -> (producer id, epoch) of that copy."""
    copies: dict[tuple[str, int, Hashable], dict[int, tuple[int, int]]] = {}
    for event in history.ops(LOG_COPIES_F):
        try:
            value = event.value
            copies[(str(value["topic"]), int(value["partition"]), _freeze(value["value"]))] = {
                int(c["offset"]): (int(c["producer_id"]), int(c["producer_epoch"]))
                for c in value["copies"]
            }
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
    return copies


def _resent(at_offsets: list[int], sessions: Mapping[int, tuple[int, int]] | None) -> bool:
    """Each copy, in offset order, written by a newer producer session than the one before.

    Producer ids only grow (``ProducerIdManager``) and an epoch bump keeps the id: a newer
    session compares greater. A non-idempotent producer (id -1) never qualifies."""
    if sessions is None or any(o not in sessions for o in at_offsets):
        return False
    ordered = [sessions[o] for o in sorted(at_offsets)]
    return ordered[0][0] >= 0 and all(a < b for a, b in pairwise(ordered))


def _check_log(
    log: Mapping[_TopicPartition, Mapping[int, Mapping[Hashable, Any]]],
    copies: Mapping[tuple[str, int, Hashable], Mapping[int, tuple[int, int]]],
    findings: _Findings,
) -> list[dict[str, Any]]:
    """inconsistent-offsets and duplicate; the duplicates a client resent (``_resent``)."""
    resends: list[dict[str, Any]] = []
    for (topic, partition), offsets in sorted(log.items()):
        where: dict[Hashable, list[int]] = defaultdict(list)
        for offset, values in sorted(offsets.items()):
            if len(values) > 1:
                findings.add(
                    "inconsistent-offsets",
                    {
                        "topic": topic,
                        "partition": partition,
                        "offset": offset,
                        "values": list(values.values()),
                    },
                )
            for frozen in values:
                where[frozen].append(offset)
        for frozen, at_offsets in where.items():
            if len(at_offsets) > 1:
                sessions = copies.get((topic, partition, frozen))
                example = {
                    "topic": topic,
                    "partition": partition,
                    "value": offsets[at_offsets[0]][frozen],
                    "offsets": at_offsets,
                    "sessions": None if sessions is None else [sessions.get(o) for o in at_offsets],
                }
                if _resent(at_offsets, sessions):
                    resends.append(example)
                else:
                    findings.add("duplicate", example)
    return resends


def _check_aborted_reads(
    reads: list[_Read], attempts: Mapping[tuple[str, Hashable], list[str]], findings: _Findings
) -> None:
    reported: set[tuple[str, Hashable]] = set()
    for read in reads:
        for partition, offset, value in read.records:
            key = (read.topic, _freeze(value))
            outcomes = attempts.get(key)
            if key in reported:
                continue
            if not outcomes:
                reported.add(key)
                findings.add(
                    "unexpected",
                    {
                        "topic": read.topic,
                        "partition": partition,
                        "offset": offset,
                        "value": value,
                        "read": read.event.index,
                    },
                )
            elif all(t == FAIL for t in outcomes):
                reported.add(key)
                findings.add(
                    "aborted-read",
                    {
                        "topic": read.topic,
                        "partition": partition,
                        "offset": offset,
                        "value": value,
                        "read": read.event.index,
                    },
                )


def _check_poll_order(
    ordered: list[Event],
    reads: list[_Read],
    version_order: Mapping[_TopicPartition, Mapping[int, int]],
    findings: _Findings,
) -> None:
    polls = {read.event.index: read for read in reads if not read.final}
    # process -> (topic, partition) -> (offset, event index) of its last record.
    last: dict[str, dict[_TopicPartition, tuple[int, int]]] = defaultdict(dict)
    generation: dict[str, Any] = {}
    for event in ordered:
        process = event.process
        if event.type in (INVOKE, FAIL):
            continue
        if event.f in REBALANCE_ALL_FS:
            last.pop(process, None)
        elif event.f in REBALANCE_LISTED_FS:
            _forget_listed(last[process], event.value)
        elif event.f in ("start", "stop") and event.value.get("fault") == "clients":
            for target in event.value.get("targets") or []:
                last.pop(str(target), None)
        elif event.index in polls:
            read = polls[event.index]
            polled_generation = event.value.get("generation")
            if polled_generation is not None:
                if generation.get(process, polled_generation) != polled_generation:
                    last.pop(process, None)
                generation[process] = polled_generation
            for partition, offset, _ in read.records:
                tp = (read.topic, partition)
                previous = last[process].get(tp)
                last[process][tp] = (offset, event.index)
                if previous is None:
                    continue
                order = version_order[tp]
                delta = order[offset] - order[previous[0]]
                if delta == 1:
                    continue
                example = {
                    "process": process,
                    "topic": read.topic,
                    "partition": partition,
                    "offsets": [previous[0], offset],
                    "events": [previous[1], event.index],
                }
                if delta > 1:
                    skipped = sorted(o for o in order if previous[0] < o < offset)
                    findings.add("poll-skip", {**example, "skipped": skipped[:MAX_EXAMPLES]})
                else:
                    findings.add("nonmonotonic-poll", example)


def _forget_listed(last: dict[_TopicPartition, tuple[int, int]], value: Mapping[str, Any]) -> None:
    listed = value.get("partitions")
    topic = _topic(value)
    if listed is None:
        last.clear()
        return
    partitions = {int(p) for p in listed}
    for tp in [tp for tp in last if tp[1] in partitions and topic in (None, tp[0])]:
        del last[tp]


def _check_send_order(sends: list[_Send], findings: _Findings) -> None:
    last: dict[tuple[str, _TopicPartition], _Send] = {}
    for send in sorted(sends, key=lambda s: s.order_at):
        if send.offset is None:
            continue
        key = (send.process, (send.topic, send.partition))
        previous = last.get(key)
        last[key] = send
        if previous is not None and previous.offset is not None and send.offset <= previous.offset:
            findings.add(
                "nonmonotonic-send",
                {
                    "process": send.process,
                    "topic": send.topic,
                    "partition": send.partition,
                    "offsets": [previous.offset, send.offset],
                    "sends": [previous.event.index, send.event.index],
                },
            )


# ---------------------------------------------------------------------------------------------
# Liveness


def check_consumed(history: History) -> CheckResult:
    """unconsumed (groups workload)."""
    findings = _Findings("consumed")
    sends, _ = _sends(history, findings)
    consumed: dict[tuple[str, str], set[Hashable]] = defaultdict(set)
    for event in history.ops("consume"):
        if event.type != OK:
            continue
        try:
            group, topic = _required(event.value, "group"), _required(event.value, "topic")
            consumed[(group, topic)].update(_freeze(v) for _p, _o, v in _records(event.value))
        except _PARSE_ERRORS as error:
            findings.malformed(event, error)
    groups = {
        str(e.value.get("group"))
        for e in history.ops("describe", OK)
        if e.process == FINAL_PROCESS and e.value.get("members")
    }
    groups.update(group for group, _topic_name in consumed)
    topics = {send.topic for send in sends}
    for group in sorted(groups):
        for send in sends:
            if _freeze(send.value) not in consumed[(group, send.topic)]:
                findings.add(
                    "unconsumed",
                    {
                        "group": group,
                        "topic": send.topic,
                        "partition": send.partition,
                        "offset": send.offset,
                        "value": send.value,
                        "send": send.event.index,
                    },
                )
    return findings.result(
        {"groups": len(groups), "topics": len(topics), "acknowledged_sends": len(sends)}
    )


def check_liveness(
    history: History, *, commit_within_s: float = DEFAULT_COMMIT_WITHIN_S
) -> CheckResult:
    """no-commit-after-heal, no-send-after-heal."""
    findings = _Findings("liveness")
    ordered = _in_time_order(history)
    heals = [e for e in ordered if e.f == "heal"]
    commits = [e for e in ordered if e.f in COMMIT_FS and e.type == OK]
    sends = [e for e in ordered if e.f == "send" and e.type == OK]
    recovery_s = _after_each_heal(
        "no-commit-after-heal", heals, commits, ordered, within_s=commit_within_s, findings=findings
    )
    # Only when the run has producers: a run whose producers died (or hung) before the faults
    # passed on the runner's own probe commits alone.
    send_recovery_s = (
        _after_each_heal(
            "no-send-after-heal",
            heals,
            sends,
            ordered,
            within_s=commit_within_s,
            findings=findings,
        )
        if history.ops("send")
        else []
    )
    return findings.result(
        {
            "heals": len(heals),
            "acknowledged_commits": len(commits),
            "acknowledged_sends": len(sends),
            "recovery_s": recovery_s,
            "max_recovery_s": max(recovery_s, default=None),
            "max_send_recovery_s": max(send_recovery_s, default=None),
        }
    )


def check_fencing(history: History) -> CheckResult:
    """``false-fencing``: a node fenced for a pause shorter than the session timeout (DESIGN
    §8: faster failure detection "with no false fencing under the chaos suite's pauses
    shorter than the session timeout"), as the runner's ``fencing-watch`` events saw it: the
    node unfenced when the pause began, fenced while it held or before a second past a session
    timeout from its start. A watch no node answered is counted, not judged."""
    findings = _Findings("fencing")
    watches = [e for e in _in_time_order(history) if e.f == FENCING_WATCH_F]
    unanswered = 0
    for event in watches:
        try:
            answers = int(event.value["answers"])
            at_start = event.value["fenced_at_start"]
            seen_after_s = event.value["fenced_seen_after_s"]
        except _PARSE_ERRORS as e:
            findings.malformed(event, e)
            continue
        if not answers:
            unanswered += 1
        elif at_start is False and seen_after_s is not None:
            findings.add("false-fencing", {"event": event.index, **event.value})
    return findings.result({"short_pauses_watched": len(watches), "unanswered": unanswered})


def _after_each_heal(
    anomaly: str,
    heals: list[Event],
    acks: list[Event],
    ordered: list[Event],
    *,
    within_s: float,
    findings: _Findings,
) -> list[float]:
    """Seconds from each heal to the first of ``acks`` after it; ``anomaly`` for a heal with
    none within ``within_s``."""
    ack_ats = [e.at for e in acks]
    end_time = ordered[-1].time if ordered else 0.0
    recovery_s: list[float] = []
    for heal in heals:
        i = bisect_right(ack_ats, heal.at)
        first = acks[i] if i < len(acks) else None
        if first is not None and first.time - heal.time <= within_s:
            recovery_s.append(round(first.time - heal.time, 3))
            continue
        findings.add(
            anomaly,
            {
                "heal": heal.index,
                "heal_time": heal.time,
                "first_ack_after_s": None if first is None else round(first.time - heal.time, 3),
                "history_ends_after_s": round(end_time - heal.time, 3),
                "bound_s": within_s,
            },
        )
    return recovery_s


# ---------------------------------------------------------------------------------------------
# Everything


def check_progress(history: History, workload: str) -> CheckResult:
    """no-acknowledged-send, no-member-commit, unrecorded-report, client-exited."""
    findings = _Findings("progress")
    sends = [e for e in history.ops("send") if e.type == OK]
    commits = [e for e in history.ops("commit") if e.type == OK]
    if not sends:
        findings.add("no-acknowledged-send", {})
    if workload == "groups":
        committed_groups = {e.value.get("group") for e in commits if isinstance(e.value, dict)}
        member_groups = {
            e.value["cfg"]["group"]
            for e in history.ops("process-start")
            if e.value.get("module") == MEMBER_MODULE and e.value.get("cfg", {}).get("group")
        }
        if not commits:
            findings.add("no-member-commit", {})
        for group in sorted(member_groups - committed_groups):
            findings.add("no-member-commit", {"group": group})
    for event in history.ops(UNRECORDED_REPORT_F):
        findings.add(
            "unrecorded-report", {"event": event.index, "process": event.process, **event.value}
        )
    for event in history.ops(PROCESS_EXIT_F):
        findings.add(
            "client-exited", {"event": event.index, "process": event.process, **event.value}
        )
    return findings.result({"acknowledged_sends": len(sends), "member_commits": len(commits)})


def check_all(
    history: History,
    workload: str,
    *,
    commit_within_s: float = DEFAULT_COMMIT_WITHIN_S,
    stable_within_s: float = DEFAULT_STABLE_WITHIN_S,
    partitions_by_topic: Mapping[str, int] | None = None,
) -> dict[str, CheckResult]:
    """Every checker that applies to ``workload`` ("groups" or "queue"), by name."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, not {workload!r}")
    liveness = check_liveness(history, commit_within_s=commit_within_s)
    progress = check_progress(history, workload)
    fencing = check_fencing(history)
    if workload == "groups":
        return {
            "offsets": check_offsets(history),
            "groups": check_groups(
                history,
                stable_within_s=stable_within_s,
                partitions_by_topic=partitions_by_topic,
            ),
            "records": check_queue(history, require_final_poll=False),
            "consumed": check_consumed(history),
            "liveness": liveness,
            "progress": progress,
            "fencing": fencing,
        }
    return {
        "queue": check_queue(history),
        "liveness": liveness,
        "progress": progress,
        "fencing": fencing,
    }


def all_valid(results: Mapping[str, CheckResult]) -> bool:
    return all(result.valid for result in results.values())


def results_as_dict(results: Mapping[str, CheckResult]) -> dict[str, Any]:
    """``{"valid": bool, "checkers": {name: CheckResult.as_dict()}}``, ready for json.dump."""
    return {
        "valid": all_valid(results),
        "checkers": {name: result.as_dict() for name, result in results.items()},
    }
