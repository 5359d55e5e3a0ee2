"""The lab's fault proxies carry every Raft link of a node, whichever voter dials it.

A 3-node cluster on 127.0.0.1-3 behind the chaos proxy (``kcoord.chaos.links``), as the lab
runs it with a ``latency`` or ``reset`` nemesis. pysyncobj's voter with the greater address
dials, so node 3 dials both others and is dialled by none: a toxic on the proxy in front of its
own Raft port touched none of its Raft traffic. Stalling node 3's Raft links (a bandwidth
toxic of rate 0, which holds everything where latency would only slow it) now leaves it behind
the metadata the other two commit, until the links heal.
"""

from __future__ import annotations

import random
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from kcoord.chaos import links
from kcoord.node import launcher
from kcoord.node.config import flatten_toml
from kcoord.node.rpc_sync import call_sync
from tests.integration.cluster import free_base_port, wait_for

pytestmark = pytest.mark.integration

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
STALL = {"type": "bandwidth", "attributes": {"rate": 0}}  # nothing passes, connections stay


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[launcher.ClusterState, links.Links]]:
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    base = free_base_port(3, random.Random(seed), ports_per_node=10)
    planned = launcher.plan(tmp_path / "cluster", 3, base, hosts=HOSTS)
    (tmp_path / "cluster").mkdir()
    with links.running_proxy(planned, seed, tmp_path / "proxy.log") as proxies:
        common, per_node = links.node_overrides(planned, proxies)
        state = launcher.up(
            tmp_path / "cluster",
            3,
            base,
            hosts=HOSTS,
            overrides=common,
            node_overrides=per_node,
        )
        try:
            yield state, proxies
        finally:
            for node in state.nodes:
                launcher.stop_node(node, kill=True)


def topics_of(node: launcher.NodeProcess) -> set[str]:
    view: dict[str, Any] = call_sync(
        node.host, node.rpc_port, "DescribeNode", {"topics": True}, 2.0
    )
    return set(view["topics"])


def create(state: launcher.ClusterState, name: str) -> bool:
    """Create ``name`` through nodes 1 and 2 (node 3 may be the stalled controller)."""
    bootstrap = ",".join(f"{n.host}:{links.proxy_port(n, 'kafka')}" for n in state.nodes[:2])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        admin.create_topics([NewTopic(name, 1, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    return True


def test_a_toxic_on_node_3_reaches_the_raft_links_it_dials(
    proxied: tuple[launcher.ClusterState, links.Links],
) -> None:
    state, proxies = proxied
    one, two, three = state.nodes
    # Each dialler reaches the other voter through a proxy of its own.
    assert sorted(proxies.quorum_pairs) == [(2, 1), (3, 1), (3, 2)]
    for node in state.nodes:
        seen = voters_of(node)
        own = f"{node.node_id}@{node.host}:{links.proxy_port(node, 'quorum')}"
        assert own in seen
    create(state, "before")
    wait_for(lambda: all("before" in topics_of(n) for n in state.nodes), "every node's image")

    for stream in ("upstream", "downstream"):
        proxies.add_toxic(3, "quorum", stream=stream, **STALL)
    wait_for(lambda: create(state, "during-1"), "a topic created by nodes 1 and 2")
    wait_for(lambda: {"during-1"} <= topics_of(one) & topics_of(two), "nodes 1 and 2")
    wait_for(lambda: create(state, "during-2"), "a second topic")
    wait_for(lambda: {"during-2"} <= topics_of(one) & topics_of(two), "nodes 1 and 2")
    # Two commits of the majority went by without a byte of Raft to or from node 3.
    assert not {"during-1", "during-2"} & topics_of(three)

    proxies.heal()
    wait_for(lambda: {"during-1", "during-2"} <= topics_of(three), "node 3 after the heal")


def voters_of(node: launcher.NodeProcess) -> str:
    voters = flatten_toml(tomllib.loads(node.config_path.read_text()))["controller.quorum.voters"]
    assert isinstance(voters, str)
    return voters
