"""ZeRO with tensor parallelism: the gathers over 'data' keep each weight split over 'tensor'.

With 'tensor' left to GSPMD, its partitioner gathers the operand of every collective over
'data' whole over 'tensor' first: the layers then run on whole weights (1.3B (2,1,2) zero 2:
0.1883 s and 32.8 GiB against zero 0's 0.1707 s and 24.4 GiB, 4x H200, 2026-11-27). ZeRO must
add no collective over 'tensor' to the step: every all-gather and reduce-scatter over a
'tensor' group is one that zero 0 has too (the sequence-parallel activations')."""
import re

import numpy as np
import pytest

from compiled import compile_grad_fn
from parity import tiny_config

MODEL = {"model.hidden_size": 64, "model.num_heads": 8, "model.seq_len": 32,
         "parallel.sequence_parallel": True}


def _groups(line: str, n: int) -> list[tuple[int, ...]]:
    """The replica groups of a collective's HLO line (explicit or iota form)."""
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", line)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        ids = np.arange(n).reshape([int(x) for x in m.group(2).split(",")])
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return [tuple(g) for g in ids.reshape(shape).tolist()]
    m = re.search(r"replica_groups=\{(\{[0-9,{}]*\})\}", line)
    return [tuple(int(x) for x in g.split(",")) for g in re.findall(r"\{([0-9,]+)\}", m.group(1))]


def _over_tensor(hlo: str, mesh) -> list[str]:
    """Result shapes of the all-gathers and reduce-scatters whose groups span only 'tensor'
    (device id = (d * p + p_i) * t + t_i, as sharding.make_mesh lays the mesh out)."""
    d, p, t = mesh
    out = []
    for line in hlo.splitlines():
        kind = re.search(r"[\s)}](all-gather|reduce-scatter)(-start)?\(", line)
        if not kind or "replica_groups" not in line:
            continue
        groups = _groups(line, d * p * t)
        if all(len({i // t for i in g}) == 1 for g in groups) and len(groups[0]) > 1:
            out.append(kind.group(1) + line.split("=", 1)[1].split(kind.group(1))[0].strip())
    return sorted(out)


@pytest.mark.parametrize("arch,mesh,zero,extra", [
    ("gpt", (2, 1, 4), 2, {"train.micro_batch_size": 4}),
    ("llama", (2, 1, 4), 1, {"train.micro_batch_size": 2}),
    ("gpt", (2, 1, 4), 3, {"train.micro_batch_size": 4}),
    ("gpt", (2, 2, 2), 1, {"train.micro_batch_size": 2, "parallel.schedule": "1f1b"}),
])
def test_zero_adds_no_collective_over_tensor(arch, mesh, zero, extra):
    hlo = {z: compile_grad_fn(tiny_config(arch, mesh, **MODEL, **extra, **{"parallel.zero": z}))
           .as_text() for z in (0, zero)}
    base, got = _over_tensor(hlo[0], mesh), _over_tensor(hlo[zero], mesh)
    assert base, "expected the sequence-parallel gathers over 'tensor'"
    extra_ops = sorted(set(got) - set(base))
    assert not extra_ops, f"zero={zero} adds collectives over 'tensor': {extra_ops[:6]}"
