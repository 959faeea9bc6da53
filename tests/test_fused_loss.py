"""The fused head loss (models/fused_loss.py): the loss and gradients of the plain
vocab-parallel cross-entropy, for any number of sequence chunks, and less memory."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptdp_jax.config.load import load_config, parse_cli_overrides
from ptdp_jax.models import fused_loss as FL
from ptdp_jax.models import model as M
from ptdp_jax.models.layers import vocab_parallel_cross_entropy
from ptdp_jax.parallel.sharding import Sharder


def _setup(name, b=2, overrides=()):
    cfg = load_config(f"configs/{name}.yaml", parse_cli_overrides(list(overrides))).model
    params = M.init_params(cfg, 0)
    rng = np.random.default_rng(0)
    targets = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, cfg.seq_len)), jnp.int32)
    x = jax.random.normal(jax.random.key(1), (b, cfg.seq_len, cfg.hidden_size))
    sh = Sharder()

    def chunk_loss(e, h, x_, t):
        return vocab_parallel_cross_entropy(M.logits(cfg, sh, e, h, x_), t, cfg.vocab_size, sh)
    return cfg, params, x, targets, chunk_loss


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_fused_head_loss_equals_plain(name):
    cfg, params, x, t, chunk_loss = _setup(name)
    plain = jax.value_and_grad(chunk_loss, argnums=(0, 1, 2))(params["embed"], params["head"], x, t)
    for n in (1, 4):
        fused = jax.value_and_grad(
            lambda e, h, x_: FL.fused_head_loss(chunk_loss, e, h, x_, t, n), argnums=(0, 1, 2))(
                params["embed"], params["head"], x)
        np.testing.assert_allclose(float(fused[0]), float(plain[0]), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(fused[1]), jax.tree.leaves(plain[1])):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # without a gradient the loss alone is computed, the same
    assert float(FL.fused_head_loss(chunk_loss, params["embed"], params["head"], x, t, 4)) == \
        pytest.approx(float(plain[0]), rel=1e-6)


def test_num_chunks_divides_the_sequence_and_bounds_the_chunk():
    assert FL.num_chunks(8, 2048, 51200, 1 << 28) == 16       # 3.4 GB of logits / 256 MiB
    assert FL.num_chunks(1, 2048, 51200, 1 << 28) == 2
    assert FL.num_chunks(1, 10, 7, 1 << 30) == 1
    assert FL.num_chunks(3, 6, 100, 1000) == 6                # 7.2 kB / 1 kB -> 8 -> next divisor


def test_fused_head_keeps_no_logits_for_the_backward():
    """Compiled temporary memory of the head's loss and gradients: the plain head keeps float32
    logits (three logits' worth here); the fused head one chunk's worth, halving with the chunk."""
    cfg, params, x, t, chunk_loss = _setup("tiny-gpt", 8, ["model.vocab_size=4096",
                                                           "model.seq_len=64"])

    def temp(fn):
        g = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))
        return g.lower(params["embed"], params["head"], x).compile().memory_analysis().temp_size_in_bytes
    plain = temp(lambda e, h, x_: chunk_loss(e, h, x_, t))
    fused = {n: temp(lambda e, h, x_: FL.fused_head_loss(chunk_loss, e, h, x_, t, n))
             for n in (2, 8)}
    logits_f32 = 8 * cfg.seq_len * cfg.padded_vocab_size * 4
    assert plain >= 2 * logits_f32, (plain, logits_f32)
    assert fused[2] < plain / 1.8 and fused[8] < fused[2] / 3, (plain, fused)
