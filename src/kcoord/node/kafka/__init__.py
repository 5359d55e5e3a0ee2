"""The Kafka wire-protocol listener and the data-plane APIs (DESIGN.md section 1, port 9092).

``server`` frames requests off TCP connections, ``codec`` decodes and encodes them with kio's
schemas, ``apis`` dispatches them to one handler per API key (``ApiRegistry.register``), and
the handler modules (``metadata``, ``admin``, ``produce``, ``fetch``) answer from the node's
``MetadataCache`` and ``ReplicaManager``, forwarding topic changes to the active controller
(``controller_channel``). ``broker`` wires them together for ``node.server``.

May import ``kcoord.node`` (cache, replica manager, RPC, controller service), ``kcoord.raft``,
``kcoord.cluster`` and ``kcoord.storage``. This package is the only importer of ``kio``.
"""
