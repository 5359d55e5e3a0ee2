"""Running a benchmark script in a subprocess for its smoke test, and finding leftover processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 30.0


def run_bench(script: str, args: list[str], run_timeout_s: float) -> tuple[int, str]:
    """Run ``bench/<script>``; on a timeout, SIGTERM it (benchmarks stop what they started)."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / script), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=run_timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"bench/{script} did not finish in {run_timeout_s:.0f} s:\n{output}")
    return proc.returncode, output


def run_bench_in(directory: Path, script: str, args: list[str], run_timeout_s: float) -> str:
    """``run_bench`` of a benchmark whose nodes run under ``directory``: it must succeed and
    leave no node process running; any it leaves is SIGKILLed, failed run or not."""
    output = ""
    try:
        code, output = run_bench(script, args, run_timeout_s)
        assert code == 0, output
    finally:
        leftovers = kill_matching("kcoord.node.cli", str(directory.resolve()))
    assert leftovers == [], f"node processes outlived the bench:\n{output}"
    return output


def processes_matching(*needles: str) -> list[tuple[int, str]]:
    """Running (not zombie) processes whose command line contains every needle."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(") ", 1)[-1]
        except OSError:
            continue  # exited meanwhile
        if not state.startswith("Z") and all(n in cmdline for n in needles):
            found.append((int(proc.name), cmdline))
    return found


def kill_matching(*needles: str) -> list[tuple[int, str]]:
    """SIGKILL the processes ``processes_matching(*needles)`` finds, and say which: called in a
    ``finally``, a failed or timed-out run leaves nothing running either."""
    found = processes_matching(*needles)
    for pid, _ in found:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, signal.SIGKILL)
    return found
