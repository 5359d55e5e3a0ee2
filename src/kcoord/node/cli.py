"""The ``kcoord`` command line.

Subcommands:
  node --config FILE                          run one node (every key also via KCOORD_* env)
  cluster up|status|stop-node|start-node|down a local cluster of node processes
  quorum describe --bootstrap-server H:P      like kafka-metadata-quorum.sh describe
  dump-log FILE... [--deep-iteration] [--print-data-log] [--offsets-decoder]  kafka-dump-log.sh
  groups list|describe|reset-offsets|delete   like kafka-consumer-groups.sh (groups_tool)
  topics list|describe|create|alter|delete    like kafka-topics.sh (topics_tool)
  configs describe|alter                      like kafka-configs.sh (configs_tool)

(``kcoord chaos ...`` is dispatched before this by ``kcoord.cli``.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcoord import __version__
from kcoord.node import log_file

if TYPE_CHECKING:
    from kcoord.node import launcher

DEFAULT_CLUSTER_DIR = Path(".kcoord/cluster")


def _dump_log(args: argparse.Namespace) -> int:
    from kcoord.node.dump_log import dump_files

    return dump_files(  # a closed pipe (``| head``): kcoord.cli.main
        [Path(f) for f in args.files],
        sys.stdout,
        print_data=args.print_data_log,
        offsets_decoder=args.offsets_decoder,
        deep_iteration=args.deep_iteration,
    )


def _node(args: argparse.Namespace) -> int:
    from kcoord.node.config import ConfigError, load_config

    try:
        config = load_config(Path(args.config) if args.config else None, os.environ)
    except ConfigError as e:
        print(f"kcoord: invalid config: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"kcoord: cannot read config: {e}", file=sys.stderr)
        return 2
    level = getattr(logging, args.log_level.upper())
    fmt = f"%(asctime)s node-{config.node_id} %(levelname)s %(name)s: %(message)s"
    if args.log_file:
        try:
            log_file.configure(
                Path(args.log_file), level, fmt, args.log_file_max_bytes, args.log_file_backups
            )
        except (OSError, ValueError) as e:
            print(f"kcoord: cannot log to {args.log_file}: {e}", file=sys.stderr)
            return 2
    else:
        logging.basicConfig(level=level, format=fmt)
    from kcoord.node.server import run
    from kcoord.storage.meta_properties import DataDirError

    try:
        run(config)
    except DataDirError as e:  # another process's or another node's directory
        print(f"kcoord: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a read-only or full data directory, a port taken: say what, once
        logging.getLogger("kcoord.node").exception("the node stopped on an I/O error")
        print(f"kcoord: the node stopped: {e}", file=sys.stderr)
        return 1
    return 0


def _saved_state(data_dir: Path) -> launcher.ClusterState | None:
    """The cluster kept in ``data_dir`` as its state file has it now (a node restarted from
    another shell has a pid this process never saw); None while it is being rewritten or
    cannot be read."""
    from kcoord.node import launcher

    try:
        return launcher.ClusterState.load(data_dir)
    except (OSError, ValueError, launcher.LauncherError):
        return None


def _any_node_alive(data_dir: Path) -> bool:
    """Whether a node of the cluster kept in ``data_dir`` runs, by its state file as saved."""
    from kcoord.node import launcher

    state = _saved_state(data_dir)
    if state is None:
        return True  # not a reason to stop
    return any(launcher.is_alive(n.pid, n.config_path) for n in state.nodes)


def _print_status(report: dict[str, Any]) -> None:
    print(f"data dir: {report['data_dir']}")
    print(f"bootstrap servers: {report['bootstrap_servers']}")
    print(
        f"{'ID':>3} {'PID':>8} {'ALIVE':>5} {'ROLE':<20} {'KAFKA':<16} {'RPC':<16} "
        f"{'QUORUM':<16} {'ADMIN':<16}"
    )
    for n in report["nodes"]:
        print(
            f"{n['node_id']:>3} {n['pid'] or '-':>8} {('yes' if n['alive'] else 'no'):>5} "
            f"{n['role']:<20} {n['kafka']:<16} {n['rpc']:<16} {n['quorum']:<16} {n['admin']:<16}"
        )


def _cluster(args: argparse.Namespace) -> int:
    from kcoord.node import launcher

    data_dir = Path(args.data_dir)
    started: launcher.ClusterState | None = None  # a cluster up() returned
    try:
        if args.cluster_command == "up":
            # A cluster kept in data_dir restarts as it was, unless told otherwise.
            kept = None
            if (data_dir / launcher.STATE_FILE).exists():
                kept = launcher.ClusterState.load(data_dir)
            nodes = args.nodes or (len(kept.nodes) if kept else 3)
            base_port = args.base_port or (kept.nodes[0].kafka_port if kept else 9092)
            launcher.check_startable(data_dir, nodes)  # refused before "starting"
            launcher.refuse_if_starting(data_dir)  # likewise
            _, left_out = launcher.node_environment()  # refused before "starting" too
            if left_out:
                print(
                    f"kcoord: not passed to the nodes (no such setting): {', '.join(left_out)}",
                    file=sys.stderr,
                )
            print(f"kcoord: starting {nodes} nodes in {data_dir} ...", flush=True)
            # A signal from here on stops the nodes: one during the wait for the cluster to be
            # ready killed the launcher alone, leaving its nodes running unmanaged. The handler
            # only sets a flag, which up() polls: a KeyboardInterrupt raised from it landed once
            # in a weakref callback, where Python prints and drops it, and the launcher waited on.
            stop = {"now": False}

            def on_signal(_sig: int, _frame: Any) -> None:
                stop["now"] = True

            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            # A closed terminal or a dropped ssh session: the nodes, in sessions of their own,
            # outlived the launcher, unmanaged, and the next ``cluster up`` refused to start.
            signal.signal(signal.SIGHUP, on_signal)
            state = started = launcher.up(
                data_dir, nodes, base_port, interrupted=lambda: stop["now"]
            )
            print("kcoord: cluster ready", flush=True)
            _print_status(launcher.status(state))  # the bootstrap servers first
            if args.detach:
                return 0
            print("kcoord: running in the foreground; Ctrl-C stops every node", flush=True)
            checked = time.monotonic()
            while not stop["now"]:
                time.sleep(0.2)  # waiting for a signal
                if time.monotonic() - checked >= 1.0:
                    checked = time.monotonic()
                    if not _any_node_alive(data_dir):
                        # ``cluster down`` (``make down``) from elsewhere: nothing left to run.
                        print("kcoord: every node has stopped; exiting", flush=True)
                        return 0
            print("kcoord: stopping the cluster ...", flush=True)
            # As the data directory has it now: a node stopped and started again from another
            # shell meanwhile (``start-node``); else the nodes as started.
            launcher.down(_saved_state(data_dir) or state)
            print("kcoord: stopped", flush=True)
            return 0
        state = launcher.ClusterState.load(data_dir)
        if args.cluster_command == "status":
            report = launcher.status(state)
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                _print_status(report)
        elif args.cluster_command == "stop-node":
            node = state.node(args.id)
            try:
                launcher.stop_node(node, kill=args.kill)
            finally:
                state.save_nodes([node])
        elif args.cluster_command == "start-node":
            node = state.node(args.id)
            if launcher.is_alive(node.pid, node.config_path):
                # Nothing to do, as stop-node of a stopped node (both idempotent).
                print(f"kcoord: node {args.id} is already running", file=sys.stderr)
                return 0
            launcher.start_node(node)
            state.save_nodes([node])
            try:
                serving = launcher.wait_started(node)
            finally:
                state.save_nodes([node])  # no pid of a node that exited
            if not serving:
                print(f"kcoord: node {args.id} is still starting; see {node.log_path}")
        elif args.cluster_command == "down":
            launcher.down(state, kill=args.kill)
            print("kcoord: cluster stopped (data kept)")
    except launcher.LauncherError as e:
        print(f"kcoord: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if started is not None:  # the signal came as up() returned, before the handlers knew
            launcher.down(started)
        print("kcoord: interrupted; the nodes it had started are stopped", file=sys.stderr)
        return 130
    return 0


def _quorum(args: argparse.Namespace) -> int:
    from kcoord.node.quorum_tool import describe
    from kcoord.node.tool_client import ToolError, resolve_bootstrap

    try:
        servers = resolve_bootstrap(args.bootstrap_server, Path(args.data_dir))
    except ToolError as e:
        print(f"kcoord: {e}", file=sys.stderr)
        return 1
    return describe(servers, replication=args.replication, out=sys.stdout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcoord",
        description="kcoord command line",
        # Dispatched before this parser by kcoord.cli (this layer may not import them).
        epilog="also: kcoord chaos {run,matrix,clean} ... (the chaos suite) and kcoord pipeline "
        "{generate,run} ... (the Spark pipeline); each takes --help",
    )
    parser.add_argument("--version", action="version", version=f"kcoord {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    node = sub.add_parser("node", help="run one node")
    node.add_argument("--config", help="TOML file; KCOORD_* environment variables override it")
    node.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    node.add_argument(
        "--log-file",
        metavar="PATH",
        help="log to this file, rolled by size, instead of standard error (which follows it)",
    )
    node.add_argument(
        "--log-file-max-bytes",
        type=int,
        default=log_file.DEFAULT_MAX_BYTES,
        metavar="N",
        help="roll the --log-file once it passes N bytes (default: %(default)s)",
    )
    node.add_argument(
        "--log-file-backups",
        type=int,
        default=log_file.DEFAULT_BACKUPS,
        metavar="K",
        help="rolled files kept: PATH.1 (newest) to PATH.K (default: %(default)s)",
    )
    node.set_defaults(func=_node)

    cluster = sub.add_parser("cluster", help="a local cluster of node processes")
    csub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = csub.add_parser("up", help="write configs, start nodes, wait until ready")
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="1, 3 or 5 (default: as the cluster kept in --data-dir, else 3)",
    )
    up.add_argument(
        "--base-port",
        type=int,
        default=None,
        help="node i listens on base+10(i-1) to base+10(i-1)+3 (default: as the cluster kept "
        "in --data-dir, else 9092)",
    )
    up.add_argument("--detach", action="store_true", help="return once ready")
    status = csub.add_parser("status", help="nodes, pids, roles, addresses")
    status.add_argument("--json", action="store_true")
    stop_node = csub.add_parser("stop-node", help="stop one node (SIGTERM, or --kill)")
    stop_node.add_argument("id", type=int)
    stop_node.add_argument("--kill", action="store_true", help="SIGKILL")
    start_node = csub.add_parser("start-node", help="start a stopped node again")
    start_node.add_argument("id", type=int)
    down = csub.add_parser("down", help="stop every node; data is kept")
    down.add_argument("--kill", action="store_true")
    for p in (up, status, stop_node, start_node, down):
        p.add_argument("--data-dir", default=str(DEFAULT_CLUSTER_DIR))
    cluster.set_defaults(func=_cluster)

    quorum = sub.add_parser("quorum", help="the metadata quorum")
    qsub = quorum.add_subparsers(dest="quorum_command", required=True)
    describe = qsub.add_parser("describe", help="like kafka-metadata-quorum.sh describe")
    describe.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,HOST:PORT]",
        help="Kafka listeners, tried in turn (DescribeQuorum is forwarded to the controller; "
        "default: the local cluster's, see --data-dir)",
    )
    describe.add_argument(
        "--data-dir",
        default=str(DEFAULT_CLUSTER_DIR),
        help="the local cluster whose bootstrap servers are the default",
    )
    describe.add_argument("--replication", action="store_true", help="a row per voter")
    describe.add_argument("--status", action="store_true", help="the summary (default)")
    quorum.set_defaults(func=_quorum)

    dump = sub.add_parser(
        "dump-log", help="print log segments, offset and time indexes, producer snapshots"
    )
    dump.add_argument("files", nargs="+", metavar="FILE", help=".log, .index or .timeindex")
    dump.add_argument("--deep-iteration", action="store_true", help="print every record's metadata")
    dump.add_argument(
        "--print-data-log",
        action="store_true",
        help="print every record with its key and payload (implies --deep-iteration)",
    )
    dump.add_argument(
        "--offsets-decoder",
        action="store_true",
        help="decode __consumer_offsets records (implies --print-data-log)",
    )
    dump.set_defaults(func=_dump_log)

    from kcoord.node import configs_tool, groups_tool, topics_tool

    groups_tool.add_parser(sub, DEFAULT_CLUSTER_DIR)
    topics_tool.add_parser(sub, DEFAULT_CLUSTER_DIR)
    configs_tool.add_parser(sub, DEFAULT_CLUSTER_DIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
