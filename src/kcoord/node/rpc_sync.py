"""One inter-node RPC from synchronous code (the CLI and the cluster launcher)."""

from __future__ import annotations

import asyncio
from typing import Any

from kcoord.node.rpc import RpcClient


def call_sync(host: str, port: int, method: str, payload: Any, timeout_s: float) -> Any:
    async def once() -> Any:
        client = RpcClient(host, port, connect_timeout_s=timeout_s)
        try:
            return await client.call(method, payload, timeout_s)
        finally:
            await client.close()

    return asyncio.run(once())
