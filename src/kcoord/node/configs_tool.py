"""``kcoord configs``: topic, broker, broker logger and group configs as ``kafka-configs.sh``
shows and changes them.

::

  configs describe --entity-type topics|brokers|broker-loggers|groups [--entity-name N] [--all]
  configs describe --entity-type brokers --entity-default
  configs alter --entity-type topics|groups|broker-loggers --entity-name N
                [--add-config K=V,...] [--delete-config K,...]
  configs alter --entity-type brokers --entity-default [--add-config log.retention.ms=N,...]
                [--delete-config K,...]

Through the Kafka protocol (``tool_client``): DescribeConfigs v4 (a broker's resource goes to
that broker, as Kafka's admin client sends it) and IncrementalAlterConfigs v1. ``describe``
prints Kafka's ``ConfigCommand`` lines::

  Dynamic configs for topic T are:
    retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000, ...}

"Dynamic" lists what was set on the resource itself; ``--all`` ("All configs for ...") lists
every config with its effective value. Without ``--entity-name`` every topic (or broker, or
group that ListGroups shows) is described. A group's configs are KIP-848's
(``consumer.session.timeout.ms``, ``consumer.heartbeat.interval.ms``); the group need not
exist. ``--add-config`` takes Kafka's syntax: comma-separated ``key=value`` pairs, a list
value in square brackets (``cleanup.policy=[compact,delete]``). ``alter`` prints "Completed
updating config for topic T." (or "group G"). kcoord has no dynamic per-broker configs; the
cluster-level dynamic defaults, the broker synonyms of topic configs (``log.retention.ms``,
``log.cleanup.policy``, ``min.insync.replicas``, which the first active controller writes
from its own config, KIP-966 ...), are shown and changed with ``--entity-default``, as
Kafka's "Default configs for brokers in the cluster". A broker's loggers
(``--entity-type broker-loggers --entity-name <id>``) are its Python loggers and their levels
in Kafka's names (``kcoord.node.replica_fetcher=DEBUG``; ``--delete-config`` gives a logger
its parent's level back), changed on that broker alone until it restarts; a logger it does
not have is "Invalid broker logger(s): ...", as in ConfigCommand. Errors go to stderr as
"Error while executing config command : ..." and exit 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.tool_client import (
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    KafkaError,
    Once,
    RetriableError,
    ToolClient,
    ToolError,
    add_connection_arguments,
    error_name,
    run_tool,
)

ERROR_PREFIX: Final = "Error while executing config command : "
# ConfigResource.Type
_RESOURCE_TYPES: Final = {"topics": 2, "brokers": 4, "broker-loggers": 8, "groups": 32}
_ENTITY_NAMES: Final = {
    "topics": "topic",
    "brokers": "broker",
    "broker-loggers": "broker-logger",
    "groups": "group",
}
_PER_BROKER: Final = ("brokers", "broker-loggers")  # sent to the broker named
_SOURCES: Final = {
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    8: "DYNAMIC_GROUP_CONFIG",  # the admin client's name of GROUP_CONFIG
}
# What "Dynamic configs" shows (ConfigCommand's source filter): what was set on the resource.
_DYNAMIC_SOURCE: Final = {"topics": 1, "brokers": 2, "broker-loggers": 6, "groups": 8}
_DYNAMIC_DEFAULT_SOURCE: Final = 3  # of the brokers' cluster-level defaults
_SET, _DELETE = 0, 1  # AlterConfigOp.OpType


def parse_add_config(text: str) -> list[tuple[str, str]]:
    """``k1=v1,k2=[a,b]`` (``ConfigCommand.parseConfigsToBeAdded``): split at the commas and
    the '=' outside brackets, each pair exactly a key and a value (``a=b=c`` is refused), the
    brackets dropped from the value; a key given twice takes its last value (Kafka collects
    the pairs into ``Properties``), where two SETs of one key failed the whole alter."""
    added: dict[str, str] = {}
    for piece in _split_outside_brackets(text, ","):
        parts = _split_outside_brackets(piece, "=")
        if len(parts) != 2 or not parts[0].strip():
            raise ToolError(
                "Invalid entity config: all configs to be added must be in the format "
                '"key=val" or "key=[val1,val2]".'
            )
        added[parts[0].strip()] = parts[1].replace("[", "").replace("]", "").strip()
    return list(added.items())


def _split_outside_brackets(text: str, separator: str) -> list[str]:
    depth, start = 0, 0
    pieces: list[str] = []
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == separator and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    return pieces


def _is_default(kind: str, name: str) -> bool:
    """The cluster-level defaults: brokers with an empty name (--entity-default)."""
    return kind == "brokers" and name == ""


def _label(kind: str, name: str) -> str:
    return "brokers in the cluster" if _is_default(kind, name) else f"{_ENTITY_NAMES[kind]} {name}"


def _check_entity_default(args: argparse.Namespace) -> None:
    if args.entity_default and args.entity_type != "brokers":
        raise ToolError("--entity-default is only for --entity-type brokers in kcoord")
    if args.entity_default and args.entity_name is not None:
        raise ToolError("--entity-name and --entity-default cannot both be given")


def _describe(client: ToolClient, args: argparse.Namespace) -> int:
    _check_entity_default(args)
    kind = args.entity_type
    if args.entity_default:
        names = [""]
    elif args.entity_name is not None:
        names = [args.entity_name]
    elif kind == "topics":
        names = sorted(client.metadata(None).topics)
    elif kind == "groups":
        names = sorted({group for group, _, _ in client.list_groups(())})
    else:
        names = [str(b) for b in sorted(client.metadata([]).brokers)]
        if kind == "brokers":
            # ConfigCommand.describeConfig: the cluster-level defaults after the brokers.
            names.append("")
    for name in names:
        result = _describe_one(client, kind, name)
        default = _is_default(kind, name)
        dynamic = _DYNAMIC_DEFAULT_SOURCE if default else _DYNAMIC_SOURCE[kind]
        shown = [c for c in result.configs if args.all or int(c.config_source) == dynamic]
        scope = "Default" if default else "All" if args.all else "Dynamic"
        print(f"{scope} configs for {_label(kind, name)} are:")
        for c in shown:
            value = "null" if c.value is None else c.value
            synonyms = ", ".join(
                f"{_SOURCES.get(int(s.source), str(s.source))}:{s.name}="
                f"{'null' if s.value is None else s.value}"
                for s in c.synonyms
            )
            sensitive = "true" if c.is_sensitive else "false"
            print(f"  {c.name}={value} sensitive={sensitive} synonyms={{{synonyms}}}")
    return 0


def _describe_one(client: ToolClient, kind: str, name: str) -> Any:
    values = {
        "resources": [
            {
                "resource_type": _RESOURCE_TYPES[kind],
                "resource_name": name,
                "configuration_keys": None,
            }
        ],
        "include_synonyms": True,
        "include_documentation": False,
    }

    def attempt() -> Any:
        if kind in _PER_BROKER and name != "":
            body = client.send_to(_broker_id(kind, name), DESCRIBE_CONFIGS, values)
        else:
            body = client.send_any(DESCRIBE_CONFIGS, values)
        return body.results[0]

    result = client.retrying(f"describing the configs of {name}", attempt)
    code = int(result.error_code)
    if code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
        raise ToolError(f"The topic '{name}' does not exist.")
    if code != Errors.NONE:
        raise KafkaError(code, f"{_ENTITY_NAMES[kind]} '{name}'", result.error_message)
    return result


def _broker_id(kind: str, name: str) -> int:
    if not (name.isascii() and name.isdigit()):
        raise ToolError(f"The entity name for {kind} must be a broker id, not '{name}'")
    return int(name)


def _alter(client: ToolClient, args: argparse.Namespace) -> int:
    _check_entity_default(args)
    kind = args.entity_type
    if kind == "brokers" and not args.entity_default:
        raise ToolError(
            "kcoord has no dynamic per-broker configs; alter topic and group configs, or the "
            "cluster-level defaults of topic configs (log.retention.ms ...) with "
            "--entity-default"
        )
    name = "" if args.entity_default else args.entity_name
    if name is None:
        raise ToolError(f"--entity-name must be specified with --alter of {kind}")
    added = parse_add_config(args.add_config) if args.add_config else []
    deleted = [k.strip() for text in args.delete_config or () for k in text.split(",")]
    if not added and not deleted:
        raise ToolError("At least one of --add-config or --delete-config must be specified")
    deleted = [k for k in deleted if k]
    if kind == "broker-loggers":
        # ConfigCommand: every logger named must be one the broker has.
        loggers = {str(c.name) for c in _describe_one(client, kind, name).configs}
        invalid = [k for k in deleted if k not in loggers] + [
            k for k, _ in added if k not in loggers
        ]
        if invalid:
            raise ToolError(f"Invalid broker logger(s): {','.join(invalid)}")
    elif deleted:
        # A key to delete must be one of the resource's configs, set or not: a misspelt one
        # is refused, as ConfigCommand did; one not set is deleted as a no-op, as Kafka 4.3's
        # ConfigCommand does (KAFKA-20506; before, it had to be set).
        known = {str(c.name) for c in _describe_one(client, kind, name).configs}
        invalid = [k for k in deleted if k not in known]
        if invalid:
            raise ToolError(f"Invalid config(s): {','.join(invalid)}")
    ops = [{"name": k, "config_operation": _SET, "value": v} for k, v in added]
    ops += [{"name": k, "config_operation": _DELETE, "value": None} for k in deleted]
    values = {
        "resources": [
            {"resource_type": _RESOURCE_TYPES[kind], "resource_name": name, "configs": ops}
        ],
        "validate_only": False,
    }  # fmt: skip

    def attempt() -> Any:
        if kind == "broker-loggers":  # the broker's own loggers: only it answers for them
            body = client.send_to(_broker_id(kind, name), INCREMENTAL_ALTER_CONFIGS, values)
        else:
            body = client.send_any(INCREMENTAL_ALTER_CONFIGS, values)
        response = body.responses[0]
        if int(response.error_code) in (Errors.NOT_CONTROLLER, Errors.REQUEST_TIMED_OUT):
            raise RetriableError(error_name(int(response.error_code)))
        return response

    response = client.retrying(f"altering the configs of {_label(kind, name)}", attempt)
    code = int(response.error_code)
    if code != Errors.NONE:
        what = (
            "the brokers' defaults"
            if _is_default(kind, name)
            else f"{_ENTITY_NAMES[kind]} '{name}'"
        )
        raise KafkaError(code, what, response.error_message)
    default = "default " if _is_default(kind, name) else ""
    print(f"Completed updating {default}config for {_label(kind, name)}.")
    return 0


def _run(args: argparse.Namespace) -> int:
    commands = {"describe": _describe, "alter": _alter}
    return run_tool(commands[args.configs_command], args, error_prefix=ERROR_PREFIX)


def add_parser(sub: Any, default_cluster_dir: Path) -> None:
    """``kcoord configs ...`` under the top-level subparsers ``sub``."""
    configs = sub.add_parser(
        "configs", help="topic, broker, broker logger and group configs, like kafka-configs.sh"
    )
    csub = configs.add_subparsers(dest="configs_command", required=True)
    describe = csub.add_parser("describe", help="DescribeConfigs")
    describe.add_argument("--all", action="store_true", help="every config, not just dynamic")
    alter = csub.add_parser(
        "alter",
        help="IncrementalAlterConfigs (topics, groups, a broker's loggers, the brokers' "
        "cluster default)",
    )
    alter.add_argument("--add-config", action=Once, metavar="K=V[,K=V]", help="set these keys")
    # Repeatable, as Kafka's ``valuesOf(deleteConfig)``; --add-config is one ``valueOf``.
    alter.add_argument(
        "--delete-config", action="append", metavar="K[,K]", help="remove these keys; repeatable"
    )
    for p in (describe, alter):
        p.add_argument("--entity-type", action=Once, required=True, choices=sorted(_RESOURCE_TYPES))
        p.add_argument(
            "--entity-name",
            action=Once,
            help="topic name, broker id (brokers, broker-loggers) or group id",
        )
        p.add_argument(
            "--entity-default",
            action="store_true",
            help="the cluster-level default configs of brokers (with --entity-type brokers)",
        )
        add_connection_arguments(p, default_cluster_dir)
    configs.set_defaults(func=_run)
