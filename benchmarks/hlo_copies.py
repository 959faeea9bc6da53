"""The data movement an optimized HLO module does: copies, dynamic-update-slice and
dynamic-slice fusions, transposes, of at least --min-mb, grouped by (kind, dtype, shape).

    python benchmarks/hlo_copies.py HLO_TEXT [--min-mb 1] [--top 25] [--where DTYPE[SHAPE]]

HLO_TEXT: the optimized module as text (`capture_step.py --hlo-dir`, or
`compiled.as_text()`). Per group: how many instructions, MB each (the result's size), and in
how many computations they sit; a count is per program text, not per execution (an op inside
a loop body or a branch runs each time that runs). --where bf16[1,2048,8192]: for moves of
that result, each computation holding them, what calls it (a conditional's branch, a while
body, ...) and what the moves read."""
from __future__ import annotations

import argparse
import collections
import re

BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4,
         "u32": 4, "f64": 8, "s64": 8}
INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([0-9,]*)\]\{[^}]*\} (\S+?)\((.*)$")
KINDS = ("copy", "dynamic-update-slice", "dynamic-slice", "transpose")


def kind_of(name: str, opcode: str, rest: str) -> str | None:
    """Which data-movement kind an instruction is: its opcode, or for a fusion the kind in
    its name (XLA names fusions after their root: loop_dynamic_update_slice_fusion...)."""
    if opcode in KINDS:
        return opcode
    if opcode == "fusion":
        for k in KINDS:
            if k.replace("-", "_") in name and "kind=kCustom" not in rest:
                return k
    return None


def scan(text: str, min_mb: float = 1.0):
    """{(kind, dtype, shape): (count, mb_each, computations)} for moves of >= min_mb."""
    groups: dict = collections.defaultdict(lambda: [0, 0.0, set()])
    comp = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            comp = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            continue
        m = INSTR.match(line)
        if not m:
            continue
        name, dtype, dims, opcode, rest = m.groups()
        kind = kind_of(name, opcode, rest)
        if kind is None or dtype not in BYTES:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        mb = n * BYTES[dtype] / 1e6
        if mb >= min_mb:
            g = groups[(kind, dtype, dims)]
            g[0] += 1
            g[1] = mb
            g[2].add(comp)
    return {k: (c, mb, comps) for k, (c, mb, comps) in groups.items()}


def where(text: str, target: str) -> str:
    """The computations holding moves whose result is `target` (e.g. 'bf16[1,2048,8192]'),
    with their callers and the moves' operands."""
    comp, found, callers = "", collections.defaultdict(list), collections.defaultdict(set)
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            comp = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            continue
        for callee in re.findall(r"(?:branch_computations=\{|body=|calls=|condition=)([^},]+(?:, *%[^},]+)*)", line):
            for c in callee.split(","):
                op = re.search(r"\} (\w[\w-]*)\(|\) (\w[\w-]*)\(", line)
                opcode = next((g for g in op.groups() if g), "?") if op else "?"
                callers[c.strip().lstrip("%")].add(f"{comp} ({opcode})")
        m = INSTR.match(line)
        if m and f"{m.group(2)}[{m.group(3)}]" == target and kind_of(m.group(1), m.group(4), m.group(5)):
            found[comp].append(f"{m.group(4)}({m.group(5).split(')')[0][:60]})")
    out = []
    for c, moves in sorted(found.items(), key=lambda kv: -len(kv[1])):
        out.append(f"- {c}: {len(moves)} moves, called from {sorted(callers.get(c.lstrip('%'), []))[:2]}")
        out.extend(f"    {mv}" for mv in moves[:3])
    return "\n".join(out)


def report(groups, top: int = 25) -> str:
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0] * kv[1][1])[:top]
    out = ["| kind | dtype[shape] | count | MB each | computations |", "|---|---|---|---|---|"]
    for (kind, dtype, dims), (c, mb, comps) in rows:
        out.append(f"| {kind} | {dtype}[{dims}] | {c} | {mb:.1f} | {len(comps)} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("hlo")
    ap.add_argument("--min-mb", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--where", default="")
    a = ap.parse_args(argv)
    text = open(a.hlo).read()
    print(where(text, a.where) if a.where else report(scan(text, a.min_mb), a.top))


if __name__ == "__main__":
    main()
