"""A flow drawn as layers (pure: no I/O): each run in the layer one past the deepest run it
waits on, runs as boxes left to right, edges as lines from a dependency down to the run
waiting on it. A layer of more than MAX_BOXES runs is one box that counts them by state, so
a 10,000-run chord draws as two boxes and a line; at most MAX_LINES lines are drawn (their
count is said when more are left out)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from jobqueue.ops.flow_queries import FlowEdge, FlowRun

MAX_BOXES = 12  # runs drawn one by one in a layer; past it the layer is one box
MAX_LINES = 400
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 150, 36, 16, 48, 8


@dataclass(frozen=True)
class Box:
    x: int
    y: int
    label: str  # a run id, or 'N runs'
    detail: str  # the run's state, or the counts by state
    state: str  # the class: a run state, or the layer's most common one
    run_id: str | None  # for a link to the run page (None for a layer box)
    queue: str | None


@dataclass(frozen=True)
class Line:
    x1: int
    y1: int
    x2: int
    y2: int
    policy: str


@dataclass(frozen=True)
class Drawing:
    width: int
    height: int
    boxes: list[Box]
    lines: list[Line]
    lines_left_out: int


def layers(runs: Sequence[FlowRun], edges: Sequence[FlowEdge]) -> list[list[FlowRun]]:
    """The runs by depth (0: waits on no run of the flow), each layer in the runs' order. A
    cycle (foreign data: jobqueue creates none) puts its runs in the last layer."""
    known = {r.run_id for r in runs}
    waits: dict[str, set[str]] = {r.run_id: set() for r in runs}
    for e in edges:
        if e.waiting in known and e.dependency in known:
            waits[e.waiting].add(e.dependency)
    # Kahn's order: a run is placed once every run it waits on is; what a cycle holds is
    # never ready, and goes below the rest.
    depth: dict[str, int] = {}
    left = {rid: len(deps) for rid, deps in waits.items()}
    waited_by: dict[str, list[str]] = {}
    for rid, deps in waits.items():
        for d in deps:
            waited_by.setdefault(d, []).append(rid)
    ready = [rid for rid, n in left.items() if n == 0]
    while ready:
        rid = ready.pop()
        depth[rid] = 1 + max((depth[d] for d in waits[rid]), default=-1)
        for w in waited_by.get(rid, []):
            left[w] -= 1
            if left[w] == 0:
                ready.append(w)
    deepest = max(depth.values(), default=-1) + 1
    for rid in known - depth.keys():
        depth[rid] = deepest
    out: list[list[FlowRun]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for r in runs:
        out[depth[r.run_id]].append(r)
    return out


def draw(runs: Sequence[FlowRun], edges: Sequence[FlowEdge]) -> Drawing:
    placed: dict[str, tuple[int, int]] = {}  # run id -> the centre of its box's top edge
    boxes: list[Box] = []
    widest = 1
    for level, layer in enumerate(layers(runs, edges)):
        y = MARGIN + level * (BOX_H + GAP_Y)
        if len(layer) > MAX_BOXES:
            counts = Counter(r.state for r in layer)
            detail = ", ".join(f"{n} {s}" for s, n in counts.most_common())
            boxes.append(Box(MARGIN, y, f"{len(layer)} runs", detail,
                             counts.most_common(1)[0][0], None, None))
            for r in layer:
                placed[r.run_id] = (MARGIN + BOX_W // 2, y)
            continue
        widest = max(widest, len(layer))
        for i, r in enumerate(layer):
            x = MARGIN + i * (BOX_W + GAP_X)
            boxes.append(Box(x, y, r.run_id, r.state, r.state, r.run_id, r.queue))
            placed[r.run_id] = (x + BOX_W // 2, y)
    lines: dict[tuple[int, int, int, int], str] = {}
    for e in edges:
        if e.dependency in placed and e.waiting in placed:
            (x1, y1), (x2, y2) = placed[e.dependency], placed[e.waiting]
            lines.setdefault((x1, y1 + BOX_H, x2, y2), e.policy)  # one line per pair of boxes
    drawn = [Line(*xy, policy) for xy, policy in list(lines.items())[:MAX_LINES]]
    depth = max((b.y for b in boxes), default=0) + BOX_H + MARGIN
    width = MARGIN * 2 + widest * BOX_W + (widest - 1) * GAP_X
    return Drawing(width, depth, boxes, drawn, max(len(lines) - MAX_LINES, 0))
