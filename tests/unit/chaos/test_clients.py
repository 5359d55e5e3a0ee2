"""The chaos clients' reports as the runner records them."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kcoord.chaos import member, producer, queue_consumer
from kcoord.chaos import workload as workload_module
from kcoord.chaos.history import PROCESS_EXIT_F, UNRECORDED_REPORT_F, History
from kcoord.chaos.queue_consumer import _generation
from kcoord.chaos.workload import GroupsWorkload


class _Metadata:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def consumer_group_metadata(self) -> Any:
        return self.raw


def test_the_queue_consumer_reads_the_generation_of_librdkafkas_group_metadata() -> None:
    """``"CGMDv2:"``, then the generation as a native int32 (the checker resets a consumer's
    expected offsets when it changes; read at the wrong place it never did)."""
    for generation in (1, 7):
        raw = b"CGMDv2:" + struct.pack("=i", generation) + b"group\0member\0"
        assert _generation(_Metadata(raw)) == generation
    assert _generation(_Metadata(b"")) == -1


def test_the_queue_consumer_waits_for_a_node_that_does_not_show_the_topic_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 4366: the node an assigning consumer asked had not applied the topic's creation
    and showed it without partitions; the consumer was assigned none, read nothing, and the
    run failed waiting for every consumer to read."""
    answers = [
        {},
        {"q": SimpleNamespace(partitions={})},
        {"q": SimpleNamespace(partitions={1: 0, 0: 0})},
    ]
    consumer = SimpleNamespace(
        list_topics=lambda topic, timeout: SimpleNamespace(topics=answers.pop(0))
    )
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    assert queue_consumer._partitions(consumer, "q", 30.0) == [0, 1]
    assert answers == []
    never = SimpleNamespace(list_topics=lambda topic, timeout: SimpleNamespace(topics={}))
    with pytest.raises(RuntimeError, match="no partitions"):
        queue_consumer._partitions(never, "q", 0.0)


def _run_fake_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> tuple[History, int]:
    """Run ``source`` as a workload client to its end: the history, and the reports read."""
    (tmp_path / "fake_client.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    history = History(clock=time.monotonic)
    workload = GroupsWorkload("127.0.0.1:1", history, tmp_path)
    client = workload._spawn("m1", "fake_client", {"group": "g", "topic": "t"})
    try:
        client.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        client.kill()  # its process group, so that nothing outlives the test
        raise
    client._reader.join(timeout=30)
    assert not client._reader.is_alive(), "the client's reports were never all read"
    return history, client.events


def test_a_client_report_of_an_unknown_kind_is_an_unrecorded_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt acknowledgement must fail the run (check_progress), not vanish."""
    history, events = _run_fake_client(
        tmp_path,
        monkeypatch,
        'print(\'{"event": "started"}\')\nprint(\'{"event": "comitted", "offsets": {"0": 5}}\')\n',
    )
    assert events == 2
    assert [e.value for e in history.ops(UNRECORDED_REPORT_F)] == [
        {"error": "ValueError(\"unknown event 'comitted'\")"}
    ]


def test_a_whole_line_that_is_not_json_is_an_unrecorded_report_a_cut_last_line_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stray output may stand where an acknowledgement was (fail the run); a last line cut
    by a kill was never a report (nothing to say)."""
    history, events = _run_fake_client(
        tmp_path,
        monkeypatch,
        "import sys\n"
        'print(\'{"event": "started"}\')\n'
        "print('connecting...')\n"
        'sys.stdout.write(\'{"event": "comm\')\n',
    )
    assert events == 1
    assert [e.value for e in history.ops(UNRECORDED_REPORT_F)] == [
        {"error": "not JSON: b'connecting...\\n'"}
    ]


def test_a_client_that_exits_by_itself_is_recorded_one_stopped_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member that gave up (a fatal error such as FENCED_INSTANCE_ID, a crash) went
    unnoticed: the final checks look at the members still alive. Its exit is in the history
    (``client-exited``); a kill by the nemesis or a stop by the runner is not."""
    history, _ = _run_fake_client(
        tmp_path,
        monkeypatch,
        'print(\'{"event": "error", "error": "FENCED_INSTANCE_ID", "fatal": true}\')\n'
        "raise SystemExit(3)\n",
    )
    (error,) = history.ops("client-error")
    assert error.value["fatal"] is True
    assert [(e.process, e.value) for e in history.ops(PROCESS_EXIT_F)] == [
        ("m1", {"returncode": 3})
    ]

    (tmp_path / "sleeping_client.py").write_text("import time\ntime.sleep(60)\n")
    workload = GroupsWorkload("127.0.0.1:1", history, tmp_path)
    for name in ("killed", "stopped"):
        client = workload._spawn(name, "sleeping_client", {})
        try:
            client.kill() if name == "killed" else client.stop()
        finally:
            client.kill()  # none left sleeping if the stop under test fails
        client._reader.join(timeout=30)
        assert not client._reader.is_alive(), f"the {name} client's reports were never all read"
    assert [e.process for e in history.ops(PROCESS_EXIT_F)] == ["m1"]


def test_a_client_that_does_not_stop_leaves_its_stacks_before_it_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client stuck past the stop timeout is asked for its threads' stacks (SIGUSR1, which
    every chaos client hands to faulthandler) before the SIGKILL: the report says where it
    was stuck, not only that it was."""
    (tmp_path / "stuck_client.py").write_text(
        "import faulthandler, json, signal, sys, time\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(json.dumps({'event': 'started'}), flush=True)\n"
        "def stuck_in_the_client():\n"
        "    while True:\n"
        "        time.sleep(1)  # stands for a client call that never returns\n"
        "stuck_in_the_client()\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(workload_module, "STOP_TIMEOUT_S", 0.5)
    workload = GroupsWorkload("127.0.0.1:1", History(clock=time.monotonic), tmp_path)
    client = workload._spawn("m1", "stuck_client", {"group": "g", "topic": "t"})
    try:
        deadline = time.monotonic() + 30
        while client.events == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for its first report: its handlers are in place
        assert client.events == 1, "the client never started"
        client.stop()
    finally:
        client.kill()
    assert not client.alive
    stacks = client.stderr_path.read_text()
    assert "stuck_in_the_client" in stacks, stacks


def test_a_sigterm_while_the_client_waits_on_its_stop_event_does_not_deadlock() -> None:
    """The SIGTERM handler runs in the main thread, which may hold the stop event's lock at
    that moment (inside ``Event.wait``). A handler that called ``Event.set`` itself waited for
    that lock forever; one that hands the set to another thread returns, and the event is set
    once the lock is free. Run in a process of its own, as a hang would hang the test."""
    script = (
        "import signal\n"
        "from kcoord.chaos import client_signals\n"
        "stopping = client_signals.install()\n"
        "with stopping._cond:  # the main thread interrupted inside stopping.wait()\n"
        "    signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)\n"
        "    print('handler returned', flush=True)\n"
        "print('stopping' if stopping.wait(10) else 'never set', flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.stdout.split("\n")[:2] == ["handler returned", "stopping"], proc


def test_a_members_reports_are_stamped_on_the_hosts_monotonic_clock(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The early-handover checker orders different members' reports by their "at": on the
    wall clock, a step of it (NTP) during a run reordered a revocation and the next owner's
    assignment. CLOCK_MONOTONIC is one for every process of the host."""
    # A wall clock stepped far ahead, the monotonic one where it is.
    monkeypatch.setattr(member, "time", SimpleNamespace(time=lambda: 1e12, monotonic=lambda: 42.5))
    member.emit("revoked", partitions=[0])
    assert json.loads(capsys.readouterr().out) == {
        "event": "revoked",
        "at": 42.5,
        "partitions": [0],
    }


def test_each_report_is_recorded_at_the_time_its_client_stamped_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The runner reads each client's reports on a thread of its own, and recorded them at
    the time it got them: a commit invoked by one member after another's was acknowledged
    could be recorded before it, and the checker then took the commit acknowledged last for
    one overwritten (a false lost commit; a review's probe). A report is recorded at its
    ``"at"``, on the run's clock; one without it (or a history without an origin) when read."""
    history = History(clock=lambda: 1000.0, origin=10.0)
    workload = GroupsWorkload("127.0.0.1:1", history, Path("/nonexistent"))
    proc = cast(Any, SimpleNamespace(name="m1", cfg={"group": "g", "topic": "t"}))
    workload._on_event(proc, {"event": "committing", "at": 12.5, "offsets": {"0": 5}})
    workload._on_event(proc, {"event": "committed", "offsets": {"0": 5}})
    workload._on_event(proc, {"event": "sent", "at": 11.0, "key": "k", "value": "v"})
    assert [(e.f, e.type, e.time) for e in history.events()] == [
        ("commit", "invoke", 2.5),
        ("commit", "ok", 1000.0),
        ("send", "ok", 1.0),
    ]
    # The producer and the queue consumer stamp their reports as the members do.
    for module in (producer, queue_consumer):
        module.emit("sent", key="k")
        assert isinstance(json.loads(capsys.readouterr().out)["at"], float)


def test_a_commit_refused_for_the_membership_pauses_the_members_commits() -> None:
    """librdkafka puts a member's next heartbeat off by a second at every commit refused for
    its membership: committing every poll, a KIP-848 member removed while cut off never sent
    the heartbeat that makes it rejoin (make chaos, groups-partition seed 2). Such a refusal
    pauses its commits; others (a timeout, a coordinator moving) do not."""
    from confluent_kafka import KafkaError

    for code in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_MEMBER_EPOCH):
        assert member._membership_error(KafkaError(code))
    for code in (KafkaError._TIMED_OUT, KafkaError.NOT_COORDINATOR):
        assert not member._membership_error(KafkaError(code))
    assert not member._membership_error(None)
    assert member.COMMIT_PAUSE_AFTER_FENCING_S > 1.0  # past librdkafka's heartbeat backoff
