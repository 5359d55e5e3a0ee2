"""The launcher's readiness rule (``cluster up`` and every cluster test start from it)."""

from __future__ import annotations

from typing import Any

import pytest

from kcoord.node import launcher


def _state() -> launcher.ClusterState:
    nodes = [
        launcher.NodeProcess(i, "127.0.0.1", 9000 + i, 9100 + i, 9200 + i, 9300 + i, f"/n{i}")
        for i in (1, 2, 3)
    ]
    return launcher.ClusterState("/unused", nodes)


def _view(node_id: int, offsets_topic: bool) -> dict[str, Any]:
    return {
        "controller_id": 3,
        "is_active_controller": node_id == 3,
        "brokers": {str(i): {"fenced": False, "epoch": 10 + i} for i in (1, 2, 3)},
        "broker_epoch": 10 + node_id,
        "serving": True,
        "offsets_topic_created": offsets_topic,
    }


def test_ready_waits_for_the_offsets_topic_in_every_nodes_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The controller's image has the topic; node 1 is still creating its logs for the batch.
    images = {1: False, 2: True, 3: True}
    monkeypatch.setattr(
        launcher, "describe_node", lambda n, *a, **k: _view(n.node_id, images[n.node_id])
    )
    ok, why = launcher.cluster_ready(_state())
    assert not ok
    assert why == "__consumer_offsets not in the image of nodes [1] yet"

    images[1] = True
    assert launcher.cluster_ready(_state()) == (True, "ready")
