"""Every YAML in configs/ loads and validates; the Table 1 / GPT-3 / LLaMA
configs have the paper's parameter counts and GPU counts. Shape arithmetic
only: no jax compilation."""
from __future__ import annotations

from pathlib import Path

import pytest

from ptdp_jax.config.load import load_config
from ptdp_jax.config.validation import validate
from ptdp_jax.training.metrics import paper_param_count
from ptdp_jax.models.model import num_params

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL = sorted(p.name for p in CONFIGS.glob("*.yaml"))

# Table 1: name -> (params in B as printed, heads, hidden, layers, t, p, GPUs, batch,
# microbatch, layers per virtual stage or None)
TABLE1 = {
    "gpt-1.7b.yaml": (1.7, 24, 2304, 24, 1, 1, 32, 512, 16, None),
    "gpt-3.6b.yaml": (3.6, 32, 3072, 30, 2, 1, 64, 512, 16, None),
    "gpt-7.5b.yaml": (7.5, 32, 4096, 36, 4, 1, 128, 512, 16, None),
    "gpt-18.4b.yaml": (18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, None),
    "gpt-39.1b.yaml": (39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, None),
    "gpt-76.1b.yaml": (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 5),
    "gpt-145.6b.yaml": (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 5),
    "gpt-310.1b.yaml": (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 3),
    "gpt-529.6b.yaml": (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 1),
    "gpt-1t.yaml": (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, None),
}

# LLaMA table: name -> (params in B, dim, heads, layers, lr, tokens)
LLAMA = {
    "llama-7b.yaml": (6.7, 4096, 32, 32, 3.0e-4, 1.0e12),
    "llama-13b.yaml": (13.0, 5120, 40, 40, 3.0e-4, 1.0e12),
    "llama-33b.yaml": (32.5, 6656, 52, 60, 1.5e-4, 1.4e12),
    "llama-65b.yaml": (65.2, 8192, 64, 80, 1.5e-4, 1.4e12),
}


def load(name):
    return load_config(CONFIGS / name)


def n_devices(cfg):
    d, p, t = cfg.parallel.mesh_shape
    return d * p * t


def test_expected_configs_exist():
    expected = {"demo.yaml", "tiny-gpt.yaml", "tiny-llama.yaml", "gpt3-175b.yaml",
                "bench-1.3b.yaml", *TABLE1, *LLAMA}
    assert expected <= set(ALL), sorted(expected - set(ALL))


@pytest.mark.parametrize("name", ALL)
def test_config_loads_and_validates(name):
    cfg = load(name)
    validate(cfg)


@pytest.mark.parametrize("name", ALL)
def test_config_sets_only_known_keys(name):
    # load_config raises on unknown keys; also: no section other than the known ones
    import yaml
    tree = yaml.safe_load((CONFIGS / name).read_text())
    assert set(tree) <= {"model", "train", "parallel", "data", "checkpoint", "run"}


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_table1_row(name):
    P, heads, h, l, t, p, gpus, batch, micro, lpvs = TABLE1[name]
    cfg = load(name)
    m, tr, par = cfg.model, cfg.train, cfg.parallel
    assert (m.arch, m.num_heads, m.hidden_size, m.num_layers) == ("gpt", heads, h, l)
    assert (m.vocab_size, m.seq_len) == (51200, 2048)
    assert (par.tensor, par.pipe) == (t, p)
    assert n_devices(cfg) == gpus
    assert (tr.global_batch_size, tr.micro_batch_size) == (batch, micro)
    assert tr.dtype == "bfloat16" and tr.recompute == "full"
    if lpvs is None:
        assert par.schedule == "1f1b" and par.virtual_stages == 1
    else:
        assert par.schedule == "interleaved"
        assert par.virtual_stages == l // (p * lpvs)
        assert l // (p * par.virtual_stages) == lpvs
    # parameters: the model's count = the paper's formula with the padded
    # vocabulary + the final LayerNorm's 2h, exactly
    n = num_params(m)
    assert n == paper_param_count(cfg, vocab_size=m.padded_vocab_size) + 2 * h
    # ... and the paper's column as printed (one decimal, in billions)
    assert abs(n / 1e9 - P) <= 0.05 + 1e-9, (n, P)
    if P >= 7.5:   # 1.7B and 3.6B are 1.652B and 3.562B: 2.8% / 1.05% off by rounding only
        assert abs(n / 1e9 - P) / P < 0.01


def test_gpt3_175b():
    cfg = load("gpt3-175b.yaml")
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.seq_len, m.vocab_size) == \
        (96, 12288, 96, 2048, 51200)
    assert abs(num_params(m) / 1e9 - 174.6) < 0.05
    assert cfg.parallel.tensor * cfg.parallel.pipe == 96          # the paper's model-parallel size
    assert cfg.train.global_batch_size == 1536


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_llama_row(name):
    P, h, heads, l, lr, tokens = LLAMA[name]
    cfg = load(name)
    m, tr = cfg.model, cfg.train
    assert (m.arch, m.hidden_size, m.num_heads, m.num_layers) == ("llama", h, heads, l)
    assert (m.seq_len, m.vocab_size) == (2048, 32000)
    assert abs(num_params(m) / 1e9 - P) / P < 0.02
    assert tr.lr == pytest.approx(lr)
    assert tr.global_batch_size * m.seq_len == 4 * 1024 * 1024          # 4M tokens
    assert (tr.warmup_steps, tr.weight_decay, tr.grad_clip) == (2000, 0.1, 1.0)
    assert (tr.adam_betas, tr.min_lr_ratio) == ((0.9, 0.95), 0.1)
    assert abs(tr.steps * tr.global_batch_size * m.seq_len - tokens) / tokens < 1e-5
    assert n_devices(cfg) % 8 == 0 and cfg.parallel.tensor <= 8        # t within an 8-GPU node


def test_llama3_8b():
    """LLaMA-3 8B: grouped-query attention (8 key/value heads of 32), 8.03B parameters."""
    cfg = load("llama3-8b.yaml")
    m = cfg.model
    assert (m.arch, m.hidden_size, m.num_layers, m.num_heads, m.kv_heads) == ("llama", 4096, 32, 32, 8)
    assert (m.ffn, m.vocab_size, m.padded_vocab_size, m.seq_len) == (14336, 128256, 128256, 8192)
    assert m.rope_theta == 500000.0
    assert abs(num_params(m) / 1e9 - 8.03) < 0.005
    shapes = __import__("ptdp_jax.models.model", fromlist=["x"]).param_shapes(m)["layers"]
    assert shapes["wk"] == (32, 4096, 8, 128) and shapes["wq"] == (32, 4096, 32, 128)
    assert cfg.train.global_batch_size * m.seq_len == 4 * 1024 * 1024
    assert m.kv_heads % cfg.parallel.tensor == 0 and cfg.parallel.tensor <= 8
    validate(cfg)


def test_demo():
    cfg = load("demo.yaml")
    assert cfg.parallel.mesh_shape == (2, 2, 2)
    assert cfg.parallel.schedule == "interleaved" and cfg.parallel.virtual_stages == 2
    assert cfg.data.path == ()
    assert cfg.model.vocab_size == 257 and cfg.model.seq_len == 128
    assert cfg.num_microbatches % cfg.parallel.pipe == 0
    assert cfg.train.sample_tokens > 0 and cfg.train.eval_every > 0
    validate(cfg, num_devices=8)


def test_bench():
    cfg = load("bench-1.3b.yaml")
    m = cfg.model
    assert (m.arch, m.hidden_size, m.num_layers, m.num_heads, m.seq_len, m.vocab_size) == \
        ("gpt", 2048, 24, 16, 2048, 51200)
    assert 1.2e9 < num_params(m) < 1.4e9
    assert (cfg.train.eval_every, cfg.train.sample_tokens) == (0, 0)
    validate(cfg, num_devices=1)
    # the model and the batch only: precision, recomputation and layout are the run's choice
    from ptdp_jax.config.load import read_yaml
    from ptdp_jax.config.decisions import FILL_KEYS, MESH_KEYS
    keys = set(read_yaml(CONFIGS / "bench-1.3b.yaml")[0])
    assert not keys & {*FILL_KEYS, *MESH_KEYS, "train.dtype"}, keys
    assert (cfg.train.dtype, cfg.train.recompute, cfg.train.global_batch_size) == ("auto", "auto", 16)


@pytest.mark.parametrize("name", ["tiny-gpt.yaml", "tiny-llama.yaml"])
def test_tiny(name):
    cfg = load(name)
    assert cfg.model.arch == name.split("-")[1].split(".")[0]
    assert num_params(cfg.model) < 200_000
    validate(cfg, num_devices=1)
    # layouts the tests use: p * v up to 8, t up to 4
    for (d, p, t, sched, v) in [(2, 2, 2, "interleaved", 2), (1, 4, 2, "interleaved", 2),
                                (1, 8, 1, "1f1b", 1), (1, 2, 4, "interleaved", 4),
                                (8, 1, 1, "1f1b", 1)]:
        over = {"parallel.data": d, "parallel.pipe": p, "parallel.tensor": t,
                "parallel.schedule": sched, "parallel.virtual_stages": v}
        validate(load_config(CONFIGS / name, over), num_devices=8)
