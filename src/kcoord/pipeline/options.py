"""The ``kcoord`` source's options and offset planning: pure functions, no I/O.

Options use the vocabulary of Spark's Kafka source (``KafkaSourceProvider``), so a job written
for ``format("kafka")`` runs with ``format("kcoord")`` after changing the format name:

  kafka.bootstrap.servers   required; every other ``kafka.<key>`` option is passed to the client
                            (``kafka.isolation.level`` defaults to ``read_uncommitted``, as in
                            Spark, and the plan reads the offsets that level reaches)
  subscribe                 a comma-separated topic list        } exactly one of the three
  subscribePattern          a regular expression over topic names } (not Kafka's internal ones)
  assign                    JSON ``{"topic": [0, 1]}``           }
  startingOffsets           ``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}``
                            (-2 earliest, -1 latest); streaming default ``latest``, batch
                            ``earliest``; a restarted query resumes from its checkpoint instead
  endingOffsets             batch only: ``latest`` (default) or JSON (-1 latest)
  maxOffsetsPerTrigger      streaming only: at most this many offsets per micro-batch
  failOnDataLoss            ``true`` (default): fail when planned offsets are gone (retention,
                            a deleted partition, offsets gone backwards); ``false``: warn and
                            go on from what is there (a task too: from the log start, if
                            records of its range went while it read)
  groupId                   streaming: the consumer group the query commits its progress to
  initialOffsetsPath        streaming: a file (in the query's checkpoint directory, one per
                            source) keeping the offsets a new query started from, given again
                            when Spark asks once more (a restart before the first batch was
                            done); JSON ``{"version": 1, "subscription": ..., "offsets": ...}``,
                            refused for another subscription than the one that wrote it
  topic                     writer: the topic for rows without a ``topic`` column
  kafkaConsumer.pollTimeoutMs   how long a task waits for a fetch to make progress (120000)
  fetchOffset.numRetries    streaming: how often the driver asks for the log end offsets when
                            one is below where the query is, or a partition of the query is
                            missing from the metadata, before that is data loss (3)
  fetchOffset.retryIntervalMs   and how long it waits between two asks (1000)

JSON ``startingOffsets`` / ``endingOffsets`` must name every partition the query reads, as in
Spark. The timestamp options (``startingOffsetsByTimestamp``, ``startingTimestamp``,
``endingOffsetsByTimestamp``, ``endingTimestamp``) are refused: ignored, a query would read
from somewhere else than asked. Spark's tuning hints ``minPartitions``,
``minOffsetsPerTrigger`` and ``maxTriggerDelay`` are accepted and ignored (one input partition
per topic-partition; a micro-batch takes what there is). ``includeHeaders`` (false) adds the
``headers`` column, as Spark's does.

Offsets are Spark's JSON form everywhere: ``{"topic": {"partition": next offset}}``. A
partition range is ``[from_offset, until_offset)``; ``until`` is the next offset to read after
the range, which is also what an OffsetCommit stores (Kafka's "committed offset" is the next
record to consume), so a streaming query's end offsets are committed as they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Kafka's ListOffsets sentinels, as Spark's JSON offsets use them.
EARLIEST = -2
LATEST = -1
# Kafka's internal topics (``org.apache.kafka.common.internals.Topic.isInternal``), which a
# pattern subscription leaves out.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

DEFAULT_POLL_TIMEOUT_MS = 120_000
# Spark's fetchOffset.numRetries and fetchOffset.retryIntervalMs (KafkaSourceProvider).
DEFAULT_FETCH_OFFSET_ATTEMPTS = 3
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 1000
# Spark's Kafka source options that change what is read, which this source does not implement.
UNSUPPORTED_OPTIONS = (
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsetsByTimestamp",
    "endingTimestamp",
)

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


class OptionError(ValueError):
    """An option is missing, malformed or not allowed here (the message names it)."""


class DataLossError(RuntimeError):
    """Planned offsets are gone and ``failOnDataLoss`` is true."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest``, or per-partition offsets (which may hold the sentinels)."""

    kind: str  # "earliest" | "latest" | "specific"
    specific: tuple[tuple[TopicPartition, int], ...] = ()

    def as_dict(self) -> Offsets:
        return dict(self.specific)


@dataclass(frozen=True, slots=True)
class Subscription:
    kind: str  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartition, ...] = ()

    def select(self, partitions_by_topic: Mapping[str, int]) -> list[TopicPartition]:
        """The partitions this subscription reads, given each topic's partition count: with
        ``assign``, those of the assigned that the counts show (Spark's ``AssignStrategy``
        filters them so; ``raise_if_not_assigned`` refuses a query that starts without one)."""
        if self.kind == "assign":
            return sorted(tp for tp in self.assigned if tp[1] < partitions_by_topic.get(tp[0], 0))
        if self.kind == "subscribe":
            names = [t for t in self.topics if t in partitions_by_topic]
        else:
            # Spark's SubscribePatternStrategy lists topics with the admin client, which
            # leaves Kafka's internal topics out (``Topic.isInternal``): ``.*`` read
            # ``__consumer_offsets`` too.
            regex = re.compile(self.pattern)
            names = [
                t for t in partitions_by_topic if t not in INTERNAL_TOPICS and regex.fullmatch(t)
            ]
        return sorted((t, p) for t in names for p in range(partitions_by_topic[t]))

    def describe(self) -> dict[str, object]:
        """This subscription as JSON data, to tell whether two are the same."""
        return {
            "kind": self.kind,
            "topics": list(self.topics),
            "pattern": self.pattern,
            "assigned": [list(tp) for tp in self.assigned],
        }

    def explicit_topics(self) -> tuple[str, ...]:
        """Topics named outright (for a metadata request limited to them); () for a pattern."""
        if self.kind == "assign":
            return tuple(sorted({t for t, _ in self.assigned}))
        return self.topics


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    group_id: str | None
    poll_timeout_ms: int
    client_config: tuple[tuple[str, str], ...]
    fetch_offset_attempts: int = DEFAULT_FETCH_OFFSET_ATTEMPTS
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
    initial_offsets_path: str | None = None
    include_headers: bool = False


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """One Spark input partition: the records ``[from_offset, until_offset)`` of one partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self) -> None:
        assert 0 <= self.from_offset <= self.until_offset, self

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Spark passes options with the user's case, but option names are case-insensitive."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _parse_bool(name: str, raw: str) -> bool:
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise OptionError(f"option {name!r} must be true or false, not {raw!r}")


def parse_include_headers(options: Mapping[str, str]) -> bool:
    """Spark's ``includeHeaders`` (false): whether the rows have a ``headers`` column."""
    raw = _get(options, "includeHeaders")
    return False if raw is None else _parse_bool("includeHeaders", raw)


def _parse_positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value <= 0:
        raise OptionError(f"option {name!r} must be positive, not {value}")
    return value


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = {
        name: value
        for name in ("subscribe", "subscribePattern", "assign")
        if (value := _get(options, name)) is not None
    }
    if len(given) != 1:
        raise OptionError(
            "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be given"
            + (f", not {sorted(given)}" if given else "")
        )
    (kind, raw), *_ = given.items()
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as e:
            raise OptionError(
                f"option 'subscribePattern' is not a regular expression: {e}"
            ) from None
        return Subscription("subscribePattern", pattern=raw)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionError(f"option 'assign' is not JSON: {e}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option 'assign' must look like {{\"topic\": [0, 1]}}, not {raw!r}")
    assigned: list[TopicPartition] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OptionError(f"option 'assign': {topic!r} must map to a list of partitions")
        assigned.extend((topic, p) for p in partitions)
    return Subscription("assign", assigned=tuple(sorted(set(assigned))))


def parse_offsets_json(name: str, raw: str) -> Offsets:
    """Spark's JSON offsets ``{"topic": {"0": 23}}`` as a dict keyed by (topic, partition)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name!r} is not 'earliest', 'latest' or JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f'option {name!r} must look like {{"topic": {{"0": 23}}}}')
    out: Offsets = {}
    for topic, by_partition in parsed.items():
        if not isinstance(by_partition, dict):
            raise OptionError(f"option {name!r}: {topic!r} must map partitions to offsets")
        for partition, offset in by_partition.items():
            try:
                p = int(partition)
            except ValueError:
                raise OptionError(f"option {name!r}: {partition!r} is not a partition") from None
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(f"option {name!r}: {topic}-{p} has offset {offset!r}")
            out[(topic, p)] = offset
    return out


def parse_offset_spec(name: str, raw: str | None, default: str) -> OffsetSpec:
    text = (raw if raw is not None else default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())
    return OffsetSpec("specific", tuple(sorted(parse_offsets_json(name, text).items())))


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate the reader's options as Spark's Kafka source does (``validateBatchOptions`` /
    ``validateStreamOptions`` in ``KafkaSourceProvider``)."""
    bootstrap = _get(options, "kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' must be given")
    for name in UNSUPPORTED_OPTIONS:
        if _get(options, name) is not None:
            raise OptionError(
                f"option {name!r} is not supported by the kcoord source; use startingOffsets "
                "or endingOffsets with offsets"
            )
    subscription = parse_subscription(options)
    starting = parse_offset_spec(
        "startingOffsets", _get(options, "startingOffsets"), "latest" if streaming else "earliest"
    )
    ending = parse_offset_spec("endingOffsets", _get(options, "endingOffsets"), "latest")
    if streaming:
        if _get(options, "endingOffsets") is not None:
            raise OptionError("option 'endingOffsets' is for batch queries only")
    else:
        if starting.kind == "latest":
            raise OptionError("option 'startingOffsets' cannot be 'latest' for a batch query")
        if any(o == LATEST for o in starting.as_dict().values()):
            raise OptionError("option 'startingOffsets' cannot hold -1 (latest) in a batch query")
        if ending.kind == "earliest":
            raise OptionError("option 'endingOffsets' cannot be 'earliest' for a batch query")
        if any(o == EARLIEST for o in ending.as_dict().values()):
            raise OptionError("option 'endingOffsets' cannot hold -2 (earliest)")
    initial_offsets_path = _get(options, "initialOffsetsPath") or None
    if initial_offsets_path is not None and not streaming:
        raise OptionError("option 'initialOffsetsPath' is for streaming queries only")
    max_raw = _get(options, "maxOffsetsPerTrigger")
    if max_raw is not None and not streaming:
        raise OptionError("option 'maxOffsetsPerTrigger' is for streaming queries only")
    max_offsets = None if max_raw is None else _parse_positive_int("maxOffsetsPerTrigger", max_raw)
    fail_raw = _get(options, "failOnDataLoss")
    fail_on_data_loss = True if fail_raw is None else _parse_bool("failOnDataLoss", fail_raw)
    poll_raw = _get(options, "kafkaConsumer.pollTimeoutMs")
    poll_timeout_ms = (
        DEFAULT_POLL_TIMEOUT_MS
        if poll_raw is None
        else _parse_positive_int("kafkaConsumer.pollTimeoutMs", poll_raw)
    )
    attempts_raw = _get(options, "fetchOffset.numRetries")
    fetch_offset_attempts = (
        DEFAULT_FETCH_OFFSET_ATTEMPTS
        if attempts_raw is None
        else _parse_positive_int("fetchOffset.numRetries", attempts_raw)
    )
    interval_raw = _get(options, "fetchOffset.retryIntervalMs")
    fetch_offset_retry_interval_ms = (
        DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
        if interval_raw is None
        else _parse_positive_int("fetchOffset.retryIntervalMs", interval_raw)
    )
    group_id = _get(options, "groupId") or None
    # Spark forbids the client settings it owns; so do we (the source assigns partitions
    # itself and commits only what the query has processed).
    client: list[tuple[str, str]] = []
    for key, value in options.items():
        if not key.lower().startswith("kafka.") or key.lower() == "kafka.bootstrap.servers":
            continue
        setting = key[len("kafka.") :]
        if setting.lower() in ("group.id", "enable.auto.commit", "auto.offset.reset"):
            raise OptionError(f"option {key!r} is not supported: the source sets it itself")
        client.append((setting, value))
    return SourceOptions(
        bootstrap_servers=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_offsets,
        fail_on_data_loss=fail_on_data_loss,
        group_id=group_id,
        poll_timeout_ms=poll_timeout_ms,
        client_config=tuple(sorted(client)),
        include_headers=parse_include_headers(options),
        fetch_offset_attempts=fetch_offset_attempts,
        fetch_offset_retry_interval_ms=fetch_offset_retry_interval_ms,
        initial_offsets_path=initial_offsets_path,
    )


def resolve(
    spec: OffsetSpec,
    partitions: Iterable[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    unnamed: int = EARLIEST,
) -> Offsets:
    """Concrete offsets for ``partitions``: sentinels become the partition's earliest or
    latest offset; a partition the JSON form leaves out gets ``unnamed`` (starting offsets:
    the earliest, as Spark does for partitions that appear after a query started; ending
    offsets: the latest); a given offset is kept as is (and checked against the log by
    ``check_data_loss``)."""
    given = spec.as_dict()
    out: Offsets = {}
    for tp in partitions:
        if spec.kind == "latest":
            out[tp] = latest[tp]
        elif spec.kind == "earliest":
            out[tp] = earliest[tp]
        else:
            offset = given.get(tp, unnamed)
            out[tp] = (
                earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
            )
    return out


def raise_if_unknown_partitions(
    name: str, spec: OffsetSpec, partitions: Iterable[TopicPartition]
) -> None:
    """Spark fails a query whose JSON offsets do not name exactly the partitions it reads
    (``fetchSpecificOffsets``: "you must specify all TopicPartitions"; -2 and -1 stand for
    earliest and latest)."""
    if spec.kind != "specific":
        return
    known, named = set(partitions), set(spec.as_dict())
    unknown = sorted(named - known)
    if unknown:
        raise OptionError(
            f"option {name!r} names partitions the query does not read: "
            + ", ".join(f"{t}-{p}" for t, p in unknown)
        )
    missing = sorted(known - named)
    if missing:
        raise OptionError(
            f"option {name!r} must name every partition the query reads (-2 earliest, "
            "-1 latest); missing: " + ", ".join(f"{t}-{p}" for t, p in missing)
        )


def raise_if_not_assigned(subscription: Subscription, partitions: Sequence[TopicPartition]) -> None:
    """A query (or a batch read) that starts with ``assign`` naming a partition the metadata
    does not show is refused: a mistyped partition, never read. Once a streaming query runs, a
    partition that goes missing is data loss (``failOnDataLoss``), as Spark reports one."""
    if subscription.kind != "assign":
        return
    missing = sorted(set(subscription.assigned) - set(partitions))
    if missing:
        raise OptionError(
            "option 'assign': no such partitions: " + ", ".join(f"{t}-{p}" for t, p in missing)
        )


def check_data_loss(
    start: Mapping[TopicPartition, int],
    partitions: Iterable[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    fail_on_data_loss: bool,
) -> tuple[Offsets, list[str]]:
    """Adjust ``start`` to what the log still holds and say what was lost.

    A planned offset below the log start offset (retention or deletion took records), above
    the log end offset (the log was truncated or recreated) or a partition that is gone are
    data loss, as in Spark's ``KafkaMicroBatchStream``. With ``fail_on_data_loss`` that raises
    ``DataLossError``; otherwise the messages are returned for the caller to log, and a
    partition goes on as Spark's does: from its earliest offset when its records are gone,
    from its log end when the log end fell below the start (Spark drops that range, "offset
    was changed from X to Y", and the next batch starts at Y: the records below Y are not read
    again, though a truncated log's are the ones read already), dropped when it is gone.
    """
    current = set(partitions)
    adjusted: Offsets = {}
    lost: list[str] = []
    for tp, offset in sorted(start.items()):
        if tp not in current:
            lost.append(f"{tp[0]}-{tp[1]} is gone (it was at offset {offset})")
            continue
        if offset < earliest[tp]:
            lost.append(
                f"{tp[0]}-{tp[1]}: offsets {offset}..{earliest[tp] - 1} are gone "
                f"(log start offset {earliest[tp]})"
            )
            adjusted[tp] = earliest[tp]
        elif offset > latest[tp]:
            lost.append(
                f"{tp[0]}-{tp[1]}: offset {offset} is past the log end offset {latest[tp]} "
                "(truncated or recreated)"
            )
            adjusted[tp] = latest[tp]
        else:
            adjusted[tp] = offset
    if lost and fail_on_data_loss:
        raise DataLossError(
            "; ".join(lost) + ". Set failOnDataLoss=false to go on past the lost records."
        )
    return adjusted, lost


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_offsets: int
) -> Offsets:
    """End offsets that move at most ``max_offsets`` past ``start`` in total.

    Each partition gets a share proportional to its backlog (as ``maxOffsetsPerTrigger`` does
    in Spark's Kafka source), rounded down, and the offsets the rounding left over go one each
    to the partitions with the largest remainders, so the total is exactly
    ``min(max_offsets, backlog)`` and every partition with a backlog moves eventually.
    """
    backlog = {tp: max(0, latest[tp] - offset) for tp, offset in start.items() if tp in latest}
    total = sum(backlog.values())
    end = {tp: start[tp] for tp in start}
    end.update({tp: latest[tp] for tp in latest if tp not in start})
    if total <= max_offsets:
        end.update({tp: start[tp] + lag for tp, lag in backlog.items()})
        return end
    shares = {tp: lag * max_offsets // total for tp, lag in backlog.items()}
    remainders = sorted(backlog, key=lambda tp: (-(backlog[tp] * max_offsets % total), tp))
    left = max_offsets - sum(shares.values())
    for tp in remainders[:left]:
        shares[tp] += 1
    for tp, share in shares.items():
        assert share <= backlog[tp]
        end[tp] = start[tp] + share
    assert sum(end[tp] - start[tp] for tp in backlog) == max_offsets
    return end


def plan_ranges(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> list[OffsetRange]:
    """One input partition per topic-partition with records between ``start`` and ``end``;
    a partition ``start`` does not know begins at offset 0 (it appeared in this range)."""
    ranges = []
    for (topic, partition), until in sorted(end.items()):
        begin = start.get((topic, partition), 0)
        if until > begin:
            ranges.append(OffsetRange(topic, partition, begin, until))
    return ranges


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's JSON offsets, as the streaming reader's offset dict."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json_offsets(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {
        (topic, int(partition)): int(offset)
        for topic, by_partition in offsets.items()
        for partition, offset in by_partition.items()
    }
