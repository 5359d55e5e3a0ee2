"""SaslHandshake (17) and SaslAuthenticate (36) on kcoord's only listener, PLAINTEXT.

A Kafka broker advertises both APIs on every listener and, on one whose connections need no
authentication, answers them with ILLEGAL_SASL_STATE (``KafkaApis.handleSaslHandshakeRequest``
and ``handleSaslAuthenticateRequest``): a client configured for SASL against it fails at once
with an authentication error (``IllegalSaslStateException``) instead of reconnecting for ever,
as it did when an unknown API key closed its connection.
"""

from __future__ import annotations

from typing import Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import Request, Result

SASL_HANDSHAKE_KEY: Final = 17
SASL_AUTHENTICATE_KEY: Final = 36


async def handle_sasl_handshake(request: Request) -> Result:
    return {"error_code": Errors.ILLEGAL_SASL_STATE, "mechanisms": []}


async def handle_sasl_authenticate(request: Request) -> Result:
    return {
        "error_code": Errors.ILLEGAL_SASL_STATE,
        "error_message": "SaslAuthenticate request received after successful authentication",
        "auth_bytes": b"",
        "session_lifetime_ms": 0,
    }
