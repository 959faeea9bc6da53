"""tuning.scan_layers: the layers unrolled (default) and in a lax.scan compute the same loss and
gradients, for every recompute mode and both architectures (the same function, only XLA's
program differs)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptdp_jax.config.load import load_config
from ptdp_jax.models import model as M


@pytest.mark.parametrize("config,recompute", [("tiny-gpt", "none"), ("tiny-gpt", "selective"),
                                              ("tiny-llama", "full")])
def test_unrolled_layers_equal_scanned(config, recompute):
    cfg = load_config(f"configs/{config}.yaml", {}).model
    params = M.init_params(cfg, 0)
    tok = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.seq_len + 1)),
                      jnp.int32)

    def loss(p, scan):
        return M.loss_sum(cfg, p, tok[:, :-1], tok[:, 1:], recompute=recompute, scan_layers=scan)
    (l_scan, g_scan), (l_unr, g_unr) = (jax.value_and_grad(loss)(params, s) for s in (True, False))
    np.testing.assert_allclose(float(l_unr), float(l_scan), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_unr), jax.tree.leaves(g_scan)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
