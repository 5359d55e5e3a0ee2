"""The chaos suite's history: every operation a run performed, as invoke/completion events.

Theory of operation
-------------------

A run records what its clients *did* and what they *observed*, never what the cluster did
internally: the checkers (``chaos/checkers.py``) must prove correctness from the outside, as
Jepsen does. Each operation is an ``invoke`` event, recorded before the request leaves, and one
completion recorded after the answer came back:

``ok``
    the operation certainly happened (the cluster acknowledged it);
``fail``
    it certainly did not happen (a definite error: the request was rejected);
``info``
    the outcome is unknown (a timeout, a dropped connection): it may or may not have happened,
    now or later. Observations that are not requests (a rebalance callback, a nemesis fault) are
    lone ``info`` events; reads that cannot have side effects may be lone ``ok`` events.

A process has at most one operation of each ``f`` in flight: an invoke is completed by that
process's next completion of the same ``f`` (:meth:`History.completion`). A process that gives up
on an operation records ``info`` for it before it invokes the next one.

Events are kept in the order they were added; ``index`` is that position. ``time`` is seconds
since the run started on a monotonic clock shared by every process of the run (Linux's
``CLOCK_MONOTONIC`` is), taken from the injected ``clock`` unless the caller passes the time it
stamped itself, e.g. a member process that records its events in its own clock reading. Checkers
order events by ``(time, index)``, so real-time precedence ("this commit was acknowledged before
that one was invoked") holds even when events from several processes arrive out of order.

Values are stored in their JSON form (``add`` round-trips them through ``json``): integer dict
keys become strings, tuples become lists, so a history read back from disk equals the one that
was written, and a value that JSON cannot hold is refused when it is added, not at the end.

File format (JSONL)
-------------------

One event per line, UTF-8, in index order::

    {"index": 0, "time": 0.013, "process": "member-1", "type": "invoke", "f": "commit",
     "value": {...}}

Operation vocabulary
--------------------

``member`` is the stable name of the process (the same after a restart, so also the
``group.instance.id`` of a static member); ``member_id`` is the id the coordinator gave it;
partitions are ints; offsets are "next offset to read" as in OffsetCommit; ``records`` are
``[partition, offset, value]`` triples in the order the client returned them. Partition keys of
``offsets`` maps are strings in JSON (``{"0": 12}``); checkers read them back as ints.

Groups workload (one process per member, ``process == member``):

- ``commit`` invoke/ok/fail/info ``{group, topic, member, member_id, generation,
  offsets: {partition: offset}}``; the completion repeats the offsets (or omits them, and the
  invoke's count).
- ``consume`` ok ``{group, topic, member, member_id, generation, records}``: records handed to
  the application by one poll, before it commits them.
- ``assignment`` info ``{group, topic, member, member_id, generation, partitions}``: the
  member's settled assignment, recorded whenever it changes.
- ``assigned`` / ``revoked`` / ``lost`` info ``{group, member, member_id, generation,
  partitions, topic?}``: the rebalance listener's callbacks.
- ``committed`` ok ``{group, topic, offsets}``: OffsetFetch after healing (the final read).
- ``describe`` ok ``{group, state, generation?, members: [member_id, ...]}``: DescribeGroups
  after healing (the final read).
- ``send`` invoke/ok/fail/info ``{topic, key, value, partition?, offset?}``: a produce with
  acks=all; ``ok`` carries ``partition`` and ``offset``.

Queue workload (Jepsen's Kafka test):

- ``send`` as above; values are unique per key.
- ``poll`` ok ``{member, topic, records, mode: "assign"|"subscribe", generation?}``.
- ``assign`` / ``subscribe`` info ``{member, topic, partitions?}``: the consumer (re)assigned
  or (re)subscribed; a (re)started consumer process records one before its first poll.
- ``final-poll`` ok, the shape of ``poll``: after healing, every partition read from offset 0 to
  its end (several events are fine; together they cover the log).

Client processes (recorded by the runner, process = the client's name):

- ``process-start`` info ``{module, cfg}`` / ``process-kill`` info ``{}``: a client process was
  (re)started or killed; a restarted consumer resumes from committed offsets.
- ``unrecorded-report`` info ``{error}``: a report of the client that could not be recorded.

Run metadata (process ``"runner"`` or ``"checker"``):

- ``topic`` info ``{topic, partitions: N}``: a topic the run created, so checkers know how many
  partitions must be owned after healing.

Nemesis (process ``"nemesis"``):

- ``start`` / ``stop``: an invoke before the fault is put in place (``{fault}``) or healed, and
  an info once it is in force or healed ``{fault: "kill"|"pause"|"partition"|"latency"|"reset"|
  "clients", targets: [...], detail: {...}}``; for ``clients`` the targets are process names.
  A start that found no target is answered by an info ``{fault, skipped}``.
- ``heal`` info ``{fault?}``: a fault (or, with ``fault: "all"``, every fault) is healed.
- ``probe-commit`` invoke/ok/fail/info ``{group, ...}``: a liveness probe's OffsetCommit
  (any process; the checkers look only at ``f`` and ``type``).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

INVOKE: Final = "invoke"
OK: Final = "ok"
FAIL: Final = "fail"
INFO: Final = "info"
EVENT_TYPES: Final = frozenset({INVOKE, OK, FAIL, INFO})
COMPLETION_TYPES: Final = frozenset({OK, FAIL, INFO})
# A client process was SIGKILLed: what it had in flight is never answered (see ``pairs``).
PROCESS_KILL_F: Final = "process-kill"
# A client's report the runner could not record (an acknowledgement may be missing).
UNRECORDED_REPORT_F: Final = "unrecorded-report"
# A client process ended that neither the nemesis nor the runner stopped (its exit code).
PROCESS_EXIT_F: Final = "process-exit"
# After the run: who wrote each copy of a value a replica holds twice (``chaos.copies``).
LOG_COPIES_F: Final = "log-copies"
# What the runner saw of a node's registration while a pause shorter than the session timeout
# held and just after (``runner.FencingWatch``).
FENCING_WATCH_F: Final = "fencing-watch"


@dataclass(frozen=True)
class Event:
    """One line of a history. Frozen; ``value`` is JSON data and must not be mutated."""

    index: int  # position in the history, 0-based
    time: float  # seconds since the run started, on the run's monotonic clock
    process: str  # "member-3", "producer-1", "nemesis", "checker", ...
    type: str  # "invoke" | "ok" | "fail" | "info"
    f: str  # the operation: "commit", "poll", "heal", ...
    value: dict[str, Any]

    @property
    def at(self) -> tuple[float, int]:
        """The event's place in real time: ties on ``time`` are broken by ``index``."""
        return (self.time, self.index)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        event = cls(
            index=int(data["index"]),
            time=float(data["time"]),
            process=str(data["process"]),
            type=str(data["type"]),
            f=str(data["f"]),
            value=dict(data["value"]),
        )
        _raise_if_invalid_type(event.type)
        return event


def _raise_if_invalid_type(type_: str) -> None:
    if type_ not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {sorted(EVENT_TYPES)}, not {type_!r}")


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    # One form in memory and on disk: int keys become strings, tuples lists (see the docstring).
    result = json.loads(json.dumps(value, allow_nan=False))
    if not isinstance(result, dict):
        raise TypeError(f"an event value must be a dict, not {type(value).__name__}")
    return result


class History:
    """An append-only, thread-safe list of events.

    ``clock`` returns seconds since the run started on a monotonic clock; ``add`` reads it when
    no explicit ``time`` is given (a history loaded from disk has no clock, so every ``add``
    then needs one). ``origin``: the run's start on ``time.monotonic()``, where the times the
    client processes stamp their reports with are turned into the history's (``time_at``).
    """

    def __init__(
        self, clock: Callable[[], float] | None = None, origin: float | None = None
    ) -> None:
        self._clock = clock
        self.origin = origin
        self._lock = threading.Lock()
        self._events: list[Event] = []
        # Invoke index <-> completion index, rebuilt lazily after an add.
        self._completion_of: dict[int, int] = {}
        self._invocation_of: dict[int, int] = {}
        self._paired_up_to = 0
        self._open_invokes: dict[tuple[str, str], deque[int]] = {}

    def time_at(self, monotonic: object) -> float | None:
        """The history time of a ``time.monotonic()`` reading another process of the run
        took; None without an origin or a reading (``add`` then reads the clock)."""
        if self.origin is None or not isinstance(monotonic, int | float):
            return None
        return float(monotonic) - self.origin

    def add(
        self,
        process: str,
        type: str,  # Jepsen's name for the field
        f: str,
        value: dict[str, Any],
        time: float | None = None,
    ) -> Event:
        """Append one event and return it. Thread-safe; raises on an unknown type or non-JSON
        value, and when neither ``time`` nor a clock is given."""
        _raise_if_invalid_type(type)
        json_value = _as_json(value)
        with self._lock:
            if time is None:
                if self._clock is None:
                    raise ValueError("History has no clock: pass time explicitly")
                time = self._clock()
            event = Event(len(self._events), float(time), process, type, f, json_value)
            self._events.append(event)
            return event

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __getitem__(self, index: int) -> Event:
        with self._lock:
            return self._events[index]

    def events(self) -> tuple[Event, ...]:
        """A snapshot of every event, in index order."""
        with self._lock:
            return tuple(self._events)

    def ops(self, f: str, type: str | None = None) -> list[Event]:
        """Every event of operation ``f`` (of one ``type`` if given), in index order."""
        return [e for e in self.events() if e.f == f and (type is None or e.type == type)]

    def completion(self, invoke: Event) -> Event | None:
        """The completion of an invoke: the same process's next completion of the same ``f``
        (None while it is still in flight, or if the run ended first)."""
        if invoke.type != INVOKE:
            raise ValueError(f"event {invoke.index} is not an invoke")
        with self._lock:
            self._pair_locked()
            index = self._completion_of.get(invoke.index)
            return None if index is None else self._events[index]

    def invocation(self, completion: Event) -> Event | None:
        """The invoke a completion answers, or None for a lone completion (a callback, a read
        recorded only as ``ok``)."""
        with self._lock:
            self._pair_locked()
            index = self._invocation_of.get(completion.index)
            return None if index is None else self._events[index]

    def pairs(self, f: str | None = None) -> list[tuple[Event, Event | None]]:
        """Each invoke (of ``f`` if given) with its completion, in invoke order."""
        with self._lock:
            self._pair_locked()
            return [
                (e, self._event_or_none(self._completion_of.get(e.index)))
                for e in self._events
                if e.type == INVOKE and (f is None or e.f == f)
            ]

    def _event_or_none(self, index: int | None) -> Event | None:
        return None if index is None else self._events[index]

    def _pair_locked(self) -> None:
        # Incremental: events are append-only, so pairing resumes where it stopped.
        for event in self._events[self._paired_up_to :]:
            key = (event.process, event.f)
            if event.f == PROCESS_KILL_F:
                # What the killed process had in flight stays unanswered (may have happened):
                # a static member restarts under the same name, and its replacement's first
                # completion must not answer the dead one's invoke.
                for (process, _), in_flight in self._open_invokes.items():
                    if process == event.process:
                        in_flight.clear()
                continue
            if event.type == INVOKE:
                self._open_invokes.setdefault(key, deque()).append(event.index)
            else:
                waiting = self._open_invokes.get(key)
                if waiting:
                    invoke_index = waiting.popleft()
                    self._completion_of[invoke_index] = event.index
                    self._invocation_of[event.index] = invoke_index
        self._paired_up_to = len(self._events)

    def to_jsonl(self, path: str | Path) -> None:
        """Write every event, one JSON object a line (format in the module docstring)."""
        events = self.events()
        with Path(path).open("w", encoding="utf-8") as out:
            for event in events:
                out.write(json.dumps(event.to_dict(), separators=(",", ":")) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path, clock: Callable[[], float] | None = None) -> History:
        """Read a history written by :meth:`to_jsonl`; raises ValueError on a malformed line."""
        with Path(path).open(encoding="utf-8") as lines:
            return cls.from_events(
                (
                    _event_from_line(number, line)
                    for number, line in enumerate(lines, start=1)
                    if line.strip()
                ),
                clock=clock,
            )

    @classmethod
    def from_events(
        cls, events: Iterable[Event], clock: Callable[[], float] | None = None
    ) -> History:
        """A history holding ``events``, whose indexes must be 0, 1, 2, ... in order."""
        history = cls(clock)
        for event in events:
            if event.index != len(history._events):
                raise ValueError(f"event index {event.index} at position {len(history._events)}")
            _raise_if_invalid_type(event.type)
            history._events.append(event)
        return history


def _event_from_line(number: int, line: str) -> Event:
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        return Event.from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"history line {number}: {error}") from error
