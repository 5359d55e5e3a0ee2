"""Scenario tests in etcd's ``testdata`` style: each ``testdata/*.txt`` is a script.

A file is a sequence of blocks::

    # a comment (outside blocks)
    <command> [positional ...] [key=value ...]
    ----
    <expected output, one or more non-blank lines>
    <blank line>

Each command runs against one ``ShardContext`` (``harness.py``): a shard loaded from an empty
log, clock at 0. Requests get tokens #1, #2, ... in order; a request not answered by its own
call prints ``#n parked`` and its answer shows up in the output of the call that answers it.
Records print as ``@<log offset> ...``, then answers, in the order the shard produced them.
After every call the harness checks its invariants (a generation never goes down; Stable and
Empty groups are exactly their last record; no token is answered twice).

Commands (defaults in brackets; lists are comma-separated)::

    join [group=g] [client=c] [member=] [instance=] [session=10000] [rebalance=20000]
         [type=consumer] [protocols=range] [meta=s] [topics=t,u] [host=/127.0.0.1]
         [require_known=true] [skip_supported=true]
        protocols: name or name:metadata; topics= makes the metadata a
        ConsumerProtocolSubscription of those topics
    sync member= gen= [group=g] [instance=] [assign=m:bytes,...] [ptype=] [pname=]
    heartbeat member= gen= [group=g] [instance=]
    leave members=member[/instance],... [group=g]      (an empty member id: by instance id)
    commit offsets=topic:partition=offset,... [group=g] [member=] [gen=-1] [instance=]
           [metadata=] [metadata_len=n] [retention=ms] [report_not_found=false]
    fetch [partitions=topic:partition,...] [group=g]   (no partitions: all offsets)
    describe [groups=g] [report_not_found=false]
    list [states=...] [types=...]
    delete [groups=g]
    offset-delete partitions=topic:partition,... [group=g]
    sleep <ms>         advance the clock, firing due timers ("timer <key> fired at <ms>")
    failover           a new shard loaded from the log alone replaces this one
    unload             the partition is unloaded (parked requests: NOT_COORDINATOR)
    state [group=g]    the live group, soft state included
    offsets [group=g]  the committed offsets
    timers             the scheduled timers
    config key=value   (first command only) a shard with these GroupConfig fields

With ``KCOORD_REWRITE=1`` the expected outputs are rewritten from the actual ones (review the
diff before committing).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kcoord.cluster.coordinator.shard import GroupConfig
from tests.unit.cluster.coordinator.harness import (
    ShardContext,
    Step,
    consumer_subscription,
    format_group,
    format_offsets,
    format_step,
    format_timers,
)

TESTDATA = Path(__file__).parent / "testdata"
SEPARATOR = "----"


@dataclass
class Block:
    comments: list[str]
    command: str
    expected: list[str]


def parse_file(text: str) -> tuple[list[Block], list[str]]:
    """The blocks, and the comment lines after the last block."""
    blocks: list[Block] = []
    comments: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            comments.append(line)
            i += 1
            continue
        command = line
        i += 1
        if i >= len(lines) or lines[i] != SEPARATOR:
            raise ValueError(f"line {i + 1}: expected {SEPARATOR!r} after {command!r}")
        i += 1
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        blocks.append(Block(comments, command, expected))
        comments = []
    return blocks, comments


def render_file(blocks: list[Block], trailing: list[str]) -> str:
    out: list[str] = []
    for block in blocks:
        if out:
            out.append("")
        out.extend(block.comments)
        out.append(block.command)
        out.append(SEPARATOR)
        out.extend(block.expected)
    if trailing:
        out.append("")
        out.extend(trailing)
    return "\n".join(out) + "\n"


def _bool(value: str) -> bool:
    if value not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")
    return value == "true"


def _list(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


def _partitions(value: str) -> list[tuple[str, int]]:
    out = []
    for item in _list(value):
        topic, partition = item.rsplit(":", 1)
        out.append((topic, int(partition)))
    return out


class Interpreter:
    def __init__(self) -> None:
        self.ctx = ShardContext()
        self.commands: dict[str, Callable[[list[str], dict[str, str]], list[str]]] = {
            "join": self.join,
            "sync": self.sync,
            "heartbeat": self.heartbeat,
            "leave": self.leave,
            "commit": self.commit,
            "fetch": self.fetch,
            "describe": self.describe,
            "list": self.list_groups,
            "delete": self.delete,
            "offset-delete": self.offset_delete,
            "sleep": self.sleep,
            "failover": self.failover,
            "unload": self.unload,
            "state": self.state,
            "offsets": self.offsets,
            "timers": self.timers,
            "config": self.config,
        }

    def run(self, command: str) -> list[str]:
        verb, *words = command.split()
        positional = [w for w in words if "=" not in w]
        args = dict(w.split("=", 1) for w in words if "=" in w)
        handler = self.commands.get(verb)
        if handler is None:
            raise ValueError(f"unknown command {verb!r}")
        lines = handler(positional, args)
        if args:
            raise ValueError(f"{verb}: unknown arguments {sorted(args)}")
        return lines or ["(nothing)"]

    @staticmethod
    def _request_output(token: int, step: Step) -> list[str]:
        lines = format_step(step)
        if not step.answered(token):
            lines.append(f"#{token} parked")
        return lines

    def join(self, _: list[str], a: dict[str, str]) -> list[str]:
        topics = a.pop("topics", None)
        meta = a.pop("meta", "s").encode()
        if topics is not None:
            meta = consumer_subscription(_list(topics))
        protocols = []
        for item in _list(a.pop("protocols", "range")):
            name, _sep, explicit = item.partition(":")
            protocols.append((name, explicit.encode() if explicit else meta))
        instance = a.pop("instance", None)
        token, step = self.ctx.join(
            group_id=a.pop("group", "g"),
            member_id=a.pop("member", ""),
            instance_id=instance,
            client_id=a.pop("client", "c"),
            client_host=a.pop("host", "/127.0.0.1"),
            session_timeout_ms=int(a.pop("session", "10000")),
            rebalance_timeout_ms=int(a.pop("rebalance", "20000")),
            protocol_type=a.pop("type", "consumer"),
            protocols=protocols,
            require_known_member_id=_bool(a.pop("require_known", "true")),
            supports_skip_assignment=_bool(a.pop("skip_supported", "true")),
        )
        return self._request_output(token, step)

    def sync(self, _: list[str], a: dict[str, str]) -> list[str]:
        assignments = []
        for item in _list(a.pop("assign", "")):
            member, assignment = item.split(":", 1)
            assignments.append((member, assignment.encode()))
        token, step = self.ctx.sync(
            member_id=a.pop("member"),
            generation_id=int(a.pop("gen")),
            group_id=a.pop("group", "g"),
            instance_id=a.pop("instance", None),
            assignments=assignments,
            protocol_type=a.pop("ptype", None),
            protocol_name=a.pop("pname", None),
        )
        return self._request_output(token, step)

    def heartbeat(self, _: list[str], a: dict[str, str]) -> list[str]:
        token, step = self.ctx.heartbeat(
            member_id=a.pop("member"),
            generation_id=int(a.pop("gen")),
            group_id=a.pop("group", "g"),
            instance_id=a.pop("instance", None),
        )
        return self._request_output(token, step)

    def leave(self, _: list[str], a: dict[str, str]) -> list[str]:
        members: list[tuple[str, str | None]] = []
        for item in a.pop("members").split(","):
            member, _sep, instance = item.partition("/")
            members.append((member, instance or None))
        token, step = self.ctx.leave(members, group_id=a.pop("group", "g"))
        return self._request_output(token, step)

    def commit(self, _: list[str], a: dict[str, str]) -> list[str]:
        offsets = []
        for item in _list(a.pop("offsets")):
            where, offset = item.split("=")
            topic, partition = where.rsplit(":", 1)
            offsets.append((topic, int(partition), int(offset)))
        metadata = a.pop("metadata", None)
        if "metadata_len" in a:
            metadata = "m" * int(a.pop("metadata_len"))
        token, step = self.ctx.commit(
            offsets,
            group_id=a.pop("group", "g"),
            member_id=a.pop("member", ""),
            generation_id=int(a.pop("gen", "-1")),
            instance_id=a.pop("instance", None),
            metadata=metadata,
            retention_time_ms=int(a.pop("retention", "-1")),
            report_group_id_not_found=_bool(a.pop("report_not_found", "false")),
        )
        return self._request_output(token, step)

    def fetch(self, _: list[str], a: dict[str, str]) -> list[str]:
        partitions = a.pop("partitions", None)
        token, step = self.ctx.fetch(
            None if partitions is None else _partitions(partitions), group_id=a.pop("group", "g")
        )
        return self._request_output(token, step)

    def describe(self, _: list[str], a: dict[str, str]) -> list[str]:
        token, step = self.ctx.describe(
            _list(a.pop("groups", "g")),
            report_group_id_not_found=_bool(a.pop("report_not_found", "false")),
        )
        return self._request_output(token, step)

    def list_groups(self, _: list[str], a: dict[str, str]) -> list[str]:
        token, step = self.ctx.list_groups(_list(a.pop("states", "")), _list(a.pop("types", "")))
        return self._request_output(token, step)

    def delete(self, _: list[str], a: dict[str, str]) -> list[str]:
        token, step = self.ctx.delete_groups(_list(a.pop("groups", "g")))
        return self._request_output(token, step)

    def offset_delete(self, _: list[str], a: dict[str, str]) -> list[str]:
        token, step = self.ctx.delete_offsets(
            _partitions(a.pop("partitions")), group_id=a.pop("group", "g")
        )
        return self._request_output(token, step)

    def sleep(self, positional: list[str], _: dict[str, str]) -> list[str]:
        (ms,) = positional
        lines = []
        for key, deadline, step in self.ctx.sleep(int(ms)):
            lines.append(f"timer {key} fired at {deadline}")
            lines.extend(format_step(step))
        return lines

    def failover(self, _: list[str], __: dict[str, str]) -> list[str]:
        self.ctx = self.ctx.failover()
        lines = [f"loaded {len(self.ctx.log)} records"]
        lines.extend(format_step(self.ctx.loaded))
        for group_id in self.ctx.shard.groups:
            lines.extend(format_group(self.ctx.shard, group_id))
        lines.extend(format_timers(self.ctx))
        return lines

    def unload(self, _: list[str], __: dict[str, str]) -> list[str]:
        return format_step(self.ctx.unload())

    def state(self, _: list[str], a: dict[str, str]) -> list[str]:
        return format_group(self.ctx.shard, a.pop("group", "g"))

    def offsets(self, _: list[str], a: dict[str, str]) -> list[str]:
        return format_offsets(self.ctx.shard, a.pop("group", "g"))

    def timers(self, _: list[str], __: dict[str, str]) -> list[str]:
        return format_timers(self.ctx)

    def config(self, _: list[str], a: dict[str, str]) -> list[str]:
        assert not self.ctx.log and not self.ctx.outstanding, "config must come first"
        fields: dict[str, Any] = {
            name: value if name.endswith("_policy") else int(value) for name, value in a.items()
        }
        config = GroupConfig(**fields)
        a.clear()
        self.ctx = ShardContext(config)
        return [f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config)]


def scenario_files() -> list[Path]:
    return sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
def test_scenario(path: Path) -> None:
    blocks, trailing = parse_file(path.read_text())
    interpreter = Interpreter()
    mismatches = []
    for block in blocks:
        actual = interpreter.run(block.command)
        if actual != block.expected:
            mismatches.append(
                f"{block.command}\nexpected:\n  "
                + "\n  ".join(block.expected)
                + "\nactual:\n  "
                + "\n  ".join(actual)
            )
        block.expected = actual
    if os.environ.get("KCOORD_REWRITE") == "1":
        path.write_text(render_file(blocks, trailing))
        return
    assert not mismatches, f"{path.name}: {len(mismatches)} blocks differ\n\n" + "\n\n".join(
        mismatches
    )
    # Every request was answered or is still legitimately parked: nothing was lost silently.
    interpreter.ctx.check_invariants()


def test_at_least_the_required_scenarios_exist() -> None:
    names = {p.stem for p in scenario_files()}
    required = {
        "eager_rebalance",
        "initial_delay",
        "join_stable_group",
        "session_timeout",
        "static_member_bounce",
        "skip_assignment",
        "member_id_required",
        "delayed_sync",
        "commit_validation",
        "offset_expiry",
        "delete_group",
        "failover",
    }
    assert required <= names, f"missing scenarios: {sorted(required - names)}"


def test_parse_and_render_round_trip() -> None:
    text = "# c\njoin client=a\n----\n#1 x\n#2 y\n\nsleep 5\n----\n(nothing)\n\n# end\n"
    blocks, trailing = parse_file(text)
    assert [(b.comments, b.command, b.expected) for b in blocks] == [
        (["# c"], "join client=a", ["#1 x", "#2 y"]),
        ([], "sleep 5", ["(nothing)"]),
    ]
    assert trailing == ["# end"]
    assert render_file(blocks, trailing) == text
