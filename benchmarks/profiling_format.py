"""Markdown of a `profiling.report()` dict (also one read back from JSON): the whole step by
category, the per-tick table, the top kernels. Standard library only."""
from __future__ import annotations


def _op_order(item: tuple[str, dict]) -> tuple[int, str]:
    """'all', 'busy', then F, b, B, other labels, idle '.' last."""
    return {"all": 0, "busy": 1, "F": 2, "b": 3, "B": 4, ".": 6}.get(item[0], 5), item[0]


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table; floats with 2 decimals."""
    cell = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def format_report(r: dict, max_name: int = 60) -> str:
    """Short markdown tables of a report() dict (also one read back from JSON)."""
    devs = r["devices"]
    cols = [c for c in r["categories"] if c == "idle" or any(v["ms"][c] > 0 for v in devs.values())]
    head = f"**Step** ({r['module']}): trace window {r['window_ms']:.1f} ms"
    if r.get("step_s") is not None:
        head += f"; measured step {r['step_s']:.4f} s"
    if r.get("ideal_s"):
        head += (f"; ideal {r['ideal_s']:.4f} s; step / ideal {r['step_over_ideal']:.2f}"
                 + (" (trace window)" if r.get("step_s") is None else ""))
    out = [head, "", "### Whole step: % of the window per category, and busy ms",
           table(["device", "stage"] + cols + ["busy ms"],
                  [[d, v["stage"]] + [f"{v['pct'][c]:.1f}" for c in cols]
                   + [sum(v["ms"][c] for c in cols if c != "idle")] for d, v in devs.items()])]
    t = r["ticks"]
    if t["expected"] is None:
        out += ["", "No schedule given: whole-step figures only."]
    elif not t["matched"]:
        found = ", ".join(f"GPU{d} {n}" for d, n in t["found"].items())
        out += ["", f"Ticks: expected {t['expected']} boundaries per device, found {found}: "
                    "the tick count does not match, whole-step figures only."]
    else:
        where = "starts" if t["offset"] == 1 else "ends"
        stray = t["idle_label_compute_ms"][str(t["offset"])]
        out += ["", f"### Ticks: {t['expected']} per device, ms per tick by category (the permute "
                    f"boundary {where} its tick; the tick at the window's edge, holding the "
                    f"{'epilogue' if t['offset'] == 1 else 'prologue'}, left out; GEMM/attention "
                    f"in ticks labelled idle: {stray:.2f} ms)",
                table(["device", "stage", "op", "ticks", "tick ms"] + cols,
                       [[d, v["stage"], op, s["ticks"], s["tick_ms"]] + [s["ms"][c] for c in cols]
                        for d, v in devs.items() if "by_op" in v
                        for op, s in sorted(v["by_op"].items(), key=_op_order)])]
    out += ["", "### Top kernels per category (all devices; kernel time, overlaps not removed)",
            table(["category", "kernel", "count", "total ms", "mean us"],
                   [[c, k["name"][:max_name], k["count"], k["total_ms"], f"{k['mean_us']:.1f}"]
                    for c, ks in r["top_kernels"].items() for k in ks])]
    d2h = ", ".join(f"GPU{d} {v['d2h_copies']} ({v['idle_after_d2h_ms']:.1f} ms)"
                    for d, v in devs.items())
    out += ["", f"Host round trips, MemcpyD2H per step (GPU idle right after them): {d2h}",
            "Unclassified kernels: " + (", ".join(r["unclassified"]) or "none")]
    return "\n".join(out)
