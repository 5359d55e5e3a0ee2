"""``kcoord.cli.main``, the console script: output into a pipe whose reader went away."""

from __future__ import annotations

import os
import sys

import pytest

from kcoord import cli as kcoord_cli


def test_output_into_a_closed_pipe_stops_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kcoord topics describe | head``: output still buffered when the reader has gone
    failed at the interpreter's exit, a traceback ("Exception ignored ... BrokenPipeError"),
    whatever the command (dump-log alone handled it). It stops quietly with status 1, stdout
    sent to /dev/null so that exit's flush cannot fail again."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)

        def describe(args: list[str]) -> int:
            print("Topic: payments\tTopicId: ...")
            return 0

        monkeypatch.setattr(kcoord_cli, "_dispatch", describe)
        assert kcoord_cli.main(["topics", "describe"]) == 1
        print("more", flush=True)  # into /dev/null now


def test_a_broken_pipe_that_is_not_stdout_s_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a closed stdout is taken quietly: a socket's EPIPE still surfaces."""

    def broken(args: list[str]) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(kcoord_cli, "_dispatch", broken)
    with pytest.raises(BrokenPipeError):
        kcoord_cli.main(["topics", "list"])
