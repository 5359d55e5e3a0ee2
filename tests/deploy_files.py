"""The shipped deployment files, read the way the tests of deploy/ need them.

docker-compose.yml (PyYAML resolves its anchors and ``<<`` merge keys as Compose does),
deploy/Dockerfile (instructions with their continuation lines joined), the Toxiproxy config,
and the PromQL of the Grafana dashboards: every panel target and every query variable, with the
Grafana variables substituted so that Prometheus (or promtool) can evaluate them, and the metric
names each expression reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
TOXIPROXY_CONFIG = REPO / "deploy" / "toxiproxy" / "toxiproxy.json"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"

# What the Grafana variables stand for when an expression is evaluated outside Grafana:
# $__rate_interval is at least four scrape intervals (1 m covers the tests' 1 s and the
# shipped 5 s), and a multi-value variable with "All" selected is the regex ".*".
RATE_INTERVAL = "1m"
_GRAFANA_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")

# PromQL words that look like metric names but are not.
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_VALUES = re.compile(r"^label_values\(\s*(?P<selector>.+?)\s*,\s*(?P<label>\w+)\s*\)$")


def load_compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


def node_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The kcoord node services: those with a ``KCOORD_NODE_ID``."""
    return {
        name: spec
        for name, spec in compose["services"].items()
        if "KCOORD_NODE_ID" in (spec.get("environment") or {})
    }


def environment(spec: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings (Compose passes every value as a string)."""
    env = spec.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.partition("=") for item in env)
        return {k: v for k, _, v in pairs}
    return {str(k): str(v) for k, v in env.items()}


def published_ports(spec: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """Container port -> (host address, host port) of the short ``HOST:PUBLISHED:TARGET``
    syntax the compose file uses."""
    out: dict[int, tuple[str, int]] = {}
    for entry in spec.get("ports") or []:
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) == 3, f"expected HOST:PUBLISHED:TARGET, got {entry!r}"
        out[int(parts[2])] = (parts[0], int(parts[1]))
    return out


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "a continuation line at the end of the Dockerfile"
    return instructions


def toxiproxy_proxies() -> list[dict[str, Any]]:
    proxies: list[dict[str, Any]] = json.loads(TOXIPROXY_CONFIG.read_text())
    return proxies


# -- dashboards ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    """One PromQL expression of a dashboard, where it is, and what Prometheus is asked."""

    dashboard: str
    where: str  # panel title (and refId) or "variable <name>"
    raw: str  # as written in the JSON, Grafana variables and all
    query: str  # with the variables substituted

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.where}: {self.raw}"


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON."""
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def substitute(expression: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return RATE_INTERVAL if name in ("__rate_interval", "__interval") else ".*"

    return _GRAFANA_VARIABLE.sub(value, expression)


def expressions() -> list[Expression]:
    """Every expression of every dashboard: panel targets, then query variables (Grafana's
    ``label_values(selector, label)`` is asked as its selector)."""
    out: list[Expression] = []
    for name, board in dashboards().items():
        for panel in panels(board):
            for target in panel.get("targets", []):
                raw = target.get("expr", "")
                where = f"{panel.get('title')} ({target.get('refId')})"
                out.append(Expression(name, where, raw, substitute(raw)))
        for variable in board.get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            query = variable["query"]
            raw = query["query"] if isinstance(query, dict) else query
            match = _LABEL_VALUES.match(raw.strip())
            assert match, f"{name}: variable {variable['name']}: expected label_values(...)"
            out.append(
                Expression(
                    name,
                    f"variable {variable['name']}",
                    raw,
                    substitute(match.group("selector")),
                )
            )
    return out


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads.

    Strings, label matchers, ranges and grouping clauses are removed first; what is left that
    looks like an identifier is a metric name unless it is called (a function or aggregation)
    or a keyword.
    """
    text = _STRING.sub('""', expression)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names
