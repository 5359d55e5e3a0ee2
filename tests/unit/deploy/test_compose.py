"""docker-compose.yml, deploy/Dockerfile and the Toxiproxy, Prometheus and Grafana files, checked
statically (there is no Docker engine here: nothing is built or started).

- ``docker-compose config`` (Debian's docker-compose, Compose v1, which validates against the
  Compose schema without an engine) accepts the file, and rejects a broken copy of it;
- every node service's entrypoint and command parse with the project's own argparse
  (``kcoord.node.cli.build_parser``) as ``kcoord node``;
- every node's ``KCOORD_*`` environment is a valid node config (``load_config``: unknown keys,
  types, listener clashes, voters), and its addresses fit together: each advertised address is
  the Toxiproxy proxy in front of the port the node binds, the published host ports are the
  advertised Kafka ports, Prometheus scrapes every admin port, Grafana's provisioning points at
  Prometheus and the mounted dashboards;
- the Dockerfile: python:3.11-slim, a non-root user, a HEALTHCHECK on /healthz that is valid
  Python, ``kcoord node`` as the entrypoint, and a build context (.dockerignore) from which
  ``pip install .`` builds the ``kcoord`` console script.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from kcoord.node.cli import build_parser
from kcoord.node.config import Endpoint, NodeConfig, load_config
from tests import deploy_files as files

COMPOSE_SKIP_REASON = (
    "Debian's docker-compose is not installed: run scripts/setup-deploy-tools.sh as root "
    "(make test does)"
)
EXPECTED_SERVICES = {"kcoord-1", "kcoord-2", "kcoord-3", "toxiproxy", "prometheus", "grafana"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return files.load_compose()


@pytest.fixture(scope="module")
def configs(compose: dict[str, Any]) -> dict[str, NodeConfig]:
    """Service name -> the node config its environment makes (as `kcoord node` loads it)."""
    return {
        name: load_config(None, files.environment(spec))
        for name, spec in files.node_services(compose).items()
    }


def compose_command() -> list[str] | None:
    """Compose v1 (Debian bookworm's package) or the v2 plugin, whichever is here."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    return None


def run_compose_config(command: list[str], path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, "-f", str(path), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=path.parent,
    )


# -- docker-compose config -------------------------------------------------------------------


def test_docker_compose_config_accepts_the_file() -> None:
    command = compose_command()
    if command is None:
        pytest.skip(COMPOSE_SKIP_REASON)
    result = run_compose_config(command, files.COMPOSE_FILE)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == EXPECTED_SERVICES
    for i in (1, 2, 3):
        node = resolved["services"][f"kcoord-{i}"]
        # The anchors resolved as intended: each node has the shared and its own settings.
        assert node["environment"]["KCOORD_NODE_ID"] == str(i)
        assert node["environment"]["KCOORD_LISTENERS"] == "0.0.0.0:9092"
        assert node["depends_on"]["toxiproxy"]["condition"] == "service_healthy"
        assert f"kcoord-{i}-data" in resolved["volumes"]


def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validation above can fail: a misspelt service key is refused."""
    command = compose_command()
    if command is None:
        pytest.skip(COMPOSE_SKIP_REASON)
    broken = files.COMPOSE_FILE.read_text().replace("    hostname: kcoord-2\n", "    hostnme: x\n")
    assert "hostnme" in broken
    (tmp_path / "docker-compose.yml").write_text(broken)
    result = run_compose_config(command, tmp_path / "docker-compose.yml")
    assert result.returncode != 0
    assert "hostnme" in result.stderr


# -- the command line ------------------------------------------------------------------------


def dockerfile_exec_form(instruction: str) -> list[str]:
    [args] = [a for k, a in files.dockerfile_instructions() if k == instruction]
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def parse_cli(argv: list[str]) -> Any:
    """Parse a container's argv with kcoord's own parser; argparse's exit becomes a failure."""
    assert argv[0] == "kcoord", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as e:
        raise AssertionError(f"{argv} does not parse with kcoord's CLI (exit {e.code})") from e


def test_every_node_command_is_kcoord_node(compose: dict[str, Any]) -> None:
    entrypoint = dockerfile_exec_form("ENTRYPOINT")
    assert entrypoint == ["kcoord", "node"]
    # The image alone (CMD []) runs a node configured by the environment.
    args = parse_cli(entrypoint + dockerfile_exec_form("CMD"))
    assert args.command == "node" and args.config is None
    nodes = files.node_services(compose)
    assert set(nodes) == {"kcoord-1", "kcoord-2", "kcoord-3"}
    for name, spec in nodes.items():
        assert "entrypoint" not in spec, f"{name} keeps the image's entrypoint"
        assert spec["build"]["dockerfile"] == "deploy/Dockerfile"
        args = parse_cli(entrypoint + list(spec["command"]))
        assert args.command == "node", name
        assert args.config is None, f"{name} is configured by its environment"


def test_a_wrong_command_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AssertionError, match="does not parse"):
        parse_cli(["kcoord", "node", "--log-level", "loud"])
    assert "invalid choice" in capsys.readouterr().err


# -- node configuration and addresses --------------------------------------------------------


def test_every_node_environment_is_a_valid_config(
    compose: dict[str, Any], configs: dict[str, NodeConfig]
) -> None:
    for name, spec in files.node_services(compose).items():
        env = files.environment(spec)
        assert all(k.startswith("KCOORD_") for k in env), f"{name}: {sorted(env)}"
        config = configs[name]
        assert name == f"kcoord-{config.node_id}"
        assert config.data_dir == Path("/var/lib/kcoord/data")
        # Combined roles: every node is a voter, and all of them agree on who the voters are;
        # where each dials the others may differ (the Raft pair proxies, checked below).
        assert {v.node_id for v in config.voters} == {1, 2, 3}
    identities = {c.node_id: c.self_voter.endpoint for c in configs.values()}
    assert len(set(identities.values())) == 3


def test_an_unknown_variable_is_refused() -> None:
    """load_config above is a real check: a misspelt KCOORD_* variable is refused."""
    env = files.environment(files.node_services(files.load_compose())["kcoord-1"])
    with pytest.raises(ValueError, match="KCOORD_NODE_IDD"):
        load_config(None, {**env, "KCOORD_NODE_IDD": "1"})


def test_toxiproxy_is_in_front_of_every_client_and_inter_node_port(
    compose: dict[str, Any], configs: dict[str, NodeConfig]
) -> None:
    toxiproxy = compose["services"]["toxiproxy"]
    proxies = {p["name"]: p for p in files.toxiproxy_proxies()}
    assert all(p["enabled"] for p in proxies.values())
    published = files.published_ports(toxiproxy)
    used: set[str] = set()
    for service, config in configs.items():
        i = config.node_id

        def proxy(kind: str, bind: Endpoint, service: str = service, i: int = i) -> Endpoint:
            name = f"{kind}-{i}"
            used.add(name)
            assert proxies[name]["upstream"] == f"{service}:{bind.port}", name
            assert bind.host == "0.0.0.0", f"{service} binds {kind} on the compose network"
            return Endpoint.parse(proxies[name]["listen"])

        kafka = proxy("kafka", config.kafka_listener.bind)
        # Host clients dial the advertised 127.0.0.1 port, which compose publishes from
        # Toxiproxy's kafka-i listener.
        advertised = config.kafka_listener.advertised
        assert advertised.host == "127.0.0.1"
        assert published[kafka.port] == ("127.0.0.1", advertised.port), service
        # Containers dial the inter-node addresses: the proxies, by service name.
        rpc = proxy("rpc", config.rpc_listener.bind)
        assert config.rpc_listener.advertised == Endpoint("toxiproxy", rpc.port)
        quorum = proxy("quorum", config.quorum_listener.bind)
        assert config.self_voter.endpoint == Endpoint("toxiproxy", quorum.port)
        assert "toxiproxy" in compose["services"][service]["depends_on"], service
    # Raft: pysyncobj keeps one connection per pair of voters, dialled by the greater
    # "host:port" in the dialler's own view. Each pair has one dialler, which reaches the other
    # through a pair proxy of its own; the other knows the dialler by its quorum-N identity.
    identity = {c.node_id: str(c.self_voter.endpoint) for c in configs.values()}
    by_id = {c.node_id: (service, c) for service, c in configs.items()}
    for dialler_id, (_, dialler) in by_id.items():
        for voter in dialler.voters:
            dialled_id = voter.node_id
            if dialled_id == dialler_id:
                continue
            seen = str(voter.endpoint)
            dials = identity[dialler_id] > seen
            other_dials = identity[dialled_id] > identity[dialler_id]
            assert dials != other_dials, f"{dialler_id} and {dialled_id}: one dialler"
            if dials:
                name = f"quorum-{dialled_id}-from-{dialler_id}"
                used.add(name)
                service, dialled = by_id[dialled_id]
                assert proxies[name]["upstream"] == f"{service}:{dialled.quorum_listener.bind.port}"
                assert seen == f"toxiproxy:{Endpoint.parse(proxies[name]['listen']).port}", name
            else:
                assert seen == identity[dialled_id], f"{dialler_id} knows {dialled_id} by its id"
    assert used == set(proxies), f"proxies for no node port: {set(proxies) - used}"
    # Every listen port is distinct within the one Toxiproxy container.
    ports = [Endpoint.parse(p["listen"]).port for p in proxies.values()]
    assert len(ports) == len(set(ports))
    # The config file is loaded at start from where it is mounted.
    [config_arg] = [a for a in toxiproxy["command"] if a.startswith("-config=")]
    target = config_arg.removeprefix("-config=")
    assert f"./deploy/toxiproxy/toxiproxy.json:{target}:ro" in toxiproxy["volumes"]
    assert toxiproxy["image"].startswith("ghcr.io/shopify/toxiproxy:")


def test_every_published_port_is_loopback_only(compose: dict[str, Any]) -> None:
    for name, spec in compose["services"].items():
        for target, (host, _) in files.published_ports(spec).items():
            assert host == "127.0.0.1", f"{name} publishes {target} on {host}"


def test_prometheus_scrapes_every_admin_port(
    compose: dict[str, Any], configs: dict[str, NodeConfig]
) -> None:
    prometheus = compose["services"]["prometheus"]
    assert (
        "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
        in prometheus["volumes"]
    )
    scrape = yaml.safe_load(files.PROMETHEUS_CONFIG.read_text())
    [job] = [j for j in scrape["scrape_configs"] if j["job_name"] == "kcoord"]
    targets = {
        target: group["labels"]["node"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    expected = {f"{s}:{c.admin_listener.bind.port}": str(c.node_id) for s, c in configs.items()}
    assert targets == expected
    for service, config in configs.items():
        assert config.admin_listener.bind.host == "0.0.0.0"
        ports = files.published_ports(compose["services"][service])
        assert config.admin_listener.bind.port in ports, f"{service}'s admin API is published"


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("Debian's prometheus (promtool) is not installed: scripts/setup-prometheus.sh")
    result = subprocess.run(
        [promtool, "check", "config", str(files.PROMETHEUS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_nodes_keep_their_data_in_named_volumes(
    compose: dict[str, Any], configs: dict[str, NodeConfig]
) -> None:
    for service, config in configs.items():
        [mount] = compose["services"][service]["volumes"]
        volume, _, path = mount.partition(":")
        assert volume in compose["volumes"], f"{service}: {volume} is a named volume"
        assert config.data_dir.is_relative_to(path), f"{service}'s data dir is on {volume}"


def test_grafana_is_provisioned_with_prometheus_and_the_dashboards(
    compose: dict[str, Any],
) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {}
    for volume in grafana["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    assert mounts["/etc/grafana/dashboards"] == "./deploy/grafana/dashboards"
    provisioning = files.GRAFANA / "provisioning"
    [datasource] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["url"] == "http://prometheus:9090"
    assert "9090" in str(compose["services"]["prometheus"]["ports"])
    [provider] = yaml.safe_load((provisioning / "dashboards" / "kcoord.yml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (files.DASHBOARDS / Path(home).relative_to("/etc/grafana/dashboards")).exists()
    # Every panel and variable uses the provisioned data source.
    for name, board in files.dashboards().items():
        for panel in files.panels(board):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == datasource["uid"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == datasource["uid"], (name, panel["title"])
        for variable in board["templating"]["list"]:
            assert variable["datasource"]["uid"] == datasource["uid"], name


# -- the Dockerfile --------------------------------------------------------------------------


def test_dockerfile_base_user_healthcheck_and_entrypoint() -> None:
    instructions = files.dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    runs = [a for k, a in instructions if k == "RUN"]
    assert any("pip install ." in r for r in runs)
    users = [(i, a) for i, (k, a) in enumerate(instructions) if k == "USER"]
    assert users, "no USER: the node would run as root"
    last_user_at, user = users[-1]
    assert user not in ("root", "0") and not user.startswith("0:")
    assert any("useradd" in r and user in r for r in runs), f"{user} is created"
    # Nothing after the switch runs as root again.
    assert all(k != "RUN" for k, _ in instructions[last_user_at:])
    [healthcheck] = [a for k, a in instructions if k == "HEALTHCHECK"]
    options, found, exec_form = healthcheck.partition("CMD ")
    assert found and "--interval" in options, healthcheck
    argv = json.loads(exec_form)
    assert argv[:2] == ["python", "-c"], argv
    ast.parse(argv[2])  # valid Python
    assert "/healthz" in argv[2] and "urllib" in argv[2]


def test_the_build_context_builds_the_kcoord_command(tmp_path: Path) -> None:
    """What .dockerignore lets through and the Dockerfile copies is enough for `pip install .`
    to build kcoord with its console script."""
    ignore = [
        line.strip()
        for line in files.DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", "the context is an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied: list[str] = []
    for keyword, args in files.dockerfile_instructions():
        if keyword == "COPY":
            *sources, _ = args.split()
            copied.extend(s.rstrip("/") for s in sources)
    assert set(copied) <= allowed, f"COPY of files the context leaves out: {set(copied) - allowed}"
    context = tmp_path / "context"
    for source in copied:
        origin = files.REPO / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            context.mkdir(parents=True, exist_ok=True)
            shutil.copy(origin, context / source)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), "."],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=context,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    [wheel] = tmp_path.glob("kcoord-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        [entry_points] = [n for n in archive.namelist() if n.endswith("entry_points.txt")]
        assert "kcoord = kcoord.cli:main" in archive.read(entry_points).decode()
        assert "kcoord/node/server.py" in archive.namelist()
