"""The active controller, run on the node that is the Raft leader (Kafka's ``QuorumController``).

Theory of operation
-------------------
Every node runs this service; it is *active* only while the local quorum says this node leads
and after a first batch proposed in the new term has been committed and applied locally (like
KRaft's leader writing its ``LeaderChangeMessage`` first): from then on the local image holds
everything committed before this term, so decisions are made on the whole committed state.

Decisions come from the pure ``raft.controller.Controller`` and are made one at a time (one
``asyncio.Lock``), each on the committed image: propose the records, wait until they are
committed *and* applied to the local image, then answer. A heartbeat that can write nothing
does not wait its turn: it is answered at once from the applied image
(``Controller.steady_broker_heartbeat``), so a long decision (a CreateTopics waiting for
thousands of logs) leaves the brokers' heartbeats flowing. A node that only believes it leads
(isolated, before pysyncobj's leader fallback timeout steps it down) can propose, but nothing
it proposes commits without a majority; and once a successor leads, pysyncobj hands what it
proposes to that leader, whose log takes it in the new term, where a batch of an older
controller epoch is skipped. So it never fences or elects anything.

Periodic duties (``tick``, every ``tick_interval_ms``): write the cluster id once, create
``__consumer_offsets`` once every expected broker is unfenced (or, after
``OFFSETS_TOPIC_GRACE_MS`` as the active controller, once its replication factor's worth are:
Kafka creates it on the first FindCoordinator, when a cluster's brokers are normally all up;
created early, a node that starts late would host none of it and coordinate no group), fence
brokers whose session expired, and move leadership back to preferred replicas (Kafka's auto
leader rebalance). Besides, every ``metadata.max.idle.interval.ms`` it appends a ``NoOp``
(KIP-835's NoOpRecord), so that each node's image keeps moving and a node that stopped following
the log can tell (``MetadataCache.last_applied_ms``).

RPC methods served here (payloads are msgpack maps): ``BrokerRegistration``,
``BrokerHeartbeat``, ``AlterPartition``, ``CreateTopics``, ``CreatePartitions`` and
``DeleteTopics`` (Kafka's brokers forward these three to the controller; their replies carry
the ``metadata_offset`` that holds the results, for the caller to wait for). A node that is
not the active controller answers ``NOT_CONTROLLER``; the caller retries at the leader.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from kcoord.errors import Errors
from kcoord.node.config import registered_endpoint
from kcoord.node.metadata import MetadataCache
from kcoord.node.rpc import RpcError, caller_gone
from kcoord.raft import records as rec
from kcoord.raft.controller import (
    CLUSTER_CONFIGS,
    MIN_INSYNC_REPLICAS_CONFIG,
    OFFSETS_TOPIC_NAME,
    AlterPartitionItem,
    AlterPartitionRequest,
    AlterPartitionResponse,
    BrokerHeartbeatRequest,
    BrokerRegistrationRequest,
    BrokerState,
    Controller,
    ControllerConfig,
    Election,
    NewPartitions,
    NewTopic,
    atomic_of,
)
from kcoord.raft.quorum import BatchTooLargeError, MetadataQuorum
from kcoord.stats import LATENCY_BUCKETS_S, Histogram
from kcoord.storage.config import parse_min_insync_replicas

log = logging.getLogger(__name__)


def new_topic_id() -> str:
    """A Kafka-style topic id: a random UUID as 22 characters of URL-safe base64."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


# How long the active controller waits for every expected broker before it creates
# ``__consumer_offsets`` on fewer (at least its replication factor): long enough for a
# cluster's nodes started together to register, short for one that lost a node for good.
OFFSETS_TOPIC_GRACE_MS = 10_000
RECENT_FENCINGS = 100  # fenced_by_me keeps the latest this many
# The most records a batch of a result that need not be atomic holds (fencing, elections, a
# broker's heartbeat). Kafka's controller writes such a result in batches of at most 10,000
# (QuorumController.MAX_RECORDS_PER_BATCH); fewer here, as every node applies a batch in one
# turn of its event loop, about 20 us a record: fencing a broker in the ISRs of 50,000
# partitions was one batch, which held each node's loop for a second.
MAX_RECORDS_PER_BATCH = 2_000


class NotActiveError(Exception):
    pass


class ControllerService:
    def __init__(
        self,
        node_id: int,
        quorum: MetadataQuorum,
        cache: MetadataCache,
        config: ControllerConfig,
        monotonic_ms: Callable[[], int],
        *,
        cluster_id: str | None = None,
        expected_brokers: int = 1,
        tick_interval_ms: int = 100,
        preferred_election_interval_ms: int = 5000,
        unclean_election_interval_ms: int = 300_000,
        propose_timeout_s: float = 10.0,
        max_idle_interval_ms: int = 500,
        broker_heartbeat_interval_ms: int = 500,
    ) -> None:
        self.node_id = node_id
        self.quorum = quorum
        self.cache = cache
        self.config = config
        self.monotonic_ms = monotonic_ms
        self.cluster_id = cluster_id
        self.expected_brokers = expected_brokers
        self.tick_interval_ms = tick_interval_ms
        self.preferred_election_interval_ms = preferred_election_interval_ms
        # Kafka's internal unclean.leader.election.interval.ms (5 minutes).
        self.unclean_election_interval_ms = unclean_election_interval_ms
        self.propose_timeout_s = propose_timeout_s
        # Kafka's metadata.max.idle.interval.ms (KIP-835): 0 writes no NoOp records.
        self.max_idle_interval_ms = max_idle_interval_ms
        # A heartbeat that must wait its turn and has not had it within this long of its
        # arrival decides nothing (Kafka's ControllerApis gives it a deadline of half the
        # heartbeat interval): the broker has heartbeated again by then, or is gone.
        self.heartbeat_deadline_ms = max(broker_heartbeat_interval_ms // 2, 100)
        self._last_no_op_ms = 0
        self.no_op_writes = 0
        self.controller: Controller | None = None
        self.active_epoch: int | None = None
        self.activated_at_ms = 0
        self._activating_epoch: int | None = None
        # The controller set aside by _decide_again_later, with its epoch and when: activated
        # again in that epoch, it goes on with the brokers' sessions, which the heartbeats
        # refused meanwhile still renew.
        self._set_aside: tuple[int, Controller, int] | None = None
        self._lock = asyncio.Lock()
        self._last_preferred_election_ms = 0
        self._last_unclean_election_ms = 0
        # The last refusal of __consumer_offsets' creation, logged once (it is retried each
        # tick): a user topic colliding with its name (``__consumer.offsets``) blocks it.
        self._offsets_topic_refusal: tuple[Errors, str] | None = None
        self.activations = 0
        # The brokers this node's controller fenced for missing heartbeats: how many, and the
        # latest (the admin API's; bounded, the count is not).
        self.fencings = 0
        self.fenced_by_me: collections.deque[int] = collections.deque(maxlen=RECENT_FENCINGS)
        # For the node's metrics: proposals made (and failed), and the time from proposing a
        # batch to having it in this node's image (Raft commit plus apply).
        self.proposals = 0
        self.proposal_failures = 0
        self.commit_latency_s = Histogram(LATENCY_BUCKETS_S)
        self._wake = asyncio.Event()

    # -----------------------------------------------------------------------------------------
    # Activation.

    @property
    def is_active(self) -> bool:
        return self.controller is not None

    def on_quorum_state_changed(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self._maybe_activate()
                if self.controller is not None:
                    await self.tick()
                    self._maybe_write_no_op()
            except asyncio.CancelledError:
                raise
            except NotActiveError as e:
                log.info("controller duty not committed: %s", e)
            except Exception:
                log.exception("controller tick failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_interval_ms / 1000)

    async def _maybe_activate(self) -> None:
        status = self.quorum.status()
        if not status.is_leader:
            if self.controller is not None:
                log.info("node %d is no longer the active controller", self.node_id)
            self.controller = None
            self._set_aside = None  # its term is over: it is never reused
            self.active_epoch = None
            return
        if self.controller is not None and self.active_epoch == status.epoch:
            return
        if self._activating_epoch == status.epoch:
            return
        self.controller = None
        self._activating_epoch = status.epoch
        try:
            # Commit a batch in this term before deciding anything (KRaft's LeaderChange).
            activated_at = await self._propose([rec.NoOp()], epoch=status.epoch)
        except NotActiveError as e:
            log.info("activation in epoch %d failed: %s", status.epoch, e)
            return
        finally:
            self._activating_epoch = None
        if not self.quorum.status().is_leader:
            return
        set_aside, self._set_aside = self._set_aside, None
        if (
            set_aside is not None
            and set_aside[0] == status.epoch
            and self.monotonic_ms() - set_aside[2] < self.config.broker_session_timeout_ms
        ):
            # Deciding again after an abandoned proposal, in the same term: Kafka's active
            # controller keeps its BrokerHeartbeatManager (a new one only comes with a new
            # active controller). A new one here restarted every broker's session, and a broker
            # that had died just before was fenced a whole session timeout late. Not after a
            # longer pause: a broker that stopped sending heartbeats to a node answering
            # NOT_CONTROLLER is not to be fenced for it.
            self.controller = set_aside[1]
            # A controlled shutdown whose later batches were abandoned may have committed
            # them since: the broker goes once the others have replayed past this NoOp.
            self.controller.heartbeats.controlled_shutdowns_written_up_to(activated_at)
        else:
            self.activated_at_ms = self.monotonic_ms()
            self.controller = Controller(self.config, activated_at_ms=self.activated_at_ms)
        # The activation's NoOp counts as one (Kafka schedules the first an interval after it).
        self._last_no_op_ms = self.monotonic_ms()
        self.active_epoch = status.epoch
        self.activations += 1
        log.info("node %d is the active controller in epoch %d", self.node_id, status.epoch)
        cluster = self.cache.image.resource_configs(CLUSTER_CONFIGS)
        pinned = cluster.get(MIN_INSYNC_REPLICAS_CONFIG)
        if (
            pinned is not None
            and parse_min_insync_replicas(pinned) != self.config.min_insync_replicas
        ):
            log.warning(
                "min.insync.replicas is %d in this node's config but %s at the cluster level, "
                "which applies: change it with kcoord configs alter --entity-type brokers "
                "--entity-default",
                self.config.min_insync_replicas,
                pinned,
            )

    # -----------------------------------------------------------------------------------------
    # Proposing.

    async def _propose(
        self,
        records: tuple[rec.MetadataRecord, ...] | list[rec.MetadataRecord],
        *,
        epoch: int | None = None,
    ) -> int:
        """Propose a batch decided in ``epoch`` (default: the epoch this controller is active
        in); return its offset once it is applied to the local image. The batch applies only
        if the leader of that epoch appended it (``MetadataQuorum.propose``): a controller
        deposed before it noticed proposes in vain."""
        if epoch is None:
            epoch = self.active_epoch
        if epoch is None:
            raise NotActiveError(f"node {self.node_id} is not the active controller")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def on_done(offset: int | None, error: str | None) -> None:
            def settle() -> None:
                if fut.done():
                    return
                if offset is None:
                    fut.set_exception(NotActiveError(error or "not committed"))
                else:
                    fut.set_result(offset)

            loop.call_soon_threadsafe(settle)

        start = loop.time()
        self.proposals += 1
        try:
            self.quorum.propose(list(records), on_done, epoch=epoch)
        except BatchTooLargeError:
            self.proposal_failures += 1  # nothing proposed: no decision to make again
            raise
        try:
            offset = await asyncio.wait_for(fut, self.propose_timeout_s)
        except TimeoutError as e:
            self.proposal_failures += 1
            self._decide_again_later(epoch, "timed out")
            raise NotActiveError("proposal timed out") from e
        except asyncio.CancelledError:
            # The caller went (its connection closed) and frees the decision lock: the batch
            # may still commit, exactly as after a timeout.
            self.proposal_failures += 1
            self._decide_again_later(epoch, "was abandoned")
            raise
        except NotActiveError:
            self.proposal_failures += 1
            raise
        # Committed: this node applies every committed batch in order, so the wait ends. It is
        # not bounded by the proposal's timeout: a batch creating thousands of partitions here
        # waits for their logs (QuorumBridge), and a timeout would answer a CreateTopics that
        # succeeded with an error (the client's retry then got TOPIC_ALREADY_EXISTS).
        try:
            await self.cache.wait_for_offset(offset)
        except asyncio.CancelledError:
            self._decide_again_later(epoch, "was abandoned before this node applied it")
            raise
        self.commit_latency_s.observe(loop.time() - start)
        return offset

    async def _propose_in_batches(self, records: tuple[rec.MetadataRecord, ...]) -> int:
        """Propose a result that need not apply atomically in batches of at most
        ``MAX_RECORDS_PER_BATCH``, each once the one before is applied here (Kafka's
        ``QuorumController.appendRecords`` for a result not ``atomicOf``). Ones after a batch
        that failed are not proposed: the controller decides again on the image it left."""
        epoch = self.active_epoch  # each batch decided in the epoch the result was
        offset = -1
        for start in range(0, len(records), MAX_RECORDS_PER_BATCH):
            batch = records[start : start + MAX_RECORDS_PER_BATCH]
            offset = await self._propose(batch, epoch=epoch)
        return offset

    def _decide_again_later(self, epoch: int, what: str) -> None:
        """A batch of ``epoch`` may commit after the decision lock is free, and the next
        decision would be made on an image without it (a fenced incarnation put back in an
        ISR). Kafka's controller renounces on a failed write; this one activates again, behind
        a batch of its own that commits only after this one is committed or lost."""
        if self.controller is not None and epoch == self.active_epoch:
            log.warning(
                "a proposal of epoch %d %s: deciding again once the log catches up", epoch, what
            )
            self._set_aside = (epoch, self.controller, self.monotonic_ms())
            self.controller = None
            self.active_epoch = None
            self._wake.set()

    def _require_active(self) -> Controller:
        if caller_gone():
            # Its requester stopped waiting before the decision began (a heartbeat of a
            # broker SIGKILLed meanwhile would renew a dead broker's session, or unfence it).
            raise RpcError(int(Errors.REQUEST_TIMED_OUT), "the caller had gone before it began")
        if self.controller is None:
            raise RpcError(int(Errors.NOT_CONTROLLER), f"node {self.node_id} is not the controller")
        return self.controller

    # -----------------------------------------------------------------------------------------
    # Periodic duties.

    async def tick(self) -> None:
        async with self._lock:
            controller = self.controller
            if controller is None:
                return
            image = self.cache.image
            if image.cluster_id is None:
                result = controller.maybe_write_cluster_id(image, self.cluster_id or new_topic_id())
                if result.records:
                    await self._propose(result.records)
                    return
            pinned = controller.elr_safety_records(image)
            if pinned.records:
                log.info(
                    "writing the cluster-level min.insync.replicas, %s, into the metadata log "
                    "(KIP-966): leaders and controllers read it before their own config",
                    pinned.response,
                )
                await self._propose(pinned.records)
            now_ms = self.monotonic_ms()
            # Decided in parts, each on the image with the one before applied (and nothing
            # else: the lock is held): the whole decision, at 50,000 partitions, held this
            # node's loop for a second. A part and its FenceBroker fill one batch.
            for fenced in controller.fence_stale_brokers(
                lambda: self.cache.image, now_ms, max_changes=MAX_RECORDS_PER_BATCH - 1
            ):
                if fenced.response:
                    log.warning(
                        "fencing brokers %s: no heartbeat within the session timeout",
                        list(fenced.response),
                    )
                    self.fenced_by_me.extend(fenced.response)
                    self.fencings += len(fenced.response)
                if fenced.records:
                    await self._propose_in_batches(fenced.records)
                if self.controller is not controller:
                    return
            image = self.cache.image
            if image.topic_by_name(OFFSETS_TOPIC_NAME) is None:
                unfenced = len(image.unfenced_broker_ids())
                wanted = min(self.config.offsets_topic_replication_factor, self.expected_brokers)
                waited = now_ms - self.activated_at_ms >= OFFSETS_TOPIC_GRACE_MS
                if unfenced >= self.expected_brokers or (waited and unfenced >= wanted):
                    created = controller.create_offsets_topic(image, new_topic_id())
                    if created.records:
                        log.info("creating %s: %s", OFFSETS_TOPIC_NAME, created.response)
                        await self._propose(created.records)
                    else:
                        refusal = (created.response.error, created.response.message)
                        if refusal != self._offsets_topic_refusal:
                            # No group can be coordinated until this is mended.
                            log.error(
                                "cannot create %s: %s %s",
                                OFFSETS_TOPIC_NAME,
                                refusal[0].name,
                                refusal[1],
                            )
                        self._offsets_topic_refusal = refusal
            if now_ms - self._last_preferred_election_ms >= self.preferred_election_interval_ms:
                self._last_preferred_election_ms = now_ms
                elected = controller.elect_preferred_leaders(self.cache.image)
                if elected.records:
                    await self._propose_in_batches(elected.records)
            if now_ms - self._last_unclean_election_ms >= self.unclean_election_interval_ms:
                self._last_unclean_election_ms = now_ms
                elected = controller.elect_unclean_leaders(self.cache.image)
                if elected.records:
                    log.warning("unclean leader election for %s", list(elected.response))
                    await self._propose_in_batches(elected.records)

    def _maybe_write_no_op(self) -> None:
        """Propose a ``NoOp`` once ``max_idle_interval_ms`` passed since the last one, as
        Kafka's active controller does on a timer whatever else it wrote
        (``QuorumController.maybeScheduleNextWriteNoOpRecord``, KIP-835). Not under the
        decision lock, and not waited for: it depends on nothing in the image and nothing
        depends on it, and Kafka's write event does not wait for its commit either. Awaited,
        one that never settled (a controller cut off, a snapshot installed over it) held the
        run loop, activation included, for the whole proposal timeout."""
        interval = self.max_idle_interval_ms
        epoch = self.active_epoch
        if interval <= 0 or self.controller is None or epoch is None:
            return
        now_ms = self.monotonic_ms()
        if now_ms - self._last_no_op_ms < interval:
            return
        self._last_no_op_ms = now_ms
        loop = asyncio.get_running_loop()

        def on_done(offset: int | None, error: str | None) -> None:
            loop.call_soon_threadsafe(self._no_op_settled, offset, error)

        self.proposals += 1
        self.quorum.propose([rec.NoOp()], on_done, epoch=epoch)

    def _no_op_settled(self, offset: int | None, error: str | None) -> None:
        if offset is None:
            self.proposal_failures += 1
            log.debug("a NoOp was not committed: %s", error)
        else:
            self.no_op_writes += 1

    # -----------------------------------------------------------------------------------------
    # RPC handlers.

    async def handle_broker_registration(self, payload: Any) -> dict[str, Any]:
        request = BrokerRegistrationRequest(
            broker_id=int(payload["broker_id"]),
            incarnation_id=str(payload["incarnation_id"]),
            endpoints={str(k): str(v) for k, v in payload["endpoints"].items()},
            rack=payload.get("rack"),
            cluster_id=payload.get("cluster_id"),
            storage_lost=bool(payload.get("storage_lost", False)),
        )
        if any(registered_endpoint(request.endpoints, name) is None for name in request.endpoints):
            # Every endpoint is dialled, or answered in Metadata, as host and port.
            return {"error": int(Errors.INVALID_REQUEST), "broker_epoch": -1}
        if request.rack is not None and not isinstance(request.rack, str):
            return {"error": int(Errors.INVALID_REQUEST), "broker_epoch": -1}
        async with self._lock:
            controller = self._require_active()
            result = controller.register_broker(self.cache.image, request, self.monotonic_ms())
            if result.records:
                await self._propose_or_not_controller(result.records)
        reply = result.response
        return {"error": int(reply.error), "broker_epoch": reply.broker_epoch}

    async def handle_broker_heartbeat(self, payload: Any) -> dict[str, Any]:
        request = BrokerHeartbeatRequest(
            broker_id=int(payload["broker_id"]),
            broker_epoch=int(payload["broker_epoch"]),
            current_metadata_offset=int(payload["current_metadata_offset"]),
            want_fence=bool(payload.get("want_fence", False)),
            want_shut_down=bool(payload.get("want_shut_down", False)),
            # By topic id; an older node's "offline_replicas" named topics and is ignored.
            offline_replicas=tuple(
                (str(topic_id), int(index))
                for topic_id, index in payload.get("offline_replica_ids", ())
            ),
        )
        arrived_ms = self.monotonic_ms()
        reply = None
        if self.controller is None and self._set_aside is not None:
            # Refused below (NOT_CONTROLLER), but the broker is alive: its session in the
            # controller set aside goes on.
            self._set_aside[1].track_broker_heartbeat(
                self.cache.image, request.broker_id, request.broker_epoch, self.monotonic_ms()
            )
        if self.controller is not None:  # before the lock: see Controller.track_broker_heartbeat
            self.controller.track_broker_heartbeat(
                self.cache.image, request.broker_id, request.broker_epoch, self.monotonic_ms()
            )
            # Kafka answers a heartbeat in its turn on the controller's event queue, where no
            # event waits for brokers. Here a decision holds the lock until its batch is
            # applied: for a CreateTopics of thousands of partitions, until this node has
            # created their logs (QuorumBridge), 12 s on a loaded machine. Its brokers, each
            # waiting for its heartbeat's answer, sent no other, and once the lock was free
            # the controller fenced every one of them (and itself). A heartbeat that writes
            # nothing needs no turn: it is answered at once from the applied image; one that
            # may write or decide (unfence, fence, shut down) waits its turn below.
            reply = self.controller.steady_broker_heartbeat(
                self.cache.image, request, self.monotonic_ms()
            )
        if reply is None:
            async with self._lock:
                controller = self._require_active()
                if self.monotonic_ms() - arrived_ms > self.heartbeat_deadline_ms:
                    # Waited behind a long decision for a broker that may have stopped (or
                    # been paused or cut off, its connection up) meanwhile: unfencing it now
                    # would make it a leader nobody reaches until its session expires.
                    raise RpcError(int(Errors.REQUEST_TIMED_OUT), "the heartbeat's deadline passed")
                # In parts, as the tick's fencing: a broker in every ISR of 50,000 partitions
                # that asks to shut down is fenced over a second of decisions.
                for result in controller.broker_heartbeat(
                    lambda: self.cache.image,
                    request,
                    self.monotonic_ms(),
                    max_changes=MAX_RECORDS_PER_BATCH - 1,
                ):
                    reply = result.response
                    if result.records:
                        offset = await self._propose_or_not_controller(result.records, atomic=False)
                        if request.want_shut_down:
                            controller.heartbeats.controlled_shutdowns_written_up_to(offset)
                    if self.controller is not controller:  # the rest is decided again
                        raise RpcError(int(Errors.NOT_CONTROLLER), "no longer the controller")
            assert reply is not None
        return {
            "error": int(reply.error),
            "is_caught_up": reply.is_caught_up,
            "is_fenced": reply.is_fenced,
            "should_shut_down": reply.should_shut_down,
        }

    async def handle_alter_partition(self, payload: Any) -> dict[str, Any]:
        request = alter_partition_request(payload)
        async with self._lock:
            controller = self._require_active()
            result = controller.alter_partition(self.cache.image, request)
            if result.records:
                await self._propose_or_not_controller(result.records)
        return alter_partition_reply(result.response)

    async def handle_create_topics(self, payload: Any) -> dict[str, Any]:
        """Create the topics in one decision (one atomic batch); per-topic errors as Kafka's
        CreateTopics."""
        topics = [
            NewTopic(
                str(t["name"]),
                new_topic_id(),
                num_partitions=int(t.get("num_partitions", -1)),
                replication_factor=int(t.get("replication_factor", -1)),
                configs={
                    str(k): None if v is None else str(v)
                    for k, v in (t.get("configs") or {}).items()
                },
                assignments=[
                    (int(index), [int(b) for b in replicas])
                    for index, replicas in t.get("assignments") or ()
                ],
            )
            for t in payload["topics"]
        ]
        async with self._lock:
            result = self._require_active().create_topics(self.cache.image, topics)
            if result.records and not payload.get("validate_only"):
                await self._propose_or_not_controller(result.records)
        results = [
            {
                "name": t.name,
                "error": int(r.error),
                "message": r.message,
                "topic_id": r.topic_id,
                "num_partitions": r.num_partitions,
                "replication_factor": r.replication_factor,
            }
            for t, r in zip(topics, result.response, strict=True)
        ]
        # The offset the caller's image must reach to see every result (kafka/ waits for it).
        return {"topics": results, "metadata_offset": self.cache.image.last_offset}

    async def handle_create_partitions(self, payload: Any) -> dict[str, Any]:
        """Add partitions to the topics in one decision (one atomic batch); per-topic errors
        as Kafka's CreatePartitions."""
        topics = payload["topics"]
        async with self._lock:
            controller = self._require_active()
            result = controller.create_partitions_of(
                self.cache.image,
                [
                    NewPartitions(
                        str(t["name"]),
                        int(t["count"]),
                        None
                        if t.get("assignments") is None
                        else [[int(b) for b in replicas] for replicas in t["assignments"]],
                    )
                    for t in topics
                ],
            )
            if result.records and not payload.get("validate_only"):
                await self._propose_or_not_controller(result.records)
        results = [
            {"name": t["name"], "error": int(r.error), "message": r.message}
            for t, r in zip(topics, result.response, strict=True)
        ]
        return {"topics": results, "metadata_offset": self.cache.image.last_offset}

    async def handle_delete_topics(self, payload: Any) -> dict[str, Any]:
        """Delete topics given by name (``names``) or by id (``ids``) in one decision (one atomic
        batch), each looked up here, on the active controller's image, as Kafka's
        ``ControllerApis.deleteTopics`` does (``findTopicNames``, ``findTopicIds``, then
        ``deleteTopics`` by id): the node that took the request may be behind the log, and an
        id it turned into a name could delete a topic re-created under that name since.
        ``duplicate_names`` and ``duplicate_ids`` are those the request gave twice (refused
        there): an id naming such a name is refused, and a name naming an id given too leaves
        both undeleted. One result per name, then per id, each with the topic's name and id as
        this controller knows them."""
        names = [str(name) for name in payload["names"]]
        ids = [str(topic_id) for topic_id in payload.get("ids", ())]
        duplicate_names = {str(name) for name in payload.get("duplicate_names", ())}
        duplicate_ids = {str(topic_id) for topic_id in payload.get("duplicate_ids", ())}
        by_name: dict[str, dict[str, Any]] = {}
        by_id: dict[str, dict[str, Any]] = {}

        def answer(
            name: str | None, topic_id: str | None, error: Errors, message: str = ""
        ) -> dict[str, Any]:
            return {"name": name, "topic_id": topic_id, "error": int(error), "message": message}

        async with self._lock:
            controller = self._require_active()
            image = self.cache.image
            id_to_name: dict[str, str] = {}
            named: set[str] = set()  # the ids of topics given by name
            for topic_id in ids:
                topic = image.topic(topic_id)
                if topic is None:
                    by_id[topic_id] = answer(None, topic_id, Errors.UNKNOWN_TOPIC_ID)
                elif topic.name in duplicate_names:
                    by_id[topic_id] = answer(
                        topic.name,
                        topic_id,
                        Errors.INVALID_REQUEST,
                        "The provided topic ID maps to a name that was already supplied.",
                    )
                else:
                    id_to_name[topic_id] = topic.name
            for name in names:
                topic = image.topic_by_name(name)
                if topic is None:
                    by_name[name] = answer(name, None, Errors.UNKNOWN_TOPIC_OR_PARTITION)
                elif topic.topic_id in duplicate_ids or topic.topic_id in id_to_name:
                    # Neither is deleted; the id is not answered (ControllerApis).
                    duplicate_ids.add(topic.topic_id)
                    id_to_name.pop(topic.topic_id, None)
                    by_name[name] = answer(
                        name,
                        topic.topic_id,
                        Errors.INVALID_REQUEST,
                        "The provided topic name maps to an ID that was already supplied.",
                    )
                else:
                    id_to_name[topic.topic_id] = name
                    named.add(topic.topic_id)
            to_delete = list(id_to_name)
            result = atomic_of(image, to_delete, controller.delete_topic)
            if result.records:
                await self._propose_or_not_controller(result.records)
        for topic_id, error in zip(to_delete, result.response, strict=True):
            name = id_to_name[topic_id]
            message = (
                f"The internal topic {OFFSETS_TOPIC_NAME} cannot be deleted."
                if error is Errors.INVALID_REQUEST and name == OFFSETS_TOPIC_NAME
                else ""
            )
            if topic_id in named:
                by_name[name] = answer(name, topic_id, error, message)
            else:
                by_id[topic_id] = answer(name, topic_id, error, message)
        results = [by_name[name] for name in names] + [by_id[i] for i in ids if i in by_id]
        return {"topics": results, "metadata_offset": self.cache.image.last_offset}

    async def handle_alter_configs(self, payload: Any) -> dict[str, Any]:
        """Alter configs, per-resource errors as Kafka's AlterConfigs; the resources' records
        are one batch (``ConfigurationControlManager.incrementalAlterConfigs`` returns
        ``ControllerResult.atomicOf``): proposed resource by resource, a leadership lost part
        way left the first resources altered and the client, told NOT_CONTROLLER, retried
        them all."""
        incremental = bool(payload["incremental"])
        resources = [
            (
                int(r["resource_type"]),
                str(r["resource_name"]),
                [
                    (str(key), int(op), None if value is None else str(value))
                    for key, op, value in r["ops"]
                ],
            )
            for r in payload["resources"]
        ]
        async with self._lock:
            controller = self._require_active()
            result = atomic_of(
                self.cache.image,
                resources,
                lambda image, r: controller.alter_configs(
                    image, r[0], r[1], r[2], incremental=incremental
                ),
            )
            if result.records and not payload.get("validate_only"):
                await self._propose_or_not_controller(result.records)
        return {
            "resources": [{"error": int(a.error), "message": a.message} for a in result.response],
            "metadata_offset": self.cache.image.last_offset,
        }

    async def handle_elect_leaders(self, payload: Any) -> dict[str, Any]:
        """ElectLeaders as one decision: ``{election: "preferred"|"unclean", partitions:
        [[topic, partition]] or None}`` -> ``{results: [[topic, partition, error]]}``."""
        partitions = payload.get("partitions")
        async with self._lock:
            controller = self._require_active()
            result = controller.elect_leaders(
                self.cache.image,
                Election(str(payload["election"])),
                None if partitions is None else [(str(t), int(p)) for t, p in partitions],
            )
            if result.records:
                # Not atomic, as Kafka's electLeaders (ControllerResult.of): every election
                # of the cluster in one batch held each node's loop while it applied.
                await self._propose_or_not_controller(result.records, atomic=False)
        return {
            "results": [[r.topic, r.partition, int(r.error)] for r in result.response],
            "metadata_offset": self.cache.image.last_offset,
        }

    async def _propose_or_not_controller(
        self, records: tuple[rec.MetadataRecord, ...], *, atomic: bool = True
    ) -> int:
        """Propose for an RPC caller: a lost leadership answers NOT_CONTROLLER (retriable)."""
        try:
            return await (self._propose(records) if atomic else self._propose_in_batches(records))
        except NotActiveError as e:
            raise RpcError(int(Errors.NOT_CONTROLLER), f"not committed: {e}") from e
        except BatchTooLargeError as e:
            # Kafka's RecordBatchTooLargeException for a write the Raft client cannot take:
            # final, where NOT_CONTROLLER had the broker retry it until the client's timeout.
            raise RpcError(int(Errors.RECORD_LIST_TOO_LARGE), str(e)) from e


def alter_partition_request(payload: Any) -> AlterPartitionRequest:
    """An AlterPartition RPC's payload as the controller takes it (``KeyError`` / ``TypeError``
    / ``ValueError`` if it is malformed)."""
    return AlterPartitionRequest(
        broker_id=int(payload["broker_id"]),
        broker_epoch=int(payload["broker_epoch"]),
        partitions=tuple(
            AlterPartitionItem(
                topic_id=str(p["topic_id"]),
                partition=int(p["partition"]),
                leader_epoch=int(p["leader_epoch"]),
                partition_epoch=int(p["partition_epoch"]),
                new_isr=tuple(BrokerState(int(b), int(e)) for b, e in p["new_isr"]),
            )
            for p in payload["partitions"]
        ),
    )


def alter_partition_reply(reply: AlterPartitionResponse) -> dict[str, Any]:
    """The controller's AlterPartition answer as the RPC carries it."""
    return {
        "error": int(reply.error),
        "partitions": [
            {
                "topic_id": r.topic_id,
                "partition": r.partition,
                "error": int(r.error),
                "leader": r.leader,
                "leader_epoch": r.leader_epoch,
                "partition_epoch": r.partition_epoch,
                "isr": list(r.isr),
            }
            for r in reply.partitions
        ],
    }
