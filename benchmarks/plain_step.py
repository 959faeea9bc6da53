"""The one-GPU baseline of issue 12: a plain JAX GPT train step, no ptdp_jax.

    PYTHONPATH=. python benchmarks/plain_step.py [--micro 8] [--batch 16] [--layers 24]
        [--hidden 2048] [--heads 16] [--seq 2048] [--vocab 51200] [--steps 6] [--remat dots] [--attention cudnn]

The same model as configs/bench-1.3b.yaml (pre-LN GPT, GeLU MLP of 4h, tied embedding),
float32 master weights cast to bf16, cuDNN causal attention, a scan over layers with
jax.checkpoint (`--remat`: none | dots (save the GEMM outputs) | full), a scan over
microbatches, AdamW. Prints one JSON line: median step time, tokens/s, MFU by the paper's
formula (72 B s l h^2 (1 + s/6h + V/16lh), 989 TFLOP/s)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax


def init(key, L, h, V, s):
    ks = jax.random.split(key, 6)
    n = lambda k, shape, std=0.02: std * jax.random.normal(k, shape, jnp.float32)
    return {"wte": n(ks[0], (V, h)), "wpe": n(ks[1], (s, h)),
            "lnf": jnp.ones((2, h)).at[1].set(0.0),
            "layers": {"ln": jnp.ones((L, 4, h)).at[:, 1::2].set(0.0),
                       "qkv": n(ks[2], (L, h, 3 * h)), "qkv_b": jnp.zeros((L, 3 * h)),
                       "out": n(ks[3], (L, h, h), 0.02 / (2 * L) ** 0.5), "out_b": jnp.zeros((L, h)),
                       "fc1": n(ks[4], (L, h, 4 * h)), "fc1_b": jnp.zeros((L, 4 * h)),
                       "fc2": n(ks[5], (L, 4 * h, h), 0.02 / (2 * L) ** 0.5),
                       "fc2_b": jnp.zeros((L, h))}}


def ln(x, sb):
    xf = x.astype(jnp.float32)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    return ((xf - mu) * jax.lax.rsqrt(var + 1e-5) * sb[0] + sb[1]).astype(x.dtype)


def layer(x, p, heads, impl="cudnn"):
    b, s, h = x.shape
    qkv = ln(x, p["ln"][0:2]) @ p["qkv"] + p["qkv_b"]
    q, k, v = (a.reshape(b, s, heads, h // heads) for a in jnp.split(qkv, 3, -1))
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
    x = x + a.reshape(b, s, h) @ p["out"] + p["out_b"]
    u = jax.nn.gelu(ln(x, p["ln"][2:4]) @ p["fc1"] + p["fc1_b"], approximate=True)
    return x + u @ p["fc2"] + p["fc2_b"]


POLICIES = {"none": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            "full": jax.checkpoint_policies.nothing_saveable}


def loss_fn(params, tokens, heads, remat, impl="cudnn"):
    p = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    x = p["wte"][tokens[:, :-1]] + p["wpe"][None]
    f = lambda x, lp: (layer(x, lp, heads, impl), None)
    if remat != "none":
        f = jax.checkpoint(f, policy=POLICIES[remat])
    x, _ = jax.lax.scan(f, x, p["layers"])
    logits = (ln(x, p["lnf"]) @ p["wte"].T).astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, -1)
    tgt = jnp.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0]
    return (lse - tgt).mean()


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(micro=8, batch=16, layers=24, hidden=2048, heads=16, seq=2048,
                     vocab=51200, steps=6).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--remat", default="dots", choices=sorted(POLICIES))
    ap.add_argument("--attention", default="cudnn", choices=["cudnn", "xla"])
    a = ap.parse_args()
    tx = optax.adamw(1e-4, weight_decay=0.1)
    params = init(jax.random.key(0), a.layers, a.hidden, a.vocab, a.seq)
    opt = tx.init(params)
    m = a.batch // a.micro

    @jax.jit
    def step(params, opt, tokens):
        def acc(g, mb):
            l, gi = jax.value_and_grad(loss_fn)(params, mb, a.heads, a.remat, a.attention)
            return jax.tree.map(jnp.add, g, (l, gi)), None
        zero = jax.tree.map(jnp.zeros_like, (jnp.zeros(()), params))
        (l, g), _ = jax.lax.scan(acc, zero, tokens.reshape(m, a.micro, -1))
        upd, opt = tx.update(jax.tree.map(lambda x: x / m, g), opt, params)
        return optax.apply_updates(params, upd), opt, l / m

    tokens = jnp.asarray(np.random.default_rng(0).integers(0, a.vocab, (a.batch, a.seq + 1)),
                         jnp.int32)
    times = []
    for i in range(a.steps + 2):
        t0 = time.perf_counter()
        params, opt, l = step(params, opt, tokens)
        float(l)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[2:])
    L, h, s, V = a.layers, a.hidden, a.seq, a.vocab
    flops = 72 * a.batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    print(json.dumps({"impl": "plain_jax", "remat": a.remat, "micro": a.micro, "batch": a.batch,
                      "device": jax.devices()[0].device_kind, "step_time_s": round(t, 4),
                      "tokens_per_s": round(a.batch * s / t, 1),
                      "mfu": round(flops / t / 989e12, 4), "loss": float(l)}))


if __name__ == "__main__":
    main()
