"""Calls to the active controller on behalf of Kafka clients (Kafka's ``ForwardingManager``).

CreateTopics, CreatePartitions and DeleteTopics (and auto-created topics) are decided by the
active controller. The channel finds it the way ``BrokerLifecycle`` does: the quorum leader's
node id, then that node's ``rpc`` endpoint from its registration in the metadata image; when
this node leads, the controller service is called in-process. A call is retried, with a
backoff of 50 ms doubling to 500 ms, while there is no leader, the leader is not active yet
(``NOT_CONTROLLER``) or it cannot be reached, until the caller's deadline.

The controller answers once its records are applied to *its* image. The reply carries their
metadata offset, and ``call`` then waits until this node's image has reached it too, so the
client's next Metadata request (to this node) sees the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kcoord.errors import Errors
from kcoord.node.config import registered_endpoint
from kcoord.node.metadata import MetadataCache
from kcoord.node.rpc import (
    RpcClientPool,
    RpcConnectionError,
    RpcError,
    RpcRemoteError,
    RpcTimeout,
    awaited_detached,
    with_deadline,
)

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 0.5


class ControllerUnavailableError(Exception):
    """No active controller answered before the deadline."""


class ControllerChannel:
    def __init__(
        self,
        node_id: int,
        leader_id: Callable[[], int | None],
        cache: MetadataCache,
        local_handlers: Mapping[str, Handler],
        rpc_pool: RpcClientPool,
    ) -> None:
        self.node_id = node_id
        self.leader_id = leader_id
        self.cache = cache
        self.local_handlers = dict(local_handlers)
        self.rpc_pool = rpc_pool

    async def call(self, method: str, payload: dict[str, Any], timeout_s: float) -> Any:
        """The controller's reply, once this node's image has what the reply describes.

        Raises ``ControllerUnavailableError`` when no active controller answered in time and
        ``RpcRemoteError`` for any other error answer.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        backoff_s = _BACKOFF_MIN_S
        last_error = "no attempt"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ControllerUnavailableError(f"{method}: {last_error}")
            try:
                reply = await self._call_once(method, payload, remaining)
            except _RetriableError as e:
                last_error = str(e)
            else:
                offset = reply.get("metadata_offset") if isinstance(reply, dict) else None
                if isinstance(offset, int):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self.cache.wait_for_offset(offset), max(deadline - loop.time(), 0)
                        )
                return reply
            await asyncio.sleep(min(backoff_s, max(deadline - loop.time(), 0)))  # retry backoff
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)

    async def _call_once(self, method: str, payload: dict[str, Any], timeout_s: float) -> Any:
        leader_id = self.leader_id()
        if leader_id is None:
            raise _RetriableError("no quorum leader")
        if leader_id == self.node_id:
            # The client's timeout ends its wait, not the controller's decision: cancelled in
            # its commit, the decision still committed, the client was told it timed out, and
            # the controller set itself aside until it activated again (NOT_CONTROLLER to
            # every broker's heartbeat meanwhile). Kafka's ControllerApis takes the timeout
            # as a deadline to start by (``caller_gone``); a remote controller's handler runs
            # on likewise (``runs_on_when_abandoned``).
            handler = self.local_handlers[method]
            try:
                return await awaited_detached(lambda: handler(payload), timeout_s)
            except TimeoutError as e:
                raise _RetriableError("the local controller did not answer in time") from e
            except RpcError as e:
                if e.code == int(Errors.NOT_CONTROLLER):
                    raise _RetriableError(str(e)) from e
                raise
        broker = self.cache.image.broker(leader_id)
        address = registered_endpoint(broker.endpoints if broker is not None else None, "rpc")
        if address is None:
            raise _RetriableError(f"controller {leader_id} has not registered its endpoint")
        try:
            return await self.rpc_pool.call(
                address.host, address.port, method, with_deadline(payload, timeout_s), timeout_s
            )
        except RpcRemoteError as e:
            if e.code == int(Errors.NOT_CONTROLLER):
                raise _RetriableError(str(e)) from e
            raise
        except (RpcConnectionError, RpcTimeout) as e:
            raise _RetriableError(f"node {leader_id}: {e}") from e


class _RetriableError(Exception):
    pass
