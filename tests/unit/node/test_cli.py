"""The command line: config errors exit 2 with one message naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kcoord.node.cli import build_parser
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
    # A key given twice takes its last value, as Kafka's Properties do.
    assert parse_add_config("a=1,b=2,a=3") == [("a", "3"), ("b", "2")]
    for bad in ("a", "=1", "a=1,,b=2", "a=b=c"):
        with pytest.raises(ToolError, match="key=val"):
            parse_add_config(bad)


_ALTER_T = ["configs", "alter", "--entity-type", "topics", "--entity-name", "t"]
_RESET_G = ["groups", "reset-offsets", "--group", "g", "--all-topics"]


@pytest.mark.parametrize(
    "argv",
    [
        ["groups", "delete-offsets", "--group", "a", "--group", "b", "--topic", "t"],
        [*_ALTER_T, "--entity-name", "u", "--add-config", "a=1"],
        [*_ALTER_T, "--add-config", "a=1", "--add-config", "b=2"],
        ["topics", "create", "--topic", "a", "--topic", "b"],
        ["topics", "alter", "--topic", "a", "--partitions", "2", "--partitions", "3"],
        [*_RESET_G, "--to-offset", "1", "--to-offset", "2"],
        ["topics", "list", "--bootstrap-server", "h:1", "--bootstrap-server", "h:2"],
    ],
)
def test_an_option_of_one_value_given_twice_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Kafka's tools read these options with joptsimple's ``valueOf``, which fails on a second
    value. argparse kept the last one: ``delete-offsets --group a --group b`` deleted b's
    offsets and said nothing of a."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "was given more than once" in capsys.readouterr().err


def test_delete_config_may_be_repeated() -> None:
    """Kafka's ``--delete-config`` is ``valuesOf`` (comma-separated too): every key given is
    deleted; argparse kept the last --delete-config only."""
    args = build_parser().parse_args(
        [*_ALTER_T, "--delete-config", "x,y", "--delete-config", "z", "--timeout-ms", "5"]
    )
    assert args.delete_config == ["x,y", "z"] and args.timeout_ms == 5
