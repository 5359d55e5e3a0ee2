"""DeleteRecords (21): move partitions' log start offsets up (Kafka's ``deleteRecords``).

Per partition, on its leader (``ReplicaManager.delete_records``, Kafka's
``Partition.deleteRecordsOnLeader``): offset -1 means the high watermark; an offset below 0 or
above the high watermark is OFFSET_OUT_OF_RANGE; a topic without ``delete`` in its
``cleanup.policy`` is POLICY_VIOLATION; ``__consumer_offsets`` is INVALID_TOPIC_EXCEPTION. The
answer waits, up to the request's timeout, until every live replica's log start offset has
reached the offset (Kafka's ``DelayedDeleteRecords``): the answered ``low_watermark`` is the
least of them. A partition still short of it then is REQUEST_TIMED_OUT. Records below the log
start offset are never served again: a consumer positioned there gets OFFSET_OUT_OF_RANGE and
resets, and retention removes the segments that lie wholly below it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import Deferred, Request, Result, wait_or_cancel
from kcoord.node.kafka.context import BrokerContext, is_internal
from kcoord.node.replica_manager import KafkaError, Partition

DELETE_RECORDS_KEY: Final = 21


@dataclass(slots=True)
class _PartitionResult:
    index: int
    error: Errors = Errors.NONE
    low_watermark: int = -1
    partition: Partition | None = None
    reached: asyncio.Future[int] | None = None


class DeleteRecordsApi:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def handle_delete_records(self, request: Request) -> Result:
        body = request.body
        timeout_s = max(0.0, body.timeout.total_seconds())
        # KafkaApis.handleDeleteRecordsRequest collects the partitions in a map: one named
        # twice is deleted once, at its last offset, and answered once.
        asked: dict[str, dict[int, int]] = {}
        for topic in body.topics:
            offsets = asked.setdefault(topic.name, {})
            for p in topic.partitions:
                offsets[p.partition_index] = p.offset
        topics: list[tuple[str, list[_PartitionResult]]] = []
        with self.ctx.replicas.one_log_start_checkpoint():
            for name, offsets in asked.items():
                results = [self._delete(name, index, offset) for index, offset in offsets.items()]
                topics.append((name, results))
        waits = [r for _, rs in topics for r in rs if r.reached is not None]
        if not waits:
            return _response(topics)
        return Deferred(self._complete(topics, waits, timeout_s))

    def _delete(self, topic: str, index: int, offset: int) -> _PartitionResult:
        result = _PartitionResult(index)
        replicas = self.ctx.replicas
        try:
            if is_internal(topic):
                raise KafkaError(
                    Errors.INVALID_TOPIC_EXCEPTION,
                    f"Cannot delete records of internal topic {topic}",
                )
            part, target = replicas.delete_records(topic, index, offset)
        except KafkaError as e:
            result.error = e.code
            return result
        result.partition = part
        result.reached = part.low_watermark_waiters.wait(target, replicas.low_watermark(part))
        return result

    async def _complete(
        self,
        topics: list[tuple[str, list[_PartitionResult]]],
        waits: list[_PartitionResult],
        timeout_s: float,
    ) -> dict[str, Any]:
        await wait_or_cancel([r.reached for r in waits if r.reached is not None], timeout_s)
        for result in waits:
            assert result.reached is not None and result.partition is not None
            if result.reached.cancelled():
                result.error = Errors.REQUEST_TIMED_OUT
                continue
            error = result.reached.exception()
            if isinstance(error, KafkaError):
                result.error = error.code
            elif error is not None:
                raise error
            else:
                # The low watermark that completed it, not the one now: a follower fenced
                # meanwhile may be back unreported (-1), and the answer would say -1.
                result.low_watermark = result.reached.result()
        return _response(topics)


def _response(topics: list[tuple[str, list[_PartitionResult]]]) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "topics": [
            {
                "name": name,
                "partitions": [
                    {
                        "partition_index": r.index,
                        "low_watermark": r.low_watermark if r.error is Errors.NONE else -1,
                        "error_code": r.error,
                    }
                    for r in results
                ],
            }
            for name, results in topics
        ],
    }
