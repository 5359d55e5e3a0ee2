"""DescribeLogDirs (35): this node's data directory and the partitions it hosts there.

As Kafka's ``ReplicaManager.describeLogDirs``, answered by the node itself (each broker
describes its own directories; ``kafka-log-dirs.sh`` asks every broker): one entry, the
node's single data directory, with each hosted partition's size in bytes on disk and its
offset lag (how far its log end is behind its high watermark, as Kafka computes it for a
current replica), and the directory's file system's total and usable bytes (v4+). ``topics``
null asks for every hosted partition; a named topic or partition this node does not host is
left out.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import Request, Result
from kcoord.node.kafka.context import BrokerContext

log = logging.getLogger(__name__)

DESCRIBE_LOG_DIRS_KEY: Final = 35


class LogDirsApi:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def handle_describe_log_dirs(self, request: Request) -> Result:
        body = request.body
        wanted: dict[str, set[int]] | None = None
        if body.topics is not None:
            wanted = {}
            for t in body.topics:
                wanted.setdefault(t.topic, set()).update(int(p) for p in t.partitions)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), part in sorted(self.ctx.replicas.partitions.items()):
            if wanted is not None and index not in wanted.get(topic, ()):
                continue
            lg = part.log
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": index,
                    "partition_size": lg.size_bytes,
                    "offset_lag": max(part.high_watermark - lg.log_end_offset, 0),
                    "is_future_key": False,
                }
            )
        data_dir = self.ctx.replicas.logs.data_dir
        total = usable = -1
        try:
            stats = os.statvfs(data_dir)
            total, usable = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
        except OSError as e:
            log.warning("cannot read the size of %s: %s", data_dir, e)
        return {
            "throttle_time": 0,
            "error_code": Errors.NONE,
            "results": [
                {
                    "error_code": Errors.NONE,
                    "log_dir": str(data_dir.resolve()),
                    "topics": [
                        {"name": name, "partitions": parts} for name, parts in by_topic.items()
                    ],
                    "total_bytes": total,
                    "usable_bytes": usable,
                }
            ],
        }
