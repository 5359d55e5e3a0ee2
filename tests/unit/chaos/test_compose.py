"""The chaos suite's docker-compose target without Docker: the nemeses on a ``ComposeLab`` whose
docker commands go to a fake runner that keeps container states by docker's rules (pause needs
a running container, unpause a paused one, start a stopped one), and whose Toxiproxy proxies are
fakes that record what was done to them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kcoord.chaos import compose, nemesis, runner
from kcoord.chaos.history import History
from kcoord.chaos.lab import grudge_of
from kcoord.chaos.links import KINDS, Links
from kcoord.node.config import Endpoint

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"


class FakeDocker:
    """A CommandRunner: one container per service, named ``c-<service>``."""

    def __init__(self, services: Sequence[str], *, plugin: bool = True) -> None:
        self.plugin = plugin
        self.states = {f"c-{s}": compose.ContainerState(True, False) for s in services}
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if argv[:3] == ["docker", "compose", "version"]:
            if not self.plugin:
                raise compose.DockerError("docker: unknown command: docker compose")
            return "Docker Compose version v2.27.0\n"
        if "ps" in argv:
            service = argv[-1]
            return f"c-{service}\n" if f"c-{service}" in self.states else ""
        command, container = argv[1], argv[-1]
        state = self.states[container]
        if command == "inspect":
            return f"{str(state.running).lower()} {str(state.paused).lower()}\n"
        allowed = {
            "kill": state.running,
            "pause": state.running and not state.paused,
            "unpause": state.paused,
            "start": not state.running,
        }
        if not allowed[command]:
            raise compose.DockerError(f"docker {command} {container}: not allowed in {state}")
        self.states[container] = {
            "kill": compose.ContainerState(False, False),
            "pause": compose.ContainerState(True, True),
            "unpause": compose.ContainerState(True, False),
            "start": compose.ContainerState(True, False),
        }[command]
        return container + "\n"

    def actions(self) -> list[tuple[str, str]]:
        """The state-changing commands, in order."""
        return [
            (argv[1], argv[-1])
            for argv in self.calls
            if argv[0] == "docker" and argv[1] in ("kill", "pause", "unpause", "start")
        ]


class FakeProxy:
    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled = True
        self.toxics: dict[str, dict[str, Any]] = {}

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def add_toxic(self, **toxic: Any) -> None:
        self.toxics[toxic["name"]] = toxic

    def destroy_toxic(self, name: str) -> bool:
        return self.toxics.pop(name, None) is not None


def make_lab(
    tmp_path: Path, seed: int = 1, shapes: Sequence[str] = compose.SHAPES
) -> tuple[compose.ComposeLab, FakeDocker, dict[tuple[int, str], FakeProxy]]:
    topology = compose.read_topology(COMPOSE_FILE)
    fake = FakeDocker([n.service for n in topology.nodes])
    docker = compose.Docker(COMPOSE_FILE, run=fake)
    containers = {n.node_id: docker.container_id(n.service) for n in topology.nodes}
    proxies = {
        (n.node_id, kind): FakeProxy(f"{kind}-{n.node_id}")
        for n in topology.nodes
        for kind in KINDS
    }
    links = Links(client=None, proxies=dict(proxies))
    options = runner.Options(nemeses=["kill"], seed=seed, shapes=list(shapes))
    lab = compose.ComposeLab(
        options,
        topology,
        History(clock=lambda: 0.0),
        processes=compose.ComposeProcesses(docker, containers),
        links=links,
        work_dir=tmp_path,
    )
    fake.calls.clear()
    return lab, fake, proxies


# -- the compose file and docker ------------------------------------------------------------


def test_the_shipped_compose_file() -> None:
    topology = compose.read_topology(COMPOSE_FILE)
    assert [n.service for n in topology.nodes] == ["kcoord-1", "kcoord-2", "kcoord-3"]
    assert [str(n.kafka) for n in topology.nodes] == [
        "127.0.0.1:9092",
        "127.0.0.1:9102",
        "127.0.0.1:9112",
    ]
    assert [str(n.admin) for n in topology.nodes] == [
        "127.0.0.1:9095",
        "127.0.0.1:9105",
        "127.0.0.1:9115",
    ]
    assert topology.toxiproxy_service == "toxiproxy"
    assert topology.toxiproxy_api == Endpoint("127.0.0.1", 8474)


def test_compose_file_errors(tmp_path: Path) -> None:
    with pytest.raises(compose.ComposeError, match="cannot read"):
        compose.read_topology(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text(COMPOSE_FILE.read_text().replace('KCOORD_NODE_ID: "2"', 'KCOORD_NODE_ID: "two"'))
    with pytest.raises(compose.ComposeError, match=r"kcoord-2: node\.id"):
        compose.read_topology(bad)
    no_proxy = tmp_path / "no-proxy.yml"
    no_proxy.write_text(COMPOSE_FILE.read_text().replace("shopify/toxiproxy", "example/other"))
    with pytest.raises(compose.ComposeError, match="no Toxiproxy service"):
        compose.read_topology(no_proxy)


def test_docker_compose_v2_plugin_or_v1() -> None:
    plugin = FakeDocker(["kcoord-1"])
    assert compose.Docker(COMPOSE_FILE, run=plugin).container_id("kcoord-1") == "c-kcoord-1"
    assert plugin.calls[-1] == [
        "docker",
        "compose",
        "-f",
        str(COMPOSE_FILE),
        "ps",
        "-a",
        "-q",
        "kcoord-1",
    ]
    v1 = FakeDocker(["kcoord-1"], plugin=False)
    assert compose.Docker(COMPOSE_FILE, run=v1).container_id("kcoord-1") == "c-kcoord-1"
    assert v1.calls[-1][:3] == ["docker-compose", "-f", str(COMPOSE_FILE)]


def test_a_service_without_a_container_says_how_to_start_it() -> None:
    docker = compose.Docker(COMPOSE_FILE, run=FakeDocker([]))
    with pytest.raises(compose.ComposeError, match=r"docker compose -f .* up -d"):
        docker.container_id("kcoord-1")


# -- process nemeses -------------------------------------------------------------------------


def test_kill_is_docker_kill_and_the_heal_docker_start(tmp_path: Path) -> None:
    lab, fake, _ = make_lab(tmp_path)
    fault = nemesis.start_fault(lab, "kill")
    assert fault is not None
    [target] = fault.targets
    container = f"c-kcoord-{target}"
    assert fake.actions() == [("kill", container)]
    # A killed node is no candidate for another kill.
    assert target not in [n.node_id for n in nemesis.alive_in(lab)]
    fault.heal()
    assert fake.actions() == [("kill", container), ("start", container)]
    assert fake.states[container] == compose.ContainerState(True, False)


def test_pause_is_docker_pause_and_the_heal_unpause(tmp_path: Path) -> None:
    lab, fake, _ = make_lab(tmp_path)
    fault = nemesis.start_fault(lab, "pause")
    assert fault is not None
    container = f"c-kcoord-{fault.targets[0]}"
    assert fake.actions() == [("pause", container)]
    assert fault.detail["hold_s"] in (1.5, 6.0)  # half or twice the 3 s session timeout
    fault.heal()
    assert fake.actions() == [("pause", container), ("unpause", container)]
    fault.heal()  # healing twice (the final heal-all does) sends nothing more
    assert fake.actions() == [("pause", container), ("unpause", container)]


def test_heal_all_restarts_killed_and_unpauses_paused_nodes(tmp_path: Path) -> None:
    lab, fake, proxies = make_lab(tmp_path)
    fake.states["c-kcoord-1"] = compose.ContainerState(False, False)
    fake.states["c-kcoord-2"] = compose.ContainerState(True, True)
    lab.firewall.apply(grudge_of([{3}, {1, 2}]))
    lab.heal_all()
    assert sorted(fake.actions()) == [("start", "c-kcoord-1"), ("unpause", "c-kcoord-2")]
    assert all(s == compose.ContainerState(True, False) for s in fake.states.values())
    assert all(p.enabled for p in proxies.values())


# -- partitions through Toxiproxy ------------------------------------------------------------


def test_isolating_a_node_disables_its_inter_node_proxies(tmp_path: Path) -> None:
    lab, fake, proxies = make_lab(tmp_path, shapes=["one"])
    fault = nemesis.start_fault(lab, "partition", ["one"])
    assert fault is not None
    [target] = fault.targets
    disabled = {key for key, p in proxies.items() if not p.enabled}
    assert disabled == {(target, "rpc"), (target, "quorum")}, "clients still reach it"
    assert fake.actions() == []
    fault.heal()
    assert all(p.enabled for p in proxies.values())


def test_isolated_nodes_of_each_shape() -> None:
    ids = [1, 2, 3]
    assert compose.isolated_nodes(ids, grudge_of([{2}, {1, 3}])) == {2}
    assert compose.isolated_nodes(ids, set()) == set()
    five = [1, 2, 3, 4, 5]
    assert compose.isolated_nodes(five, grudge_of([{1, 4}, {2, 3, 5}])) == {1, 4}
    assert compose.isolated_nodes(five, grudge_of([{1}, {2}, {3, 4, 5}])) == {1, 2}
    # Equal halves: the one with the lowest id stays reachable.
    assert compose.isolated_nodes([1, 2, 3, 4], grudge_of([{2, 3}, {1, 4}])) == {2, 3}


def test_cuts_of_single_links_are_refused(tmp_path: Path) -> None:
    rng = random.Random(3)
    ring = nemesis._ring_cuts([1, 2, 3], rng)
    with pytest.raises(ValueError, match="whole components"):
        compose.isolated_nodes([1, 2, 3], ring)
    bridge, _ = nemesis._bridge_cuts([1, 2, 3, 4, 5], rng)
    with pytest.raises(ValueError, match="whole components"):
        compose.isolated_nodes([1, 2, 3, 4, 5], bridge)


def test_latency_and_reset_go_through_the_toxiproxy_links(tmp_path: Path) -> None:
    lab, _, proxies = make_lab(tmp_path)
    fault = nemesis.start_fault(lab, "latency")
    assert fault is not None
    [target] = fault.targets
    for (node_id, kind), proxy in proxies.items():
        if node_id == target:
            streams = sorted(t["stream"] for t in proxy.toxics.values())
            assert streams == ["downstream", "upstream"], kind
            assert {t["type"] for t in proxy.toxics.values()} == {"latency"}
        else:
            assert not proxy.toxics
    fault.heal()
    assert not any(p.toxics for p in proxies.values())


# -- the run's refusals ----------------------------------------------------------------------


def test_run_refusals(tmp_path: Path) -> None:
    options = runner.Options(nemeses=["kill"], report_dir=str(tmp_path / "r"))
    with pytest.raises(compose.ComposeError, match="inject-bug"):
        compose.run(runner.Options(nemeses=["kill"], inject_bug="ack-before-hw"), COMPOSE_FILE)
    with pytest.raises(compose.ComposeError, match="no partition shape"):
        compose.run(runner.Options(nemeses=["partition"], shapes=["ring"]), COMPOSE_FILE)
    fake = FakeDocker(["kcoord-1", "kcoord-2", "kcoord-3"])
    fake.states["c-kcoord-2"] = compose.ContainerState(False, False)
    with pytest.raises(compose.ComposeError, match="kcoord-2 is not running"):
        compose.run(options, COMPOSE_FILE, compose.Docker(COMPOSE_FILE, run=fake))
    assert fake.actions() == [], "nothing is done to a cluster that is not up"


def test_the_command_line_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = runner.parse_args(["run", "--target", "compose", "--compose-file", "x.yml"])
    assert (args.target, args.compose_file) == ("compose", "x.yml")
    assert runner.parse_args(["run"]).target == "lab"
    monkeypatch.setattr("logging.basicConfig", lambda **kwargs: None)
    missing = tmp_path / "missing.yml"
    code = runner.main(["run", "--target", "compose", "--compose-file", str(missing)])
    assert code == 2
    assert f"cannot read {missing}" in capsys.readouterr().err


class _FlakyProxy:
    """A Toxiproxy proxy whose first removal (or enabling) fails."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 1
        self.done: list[str] = []

    def _once(self, what: str) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError(f"{self.name}: connection refused")
        self.done.append(what)

    def destroy_toxic(self, name: str) -> None:
        self._once(f"removed {name}")

    def enable(self) -> None:
        self._once("enabled")


def test_a_heal_that_fails_keeps_what_it_could_not_undo_and_says_so() -> None:
    """A toxic (or a disabled proxy) whose removal failed was forgotten: it stayed in force
    while the history said the links were healed, and no later heal tried it again. The heal
    tries each, keeps the failed ones and raises; the next heal undoes them."""
    flaky, fine = _FlakyProxy("a"), _FlakyProxy("b")
    fine.failures = 0
    links = Links(client=None, toxics=[(flaky, "latency"), (fine, "latency")])
    with pytest.raises(RuntimeError, match="a: connection refused"):
        links.heal()
    assert fine.done == ["removed latency"] and links.toxics == [(flaky, "latency")]
    links.heal()
    assert flaky.done == ["removed latency"] and links.toxics == []

    flaky, fine = _FlakyProxy("a"), _FlakyProxy("b")
    fine.failures = 0
    firewall = compose.ProxyFirewall(links, [1, 2, 3])
    firewall.disabled = [flaky, fine]
    with pytest.raises(compose.ComposeError, match="a: connection refused"):
        firewall.heal()
    assert fine.done == ["enabled"] and firewall.disabled == [flaky]
    firewall.heal()
    assert flaky.done == ["enabled"] and firewall.disabled == []


def test_the_compose_fencing_watch_skips_a_node_still_catching_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the lab's (seed 4333): a node restarted answers ``/api/v1/brokers`` from its own
    old log until it serves; it is not the one asked who is fenced."""
    views = {
        1: {"serving": False, "brokers": [{"node_id": 3, "fenced": True}]},
        2: {"serving": True, "brokers": [{"node_id": 1, "fenced": True}]},
    }
    monkeypatch.setattr(compose, "admin_get", lambda node, path, timeout_s: views[node.node_id])
    nodes = [SimpleNamespace(node_id=i) for i in (1, 2, 3)]
    lab = cast(compose.ComposeLab, SimpleNamespace(topology=SimpleNamespace(nodes=nodes)))
    assert compose.ComposeLab.fenced_brokers(lab, 3, 0.5) == {1}
