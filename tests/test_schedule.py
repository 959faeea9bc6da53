"""Tests of the lockstep pipeline schedules (ptdp_jax.pipeline.schedule) and their CLI."""
from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import pytest

from ptdp_jax.pipeline.schedule import Op, bubble_fraction_theory, build_schedule


def _configs():
    """(name, p, v, m) covering p 1..8, v 1..4, m multiples of p up to 32, and m < p."""
    out = []
    for p in range(1, 9):
        multiples = list(range(p, 33, p))
        for name in ("gpipe", "1f1b"):
            small = sorted({1, max(1, p // 2), max(1, p - 1)} - set(multiples))
            out += [(name, p, 1, m) for m in small + multiples]
        out += [("interleaved", p, v, m) for v in range(2, 5) for m in multiples]
    return out


CONFIGS = _configs()
SPLITS = (True, False)


@functools.lru_cache(maxsize=None)
def sched(name, p, v, m, split):
    return build_schedule(name, p, m, v, split_backward=split)


def _positions(s):
    pos = {}
    for t, row in enumerate(s.table):
        for st, op in enumerate(row):
            if op is not None:
                assert op not in pos, f"{op} runs twice"
                pos[op] = (t, st)
    return pos


@pytest.mark.parametrize("split", SPLITS)
def test_every_op_once_on_owner_stage(split):
    for name, p, v, m in CONFIGS:
        s = sched(name, p, v, m, split)
        pos = _positions(s)
        halves = ("upper", "lower") if split else ("full",)
        expected = {Op("F", mb, c, "full") for mb in range(m) for c in range(p * v)}
        expected |= {Op("B", mb, c, h) for mb in range(m) for c in range(p * v) for h in halves}
        assert set(pos) == expected, (name, p, v, m)
        for op, (t, st) in pos.items():
            assert st == op.chunk % p
            if op.half == "lower":   # the executor relies on lower directly following upper
                assert pos[Op("B", op.microbatch, op.chunk, "upper")] == (t - 1, st)
        assert len(s.table[-1]) == p and all(len(row) == p for row in s.table)


@pytest.mark.parametrize("split", SPLITS)
def test_dependencies_strictly_earlier(split):
    for name, p, v, m in CONFIGS:
        s = sched(name, p, v, m, split)
        pos = _positions(s)
        last = p * v - 1
        final = "lower" if split else "full"
        for op, (t, _) in pos.items():
            mb, c = op.microbatch, op.chunk
            if op.kind == "F":
                pre = None if c == 0 else Op("F", mb, c - 1, "full")
            elif op.half == "lower":
                pre = Op("B", mb, c, "upper")
            else:
                pre = Op("F", mb, c, "full") if c == last else Op("B", mb, c + 1, final)
            if pre is not None:
                assert pos[pre][0] < t, (name, p, v, m, op, pre)
        for t, row in enumerate(s.table):   # ASAP placement never leaves a tick fully idle
            assert any(op is not None for op in row), (name, p, v, m, t)


def test_split_backward_hits_theory_exactly():
    for name, p, v, m in CONFIGS:
        s = sched(name, p, v, m, True)
        theory = bubble_fraction_theory(name, p, m, v)
        if name == "interleaved":
            assert s.num_ticks == 3 * (m * v + p - 1)
            assert s.predicted_time_exact(1, 2) == 3 * m + Fraction(3 * (p - 1), v)
            assert theory == Fraction(p - 1, v * m)
        else:
            assert s.num_ticks == 3 * (m + p - 1)
            assert s.predicted_time(1, 2) == (m + p - 1) * 3.0
            assert theory == Fraction(p - 1, m)
        assert s.ideal_time(1, 2) == 3 * m
        assert s.bubble_fraction_exact() == theory, (name, p, v, m)
        assert s.bubble_fraction() == float(theory)
        # other t_f, t_b with t_b = 2 t_f: the same bubble fraction
        assert s.bubble_fraction_exact(Fraction(3, 7), Fraction(6, 7)) == theory


def test_unsplit_backward_costs_at_least_theory():
    for name, p, v, m in CONFIGS:
        s = sched(name, p, v, m, False)
        theory = sched(name, p, v, m, True).predicted_time_exact()
        assert s.predicted_time_exact() >= theory, (name, p, v, m)
        if name == "gpipe" or p == 1:   # forward and backward ticks never mix: no loss
            assert s.predicted_time_exact() == theory
    # figures reported in the design notes
    assert sched("1f1b", 4, 1, 8, False).predicted_time() == 40.0          # theory 33
    assert sched("interleaved", 4, 2, 8, False).predicted_time() == 34.0   # theory 28.5


def test_known_tick_counts():
    assert sched("gpipe", 4, 1, 8, True).num_ticks == 33
    assert sched("1f1b", 4, 1, 8, True).num_ticks == 33
    assert sched("interleaved", 4, 2, 8, True).num_ticks == 57
    assert sched("interleaved", 4, 2, 8, True).predicted_time() == 28.5


@pytest.mark.parametrize("split", SPLITS)
def test_in_flight_bounds(split):
    for name, p, v, m in CONFIGS:
        s = sched(name, p, v, m, split)
        got = [s.max_in_flight(r) for r in range(p)]
        if name == "gpipe":
            assert got == [m] * p
        elif name == "1f1b":
            assert got == [min(m, p - r) for r in range(p)], (p, m, got)
        else:
            bound = [min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1) for r in range(p)]
            assert all(g <= b for g, b in zip(got, bound)), (p, v, m, got, bound)
        assert s.num_stash_slots == max(got)
    assert [sched("interleaved", 4, 2, 8, True).max_in_flight(r) for r in range(4)] == [11, 9, 7, 5]


def _simulate_executor(s):
    """Replay the buffers using only executor_arrays; check every read gets the right message."""
    a = s.executor_arrays()
    p, T, last = s.p, s.num_ticks, s.p * s.v - 1
    for k, arr in a.items():
        assert arr.dtype == np.int32 and arr.shape == (T, p), k
    stash = [[None] * s.num_stash_slots for _ in range(p)]
    fbuf = [[None] * s.num_fwd_slots for _ in range(p)]
    bbuf = [[None] * s.num_bwd_slots for _ in range(p)]
    wbuf = [[None] * s.num_wstash_slots for _ in range(p)]    # zero bubble: B -> W

    def put(buf, slot, tag):
        assert 0 <= slot < len(buf) and buf[slot] is None, (slot, buf, tag)
        buf[slot] = tag

    def take(buf, slot, tag, free=True):
        assert 0 <= slot < len(buf) and buf[slot] == tag, (slot, buf, tag)
        if free:
            buf[slot] = None

    for t in range(T):
        for st in range(p):  # arrivals, stored before this tick's op
            src, dst = (st - 1) % p, (st + 1) % p
            sent_f = t > 0 and a["op"][t - 1, src] == 1 and not a["is_last"][t - 1, src]
            sent_b = t > 0 and a["op"][t - 1, dst] in (3, 4, 5) and not a["is_first"][t - 1, dst]
            assert (a["fwd_recv_slot"][t, st] >= 0) == sent_f
            assert (a["bwd_recv_slot"][t, st] >= 0) == sent_b
            if sent_f:
                put(fbuf[st], a["fwd_recv_slot"][t, st],
                    ("act", a["mb"][t - 1, src], a["vchunk"][t - 1, src] * p + src))
            if sent_b:
                put(bbuf[st], a["bwd_recv_slot"][t, st],
                    ("grad", a["mb"][t - 1, dst], a["vchunk"][t - 1, dst] * p + dst))
        for st in range(p):
            code, mb, c = a["op"][t, st], a["mb"][t, st], a["vchunk"][t, st] * p + st
            if code == 0:
                assert mb == 0 and a["vchunk"][t, st] == 0 and a["stash_slot"][t, st] == -1
                continue
            assert a["is_first"][t, st] == (c == 0) and a["is_last"][t, st] == (c == last)
            assert (a["loss_ct_slot"][t, st] >= 0) == (code == 1 and c == last)
            assert (a["fwd_in_slot"][t, st] >= 0) == (code == 1 and c > 0)
            assert (a["bwd_in_slot"][t, st] >= 0) == (code in (2, 4, 5))
            assert (a["wstash_slot"][t, st] >= 0) == (code in (5, 6))
            if code == 6:       # W: the GEMM operands its B left
                take(wbuf[st], a["wstash_slot"][t, st], (mb, c))
            elif code == 1:
                if c > 0:
                    take(fbuf[st], a["fwd_in_slot"][t, st], ("act", mb, c - 1))
                put(stash[st], a["stash_slot"][t, st], (mb, c))
                if c == last:
                    put(bbuf[st], a["loss_ct_slot"][t, st], ("loss", mb, c))
            else:
                if code in (2, 4, 5):
                    want = ("loss", mb, c) if c == last else ("grad", mb, c + 1)
                    take(bbuf[st], a["bwd_in_slot"][t, st], want)
                take(stash[st], a["stash_slot"][t, st], (mb, c), free=code in (3, 4, 5))
                if code == 5:
                    put(wbuf[st], a["wstash_slot"][t, st], (mb, c))
    for buf in (stash, fbuf, bbuf, wbuf):
        assert all(x is None for per_stage in buf for x in per_stage)
    # nothing is sent at the last tick
    assert not any(a["op"][T - 1, st] == 1 and not a["is_last"][T - 1, st] for st in range(p))
    assert not any(a["op"][T - 1, st] in (3, 4, 5) and not a["is_first"][T - 1, st] for st in range(p))


@pytest.mark.parametrize("split", SPLITS)
def test_executor_arrays_consistent(split):
    for name, p, v, m in CONFIGS:
        if p * v * m > 256 and (p, v, m) != (8, 4, 32):   # keep the file fast
            continue
        _simulate_executor(sched(name, p, v, m, split))


def test_receive_slots_small():
    s = sched("1f1b", 4, 1, 8, True)
    assert s.num_fwd_slots == 1 and s.num_bwd_slots == 1
    s = sched("gpipe", 4, 1, 8, True)
    assert s.num_bwd_slots == 8   # all loss cotangents wait for the backward phase
    assert sched("gpipe", 1, 1, 1, True).num_fwd_slots == 1   # at least 1 even when unused


@pytest.mark.parametrize("args", [
    ("pipedream", 4, 8, 1), ("1f1b", 0, 8, 1), ("1f1b", 4, 0, 1), ("gpipe", 4, 8, 0),
    ("gpipe", 4, 8, 2), ("1f1b", 4, 8, 2), ("interleaved", 4, 8, 1), ("interleaved", 4, 6, 2),
])
def test_errors(args):
    with pytest.raises(ValueError) as err:
        build_schedule(*args)
    with pytest.raises(ValueError):
        bubble_fraction_theory(*args)
    if args == ("interleaved", 4, 6, 2):
        assert "m=6" in str(err.value) and "p=4" in str(err.value)


def test_render_text():
    text = sched("interleaved", 2, 2, 2, True).render_text()
    assert text.count("\n") == 1 and "F0:0" in text and "b1:1" in text and "B1:0" in text


def draw(tmp_path, capsys, *args) -> str:
    """`ptdp-schedule ARGS --out tmp/sched.png`: check it wrote a PNG; return what it printed."""
    from ptdp_jax.pipeline.plot import main

    out = tmp_path / "sched.png"
    assert main([*args, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return capsys.readouterr().out


def test_cli_writes_png(tmp_path, capsys):
    from ptdp_jax.pipeline.plot import main

    printed = draw(tmp_path, capsys, "--schedule", "interleaved", "--p", "4", "--v", "2",
                   "--m", "8")
    assert "bubble fraction" in printed and "0.187500" in printed and "ticks: 57" in printed
    out2 = tmp_path / "unsplit.png"
    main(["--schedule", "1f1b", "--p", "2", "--m", "3", "--out", str(out2), "--no-split-backward"])
    assert out2.exists()


@pytest.mark.parametrize("where,words", [("missing/dir/x.png", ["missing/dir", "does not exist"]),
                                         (".", ["is a folder"])])
def test_cli_out_where_no_png_can_go_is_a_user_error(tmp_path, capsys, where, words):
    """--out in a folder that does not exist, or a folder itself: one line, exit 2, before
    anything is printed or drawn."""
    from ptdp_jax.pipeline.plot import main

    out = str(tmp_path / where)
    with pytest.raises(SystemExit) as stop:
        main(["--schedule", "1f1b", "--p", "2", "--m", "2", "--out", out])
    assert stop.value.code == 2
    printed, err = capsys.readouterr()
    assert printed == "" and err.count("\n") == 1, err
    assert err.startswith(f"ptdp-schedule: error: --out {out}: ") and all(w in err for w in words)


@pytest.mark.parametrize("name,v,b", [("1f1b", 1, "backward"), ("zb-h1", 1, "input gradient (B)"),
                                      ("zb-phased", 1, "whole backward, or input gradient (B)")])
def test_the_legend_names_the_backward_cells(name, v, b):
    """zb-phased's green cells are whole backwards and input gradients B (its legend said
    "B alone: input gradient" for both)."""
    from ptdp_jax.pipeline.plot import legend_labels
    s = build_schedule(name, 4, 8, v)
    assert legend_labels(s)[1] == b
    assert legend_labels(s)[2:] == (["weight gradient (W)"] if s.has_weight_ops else [])
