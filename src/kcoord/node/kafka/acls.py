"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): kcoord has no authorizer.

A Kafka broker without ``authorizer.class.name`` answers the three ACL APIs with
SECURITY_DISABLED and the message "No Authorizer is configured." (``KafkaApis``
``handleDescribeAcls`` / ``handleCreateAcls`` / ``handleDeleteAcls``): for DescribeAcls in the
response, for the other two in each creation's and each filter's result. kcoord does the same,
so ``kafka-acls.sh`` and the clients' admin calls get Kafka's clear refusal rather than an
unsupported-API error. Every client is allowed everything, as on a Kafka broker without an
authorizer.
"""

from __future__ import annotations

from typing import Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import Request, Result

DESCRIBE_ACLS_KEY: Final = 29
CREATE_ACLS_KEY: Final = 30
DELETE_ACLS_KEY: Final = 31

NO_AUTHORIZER: Final = "No Authorizer is configured."


async def handle_describe_acls(request: Request) -> Result:
    return {
        "throttle_time": 0,
        "error_code": Errors.SECURITY_DISABLED,
        "error_message": NO_AUTHORIZER,
        "resources": [],
    }


async def handle_create_acls(request: Request) -> Result:
    refused = {"error_code": Errors.SECURITY_DISABLED, "error_message": NO_AUTHORIZER}
    return {"throttle_time": 0, "results": [refused for _ in request.body.creations]}


async def handle_delete_acls(request: Request) -> Result:
    refused = {
        "error_code": Errors.SECURITY_DISABLED,
        "error_message": NO_AUTHORIZER,
        "matching_acls": [],
    }
    return {"throttle_time": 0, "filter_results": [refused for _ in request.body.filters]}
