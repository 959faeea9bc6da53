"""benchmarks/side_probe.py, overlap_probe.py and branch_permute_probe.py on the CPU's fake
devices: their programs compile and run, the summary compares them, the rings compute what
GSPMD's collectives do, the branch probe what numpy does (timings themselves are for GPUs)."""
from __future__ import annotations

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")


def test_side_probe_runs_gemms_gathers_and_both_and_summarises(capsys, monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    monkeypatch.setenv("NCCL_CTA_POLICY", "2")
    import side_probe
    assert side_probe.main(["--rows", "16", "--hidden", "32", "--ffn", "64", "--chain", "2",
                            "--gather-mib", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["case"] for x in lines] == ["gemm", "gather", "both", "summary"]
    assert lines[0]["t"] == 8 and all(x["cta_policy"] == "2" for x in lines)
    g, c, b = (x["ms"] for x in lines[:3])
    s = lines[3]
    # the summary divides the unrounded times; the lines print them to the microsecond
    assert s["both_over_serial"] == pytest.approx(b / (g + c), rel=1e-2)
    assert s["both_over_ideal"] == pytest.approx(b / max(g, c), rel=1e-2)
    sys.modules.pop("side_probe", None)


def test_overlap_probe_rings_match_plain(capsys, monkeypatch):
    """benchmarks/overlap_probe.py: the ring and the direct sends compute GSPMD's all-gather /
    reduce-scatter block (up to bf16 sums in another order) on the 8 fake devices."""
    monkeypatch.syspath_prepend(BENCH)
    import overlap_probe
    assert overlap_probe.main(["--rows", "256", "--hidden", "32", "--ffn", "64",
                               "--chain", "2"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["case"] for x in lines] == ["gemm", "plain", "ring", "direct"]
    for x in lines[2:]:
        assert x["t"] == 8 and x["max_diff_over_max_abs"] < 2e-2, x
    sys.modules.pop("overlap_probe", None)


def test_branch_permute_probe_matches_numpy(capsys, monkeypatch):
    """benchmarks/branch_permute_probe.py: tensor permutes inside branches that differ between
    the two stages of a (1,2,2) mesh, then a stage permute, as numpy computes them."""
    monkeypatch.syspath_prepend(BENCH)
    import branch_permute_probe
    assert branch_permute_probe.main(["--rows", "8", "--ticks", "3", "--warmup"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["ok"] and line["max_err"] == 0.0 and line["ticks"] == 3 and line["warmup"]
    sys.modules.pop("branch_permute_probe", None)


def test_branch_permute_probe_idle_variant_on_a_uniform_table(monkeypatch):
    """The --idle program (branch 1 without a permute, a 'pipe' all-reduce after the switch)
    against its numpy model, on the uniform table (XLA:CPU meets every device of a permute at
    each call, so the divergent table's stage-apart permutes are for GPUs only)."""
    import numpy as np
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from ptdp_jax.sharding import make_mesh
    monkeypatch.syspath_prepend(BENCH)
    import branch_permute_probe as B
    mesh = make_mesh((1, 2, 2))
    x = np.random.default_rng(1).standard_normal((2, 2, 4, 256)).astype(np.float32)
    xd = jax.device_put(x.reshape(2, 8, 256), NamedSharding(mesh, P("pipe", "tensor")))
    table = B.uniform(3)        # odd: at t = 2 the two branches' rolls differ after it
    out = np.asarray(jax.jit(B.program(mesh, idle=True))(xd, table)).reshape(x.shape)
    np.testing.assert_allclose(out, B.expected(x, table, idle=True), rtol=1e-6)
    assert not np.allclose(B.expected(x, table, idle=True), B.expected(x, table))
    sys.modules.pop("branch_permute_probe", None)
