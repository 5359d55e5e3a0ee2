"""The runner's final describe: it is taken only when it is the state the members reported."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kcoord.chaos import checkers, nemesis, runner
from kcoord.chaos import report as chaos_report
from kcoord.chaos.history import FENCING_WATCH_F, History
from kcoord.chaos.runner import ChaosLab
from kcoord.chaos.workload import GroupsWorkload, answered_by_a_deposed_coordinator
from kcoord.node import launcher

GROUP = "g"


def lab_and_workload(history: History) -> tuple[ChaosLab, GroupsWorkload]:
    members = [SimpleNamespace(name=n, cfg={"group": GROUP}) for n in ("a", "b")]
    workload = SimpleNamespace(members=lambda: members, partitions=4)
    lab = SimpleNamespace(history=history, bootstrap="127.0.0.1:1")
    return cast(ChaosLab, lab), cast(GroupsWorkload, workload)


def report(history: History, process: str, generation: int, partitions: list[int]) -> None:
    value = {"group": GROUP, "generation": generation, "member_id": f"{process}-id"}
    history.add(process, "info", "assignment", {**value, "partitions": partitions}, time=0.0)


def settled(*reports: tuple[str, int, list[int]]) -> History:
    """A history where each (member, generation, partitions) was reported, in that order."""
    history = History()
    for process, generation, partitions in reports:
        report(history, process, generation, partitions)
    return history


def describing(monkeypatch: pytest.MonkeyPatch, members: list[str]) -> None:
    described: dict[str, Any] = {"group": GROUP, "state": "Stable", "members": members}
    monkeypatch.setattr(runner, "_stable", lambda bootstrap, group: described)


def test_the_final_describe_is_taken_when_it_matches_the_members_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = settled(("a", 3, [0, 1]), ("b", 3, [2, 3]))
    describing(monkeypatch, ["a-id", "b-id"])
    assert runner._final_describe(*lab_and_workload(history), GROUP) is not None


def test_a_stable_group_without_a_member_that_still_reports_its_assignment_is_not_final(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # b's session ran out during a fault: the coordinator has a Stable group of a alone while
    # both members' last reports still cover the topic in one generation.
    history = settled(("a", 3, [0, 1]), ("b", 3, [2, 3]))
    describing(monkeypatch, ["a-id"])
    assert runner._final_describe(*lab_and_workload(history), GROUP) is None


def test_a_group_whose_members_disagree_is_not_described(monkeypatch: pytest.MonkeyPatch) -> None:
    history = settled(("a", 4, [0, 1, 2, 3]), ("b", 3, [2, 3]))
    describing(monkeypatch, ["a-id", "b-id"])
    assert runner._final_describe(*lab_and_workload(history), GROUP) is None


def test_a_report_arriving_while_the_group_is_described_makes_it_not_final(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = settled(("a", 3, [0, 1]), ("b", 3, [2, 3]))

    def stable_while_b_moves(bootstrap: str, group: str) -> dict[str, Any]:
        report(history, "b", 3, [2])  # b reports mid-describe
        return {"group": GROUP, "state": "Stable", "members": ["a-id", "b-id"]}

    monkeypatch.setattr(runner, "_stable", stable_while_b_moves)
    assert runner._final_describe(*lab_and_workload(history), GROUP) is None


def test_a_group_that_never_settles_does_not_hold_back_the_others_describe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each group is described once it is settled; a stuck one is described as failed at the
    deadline. Before, every group waited for all of them to settle, and one stuck member made
    every group's description late (``not-stable-after-heal``)."""
    history = History(clock=lambda: 0.0)
    workload = SimpleNamespace(groups=lambda: ["stuck", "fine"])
    lab = cast(ChaosLab, SimpleNamespace(history=history))

    def final_describe(chaos: Any, wl: Any, group: str) -> dict[str, Any] | None:
        if group == "stuck":
            raise OSError("its coordinator does not answer")
        return {"group": group, "state": "Stable", "members": ["a-id"]}

    monkeypatch.setattr(runner, "_final_describe", final_describe)
    monkeypatch.setattr(runner, "FINAL_DESCRIBE_TIMEOUT_S", 0.5)
    runner.describe_groups_once_settled(lab, cast(GroupsWorkload, workload))
    described = [(e.type, e.value["group"]) for e in history.ops("describe")]
    assert described == [("ok", "fine"), ("fail", "stuck")]
    failed = next(e for e in history.ops("describe") if e.type == "fail")
    assert "its coordinator does not answer" in failed.value["error"]


def test_a_run_that_injected_no_fault_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its schedule ended before the first fault, or its nemeses found no target: it tested
    nothing, and passed."""
    monkeypatch.setattr(chaos_report, "write_timeline", lambda *args, **kwargs: None)
    verdicts: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "print_verdict", verdicts.append)
    valid = SimpleNamespace(valid=True, as_dict=lambda: {"valid": True})
    monkeypatch.setattr(checkers, "check_all", lambda history, workload: {"x": valid})
    options = runner.Options(nemeses=["kill"], report_dir=str(tmp_path))
    assert runner.conclude(options, History(), 0.0, None) == 1
    assert "no fault was injected" in verdicts[0]["error"]
    options.faults = 2
    assert runner.conclude(options, History(), 0.0, None) == 0


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The runner's clock, moved only by its sleeps; every probe commit succeeds."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=sleep, strftime=time.strftime)
    monkeypatch.setattr(runner, "time", clock)
    monkeypatch.setattr(runner, "probe_commit", lambda chaos: True)
    return now


def test_a_fault_is_invoked_before_it_is_in_force_and_healed_before_its_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jepsen's nemesis operations: the start's invoke comes before the fault is put in place,
    its info after; the stop's invoke before the heal, its info after. The timeline's window
    opens at the invoke."""
    now = fake_clock(monkeypatch)
    history = History(clock=lambda: now[0])
    started: list[int] = []

    def start_fault(chaos: Any, kind: str, shapes: Any) -> Any:
        if started:
            return None  # the second fault finds no target
        now[0] += 0.5  # putting it in place takes time
        history.add("runner", "info", "in-force", {})
        started.append(1)

        def heal() -> None:
            now[0] += 0.25
            history.add("runner", "info", "healed", {})

        return nemesis.Fault("kill", [2], {"hold_s": 3.0}, heal)

    monkeypatch.setattr(nemesis, "start_fault", start_fault)
    options = runner.Options(nemeses=["kill"], interval_s=1.0, seed=3)
    chaos = cast(
        ChaosLab,
        SimpleNamespace(options=options, schedule=random.Random(3), history=history),
    )
    assert runner.run_faults(chaos, stop_at=6.0) == 1

    order = [(e.process, e.type, e.f) for e in history]
    first = [
        ("nemesis", "invoke", "start"),
        ("runner", "info", "in-force"),
        ("nemesis", "info", "start"),
        ("nemesis", "invoke", "stop"),
        ("runner", "info", "healed"),
        ("nemesis", "info", "stop"),
        ("nemesis", "info", "heal"),
    ]
    assert order[: len(first)] == first
    # A start that found no target is an invoke answered as skipped: no window.
    events = list(history)
    skipped = [i for i, e in enumerate(events) if e.f == "start" and e.value.get("skipped")]
    assert skipped
    for i in skipped:
        assert (events[i].type, events[i].value["fault"]) == ("info", "kill")
        assert (events[i - 1].type, events[i - 1].f) == ("invoke", "start")

    invoked = next(e for e in history if e.type == "invoke" and e.f == "start")
    svg = chaos_report.render_timeline(list(history))
    scale = (chaos_report.WIDTH - chaos_report.LEFT - 20) / max(e.time for e in history)
    assert f'<rect x="{chaos_report.LEFT + invoked.time * scale:.1f}"' in svg
    assert svg.count("<rect") == 1


Step = tuple[float, str, float, float | None]  # quiet, nemesis, first target draw, hold


def schedule_of(monkeypatch: pytest.MonkeyPatch, skipping: bool) -> list[Step]:
    """Each step of a 120 s schedule as ``run_faults`` drew it. ``skipping``: the faults of the
    odd steps find no target, and each lookup draws a different number of target choices, as
    a cluster in another state would make them."""
    now = [0.0]
    log: list[tuple[Any, ...]] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        log.append(("sleep", seconds))

    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=sleep, strftime=time.strftime)
    monkeypatch.setattr(runner, "time", clock)
    monkeypatch.setattr(runner, "probe_commit", lambda chaos: True)

    def start_fault(chaos: Any, kind: str, shapes: Any) -> nemesis.Fault | None:
        step = sum(1 for e in log if e[0] == "start")
        draws = [chaos.rng.random() for _ in range(1 + (step % 3 if skipping else 0))]
        in_force = not (skipping and step % 2)
        log.append(("start", kind, draws[0], in_force))
        return nemesis.Fault(kind, [1]) if in_force else None

    monkeypatch.setattr(nemesis, "start_fault", start_fault)
    options = runner.Options(nemeses=["kill", "pause", "partition"], interval_s=2.0, seed=7)
    lab = SimpleNamespace(
        options=options,
        schedule=random.Random(7),
        rng=random.Random(7),
        history=History(clock=lambda: now[0]),
    )
    runner.run_faults(cast(ChaosLab, lab), stop_at=120.0)

    steps: list[Step] = []
    quiet = 0.0
    for i, entry in enumerate(log):
        if entry[0] == "start":
            _, kind, draw, in_force = entry
            steps.append((quiet, kind, draw, log[i + 1][1] if in_force else None))
        elif i == 0 or log[i - 1][0] == "sleep" or not log[i - 1][3]:
            quiet = entry[1]  # a sleep after a hold, or after a skipped start: a quiet time
    return steps


def test_a_skipped_fault_leaves_the_rest_of_the_schedule_as_the_seed_drew_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rerun of a seed draws the same quiet times, nemeses, holds and target streams at every
    step, whatever the faults before found: targets come from a stream of their own."""
    every = schedule_of(monkeypatch, skipping=False)
    some = schedule_of(monkeypatch, skipping=True)
    assert len(every) > 10 and len(some) >= len(every)
    assert {kind for _, kind, _, _ in every} == {"kill", "pause", "partition"}
    for drawn, rerun in zip(every, some, strict=False):
        quiet, kind, draw, hold = rerun
        assert (quiet, kind, draw) == drawn[:3]
        assert hold is None or hold == drawn[3]


def test_an_interrupt_while_a_condition_is_polled_stops_the_poll() -> None:
    """The signal handler's RunInterruptedError lands inside the condition most of the time
    (a blocking call to a node): it ends the poll, where an ordinary error means "not yet"."""
    calls = 0

    def interrupted() -> bool:
        nonlocal calls
        calls += 1
        raise runner.RunInterruptedError("signal 15")

    with pytest.raises(runner.RunInterruptedError):
        runner.poll_until("an interrupted condition", interrupted, deadline_s=5)
    assert calls == 1


def test_a_short_pause_is_watched_for_fencing_without_lengthening_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a pause shorter than the session timeout holds, and one heartbeat interval or two
    after its heal, the runner reads the other nodes' metadata for the paused node's
    registration, until a session timeout from its start and a grace past it; what it saw
    goes into the history (``fencing-watch``), and the pause lasts
    its hold, however the polls go. A longer pause is not watched."""
    now = fake_clock(monkeypatch)
    history = History(clock=lambda: now[0])
    faults = [
        nemesis.Fault("pause", [2], {"longer_than_session_timeout": False, "hold_s": 1.5}),
        nemesis.Fault("pause", [3], {"longer_than_session_timeout": True, "hold_s": 6.0}),
    ]
    monkeypatch.setattr(
        nemesis, "start_fault", lambda chaos, kind, shapes: faults.pop(0) if faults else None
    )
    asked: list[tuple[float, int]] = []
    paused_at = [0.0]

    def fenced_brokers(excluding: int, timeout_s: float) -> set[int] | None:
        asked.append((now[0], excluding))
        now[0] += min(0.04, timeout_s)  # an answer takes time, never past the timeout
        if not any(e.f == "start" and e.type == "info" for e in history):
            return set()
        paused_at[0] = paused_at[0] or now[0]
        return {2} if now[0] - paused_at[0] > 1.0 else set()  # fenced a second in

    options = runner.Options(nemeses=["pause"], interval_s=0.5, seed=3)
    chaos = cast(
        ChaosLab,
        SimpleNamespace(
            options=options,
            schedule=random.Random(3),
            history=history,
            session_timeout_ms=3000,
            fenced_brokers=fenced_brokers,
        ),
    )
    assert runner.run_faults(chaos, stop_at=30.0) == 2

    events = list(history)
    starts = [e for e in events if e.f == "start" and e.type == "info"]
    stops = [e for e in events if e.f == "stop" and e.type == "invoke"]
    assert stops[0].time - starts[0].time == pytest.approx(1.5, abs=1e-9)
    [watch] = [e for e in events if e.f == FENCING_WATCH_F]
    assert watch.value["node"] == 2 and watch.value["fenced_at_start"] is False
    assert watch.value["fenced_seen_after_s"] is not None
    assert watch.value["polls"] == watch.value["answers"] > 10
    # Watched until a session timeout from the pause's start, and the grace past it.
    assert watch.time - starts[0].time == pytest.approx(3.0 + runner.FENCING_GRACE_S, abs=1e-9)
    assert {node for _, node in asked} == {2}  # the longer pause was not watched
    assert not checkers.check_fencing(history).valid


def test_a_read_a_deposed_coordinator_answers_is_not_held_to_the_acknowledgements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 4055: node 3, fenced and not yet aware of it (cut off from the controller), answered
    a mid-run read with the offsets it had, as a deposed Kafka coordinator does; node 2 led at
    a later epoch before the read was sent. Such a read is recorded info, not ok; one the
    coordinator answers stays ok."""
    history = History(clock=time.monotonic)
    answers = iter(
        [({"0": 120}, ("127.0.0.3", 9092)), ({"0": 121}, ("127.0.0.2", 9092))]
        + [({"0": 121}, ("127.0.0.2", 9092))] * 1000
    )
    monkeypatch.setattr(runner, "read_committed", lambda *args: next(answers))
    # Node 3 still shows itself at epoch 6; nodes 1 and 2 know node 2 leads at epoch 7.
    leadership = {("127.0.0.1", 9092): (2, 7), ("127.0.0.2", 9092): (2, 7)}
    leadership[("127.0.0.3", 9092)] = (3, 6)
    monkeypatch.setattr(runner, "offsets_leadership", lambda *args, **kwargs: leadership)
    workload = SimpleNamespace(groups=lambda: [GROUP], topic="t", partitions=1)
    lab = cast(ChaosLab, SimpleNamespace(workload=workload, bootstrap="b", history=history))

    def reads() -> list[Any]:
        return [e for e in history.events() if e.process == "reader" and e.type != "invoke"]

    with runner.reading_commits(lab, every_s=0.01):
        deadline = time.monotonic() + 10
        while len(reads()) < 2:
            assert time.monotonic() < deadline, reads()
            time.sleep(0.01)  # polling for the reader thread
    first, second = reads()[:2]
    assert (first.type, first.value["answered_by"]) == ("info", "127.0.0.3:9092")
    assert (first.value["own_leadership"], first.value["known_before"]) == ([3, 6], [2, 7])
    assert (second.type, second.value["offsets"]) == ("ok", {"0": 121})


def test_only_a_later_epoch_of_another_leader_known_before_the_read_lets_it_off() -> None:
    """The answering node's own view is asked after it answered; the later epoch must have
    been shown before the read was sent (else the answering node may have been the
    coordinator when it answered, and a lost commit would pass), and name another leader
    (an epoch bumped for the same leader deposes nobody). Matrix groups-reset, seed 1: node
    2, the new coordinator, was cut off by the next fault when asked after the read; a
    view taken before it was enough."""
    assert answered_by_a_deposed_coordinator(own=(3, 6), known_before=(2, 7))
    assert not answered_by_a_deposed_coordinator(own=(3, 6), known_before=None)
    assert not answered_by_a_deposed_coordinator(own=None, known_before=(2, 7))
    assert not answered_by_a_deposed_coordinator(own=(2, 7), known_before=(3, 6))
    assert not answered_by_a_deposed_coordinator(own=(2, 7), known_before=(2, 7))
    assert not answered_by_a_deposed_coordinator(own=(3, 6), known_before=(3, 7))


def test_the_reader_holds_a_read_to_an_epoch_learnt_only_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node 2 answers as the coordinator at epoch 7; only after the read does another node
    show epoch 8 (node 1 elected since): the read is held to the acknowledgements."""
    history = History(clock=time.monotonic)
    monkeypatch.setattr(runner, "read_committed", lambda *args: ({"0": 5}, ("127.0.0.2", 9092)))
    asks = iter(
        [{("127.0.0.1", 9092): (2, 7), ("127.0.0.2", 9092): (2, 7)}]  # before the read
        + [{("127.0.0.1", 9092): (1, 8), ("127.0.0.2", 9092): (2, 7)}] * 1000
    )
    monkeypatch.setattr(runner, "offsets_leadership", lambda *args, **kwargs: next(asks))
    workload = SimpleNamespace(groups=lambda: [GROUP], topic="t", partitions=1)
    lab = cast(ChaosLab, SimpleNamespace(workload=workload, bootstrap="b", history=history))
    with runner.reading_commits(lab, every_s=0.01):
        deadline = time.monotonic() + 10
        while not [e for e in history.events() if e.process == "reader" and e.type != "invoke"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)  # polling for the reader thread
    first = next(e for e in history.events() if e.process == "reader" and e.type != "invoke")
    assert first.type == "ok"


def test_a_node_still_catching_up_is_not_asked_who_is_fenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 4333: node 1, restarted from a snapshot taken while node 3 was fenced, answered
    from that old image during a short pause of node 3 (fenced nobody): a false fencing.
    Only a node serving (caught up since its start) is asked."""
    views = {
        1: {"serving": False, "brokers": {"3": {"fenced": True}}},
        2: {"serving": True, "brokers": {"3": {"fenced": False}, "1": {"fenced": True}}},
    }
    monkeypatch.setattr(
        runner, "call_sync", lambda host, port, method, payload, timeout_s: views[port]
    )
    nodes = [SimpleNamespace(node_id=i, host="127.0.0.1", rpc_port=i) for i in (1, 2, 3)]
    lab = cast(ChaosLab, SimpleNamespace(nodes=lambda: nodes))
    assert runner.ChaosLab.fenced_brokers(lab, 3, 0.5) == {1}


def test_a_mid_run_read_is_stamped_when_it_was_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The views of the coordinator asked after a read took up to 1.5 s under a fault, and the
    read's ok was stamped after them: a commit sent meanwhile counted as one the read may have
    missed, which excused a read that lacked an acknowledged commit (review helper-278)."""
    now = [0.0]
    history = History(clock=lambda: now[0], origin=0.0)
    monkeypatch.setattr(runner, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def read(*args: Any) -> tuple[dict[str, int], tuple[str, int]]:
        now[0] = 10.0
        return {"0": 5}, ("127.0.0.2", 9092)

    def views(*args: Any, **kwargs: Any) -> dict[tuple[str, int], tuple[int, int]]:
        now[0] += 5.0  # slow answers
        return {("127.0.0.2", 9092): (2, 7)}

    monkeypatch.setattr(runner, "read_committed", read)
    monkeypatch.setattr(runner, "offsets_leadership", views)
    workload = SimpleNamespace(groups=lambda: [GROUP], topic="t", partitions=1)
    lab = cast(ChaosLab, SimpleNamespace(workload=workload, bootstrap="b", history=history))

    def done() -> list[Any]:
        return [e for e in history.events() if e.process == "reader" and e.type == "ok"]

    with runner.reading_commits(lab, every_s=0.01):
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline
            time.sleep(0.01)  # polling for the reader thread
    assert done()[0].time == 10.0


def test_resume_signals_only_the_nodes_own_process(tmp_path: Path) -> None:
    """A node's pid taken since by another process (the lab has no pid namespace): SIGCONT
    went to it, whatever stopped it."""
    other = subprocess.Popen(["sleep", "60"])

    def state() -> str:
        with open(f"/proc/{other.pid}/stat") as f:
            return f.read().split(") ")[-1][0]

    try:
        os.kill(other.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)  # polling: the stop takes effect asynchronously
        assert state() == "T"
        node = launcher.NodeProcess(1, "127.0.0.1", 1, 2, 3, 4, str(tmp_path), pid=other.pid)
        nemesis.LocalProcesses().resume(node)
        watched_until = time.monotonic() + 0.5  # a window in which a SIGCONT would show
        while time.monotonic() < watched_until:
            assert state() == "T", "the other process was resumed"
            time.sleep(0.01)
    finally:
        other.kill()
        other.wait()
