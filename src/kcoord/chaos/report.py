"""A run's timeline as one self-contained HTML page (inline SVG, no scripts, no downloads).

One row per process, time left to right: faults as bars on the nemesis row (kill red, pause
orange, partition purple, clients grey), heals as green ticks; for each client, acknowledged
operations as small blue ticks, failed or unknown ones as red ticks, and rebalance events
(assignment changes, revocations, losses) as black diamonds. Hovering over a mark shows its
event.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from kcoord.chaos.history import Event, History

ROW_H = 22
LEFT = 170
WIDTH = 1400
FAULT_COLOURS = {
    "kill": "#d62728",
    "pause": "#ff7f0e",
    "partition": "#9467bd",
    "clients": "#7f7f7f",
    "latency": "#8c564b",
    "reset": "#e377c2",
}
REBALANCE = frozenset({"assignment", "assigned", "revoked", "lost"})


def write_timeline(history: History, path: Path, *, title: str = "") -> None:
    path.write_text(render_timeline(list(history), title=title))


def render_timeline(events: list[Event], *, title: str = "") -> str:
    end = max((e.time for e in events), default=1.0) or 1.0
    processes = ["nemesis", *sorted({e.process for e in events} - {"nemesis"})]
    row = {p: i for i, p in enumerate(processes)}
    scale = (WIDTH - LEFT - 20) / end

    def x(t: float) -> float:
        return LEFT + t * scale

    marks: list[str] = []
    for p in processes:
        y = row[p] * ROW_H + 30
        marks.append(f'<text x="4" y="{y + 14}" font-size="12">{html.escape(p)}</text>')
        marks.append(
            f'<line x1="{LEFT}" y1="{y + ROW_H - 2}" x2="{WIDTH - 20}" y2="{y + ROW_H - 2}" '
            'stroke="#eee"/>'
        )
    open_faults: dict[str, Event] = {}
    invoked: dict[str, Event] = {}  # fault name -> its start's invoke, not yet in force
    for e in events:
        y = row[e.process] * ROW_H + 30
        tip = html.escape(f"{e.time:.2f}s {e.type} {e.f} {json.dumps(e.value)[:300]}")
        if e.process == "nemesis":
            key = json.dumps([e.value.get("fault"), e.value.get("targets")])
            if e.type == "invoke":
                if e.f == "start":
                    invoked[str(e.value.get("fault"))] = e
                continue
            if e.f == "start":
                # The window opens when the fault was invoked: it may be in force from then on.
                start = invoked.pop(str(e.value.get("fault")), e)
                if not e.value.get("skipped"):
                    open_faults[key] = start
            elif e.f == "stop" and key in open_faults:
                start = open_faults.pop(key)
                colour = FAULT_COLOURS.get(str(e.value.get("fault")), "#333")
                marks.append(
                    f'<rect x="{x(start.time):.1f}" y="{y + 3}" '
                    f'width="{max(1.0, (e.time - start.time) * scale):.1f}" height="{ROW_H - 8}" '
                    f'fill="{colour}" opacity="0.7"><title>{tip}</title></rect>'
                )
            elif e.f == "heal":
                marks.append(
                    f'<line x1="{x(e.time):.1f}" y1="{y}" x2="{x(e.time):.1f}" y2="{y + ROW_H}" '
                    f'stroke="#2ca02c"><title>{tip}</title></line>'
                )
            continue
        if e.f in REBALANCE:
            cx, cy = x(e.time), y + ROW_H / 2
            marks.append(
                f'<path d="M{cx:.1f} {cy - 5} l5 5 l-5 5 l-5 -5 z" fill="black">'
                f"<title>{tip}</title></path>"
            )
        elif e.type in ("ok", "fail", "info") and e.f not in ("process-start", "process-kill"):
            colour = "#1f77b4" if e.type == "ok" else "#d62728"
            marks.append(
                f'<line x1="{x(e.time):.1f}" y1="{y + 6}" x2="{x(e.time):.1f}" '
                f'y2="{y + ROW_H - 6}" stroke="{colour}" opacity="0.5"><title>{tip}</title></line>'
            )
    height = len(processes) * ROW_H + 60
    axis = "".join(
        f'<text x="{x(t):.1f}" y="20" font-size="11">{t:.0f}s</text>'
        for t in range(0, int(end) + 1, max(1, int(end) // 20 or 1))
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>kcoord chaos {html.escape(title)}</title></head><body>"
        f"<h3>kcoord chaos {html.escape(title)}</h3>"
        f'<svg width="{WIDTH}" height="{height}" font-family="sans-serif">{axis}'
        + "".join(marks)
        + "</svg></body></html>"
    )
