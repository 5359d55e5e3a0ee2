"""Tests of the classic group coordinator shard (``kcoord.cluster.coordinator``)."""
