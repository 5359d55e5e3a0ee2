"""The Grafana dashboards and the image's healthcheck against a live 3-node local cluster.

One cluster for the module (ports chosen at run time, always stopped). kafka-python creates a
3-partition topic (RF 3), produces to it, and a subscribed consumer group reads part of it and
commits, so the group, lag, rebalance and commit families have series. Checked:

- every metric name a dashboard expression or variable reads is served by a node's /metrics
  (``up`` excepted: Prometheus makes it);
- with Debian's ``prometheus`` running the shipped deploy/prometheus/prometheus.yml (targets
  rewritten to the local admin ports), every expression evaluates and returns data, but for
  the error counters whose series only appear with the first error (``MAY_BE_EMPTY``): those
  must still evaluate. Skipped, saying so, without the binary (``make test`` installs it);
- the Dockerfile's HEALTHCHECK one-liner exits 0 against a live admin port and non-zero
  against a closed one.
"""

from __future__ import annotations

import json
import re
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

from kcoord.node import launcher
from tests import deploy_files as files
from tests.integration.cluster import LocalCluster, wait_for
from tests.integration.prometheus_run import prometheus_binary, running_prometheus
from tests.integration.test_kafka_clients import run_client
from tests.portpick import free_ports

pytestmark = pytest.mark.integration

TOPIC = "dashboards"
GROUP = "dashboards-group"
PARTITIONS = 3
MESSAGES = 30
DEADLINE_S = 45.0
# Families whose series appear only with the first error: an expression reading them alone may
# return nothing on a healthy cluster, but Prometheus must still evaluate it.
MAY_BE_EMPTY = frozenset(
    {"kcoord_kafka_request_errors_total", "kcoord_coordinator_offset_commit_errors_total"}
)
# Prometheus makes these; no node serves them.
SYNTHETIC = frozenset({"up"})

# A subscribed kafka-python consumer: joins the group (a rebalance), reads what it is given
# until it has `expect` records, commits synchronously and leaves. It subscribes once the
# topic's partitions are known and polls 2 s at a time until assigned, as kafka_python_ops
# does, away from the kafka-python 3.0.12 bug that leaves a member unassigned (JOIN_POLL_MS).
CONSUME_AND_COMMIT = """
import json, sys, time
from kafka import KafkaConsumer
from kafka.errors import KafkaError
cmd = json.loads(sys.argv[1])
consumer = KafkaConsumer(
    bootstrap_servers=cmd["bootstrap"],
    group_id=cmd["group"],
    enable_auto_commit=False,
    auto_offset_reset="earliest",
    max_poll_records=5,
)
try:
    seen = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if consumer.partitions_for_topic(cmd["topic"]):
                break
        except KafkaError:  # a failed metadata request: asked again
            pass
    consumer.subscribe([cmd["topic"]])
    while seen < cmd["expect"] and time.monotonic() < deadline:
        timeout_ms = 500 if consumer.assignment() else 2000
        seen += sum(len(r) for r in consumer.poll(timeout_ms=timeout_ms).values())
    consumer.commit()
finally:
    consumer.close()
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = {"group.initial.rebalance.delay.ms": 0}
    with LocalCluster(tmp_path_factory.mktemp("dashboards"), overrides=overrides) as c:
        yield c


def nodes(cluster: LocalCluster) -> list[launcher.NodeProcess]:
    assert cluster.state is not None
    return cluster.state.nodes


@pytest.fixture(scope="module")
def workload(cluster: LocalCluster) -> None:
    """A topic produced to and a group that committed part of it (so it has lag)."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    run_client(
        "kafka-python",
        {
            "op": "create_topic",
            "bootstrap": bootstrap,
            "topic": TOPIC,
            "partitions": PARTITIONS,
            "replication_factor": 3,
        },
    )
    run_client(
        "kafka-python",
        {"op": "produce", "bootstrap": bootstrap, "topic": TOPIC, "count": MESSAGES, "prefix": "d"},
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CONSUME_AND_COMMIT,
            json.dumps({"bootstrap": bootstrap, "topic": TOPIC, "group": GROUP, "expect": 5}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) >= 5


def served_names(node: launcher.NodeProcess) -> set[str]:
    """Every name a PromQL selector can read from a node's /metrics: the samples' names and the
    families' (so a counter or histogram without series yet still counts as served)."""
    url = f"http://{node.host}:{node.admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        names.update(sample.name for sample in family.samples)
    return names


def test_every_dashboard_metric_is_served(cluster: LocalCluster, workload: None) -> None:
    served: set[str] = set()
    for node in nodes(cluster):
        served |= served_names(node)
    used = {name for e in files.expressions() for name in files.metric_names(e.query)}
    assert used, "the dashboards read no metric"
    missing = sorted(used - served - SYNTHETIC)
    assert not missing, f"dashboard metrics no node serves: {missing}"


# -- Prometheus ------------------------------------------------------------------------------


def prometheus_config(cluster: LocalCluster) -> str:
    """The shipped config with its compose targets replaced by this cluster's admin ports."""
    text = files.PROMETHEUS_CONFIG.read_text()
    for node in nodes(cluster):
        target = f'"kcoord-{node.node_id}:8080"'
        assert target in text, f"{target} not in {files.PROMETHEUS_CONFIG}"
        text = text.replace(target, f'"{node.host}:{node.admin_port}"')
    # Faster than the shipped 5 s, so rates over the 1 m rate interval have samples at once.
    text = re.sub(r"scrape_interval: \S+", "scrape_interval: 1s", text)
    text = re.sub(r"scrape_timeout: \S+", "scrape_timeout: 1s", text)
    return re.sub(r"evaluation_interval: \S+", "evaluation_interval: 1s", text)


def prom_query(port: int, query: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as e:  # 400 for an expression Prometheus refuses
        body = json.loads(e.read())
    return body


def prom_targets(port: int) -> list[dict[str, Any]] | None:
    url = f"http://127.0.0.1:{port}/api/v1/targets"
    with urllib.request.urlopen(url, timeout=10) as response:
        targets: list[dict[str, Any]] = json.loads(response.read())["data"]["activeTargets"]
    return targets if len(targets) == 3 and all(t["health"] == "up" for t in targets) else None


def test_every_dashboard_expression_returns_data(
    cluster: LocalCluster, workload: None, tmp_path: Path
) -> None:
    binary = prometheus_binary("the metric names are still checked against /metrics")
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(cluster))
    log = tmp_path / "prometheus.log"
    with running_prometheus(binary, config, tmp_path) as port:
        try:
            wait_for(lambda: prom_targets(port), "every kcoord target up", DEADLINE_S)
            empty: list[str] = []
            for expression in files.expressions():
                names = files.metric_names(expression.query)

                def evaluated(query: str = expression.query) -> dict[str, Any] | None:
                    body = prom_query(port, query)
                    assert body["status"] == "success", f"{body.get('error')}: {query}"
                    return body if body["data"]["result"] else None

                if names <= MAY_BE_EMPTY:
                    evaluated()  # must evaluate; may have no series yet
                    continue
                try:
                    wait_for(evaluated, f"data for {expression}", DEADLINE_S / 3)
                except AssertionError as e:
                    if "timed out" not in str(e):
                        raise
                    empty.append(str(expression))
            assert not empty, "expressions with no data:\n" + "\n".join(empty)
        except BaseException:
            print(log.read_text(errors="replace")[-4000:])
            raise


# -- the image's healthcheck ----------------------------------------------------------------


def healthcheck_code() -> str:
    [args] = [a for k, a in files.dockerfile_instructions() if k == "HEALTHCHECK"]
    argv = json.loads(args.partition("CMD ")[2])
    assert argv[:2] == ["python", "-c"]
    code: str = argv[2]
    return code


def run_healthcheck(admin_listener: str) -> int:
    return subprocess.run(
        [sys.executable, "-c", healthcheck_code()],
        env={"KCOORD_ADMIN_LISTENER": admin_listener},
        capture_output=True,
        timeout=30,
        check=False,
    ).returncode


def test_the_image_healthcheck_probes_the_admin_port(cluster: LocalCluster) -> None:
    node = nodes(cluster)[0]
    # As in the compose file: the node binds every interface, the check dials loopback.
    assert run_healthcheck(f"0.0.0.0:{node.admin_port}") == 0
    [closed] = free_ports(1)
    assert run_healthcheck(f"0.0.0.0:{closed}") != 0
