"""The admin HTTP API and the Prometheus metrics on a live 3-node cluster, with real clients.

One cluster for the module, with ``admin.api.token`` set. kafka-python creates a 3-partition
topic (RF 2) and produces to it, then commits known offsets for a memberless group; a
``kcoord.chaos.member`` process makes a Stable group with a member. Checked:

- the JSON shapes of /api/v1/cluster, /topics, /topics/{name}, /groups and /groups/{id}, asked of
  every node (each answers for the whole cluster: groups are proxied to their coordinator,
  offsets read from each partition's leader);
- the lag each node reports (API and kafka_exporter metrics) equals the high watermark the
  producer reached minus the committed offset, and only the coordinator exports a group;
- 401 without the token or with a wrong one (/healthz and /readyz stay open), 404 for an
  unknown group or topic, 400 for a malformed topic name;
- Debian's ``prometheus`` with the shipped deploy/prometheus/prometheus.yml (targets rewritten to
  the local admin ports, the token added) scrapes every node (all targets up) and the key
  expressions return data. Skipped, saying so, when the binary is missing
  (``make test`` installs it with scripts/setup-prometheus.sh as root).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kcoord.node import launcher, metrics
from tests.integration.cluster import LocalCluster, wait_for
from tests.integration.prometheus_run import prometheus_binary, running_prometheus
from tests.integration.test_kafka_clients import run_client

pytestmark = pytest.mark.integration

TOKEN = "test-admin-token"
TOPIC = "admin-lag"
PARTITIONS = 3
MESSAGES = 60
LAG_GROUP = "admin-lag-group"
MEMBER_GROUP = "admin-member-group"
# What LAG_GROUP commits: partition -> offset (each below what the producer puts there).
COMMITTED = {0: 1, 1: 2, 2: 3}
DEADLINE_S = 45.0
REPO = Path(__file__).resolve().parents[2]
SHIPPED_PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"

# Commits offsets as a consumer without membership (generation -1): a "simple" group.
COMMIT_SCRIPT = """
import json, sys
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
cmd = json.loads(sys.argv[1])
consumer = KafkaConsumer(
    bootstrap_servers=cmd["bootstrap"], group_id=cmd["group"], enable_auto_commit=False
)
try:
    consumer.commit(
        {
            TopicPartition(cmd["topic"], int(p)): OffsetAndMetadata(o, "", -1)
            for p, o in cmd["offsets"].items()
        }
    )
finally:
    consumer.close()
print(json.dumps("committed"))
"""


# -- HTTP ------------------------------------------------------------------------------------


def http(node: launcher.NodeProcess, path: str, token: str | None = TOKEN) -> tuple[int, Any]:
    """(status, JSON body or text) of a GET on a node's admin port."""
    request = urllib.request.Request(
        f"http://{node.host}:{node.admin_port}{path}",
        headers={"Authorization": f"Bearer {token}"} if token is not None else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, body, kind = (
                response.status,
                response.read(),
                response.headers.get_content_type(),
            )
    except urllib.error.HTTPError as e:
        status, body, kind = e.code, e.read(), e.headers.get_content_type()
    return status, json.loads(body) if kind == "application/json" else body.decode()


def ok(node: launcher.NodeProcess, path: str) -> Any:
    status, body = http(node, path)
    assert status == 200, (node.node_id, path, status, body)
    return body


def scrape(node: launcher.NodeProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = ok(node, "/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = {"admin.api.token": TOKEN, "group.initial.rebalance.delay.ms": 0}
    with LocalCluster(tmp_path_factory.mktemp("admin-metrics"), overrides=overrides) as c:
        yield c


def nodes(cluster: LocalCluster) -> list[launcher.NodeProcess]:
    assert cluster.state is not None
    return cluster.state.nodes


@pytest.fixture(scope="module")
def produced(cluster: LocalCluster) -> dict[int, int]:
    """The topic, produced to: partition -> high watermark (messages acknowledged there)."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    run_client(
        "kafka-python",
        {
            "op": "create_topic",
            "bootstrap": bootstrap,
            "topic": TOPIC,
            "partitions": PARTITIONS,
            "replication_factor": 2,
        },
    )
    acked = run_client(
        "kafka-python",
        {"op": "produce", "bootstrap": bootstrap, "topic": TOPIC, "count": MESSAGES, "prefix": "m"},
    )
    ends: dict[int, int] = {}
    for partition, offset, _, _ in acked:
        ends[int(partition)] = max(ends.get(int(partition), 0), int(offset) + 1)
    assert set(ends) == set(range(PARTITIONS)), "keys spread over every partition"
    assert all(ends[p] > COMMITTED[p] for p in COMMITTED), ends
    return ends


@pytest.fixture(scope="module")
def committed(cluster: LocalCluster, produced: dict[int, int]) -> dict[int, int]:
    assert cluster.state is not None
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            COMMIT_SCRIPT,
            json.dumps(
                {
                    "bootstrap": cluster.state.bootstrap_servers,
                    "group": LAG_GROUP,
                    "topic": TOPIC,
                    "offsets": COMMITTED,
                }
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return COMMITTED


# -- the admin API ---------------------------------------------------------------------------


def test_token_required_but_not_for_probes(cluster: LocalCluster) -> None:
    for node in nodes(cluster):
        for path in ("/api/v1/cluster", "/api/v1/topics", "/api/v1/groups", "/metrics"):
            status, body = http(node, path, token=None)
            assert status == 401, (node.node_id, path)
            assert body["error"]["status"] == 401
            assert http(node, path, token="not-the-token")[0] == 401
        assert http(node, "/healthz", token=None)[0] == 200
        status, body = http(node, "/readyz", token=None)
        assert (status, body["ready"]) == (200, True), body


def test_cluster_view_is_the_same_from_every_node(cluster: LocalCluster) -> None:
    views = [ok(node, "/api/v1/cluster") for node in nodes(cluster)]
    assert len({v["cluster_id"] for v in views}) == 1
    assert len({v["controller"]["node_id"] for v in views}) == 1
    for node, view in zip(nodes(cluster), views, strict=True):
        assert view["node_id"] == node.node_id
        assert [b["node_id"] for b in view["brokers"]] == [1, 2, 3]
        assert not any(b["fenced"] for b in view["brokers"])
        assert view["brokers"][node.node_id - 1]["endpoints"]["admin"] == (
            f"{node.host}:{node.admin_port}"
        )
        quorum = view["quorum"]
        assert quorum["leader_id"] == view["controller"]["node_id"]
        assert sorted(v["node_id"] for v in quorum["voters"]) == [1, 2, 3]
        # The leader's view: every voter has fetched up to somewhere.
        assert all(v["log_end_offset"] >= 0 for v in quorum["voters"]), quorum


def test_the_brokers_view_answers_while_the_active_controller_is_paused(
    cluster: LocalCluster,
) -> None:
    """``/api/v1/brokers`` is the node's own image, no call to the controller: it answers at
    once while the active controller is stopped (``/api/v1/cluster`` asks it and waits up to
    2 s, which left the compose chaos runner's fencing watch blind during such a pause)."""
    cluster_view = ok(nodes(cluster)[0], "/api/v1/cluster")
    for node in nodes(cluster):
        view = ok(node, "/api/v1/brokers")
        assert view["node_id"] == node.node_id
        assert [b["node_id"] for b in view["brokers"]] == [1, 2, 3]
    controller = cluster_view["controller"]["node_id"]
    [paused] = [n for n in nodes(cluster) if n.node_id == controller]
    assert paused.pid is not None
    others = [n for n in nodes(cluster) if n.node_id != controller]
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        for node in others:
            url = f"http://{node.host}:{node.admin_port}/api/v1/brokers"
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
            # The fencing watch gives a poll 0.5 s; 1.8 s leaves room on a loaded machine and
            # is still less than the 2 s (RPC_TIMEOUT_S) a call to the paused controller takes.
            with urllib.request.urlopen(request, timeout=1.8) as response:
                view = json.loads(response.read())
            assert [b["node_id"] for b in view["brokers"]] == [1, 2, 3], view
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    cluster.wait_ready()


def test_topics_with_offsets_from_their_leaders(
    cluster: LocalCluster, produced: dict[int, int]
) -> None:
    for node in nodes(cluster):
        listed = {t["name"]: t for t in ok(node, "/api/v1/topics")["topics"]}
        assert listed[TOPIC]["partitions"] == PARTITIONS
        assert listed[TOPIC]["replication_factor"] == 2
        assert listed["__consumer_offsets"]["internal"] is True
        topic = ok(node, f"/api/v1/topics/{TOPIC}")
        assert [p["partition"] for p in topic["partitions"]] == list(range(PARTITIONS))
        for p in topic["partitions"]:
            assert p["leader"] in p["replicas"] and len(p["replicas"]) == 2
            assert p["leader"] in p["isr"]
            assert p["high_watermark"] == p["log_end_offset"] == produced[p["partition"]], p
            assert p["log_start_offset"] == 0
            assert p["offline"] is False


def test_group_offsets_and_lag(
    cluster: LocalCluster, produced: dict[int, int], committed: dict[int, int]
) -> None:
    expected_lag = {p: produced[p] - committed[p] for p in committed}
    for node in nodes(cluster):  # proxied to the coordinator from the others
        group = wait_for(
            functools.partial(_group_with_offsets, node, LAG_GROUP),
            f"{LAG_GROUP} from {node.node_id}",
        )
        assert group["state"] == "Empty" and group["members"] == []
        rows = {r["partition"]: r for r in group["offsets"] if r["topic"] == TOPIC}
        assert {p: r["committed_offset"] for p, r in rows.items()} == committed
        assert {p: r["log_end_offset"] for p, r in rows.items()} == produced
        assert {p: r["lag"] for p, r in rows.items()} == expected_lag
        assert group["lag"] == sum(expected_lag.values())
        assert group["lag_unknown_partitions"] == 0
        assert all(r["member_id"] is None for r in rows.values())
    listed = ok(nodes(cluster)[0], "/api/v1/groups")
    entry = next(g for g in listed["groups"] if g["group_id"] == LAG_GROUP)
    assert entry["state"] == "Empty"
    assert entry["coordinator"] == group["coordinator"]["node_id"]
    assert listed["unavailable"] == []


def _group_with_offsets(node: launcher.NodeProcess, group_id: str) -> dict[str, Any] | None:
    status, body = http(node, f"/api/v1/groups/{urllib.parse.quote(group_id, safe='')}")
    if status != 200 or not body["offsets"]:
        return None
    result: dict[str, Any] = body
    return result


def test_lag_metrics_come_from_the_coordinator_only(
    cluster: LocalCluster, produced: dict[int, int], committed: dict[int, int]
) -> None:
    coordinator = ok(nodes(cluster)[0], f"/api/v1/groups/{LAG_GROUP}")["coordinator"]["node_id"]
    per_node = {node.node_id: scrape(node) for node in nodes(cluster)}
    for node_id, samples in per_node.items():
        lags = {
            dict(labels)["partition"]: value
            for (name, labels), value in samples.items()
            if name == "kafka_consumergroup_lag" and dict(labels)["consumergroup"] == LAG_GROUP
        }
        if node_id != coordinator:
            assert lags == {}, node_id
            continue
        assert lags == {str(p): float(produced[p] - committed[p]) for p in committed}
        key = (("consumergroup", LAG_GROUP), ("topic", TOPIC))
        assert samples[("kafka_consumergroup_lag_sum", key)] == sum(
            produced[p] - committed[p] for p in committed
        )
        assert samples[("kafka_consumergroup_current_offset_sum", key)] == sum(committed.values())
        assert samples[("kafka_consumergroup_members", (("consumergroup", LAG_GROUP),))] == 0
    # Each partition's current offset comes from its leader alone.
    offsets: dict[str, list[float]] = {}
    for samples in per_node.values():
        for (name, labels), value in samples.items():
            if name == "kafka_topic_partition_current_offset" and dict(labels)["topic"] == TOPIC:
                offsets.setdefault(dict(labels)["partition"], []).append(value)
    assert offsets == {str(p): [float(n)] for p, n in produced.items()}
    for samples in per_node.values():
        assert samples[("kafka_brokers", ())] == 3


def test_every_documented_family_is_served(
    cluster: LocalCluster, committed: dict[int, int]
) -> None:
    """The family table in node/metrics.py's docstring is what the nodes serve (some families
    only on some nodes: the Raft leader's match indexes, the coordinator's groups)."""
    doc = metrics.__doc__ or ""
    table = doc[doc.index("The families") : doc.index("    process ")]
    documented = set(re.findall(r"\b((?:kcoord|kafka)_[a-z_]+)", table))
    assert len(documented) > 60, documented
    served: set[str] = set()
    for node in nodes(cluster):
        text = ok(node, "/metrics")
        served |= {family.name for family in text_string_to_metric_families(text)}
    missing = {name for name in documented if name.removesuffix("_total") not in served}
    assert not missing, sorted(missing)
    undocumented = {
        name
        for name in served
        if name.startswith(("kcoord_", "kafka_"))
        and name not in documented
        and f"{name}_total" not in documented
    }
    assert not undocumented, sorted(undocumented)


def test_every_node_keeps_applying_the_controllers_no_ops(cluster: LocalCluster) -> None:
    """KIP-835: with nothing else written, each node's metadata offset still moves (the active
    controller's NoOp every metadata.max.idle.interval.ms, 500 ms), and each serves how long
    ago it applied a batch. Without the NoOps an idle cluster's offsets stood still."""
    start = {n.node_id: scrape(n)[("kcoord_metadata_offset", ())] for n in nodes(cluster)}

    def moved() -> dict[int, dict[str, float]] | None:
        now = {n.node_id: scrape(n) for n in nodes(cluster)}
        if any(s[("kcoord_metadata_offset", ())] < start[i] + 3 for i, s in now.items()):
            return None
        return {
            i: {
                "offset": s[("kcoord_metadata_offset", ())],
                "age": s[("kcoord_metadata_last_applied_age_seconds", ())],
            }
            for i, s in now.items()
        }

    seen = wait_for(moved, "three NoOps applied on every node", DEADLINE_S)
    assert all(view["age"] >= 0 for view in seen.values()), seen


@contextlib.contextmanager
def group_member(
    cluster: LocalCluster, client: str, group: str, protocol: str, log_dir: Path
) -> Iterator[None]:
    """A ``kcoord.chaos.member`` process consuming TOPIC in ``group``, stopped at the end."""
    assert cluster.state is not None
    cfg = {
        "client": client,
        "bootstrap": cluster.state.bootstrap_servers,
        "group": group,
        "topic": TOPIC,
        "name": "admin-member",
        "assignor": "range",
        "instance_id": None,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 500,
        "max_poll_interval_ms": 30_000,
        "metadata_max_age_ms": 5000,
        "debug": False,
        "group_protocol": protocol,
    }
    with open(log_dir / f"{group}.stderr", "wb") as err:
        member = subprocess.Popen(
            [sys.executable, "-m", "kcoord.chaos.member", json.dumps(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield
    except BaseException:
        print((log_dir / f"{group}.stderr").read_text(errors="replace")[-3000:])
        raise
    finally:
        member.send_signal(signal.SIGTERM)
        try:
            member.wait(timeout=20)
        except subprocess.TimeoutExpired:
            member.kill()
            member.wait()


def test_a_stable_group_with_its_member(
    cluster: LocalCluster, produced: dict[int, int], tmp_path: Path
) -> None:
    with group_member(cluster, "kafka-python", MEMBER_GROUP, "classic", tmp_path):
        # Stable, and the member committed everything it read (it reads from the start).
        group = wait_for(
            functools.partial(_stable_and_caught_up, nodes(cluster)[1], MEMBER_GROUP, produced),
            f"{MEMBER_GROUP} Stable with every partition committed",
            DEADLINE_S,
        )
        assert group["protocol_type"] == "consumer" and group["protocol"] == "range"
        assert group["generation_id"] >= 1
        [m] = group["members"]
        assert group["leader"] == m["member_id"]
        assert m["client_id"] == "admin-member" and m["client_host"] == "/127.0.0.1"
        assert m["assignment"] == [{"topic": TOPIC, "partitions": list(range(PARTITIONS))}]
        for row in group["offsets"]:
            assert row["member_id"] == m["member_id"] and row["client_id"] == "admin-member"
            assert row["lag"] == 0
        stable = ok(nodes(cluster)[2], "/api/v1/groups?state=stable")["groups"]
        assert MEMBER_GROUP in [g["group_id"] for g in stable]
        assert LAG_GROUP not in [g["group_id"] for g in stable]
        # The rebalance timeline (DESIGN §8): the member's join, its generation, Stable.
        steps = [(e["state"], e["generation"], e["members"]) for e in group["timeline"]]
        assert steps[:3] == [
            ("PreparingRebalance", 0, 1),
            ("CompletingRebalance", 1, 1),
            ("Stable", 1, 1),
        ], group["timeline"]
        assert group["timeline"][0]["reason"].startswith(f"Adding new member {m['member_id']}")
        coordinator = next(
            n for n in nodes(cluster) if n.node_id == group["coordinator"]["node_id"]
        )
        events = ok(coordinator, "/api/v1/rebalances?limit=10000")["events"]
        mine = [e for e in events if e["group_id"] == MEMBER_GROUP]
        assert [e["state"] for e in mine[:3]] == [s for s, _, _ in steps[:3]]
        assert http(coordinator, "/api/v1/rebalances?limit=0")[0] == 400


def test_a_kip848_consumer_group(
    cluster: LocalCluster, produced: dict[int, int], tmp_path: Path
) -> None:
    group_id = "admin-kip848-group"
    with group_member(cluster, "confluent-kafka", group_id, "consumer", tmp_path):
        group = wait_for(
            functools.partial(_stable_and_caught_up, nodes(cluster)[0], group_id, produced),
            f"{group_id} Stable with every partition committed",
            DEADLINE_S,
        )
        assert group["protocol_type"] == "consumer" and group["generation_id"] >= 1
        [m] = group["members"]
        assert m["client_id"] == "admin-member" and m["member_epoch"] >= 1
        assert m["assignment"] == [{"topic": TOPIC, "partitions": list(range(PARTITIONS))}]
        assert all(row["member_id"] == m["member_id"] for row in group["offsets"])
        assert group["protocol"] == "uniform"  # the group's server assignor
        first = group["timeline"][0]
        assert (first["protocol"], first["state"], first["generation"]) == (
            "consumer",
            "Reconciling",
            1,
        ), group["timeline"]
        assert first["reason"] == f"member {m['member_id']} joined"
        coordinator = next(
            n for n in nodes(cluster) if n.node_id == group["coordinator"]["node_id"]
        )
        samples = scrape(coordinator)
        assert samples[("kafka_consumergroup_members", (("consumergroup", group_id),))] == 1
        assert (
            samples[
                (
                    "kcoord_coordinator_groups",
                    (("protocol", "consumer"), ("protocol_type", "consumer"), ("state", "Stable")),
                )
            ]
            >= 1
        )


def _stable_and_caught_up(
    node: launcher.NodeProcess, group_id: str, produced: dict[int, int]
) -> dict[str, Any] | None:
    status, body = http(node, f"/api/v1/groups/{group_id}")
    if status != 200 or body["state"] != "Stable" or len(body["members"]) != 1:
        return None
    committed = {r["partition"]: r["committed_offset"] for r in body["offsets"]}
    if committed != produced:
        return None
    result: dict[str, Any] = body
    return result


def test_unknown_and_malformed_names(cluster: LocalCluster) -> None:
    node = nodes(cluster)[0]
    status, body = http(node, "/api/v1/groups/no-such-group")
    assert status == 404 and "no-such-group" in body["error"]["message"]
    status, body = http(node, "/api/v1/topics/no-such-topic")
    assert status == 404 and "no-such-topic" in body["error"]["message"]
    status, body = http(node, "/api/v1/topics/bad%20name")
    assert status == 400
    status, body = http(node, "/api/v1/groups?state=Sleeping")
    assert status == 400
    # The node is still fine.
    assert http(node, "/healthz")[0] == 200


# -- Prometheus ------------------------------------------------------------------------------

# Expressions a dashboard would chart; each must return data from a live cluster.
KEY_EXPRESSIONS = (
    'up{job="kcoord"}',
    "sum(kcoord_controller_active)",
    'kcoord_raft_state{state="leader"} == 1',
    "max(kcoord_raft_commit_index)",
    "kcoord_raft_epoch",
    "sum(kcoord_controller_fenced_brokers)",
    "sum(kcoord_controller_offline_partitions)",
    "max(kafka_brokers)",
    f'sum by (consumergroup, topic) (kafka_consumergroup_lag{{consumergroup="{LAG_GROUP}"}})',
    "kafka_consumergroup_current_offset_sum",
    "kafka_consumergroup_members",
    f'kafka_topic_partition_current_offset{{topic="{TOPIC}"}}',
    'sum(kcoord_coordinator_shards{state="active"})',
    "sum by (state) (kcoord_coordinator_groups)",
    "sum(kcoord_coordinator_standby_lag_offsets)",
    "sum(rate(kcoord_coordinator_offset_commits_total[1m]))",
    "sum(rate(kcoord_coordinator_rebalances_completed_total[1m]))",
    "sum by (api) (rate(kcoord_kafka_requests_total[1m]))",
    "histogram_quantile(0.99, sum by (le, api) "
    "(rate(kcoord_kafka_request_duration_seconds_bucket[1m])))",
    "histogram_quantile(0.99, sum by (le) "
    "(rate(kcoord_controller_commit_latency_seconds_bucket[1m])))",
    f'kcoord_partition_high_watermark{{topic="{TOPIC}"}}',
    "sum(kcoord_replica_under_replicated_partitions)",
    "sum(rate(kcoord_log_appended_bytes_total[1m]))",
    "sum(kcoord_kafka_connections)",
    "process_resident_memory_bytes",
)


def prometheus_config(cluster: LocalCluster, token: str) -> str:
    """The shipped config with its compose targets replaced by this cluster's admin ports."""
    text = SHIPPED_PROMETHEUS_CONFIG.read_text()
    for node in nodes(cluster):
        target = f'"kcoord-{node.node_id}:8080"'
        assert target in text, f"{target} not in {SHIPPED_PROMETHEUS_CONFIG}"
        text = text.replace(target, f'"{node.host}:{node.admin_port}"')
    # Faster than the shipped 5 s, so rates have two samples within seconds.
    text = re.sub(r"scrape_interval: \S+", "scrape_interval: 1s", text)
    text = re.sub(r"scrape_timeout: \S+", "scrape_timeout: 1s", text)
    text = re.sub(r"evaluation_interval: \S+", "evaluation_interval: 1s", text)
    return text.replace(
        "    metrics_path: /metrics\n",
        f"    metrics_path: /metrics\n    authorization:\n      type: Bearer\n"
        f"      credentials: {token}\n",
    )


def prom_get(port: int, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{query}", timeout=10) as r:
        return json.loads(r.read())


def test_prometheus_scrapes_every_node(
    cluster: LocalCluster, committed: dict[int, int], tmp_path: Path
) -> None:
    binary = prometheus_binary("the metrics are still checked through /metrics")
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(cluster, TOKEN))
    with running_prometheus(binary, config, tmp_path) as port:
        try:
            wait_for(lambda: _ready(port), "prometheus ready", DEADLINE_S)

            def all_up() -> list[dict[str, Any]] | None:
                targets = prom_get(port, "/api/v1/targets")["data"]["activeTargets"]
                up = [t for t in targets if t["health"] == "up"]
                return targets if len(targets) == 3 and len(up) == 3 else None

            targets = wait_for(all_up, "every kcoord target up", DEADLINE_S)
            assert sorted(t["labels"]["node"] for t in targets) == ["1", "2", "3"]
            for expression in KEY_EXPRESSIONS:
                wait_for(
                    functools.partial(_query_result, port, expression),
                    f"data for {expression}",
                    DEADLINE_S,
                )
            total = prom_get(
                port,
                "/api/v1/query",
                query=f'sum(kafka_consumergroup_current_offset_sum{{consumergroup="{LAG_GROUP}"}})',
            )["data"]["result"]
            assert float(total[0]["value"][1]) == sum(committed.values())
            active = prom_get(port, "/api/v1/query", query="sum(kcoord_controller_active)")
            assert float(active["data"]["result"][0]["value"][1]) == 1
        except BaseException:
            print((tmp_path / "prometheus.log").read_text(errors="replace")[-4000:])
            raise


def _query_result(port: int, expression: str) -> list[Any]:
    result: list[Any] = prom_get(port, "/api/v1/query", query=expression)["data"]["result"]
    return result


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False
