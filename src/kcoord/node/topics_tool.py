"""``kcoord topics``: topics as ``kafka-topics.sh`` lists, describes, creates and deletes them.

::

  topics list [--exclude-internal]
  topics describe [--topic T...] [--exclude-internal] [--if-exists]
                  [--under-replicated-partitions | --unavailable-partitions |
                   --under-min-isr-partitions | --at-min-isr-partitions]
  topics create --topic T [--partitions N] [--replication-factor R] [--config K=V...]
  topics alter --topic T --partitions N
  topics delete --topic T... [--exclude-internal] [--if-exists]

Through the Kafka protocol (``tool_client``): Metadata v12 for list and describe, CreateTopics
v7, CreatePartitions v3 (``alter``: ``kafka-topics.sh --alter``, the partition count only;
configs are ``kcoord configs``' as they are kafka-configs.sh's), DeleteTopics v6.
``describe`` prints Kafka's ``TopicCommand`` lines::

  Topic: T<TAB>TopicId: ID<TAB>PartitionCount: N<TAB>ReplicationFactor: R<TAB>Configs: k=v,...
  <TAB>Topic: T<TAB>Partition: 0<TAB>Leader: 1<TAB>Replicas: 1,2,3<TAB>Isr: 1,2,3

(Kafka 3.9+ adds ELR columns from DescribeTopicPartitions, which this leaves out.) Configs lists
the topic's own (non-default) configs from DescribeConfigs v4 (empty if a broker does not
serve it). A partition without a leader shows ``Leader: none``. With one of the report
options, only the partitions it names are printed, without their topics' lines
(``TopicCommand``'s ``DescribeOptions``): under-replicated (fewer ISR members than
replicas), unavailable (no leader, or a leader that is not a live broker of the Metadata
answer), under min ISR (no leader, or fewer ISR members than the topic's effective
``min.insync.replicas``) or at min ISR (exactly that many). ``create`` prints "Created topic
T."; ``alter`` and ``delete`` print nothing, as Kafka's. ``describe`` and ``delete`` take
``--topic`` as Kafka's ``IncludeList`` (``include_list``): a regular expression matching whole
names; one that matches no topic is an error, as ``TopicCommand.ensureTopicExists``, unless
``--if-exists``.
Errors go to stderr as "Error while executing topic command : ..." and exit 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.tool_client import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    KafkaError,
    Once,
    PartitionMetadata,
    RetriableError,
    ToolClient,
    ToolError,
    TopicMetadata,
    add_connection_arguments,
    error_name,
    run_tool,
)

ERROR_PREFIX: Final = "Error while executing topic command : "
TOPIC_RESOURCE: Final = 2  # ConfigResource.Type.TOPIC
DEFAULT_CONFIG_SOURCE: Final = 5  # DescribeConfigsResponse.ConfigSource.DEFAULT_CONFIG


# The report options of ``describe`` (TopicCommand's allReplicationReportOpts), by the
# argparse destination they set, with their help; those that need min.insync.replicas.
REPORTS: Final = {
    "under_replicated_partitions": "only partitions with fewer ISR members than replicas",
    "unavailable_partitions": "only partitions whose leader is not available",
    "under_min_isr_partitions": "only partitions with fewer ISR members than min.insync.replicas",
    "at_min_isr_partitions": "only partitions with exactly min.insync.replicas ISR members",
}
MIN_ISR_REPORTS: Final = frozenset({"under_min_isr_partitions", "at_min_isr_partitions"})
MIN_ISR: Final = "min.insync.replicas"
TOPIC_HELP: Final = "a topic name or regular expression (',' for '|'); repeatable"
IF_EXISTS_HELP: Final = "a --topic matching no topic is no error"


def describe_lines(topic: TopicMetadata, configs: list[tuple[str, str]]) -> list[str]:
    """``TopicDescription.printDescription`` and ``PartitionDescription.printDescription``."""
    replication_factor = len(topic.partitions[0].replicas) if topic.partitions else 0
    head = f"Topic: {topic.name}"
    if topic.topic_id and topic.topic_id != "AAAAAAAAAAAAAAAAAAAAAA":  # Uuid.ZERO_UUID
        head += f"\tTopicId: {topic.topic_id}"
    head += f"\tPartitionCount: {len(topic.partitions)}"
    head += f"\tReplicationFactor: {replication_factor}"
    head += "\tConfigs: " + ",".join(f"{k}={v}" for k, v in configs)
    return [head, *(partition_line(topic, p) for p in topic.partitions)]


def partition_line(topic: TopicMetadata, p: PartitionMetadata) -> str:
    leader = str(p.leader_id) if p.leader_id >= 0 else "none"
    return (
        f"\tTopic: {topic.name}\tPartition: {p.partition}\tLeader: {leader}"
        f"\tReplicas: {','.join(str(r) for r in p.replicas)}"
        f"\tIsr: {','.join(str(r) for r in p.isr)}"
    )


def reported(
    report: str, p: PartitionMetadata, live_brokers: Collection[int], min_isr: int | None
) -> bool:
    """Whether a report option prints partition ``p`` (``PartitionDescription``'s
    ``isUnderReplicated``, ``hasUnavailablePartitions``, ``isUnderMinIsr`` and
    ``isAtMinIsrPartitions``; ``min_isr`` None: the topic's configs could not be read)."""
    has_leader = p.leader_id >= 0
    if report == "under_replicated_partitions":
        return len(p.replicas) - len(p.isr) > 0
    if report == "unavailable_partitions":
        return not has_leader or p.leader_id not in live_brokers
    if report == "under_min_isr_partitions":
        return not has_leader or (min_isr is not None and len(p.isr) < min_isr)
    assert report == "at_min_isr_partitions", report
    return min_isr is not None and len(p.isr) == min_isr


def min_insync_replicas(client: ToolClient, names: list[str]) -> dict[str, int]:
    """Each topic's effective ``min.insync.replicas`` (its own or the broker's default);
    nothing for a topic DescribeConfigs does not answer, or if it is not served."""
    if not names or not client.supported_version(*DESCRIBE_CONFIGS):
        return {}
    body = client.send_any(
        DESCRIBE_CONFIGS,
        {
            "resources": [
                {
                    "resource_type": TOPIC_RESOURCE,
                    "resource_name": n,
                    "configuration_keys": [MIN_ISR],
                }
                for n in names
            ],
            "include_synonyms": False,
            "include_documentation": False,
        },
    )
    found: dict[str, int] = {}
    for r in body.results:
        for c in r.configs if int(r.error_code) == Errors.NONE else ():
            if str(c.name) == MIN_ISR and c.value is not None:
                found[str(r.resource_name)] = int(c.value)
    return found


def parse_configs(values: list[str] | None) -> list[tuple[str, str]]:
    """``--config k=v`` as ``TopicCommand.parseTopicConfigsToBeAdded`` reads it: split at
    ``\\s*=\\s*`` the way Java's ``String.split`` does, which drops trailing empty strings, so
    ``k=`` is one piece and refused (``k=v=`` is ``k=v``); exactly a key and a value; a key
    given twice takes its last value (Kafka collects the pairs into ``Properties``)."""
    configs: dict[str, str] = {}
    for value in values or []:
        parts = re.split(r"\s*=\s*", value)
        while parts and not parts[-1]:
            parts.pop()
        if len(parts) != 2 or not parts[0].strip():
            raise ToolError(
                'Invalid topic config: all configs to be added must be in the format "key=val".'
            )
        configs[parts[0].strip()] = parts[1].strip()
    return list(configs.items())


def topic_configs(client: ToolClient, names: list[str]) -> dict[str, list[tuple[str, str]]]:
    """The non-default configs of each topic, or nothing if DescribeConfigs v4 is not served."""
    if not names or not client.supported_version(*DESCRIBE_CONFIGS):
        return {}
    body = client.send_any(
        DESCRIBE_CONFIGS,
        {
            "resources": [
                {"resource_type": TOPIC_RESOURCE, "resource_name": n, "configuration_keys": None}
                for n in names
            ],
            "include_synonyms": False,
            "include_documentation": False,
        },
    )
    configs: dict[str, list[tuple[str, str]]] = {}
    for r in body.results:
        if int(r.error_code) != Errors.NONE:
            raise KafkaError(int(r.error_code), f"DescribeConfigs of topic '{r.resource_name}'")
        configs[str(r.resource_name)] = [
            (str(c.name), "" if c.value is None else str(c.value))
            for c in r.configs
            if int(c.config_source) != DEFAULT_CONFIG_SOURCE
        ]
    return configs


def _list(client: ToolClient, args: argparse.Namespace) -> int:
    topics = client.metadata(None).topics
    for name in sorted(topics):
        if not (args.exclude_internal and topics[name].is_internal):
            print(name)
    return 0


def include_list(pattern: str) -> re.Pattern[str]:
    """``--topic`` as Kafka's ``IncludeList`` reads it: a regular expression a whole topic name
    must match, commas standing for ``|``, spaces and surrounding quotes dropped (a plain name
    matches itself: topic names are letters, digits, ``.``, ``_`` and ``-``)."""
    cleaned = pattern.strip().replace(",", "|").replace(" ", "")
    cleaned = re.sub(r"[\"']+$", "", re.sub(r"^[\"']+", "", cleaned))
    try:
        return re.compile(cleaned)
    except re.error as e:
        raise ToolError(f"--topic '{pattern}' is not a regular expression: {e}") from None


def matching_topics(
    patterns: list[str] | None,
    topics: Mapping[str, TopicMetadata],
    exclude_internal: bool,
    *,
    if_exists: bool = False,
) -> list[str]:
    """The names in ``topics`` that one of ``patterns`` matches, all without patterns
    (``TopicCommand.getTopics``), sorted, internal topics left out if asked; a pattern
    matching none is Kafka's ``ensureTopicExists`` error, unless ``if_exists``."""
    names = sorted(n for n in topics if not (exclude_internal and topics[n].is_internal))
    if patterns is None:
        return names
    matched: set[str] = set()
    for pattern in dict.fromkeys(patterns):
        regex = include_list(pattern)
        found = [n for n in names if regex.fullmatch(n)]
        if not found and not if_exists:
            raise ToolError(f"Topic '{pattern}' does not exist as expected")
        matched.update(found)
    return [n for n in names if n in matched]


def _describe(client: ToolClient, args: argparse.Namespace) -> int:
    metadata = client.metadata(None)
    topics = metadata.topics
    shown = matching_topics(args.topic, topics, args.exclude_internal, if_exists=args.if_exists)
    for name in shown:
        if topics[name].error_code != Errors.NONE:
            raise KafkaError(topics[name].error_code, f"Topic '{name}'")
    report = next((r for r in REPORTS if getattr(args, r, False)), None)
    if report is None:
        configs = topic_configs(client, shown)
        for name in shown:
            for line in describe_lines(topics[name], configs.get(name, [])):
                print(line)
        return 0
    min_isr = min_insync_replicas(client, shown) if report in MIN_ISR_REPORTS else {}
    for name in shown:
        topic = topics[name]
        for p in topic.partitions:
            if reported(report, p, metadata.brokers, min_isr.get(name)):
                print(partition_line(topic, p))
    return 0


def _create(client: ToolClient, args: argparse.Namespace) -> int:
    configs = parse_configs(args.config)
    if args.partitions is not None and args.partitions < 1:
        raise ToolError("The partitions must be greater than 0")
    if args.replication_factor is not None and args.replication_factor < 1:
        raise ToolError("The replication factor must be greater than 0")
    values = {
        "topics": [
            {
                "name": args.topic,
                # -1: the broker's default (KIP-464).
                "num_partitions": -1 if args.partitions is None else args.partitions,
                "replication_factor": (
                    -1 if args.replication_factor is None else args.replication_factor
                ),
                "assignments": [],
                "configs": [{"name": k, "value": v} for k, v in configs],
            }
        ],
        "timeout": client.timeout_ms,
        "validate_only": False,
    }

    def attempt() -> Any:
        body = client.send_any(CREATE_TOPICS, values)
        result = body.topics[0]
        if int(result.error_code) == Errors.NOT_CONTROLLER:
            raise RetriableError(error_name(Errors.NOT_CONTROLLER))
        return result

    result = client.retrying(f"creating topic '{args.topic}'", attempt)
    if int(result.error_code) != Errors.NONE:
        raise KafkaError(int(result.error_code), f"Topic '{args.topic}'", result.error_message)
    print(f"Created topic {args.topic}.")
    return 0


def _alter(client: ToolClient, args: argparse.Namespace) -> int:
    """``TopicCommand.alterTopic``: CreatePartitions up to ``--partitions``. A topic that does
    not exist is reported as Kafka's ``ensureTopicExists`` reports it."""
    if args.partitions < 1:
        raise ToolError("The partitions must be greater than 0")
    values = {
        "topics": [{"name": args.topic, "count": args.partitions, "assignments": None}],
        "timeout": client.timeout_ms,
        "validate_only": False,
    }

    def attempt() -> Any:
        result = client.send_any(CREATE_PARTITIONS, values).results[0]
        if int(result.error_code) == Errors.NOT_CONTROLLER:
            raise RetriableError(error_name(Errors.NOT_CONTROLLER))
        return result

    result = client.retrying(f"adding partitions to topic '{args.topic}'", attempt)
    code = int(result.error_code)
    if code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
        raise ToolError(f"Topic '{args.topic}' does not exist as expected")
    if code != Errors.NONE:
        raise KafkaError(code, f"Topic '{args.topic}'", result.error_message)
    return 0


def _delete(client: ToolClient, args: argparse.Namespace) -> int:
    names = matching_topics(
        args.topic, client.metadata(None).topics, args.exclude_internal, if_exists=args.if_exists
    )
    if not names:
        return 0  # --if-exists, and nothing matched
    values = {
        "topics": [{"name": n, "topic_id": None} for n in names],
        "timeout": client.timeout_ms,
    }

    def attempt() -> Any:
        body = client.send_any(DELETE_TOPICS, values)
        if any(int(r.error_code) == Errors.NOT_CONTROLLER for r in body.responses):
            raise RetriableError(error_name(Errors.NOT_CONTROLLER))
        return body

    body = client.retrying("deleting topics", attempt)
    failed = [r for r in body.responses if int(r.error_code) != Errors.NONE]
    for r in failed:
        message = f" ({r.error_message})" if r.error_message else ""
        print(
            f"{ERROR_PREFIX}Topic '{r.name}': {error_name(int(r.error_code))}{message}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> int:
    commands = {
        "list": _list,
        "describe": _describe,
        "create": _create,
        "alter": _alter,
        "delete": _delete,
    }
    return run_tool(commands[args.topics_command], args, error_prefix=ERROR_PREFIX)


def add_parser(sub: Any, default_cluster_dir: Path) -> None:
    """``kcoord topics ...`` under the top-level subparsers ``sub``."""
    topics = sub.add_parser("topics", help="topics, like kafka-topics.sh")
    tsub = topics.add_subparsers(dest="topics_command", required=True)
    listing = tsub.add_parser("list", help="topic names")
    listing.add_argument("--exclude-internal", action="store_true")
    describe = tsub.add_parser("describe", help="partitions, leaders, replicas, ISR")
    describe.add_argument("--topic", action="append", metavar="TOPIC", help=TOPIC_HELP)
    describe.add_argument("--exclude-internal", action="store_true")
    describe.add_argument("--if-exists", action="store_true", help=IF_EXISTS_HELP)
    reports = describe.add_mutually_exclusive_group()
    for dest, what in REPORTS.items():
        option = "--" + dest.replace("_", "-")
        reports.add_argument(option, dest=dest, action="store_true", help=what)
    create = tsub.add_parser("create", help="CreateTopics")
    create.add_argument("--topic", action=Once, required=True)
    create.add_argument(
        "--partitions", action=Once, type=int, help="default: the broker's num.partitions"
    )
    create.add_argument(
        "--replication-factor",
        action=Once,
        type=int,
        help="default: the broker's default.replication.factor",
    )
    create.add_argument("--config", action="append", metavar="KEY=VALUE", help="repeatable")
    alter = tsub.add_parser("alter", help="CreatePartitions: raise the partition count")
    alter.add_argument("--topic", action=Once, required=True)
    alter.add_argument(
        "--partitions", action=Once, type=int, required=True, help="the new partition count"
    )
    delete = tsub.add_parser("delete", help="DeleteTopics")
    delete.add_argument("--topic", action="append", required=True, metavar="TOPIC", help=TOPIC_HELP)
    delete.add_argument("--exclude-internal", action="store_true")
    delete.add_argument("--if-exists", action="store_true", help=IF_EXISTS_HELP)
    for p in (listing, describe, create, alter, delete):
        add_connection_arguments(p, default_cluster_dir)
    topics.set_defaults(func=_run)
