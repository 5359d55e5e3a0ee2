"""Register with the active controller and heartbeat (Kafka's ``BrokerLifecycleManager``).

The node finds the active controller through its own quorum (every node is a voter in combined
mode): the Raft leader's node id, then that node's ``rpc`` endpoint from its registration in the
metadata image. The leader registers itself first, in-process, so its endpoint is always known
to the others. Registration gives a broker epoch; heartbeats every
``broker.heartbeat.interval.ms`` carry the node's metadata offset, and the controller unfences
the broker once that offset reaches its registration (it has caught up; the first such answer
sets ``initial_catch_up``, which the node waits for before it opens its Kafka listener). A
heartbeat answered with ``STALE_BROKER_EPOCH`` or ``BROKER_ID_NOT_REGISTERED`` (the controller
lost or replaced this registration) makes the node register again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kcoord.errors import Errors
from kcoord.node.config import registered_endpoint
from kcoord.node.controller_service import ControllerService
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
from kcoord.raft.quorum import MetadataQuorum

log = logging.getLogger(__name__)

# How often a broker in controlled shutdown asks again: the controller fences it on the first
# heartbeat and grants the shutdown once this node has replayed the fencing records.
_SHUTDOWN_POLL_S = 0.05


class ControllerUnavailableError(Exception):
    pass


class BrokerLifecycle:
    def __init__(  # noqa: PLR0917 - the node wires its parts in one place
        self,
        node_id: int,
        incarnation_id: str,
        endpoints: Mapping[str, str],
        quorum: MetadataQuorum,
        cache: MetadataCache,
        controller_service: ControllerService,
        rpc_pool: RpcClientPool,
        monotonic_ms: Callable[[], int],
        *,
        heartbeat_interval_ms: int = 500,
        rpc_timeout_s: float = 2.0,
        storage_lost: bool = False,
        on_storage_loss_registered: Callable[[], None] = lambda: None,
        offline_replicas: Callable[[], Sequence[tuple[str, int]]] = tuple,
        ready_to_unfence: bool = True,
    ) -> None:
        self.node_id = node_id
        # Until the node says it is (``set_ready_to_unfence``: it has published the metadata
        # image it caught up with), heartbeats ask to stay fenced (Kafka's ``wantFence =
        # !readyToUnfence``): unfenced at the catch-up, the broker could be elected the leader
        # of partitions before it hosts them.
        self.ready_to_unfence = ready_to_unfence
        self._wake = asyncio.Event()
        # The partitions whose logs failed to load (LogManager.offline), by topic id, sent with
        # every heartbeat (see raft/controller.py's _handle_offline_replicas).
        self.offline_replicas = offline_replicas
        # The data directory was found empty (by this process, or by one that died before it
        # registered): if the controller knows this broker, what it held is gone (a new or
        # wiped disk), and the registration says so, until one is accepted.
        self.storage_lost = storage_lost
        self.on_storage_loss_registered = on_storage_loss_registered
        self.incarnation_id = incarnation_id
        self.endpoints = dict(endpoints)
        self.quorum = quorum
        self.cache = cache
        self.controller_service = controller_service
        self.rpc_pool = rpc_pool
        self.monotonic_ms = monotonic_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rpc_timeout_s = rpc_timeout_s
        self.broker_epoch: int | None = None
        self.is_fenced = True
        self.is_caught_up = False
        # Set once the controller first says this node has replayed its own registration
        # (Kafka's ``BrokerLifecycleManager.initialCatchUpFuture``): the node opens its Kafka
        # listener only then.
        self.initial_catch_up = asyncio.Event()
        self.last_heartbeat_ok_ms: int | None = None
        self.want_shut_down = False
        self.shut_down_granted = asyncio.Event()

    async def run(self) -> None:
        while not self.shut_down_granted.is_set():
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except ControllerUnavailableError as e:
                log.debug("controller unavailable: %s", e)
            except Exception:
                log.exception("broker lifecycle step failed")
            with contextlib.suppress(TimeoutError):  # the heartbeat period, or a wake-up
                await asyncio.wait_for(self._wake.wait(), self.heartbeat_interval_ms / 1000)
            self._wake.clear()
        # Granted a controlled shutdown: no heartbeat after it (Kafka's
        # ``BrokerLifecycleManager.beginShutdown``). The controller counts the session from the
        # last heartbeat, and this node heartbeating on through its resignation and its stop
        # had its restart refused (DUPLICATE_BROKER_REGISTRATION) for a session timeout more.

    def set_ready_to_unfence(self) -> None:
        """Heartbeats stop asking to stay fenced; the next one goes now."""
        self.ready_to_unfence = True
        self._wake.set()

    async def _step(self) -> None:
        if self.broker_epoch is None:
            reply = await self.call_controller(
                "BrokerRegistration",
                {
                    "broker_id": self.node_id,
                    "incarnation_id": self.incarnation_id,
                    "endpoints": self.endpoints,
                    "cluster_id": self.cache.image.cluster_id,
                    "storage_lost": self.storage_lost,
                },
            )
            error = Errors.of(reply["error"])
            if error is not Errors.NONE:
                log.warning("registration refused: %s", error.name)
                return
            self.broker_epoch = int(reply["broker_epoch"])
            log.info("registered as broker %d with epoch %d", self.node_id, self.broker_epoch)
            if self.storage_lost:
                self.on_storage_loss_registered()
                self.storage_lost = False
        heartbeat: dict[str, Any] = {
            "broker_id": self.node_id,
            "broker_epoch": self.broker_epoch,
            "current_metadata_offset": self.cache.offset,
            "want_fence": not self.ready_to_unfence,
            "want_shut_down": self.want_shut_down,
        }
        offline = self.offline_replicas()
        if offline:  # logs that failed to load: the controller moves their leadership away
            heartbeat["offline_replica_ids"] = [list(tp) for tp in offline]
        reply = await self.call_controller("BrokerHeartbeat", heartbeat)
        error = Errors.of(reply["error"])
        if error in (Errors.STALE_BROKER_EPOCH, Errors.BROKER_ID_NOT_REGISTERED):
            log.warning("heartbeat answered %s: registering again", error.name)
            self.broker_epoch = None
            return
        if error is not Errors.NONE:
            log.warning("heartbeat answered %s", error.name)
            return
        self.last_heartbeat_ok_ms = self.monotonic_ms()
        if self.is_fenced != reply["is_fenced"]:
            log.info(
                "broker %d is now %s", self.node_id, "fenced" if reply["is_fenced"] else "unfenced"
            )
        self.is_fenced = bool(reply["is_fenced"])
        self.is_caught_up = bool(reply["is_caught_up"])
        if self.is_caught_up:
            self.initial_catch_up.set()
        if reply.get("should_shut_down"):
            self.shut_down_granted.set()

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Kafka's ``BrokerLifecycleManager.beginControlledShutdown``: heartbeat with
        ``want_shut_down`` until the controller answers ``should_shut_down``, that is until it
        has fenced this broker (moving its leaderships to the other ISR members) and every
        other active broker has replayed that far, so its partitions and coordinator shards
        have moved when the process exits (a broker already fenced is granted at once). False
        when there is nobody to hand over to (not registered, no other unfenced broker) or the
        controller did not grant it in time."""
        deadline = self.monotonic_ms() + int(timeout_s * 1000)
        self.want_shut_down = True
        while not self.shut_down_granted.is_set():
            others = set(self.cache.image.unfenced_broker_ids()) - {self.node_id}
            if self.broker_epoch is None or not others or self.monotonic_ms() >= deadline:
                return False
            try:
                await self._step()
            except ControllerUnavailableError as e:
                log.debug("controlled shutdown: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.shut_down_granted.wait(), _SHUTDOWN_POLL_S)
        return True

    async def alter_partition(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send an AlterPartition to the active controller (the ReplicaManager's ISR changes)."""
        return await self.call_controller("AlterPartition", payload)

    async def call_controller(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Call the active controller: in-process if this node is the Raft leader, else by RPC;
        ControllerUnavailableError when none answers."""
        leader_id = self.quorum.status().leader_id
        if leader_id is None:
            raise ControllerUnavailableError("no Raft leader known")
        if leader_id == self.node_id:
            handlers: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {
                "BrokerRegistration": self.controller_service.handle_broker_registration,
                "BrokerHeartbeat": self.controller_service.handle_broker_heartbeat,
                "AlterPartition": self.controller_service.handle_alter_partition,
            }
            # As an RPC would: the caller gives up after rpc_timeout_s (and heartbeats again,
            # which the controller notes as it arrives), the handler runs on (shielded), or
            # decides nothing if it had not begun (``caller_gone``).
            handler = handlers[method]
            try:
                return await awaited_detached(lambda: handler(payload), self.rpc_timeout_s)
            except RpcError as e:
                raise ControllerUnavailableError(str(e)) from e
            except TimeoutError as e:
                raise ControllerUnavailableError(
                    f"{method} to this node's controller: no answer in {self.rpc_timeout_s} s"
                ) from e
        broker = self.cache.image.broker(leader_id)
        rpc = registered_endpoint(broker.endpoints if broker is not None else None, "rpc")
        if rpc is None:
            raise ControllerUnavailableError(
                f"controller {leader_id} has not registered its endpoint"
            )
        client = self.rpc_pool.get(rpc.host, rpc.port)
        try:
            result: dict[str, Any] = await client.call(
                method, with_deadline(payload, self.rpc_timeout_s), self.rpc_timeout_s
            )
        except (RpcConnectionError, RpcTimeout, RpcRemoteError) as e:
            raise ControllerUnavailableError(f"{method} to node {leader_id}: {e}") from e
        return result
