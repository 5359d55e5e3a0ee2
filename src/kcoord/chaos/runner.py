"""The chaos runner: ``kcoord chaos run --nemesis ... --workload ... --duration S --seed N``.

A run, reproducible from its seed; the cluster's own timing is not. The schedule (each quiet
interval, nemesis and hold time) is one ``random.Random(seed)`` stream that draws the same
values at every step whatever the fault found, and each fault's targets come from a stream of
their own seeded from it: a fault skipped for want of a target, or a target lookup that drew
more or less, leaves every later step of the schedule as it was:

1. **Lab.** The outer process creates the network namespace ``kcoord-lab-<seed>`` and runs the
   rest of the run inside it (``ip netns exec``), then kills whatever is left in it and deletes
   it, also when the run fails or is interrupted (SIGINT/SIGTERM).
2. **Cluster.** Three nodes on 127.0.0.1-3, each with a group id of its own for the iptables
   owner match (``kcoord.chaos.lab``), data and logs under the report directory.
3. **Workload.** Real clients in their own processes (``kcoord.chaos.workload``) until the
   groups have settled.
4. **Faults.** Until the duration is over: a quiet interval (exponential, ``--interval`` mean),
   then one fault of a nemesis picked from ``--nemesis`` at random, held for a random time in
   ``--fault-seconds`` (pauses: shorter or longer than the session timeout), then healed; then a
   liveness probe (a simple group's OffsetCommit, retried for up to ``PROBE_TIMEOUT_S``)
   before the next fault. The probe paces the schedule, it does not judge: a cluster that
   acknowledges nothing after a heal fails ``check_liveness``, which counts the members'
   commits too: one group stuck while the others commit does not fail it.
5. **Recovery and final reads.** Everything healed; the cluster back (every node registered,
   every partition with its full ISR); the groups Stable (DescribeGroups), then the producers
   stopped, every acknowledged value consumed, the members stopped and each group's committed
   offsets read (OffsetFetch).
6. **Copies.** The nodes stopped, their logs of the workload's topic are read: each value a
   replica holds twice, with the producer id and epoch of each copy (``kcoord.chaos.copies``).
7. **Verdict.** The checkers (``kcoord.chaos.checkers``) on the history; a table on stdout;
   ``history.jsonl``, ``results.json`` and ``timeline.html`` in the report directory. The exit
   code is 0 only when every checker passes.

``--target compose`` skips steps 1 and 2: ``kcoord.chaos.compose`` runs ``drive`` and
``conclude`` against the running docker-compose cluster, with a ``ChaosLab`` of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kcoord.chaos import checkers, lab, links, nemesis, report
from kcoord.chaos.copies import copies_in_logs
from kcoord.chaos.history import FENCING_WATCH_F, LOG_COPIES_F, History
from kcoord.chaos.links import Links
from kcoord.chaos.workload import (
    GroupsWorkload,
    Leadership,
    QueueWorkload,
    answered_by_a_deposed_coordinator,
    committed_offsets,
    describe_group,
    offsets_leadership,
    read_committed,
)
from kcoord.node import launcher
from kcoord.node.kafka.client import call_once
from kcoord.node.rpc_sync import call_sync

log = logging.getLogger("kcoord.chaos")

NODES = 3
HOSTS = [f"127.0.0.{i + 1}" for i in range(NODES)]
GIDS = [43001 + i for i in range(NODES)]
SESSION_TIMEOUT_MS = 3_000  # the node default (broker.session.timeout.ms)
# FencingWatch: how often it reads the metadata, and how long it goes on after the heal or a
# session timeout from the pause's start, whichever is later (two heartbeat intervals).
FENCING_POLL_S = 0.1
FENCING_GRACE_S = 1.0
# How long the committed-offsets reader waits for each node's view of a group's coordinator.
LEADERSHIP_TIMEOUT_S = 0.5
PROBE_GROUP = "chaos-probe"
PROBE_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 90.0
# The final descriptions: as long as a settle and a describe each had before.
FINAL_DESCRIBE_TIMEOUT_S = 2 * SETTLE_TIMEOUT_S
RECOVERY_TIMEOUT_S = 120.0
FIND_COORDINATOR, OFFSET_COMMIT = 10, 8
# Deliberate bugs the suite must catch: a node config that breaks one guarantee.
BUGS: dict[str, dict[str, Any]] = {
    "ack-before-hw": {"test.bug.ack.before.high.watermark": True},
    "append-twice": {"test.bug.append.twice": True},
}
WORKLOADS: dict[str, type[GroupsWorkload]] = {"groups": GroupsWorkload, "queue": QueueWorkload}


@dataclass
class Options:
    nemeses: list[str]
    workload: str = "groups"
    duration_s: float = 120.0
    seed: int = 0
    report_dir: str = ".kcoord/chaos/run"
    interval_s: float = 8.0  # mean quiet time between faults
    fault_min_s: float = 3.0
    fault_max_s: float = 10.0
    shapes: list[str] = field(default_factory=lambda: list(nemesis.PARTITION_SHAPES))
    rate: int = 40
    inject_bug: str | None = None  # a deliberately broken node build (BUGS), for the suite's test
    faults: int = 0  # filled in by the run

    @classmethod
    def from_json(cls, raw: str) -> Options:
        return cls(**json.loads(raw))


# ---------------------------------------------------------------------------------------------
# Outside the lab.


def run_outside(options: Options) -> int:
    """Create the namespace, run the inner runner in it, always clean up."""
    name = lab.namespace_name(str(options.seed))
    report_dir = Path(options.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    with lab.namespace(name, GIDS) as ns:
        argv = ns.exec_argv(
            [sys.executable, "-m", "kcoord.chaos.runner", "inner", json.dumps(asdict(options))]
        )
        proc = subprocess.Popen(argv, start_new_session=True)

        def forward(signum: int, frame: FrameType | None) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# ---------------------------------------------------------------------------------------------
# Inside the lab.


class RunInterruptedError(BaseException):
    """SIGINT or SIGTERM: the run stops, heals, and still writes its report. Not an
    ``Exception``, as KeyboardInterrupt is not: the handler raises it wherever the run is, most
    often inside a condition being polled, whose ``except Exception`` would take it for "not
    yet" and poll on."""


def _lab_firewall(state: launcher.ClusterState) -> lab.Firewall:
    groups = {n.node_id: n.group for n in state.nodes}
    if None in groups.values():  # group 0 would cut the runner, the clients and the proxy
        raise lab.LabError(f"a lab node runs without a group of its own: {groups}")
    return lab.Firewall(
        {n.node_id: lab.LabNode(n.node_id, n.host, n.group or 0) for n in state.nodes}
    )


class ChaosLab:
    """The running cluster and workload, as the nemeses see them (``nemesis.Lab``)."""

    def __init__(
        self,
        options: Options,
        state: launcher.ClusterState,
        history: History,
        proxied: Links | None = None,
        firewall: nemesis.Partitioner | None = None,
    ) -> None:
        """``firewall``: the lab's iptables one (the default, inside the lab namespace), or
        another target's (compose: its proxies)."""
        self.options = options
        self.state = state
        self.history = history
        self.schedule = random.Random(options.seed)
        # The current fault's targets (the Lab protocol's rng): run_faults seeds a new one from
        # the schedule before each fault.
        self.rng = random.Random(options.seed)
        self.firewall: nemesis.Partitioner = (
            firewall if firewall is not None else _lab_firewall(state)
        )
        self.processes: nemesis.Processes = nemesis.LocalProcesses()
        self.session_timeout_ms = SESSION_TIMEOUT_MS
        self.workload: GroupsWorkload | None = None
        self._links = proxied

    @property
    def links(self) -> Links | None:
        return self._links

    def nodes(self) -> list[launcher.NodeProcess]:
        return list(self.state.nodes)

    def restart(self, node: launcher.NodeProcess) -> None:
        if not launcher.is_alive(node.pid, node.config_path):
            launcher.start_node(node)
            self.state.save()

    def groups(self) -> list[str]:
        return self.workload.groups() if self.workload else []

    def kill_client(self) -> str | None:
        return self.workload.kill_client(self.rng) if self.workload else None

    @property
    def bootstrap(self) -> str:
        if self._links is not None:
            return links.bootstrap(self.state)
        return self.state.bootstrap_servers

    def recovered(self) -> bool:
        return cluster_recovered(self)

    def fenced_brokers(self, excluding: int, timeout_s: float) -> set[int] | None:
        """The brokers the metadata holds fenced, as the first node other than ``excluding``
        to answer sees them; None when none answers. Not a node still catching up after its
        start (not serving yet): it answers from its own old log, and seed 4333's node 1,
        restarted from a snapshot taken while node 3 was fenced, showed node 3 fenced during
        a short pause of node 3 that fenced nobody."""
        for node in self.nodes():
            if node.node_id == excluding:
                continue
            try:
                view = call_sync(node.host, node.rpc_port, "DescribeNode", {}, timeout_s)
            except Exception:  # down, cut off or slow: ask the next one
                continue
            if not view.get("serving", True):
                continue
            return {int(b) for b, info in view["brokers"].items() if info["fenced"]}
        return None


class FencingWatch:
    """DESIGN §8: a pause shorter than the session timeout fences nobody. While such a pause
    holds, and until ``FENCING_GRACE_S`` past a session timeout from its start (a node whose
    heartbeats stayed late after the heal is fenced by then), the runner polls the other
    nodes' metadata for the paused node's registration; the summary goes into the history as
    a ``fencing-watch`` event, which ``checkers.check_fencing`` reads. The node's state at the
    first answer is its state at the start: a watch no node answered at first judges less."""

    def __init__(self, chaos: ChaosLab, node_id: int) -> None:
        self.chaos = chaos
        self.node_id = node_id
        self.started = time.monotonic()
        self.polls = self.answers = 0
        self.fenced_at_start: bool | None = None
        self.fenced_seen_after_s: float | None = None

    def until(self, end: float) -> None:
        """Poll until the monotonic time ``end`` (never later: a slow answer is cut short)."""
        while (now := time.monotonic()) < end:
            fenced = self.chaos.fenced_brokers(self.node_id, min(0.5, end - now))
            self.polls += 1
            if fenced is not None:
                self.answers += 1
                is_fenced = self.node_id in fenced
                if self.fenced_at_start is None:
                    self.fenced_at_start = is_fenced
                elif is_fenced and self.fenced_seen_after_s is None:
                    self.fenced_seen_after_s = round(time.monotonic() - self.started, 3)
            time.sleep(max(0.0, min(FENCING_POLL_S, end - time.monotonic())))  # the interval

    def summary(self, hold_s: float) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "hold_s": hold_s,
            "session_timeout_ms": self.chaos.session_timeout_ms,
            "polls": self.polls,
            "answers": self.answers,
            "fenced_at_start": self.fenced_at_start,
            "fenced_seen_after_s": self.fenced_seen_after_s,
        }


def _short_pause_target(fault: nemesis.Fault) -> int | None:
    """The node of a pause shorter than the session timeout, which must not be fenced."""
    if fault.name != "pause" or fault.detail.get("longer_than_session_timeout", True):
        return None
    return int(fault.targets[0])


def poll_until(what: str, condition: Callable[[], Any], deadline_s: float) -> Any:
    """Poll ``condition`` (exceptions count as "not yet") until truthy or the deadline."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = condition()
        except Exception as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.2)  # the polling interval
    raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}; last: {last!r}")


def progress(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def probe_commit(chaos: ChaosLab, deadline_s: float = PROBE_TIMEOUT_S) -> bool:
    """Liveness: a simple group's OffsetCommit, retried until one is acknowledged."""
    history = chaos.history
    end = time.monotonic() + deadline_s
    attempt = 0
    while time.monotonic() < end:
        attempt += 1
        value = {"group": PROBE_GROUP, "attempt": attempt}
        history.add("probe", "invoke", "probe-commit", value)
        error, sent = _probe_once(chaos, attempt)
        if error is None:
            history.add("probe", "ok", "probe-commit", value)
            return True
        # A request sent and not answered may have been applied: info, as Jepsen has it.
        history.add("probe", "info" if sent else "fail", "probe-commit", {**value, "error": error})
        time.sleep(0.25)  # a client's retry backoff
    return False


def _probe_once(chaos: ChaosLab, attempt: int) -> tuple[str | None, bool]:
    """(the error, None when acknowledged; whether the OffsetCommit may have been sent)."""
    nodes = nemesis.alive_in(chaos)
    coordinator = nemesis.coordinator_id(nodes, PROBE_GROUP)
    if coordinator is None:
        return "no coordinator", False
    node = chaos.state.node(coordinator)
    try:
        response = call_once(
            node.host,
            node.kafka_port,
            OFFSET_COMMIT,
            8,
            {
                "group_id": PROBE_GROUP,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [
                    {
                        # A topic that exists: commits for unknown ones are refused.
                        "name": chaos.workload.topic if chaos.workload else "chaos-probe",
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": attempt,
                                "committed_leader_epoch": -1,
                                "committed_metadata": "",
                            }
                        ],
                    }
                ],
            },
            timeout_s=5.0,
        )
    except (OSError, ConnectionError) as e:
        return f"{type(e).__name__}: {e}", True
    code = int(response.topics[0].partitions[0].error_code)
    return (None if code == 0 else f"error code {code}"), False


def cluster_recovered(chaos: ChaosLab) -> bool:
    """Every node alive, registered and unfenced, every partition led with its full ISR."""
    nodes = chaos.nodes()
    if not all(launcher.is_alive(n.pid, n.config_path) for n in nodes):
        return False
    views = [call_sync(n.host, n.rpc_port, "DescribeNode", {"topics": True}, 2.0) for n in nodes]
    controllers = {v["controller_id"] for v in views}
    if len(controllers) != 1 or None in controllers:
        return False
    view = next(v for v in views if v["node_id"] == next(iter(controllers)))
    if any(b["fenced"] for b in view["brokers"].values()) or len(view["brokers"]) < len(nodes):
        return False
    return all(
        p["leader"] >= 0 and sorted(p["isr"]) == sorted(p["replicas"])
        for t in view["topics"].values()
        for p in t["partitions"]
    )


@contextlib.contextmanager
def reading_commits(chaos: ChaosLab, every_s: float = 1.0) -> Iterator[None]:
    """While faults are on, read each group's committed offsets about once a second (through
    any node the admin client reaches): a read sent after an acknowledgement must see it, which
    catches acknowledgements a failover loses even when later commits would hide it.

    A read answered by a node that another node knows deposed (a later leader epoch of the
    group's partition: ``answered_by_a_deposed_coordinator``) is recorded ``info``, not held to
    that: a node cut off from the controller goes on leading
    what it led until it learns that it was fenced, as a Kafka broker does, and answers from
    the state it had (seed 4055: node 3, fenced 24.4 s into the run and cut off by connection
    resets, learnt it at 25.76 s; at 25.75 s it answered a read without the commit node 2 had
    acknowledged at 24.51 s, with the offset before it)."""
    workload = chaos.workload
    stop = threading.Event()

    # Per group, the latest leadership of its partition any node showed so far.
    known: dict[str, Leadership] = {}

    def learn(group: str, views: Mapping[tuple[str, int], Leadership | None]) -> None:
        for view in views.values():
            if view is not None and (group not in known or view[1] > known[group][1]):
                known[group] = view

    def views_of(group: str, timeout_s: float) -> dict[tuple[str, int], Leadership | None]:
        try:
            return offsets_leadership(chaos.bootstrap, group, timeout_s=timeout_s)
        except Exception:
            return {}  # nothing known of the others: the read is held to them

    def loop() -> None:
        assert workload is not None
        while not stop.wait(every_s):  # the reading interval, or the end of the faults
            for group in workload.groups():
                learn(group, views_of(group, LEADERSHIP_TIMEOUT_S))
                before = known.get(group)  # known before the read was sent
                value = {"group": group, "topic": workload.topic}
                chaos.history.add("reader", "invoke", "committed", value)
                try:
                    offsets, answered_by = read_committed(
                        chaos.bootstrap, group, workload.topic, workload.partitions, 5.0
                    )
                except Exception as e:
                    chaos.history.add("reader", "fail", "committed", {**value, "error": str(e)})
                    continue
                # Stamped when answered, not after the views are asked (up to 1.5 s more):
                # commits sent meanwhile would count as ones the read may have missed.
                answered_at = chaos.history.time_at(time.monotonic())
                after = views_of(group, LEADERSHIP_TIMEOUT_S)
                learn(group, after)
                if answered_by_a_deposed_coordinator(after.get(answered_by), before):
                    # Not held to the acknowledgements: outcome info (see the docstring).
                    chaos.history.add(
                        "reader",
                        "info",
                        "committed",
                        {
                            **value,
                            "offsets": offsets,
                            "answered_by": f"{answered_by[0]}:{answered_by[1]}",
                            "own_leadership": list(after.get(answered_by) or ()),
                            "known_before": list(before or ()),
                        },
                        time=answered_at,
                    )
                    continue
                chaos.history.add(
                    "reader", "ok", "committed", {**value, "offsets": offsets}, time=answered_at
                )

    if workload is None or isinstance(workload, QueueWorkload):
        yield
        return
    thread = threading.Thread(target=loop, name="committed-reader", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def run_faults(chaos: ChaosLab, stop_at: float) -> int:
    options = chaos.options
    schedule = chaos.schedule
    history = chaos.history
    count = 0
    while True:
        # Every step draws the same four values, whatever its fault finds (see the docstring).
        quiet = schedule.expovariate(1.0 / options.interval_s) if options.interval_s > 0 else 0.0
        kind = schedule.choice(options.nemeses)
        drawn_hold = schedule.uniform(options.fault_min_s, options.fault_max_s)
        chaos.rng = random.Random(schedule.getrandbits(64))
        if time.monotonic() + quiet >= stop_at:
            break
        time.sleep(quiet)  # the schedule's quiet time
        # Jepsen's nemesis operations: the invoke before the fault is put in place, the info
        # once it is in force (what it did), so the fault's window is known to lie between.
        history.add("nemesis", "invoke", "start", {"fault": kind})
        fault = nemesis.start_fault(chaos, kind, options.shapes)
        if fault is None:
            history.add("nemesis", "info", "start", {"fault": kind, "skipped": "no target"})
            progress(f"{kind}: no target now, skipped")
            continue
        count += 1
        hold = float(fault.detail.get("hold_s") or drawn_hold)
        info = {"fault": fault.name, "targets": fault.targets, "detail": fault.detail}
        history.add("nemesis", "info", "start", info)
        progress(f"fault {count}: {fault.name} {fault.targets} {fault.detail} for {hold:.1f} s")
        watched = _short_pause_target(fault)
        watch = None if watched is None else FencingWatch(chaos, watched)
        if watch is None:
            time.sleep(hold)  # the fault's duration
        else:
            watch.until(time.monotonic() + hold)
        history.add("nemesis", "invoke", "stop", {"fault": fault.name})
        fault.heal()
        history.add("nemesis", "info", "stop", info)
        history.add("nemesis", "info", "heal", {"fault": fault.name})
        if watch is not None:
            # A node whose heartbeats stay late after the heal is fenced a session timeout
            # after its last one, which came before the pause: watch until then, and more.
            session_end = watch.started + chaos.session_timeout_ms / 1000
            watch.until(max(time.monotonic(), session_end) + FENCING_GRACE_S)
            history.add("nemesis", "info", FENCING_WATCH_F, watch.summary(hold))
        ok = probe_commit(chaos)
        progress(f"healed {fault.name}; a commit {'was' if ok else 'was NOT'} acknowledged")
    return count


def settle_groups(chaos: ChaosLab, workload: GroupsWorkload) -> None:
    """Until every group's live members report one generation and cover the topic (queue:
    until every consumer has read something)."""

    def settled() -> bool:
        if isinstance(workload, QueueWorkload):
            polled = {e.process for e in chaos.history.ops("poll")}
            return {p.name for p in workload.members()} <= polled
        return all(group_settled(chaos.history, workload, group) for group in workload.groups())

    poll_until("the groups to settle", settled, SETTLE_TIMEOUT_S)


def describe_groups_once_settled(chaos: ChaosLab, workload: GroupsWorkload) -> None:
    """Each group's final ``describe``, taken as soon as that group is Stable at the coordinator
    *and* every live member has reported that assignment (``_final_describe``): the described
    state is the final one the checkers judge, and its time is when the group settled
    (``not-stable-after-heal`` bounds it). The groups are watched together: one that never
    settles no longer holds the others' descriptions back until it times out (one stuck member
    of one group made every group "late")."""
    history = chaos.history
    pending = list(workload.groups())
    last_error: dict[str, str] = {}

    def all_described() -> bool:
        for group in list(pending):
            try:
                described = _final_describe(chaos, workload, group)
            except Exception as e:  # the coordinator did not answer: not yet
                last_error[group] = repr(e)[:300]
                continue
            if described is not None:
                history.add("checker", "ok", "describe", described)
                pending.remove(group)
        return not pending

    with contextlib.suppress(TimeoutError):
        poll_until("every group Stable", all_described, FINAL_DESCRIBE_TIMEOUT_S)
    for group in pending:
        history.add(
            "checker",
            "fail",
            "describe",
            {
                "group": group,
                "error": f"not Stable with its members' assignment after "
                f"{FINAL_DESCRIBE_TIMEOUT_S:.0f} s; last error: {last_error.get(group)}",
            },
        )


def group_settled(history: History, workload: GroupsWorkload, group: str) -> bool:
    return _settled_assignments(history, workload, group) is not None


def _settled_assignments(
    history: History, workload: GroupsWorkload, group: str
) -> dict[str, dict[str, Any]] | None:
    """Each live member's last reported assignment, when they share one generation and cover
    the topic; else None."""
    live = {p.name for p in workload.members() if p.cfg.get("group") == group}
    last: dict[str, dict[str, Any]] = {}
    for event in history.ops("assignment"):
        if event.value.get("group") == group and event.process in live:
            last[event.process] = event.value
    if set(last) != live or not live:
        return None
    generations = {v["generation"] for v in last.values()}
    owned = [p for v in last.values() for p in v["partitions"]]
    if len(generations) == 1 and sorted(owned) == list(range(workload.partitions)):
        return last
    return None


def _final_describe(chaos: ChaosLab, workload: GroupsWorkload, group: str) -> dict[str, Any] | None:
    """The coordinator's Stable description of the group, when it is the state the members last
    reported: the same member ids, and no member reported anything while it was asked for.

    The members' reports can be older than the coordinator's state: a member whose session
    ran out during a fault still shows its old assignment until it learns it was removed, while
    the coordinator already has a Stable group without it. Describing only then would hand the
    checkers a final state the members never reached."""
    before = _settled_assignments(chaos.history, workload, group)
    if before is None:
        return None
    described = _stable(chaos.bootstrap, group)
    if described is None or _settled_assignments(chaos.history, workload, group) != before:
        return None
    reported = {str(v["member_id"]) for v in before.values()}
    return described if set(described["members"]) == reported else None


def heal_and_recover(chaos: ChaosLab) -> None:
    history = chaos.history
    chaos.firewall.heal()
    for n in chaos.nodes():
        chaos.processes.resume(n)
        chaos.restart(n)
    history.add("nemesis", "info", "heal", {"fault": "all"})
    progress("healed everything; waiting for the cluster to recover")
    poll_until("the cluster to recover", chaos.recovered, RECOVERY_TIMEOUT_S)
    probe_commit(chaos, RECOVERY_TIMEOUT_S)


def final_queue_phase(chaos: ChaosLab, workload: QueueWorkload) -> None:
    heal_and_recover(chaos)
    progress("cluster recovered; stopping the producers, then the final polls")
    workload.stop_producers()
    workload.final_poll()
    workload.stop()


def final_phase(chaos: ChaosLab, workload: GroupsWorkload) -> None:
    history = chaos.history
    heal_and_recover(chaos)
    progress("cluster recovered; waiting for the groups to settle")
    describe_groups_once_settled(chaos, workload)
    workload.stop_producers()
    acked = {e.value["value"] for e in history.ops("send") if e.type == "ok"}
    for group in workload.groups():
        try:
            poll_until(
                f"{group} to consume every acknowledged value",
                lambda g=group: acked <= _consumed(history, g),  # type: ignore[misc]
                SETTLE_TIMEOUT_S,
            )
        except TimeoutError as e:
            progress(str(e).split("; last")[0])
    # Let the members commit what they processed, then stop them cleanly.
    with contextlib.suppress(TimeoutError):
        poll_until("the last commits", lambda: _commits_caught_up(history, workload), 30.0)
    workload.stop()
    for group in workload.groups():
        # With its invoke: regressed-read compares it with every earlier read.
        history.add("checker", "invoke", "committed", {"group": group, "topic": workload.topic})
        offsets = poll_until(
            f"OffsetFetch of {group}",
            lambda g=group: (  # type: ignore[misc]
                committed_offsets(chaos.bootstrap, g, workload.topic, workload.partitions),
            ),
            60.0,
        )[0]
        history.add(
            "checker",
            "ok",
            "committed",
            {"group": group, "topic": workload.topic, "offsets": offsets},
        )


def _stable(bootstrap: str, group: str) -> dict[str, Any] | None:
    described = describe_group(bootstrap, group)
    return described if described["state"] == "Stable" else None


def _consumed(history: History, group: str) -> set[str]:
    return {
        r[2]
        for e in history.ops("consume")
        if e.value.get("group") == group
        for r in e.value["records"]
    }


def _commits_caught_up(history: History, workload: GroupsWorkload) -> bool:
    """Every group's acknowledged commits reach the end of what it consumed."""
    for group in workload.groups():
        consumed: dict[str, int] = {}
        for e in history.ops("consume"):
            if e.value.get("group") == group:
                for p, o, _ in e.value["records"]:
                    consumed[str(p)] = max(consumed.get(str(p), 0), int(o) + 1)
        committed: dict[str, int] = {}
        for e in history.ops("commit"):
            if e.type == "ok" and e.value.get("group") == group:
                for p, o in e.value["offsets"].items():
                    committed[p] = max(committed.get(p, 0), int(o))
        if any(committed.get(p, 0) < o for p, o in consumed.items()):
            return False
    return True


@contextlib.contextmanager
def cluster(options: Options, root: Path) -> Iterator[tuple[launcher.ClusterState, Links | None]]:
    """The nodes, behind the fault proxy when a proxied nemesis is selected."""
    # A fresh namespace; below the ephemeral range, so restarted nodes find their ports free.
    base_port = 10000 + random.Random(options.seed).randrange(0, 20000, 10)
    overrides: dict[str, Any] = {
        "group.initial.rebalance.delay.ms": 0,
        # KIP-848 members: sessions as short as the classic members' (Kafka's are 45 s / 5 s,
        # and no less than 45 s / 5 s: the bounds come down with them).
        "group.consumer.session.timeout.ms": 6_000,
        "group.consumer.min.session.timeout.ms": 6_000,
        "group.consumer.heartbeat.interval.ms": 500,
        "group.consumer.min.heartbeat.interval.ms": 500,
        # Snapshot the metadata log every 2 s (the default is 5 min) so that a node brought
        # back after a fault often catches up by installing the leader's snapshot.
        "metadata.log.max.snapshot.interval.ms": 2_000,
        **(BUGS[options.inject_bug] if options.inject_bug else {}),
    }
    planned = launcher.plan(root, NODES, base_port, hosts=HOSTS, groups=GIDS)
    with contextlib.ExitStack() as stack:
        proxied: Links | None = None
        per_node: dict[int, dict[str, Any]] = {}
        if nemesis.PROXIED & set(options.nemeses):
            root.mkdir(parents=True, exist_ok=True)
            proxied = stack.enter_context(
                links.running_proxy(planned, options.seed, root / "proxy.log")
            )
            common, per_node = links.node_overrides(planned, proxied)
            overrides.update(common)
        state = launcher.up(
            root,
            NODES,
            base_port,
            hosts=HOSTS,
            groups=GIDS,
            overrides=overrides,
            node_overrides=per_node,
        )
        stack.callback(_stop_nodes, state)
        yield state, proxied


def _stop_nodes(state: launcher.ClusterState) -> None:
    for n in state.nodes:
        if n.pid is not None and launcher.is_alive(n.pid, n.config_path):  # not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(n.pid, signal.SIGCONT)  # a paused node cannot die
    launcher.stop_all(state.nodes, kill=True)


def prepare_run(options: Options) -> tuple[Path, History, float]:
    """(work directory, history, start time) of a run, with SIGINT/SIGTERM interrupting it."""
    report_dir = Path(options.report_dir)
    work = report_dir / "work"
    shutil.rmtree(work, ignore_errors=True)
    (work / "clients").mkdir(parents=True)
    t0 = time.monotonic()
    history = History(clock=lambda: time.monotonic() - t0, origin=t0)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise RunInterruptedError(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    progress(
        f"seed {options.seed}: workload {options.workload}, nemeses {','.join(options.nemeses)}, "
        f"{options.duration_s:.0f} s; report in {report_dir}"
    )
    if options.workload not in WORKLOADS:
        raise SystemExit(f"unknown workload {options.workload!r}")
    return work, history, time.monotonic()


def run_inside(options: Options) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    work, history, started = prepare_run(options)
    with cluster(options, work / "cluster") as (state, proxied):
        error = drive(ChaosLab(options, state, history, proxied), work / "clients")
    record_copies(history, state)  # the nodes are stopped: their logs hold still
    return conclude(options, history, started, error)


def record_copies(history: History, state: launcher.ClusterState) -> None:
    """A ``log-copies`` event for each value a replica of the workload's topic holds at two
    offsets, with the producer id, epoch and sequence of each copy (``chaos.copies``)."""
    topics = [str(e.value["topic"]) for e in history.ops("topic") if "topic" in e.value]
    data_dirs = [Path(n.directory) / "data" for n in state.nodes]
    for found in copies_in_logs(data_dirs, topics):
        history.add("checker", "info", LOG_COPIES_F, found)


def drive(chaos: ChaosLab, clients_dir: Path, prefix: str = "chaos") -> str | None:
    """The workload under faults, then the final phase, on a running cluster; the run's error
    (None if it ran to the end). Topics and groups are named ``<prefix>-...``."""
    options, history = chaos.options, chaos.history
    error: str | None = None
    workload = WORKLOADS[options.workload](
        chaos.bootstrap,
        history,
        clients_dir,
        prefix=prefix,
        rate=options.rate,
    )
    chaos.workload = workload
    try:
        progress(f"cluster up ({chaos.bootstrap}); starting the workload")
        workload.start()
        history.add(
            "checker",
            "info",
            "topic",
            {"topic": workload.topic, "partitions": workload.partitions},
        )
        settle_groups(chaos, workload)
        progress("groups settled; faults begin")
        with reading_commits(chaos):
            options.faults = run_faults(chaos, time.monotonic() + options.duration_s)
        if isinstance(workload, QueueWorkload):
            final_queue_phase(chaos, workload)
        else:
            final_phase(chaos, workload)
    except RunInterruptedError as e:
        error = f"interrupted ({e})"
    except Exception as e:
        log.exception("the run failed")
        error = f"{type(e).__name__}: {e}"
    finally:
        try:
            chaos.firewall.heal()
        finally:
            # Clients run in sessions of their own: on the compose target nothing else stops
            # them if healing fails (Toxiproxy gone).
            workload.kill_all()
    return error


def conclude(options: Options, history: History, started: float, error: str | None) -> int:
    """The checkers' verdict: history.jsonl, results.json, timeline.html and the table."""
    report_dir = Path(options.report_dir)
    if error is None and options.nemeses and options.faults == 0:
        # A run whose schedule ended before its first fault, or whose nemeses found no
        # target, tested nothing: it passed vacuously.
        error = "no fault was injected (a longer --duration, or nemeses with targets)"
    history.to_jsonl(report_dir / "history.jsonl")
    results = checkers.check_all(history, options.workload)
    verdict = {name: r.as_dict() for name, r in results.items()}
    valid = error is None and all(r.valid for r in results.values())
    summary = {
        "seed": options.seed,
        "inject_bug": options.inject_bug,
        "workload": options.workload,
        "nemeses": options.nemeses,
        "duration_s": options.duration_s,
        # With the seed, what a rerun needs to draw the same schedule.
        "interval_s": options.interval_s,
        "shapes": options.shapes,
        "rate": options.rate,
        "faults": options.faults,
        "elapsed_s": round(time.monotonic() - started, 1),
        "events": len(history),
        "valid": valid,
        "error": error,
        "checkers": verdict,
    }
    (report_dir / "results.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    report.write_timeline(history, report_dir / "timeline.html", title=f"seed {options.seed}")
    print_verdict(summary)
    return 0 if valid else 1


def print_verdict(summary: dict[str, Any]) -> None:
    print()
    print(f"{'checker':<12} {'valid':<6} anomalies")
    for name, result in sorted(summary["checkers"].items()):
        # Every one counted; ``anomalies`` keeps only the first examples of each.
        counts = result["stats"].get("anomaly_counts", {})
        anomalies = ", ".join(
            f"{k} ({counts.get(k, len(v))})" for k, v in sorted(result["anomalies"].items()) if v
        )
        print(f"{name:<12} {'yes' if result['valid'] else 'NO':<6} {anomalies or '-'}")
    for name, result in sorted(summary["checkers"].items()):
        if resends := result["stats"].get("client_resends"):
            print(
                f"note: {name}: {resends} values written twice by a producer that resent them "
                "under a new epoch (librdkafka #4953; chaos/README.md): not anomalies"
            )
    if summary["error"]:
        print(f"run error: {summary['error']}")
    verdict = "PASS" if summary["valid"] else "FAIL"
    print(
        f"{verdict}: seed {summary['seed']}, {summary['faults']} faults, "
        f"{summary['events']} events in {summary['elapsed_s']} s"
    )


# ---------------------------------------------------------------------------------------------
# Command line.


def run_matrix(args: argparse.Namespace) -> int:
    """Each nemesis alone and all of them together, for each workload and seed, one run
    after the other; each run's results.json is kept in ``--out`` (histories stay in the
    scratch report directories), with ``matrix.json`` summing them up."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = [n for n in args.nemeses.split(",") if n]
    combos = [[k] for k in kinds] + ([kinds] if len(kinds) > 1 else [])
    rows: list[dict[str, Any]] = []
    for workload in [w for w in args.workloads.split(",") if w]:
        for nemeses in combos:
            for seed in [int(x) for x in args.seeds.split(",") if x]:
                name = f"{workload}-{'+'.join(nemeses)}-{seed}"
                report_dir = Path(".kcoord/chaos") / name
                options = Options(
                    nemeses=nemeses,
                    workload=workload,
                    duration_s=args.duration,
                    seed=seed,
                    report_dir=str(report_dir),
                    interval_s=args.interval,
                )
                progress(f"matrix: {name}")
                code = run_outside(options)
                results = report_dir / "results.json"
                summary = json.loads(results.read_text()) if results.exists() else {}
                summary["exit_code"] = code
                (out / f"{name}.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
                rows.append(
                    {
                        "run": name,
                        "valid": code == 0,
                        "faults": summary.get("faults"),
                        "anomalies": sorted(
                            a
                            for r in summary.get("checkers", {}).values()
                            for a, found in r.get("anomalies", {}).items()
                            if found
                        ),
                        "error": summary.get("error"),
                    }
                )
    (out / "matrix.json").write_text(json.dumps(rows, indent=2))
    print(f"\n{'run':<40} {'valid':<6} {'faults':<7} anomalies")
    for row in rows:
        anomalies: list[str] = row["anomalies"]
        print(
            f"{row['run']:<40} {'yes' if row['valid'] else 'NO':<6} {row['faults']!s:<7} "
            f"{', '.join(anomalies) or row['error'] or '-'}"
        )
    failed = [r for r in rows if not r["valid"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} runs passed")
    return 1 if failed else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kcoord chaos", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the cluster under faults and check the history")
    run.add_argument("--nemesis", default=",".join(nemesis.NEMESES))
    run.add_argument("--workload", default="groups", choices=sorted(WORKLOADS))
    run.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    run.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    run.add_argument("--report", default=None, help="default: .kcoord/chaos/<workload>-<seed>")
    run.add_argument("--interval", type=float, default=8.0, help="mean quiet seconds")
    run.add_argument("--rate", type=int, default=40, help="producer sends per second")
    run.add_argument(
        "--partition-shapes", default=",".join(nemesis.PARTITION_SHAPES), help="partition targets"
    )
    run.add_argument(
        "--inject-bug",
        choices=sorted(BUGS),
        default=None,
        help="run a deliberately broken node build (the suite's own test)",
    )
    run.add_argument(
        "--target",
        choices=["lab", "compose"],
        default="lab",
        help="lab: local nodes in a network namespace; compose: the running docker-compose "
        "cluster (kcoord.chaos.compose)",
    )
    run.add_argument("--compose-file", default="docker-compose.yml", help="with --target compose")
    matrix = sub.add_parser(
        "matrix", help="every nemesis alone and all together, for each workload and seed"
    )
    matrix.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    matrix.add_argument("--workloads", default="groups,queue")
    matrix.add_argument("--nemeses", default=",".join(nemesis.NEMESES))
    matrix.add_argument("--duration", type=float, default=30.0)
    matrix.add_argument("--interval", type=float, default=5.0)
    matrix.add_argument("--out", default="chaos/results", help="summary JSON per run and overall")
    sub.add_parser("clean", help="remove lab namespaces left behind by killed runs")
    # Not for people (argparse cannot hide a subcommand: SUPPRESS showed as "==SUPPRESS==").
    inner = sub.add_parser("inner", help="internal: one run inside its lab's namespace")
    inner.add_argument("options")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "inner":
        return run_inside(Options.from_json(args.options))
    if args.command == "matrix":
        return run_matrix(args)
    if args.command == "clean":
        for name in lab.stale_namespaces():
            lab.Namespace(name).delete()
            print(f"removed {name}")
        return 0
    nemeses = [n for n in args.nemesis.split(",") if n]
    unknown = sorted(set(nemeses) - set(nemesis.NEMESES))
    if unknown or not nemeses:
        print(f"unknown nemesis {unknown} (known: {', '.join(nemesis.NEMESES)})", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    options = Options(
        nemeses=nemeses,
        workload=args.workload,
        duration_s=args.duration,
        seed=seed,
        report_dir=args.report or f".kcoord/chaos/{args.workload}-{seed}",
        interval_s=args.interval,
        shapes=[s for s in args.partition_shapes.split(",") if s],
        rate=args.rate,
        inject_bug=args.inject_bug,
    )
    if args.target == "compose":
        from kcoord.chaos import compose

        try:
            return compose.run(options, Path(args.compose_file))
        except compose.ComposeError as e:
            print(f"kcoord chaos: {e}", file=sys.stderr)
            return 2
    try:
        return run_outside(options)
    except lab.LabError as e:
        print(f"kcoord chaos: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
