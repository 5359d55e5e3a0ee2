"""``kcoord groups`` and ``kcoord topics`` against a live 3-node cluster.

A topic ``orders`` (3 partitions, RF 3) gets 10, 20 and 5 records with known timestamps from a
kafka-python producer; groups commit known offsets with kafka-python (each client in a process
of its own, ``kafka_python_ops``). The tests check the exact
columns of every view, the lag values, reset-offsets (dry run, execute, each scenario, clamping)
as kafka-python then reads the committed offsets, the refusals while a kafka-python consumer is a
live member, DeleteGroups' per-group results, OffsetDelete through the tool and kafka-python's
admin client, the topic commands, and clear errors with non-zero
exit codes. The commands run in-process through ``kcoord.cli.main`` (one test runs the console
script itself).
"""

from __future__ import annotations

import contextlib
import io
import json
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kcoord.cli import main
from kcoord.cluster.routing import partition_for
from kcoord.raft.controller import OFFSETS_TOPIC_NAME
from kcoord.storage.config import TOPIC_CONFIGS
from tests.integration.cluster import LocalCluster, free_base_port, wait_for

pytestmark = pytest.mark.integration

TOPIC = "orders"
RECORDS = {0: 10, 1: 20, 2: 5}  # records per partition: the log end offsets
BASE_TIMESTAMP_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z; record i is 1 s later than i-1
OFFSETS_HEADER = (
    "GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG"
    "             CONSUMER-ID     HOST            CLIENT-ID"
)
DEADLINE_S = 30.0
COMMAND_TIMEOUT_MS = 30_000
OPS_TIMEOUT_S = 90.0
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def rows(self) -> list[list[str]]:
        """The table's rows (after its header), split on whitespace."""
        lines = [line for line in self.out.splitlines() if line.strip()]
        return [line.split() for line in lines[1:]]


def kcoord(*args: str) -> Run:
    """One command in-process. Its retries may take longer than Kafka's 5 s default here: the
    test machine is shared and slow at times."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--timeout-ms", str(COMMAND_TIMEOUT_MS)])
    return Run(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = {"group.initial.rebalance.delay.ms": 0}
    with LocalCluster(tmp_path_factory.mktemp("operator-cli"), overrides=overrides) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    """The cluster, with ``orders`` created by ``kcoord topics create`` and produced to."""
    assert cluster.state is not None
    servers = cluster.state.bootstrap_servers
    # The records' timestamps are years old: under the default retention.ms (7 days) the first
    # retention pass (log.initial.task.delay.ms, 30 s after start) deletes them, as Kafka's
    # would, and every offset read after it moves to the log end. Time retention is off here.
    run = kcoord(
        "topics", "create", "--topic", TOPIC, "--partitions", "3", "--replication-factor", "3",
        "--config", "retention.ms=-1", "--bootstrap-server", servers,
    )  # fmt: skip
    assert (run.code, run.out) == (0, f"Created topic {TOPIC}.\n"), run.err
    wait_for(lambda: _leaders(servers, TOPIC) == 3, "leaders of every orders partition")
    kafka_python(
        "produce", servers, counts={str(p): n for p, n in RECORDS.items()},
        base_timestamp_ms=BASE_TIMESTAMP_MS,
    )  # fmt: skip
    return servers


def _leaders(servers: str, topic: str) -> int:
    run = kcoord("topics", "describe", "--topic", topic, "--bootstrap-server", servers)
    return sum(1 for line in run.out.splitlines() if "\tLeader: " in line and "none" not in line)


def kafka_python(op: str, servers: str, **cmd: Any) -> Any:
    """One ``kafka_python_ops`` operation; its JSON answer."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.kafka_python_ops",
            _ops_command(op, servers, cmd),
        ],
        capture_output=True,
        text=True,
        timeout=OPS_TIMEOUT_S,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"kafka-python {op} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


def _ops_command(op: str, servers: str, cmd: dict[str, Any]) -> str:
    return json.dumps({"op": op, "bootstrap": servers.split(","), "topic": TOPIC, **cmd})


def commit(servers: str, group: str, offsets: dict[int, int]) -> None:
    """Commit as kafka-python does for a consumer without a subscription (generation -1)."""
    kafka_python("commit", servers, group=group, offsets={str(p): o for p, o in offsets.items()})


def committed(servers: str, group: str) -> dict[int, int | None]:
    """The group's committed offsets as kafka-python reads them (OffsetFetch of its own)."""
    answer = kafka_python("committed", servers, group=group, partitions=list(RECORDS))
    return {int(p): o for p, o in answer.items()}


def describe(servers: str, group: str, *view: str) -> Run:
    return kcoord("groups", "describe", "--group", group, *view, "--bootstrap-server", servers)


def reset(servers: str, group: str, *args: str) -> Run:
    return kcoord("groups", "reset-offsets", "--group", group, *args, "--bootstrap-server", servers)


# -- describe ----------------------------------------------------------------------------------


def test_describe_an_empty_group_shows_committed_offsets_and_lag(bootstrap: str) -> None:
    commit(bootstrap, "lagging", {0: 3, 1: 20})
    run = describe(bootstrap, "lagging")
    assert run.code == 0
    assert run.err == "Consumer group 'lagging' has no active members.\n"
    lines = run.out.splitlines()
    assert lines[:2] == ["", OFFSETS_HEADER]
    assert run.rows() == [
        ["lagging", TOPIC, "0", "3", "10", "7", "-", "-", "-"],
        ["lagging", TOPIC, "1", "20", "20", "0", "-", "-", "-"],
    ]
    # Kafka's widths: every column starts under its header.
    assert lines[2].index("10") == OFFSETS_HEADER.index("LOG-END-OFFSET")
    assert lines[2].index("7") == OFFSETS_HEADER.index("LAG")

    members = describe(bootstrap, "lagging", "--members")
    assert (members.code, members.out) == (0, "")
    assert members.err == "Consumer group 'lagging' has no active members.\n"

    state = describe(bootstrap, "lagging", "--state")
    assert state.out.splitlines()[1].split() == [
        "GROUP",
        "COORDINATOR",
        "(ID)",
        "ASSIGNMENT-STRATEGY",
        "STATE",
        "#MEMBERS",
    ]
    group, address, node, strategy, group_state, count = state.rows()[0]
    assert (group, strategy, group_state, count) == ("lagging", "-", "Empty", "0")
    # The coordinator is the leader of the group's __consumer_offsets partition.
    offsets = kcoord(
        "topics", "describe", "--topic", OFFSETS_TOPIC_NAME, "--bootstrap-server", bootstrap
    ).out.splitlines()[1:]
    leader = offsets[partition_for("lagging", len(offsets))].split("\tLeader: ")[1].split("\t")[0]
    assert node == f"({leader})"
    assert address in bootstrap.split(",")


def test_describe_a_group_that_does_not_exist(bootstrap: str) -> None:
    for view in ((), ("--members",), ("--state",)):
        run = describe(bootstrap, "no-such-group", *view)
        assert (run.code, run.out) == (1, "")
        assert run.err == "Error: Consumer group 'no-such-group' does not exist.\n"


# -- a live member -----------------------------------------------------------------------------


@contextlib.contextmanager
def live_member(
    cluster: LocalCluster, group: str, client_id: str, offsets: dict[int, int], log: Path
) -> Iterator[None]:
    """A kafka-python consumer in the group, assigned every partition, that has committed
    ``offsets``; it leaves the group on exit. Its failure message has the client's log and the
    nodes' (a member once stayed unassigned for 30 s in a CI run: kafka-python dropped the
    SyncGroup answer it had received; see kafka_python_ops.JOIN_POLL_MS)."""
    assert cluster.state is not None
    servers = cluster.state.bootstrap_servers
    cmd = _ops_command(
        "member",
        servers,
        {
            "group": group,
            "client_id": client_id,
            "partitions": len(RECORDS),
            "offsets": {str(p): o for p, o in offsets.items()},
        },
    )
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.kafka_python_ops", cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO,
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        # The member gives up (and exits, closing stdout) after its own deadline; one stuck
        # in the client (no node answering its metadata request) is given up on here.
        ready, _, _ = select.select([proc.stdout], [], [], OPS_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        assert json.loads(line or "null") == "assigned", (
            f"{log.read_text()[-4000:]}\n{cluster.log_tails(80)}"
        )
        yield
        proc.stdin.close()
        assert proc.wait(timeout=OPS_TIMEOUT_S) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()  # a no-op after the close above; not left to the GC on a failure
        proc.stdout.close()


def test_a_live_member_shows_in_every_view_and_blocks_reset_and_delete(
    cluster: LocalCluster, bootstrap: str, tmp_path: Path
) -> None:
    with live_member(cluster, "live", "live-member", {0: 4}, tmp_path / "member.stderr"):
        run = describe(bootstrap, "live")
        assert (run.code, run.err) == (0, "")
        rows = run.rows()
        member_id = rows[0][6]
        assert member_id.startswith("live-member-")
        # Uncommitted partitions show "-" for the offset and the lag.
        assert rows == [
            ["live", TOPIC, "0", "4", "10", "6", member_id, "/127.0.0.1", "live-member"],
            ["live", TOPIC, "1", "-", "20", "-", member_id, "/127.0.0.1", "live-member"],
            ["live", TOPIC, "2", "-", "5", "-", member_id, "/127.0.0.1", "live-member"],
        ]

        members = describe(bootstrap, "live", "--members", "--verbose")
        assert members.out.splitlines()[1].split() == [
            "GROUP",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
            "#PARTITIONS",
            "ASSIGNMENT",
        ]
        assert members.rows() == [
            ["live", member_id, "/127.0.0.1", "live-member", "3", f"{TOPIC}(0,1,2)"]
        ]
        assert describe(bootstrap, "live", "--members").rows() == [
            ["live", member_id, "/127.0.0.1", "live-member", "3"]
        ]
        state = describe(bootstrap, "live", "--state").rows()[0]
        assert (state[0], state[3:]) == ("live", ["range", "Stable", "1"])

        listed = kcoord("groups", "list", "--state", "Stable", "--bootstrap-server", bootstrap)
        assert listed.out.splitlines()[0].split() == ["GROUP", "STATE"]
        assert ["live", "Stable"] in listed.rows()
        assert all(state == "Stable" for _, state in listed.rows())

        refused = reset(bootstrap, "live", "--all-topics", "--to-earliest", "--execute")
        assert (refused.code, refused.out) == (1, "")
        assert refused.err == (
            "Error: Assignments can only be reset if the group 'live' is inactive, "
            "but the current state is Stable.\n"
        )
        deleted = kcoord("groups", "delete", "--group", "live", "--bootstrap-server", bootstrap)
        assert (deleted.code, deleted.out) == (1, "")
        assert deleted.err == (
            "Error: Deletion of some consumer groups failed:\n"
            "* Group 'live' could not be deleted due to: NON_EMPTY_GROUP\n"
        )
        # Its topic's offsets stay while a member is subscribed to it (KIP-496).
        refused = delete_offsets(bootstrap, "live", TOPIC)
        assert refused.code == 1
        assert refused.err == (
            "Error: Encounter some partition level error, see the follow-up details:\n"
        )
        assert refused.rows() == [
            [TOPIC, str(p), "Error:", "GROUP_SUBSCRIBED_TO_TOPIC"] for p in RECORDS
        ]
        assert kafka_python("delete_offsets", bootstrap, group="live", partitions=[[TOPIC, 0]]) == {
            f"{TOPIC}:0": "GroupSubscribedToTopicError"
        }
        assert committed(bootstrap, "live")[0] == 4

    # The member left: the group is Empty, and both go through.
    wait_for(
        lambda: describe(bootstrap, "live", "--state").rows()[0][4] == "Empty",
        "the group empty after its member left",
    )
    done = reset(bootstrap, "live", "--all-topics", "--to-latest", "--execute")
    assert (done.code, done.rows()) == (0, [["live", TOPIC, "0", "10"]])
    assert committed(bootstrap, "live") == {0: 10, 1: None, 2: None}
    deleted = kcoord("groups", "delete", "--group", "live", "--bootstrap-server", bootstrap)
    assert (deleted.code, deleted.out) == (
        0,
        "Deletion of requested consumer groups ('live') was successful.\n",
    )
    assert describe(bootstrap, "live").code == 1


# -- reset-offsets -----------------------------------------------------------------------------


def test_reset_offsets_dry_run_then_execute(bootstrap: str) -> None:
    commit(bootstrap, "resettable", {0: 3, 1: 20})
    before = committed(bootstrap, "resettable")
    assert before == {0: 3, 1: 20, 2: None}

    def plan(*args: str) -> list[list[str]]:
        run = reset(bootstrap, "resettable", *args)
        assert run.code == 0, run.err
        assert run.out.splitlines()[1].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
        return [row[2:] for row in run.rows()]

    assert plan("--topic", TOPIC, "--to-earliest") == [["0", "0"], ["1", "0"], ["2", "0"]]
    assert plan("--topic", TOPIC, "--to-latest", "--dry-run") == [
        ["0", "10"],
        ["1", "20"],
        ["2", "5"],
    ]
    # Clamped to the log end, and to the log start.
    assert plan("--topic", TOPIC, "--to-offset", "15") == [["0", "10"], ["1", "15"], ["2", "5"]]
    assert plan("--all-topics", "--shift-by", "-5") == [["0", "0"], ["1", "15"]]
    assert plan("--topic", f"{TOPIC}:1", "--shift-by", "7") == [["1", "20"]]
    # The first record at or after 22:13:25Z is the sixth of a partition; partition 2's last
    # record is older, so it falls back to the log end.
    at = reset(bootstrap, "resettable", "--topic", TOPIC, "--to-datetime", "2023-11-14T22:13:25Z")
    assert [row[2:] for row in at.rows()] == [["0", "5"], ["1", "5"], ["2", "5"]]
    # Neither --dry-run nor --execute: Kafka's warning that nothing is done.
    assert at.err == (
        "WARN: No action will be performed as the --execute option is missing. Add --dry-run "
        "to say so explicitly.\n"
        "Warn: Partition 2 from topic orders is empty. Falling back to latest known offset.\n"
    )
    assert committed(bootstrap, "resettable") == before  # nothing written by a dry run

    run = reset(bootstrap, "resettable", "--topic", f"{TOPIC}:0,1", "--to-offset", "7", "--execute")
    assert (run.code, run.rows()) == (
        0,
        [["resettable", TOPIC, "0", "7"], ["resettable", TOPIC, "1", "7"]],
    )
    assert committed(bootstrap, "resettable") == {0: 7, 1: 7, 2: None}
    assert [row[3:6] for row in describe(bootstrap, "resettable").rows()] == [
        ["7", "10", "3"],
        ["7", "20", "13"],
    ]


def test_reset_offsets_to_current_by_duration_and_through_a_file(
    bootstrap: str, tmp_path: Path
) -> None:
    commit(bootstrap, "replanned", {0: 3, 1: 20})

    def plan(*args: str) -> list[list[str]]:
        run = reset(bootstrap, "replanned", *args, "--dry-run")
        assert run.code == 0, run.err
        return [row[2:] for row in run.rows()]

    # The committed offsets, and the log end where there is none.
    assert plan("--topic", TOPIC, "--to-current") == [["0", "3"], ["1", "20"], ["2", "5"]]
    # Every record is older than a day ago: nothing at or after it, so the log end.
    day = reset(
        bootstrap, "replanned", "--topic", f"{TOPIC}:0", "--by-duration", "P1D", "--dry-run"
    )
    assert [row[2:] for row in day.rows()] == [["0", "10"]]
    assert "Partition 0 from topic orders is empty. Falling back" in day.err
    # Back far enough, every record is newer: the log start.
    assert plan("--all-topics", "--by-duration", "P3650D") == [["0", "0"], ["1", "0"]]

    # --export prints the plan as CSV; --from-file reads it back (clamped like --to-offset).
    exported = reset(bootstrap, "replanned", "--topic", TOPIC, "--to-offset", "4", "--export")
    assert (exported.code, exported.out) == (0, f"{TOPIC},0,4\n{TOPIC},1,4\n{TOPIC},2,4\n")
    csv = tmp_path / "plan.csv"
    csv.write_text(exported.out.replace(f"{TOPIC},1,4", f"{TOPIC},1,99"))
    run = reset(bootstrap, "replanned", "--from-file", str(csv), "--execute")
    assert (run.code, [row[2:] for row in run.rows()]) == (
        0,
        [["0", "4"], ["1", "20"], ["2", "4"]],
    )
    assert committed(bootstrap, "replanned") == {0: 4, 1: 20, 2: 4}

    # A file without the group; no scope at all: clear errors, nothing written.
    other = tmp_path / "other.csv"
    other.write_text(f"someone-else,{TOPIC},0,1\n")
    run = reset(bootstrap, "replanned", "--from-file", str(other), "--execute")
    assert (run.code, run.err) == (1, "Error: No reset plan for group replanned found\n")
    run = reset(bootstrap, "replanned", "--to-earliest", "--execute")
    assert (run.code, run.err) == (
        1,
        "Error: One of the reset scopes should be defined: --all-topics, --topic.\n",
    )
    assert committed(bootstrap, "replanned") == {0: 4, 1: 20, 2: 4}


def test_reset_offsets_errors_and_an_unknown_group(bootstrap: str) -> None:
    commit(bootstrap, "reset-errors", {0: 1})
    cases = {
        ("--topic", f"{TOPIC}:2", "--shift-by", "1"): (
            "Error: Cannot shift offset for partition orders-2 since there is no current "
            "committed offset\n"
        ),
        ("--topic", f"{TOPIC}:0,9", "--to-earliest"): (
            'Error: The partitions "orders-9" do not exist\n'
        ),
        ("--topic", "no-such-topic", "--to-earliest"): (
            "Error: Topic 'no-such-topic' does not exist\n"
        ),
        ("--all-topics", "--to-datetime", "Tuesday"): (
            "Error: invalid --to-datetime 'Tuesday': expected ISO 8601 like "
            "2024-05-01T12:00:00.000\n"
        ),
        ("--all-topics", "--to-datetime", "2024-05-01"): (
            "Error: invalid --to-datetime '2024-05-01': it does not contain a 'T' according "
            "to ISO 8601 format, like 2024-05-01T12:00:00.000\n"
        ),
    }
    for args, message in cases.items():
        run = reset(bootstrap, "reset-errors", *args, "--execute")
        assert (run.code, run.out, run.err) == (1, "", message), args
    assert committed(bootstrap, "reset-errors") == {0: 1, 1: None, 2: None}

    # A group that does not exist is Dead, which Kafka allows: the commit creates it.
    run = reset(bootstrap, "brand-new", "--topic", f"{TOPIC}:2", "--to-offset", "2", "--execute")
    assert (run.code, run.rows()) == (0, [["brand-new", TOPIC, "2", "2"]])
    assert committed(bootstrap, "brand-new") == {0: None, 1: None, 2: 2}


# -- list and delete ---------------------------------------------------------------------------


def delete_offsets(servers: str, group: str, *topics: str) -> Run:
    topic_args = [arg for topic in topics for arg in ("--topic", topic)]
    return kcoord(
        "groups", "delete-offsets", "--group", group, *topic_args, "--bootstrap-server", servers
    )


def test_delete_offsets_of_an_empty_group(bootstrap: str) -> None:
    commit(bootstrap, "trim", {0: 3, 1: 4, 2: 5})
    # kafka-python's admin client: partitions the metadata lacks are answered by the broker.
    answer = kafka_python(
        "delete_offsets",
        bootstrap,
        group="trim",
        partitions=[[TOPIC, 0], [TOPIC, 9], ["no-such-topic", 0]],
    )
    assert answer == {
        f"{TOPIC}:0": "NoError",
        f"{TOPIC}:9": "UnknownTopicOrPartitionError",
        "no-such-topic:0": "UnknownTopicOrPartitionError",
    }
    assert committed(bootstrap, "trim") == {0: None, 1: 4, 2: 5}

    run = delete_offsets(bootstrap, "trim", f"{TOPIC}:1", "no-such-topic")
    assert (run.code, run.err) == (1, "")
    assert run.out == (
        f"Request succeed for deleting offsets with topic {TOPIC}:1, no-such-topic group trim\n"
        "\n"
        "TOPIC                          PARTITION       STATUS\n"
        "no-such-topic                  Not Provided    Error: UNKNOWN_TOPIC_OR_PARTITION\n"
        f"{TOPIC:<30} 1               Successful\n"
    )
    assert committed(bootstrap, "trim") == {0: None, 1: None, 2: 5}
    # A topic without partitions is all of them; deleting what is not there succeeds.
    run = delete_offsets(bootstrap, "trim", TOPIC)
    assert (run.code, run.err) == (0, "")
    assert run.rows()[1:] == [[TOPIC, str(p), "Successful"] for p in RECORDS]
    assert committed(bootstrap, "trim") == {0: None, 1: None, 2: None}

    unknown = delete_offsets(bootstrap, "never-there", TOPIC)
    assert unknown.code == 1
    assert unknown.err == "Error: 'never-there' does not exist.\n"
    assert unknown.rows() == [[TOPIC, str(p), "Error:", "GROUP_ID_NOT_FOUND"] for p in RECORDS]
    assert kafka_python(
        "delete_offsets", bootstrap, group="never-there", partitions=[[TOPIC, 0]]
    ) == {"error": "GroupIdNotFoundError"}


def test_list_and_delete_groups(bootstrap: str) -> None:
    commit(bootstrap, "deletable", {0: 1})
    commit(bootstrap, "kept", {0: 1})
    names = kcoord("groups", "list", "--bootstrap-server", bootstrap)
    assert names.code == 0
    assert {"deletable", "kept"} <= set(names.out.split())
    empty = kcoord("groups", "list", "--state", "empty", "--bootstrap-server", bootstrap)
    assert ["deletable", "Empty"] in empty.rows() and ["kept", "Empty"] in empty.rows()
    every = kcoord("groups", "describe", "--all-groups", "--state", "--bootstrap-server", bootstrap)
    described = [line.split()[0] for line in every.out.splitlines() if line.strip()]
    assert {"deletable", "kept"} <= set(described) and "GROUP" in described
    assert "Consumer group 'kept' has no active members.\n" in every.err

    run = kcoord(
        "groups", "delete", "--group", "deletable", "--group", "never-existed",
        "--bootstrap-server", bootstrap,
    )  # fmt: skip
    assert run.code == 1
    assert run.err == (
        "Error: Deletion of some consumer groups failed:\n"
        "* Group 'never-existed' could not be deleted due to: GROUP_ID_NOT_FOUND\n"
    )
    assert run.out == "\nThese consumer groups were deleted successfully: 'deletable'\n"
    after = kcoord("groups", "list", "--bootstrap-server", bootstrap).out.split()
    assert "deletable" not in after and "kept" in after
    assert committed(bootstrap, "deletable") == {0: None, 1: None, 2: None}


# -- topics ------------------------------------------------------------------------------------


def test_topics_create_describe_list_delete(bootstrap: str) -> None:
    run = kcoord(
        "topics", "create", "--topic", "cli-topic", "--partitions", "4",
        "--replication-factor", "2", "--config", "retention.ms=3600000",
        "--bootstrap-server", bootstrap,
    )  # fmt: skip
    assert (run.code, run.out, run.err) == (0, "Created topic cli-topic.\n", "")
    wait_for(lambda: _leaders(bootstrap, "cli-topic") == 4, "leaders of cli-topic")

    lines = kcoord("topics", "describe", "--topic", "cli-topic", "--bootstrap-server", bootstrap)
    head, *partitions = lines.out.splitlines()
    fields = head.split("\t")
    assert fields[0] == "Topic: cli-topic"
    assert fields[1].startswith("TopicId: ") and len(fields[1]) == len("TopicId: ") + 22
    assert fields[2:4] == ["PartitionCount: 4", "ReplicationFactor: 2"]
    # DescribeConfigs: every config not at Kafka's default (TopicCommand's !isDefault): the
    # topic's own, and the cluster-level min.insync.replicas the controller wrote (KIP-966).
    assert fields[4] == "Configs: min.insync.replicas=2,retention.ms=3600000"
    assert len(partitions) == 4
    for index, line in enumerate(partitions):
        cells = dict(cell.split(": ", 1) for cell in line.strip("\t").split("\t"))
        assert (cells["Topic"], cells["Partition"]) == ("cli-topic", str(index))
        replicas = cells["Replicas"].split(",")
        assert len(set(replicas)) == 2 and set(replicas) <= {"1", "2", "3"}
        assert cells["Leader"] in replicas
        assert set(cells["Isr"].split(",")) <= set(replicas)

    listed = kcoord("topics", "list", "--bootstrap-server", bootstrap).out.splitlines()
    assert listed == sorted(listed) and {"cli-topic", TOPIC, OFFSETS_TOPIC_NAME} <= set(listed)
    internal = kcoord("topics", "list", "--exclude-internal", "--bootstrap-server", bootstrap)
    assert OFFSETS_TOPIC_NAME not in internal.out.split()

    again = kcoord("topics", "create", "--topic", "cli-topic", "--bootstrap-server", bootstrap)
    assert again.code == 1
    assert again.err.startswith(
        "Error while executing topic command : Topic 'cli-topic': TOPIC_ALREADY_EXISTS"
    )

    # kafka-topics.sh --alter: more partitions; fewer is the broker's INVALID_PARTITIONS.
    alter = ("topics", "alter", "--topic", "cli-topic", "--bootstrap-server", bootstrap)
    grown = kcoord(*alter, "--partitions", "6")
    assert (grown.code, grown.out, grown.err) == (0, "", "")
    wait_for(lambda: _leaders(bootstrap, "cli-topic") == 6, "leaders of 6 partitions")
    shrunk = kcoord(*alter, "--partitions", "2")
    assert shrunk.code == 1
    assert shrunk.err.startswith(
        "Error while executing topic command : Topic 'cli-topic': INVALID_PARTITIONS"
    )
    missing = kcoord(
        "topics", "alter", "--topic", "nope", "--partitions", "2", "--bootstrap-server", bootstrap
    )
    assert (missing.code, missing.err) == (
        1,
        "Error while executing topic command : Topic 'nope' does not exist as expected\n",
    )

    # --topic is a regular expression matching whole names (TopicCommand's IncludeList).
    describe = ("topics", "describe", "--bootstrap-server", bootstrap)
    matched = kcoord(*describe, "--topic", "cli-.*,nope")
    assert matched.out.startswith("Topic: cli-topic\t")
    assert matched.out == kcoord(*describe, "--topic", "cli-topic").out
    prefix = kcoord(*describe, "--topic", "cli")
    assert (prefix.code, prefix.err) == (
        1,
        "Error while executing topic command : Topic 'cli' does not exist as expected\n",
    )

    deleted = kcoord("topics", "delete", "--topic", "cli-t.*", "--bootstrap-server", bootstrap)
    assert (deleted.code, deleted.out, deleted.err) == (0, "", "")
    wait_for(
        lambda: (
            "cli-topic" not in kcoord("topics", "list", "--bootstrap-server", bootstrap).out.split()
        ),
        "cli-topic gone from the metadata",
    )
    gone = kcoord("topics", "describe", "--topic", "cli-topic", "--bootstrap-server", bootstrap)
    assert (gone.code, gone.out) == (1, "")
    assert gone.err == (
        "Error while executing topic command : Topic 'cli-topic' does not exist as expected\n"
    )
    twice = kcoord("topics", "delete", "--topic", "cli-topic", "--bootstrap-server", bootstrap)
    assert (twice.code, twice.err) == (
        1,
        "Error while executing topic command : Topic 'cli-topic' does not exist as expected\n",
    )
    for command in ("delete", "describe"):
        forgiven = kcoord(
            "topics",
            command,
            "--topic",
            "cli-topic",
            "--if-exists",
            "--bootstrap-server",
            bootstrap,
        )
        assert (forgiven.code, forgiven.out, forgiven.err) == (0, "", "")


def test_configs_describe_and_alter(bootstrap: str) -> None:
    created = kcoord(
        "topics", "create", "--topic", "tuned", "--config", "retention.ms=3600000",
        "--bootstrap-server", bootstrap,
    )  # fmt: skip
    assert created.code == 0, created.err
    topic = ("--entity-type", "topics", "--entity-name", "tuned", "--bootstrap-server", bootstrap)
    described = kcoord("configs", "describe", *topic)
    assert (described.code, described.out) == (
        0,
        "Dynamic configs for topic tuned are:\n"
        "  retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms="
        "3600000, DEFAULT_CONFIG:log.retention.ms=604800000}\n",
    )
    altered = kcoord(
        "configs", "alter", *topic, "--add-config",
        "cleanup.policy=[compact,delete],max.message.bytes=5000", "--delete-config", "retention.ms",
    )  # fmt: skip
    assert (altered.code, altered.out) == (0, "Completed updating config for topic tuned.\n")
    shown = kcoord("topics", "describe", "--topic", "tuned", "--bootstrap-server", bootstrap)
    assert shown.out.splitlines()[0].endswith(
        "\tConfigs: cleanup.policy=compact,delete,max.message.bytes=5000,min.insync.replicas=2"
    )
    every = kcoord("configs", "describe", *topic, "--all").out.splitlines()
    assert every[0] == "All configs for topic tuned are:"
    entries = {line.split("=", 1)[0].strip(): line for line in every[1:]}
    assert set(entries) == {name for name, d in TOPIC_CONFIGS.items() if not d.internal}
    assert entries["retention.ms"].startswith("  retention.ms=604800000 sensitive=false")
    # ConfigCommand: a key to delete must be one of the topic's configs.
    unknown = kcoord("configs", "alter", *topic, "--delete-config", "segment.ms,nosuchkey")
    assert (unknown.code, unknown.err) == (
        1,
        "Error while executing config command : Invalid config(s): nosuchkey\n",
    )
    unnamed = kcoord(
        "configs", "alter", "--entity-type", "topics", "--entity-name", "", "--add-config",
        "retention.ms=1", "--bootstrap-server", bootstrap,
    )  # fmt: skip
    assert (unnamed.code, unnamed.err) == (
        1,
        "Error while executing config command : topic '': INVALID_REQUEST (Default topic "
        "resources are not allowed.)\n",
    )
    refused = kcoord("configs", "alter", *topic, "--add-config", "retention.ms=soon")
    assert (refused.code, refused.err) == (
        1,
        "Error while executing config command : topic 'tuned': INVALID_CONFIG (Invalid value "
        "soon for configuration retention.ms: Not a number of type LONG)\n",
    )
    broker = ("--entity-type", "brokers", "--entity-name", "2", "--bootstrap-server", bootstrap)
    assert kcoord("configs", "describe", *broker).out == "Dynamic configs for broker 2 are:\n"
    static = kcoord("configs", "describe", *broker, "--all").out.splitlines()
    assert "  node.id=2 sensitive=false synonyms={STATIC_BROKER_CONFIG:node.id=2}" in static
    assert kcoord("configs", "alter", *broker, "--add-config", "a=b").code == 1
    # The cluster-level defaults (KIP-966: the first active controller wrote its own
    # min.insync.replicas).
    default = ("--entity-type", "brokers", "--entity-default", "--bootstrap-server", bootstrap)
    min_isr = "min.insync.replicas={v} sensitive=false synonyms={{DYNAMIC_DEFAULT_BROKER_CONFIG:"
    min_isr += "min.insync.replicas={v}}}"
    header = "Default configs for brokers in the cluster are:\n"
    assert kcoord("configs", "describe", *default).out == f"{header}  {min_isr.format(v=2)}\n"
    # Every broker, then the cluster-level defaults (ConfigCommand.describeConfig).
    brokers = kcoord("configs", "describe", *broker[:2], *broker[4:]).out
    assert brokers == "".join(f"Dynamic configs for broker {b} are:\n" for b in (1, 2, 3)) + (
        f"{header}  {min_isr.format(v=2)}\n"
    )
    altered = kcoord("configs", "alter", *default, "--add-config", "min.insync.replicas=1")
    assert (altered.code, altered.out) == (
        0,
        "Completed updating default config for brokers in the cluster.\n",
    )
    assert kcoord("configs", "describe", *default).out == f"{header}  {min_isr.format(v=1)}\n"
    removed = kcoord("configs", "alter", *default, "--delete-config", "min.insync.replicas")
    assert (removed.code, removed.err) == (
        1,
        "Error while executing config command : the brokers' defaults: INVALID_CONFIG "
        "(Cluster-level min.insync.replicas cannot be removed while ELR is enabled.)\n",
    )
    restored = kcoord("configs", "alter", *default, "--add-config", "min.insync.replicas=2")
    assert restored.code == 0, restored.err
    # Any topic config's broker synonym is a cluster-level default too; others are refused.
    retention = "log.retention.ms=86400000"
    added = kcoord("configs", "alter", *default, "--add-config", retention)
    assert added.code == 0, added.err
    assert kcoord("configs", "describe", *default).out == (
        f"{header}  {retention} sensitive=false synonyms={{DYNAMIC_DEFAULT_BROKER_CONFIG:"
        f"{retention}}}\n  {min_isr.format(v=2)}\n"
    )
    dirs = kcoord("configs", "alter", *default, "--add-config", "log.dirs=/elsewhere")
    assert (dirs.code, dirs.err) == (
        1,
        "Error while executing config command : the brokers' defaults: INVALID_REQUEST "
        "(Cannot update these configs dynamically: log.dirs (kcoord's cluster-level dynamic "
        "configs are the broker synonyms of topic configs, such as log.retention.ms))\n",
    )
    gone = kcoord("configs", "alter", *default, "--delete-config", "log.retention.ms")
    assert gone.code == 0, gone.err

    # Broker 2's loggers, changed on broker 2 alone (kafka-configs.sh --entity-type
    # broker-loggers).
    loggers = ("--entity-type", "broker-loggers", "--bootstrap-server", bootstrap)
    fetcher = "kcoord.node.replica_fetcher"

    def level(node: str) -> str:
        out = kcoord("configs", "describe", *loggers, "--entity-name", node).out.splitlines()
        assert out[0] == f"Dynamic configs for broker-logger {node} are:"
        line = next(x for x in out if x.startswith(f"  {fetcher}="))
        return line.split()[0].split("=")[1]

    before = level("2")
    set_debug = kcoord(
        "configs", "alter", *loggers, "--entity-name", "2", "--add-config", f"{fetcher}=DEBUG"
    )
    assert (set_debug.code, set_debug.out) == (
        0,
        "Completed updating config for broker-logger 2.\n",
    )
    assert (level("2"), level("1")) == ("DEBUG", before)
    unset = kcoord("configs", "alter", *loggers, "--entity-name", "2", "--delete-config", fetcher)
    assert unset.code == 0, unset.err
    assert level("2") == before
    nope = kcoord("configs", "alter", *loggers, "--entity-name", "2", "--add-config", "nope=INFO")
    assert (nope.code, nope.err) == (
        1,
        "Error while executing config command : Invalid broker logger(s): nope\n",
    )
    bad = kcoord(
        "configs", "alter", *loggers, "--entity-name", "2", "--add-config", f"{fetcher}=LOUD"
    )
    assert bad.code == 1 and "INVALID_CONFIG (Cannot set the log level of" in bad.err

    # A group's KIP-848 configs; the group need not exist.
    group = ("--entity-type", "groups", "--entity-name", "tuned", "--bootstrap-server", bootstrap)
    assert kcoord("configs", "describe", *group).out == "Dynamic configs for group tuned are:\n"
    altered = kcoord(
        "configs", "alter", *group, "--add-config", "consumer.heartbeat.interval.ms=6000"
    )
    assert (altered.code, altered.out) == (0, "Completed updating config for group tuned.\n")
    assert kcoord("configs", "describe", *group).out == (
        "Dynamic configs for group tuned are:\n"
        "  consumer.heartbeat.interval.ms=6000 sensitive=false synonyms={DYNAMIC_GROUP_CONFIG:"
        "consumer.heartbeat.interval.ms=6000, DEFAULT_CONFIG:group.consumer.heartbeat.interval.ms"
        "=5000}\n"
    )
    refused = kcoord("configs", "alter", *group, "--add-config", "consumer.session.timeout.ms=1")
    assert (refused.code, refused.err) == (
        1,
        "Error while executing config command : group 'tuned': INVALID_CONFIG (consumer.session."
        "timeout.ms must be in the range 45000 to 60000 inclusive.)\n",
    )


def create_short_lived(bootstrap: str) -> None:
    created = kcoord(
        "topics", "create", "--topic", "short-lived", "--partitions", "2",
        "--replication-factor", "3", "--bootstrap-server", bootstrap,
    )  # fmt: skip
    assert created.code == 0, created.err
    wait_for(lambda: _leaders(bootstrap, "short-lived") == 2, "leaders of short-lived")


def test_deleting_a_topic_deletes_the_offsets_committed_on_it(bootstrap: str) -> None:
    """Kafka's ``GroupCoordinatorService.onPartitionsDeleted``: once a topic is deleted, the
    coordinators write tombstones for every group's offsets on its partitions, so the group
    shows none and a topic created again under the name starts without them."""
    create_short_lived(bootstrap)
    kafka_python(
        "commit", bootstrap, group="outlives", topic="short-lived", offsets={"0": 0, "1": 0}
    )
    commit(bootstrap, "outlives", {0: 2})
    assert {row[1] for row in describe(bootstrap, "outlives").rows()} == {"short-lived", TOPIC}

    deleted = kcoord("topics", "delete", "--topic", "short-lived", "--bootstrap-server", bootstrap)
    assert deleted.code == 0, deleted.err
    wait_for(
        lambda: [row[1:4] for row in describe(bootstrap, "outlives").rows()] == [[TOPIC, "0", "2"]],
        "only the offsets of the topic still there",
    )
    create_short_lived(bootstrap)  # again, under the same name
    answer = kafka_python(
        "committed", bootstrap, group="outlives", topic="short-lived", partitions=[0, 1]
    )
    assert answer == {"0": None, "1": None}


# -- connecting --------------------------------------------------------------------------------


def test_clear_errors_when_nothing_answers(tmp_path: Path) -> None:
    port = free_base_port(1)  # nothing listens there
    run = kcoord("groups", "list", "--bootstrap-server", f"127.0.0.1:{port}")
    assert (run.code, run.out) == (1, "")
    assert run.err == (
        f"Error: cannot connect to any bootstrap server: 127.0.0.1:{port} (Connection refused)\n"
    )
    run = kcoord("topics", "list", "--data-dir", str(tmp_path))
    assert run.code == 1
    assert run.err.startswith(
        "Error while executing topic command : no --bootstrap-server given and no cluster state"
    )


def test_the_console_script_defaults_to_the_local_clusters_bootstrap(
    cluster: LocalCluster, bootstrap: str
) -> None:
    commit(bootstrap, "scripted", {1: 12})
    script = Path(sys.executable).parent / "kcoord"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kcoord.cli"]
    args = ["groups", "describe", "--group", "scripted", "--data-dir", str(cluster.root)]
    result = subprocess.run(
        [*command, *args, "--timeout-ms", str(COMMAND_TIMEOUT_MS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        OFFSETS_HEADER,
        "scripted        orders          1          12              20              8"
        "               -               -               -",
    ]
