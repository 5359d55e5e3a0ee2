"""The command line: config errors exit 2 with one message naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kcoord.node.configs_tool import parse_add_config
from kcoord.node.tool_client import ToolError


def _kcoord(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcoord.node.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


def test_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        '"node.id" = 1\n"controller.quorum.voters" = "1@127.0.0.1:9094"\n'
        f'"data.dir" = "{tmp_path}"\n"broker.session.timeout.ms" = "soon"\n'
    )
    result = _kcoord("node", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.startswith("kcoord: invalid config: broker.session.timeout.ms")
    assert result.stderr.count("\n") == 1


def test_missing_required_key_and_unreadable_file(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('"node.id" = 1\n')
    result = _kcoord("node", "--config", str(config), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "controller.quorum.voters" in result.stderr
    result = _kcoord("node", "--config", str(tmp_path / "absent.toml"))
    assert result.returncode == 2
    assert "absent.toml" in result.stderr


def test_cluster_commands_without_a_cluster_fail_clearly(tmp_path: Path) -> None:
    result = _kcoord("cluster", "status", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert "no cluster state" in result.stderr


def test_add_config_takes_kafkas_syntax() -> None:
    assert parse_add_config("a=1, cleanup.policy=[compact,delete] ,b=") == [
        ("a", "1"),
        ("cleanup.policy", "compact,delete"),
        ("b", ""),
    ]
    for bad in ("a", "=1", "a=1,,b=2"):
        with pytest.raises(ToolError, match="key=val"):
            parse_add_config(bad)
