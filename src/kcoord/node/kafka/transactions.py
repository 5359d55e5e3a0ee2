"""ListTransactions (apiKey 66, KIP-664): kcoord has no transaction coordinator.

Transactional producers are refused before they begin (FindCoordinator and InitProducerId
answer TRANSACTIONAL_ID_AUTHORIZATION_FAILED, see ``metadata`` and ``produce``), so no node
ever holds a transaction: every node answers ListTransactions with none, which is what
``kafka-transactions.sh list`` and the admin clients' hanging-transaction searches ask every
broker. As Kafka's ``TransactionStateManager.listTransactionStates``, state filters that name
no transaction state come back in ``unknown_state_filters``; the producer id, duration (v1,
KIP-994) and transactional id pattern (v2, KIP-1152) filters have nothing to filter.
"""

from __future__ import annotations

from typing import Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import Request, Result

LIST_TRANSACTIONS_KEY: Final = 66

# TransactionState names.
TRANSACTION_STATES: Final = frozenset(
    {
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    }
)


async def handle_list_transactions(request: Request) -> Result:
    unknown = [s for s in request.body.state_filters if s not in TRANSACTION_STATES]
    return {
        "throttle_time": 0,
        "error_code": Errors.NONE,
        "unknown_state_filters": unknown,
        "transaction_states": [],
    }
