"""The Grafana dashboards, statically: the four the issue asks for, well-formed panels, every
expression parsed by Prometheus's own parser (``promtool check rules``) and every metric name one
that node/metrics.py defines. tests/integration/test_deploy_dashboards.py checks the names
against a live node's /metrics and evaluates every expression in a real Prometheus.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest
import yaml

from tests import deploy_files as files

REPO = Path(__file__).resolve().parents[3]
METRICS_SOURCE = REPO / "src" / "kcoord" / "node" / "metrics.py"
# Families prometheus_client's process and GC collectors add, and the one Prometheus makes.
LIBRARY_PREFIXES = ("process_", "python_")
SYNTHETIC = frozenset({"up"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def test_the_four_dashboards() -> None:
    boards = files.dashboards()
    titles = {b["title"] for b in boards.values()}
    assert titles == {
        "kcoord: cluster overview",
        "kcoord: consumer groups and lag",
        "kcoord: Raft and controller",
        "kcoord: replication",
    }
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)
    for name, board in boards.items():
        assert name == f"{board['uid']}.json"
        ids = [p["id"] for p in files.panels(board)]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        for panel in files.panels(board):
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (name, panel["title"])
            if panel["type"] != "row":
                assert panel["targets"], (name, panel["title"])
                assert panel.get("description"), f"{name}: {panel['title']} says what it shows"


def test_metric_names_are_read_from_promql() -> None:
    assert files.metric_names(
        "histogram_quantile(0.99, sum by (le, api) "
        '(rate(kcoord_kafka_request_duration_seconds_bucket{job="x"}[1m])))'
    ) == {"kcoord_kafka_request_duration_seconds_bucket"}
    assert files.metric_names(
        "scalar(max(a_total)) - max by (voter) (b) * on (instance) group_left () (c == 1)"
    ) == {"a_total", "b", "c"}
    assert files.metric_names('up{job="kcoord"} and on() vector(1)') == {"up"}
    assert files.metric_names(
        'sum(x{topic=~"a|b"}) or label_replace(y, "d", "$1", "s", "(.*)")'
    ) == {
        "x",
        "y",
    }


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS``, or the test skipped if Debian's prometheus is not installed."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("Debian's prometheus (promtool) is not installed: scripts/setup-prometheus.sh")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)


def test_every_expression_parses(tmp_path: Path) -> None:
    """Prometheus's parser (promtool) on every expression, as recording rules."""
    expressions = files.expressions()
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard_expression_{i}", "expr": e.query}
                    for i, e in enumerate(expressions)
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout


def test_promtool_catches_a_bad_expression(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "x", "rules": [{"record": "r", "expr": "sum by (le (x)"}]}]}
        )
    )
    assert promtool("check", "rules", str(path)).returncode != 0


def test_every_metric_is_a_family_of_node_metrics() -> None:
    source = METRICS_SOURCE.read_text()
    for expression in files.expressions():
        names = files.metric_names(expression.query)
        assert names, f"no metric in {expression}"
        for name in names:
            if name in SYNTHETIC or name.startswith(LIBRARY_PREFIXES):
                continue
            family = name
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix) and f'"{name}"' not in source:
                    family = name.removesuffix(suffix)
            assert f'"{family}"' in source, (
                f"{family} is not defined in node/metrics.py: {expression}"
            )


def test_grafana_variables_are_substituted() -> None:
    for expression in files.expressions():
        assert "$" not in expression.query, expression
    assert files.substitute('rate(x{g=~"$consumergroup"}[$__rate_interval])') == (
        'rate(x{g=~".*"}[1m])'
    )


def test_rate_and_increase_take_counters_only() -> None:
    """rate() reads any drop as a counter reset: over a gauge of offsets (a reset-offsets or a
    truncation moves it back) it drew a false spike. Gauges take deriv() or delta()."""
    counter_like = ("_total", "_bucket", "_count")
    wrong = []
    for name, board in files.dashboards().items():
        for panel in files.panels(board):
            for target in panel.get("targets", []):
                expr = target.get("expr", "")
                for match in re.finditer(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)", expr):
                    metric = match.group(1)
                    if not metric.endswith(counter_like):
                        wrong.append((name, panel["title"], metric))
    assert wrong == []


def test_a_groups_or_partitions_own_series_are_not_summed_across_nodes() -> None:
    """A node cut off from the controller goes on exporting the groups it coordinated (and the
    lag of their partitions) until it hears of the new coordinator, which exports them too: a
    group's or a partition's own series take ``max`` across targets (node/metrics.py)."""
    summed = re.compile(
        r"\bsum\b(\s*by\s*\([^)]*\))?\s*\(\s*kafka_consumergroup_(lag|lag_sum|current_offset)\b"
    )
    assert summed.search('sum by (a, b) (kafka_consumergroup_lag{x=~"y"})')
    for name, board in files.dashboards().items():
        for panel in files.panels(board):
            for target in panel.get("targets", []):
                expr = target.get("expr", "")
                assert not summed.search(expr), (name, panel["title"], expr)


# A group's coordinator (and a partition's leader) moves from node a to node b at 5 m: the
# group commits, and the partition grows, 100 offsets every 15 s throughout (6.67/s).
_MOVE_SERIES: Final = {
    "kafka_consumergroup_current_offset_sum": '{consumergroup="g",topic="t"}',
    "kafka_topic_partition_current_offset": '{topic="t",partition="0"}',
}


@pytest.mark.parametrize("evaluation_interval", ["15s", "1m"])
def test_a_rate_across_a_coordinator_or_leader_move_is_counted_once(
    tmp_path: Path, evaluation_interval: str
) -> None:
    """``sum(deriv(x[...]))`` summed the old and the new node's series while both were in the
    range: the consumption and production rates read double (13.3/s) after every move (a
    review's promtool probe). The panels take the ``max`` of one group's or partition's
    derivatives across nodes. Whatever Prometheus' evaluation interval: a subquery without a
    step is evaluated at it, and at 1m (Prometheus' default) gave one point and no rate."""
    inputs = []
    for metric, labels in _MOVE_SERIES.items():
        inner = labels[1:-1]
        inputs.append({"series": f'{metric}{{instance="a",{inner}}}', "values": "0+100x20 _x20"})
        inputs.append({"series": f'{metric}{{instance="b",{inner}}}', "values": "_x21 2100+100x19"})
    checks = [
        e
        for e in files.expressions()
        if "deriv" in e.query and files.metric_names(e.query) & set(_MOVE_SERIES)
    ]
    assert len(checks) == 2, checks  # the consumption and production rate panels
    # What each panel is by: the group and topic, or the topic.
    by = {
        "kafka_consumergroup_current_offset_sum": '{consumergroup="g",topic="t"}',
        "kafka_topic_partition_current_offset": '{topic="t"}',
    }
    tests = [
        {
            "expr": e.query,
            "eval_time": "5m30s",
            "exp_samples": [
                {"labels": by[next(iter(files.metric_names(e.query)))], "value": 100 / 15}
            ],
        }
        for e in checks
    ]
    (tmp_path / "none.yml").write_text("groups: []\n")
    spec = {
        "rule_files": ["none.yml"],
        "evaluation_interval": evaluation_interval,
        "tests": [{"interval": "15s", "input_series": inputs, "promql_expr_test": tests}],
    }
    path = tmp_path / "move.yml"
    path.write_text(yaml.safe_dump(spec))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
