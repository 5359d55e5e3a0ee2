"""Run inside a lab network namespace: isolate the active controller, check it decides nothing.

Started by ``test_isolation.py`` with ``ip netns exec``. Nodes bind to 127.0.0.1-3 and run with
their own group ids, so ``iptables -m owner --gid-owner`` drops exactly one node's packets.
Exits non-zero with a message if any check fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kcoord.node import launcher
from kcoord.node.rpc_sync import call_sync
from tests.portpick import free_base_port

GROUPS = [42001, 42002, 42003]
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
SESSION_TIMEOUT_S = 3.0


def describe(node: launcher.NodeProcess, topics: bool = False) -> dict[str, Any]:
    # Room for a node slowed by the load: the watch of the majority calls this outside poll,
    # where one slow answer failed the scenario.
    result: dict[str, Any] = call_sync(
        node.host, node.rpc_port, "DescribeNode", {"topics": topics}, 5.0
    )
    return result


def poll(what: str, condition: Any, deadline_s: float = 60.0) -> Any:
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
        time.sleep(0.05)  # polling interval
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def iptables(*args: str) -> None:
    subprocess.run(["iptables", *args], check=True)


def led_epochs(view: dict[str, Any]) -> dict[int, tuple[int, int]]:
    parts = view["topics"]["__consumer_offsets"]["partitions"]
    return {p["partition"]: (p["leader"], p["leader_epoch"]) for p in parts}


def main() -> None:
    root = Path(sys.argv[1])
    # Chosen at run time, though the namespace is fresh: its loopback has nothing bound yet.
    base_port = free_base_port(3)
    print(f"base port {base_port}")
    state = launcher.up(root, 3, base_port, hosts=HOSTS, groups=GROUPS)
    rule = None
    try:
        nodes = {n.node_id: n for n in state.nodes}

        def agreed_controller() -> int | None:
            ids = {describe(n)["controller_id"] for n in nodes.values()}
            c = ids.pop() if len(ids) == 1 else None
            return c if c is not None and describe(nodes[c])["is_active_controller"] else None

        old = poll("an active controller", agreed_controller)
        majority = [i for i in nodes if i != old]
        # launcher.up returns once every listener is up; the offsets topic's partitions may
        # still be on their way into this node's image.
        before = poll(
            "the offsets topic in the majority's image",
            lambda: led_epochs(describe(nodes[majority[0]], topics=True)),
        )

        rule = ["OUTPUT", "-m", "owner", "--gid-owner", str(nodes[old].group), "-j", "DROP"]
        iptables("-A", *rule)

        def new_controller() -> int | None:
            views = [describe(nodes[i]) for i in majority]
            ids: set[int | None] = {v["controller_id"] for v in views}
            c = ids.pop() if len(ids) == 1 else None
            if c is not None and c in majority and describe(nodes[c])["is_active_controller"]:
                return c
            return None

        new = poll("the majority to elect a new controller", new_controller)
        # The new controller's broker sessions start when it becomes active (Controller's
        # BrokerHeartbeatManager takes activated_at_ms), not at the isolation: the window is
        # timed from the election, which may take far longer than a session timeout.
        elected_at = time.monotonic()
        # Watch the majority for twice the session timeout after the new controller would have
        # fenced anyone: its own members stay unfenced, their partitions keep their leaders.
        watched = 0
        while time.monotonic() - elected_at < 3 * SESSION_TIMEOUT_S:
            view = describe(nodes[new], topics=True)
            for i in majority:
                assert not view["brokers"][str(i)]["fenced"], f"majority node {i} was fenced"
            for partition, (leader, epoch) in led_epochs(view).items():
                old_leader, old_epoch = before[partition]
                if old_leader in majority:
                    assert (leader, epoch) == (old_leader, old_epoch), (
                        f"partition {partition} led by majority node {old_leader} changed to "
                        f"{leader} epoch {epoch} while node {old} was isolated"
                    )
            watched += 1
            time.sleep(0.1)  # sampling period
        assert watched > 0, "the majority was never watched"

        def old_fenced() -> dict[str, Any] | None:
            view = describe(nodes[new], topics=True)
            return view if view["brokers"][str(old)]["fenced"] else None

        # Fencing the isolated node moves its partitions in the same batch (FenceBroker with
        # their PartitionChange records), so the view that shows it fenced shows them moved.
        view = poll("the isolated node to be fenced", old_fenced, deadline_s=30.0)
        moved = [p for p, (leader, _) in led_epochs(view).items() if before[p][0] == old]
        assert moved, f"the isolated node {old} led no partition to move: {before}"
        assert all(led_epochs(view)[p][0] in majority for p in moved)

        epoch = describe(nodes[new])["controller_epoch"]
        iptables("-D", *rule)
        rule = None

        def rejoined() -> dict[str, Any] | None:
            # Read a majority member first: its offset only grows, so an isolated node at or
            # past it has caught up. The node rejoins in steps: its broker heartbeats have their
            # own connection, so the majority may unfence it before its Raft link is back (seen
            # in CI: unfenced, no leader known, two records behind).
            majority_view = describe(nodes[new])
            view = describe(nodes[old])
            settled = (
                not majority_view["brokers"][str(old)]["fenced"]
                and view["controller_id"] is not None
                and view["controller_id"] == majority_view["controller_id"]
                and view["metadata_offset"] >= majority_view["metadata_offset"]
            )
            return view if settled else None

        healed = poll("the isolated node to rejoin and follow the majority", rejoined)
        # It asked for votes while cut off (pre-vote, KIP-996) and raised no term, so its
        # return deposed nobody: the majority's controller kept its epoch.
        assert healed["controller_epoch"] == epoch, (healed, epoch)
        # It believes itself active only if it is the controller the majority follows.
        assert healed["is_active_controller"] == (healed["controller_id"] == old), healed
        assert healed["fenced_by_me"] == [], f"isolated node proposed fencing {healed}"
        print(json.dumps({"old_controller": old, "new_controller": new, "samples": watched}))
    finally:
        if rule is not None:
            iptables("-D", *rule)
        for n in state.nodes:
            launcher.stop_node(n, kill=True)


if __name__ == "__main__":
    main()
