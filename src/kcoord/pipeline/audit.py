"""The offsets audit's rules: commit rates and a Burrow-style status per partition. Pure.

Input: every OffsetCommit record of ``__consumer_offsets`` (decoded by the job), in log
order per offsets partition. For each (group, topic, partition) the evaluation window is the
group's last ``max_samples`` commits (Burrow's window of offsets); each sample carries the
partition's lag at the commit's time, estimated by the job as the log end offset at that time
(ListOffsets by timestamp: the first offset at or after the commit timestamp) minus the
committed offset. The rules, in order (Burrow's evaluator, ``burrow/core/internal/evaluator``,
simplified to what these samples show):

  REWIND  the committed offset went backwards between two samples of the window;
  AHEAD   the committed offset is past the partition's high watermark now: the log was
          truncated, deleted or recreated below it, and a consumer starting from it gets
          OFFSET_OUT_OF_RANGE and resets (``auto.offset.reset``); the lag shown is negative,
          as ``kafka-consumer-groups.sh`` shows it;
  STOP    the partition has a lag now and the last commit is older than ``stop_after_ms``
          (the consumer stopped committing);
  OK      some sample, or now, has lag 0 (the consumer caught up within the window);
  STALL   at least two samples, the committed offset never moved and the lag is not 0;
  WARN    at least two samples and the lag grew at every step (the consumer falls behind);
  OK      otherwise.

A group's status is its worst partition's (OK < WARN < STALL < REWIND < AHEAD < STOP). A
sample's lag, an estimate from two clocks (the producers' record timestamps against the
coordinator's commit time), is never below 0; the lag now is exact (the high watermark). The commit
rate is the number of OffsetCommit records with a commit timestamp in the last ``window_ms``,
per second.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

DEFAULT_MAX_SAMPLES = 10


class Status(IntEnum):
    """Partition (and group) status; the order is severity, for a group's worst."""

    OK = 0
    WARN = 1
    STALL = 2
    REWIND = 3
    AHEAD = 4
    STOP = 5


@dataclass(frozen=True, slots=True)
class Commit:
    """One OffsetCommit record, with where it sits in ``__consumer_offsets``."""

    group: str
    topic: str
    partition: int
    offset: int
    commit_timestamp_ms: int
    log_partition: int
    log_offset: int


@dataclass(frozen=True, slots=True)
class Deleted:
    """An OffsetCommit tombstone: the key's offset was deleted (OffsetDelete, DeleteGroups)
    or expired."""

    group: str
    topic: str
    partition: int
    log_partition: int
    log_offset: int


@dataclass(frozen=True, slots=True)
class Sample:
    offset: int
    timestamp_ms: int
    lag: int | None  # None when the partition's end offset at that time is unknown


@dataclass(frozen=True, slots=True)
class PartitionReport:
    topic: str
    partition: int
    status: Status
    committed_offset: int
    last_commit_ms: int
    lag: int | None
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class GroupReport:
    group: str
    status: Status
    commits_in_window: int
    commit_rate_per_s: float
    partitions: tuple[PartitionReport, ...] = field(default=())


def partition_status(
    samples: Sequence[Sample], lag_now: int | None, now_ms: int, stop_after_ms: int
) -> Status:
    assert samples, "a partition is audited only once it has a commit"
    offsets = [s.offset for s in samples]
    if any(b < a for a, b in itertools.pairwise(offsets)):
        return Status.REWIND
    if lag_now is not None and lag_now < 0:
        return Status.AHEAD
    if lag_now is not None and lag_now > 0 and now_ms - samples[-1].timestamp_ms > stop_after_ms:
        return Status.STOP
    lags = [s.lag for s in samples]
    if lag_now == 0 or any(lag == 0 for lag in lags):
        return Status.OK
    if len(samples) < 2:
        return Status.OK
    if offsets[0] == offsets[-1] and (lag_now is None or lag_now > 0):
        return Status.STALL
    known = [lag for lag in lags if lag is not None]
    if len(known) == len(lags) and all(b > a for a, b in itertools.pairwise(known)):
        return Status.WARN
    return Status.OK


def without_deleted(rows: Iterable[Commit | Deleted]) -> list[Commit]:
    """The commits no later tombstone deleted (an offset deleted or expired, a group deleted:
    its records stay in the log until compaction removes them). Log order within an offsets
    partition is the order they were written; a key lives in one offsets partition."""
    by_key: dict[tuple[str, str, int], list[Commit]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r.log_partition, r.log_offset)):
        key = (row.group, row.topic, row.partition)
        if isinstance(row, Deleted):
            by_key.pop(key, None)
        else:
            by_key[key].append(row)
    return [c for commits in by_key.values() for c in commits]


def latest_commits(
    commits: Iterable[Commit], max_samples: int = DEFAULT_MAX_SAMPLES
) -> dict[tuple[str, str, int], list[Commit]]:
    """Each (group, topic, partition)'s last ``max_samples`` commits, oldest first. A group's
    commits are in one offsets partition, so log order is commit order."""
    by_key: dict[tuple[str, str, int], list[Commit]] = defaultdict(list)
    for c in sorted(commits, key=lambda c: (c.log_partition, c.log_offset)):
        by_key[(c.group, c.topic, c.partition)].append(c)
    return {key: items[-max_samples:] for key, items in sorted(by_key.items())}


def build_report(
    commits: Sequence[Commit],
    *,
    end_offsets_at: Mapping[tuple[str, int, int], int],
    end_offsets_now: Mapping[tuple[str, int], int],
    now_ms: int,
    window_ms: int,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    stop_after_ms: int | None = None,
) -> list[GroupReport]:
    """The audit. ``end_offsets_at[(topic, partition, timestamp_ms)]`` is the log end offset
    at a commit's time, for the commits ``latest_commits`` keeps; ``end_offsets_now`` the high
    watermarks now. A missing entry makes that lag unknown."""
    stop_after = window_ms if stop_after_ms is None else stop_after_ms
    windows = latest_commits(commits, max_samples)
    in_window: dict[str, int] = defaultdict(int)
    for c in commits:
        if now_ms - window_ms <= c.commit_timestamp_ms <= now_ms:
            in_window[c.group] += 1
    partitions: dict[str, list[PartitionReport]] = defaultdict(list)
    for (group, topic, partition), items in windows.items():
        samples = []
        for c in items:
            end = end_offsets_at.get((topic, partition, c.commit_timestamp_ms))
            samples.append(
                Sample(
                    c.offset, c.commit_timestamp_ms, None if end is None else max(0, end - c.offset)
                )
            )
        end_now = end_offsets_now.get((topic, partition))
        lag_now = None if end_now is None else end_now - items[-1].offset
        partitions[group].append(
            PartitionReport(
                topic=topic,
                partition=partition,
                status=partition_status(samples, lag_now, now_ms, stop_after),
                committed_offset=items[-1].offset,
                last_commit_ms=items[-1].commit_timestamp_ms,
                lag=lag_now,
                samples=tuple(samples),
            )
        )
    return [
        GroupReport(
            group=group,
            status=max(p.status for p in reports),
            commits_in_window=in_window[group],
            commit_rate_per_s=in_window[group] * 1000 / window_ms,
            partitions=tuple(reports),
        )
        for group, reports in sorted(partitions.items())
    ]


def report_json(reports: Sequence[GroupReport]) -> list[dict[str, Any]]:
    return [
        {
            "group": g.group,
            "status": g.status.name,
            "commits_in_window": g.commits_in_window,
            "commit_rate_per_s": round(g.commit_rate_per_s, 3),
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "status": p.status.name,
                    "committed_offset": p.committed_offset,
                    "last_commit_ms": p.last_commit_ms,
                    "lag": p.lag,
                    "lags": [s.lag for s in p.samples],
                    "offsets": [s.offset for s in p.samples],
                }
                for p in g.partitions
            ],
        }
        for g in reports
    ]


def report_text(reports: Sequence[GroupReport]) -> str:
    lines = [f"{'GROUP':<32} {'STATUS':<7} {'COMMITS/S':>9}  PARTITIONS (status lag)"]
    for g in reports:
        parts = ", ".join(
            f"{p.topic}-{p.partition} {p.status.name} {'?' if p.lag is None else p.lag}"
            for p in g.partitions
        )
        lines.append(f"{g.group:<32} {g.status.name:<7} {g.commit_rate_per_s:>9.3f}  {parts}")
    return "\n".join(lines)
