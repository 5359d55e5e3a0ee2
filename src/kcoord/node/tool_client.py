"""A blocking Kafka admin client for the operator commands (``kcoord groups``, ``kcoord topics``).

Theory of operation
-------------------
Everything goes through the Kafka protocol, one request per connection
(``kafka.client.call_once``), so the commands work against kcoord and Apache Kafka alike. The
client does what Kafka's ``KafkaAdminClient`` does for these commands, synchronously:

- **Bootstrap.** Metadata (and any request that may go to any broker) is sent to the bootstrap
  servers in order; the first that answers wins. If none accepts a connection the command fails
  at once ("cannot connect to any bootstrap server ...") rather than retrying until the
  deadline: every address refusing means the cluster is down or the address is wrong. A server
  that took the request and did not answer in time is not passed over for the next one: it may
  have carried the request out, and the deadline has passed anyway (the request's timeout is
  the command's, plus a grace).
- **Brokers** are known by id from the last Metadata answer (their advertised host and port).
- **Group requests** go to the group's coordinator (FindCoordinator at any broker). An answer
  of NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS or COORDINATOR_NOT_AVAILABLE, or a dead
  connection, looks the coordinator up again and retries, as the admin client's
  ``CoordinatorStrategy`` does.
- **Partition requests** (ListOffsets) go to each partition's leader from Metadata; a leader
  change (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, ...) refreshes Metadata and retries only
  the partitions that failed.
- **Retries** stop at one deadline per call, ``timeout_ms`` after it started (Kafka's
  ``--timeout``, 5000 ms by default for kafka-consumer-groups.sh), with a short backoff between
  attempts. The error then names the last failure.

Versions are ones kcoord, Apache Kafka 3.x and Apache Kafka 4.x all serve (Kafka 4.0 dropped the
oldest versions of several APIs, KIP-896); the field names are kio's for those versions.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

from kcoord.errors import Errors
from kcoord.node.clock import SYSTEM_CLOCK, Clock
from kcoord.node.config import Endpoint

# (api key, version) of every request the tools send.
METADATA: Final = (3, 12)
FIND_COORDINATOR: Final = (10, 3)
DESCRIBE_GROUPS: Final = (15, 5)
CONSUMER_GROUP_DESCRIBE: Final = (69, 0)  # KIP-848 groups (Kafka 3.7+), where served
LIST_GROUPS: Final = (16, 4)
OFFSET_FETCH: Final = (9, 7)
OFFSET_COMMIT: Final = (8, 8)
LIST_OFFSETS: Final = (2, 5)
CREATE_TOPICS: Final = (19, 7)
DELETE_TOPICS: Final = (20, 6)
CREATE_PARTITIONS: Final = (37, 3)
DELETE_GROUPS: Final = (42, 2)
OFFSET_DELETE: Final = (47, 0)
API_VERSIONS: Final = (18, 3)
DESCRIBE_CONFIGS: Final = (32, 4)
INCREMENTAL_ALTER_CONFIGS: Final = (44, 1)

# ListOffsets timestamps with a meaning (ListOffsetsRequest.LATEST_TIMESTAMP, EARLIEST_...).
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
NO_OFFSET: Final = -1  # ListOffsets: no record at or after the timestamp; OffsetFetch: none

DEFAULT_TIMEOUT_MS: Final = 5_000
RETRY_BACKOFF_MS: Final = 100
# How much longer than the command's timeout one request may take: CreateTopics and DeleteTopics
# carry the timeout to the broker, which answers when it expires.
REQUEST_GRACE_S: Final = 1.0

COORDINATOR_ERRORS: Final = frozenset(
    {
        Errors.NOT_COORDINATOR,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
        Errors.COORDINATOR_NOT_AVAILABLE,
    }
)
# The per-partition errors after which the admin client refreshes metadata and retries.
LEADER_ERRORS: Final = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.REPLICA_NOT_AVAILABLE,
        Errors.OFFSET_NOT_AVAILABLE,
    }
)

T = TypeVar("T")


class ToolError(Exception):
    """A failure to report to the operator; the message says it all."""


class KafkaError(ToolError):
    """A Kafka error code in an answer."""

    def __init__(self, code: int, context: str, message: str | None = None) -> None:
        self.code = code
        detail = f" ({message})" if message else ""
        super().__init__(f"{context}: {error_name(code)}{detail}")


class RetriableError(Exception):
    """One attempt failed in a way that may pass: ``ToolClient.retrying`` tries again until
    the deadline."""


def error_name(code: int) -> str:
    """Kafka's name of an error code (``Errors.forCode(code).name()``)."""
    try:
        return Errors(code).name
    except ValueError:
        return f"UNKNOWN_ERROR_CODE_{code}"


def topic_id_str(topic_id: Any) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 of the 16 bytes, without padding."""
    if topic_id is None:
        return ""
    return base64.urlsafe_b64encode(topic_id.bytes).decode("ascii").rstrip("=")


def parse_bootstrap(text: str) -> list[Endpoint]:
    """``H:P[,H:P...]``; raises ``ToolError`` naming what is wrong."""
    try:
        endpoints = [Endpoint.parse(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as e:
        raise ToolError(f"invalid --bootstrap-server {text!r}: {e}") from None
    if not endpoints:
        raise ToolError("--bootstrap-server is empty")
    return endpoints


def resolve_bootstrap(text: str | None, cluster_dir: Path) -> list[Endpoint]:
    """``--bootstrap-server``, or else the bootstrap servers of the local cluster that
    ``kcoord cluster up`` started in ``cluster_dir``."""
    if text is not None:
        return parse_bootstrap(text)
    from kcoord.node.launcher import ClusterState, LauncherError

    try:
        state = ClusterState.load(cluster_dir)
    except LauncherError as e:
        raise ToolError(f"no --bootstrap-server given and {e}") from None
    return parse_bootstrap(state.bootstrap_servers)


class Once(argparse.Action):
    """An option that takes one value and may be given once: Kafka's tools read such an option
    with joptsimple's ``valueOf``, which fails when it was given twice ("Found multiple
    arguments for option"). argparse kept the last value: ``--group a --group b`` acted on
    ``b`` alone, ``--delete-config x --delete-config y`` deleted ``y`` alone."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = f"_{self.dest}_given"
        if getattr(namespace, given, False):
            parser.error(f"{option_string} was given more than once; give it once")
        setattr(namespace, given, True)
        setattr(namespace, self.dest, values)


def add_connection_arguments(parser: argparse.ArgumentParser, default_cluster_dir: Path) -> None:
    """The options every operator command shares."""
    parser.add_argument(
        "--bootstrap-server",
        action=Once,
        metavar="HOST:PORT[,HOST:PORT]",
        help="Kafka listeners to start from (default: the local cluster's, see --data-dir)",
    )
    parser.add_argument(
        "--data-dir",
        action=Once,
        default=str(default_cluster_dir),
        help="the local cluster whose bootstrap servers are the default",
    )
    parser.add_argument(
        "--timeout-ms",
        action=Once,
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help="give up retrying after this long (default %(default)s)",
    )


_INT32_MAX: Final = 2**31 - 1


def client_from_args(args: argparse.Namespace) -> ToolClient:
    if not 0 < args.timeout_ms <= _INT32_MAX:  # requests carry it as an int32
        raise ToolError(f"--timeout-ms must be between 1 and {_INT32_MAX}")
    bootstrap = resolve_bootstrap(args.bootstrap_server, Path(args.data_dir))
    return ToolClient(bootstrap, timeout_ms=args.timeout_ms)


def run_tool(
    main: Callable[[ToolClient, argparse.Namespace], int],
    args: argparse.Namespace,
    *,
    error_prefix: str = "Error: ",
) -> int:
    """Run one command; a ``ToolError`` goes to stderr after ``error_prefix`` (each Kafka tool
    has its own) and exits 1."""
    try:
        return main(client_from_args(args), args)
    except ToolError as e:
        print(f"{error_prefix}{e}", file=sys.stderr)
        return 1


def _describe_os_error(e: OSError) -> str:
    if isinstance(e, TimeoutError):
        return "timed out"
    return e.strerror or str(e) or type(e).__name__


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"  # Kafka's TopicPartition.toString()


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return str(Endpoint(self.host, self.port))


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader_id: int  # -1: no leader
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: str
    is_internal: bool
    error_code: int
    partitions: tuple[PartitionMetadata, ...]  # by partition index

    def partition(self, index: int) -> PartitionMetadata | None:
        for p in self.partitions:
            if p.partition == index:
                return p
        return None


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str | None
    controller_id: int
    brokers: Mapping[int, Broker]
    topics: Mapping[str, TopicMetadata]


class ToolClient:
    """See the module docstring. ``clock`` and ``sleep`` are injectable for tests."""

    def __init__(
        self,
        bootstrap: Sequence[Endpoint],
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        assert bootstrap, "no bootstrap servers"
        self.bootstrap = list(bootstrap)
        self.timeout_ms = timeout_ms
        self._clock = clock
        self._sleep = sleep
        self._brokers: dict[int, Broker] = {}
        self._api_versions: dict[int, range] | None = None

    # -- transport -----------------------------------------------------------------------------

    def send(self, endpoint: Endpoint, api: tuple[int, int], values: Mapping[str, Any]) -> Any:
        """One request and its kio answer; ``OSError`` if the connection fails."""
        # Imported here: kio takes ~0.2 s to import, and every kcoord command's parser
        # imports this module.
        from kcoord.node.kafka.client import BadAnswerError, RequestValueError, call_once

        api_key, version = api
        timeout_s = self.timeout_ms / 1000 + REQUEST_GRACE_S
        try:
            return call_once(
                endpoint.host, endpoint.port, api_key, version, values, timeout_s=timeout_s
            )
        except RequestValueError as e:
            raise ToolError(str(e)) from None
        except BadAnswerError as e:
            # Not retried, not sent elsewhere: the request may have been carried out.
            raise ToolError(f"{e}; the request may have been carried out") from None

    def send_any(self, api: tuple[int, int], values: Mapping[str, Any]) -> Any:
        """To the first bootstrap server that answers."""
        from kcoord.node.kafka.client import NoAnswerError

        failures = []
        for endpoint in self.bootstrap:
            try:
                return self.send(endpoint, api, values)
            except NoAnswerError:
                raise ToolError(
                    f"bootstrap server {endpoint} took the request and did not answer within "
                    f"{self.timeout_ms} ms; it may have been carried out"
                ) from None
            except OSError as e:
                failures.append(f"{endpoint} ({_describe_os_error(e)})")
        raise ToolError("cannot connect to any bootstrap server: " + ", ".join(failures))

    def send_to(self, node_id: int, api: tuple[int, int], values: Mapping[str, Any]) -> Any:
        """To one broker; a failure to reach it is ``RetriableError`` (a retry of the same
        request, as the group commands make, is harmless), and one that took the request and
        did not answer says the request may have been carried out, which the timeout's
        message then carries (an operator who ran a --shift-by again shifted twice)."""
        from kcoord.node.kafka.client import NoAnswerError

        broker = self._brokers.get(node_id)
        if broker is None:
            self.metadata([])
            broker = self._brokers.get(node_id)
            if broker is None:
                raise RetriableError(f"broker {node_id} is not in the metadata")
        try:
            return self.send(Endpoint(broker.host, broker.port), api, values)
        except NoAnswerError as e:
            raise RetriableError(
                f"broker {node_id} at {broker.address} took the request and did not answer "
                "in time; it may have been carried out"
            ) from e
        except OSError as e:
            raise RetriableError(
                f"broker {node_id} at {broker.address}: {_describe_os_error(e)}"
            ) from e

    def retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt()`` until it returns, or until the deadline if it raises ``RetriableError``."""
        deadline_ms = self._clock.monotonic_ms() + self.timeout_ms
        while True:
            try:
                return attempt()
            except RetriableError as e:
                if self._clock.monotonic_ms() >= deadline_ms:
                    raise ToolError(f"timed out after {self.timeout_ms} ms {what}: {e}") from None
            self._sleep(RETRY_BACKOFF_MS / 1000)

    # -- cluster -------------------------------------------------------------------------------

    def metadata(self, topics: Collection[str] | None) -> ClusterMetadata:
        """Metadata v12 for ``topics`` (None: every topic). Never creates a topic."""
        body = self.send_any(
            METADATA,
            {
                "topics": None
                if topics is None
                else [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        brokers = {
            int(b.node_id): Broker(int(b.node_id), str(b.host), int(b.port)) for b in body.brokers
        }
        self._brokers = dict(brokers)
        described = {}
        for t in body.topics:
            name = str(t.name)
            described[name] = TopicMetadata(
                name=name,
                topic_id=topic_id_str(t.topic_id),
                is_internal=bool(t.is_internal),
                error_code=int(t.error_code),
                partitions=tuple(
                    sorted(
                        (
                            PartitionMetadata(
                                partition=int(p.partition_index),
                                leader_id=int(p.leader_id),
                                leader_epoch=int(p.leader_epoch),
                                replicas=tuple(int(r) for r in p.replica_nodes),
                                isr=tuple(int(r) for r in p.isr_nodes),
                                error_code=int(p.error_code),
                            )
                            for p in t.partitions
                        ),
                        key=lambda p: p.partition,
                    )
                ),
            )
        return ClusterMetadata(
            cluster_id=body.cluster_id,
            controller_id=int(body.controller_id),
            brokers=brokers,
            topics=described,
        )

    def supported_version(self, api_key: int, version: int) -> bool:
        """Whether the bootstrap server that answers serves ``version`` of ``api_key``
        (ApiVersions v3, asked once per client)."""
        if self._api_versions is None:
            body = self.send_any(
                API_VERSIONS, {"client_software_name": "kcoord", "client_software_version": "0"}
            )
            self._api_versions = (
                {
                    int(k.api_key): range(int(k.min_version), int(k.max_version) + 1)
                    for k in body.api_keys
                }
                if int(body.error_code) == Errors.NONE
                else {}
            )
        return version in self._api_versions.get(api_key, range(0))

    # -- groups --------------------------------------------------------------------------------

    def _find_coordinator_once(self, group_id: str) -> Broker:
        body = self.send_any(FIND_COORDINATOR, {"key": group_id, "key_type": 0})
        code = int(body.error_code)
        if code in COORDINATOR_ERRORS:
            raise RetriableError(f"FindCoordinator: {error_name(code)}")
        if code != Errors.NONE:
            raise KafkaError(code, f"FindCoordinator for group '{group_id}'", body.error_message)
        broker = Broker(int(body.node_id), str(body.host), int(body.port))
        self._brokers[broker.node_id] = broker
        return broker

    def find_coordinator(self, group_id: str) -> Broker:
        return self.retrying(
            f"finding the coordinator of group '{group_id}'",
            lambda: self._find_coordinator_once(group_id),
        )

    def group_request(
        self,
        group_id: str,
        api: tuple[int, int],
        values: Mapping[str, Any],
        error_of: Callable[[Any], int],
    ) -> tuple[Broker, Any]:
        """(coordinator, answer) of a request to ``group_id``'s coordinator. ``error_of``
        picks the answer's error for the group; coordinator errors are retried."""

        def attempt() -> tuple[Broker, Any]:
            coordinator = self._find_coordinator_once(group_id)
            body = self.send_to(coordinator.node_id, api, values)
            code = error_of(body)
            if code in COORDINATOR_ERRORS:
                raise RetriableError(f"coordinator {coordinator.node_id}: {error_name(code)}")
            return coordinator, body

        return self.retrying(f"waiting for the coordinator of group '{group_id}'", attempt)

    def list_groups(self, states: Collection[str]) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group of every broker: each broker
        lists the groups it coordinates (``KafkaAdminClient.listGroups``)."""
        brokers = self.metadata([]).brokers
        listed: dict[str, tuple[str, str, str]] = {}
        for node_id in sorted(brokers):

            def attempt(node_id: int = node_id) -> Any:
                body = self.send_to(node_id, LIST_GROUPS, {"states_filter": list(states)})
                code = int(body.error_code)
                if code in COORDINATOR_ERRORS:
                    raise RetriableError(f"ListGroups at broker {node_id}: {error_name(code)}")
                if code != Errors.NONE:
                    raise KafkaError(code, f"ListGroups at broker {node_id}")
                return body

            body = self.retrying(f"listing the groups of broker {node_id}", attempt)
            for g in body.groups:
                listed[str(g.group_id)] = (
                    str(g.group_id),
                    str(g.protocol_type),
                    str(g.group_state),
                )
        return [listed[g] for g in sorted(listed)]

    # -- partitions ----------------------------------------------------------------------------

    def list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int]:
        """ListOffsets v5 (read_uncommitted) at each partition's leader: the offset for
        ``timestamp`` (LATEST_TIMESTAMP: the high watermark; EARLIEST_TIMESTAMP: the log start
        offset; otherwise the first offset with a timestamp at or after it, or NO_OFFSET).

        Partitions without a leader in the metadata are left out of the answer, as Kafka's
        ``ConsumerGroupCommand`` leaves them out of its ListOffsets (it shows "-" for them);
        leader changes while asking are retried until the deadline."""
        pending = set(partitions)
        found: dict[TopicPartition, int] = {}

        def attempt() -> dict[TopicPartition, int]:
            topics = self.metadata(sorted({tp.topic for tp in pending})).topics
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in sorted(pending):
                topic = topics.get(tp.topic)
                p = topic.partition(tp.partition) if topic is not None else None
                if p is None or p.leader_id < 0:
                    pending.discard(tp)
                else:
                    by_leader.setdefault(p.leader_id, []).append(tp)
            failures: list[str] = []
            for leader, tps in sorted(by_leader.items()):
                try:
                    body = self.send_to(leader, LIST_OFFSETS, _list_offsets_values(tps, timestamp))
                except RetriableError as e:
                    failures.append(str(e))
                    continue
                for t in body.topics:
                    for p in t.partitions:
                        tp = TopicPartition(str(t.name), int(p.partition_index))
                        code = int(p.error_code)
                        if code == Errors.NONE:
                            found[tp] = int(p.offset)
                            pending.discard(tp)
                        elif code in LEADER_ERRORS:
                            failures.append(f"{tp}: {error_name(code)}")
                        else:
                            raise KafkaError(code, f"ListOffsets for {tp}")
            if pending:
                raise RetriableError("; ".join(failures) or f"no answer for {sorted(pending)}")
            return found

        return self.retrying("listing offsets", attempt)


def _list_offsets_values(tps: Iterable[TopicPartition], timestamp: int) -> dict[str, Any]:
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": p, "current_leader_epoch": -1, "timestamp": timestamp}
                    for p in sorted(ps)
                ],
            }
            for topic, ps in sorted(by_topic.items())
        ],
    }
