"""kcoord: a Kafka-compatible group-coordinator cluster.

Packages (DESIGN.md section 2), dependencies pointing one way:
``node -> {cluster, raft, storage}``; ``chaos`` and ``pipeline`` may use all of them.
"""

__version__ = "0.1.0"
