"""``Plan.draw(path)``: a picture of a plan (PNG or SVG, by matplotlib).

The plan's values form a DAG, laid out left to right in topological layers (each node
just before its first use; outputs at their longest-path depth).  Long
plans wrap into several bands of layers, top to bottom; an edge into a later band is
drawn as a dashed stub "to <value>" out of its source and a dashed arrow "from <value>"
into its target.  Boxes: fed inputs (green), local ops (blue; free views pale), collectives
(orange, bold border: kind, team and bytes received per rank), local slices (yellow,
dashed: no communication), repeated layers (grey, dotted: a run of layers whose steps are
an earlier layer's, ``plan_view.repeated_layers``, drawn as one box unless ``full=True``);
outputs have a double border; a training plan's saved activations say "saved <bytes>" and ops
recomputed in the backward pass "recomputed".  A plan of more than ``MAX_BOXES`` boxes so is drawn
one box per *part* instead (``part_boxes``: a layer or a module of each pass, as ``summary``
tells them; consecutive layers repeating another's steps one box), unless ``full=True`` (every
step, no layer folded).  A PNG is at most ``MAX_PX`` pixels a side (its resolution drops to fit).
The title gives the modeled cost, communication bytes and, for a training plan, the saved
activations' bytes.

A training plan is drawn as two shaded clusters, the forward pass above the backward pass
(``plan_view.node_passes``), each laid out on its own and headed by its totals (steps,
collectives, bytes, modeled time: ``plan_view.pass_totals``); the saved activations sit in the
forward cluster, their edges into the backward one drawn as "to" / "from" tags.  A plan
without a backward pass is drawn as one DAG, with no cluster.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
import pathlib
from dataclasses import dataclass, field

from .extract.plan_node import PlanNode, Tag
from .ir.errors import ReshardError
from .ir.ops import op_kind
from .plan_view import (Layers, PassTotal, PlanView, fmt_bytes, fmt_time, layer_count, layer_runs, layer_span,
                      node_moved, node_passes, nodes_cost_s, op_label, pass_totals, recomputed, repeated_layers)
from .summary import clip, collective_kinds, parts, run_name, runs


FORMATS = {".png": "png", ".svg": "svg"}
FONT = 7.0                 # points
CHAR_W = 0.062             # inches per character at FONT (DejaVu Sans, generous)
LINE_H = 0.135             # inches per text line
BOX_H = 0.62               # three lines + padding
GAP_X, GAP_Y = 0.75, 0.36  # between boxes
CHANNEL = 0.12             # height of the first lane of long edges above a band
BAND_GAP = 0.75            # between bands (room for the lanes of long edges)
MARGIN = 0.85              # left/right margins (room for band connectors)
MAX_LAYERS_PER_BAND = 10
MAX_LABEL = 38             # characters per label line (a longer one is cut in its middle)
MAX_BOXES = 80             # more boxes (repeated layers folded): a box per part
MAX_PX, DPI = 4000, 150    # the largest side of a PNG in pixels, and its resolution when that fits
HEADER_H = 1.2             # title + legend
PASS_H = 0.3               # a pass cluster's heading above its first band
PASS_FACE = {"forward": "#f3f7fb", "backward": "#fbf3ec"}
STYLE = {  # kind -> (face, edge, linewidth, linestyle)
    "input": ("#d9f2d9", "#3c8d3c", 1.0, "-"),
    "local": ("#dbe8f7", "#3b6ea5", 1.0, "-"),
    "view": ("#f1f5fa", "#8aa5c2", 0.8, "-"),
    "collective": ("#ffd8a8", "#d9480f", 2.2, "-"),
    "slice": ("#fff3bf", "#b08900", 1.2, "--"),
    "repeat": ("#eeeeee", "#777777", 1.2, ":"),
    "part": ("#dbe8f7", "#3b6ea5", 1.0, "-"),
    "part_comm": ("#ffd8a8", "#d9480f", 2.2, "-"),
}
LEGEND = [("input", "fed input"), ("local", "local op"), ("view", "view (free)"),
          ("collective", "collective (kind, team, bytes received per rank)"),
          ("slice", "local slice / partial (no comm)"),
          ("repeat", "repeated layers (each repeats the steps of the layer named)"),
          ("part", "a layer or module's steps, no collective"),
          ("part_comm", "a layer or module's steps, with collectives")]


def _short(s: str, n: int = MAX_LABEL) -> str:
    return clip(s, n)


def _placements(n: PlanNode) -> str:
    ts = n.sharding
    return " ".join(ts.describe_axis(a) for a in range(len(ts.axes)))


def _category(plan: PlanView, n: PlanNode) -> str:
    h = n.head
    if h.tag is Tag.INPUT:
        return "input"
    if h.communicates:
        return "collective"
    if h.tag is Tag.LOCAL:
        return "slice"
    # (a saved op is a view too: its cost law is a keep's, ``rules.remat``)
    return "view" if op_kind(plan.fusion.ops[h.op].kind).cost in ("view", "kept") else "local"


def _labels(plan: PlanView, n: PlanNode, saved: bool = False) -> list[str]:
    """Three lines: what, sharding, detail (``saved``: the node's buffer is a saved activation,
    kept for the backward pass; an op recomputed there from saved operands says so)."""
    lines = _node_labels(plan, n)
    if saved:
        lines[2] += f", saved {fmt_bytes(math.prod(n.sharding.local_shape) * plan.fusion.tensors[n.value].itemsize)}"
    if recomputed(plan, n):
        lines[2] = f"recomputed, {lines[2]}"
    return lines


def _node_labels(plan: PlanView, n: PlanNode) -> list[str]:
    name = plan.fusion.tensors[n.value].name
    mesh, h = n.sharding.mesh, n.head
    if h.tag is Tag.INPUT:
        return [f"input {name}", _placements(n), f"local {'x'.join(map(str, n.sharding.local_shape))}"]
    if h.tag is Tag.APPLY:
        return [f"{name} = {op_label(plan.fusion, h.op)}", _placements(n), fmt_time(n.cost_ps * 1e-12)]
    src_ts = n.args[0].sharding
    team = (f"{src_ts.mesh.size}->{mesh.size} ranks" if h.tag is Tag.TRANSFER
            else f"{mesh.axis_names[h.axis]} x{mesh.shape[h.axis]}")
    src = " ".join(src_ts.describe_axis(a) for a in range(len(src_ts.axes)))
    detail = (f"{team}, {fmt_bytes(node_moved(plan, n))}, {fmt_time(n.cost_ps * 1e-12)}" if h.communicates
              else f"{team}, no comm")
    return [f"{h.label} {name}", f"{src} \u2192 {_placements(n)}", detail]


@dataclass(eq=False)
class _Box:
    """One box of the picture: a plan node, or a run of repeated layers drawn as one."""

    uid: int
    args: list["_Box"]
    category: str
    labels: list[str]
    name: str                   # what the edge tags "to <name>" / "from <name>" say
    output: bool = False        # double border
    first: int = 0              # program position (of its first step)
    members: list[PlanNode] = field(default_factory=list)


def _buffers(plan: PlanView) -> dict[int, str]:
    """uid -> the buffer a plan node's value lives in (a redistribute view reuses its operand's)."""
    buf_of: dict[int, str] = {}
    for n in plan.lowered.nodes:
        h = n.head
        if h.tag is Tag.APPLY and plan.fusion.ops[h.op].kind == "redistribute":
            buf_of[n.uid] = buf_of[n.args[0].uid]
        elif h.tag is Tag.INPUT:
            buf_of[n.uid] = f"{h.input_name}@{n.uid}"
        else:
            buf_of[n.uid] = f"b{n.uid}"
    return buf_of


def _run_labels(plan: PlanView, members: list[PlanNode], names: list[str], ref: str) -> list[str]:
    comms = [n for n in members if n.head.communicates]
    moved = sum(node_moved(plan, n) for n in comms)
    return [layer_span(names), f"{layer_count(names)}, {'each repeats' if len(names) > 1 else 'repeats'} {ref}",
            f"{len(members)} steps, {len(comms)} collectives, {fmt_bytes(moved)}"]


def _topological(boxes: list[_Box]) -> list[_Box] | None:
    """``boxes`` in a topological order, each as early in the program as its operands allow;
    None when merging repeated layers into boxes made a cycle."""
    users: dict[int, list[_Box]] = defaultdict(list)
    waiting = {b.uid: len(b.args) for b in boxes}
    for b in boxes:
        for a in b.args:
            users[a.uid].append(b)
    ready = [(b.first, b.uid, b) for b in boxes if not b.args]
    heapq.heapify(ready)
    out = []
    while ready:
        _, _, b = heapq.heappop(ready)
        out.append(b)
        for u in users[b.uid]:
            waiting[u.uid] -= 1
            if waiting[u.uid] == 0:
                heapq.heappush(ready, (u.first, u.uid, u))
    return out if len(out) == len(boxes) else None


def _marks(plan: PlanView) -> tuple[set[int], set[int]]:
    """The uids of the nodes whose buffer is an output, and of those whose buffer is a saved
    activation (the last node on each such buffer)."""
    buf_of = _buffers(plan)
    last_on: dict[str, int] = {}
    for n in plan.lowered.nodes:
        last_on[buf_of[n.uid]] = n.uid
    outputs = {r for r, _ in plan.lowered.outputs}
    return {u for b, u in last_on.items() if b in outputs}, {last_on[b] for b in plan.lowered.program.saved_buffers}


def boxes(plan: PlanView, summarize: bool = True) -> list[_Box]:
    """The boxes to draw, in a topological order: one per plan node; with ``summarize``, each
    run of repeated layers (``plan_view.repeated_layers``) is one box, unless that would make a
    cycle (then every node is drawn)."""
    nodes = plan.lowered.nodes
    pos = {n.uid: i for i, n in enumerate(nodes)}
    out_uids, saved = _marks(plan)
    lay = repeated_layers(plan) if summarize else Layers()
    runs = layer_runs(plan, lay)
    run_of = {layer: k for k, (_, members, _) in enumerate(runs) for layer in members}
    box_of: dict[int, _Box] = {}
    run_box: dict[int, _Box] = {}
    out: list[_Box] = []
    for n in nodes:
        layer = lay.of.get(n.uid)
        if layer in lay.same:
            k = run_of[layer]
            b = run_box.get(k)
            if b is None:  # uid -1 - k: no plan node's
                b = run_box[k] = _Box(-1 - k, [], "repeat", [], f"{runs[k][1][0]} ..", first=pos[n.uid])
                out.append(b)
            b.members.append(n)
            b.output |= n.uid in out_uids
            for a in n.args:
                ab = box_of[a.uid]
                if ab is not b and ab not in b.args:
                    b.args.append(ab)
        else:
            b = _Box(n.uid, list(dict.fromkeys(box_of[a.uid] for a in n.args)), _category(plan, n),
                     _labels(plan, n, n.uid in saved), plan.fusion.tensors[n.value].name, n.uid in out_uids,
                     pos[n.uid], [n])
            out.append(b)
        box_of[n.uid] = b
    for k, b in run_box.items():
        b.labels = _run_labels(plan, b.members, runs[k][1], runs[k][2])
    order = _topological(out)
    return order if order is not None else boxes(plan, summarize=False)


def part_boxes(plan: PlanView) -> list[_Box]:
    """One box per run of parts of each pass (``summary.parts``, ``summary.runs``), in a
    topological order; an edge from box A to box B when a step of B reads one of A and A's
    run comes first (the passes in order, each's runs in ``parts``' order; an edge to an
    earlier run is left out, so that the picture is a DAG)."""
    pos = {n.uid: i for i, n in enumerate(plan.lowered.nodes)}
    out_uids, _ = _marks(plan)
    out: list[_Box] = []
    box_of: dict[int, _Box] = {}
    for ps in parts(plan).values():
        for run in runs(ps):
            members = [n for p in run for n in p.nodes]
            kinds, moved = collective_kinds(members), sum(node_moved(plan, n) for n in members)
            names = [p.name for p in run]
            last = (f"{layer_count(names)}, {'each repeats' if len(run) > 1 else 'repeats'} {run[0].ref}" if run[0].ref
                    else f"{fmt_bytes(moved)} received, {fmt_time(nodes_cost_s(members))}" if moved
                    else f"modeled {fmt_time(nodes_cost_s(members))}")
            half = MAX_LABEL // 2 - 2
            span = names[0] if len(run) == 1 else f"{clip(names[0], half)} .. {clip(names[-1], half)}"
            b = _Box(-1 - len(out), [], "repeat" if run[0].ref else "part_comm" if kinds else "part",
                     [span, f"{len(members)} steps, {kinds or 'no collective'}", last],
                     run_name(run, 14), any(n.uid in out_uids for n in members), min(pos[n.uid] for n in members),
                     members)
            out.append(b)
            box_of.update((n.uid, b) for n in members)
    rank = {b.uid: i for i, b in enumerate(out)}
    for b in out:
        b.args = list(dict.fromkeys(box_of[a.uid] for n in b.members for a in n.args
                                    if rank[box_of[a.uid].uid] < rank[b.uid]))
    order = _topological(out)
    assert order is not None  # edges go from earlier runs to later ones
    return order


def layers(nodes: "list[_Box]") -> dict[int, int]:
    """uid -> layer: the longest path from an input decides the depth; every node that
    feeds others then sits just before its first use (weights and their collectives
    next to the op that needs them).  Edges from boxes not in ``nodes`` are not followed."""
    layer: dict[int, int] = {}
    for n in nodes:  # topological order
        layer[n.uid] = 1 + max((layer[a.uid] for a in n.args if a.uid in layer), default=-1)
    users: dict[int, list[int]] = defaultdict(list)
    for n in nodes:
        for a in n.args:
            if a.uid in layer:
                users[a.uid].append(n.uid)
    for n in reversed(nodes):  # then as late as possible: side branches sit by their use
        if users[n.uid]:
            layer[n.uid] = min(layer[u] for u in users[n.uid]) - 1
    low = min(layer.values(), default=0)
    return {k: v - low for k, v in layer.items()}


@dataclass(frozen=True)
class Band:
    """A band of the picture: consecutive layers drawn in one row, left to right, and the
    pass (cluster) it belongs to (None in a plan without a backward pass)."""

    layers: range
    phase: str | None


def box_passes(plan: PlanView, nodes: "list[_Box]") -> dict[int, str] | None:
    """uid -> the pass of a box (its first step's: ``plan_view.node_passes``); None for a plan
    without a backward pass."""
    passes = node_passes(plan)
    return None if passes is None else {b.uid: passes[b.first] for b in nodes}


def band_layout(nodes: "list[_Box]", phase: dict[int, str] | None) -> tuple[dict[int, int], list[Band]]:
    """uid -> layer, and the bands: each pass (the whole plan when ``phase`` is None) is laid
    out on its own (``layers``, edges from the other pass not followed), the backward pass's
    layers after the forward pass's, and wrapped into bands of at most
    ``MAX_LAYERS_PER_BAND`` layers of near-equal length."""
    groups = [(None, nodes)] if phase is None else [(p, [b for b in nodes if phase[b.uid] == p])
                                                    for p in ("forward", "backward")]
    layer: dict[int, int] = {}
    bands: list[Band] = []
    start = 0
    for p, group in groups:
        mine = layers(group)
        n_layers = max(mine.values(), default=0) + 1
        layer.update({u: start + L for u, L in mine.items()})
        n_bands = math.ceil(n_layers / MAX_LAYERS_PER_BAND)
        per_band = math.ceil(n_layers / n_bands)
        bands += [Band(range(start + k, start + min(n_layers, k + per_band)), p) for k in range(0, n_layers, per_band)]
        start += n_layers
    return layer, bands


def _pass_heading(t: PassTotal) -> str:
    return (f"{t.name} pass: {t.steps} steps, {t.collectives} collectives, {fmt_bytes(t.bytes)} received per rank, "
            f"modeled {fmt_time(t.cost_s)}")


def _order(nodes: "list[_Box]", layer: dict[int, int]) -> "dict[int, list[_Box]]":
    """Nodes per layer, ordered by barycenter sweeps to reduce crossings."""
    per: dict[int, list[_Box]] = defaultdict(list)
    for n in nodes:
        per[layer[n.uid]].append(n)
    users: dict[int, list[_Box]] = defaultdict(list)
    for n in nodes:
        for a in n.args:
            users[a.uid].append(n)
    pos = {n.uid: i for lst in per.values() for i, n in enumerate(lst)}
    n_layers = max(per, default=-1) + 1
    for sweep in range(4):
        down = sweep % 2 == 0
        for L in (range(1, n_layers) if down else range(n_layers - 2, -1, -1)):
            def bary(n: _Box) -> float:
                nb = n.args if down else users[n.uid]
                nb = [m for m in nb if layer[m.uid] != L]
                return sum(pos[m.uid] for m in nb) / len(nb) if nb else pos[n.uid]
            per[L].sort(key=lambda n: (bary(n), pos[n.uid]))
            for i, n in enumerate(per[L]):
                pos[n.uid] = i
    return per


def check_path(path: "str | pathlib.Path") -> tuple[pathlib.Path, str]:
    """``path`` as a Path and its format ("png"/"svg"); ReshardError for another extension
    or a missing directory."""
    if not isinstance(path, (str, pathlib.Path)) or not str(path):
        raise ReshardError(f"Plan.draw: expected a file path ending in .png or .svg, got {path!r}")
    p = pathlib.Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ReshardError(f"Plan.draw: cannot draw to {str(path)!r}: the file name must end in .png or .svg")
    if not p.parent.is_dir():
        raise ReshardError(f"Plan.draw: cannot write {str(path)!r}: no such directory {str(p.parent)!r}")
    return p, fmt


def draw_boxes(plan: PlanView, full: bool | None = None) -> tuple[list[_Box], bool]:
    """The boxes of the picture and whether they are parts: ``full=True``, a box per plan
    node; None, a run of repeated layers is one box (``boxes``), or, more than ``MAX_BOXES``
    so, a box per part (``part_boxes``); ``full=False``, a box per part."""
    if full:
        return boxes(plan, summarize=False), False
    nodes = boxes(plan) if full is None else []
    return (nodes, False) if nodes and len(nodes) <= MAX_BOXES else (part_boxes(plan), True)


def draw_plan(plan: PlanView, path: "str | pathlib.Path", *, full: bool | None = None) -> pathlib.Path:
    """Write the picture of ``plan`` to ``path`` (.png or .svg) and return the path (``full``:
    which boxes, see ``draw_boxes``; a PNG at most ``MAX_PX`` pixels a side)."""
    p, fmt = check_path(path)
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.path import Path
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    nodes, by_part = draw_boxes(plan, full)
    layer, bands = band_layout(nodes, box_passes(plan, nodes))
    per = _order(nodes, layer)
    labels = {n.uid: [_short(s) for s in n.labels] for n in nodes}
    box_w = max([len(s) for ls in labels.values() for s in ls] + [14]) * CHAR_W + 0.2
    n_bands = len(bands)
    per_band = max(len(b.layers) for b in bands)
    band_rows = [max(len(per[L]) for L in b.layers) for b in bands]
    band_h = [r * (BOX_H + GAP_Y) for r in band_rows]
    headed = [b > 0 and bands[b - 1].phase != bands[b].phase or b == 0 and bands[b].phase is not None
              for b in range(n_bands)]  # the first band of a pass cluster
    width = 2 * MARGIN + per_band * box_w + (per_band - 1) * GAP_X
    height = HEADER_H + sum(band_h) + BAND_GAP * (n_bands - 1) + 0.3 + PASS_H * sum(headed)
    # legend and title need some width too
    width = max(width, 9.0)

    # node centers (inches, y up)
    center: dict[int, tuple[float, float]] = {}
    band_of: dict[int, int] = {}
    top = height - HEADER_H
    band_y: list[tuple[float, float]] = []  # (top, bottom) of each band
    for b in range(n_bands):
        top -= PASS_H * headed[b]
        band_y.append((top, top - band_h[b]))
        for L in bands[b].layers:
            col = L - bands[b].layers.start
            x = MARGIN + col * (box_w + GAP_X) + box_w / 2
            k = len(per[L])
            y0 = top - (band_h[b] - k * (BOX_H + GAP_Y)) / 2  # center the layer in its band
            for i, n in enumerate(per[L]):
                center[n.uid] = (x, y0 - i * (BOX_H + GAP_Y) - BOX_H / 2 - GAP_Y / 2)
                band_of[n.uid] = b
        top -= band_h[b] + BAND_GAP

    band_top = [max(center[u][1] for u in center if band_of[u] == b) + BOX_H / 2 for b in range(n_bands)]
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    totals = {t.name: t for t in pass_totals(plan)}
    for b in range(n_bands):
        if not headed[b]:
            continue
        last = next((k for k in range(b + 1, n_bands) if headed[k]), n_bands) - 1
        y_top, y_bottom = band_y[b][0] + PASS_H + 0.05, band_y[last][1] - 0.12
        face = PASS_FACE[bands[b].phase]
        ax.add_patch(FancyBboxPatch((0.08, y_bottom), width - 0.16, y_top - y_bottom,
                                    boxstyle="round,pad=0,rounding_size=0.1", fc=face, ec="#bbbbbb", lw=0.8,
                                    zorder=0))
        ax.text(0.22, y_top - 0.16, _pass_heading(totals[bands[b].phase]), ha="left", va="center",
                fontsize=FONT + 1.5, fontweight="bold", color="#444444", zorder=4)
    for n in nodes:
        x, y = center[n.uid]
        face, edge, lw, ls = STYLE[n.category]
        if n.output:
            ax.add_patch(FancyBboxPatch((x - box_w / 2 - 0.05, y - BOX_H / 2 - 0.05), box_w + 0.1, BOX_H + 0.1,
                                        boxstyle="round,pad=0,rounding_size=0.08", fc="none", ec="#222222",
                                        lw=1.0, zorder=2))
        ax.add_patch(FancyBboxPatch((x - box_w / 2, y - BOX_H / 2), box_w, BOX_H,
                                    boxstyle="round,pad=0,rounding_size=0.06", fc=face, ec=edge, lw=lw, ls=ls,
                                    zorder=3))
        lines = labels[n.uid]
        for i, s in enumerate(lines):
            ax.text(x, y + (1 - i) * LINE_H * 1.15, s, ha="center", va="center", fontsize=FONT,
                    fontweight="bold" if i == 0 else "normal", family="DejaVu Sans", zorder=4,
                    color="#7a2e00" if n.category == "collective" and i == 2 else "#111111")

    arrow = dict(arrowstyle="-|>", mutation_scale=8, lw=0.8, color="#555555", zorder=1, shrinkA=0, shrinkB=1)
    incoming_tags: dict[int, int] = defaultdict(int)
    outgoing_tags: dict[int, int] = defaultdict(int)
    lanes: dict[int, int] = defaultdict(int)
    for n in nodes:
        for a in n.args:
            (x0, y0), (x1, y1) = center[a.uid], center[n.uid]
            start, end = (x0 + box_w / 2, y0), (x1 - box_w / 2, y1)
            if band_of[a.uid] == band_of[n.uid]:
                if layer[n.uid] - layer[a.uid] <= 1:
                    ax.add_patch(FancyArrowPatch(start, end, **arrow))
                    continue
                # a long edge: up the gap after its source, along a lane above its band's
                # boxes, down the gap before its target (it crosses no box)
                b = band_of[n.uid]
                lane = lanes[b]
                lanes[b] += 1
                gx0 = start[0] + GAP_X * (0.25 + 0.1 * (lane % 4))
                gx1 = end[0] - GAP_X * (0.25 + 0.1 * (lane % 4))
                ty = band_top[b] + CHANNEL + 0.06 * (lane % 3)
                route = Path([start, (gx0, y0), (gx0, ty), (gx1, ty), (gx1, y1), end])
                ax.add_patch(FancyArrowPatch(path=route, **{**arrow, "color": "#4a6fa5"}))
                continue
            # into a later band: a stub "to <value>" out of the source, a tagged arrow
            # "from <value>" into the target (both in the gaps next to the boxes)
            dashed = {**arrow, "color": "#888888", "linestyle": "--"}
            k_out = outgoing_tags[a.uid]
            outgoing_tags[a.uid] += 1
            sy = y0 - BOX_H * 0.28 - 0.14 * k_out
            ax.add_patch(FancyArrowPatch((start[0], sy), (start[0] + GAP_X * 0.8, sy), **dashed))
            ax.text(start[0] + 0.04, sy + 0.025, _short(f"to {n.name}", 14), fontsize=FONT - 1,
                    color="#555555", ha="left", va="bottom", style="italic")
            k = incoming_tags[n.uid]
            incoming_tags[n.uid] += 1
            ty = y1 + BOX_H * 0.28 - 0.14 * k
            ax.add_patch(FancyArrowPatch((end[0] - GAP_X * 0.85, ty), (end[0], ty), **dashed))
            ax.text(end[0] - GAP_X * 0.85, ty + 0.025, _short(f"from {a.name}", 14),
                    fontsize=FONT - 1, color="#555555", ha="left", va="bottom", style="italic")

    title = (f"reshard plan: modeled {fmt_time(plan.cost)}, {len(plan.communications)} collectives, "
             f"{fmt_bytes(plan.comm_bytes)} received per rank")
    if plan.lowered.program.backward_from is not None:
        title += f", {fmt_bytes(plan.lowered.saved_bytes)} of saved activations per rank"
    meshes = list(dict.fromkeys(m.sharding.mesh for m in plan.lowered.nodes))
    desc = [f"{' x '.join(f'{a}={s}' for a, s in zip(m.axis_names, m.shape))}" for m in meshes]
    if len(meshes) > 1:
        desc = [f"{d} (ranks {list(m.ranks)})" for d, m in zip(desc, meshes)]
    sub = (f"mesh{'es' if len(meshes) > 1 else ''} {', '.join(desc)}; {len(plan.lowered.nodes)} steps; " +
           ("a box per layer or module (plan.draw(path, full=True): a box per step)" if by_part else
            "sharding per mesh axis: S(d) shard dim d, R replicate, P(op) partial"))
    ax.text(width / 2, height - 0.22, title, ha="center", va="center", fontsize=11, fontweight="bold")
    ax.text(width / 2, height - 0.45, sub, ha="center", va="center", fontsize=FONT + 0.5, color="#333333")
    present = {n.category for n in nodes}
    handles = [Patch(facecolor=STYLE[k][0], edgecolor=STYLE[k][1], linewidth=STYLE[k][2], linestyle=STYLE[k][3],
                     label=t) for k, t in LEGEND if k in present]
    handles.append(Patch(facecolor="white", edgecolor="#222222", label="output (double border)"))
    if incoming_tags:
        handles.append(Line2D([], [], color="#999999", linestyle="--", label="edge into a later band (to / from)"))
    if lanes:
        handles.append(Line2D([], [], color="#4a6fa5", label="edge skipping layers"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.56 / height), ncol=4,
              fontsize=FONT, frameon=False, handlelength=1.6, columnspacing=1.2)
    try:
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text (searchable)
            fig.savefig(p, format=fmt, dpi=min(DPI, MAX_PX / max(width, height)))
    except OSError as e:
        raise ReshardError(f"Plan.draw: cannot write {str(path)!r}: {e}") from e
    return p
