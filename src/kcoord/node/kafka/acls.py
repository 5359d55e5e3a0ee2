"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): kcoord has no authorizer.

A Kafka broker without ``authorizer.class.name`` answers the three ACL APIs with
SECURITY_DISABLED and the message "No Authorizer is configured." (``KafkaApis``
``handleDescribeAcls`` / ``handleCreateAcls`` / ``handleDeleteAcls``): for DescribeAcls in the
response, for the other two in each creation's and each filter's result. kcoord does the same,
so ``kafka-acls.sh`` and the clients' admin calls get Kafka's clear refusal rather than an
unsupported-API error. Every client is allowed everything, as on a Kafka broker without an
authorizer.

Authorized operations (Metadata v8+, DescribeGroups v3+, DescribeCluster,
ConsumerGroupDescribe): asked for, they are every operation the resource type supports
(``AuthHelper.authorizedOperations`` without an authorizer, over ``AclEntry.supportedOperations``
of Kafka 4, where groups have configs), as a bit field with bit ``code`` set for each
``AclOperation``; not asked for, ``Integer.MIN_VALUE``.
"""

from __future__ import annotations

import functools
from typing import Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import Request, Result

DESCRIBE_ACLS_KEY: Final = 29
CREATE_ACLS_KEY: Final = 30
DELETE_ACLS_KEY: Final = 31

NO_AUTHORIZER: Final = "No Authorizer is configured."

# org.apache.kafka.common.acl.AclOperation codes.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
# AclEntry.supportedOperations per resource type.
TOPIC_OPERATIONS: Final = frozenset(
    {READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS}
)
GROUP_OPERATIONS: Final = frozenset({READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS})
CLUSTER_OPERATIONS: Final = frozenset(
    {CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE}
)
# Integer.MIN_VALUE: the operations were not asked for.
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)


@functools.cache  # once per resource type: a DescribeTopicPartitions may name 100,000 topics
def authorized_operations(supported: frozenset[int], asked: bool) -> int:
    """What a client may do with a resource of the type ``supported`` belongs to: everything
    (no authorizer), as ``Utils.to32BitField``; omitted unless ``asked``."""
    if not asked:
        return AUTHORIZED_OPERATIONS_OMITTED
    bits = 0
    for code in supported:
        bits |= 1 << code
    return bits


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
