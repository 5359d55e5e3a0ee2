"""Request dispatch: one handler per API key, and ApiVersions (Kafka's ``ApiVersionManager``).

A handler is ``async def handle(request: Request) -> Result``, registered with
``ApiRegistry.register(api_key, handler, min_version, max_version)``. The versions advertised
for an API are those of its registration that kio also has schemas for; every registered
version is decoded for the handler and its response encoded through
``codec.build_response``, so a handler deals in field names only and reads a request with
``getattr(body, "field", default)`` for fields older versions lack.

A handler answers with one of:

- a mapping of response field values (encoded for the request's version);
- ``Deferred(awaitable, max_bytes=0)``: the handler did the part of its work that must happen
  in request order (a produce appends) and the rest (waiting for the high watermark, a fetch
  long poll) finishes later; the connection goes on reading and processing the next requests
  while the responses still leave in request order. ``max_bytes``, the most the answer may
  take (a fetch's), counts as unsent until it is made: a peer that does not read cannot have
  several such answers made at once (Kafka reads a connection's next request only once it has
  answered the last);
- ``NO_RESPONSE``: nothing is written (a produce with acks=0);
- ``CLOSE_CONNECTION``: close the connection once the earlier responses are written (Kafka's
  answer to a failed acks=0 produce, so the producer refreshes its metadata).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, ParamSpec, Protocol, TypeVar

from kcoord.errors import Errors
from kcoord.node.kafka import codec
from kcoord.node.kafka.codec import API_VERSIONS_KEY, RequestHeader

# KIP-511: client software names and versions (ApiVersionsRequest.isValid).
_SOFTWARE_PATTERN: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")

# KIP-584 feature flags in ApiVersions v3+ (Kafka's BrokerFeatures and the finalized levels of
# its metadata log): name -> (min supported, max supported, finalized level). kcoord's levels
# are fixed by its code, always on: group.version 1 is KIP-848's consumer protocol,
# eligible.leader.replicas.version 1 is KIP-966's ELR. Kafka's metadata.version and
# kraft.version name the format of its own metadata log and quorum, which kcoord's are not, so
# they are left out; so is transaction.version (no transactions here).
FEATURES: Final = {
    "eligible.leader.replicas.version": (0, 1, 1),
    "group.version": (0, 1, 1),
}
# Kafka's epoch is the metadata offset of the last feature change; kcoord's never change.
FINALIZED_FEATURES_EPOCH: Final = 0
# ApiVersionsResponse: below v4 a supported feature whose minimum is 0 is left out, as older
# clients refuse such a range (KAFKA-17011, KAFKA-17492).
_ZERO_MIN_FEATURES_MIN_VERSION: Final = 4


_P = ParamSpec("_P")
_T = TypeVar("_T")


class OffLoop(Protocol):
    """Runs a pure step on the listener's codec threads (``KafkaServer.off_loop``)."""

    async def __call__(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T: ...


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Any  # the kio request dataclass of header.api_version
    # The client's address as Kafka's RequestContext.clientAddress prints it ("/127.0.0.1").
    client_host: str = ""

    @property
    def version(self) -> int:
        return self.header.api_version


class Deferred:
    """A response that completes later; see the module docstring."""

    __slots__ = ("awaitable", "max_bytes")

    def __init__(self, awaitable: Awaitable[Mapping[str, Any]], max_bytes: int = 0) -> None:
        self.awaitable = awaitable
        self.max_bytes = max_bytes


async def wait_or_cancel(futures: Sequence[asyncio.Future[Any]], timeout_s: float) -> None:
    """Wait for every future up to ``timeout_s``, then cancel the rest (so no wait stays
    registered, also when the caller itself is cancelled: its connection closed) and mark a
    failure nobody will read as read. A cancelled future afterwards means "timed out"."""
    try:
        await asyncio.wait(futures, timeout=timeout_s)
    finally:
        for fut in futures:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


# A handler walking a request's partitions (Produce, Fetch) or groups (DescribeGroups,
# OffsetFetch v8+) yields to the event loop after this many: one naming 200,000 held every
# other connection for seconds (server.py's docstring).
PARTITIONS_PER_SLICE: Final = 512
NO_RESPONSE: Final = _Marker("NO_RESPONSE")
CLOSE_CONNECTION: Final = _Marker("CLOSE_CONNECTION")

Result = Mapping[str, Any] | Deferred | _Marker
Handler = Callable[[Request], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class ApiSpec:
    api_key: int
    versions: range
    handler: Handler


class ApiRegistry:
    def __init__(self) -> None:
        self._apis: dict[int, ApiSpec] = {}
        self.register(API_VERSIONS_KEY, self.handle_api_versions)

    def register(
        self,
        api_key: int,
        handler: Handler,
        *,
        min_version: int = 0,
        max_version: int = 2**15 - 1,
    ) -> ApiSpec:
        """Serve ``api_key`` with ``handler`` for the versions both it and kio support."""
        kio = codec.kio_versions(api_key)
        versions = range(max(min_version, kio.start), min(max_version + 1, kio.stop))
        assert len(versions) > 0, f"api key {api_key}: no version in common with kio ({kio})"
        spec = ApiSpec(api_key, versions, handler)
        self._apis[api_key] = spec
        return spec

    def get(self, api_key: int) -> ApiSpec | None:
        return self._apis.get(api_key)

    @property
    def versions(self) -> dict[int, range]:
        return {key: spec.versions for key, spec in sorted(self._apis.items())}

    def warm_up(self) -> int:
        return codec.warm_up(self.versions)

    def api_keys(self) -> list[dict[str, int]]:
        return [
            {"api_key": key, "min_version": r.start, "max_version": r.stop - 1}
            for key, r in self.versions.items()
        ]

    # -----------------------------------------------------------------------------------------
    # ApiVersions (apiKey 18).

    async def handle_api_versions(self, request: Request) -> Result:
        body = request.body
        name = getattr(body, "client_software_name", None)
        version = getattr(body, "client_software_version", None)
        if name is not None and not (
            _SOFTWARE_PATTERN.fullmatch(name) and _SOFTWARE_PATTERN.fullmatch(version or "")
        ):
            return {"error_code": Errors.INVALID_REQUEST, "api_keys": []}
        zero_min_too = request.version >= _ZERO_MIN_FEATURES_MIN_VERSION
        return {
            "error_code": Errors.NONE,
            "api_keys": self.api_keys(),
            "throttle_time": 0,
            "supported_features": [
                {"name": name, "min_version": low, "max_version": high}
                for name, (low, high, _) in FEATURES.items()
                if low > 0 or zero_min_too
            ],
            "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
            "finalized_features": [
                {"name": name, "min_version_level": level, "max_version_level": level}
                for name, (_, _, level) in FEATURES.items()
            ],
        }

    def unsupported_api_versions(self, correlation_id: int) -> bytes:
        """Kafka's answer to an ApiVersions version it does not know: v0 with
        UNSUPPORTED_VERSION and ApiVersions' own versions alone, so the client retries with
        one (KIP-511, ``ApiVersionsRequest.getErrorResponse``)."""
        own = [k for k in self.api_keys() if k["api_key"] == API_VERSIONS_KEY]
        values = {"error_code": Errors.UNSUPPORTED_VERSION, "api_keys": own}
        return codec.encode_response(
            correlation_id, codec.build_response(API_VERSIONS_KEY, 0, values)
        )
