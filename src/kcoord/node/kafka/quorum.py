"""DescribeQuorum (apiKey 55, KIP-595, KIP-836): the metadata quorum as the controller sees it.

A broker forwards the request to the active controller, as Kafka's brokers do, because only the
leader knows each voter's log end offset and fetch times. The quorum's single partition is
``__cluster_metadata-0``; anything else asked for gets UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.config import registered_endpoint
from kcoord.node.kafka.apis import Request, Result
from kcoord.node.kafka.context import BrokerContext

log = logging.getLogger(__name__)

DESCRIBE_QUORUM_KEY: Final = 55
METADATA_TOPIC: Final = "__cluster_metadata"
TIMEOUT_S: Final = 5.0


class QuorumApi:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def handle_describe_quorum(self, request: Request) -> Result:
        asked = [
            (t.topic_name, p.partition_index) for t in request.body.topics for p in t.partitions
        ]
        try:
            q = await self.ctx.controller.call("DescribeQuorum", {}, TIMEOUT_S)
        except Exception as e:  # no active controller in time
            log.info("DescribeQuorum: %s", e)
            return {
                "error_code": Errors.NOT_LEADER_OR_FOLLOWER,
                "error_message": str(e),
                "topics": [],
            }
        if not q["is_leader"]:
            return {"error_code": Errors.NOT_LEADER_OR_FOLLOWER, "topics": []}
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition in asked:
            parts = topics.setdefault(topic, [])
            if (topic, partition) != (METADATA_TOPIC, 0):
                parts.append(
                    {"partition_index": partition, "error_code": Errors.UNKNOWN_TOPIC_OR_PARTITION}
                )
                continue
            parts.append(
                {
                    "partition_index": 0,
                    "error_code": Errors.NONE,
                    "leader_id": q["leader_id"],
                    "leader_epoch": q["leader_epoch"],
                    "high_watermark": q["high_watermark"],
                    "current_voters": [
                        {
                            "replica_id": v["node_id"],
                            "log_end_offset": v["log_end_offset"],
                            "last_fetch_timestamp": v["last_fetch_timestamp"],
                            "last_caught_up_timestamp": v["last_caught_up_timestamp"],
                        }
                        for v in q["voters"]
                    ],
                    "observers": [],
                }
            )
        nodes = []
        for broker in self.ctx.image.brokers.values():
            quorum = registered_endpoint(broker.endpoints, "quorum")
            host, port = ("", 0) if quorum is None else (quorum.host, quorum.port)
            nodes.append(
                {
                    "node_id": broker.broker_id,
                    "listeners": [{"name": "CONTROLLER", "host": host, "port": port}],
                }
            )
        return {
            "error_code": Errors.NONE,
            "topics": [{"topic_name": t, "partitions": p} for t, p in topics.items()],
            "nodes": nodes,
        }
