"""Draw pipeline schedules in the style of Figure 4 of the Megatron-LM (PTD-P) paper.

``ptdp-schedule --schedule interleaved --p 4 --v 2 --m 8`` prints the tick grid, the tick count,
the predicted and the theoretical bubble fraction, and writes a picture (PNG unless --out
ends otherwise).

In the picture the x axis is time in the cost model (t_f = 1, t_b = 2 per microbatch and stage,
divided by v per chunk): a tick is as wide as its most expensive op, and each op is as wide as its
own cost. Rows are stages (stage 0 on top). Microbatch numbers are 1-BASED, like the paper.
Forward cells are blue, backward cells green (zero-bubble schedules: input gradients B green,
weight gradients W orange; zb-phased has both whole backwards and B / W); the first model chunk
of a stage is dark, the other chunks (v > 1; ZB-V: the way back up the V) are lighter. A split
backward (upper half, then lower half at the next tick) is drawn as one cell with a dotted line
between the halves.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from ptdp_jax.command import command  # noqa: E402
from ptdp_jax.exits import ExitCode  # noqa: E402
from ptdp_jax.paths import nearest_existing, unwritable  # noqa: E402

from .schedule import SCHEDULES, Schedule, bubble_fraction_theory, build_schedule  # noqa: E402

_FWD = ["#1f5fa8", "#6fa3dc", "#a9c8ec", "#d3e3f6"]   # dark -> light per local chunk
_BWD = ["#2b8a3e", "#74c184", "#acdcb6", "#d5eedb"]
_WGT = ["#d9730d", "#f0a35e", "#f6c79b", "#fbe3cd"]   # zero-bubble weight-gradient ops


def _colour(kind: str, vchunk: int) -> str:
    palette = {"F": _FWD, "B": _BWD, "W": _WGT}[kind]
    return palette[min(vchunk, len(palette) - 1)]


def legend_labels(s: Schedule) -> list[str]:
    """The legend's names of the cell kinds (F, B, then W where the schedule has weight ops),
    each per local chunk when v > 1. Green cells are whole backwards, except in zero-bubble
    tables, where they are input gradients (B) whose weight gradient (W) runs apart; zb-phased
    has both (whole backwards, and B / W where splitting pays)."""
    whole = any(op is not None and op.kind == "B" and op.half in ("full", "upper", "lower")
                for row in s.table for op in row)
    split = s.has_weight_ops
    names = {"F": "forward", "W": "weight gradient (W)",
             "B": "whole backward, or input gradient (B)" if whole and split
             else "input gradient (B)" if split else "backward"}
    kinds = "FBW" if split else "FB"
    return [f"{names[k]}{f' chunk {c}' if s.v > 1 else ''}" for k in kinds for c in range(s.v)]


def draw_schedule(schedule: Schedule, path: str, t_f: float = 1.0, t_b: float = 2.0) -> str:
    """Write a PNG of ``schedule`` to ``path`` and return the path."""
    s = schedule
    costs = [float(c) for c in s.tick_costs(t_f, t_b)]
    starts = [sum(costs[:i]) for i in range(len(costs))]
    total = sum(costs)
    unit = t_f / s.v                                          # width of one forward cell
    fig_w = min(max(6.0, 0.32 * total / unit + 1.5), 60.0)
    fig_w = max(fig_w, 8.0)
    fig_h = 0.55 * s.p + 1.8
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    font = 7 if s.m < 10 else 6
    for stage in range(s.p):
        y = s.p - 1 - stage
        ax.add_patch(Rectangle((0, y), total, 1, facecolor="#f2f2f2", edgecolor="none"))
        tick = 0
        while tick < s.num_ticks:
            op = s.table[tick][stage]
            if op is None:
                tick += 1
                continue
            x, width, span = starts[tick], float(s.op_cost(op, t_f, t_b)), 1
            if op.half == "upper":                             # merge with the lower half
                width, span = width + float(s.op_cost(s.table[tick + 1][stage], t_f, t_b)), 2
            ax.add_patch(Rectangle((x, y), width, 1, facecolor=_colour(op.kind, s.local_of(op.chunk)),
                                   edgecolor="black", linewidth=0.6))
            if span == 2:
                for y0, y1 in ((y + 0.05, y + 0.25), (y + 0.75, y + 0.95)):
                    ax.plot([starts[tick + 1]] * 2, [y0, y1], ":", color="black", lw=0.6)
            dark = s.local_of(op.chunk) == 0
            ax.text(x + width / 2, y + 0.5, str(op.microbatch + 1), ha="center", va="center",
                    fontsize=font, color="white" if dark else "black")
            tick += span
    ax.set_xlim(0, total)
    ax.set_ylim(0, s.p)
    ax.set_yticks([s.p - 0.5 - i for i in range(s.p)], [f"stage {i}" for i in range(s.p)])
    ax.set_xlabel(f"time (t_f={t_f:g}, t_b={t_b:g} per microbatch and stage); "
                  f"{s.num_ticks} lockstep ticks")
    theory = bubble_fraction_theory(s.name, s.p, s.m, s.v)
    ax.set_title(f"{s.name} schedule: p={s.p}, v={s.v}, m={s.m}"
                 f"{'' if s.split_backward else ', unsplit backward'}\nbubble fraction "
                 f"{s.bubble_fraction(t_f, t_b):.4f} (theory {float(theory):.4f}); "
                 "cell numbers = microbatch (1-based)", fontsize=9)
    kinds = "FBW" if s.has_weight_ops else "FB"
    handles = [Rectangle((0, 0), 1, 1, facecolor=_colour(k, c), edgecolor="black", lw=0.6)
               for k in kinds for c in range(s.v)]
    labels = legend_labels(s)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout(rect=(0, 0.3 / fig_h, 1, 1))
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ptdp-schedule",
                                     description="Build, print and draw a pipeline schedule.")
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    parser.add_argument("--p", type=int, default=4, help="pipeline stages")
    parser.add_argument("--v", type=int, default=None,
                        help="model chunks per stage (default 1, or 2 for interleaved and zb-v)")
    parser.add_argument("--m", type=int, default=8, help="microbatches")
    parser.add_argument("--out", default=None,
                        help="the picture's path: .png (the default; added to a name without "
                             "an ending), .svg, .pdf, ... (default schedule_<name>_p_v_m.png)")
    parser.add_argument("--no-split-backward", action="store_true",
                        help="one backward op of cost t_b per chunk instead of two halves")
    parser.add_argument("--no-grid", action="store_true", help="do not print the ASCII grid")
    return parser


def picture_path(out: str) -> tuple[str, str | None]:
    """(the file the picture goes to: `out`, with .png added where it has no ending; why it
    cannot be written there, or None): a format matplotlib cannot write, a folder as `out`, a
    folder that does not exist or cannot take files."""
    if os.path.isdir(out) or out.endswith(os.sep):
        return out, "is a folder; give a file name such as schedule.png"
    if not os.path.splitext(out)[1]:
        out += ".png"
    fmt = os.path.splitext(out)[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt not in formats:
        return out, (f"unsupported format {fmt!r}: the ending names the format, one of "
                     f"{', '.join(sorted(formats))} (e.g. .png)")
    folder = os.path.dirname(out) or "."
    if not os.path.isdir(folder):
        probe = nearest_existing(Path(folder))
        return out, (f"the folder {folder} does not exist" if probe.is_dir()
                     else f"{probe} is a file, not a directory")
    why = unwritable(folder)
    return out, why and f"{folder} {why}"


@command("ptdp-schedule")
def main(argv: list[str] | None = None) -> int:
    """ptdp-schedule: check --out, draw the picture, then print the table and its numbers
    (the picture first, so that a reader closing stdout early cannot stop it)."""
    parser = _parser()
    args = parser.parse_args(argv)
    v = args.v if args.v is not None else (2 if args.schedule in ("interleaved", "zb-v") else 1)
    try:
        sched = build_schedule(args.schedule, args.p, args.m, v,
                               split_backward=not args.no_split_backward)
    except ValueError as err:
        parser.error(str(err))
    out, why = picture_path(args.out or f"schedule_{args.schedule}_p{args.p}_v{v}_m{args.m}.png")
    if why:                                            # before any output: fail in one line
        parser.exit(ExitCode.CONFIG, f"ptdp-schedule: error: --out {args.out or out}: {why}\n")
    draw_schedule(sched, out)
    _report(sched, args.no_grid)
    print(f"wrote {out}")
    return 0


def _report(sched: Schedule, no_grid: bool) -> None:
    """Print the tick grid (unless no_grid), the ticks, the times and the bubble fractions."""
    if not no_grid:
        print(sched.render_text())
    theory = bubble_fraction_theory(sched.name, sched.p, sched.m, sched.v)
    print(f"schedule={sched.name} p={sched.p} v={sched.v} m={sched.m} "
          f"split_backward={sched.split_backward}")
    print(f"ticks: {sched.num_ticks}")
    print(f"predicted time (t_f=1, t_b=2): {sched.predicted_time():g}  ideal: {sched.ideal_time():g}")
    print(f"bubble fraction: predicted {sched.bubble_fraction():.6f} "
          f"({sched.bubble_fraction_exact()}), theory {float(theory):.6f} ({theory})")
    print("max in flight per stage: " + " ".join(str(sched.max_in_flight(r)) for r in range(sched.p)))


if __name__ == "__main__":
    sys.exit(main())
