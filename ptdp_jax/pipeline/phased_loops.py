"""The loops that run a phased table (pipeline/phased.py) in the executor: each part of the
table with a switch of its own branches (`part_rows`), and the steady pairs, which at v > 1 come
in rounds of head-less groups and head groups (`steady`), loops whose trip counts XLA is not
told (`hidden_loop`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def part_rows(ctl: dict, ops: list, idx: range):
    """Phased tables: the control rows idx (one part of the table, pipeline/phased.py) and the
    switch branches they use, renumbered (idle stays 0), so that each loop's switch holds only
    its own ops."""
    idx = np.asarray(idx, np.int64)
    used = sorted(set(np.unique(ctl["branch"][idx]).tolist()) | {0})
    local = np.zeros(len(ops), np.int32)
    local[used] = np.arange(len(used), dtype=np.int32)
    rows = {n: jnp.asarray(local[a[idx]] if n == "branch" else a[idx]) for n, a in ctl.items()}
    return [ops[i] for i in used], rows


def steady(state, head_pair, plain_pair, h_rows, n_rows, b_rows, heads, p: int, v: int):
    """The steady pairs of a phased table. v = 1: one loop, every pair with its head. v > 1:
    the pairs come in groups of p (one local chunk on the last stage each): a head group, then
    m / p - 1 rounds of (v - 1) groups without a head and one with (phased.head_pairs), run as
    a loop over the rounds around one loop of each kind, so each body is one pair. These loops
    hide their trip counts from XLA (`hidden_loop`): XLA:GPU unrolls every loop holding collectives
    by two and copies what it calls per call site, which for loops inside a loop multiplies the
    switches' branches (a v = 2 1.3B step did not finish compiling in 330 s on 4x H200)."""
    take = lambda rows, sl: jax.tree.map(lambda a: a[sl], rows)
    if heads.all():
        state, _ = jax.lax.scan(head_pair, state, (h_rows, b_rows))
        return state
    state = hidden_loop(head_pair, state, (take(h_rows, slice(0, p)), take(b_rows, slice(0, p))))
    rounds, per = (len(heads) - p) // (v * p), (v - 1) * p
    assert (heads[p:].reshape(rounds, v * p) == [False] * per + [True] * p).all()
    shape = lambda rows, k: jax.tree.map(lambda a: a.reshape((rounds, k) + a.shape[1:]), rows)
    b_rest = shape(take(b_rows, slice(p, None)), v * p)

    def one_round(st, r):
        n_r, h_r, b_r = r
        st = hidden_loop(plain_pair, st, (n_r, take(b_r, slice(0, per))))
        return hidden_loop(head_pair, st, (h_r, take(b_r, slice(per, None)))), None
    return hidden_loop(one_round, state, (shape(n_rows, per),
                                          shape(take(h_rows, slice(p, None)), p), b_rest))


def hidden_loop(body, state, rows):
    """lax.scan(body, state, rows)[0] as a while loop whose trip count XLA cannot compute (its
    bound passes an optimization barrier), so that XLA:GPU neither unrolls it nor copies the
    loop body and everything it calls."""
    n = jax.tree.leaves(rows)[0].shape[0]
    bound = jax.lax.optimization_barrier(jnp.int32(n))

    def step(i, st):
        row = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, False), rows)
        return body(st, row)[0]
    return jax.lax.fori_loop(0, bound, step, state)
