"""Greedy text generation from canonical parameters (the demo's closing sample)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.models import model as M
from ptdp_jax.sharding import Sharder


def greedy_generate(model_cfg, params, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding with a fixed window of model_cfg.seq_len tokens (no KV cache:
    each new token re-runs the window, which is plenty for a short sample)."""
    s = model_cfg.seq_len
    sh = Sharder()
    params = jax.tree.map(jnp.asarray, params)

    @jax.jit
    def next_token(window_s, last):
        x = M.embed(model_cfg, sh, params["embed"], window_s[None])
        x = M.run_layers(model_cfg, sh, params["layers"], x)
        logits_v = M.logits(model_cfg, sh, params["embed"], params["head"], x)[0, last]
        logits_v = jnp.where(jnp.arange(logits_v.shape[0]) < model_cfg.vocab_size, logits_v,
                             -jnp.inf)
        return jnp.argmax(logits_v)

    ids = list(prompt_ids) or [0]
    out = []
    for _ in range(num_tokens):
        ctx = ids[-s:]
        window = np.zeros((s,), np.int32)
        window[: len(ctx)] = ctx
        tok = int(next_token(jnp.asarray(window), len(ctx) - 1))
        ids.append(tok)
        out.append(tok)
    return out
