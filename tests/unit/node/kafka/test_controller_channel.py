"""The channel from a node's Kafka APIs to the active controller (``controller_channel``)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kcoord.node.kafka.controller_channel import ControllerChannel, ControllerUnavailableError
from kcoord.node.metadata import MetadataCache
from kcoord.node.rpc import RpcClientPool


def test_a_client_timing_out_does_not_cancel_the_local_controllers_decision() -> None:
    """A CreateTopics whose commit outlasted the client's timeout was cancelled in the
    controller's commit: the topic was still created, and the controller set itself aside
    until it activated again. The client is told it timed out; the decision runs on, as a
    remote controller's does, and a failure it ends in is taken, not reported unretrieved."""

    async def scenario() -> None:
        commit = asyncio.Event()
        finished: list[str] = []

        async def create_topics(payload: dict[str, Any]) -> dict[str, Any]:
            try:
                await commit.wait()
            except asyncio.CancelledError:
                finished.append("cancelled")
                raise
            finished.append("committed")
            if payload.get("fail"):
                raise RuntimeError("refused after the client left")
            return {"topics": []}

        channel = ControllerChannel(
            1,
            lambda: 1,
            cast(MetadataCache, None),
            {"CreateTopics": create_topics},
            RpcClientPool(),
        )
        for payload in ({}, {"fail": True}):
            commit.clear()
            with pytest.raises(ControllerUnavailableError):
                await channel.call("CreateTopics", payload, 0.05)
            commit.set()
            while len(finished) < (1 if not payload else 2):
                await asyncio.sleep(0)
        assert finished == ["committed", "committed"]
        assert await channel.call("CreateTopics", {}, 5.0) == {"topics": []}

    asyncio.run(scenario())
