"""Pipeline parallelism: every schedule, on pure and mixed meshes, gives the
loss and every gradient of the one-device model (float32).

Mixed meshes matter: pipe rings replicated over data or tensor are where XLA's
collective-permute handling has gone wrong before. The matrix below covers each
schedule on (1,2,1), (1,4,1), (2,2,2), (1,2,4), (2,4,1), (1,4,2); v = 2 and 4 (and
ZB-V's V placement);
m = p, 2p, 3p; the residual stash static and indexed per tick; recompute none, selective and full; scatter/gather on and off;
split and unsplit backward (1 layer per chunk); and uneven layers per chunk
(parallel.stage_layers, explicit and auto); grouped-query attention; the zero-bubble split
alone (zb-h1, zb-v) and mixed with whole backwards (zb-phased)."""
import pytest

from parity import assert_close, loss_and_grads, reference, tiny_config

I2 = {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}
I4 = {"parallel.schedule": "interleaved", "parallel.virtual_stages": 4}
GP = {"parallel.schedule": "gpipe"}
F1 = {"parallel.schedule": "1f1b"}
ZB = {"parallel.schedule": "zb-h1"}
ZV = {"parallel.schedule": "zb-v", "parallel.virtual_stages": 2}
PH = {"parallel.schedule": "1f1b-phased"}
PH2 = {**PH, "parallel.virtual_stages": 2}
ZP = {"parallel.schedule": "zb-phased"}
FULL = {"train.recompute": "full"}
SEL = {"train.recompute": "selective"}
SG = {"parallel.scatter_gather": True}
DYN = {"tuning.static_stash": False}    # the residual stash indexed per tick
STAT = {"tuning.static_stash": True}    # a buffer per slot (auto: only for 1f1b, 1f1b-phased)
M3P = {"train.global_batch_size": 6, "train.micro_batch_size": 1}   # m = 6 = 3p for p = 2


def mb(m, d=1):
    """Overrides giving m microbatches with global batch 8 (micro batch 8/(m*d))."""
    return {"train.micro_batch_size": 8 // (m * d)}


CASES = [
    # (arch, mesh, overrides)
    ("gpt", (1, 2, 1), {**F1, **mb(2)}),                     # m = p
    ("gpt", (1, 2, 1), {**GP, **mb(4)}),                     # m = 2p
    ("gpt", (1, 2, 1), {**I2, **mb(8)}),                     # m = 4p
    ("gpt", (1, 4, 1), {**F1, **mb(8)}),                     # m = 2p
    ("gpt", (1, 4, 1), {**GP, **mb(4), **FULL}),             # m = p
    ("gpt", (1, 4, 1), {**I2, **mb(4)}),                     # 1 layer per chunk: unsplit backward
    ("gpt", (2, 2, 2), {**I2, **mb(2, 2)}),                  # the demo's layout
    ("gpt", (2, 2, 2), {**GP, **mb(4, 2), **SG}),
    ("gpt", (2, 2, 2), {**F1, **mb(2, 2), **SEL, **SG}),
    ("gpt", (1, 2, 4), {**I4, **mb(4), **SG}),               # v = 4
    ("gpt", (1, 2, 4), {**F1, **mb(8), **FULL}),
    ("gpt", (2, 4, 1), {**I2, **mb(4, 2), **FULL}),
    ("gpt", (2, 4, 1), {**GP, **mb(4, 2)}),
    ("gpt", (1, 4, 2), {**I2, **mb(8), **SG}),
    ("gpt", (1, 4, 2), {**F1, **mb(4), **SEL}),
    ("gpt", (1, 2, 1), {**F1, **M3P}),                       # m = 3p
    ("gpt", (1, 2, 1), {**I2, **M3P, **SG}),
    ("llama", (1, 2, 1), {**F1, **mb(4)}),
    ("llama", (2, 2, 2), {**I2, **mb(2, 2), **SG}),
    ("llama", (1, 4, 2), {**GP, **mb(4), **FULL}),
    ("llama", (2, 4, 1), {**F1, **mb(4, 2), **SEL}),
    ("llama", (1, 2, 4), {**I4, **mb(2), **FULL, **SG}),
    # parallel.stage_layers: uneven chunks (padded stage layout), explicit and auto
    ("gpt", (1, 4, 1), {**F1, **mb(8), "parallel.stage_layers": (2, 3, 1, 2)}),   # a 1-layer chunk
    ("gpt", (2, 2, 2), {**I2, **mb(2, 2), "parallel.stage_layers": (3, 1, 2, 2), **SEL}),
    ("gpt", (1, 2, 4), {**F1, **mb(4), "parallel.stage_layers": "auto", **SG}),
    ("llama", (2, 2, 1), {**F1, **mb(2, 2), "parallel.stage_layers": (5, 3), **FULL}),
    ("llama", (1, 4, 2), {**GP, **mb(4), "parallel.stage_layers": (2, 2, 3, 1)}),
    # zero bubble: backward split into B (input gradient) and W (weight gradient)
    ("gpt", (1, 4, 1), {**ZB, **mb(8)}),
    ("gpt", (2, 2, 2), {**ZB, **mb(2, 2), **SEL, **SG}),
    ("gpt", (1, 2, 4), {**ZB, **mb(4), **FULL}),
    ("llama", (2, 4, 1), {**ZB, **mb(4, 2), **SEL, "parallel.stage_layers": (3, 1, 2, 2)}),
    ("llama", (1, 4, 2), {**ZB, **mb(8)}),
    # ZB-V: two chunks per stage in a V (activations down, then back up), head and loss on stage 0
    ("gpt", (1, 2, 1), {**ZV, **mb(2)}),                     # m = p
    ("gpt", (1, 4, 1), {**ZV, **mb(8)}),                     # m = 2p, 1 layer per chunk
    ("gpt", (1, 2, 1), {**ZV, **M3P, **FULL}),               # m = 3p
    ("gpt", (2, 2, 2), {**ZV, **mb(2, 2), **SEL, **SG}),
    ("llama", (1, 2, 4), {**ZV, **mb(4), **FULL}),
    ("llama", (1, 4, 2), {**ZV, **mb(4), **SEL}),
    ("llama", (2, 2, 1), {**ZV, **mb(2, 2), "parallel.stage_layers": (3, 1, 2, 2)}),
    ("gpt", (1, 3, 1), {**ZV, **mb(4), "parallel.stage_layers": (2, 1, 1, 1, 1, 2),
                        "model.vocab_size": 100}),       # the head unspread, on stage 0
    # 1F1B in forward and backward phases (whole backwards)
    ("gpt", (1, 4, 1), {**PH, **mb(8)}),
    ("gpt", (2, 2, 2), {**PH, **mb(2, 2), **SEL, **SG}),
    ("llama", (1, 2, 4), {**PH, **mb(4), **FULL}),
    ("llama", (2, 4, 1), {**PH, **mb(4, 2), "parallel.stage_layers": "auto"}),
    ("gpt", (1, 3, 1), {**PH, **mb(4), "parallel.stage_layers": (3, 3, 2),
                        "model.vocab_size": 100}),     # the head unspread, in the last stage's F
    # ... interleaved: v chunks a stage, Megatron's order within each kind of row
    ("gpt", (1, 4, 1), {**PH2, **mb(4)}),                    # m = p, 1 layer per chunk
    ("gpt", (1, 2, 1), {**PH2, **mb(8), **SEL}),             # m = 4p: three rounds of groups
    ("gpt", (2, 2, 2), {**PH2, **mb(2, 2), **SG}),           # m = p
    ("llama", (1, 2, 4), {**PH, "parallel.virtual_stages": 4, **mb(4), **FULL}),
    ("llama", (2, 2, 1), {**PH2, **mb(4, 2), "parallel.stage_layers": (3, 1, 2, 2)}),
    ("gpt", (1, 4, 2), {**PH2, **mb(8), **DYN, **SG}),
    # the same with the first p - 1 partial backward rows split into B and W (zb-phased)
    ("gpt", (1, 4, 1), {**ZP, **mb(8)}),
    ("gpt", (2, 2, 2), {**ZP, **mb(2, 2), **SEL, **SG}),
    ("llama", (1, 2, 4), {**ZP, **mb(4), **FULL}),
    ("llama", (2, 4, 1), {**ZP, **mb(4, 2), **SEL, "parallel.stage_layers": "auto"}),
    ("gpt", (1, 4, 1), {**ZP, **mb(2)}),                     # m = 2 < p - 1 split backwards
    ("llama", (1, 4, 2), {**ZP, **mb(4), **DYN}),
    ("gpt", (1, 3, 1), {**ZP, **mb(4), "parallel.stage_layers": (3, 3, 2),
                        "model.vocab_size": 100}),     # the head unspread, in the last stage's F
    ("gpt", (1, 4, 1), {**ZP, "parallel.virtual_stages": 2, **mb(4)}),   # ... interleaved
    ("llama", (2, 2, 2), {**ZP, "parallel.virtual_stages": 2, **mb(2, 2), **SEL, **SG}),
    ("gpt", (1, 2, 1), {**ZP, "parallel.virtual_stages": 2, **mb(8), **FULL}),
    # the residual stash the other way round from tuning.static_stash=auto: indexed per tick
    # for 1f1b and 1f1b-phased, a buffer per slot for the others
    ("gpt", (1, 4, 1), {**F1, **mb(8), **DYN}),
    ("gpt", (2, 2, 2), {**PH, **mb(2, 2), **SEL, **SG, **DYN}),
    ("gpt", (1, 2, 1), {**GP, **mb(4), **STAT}),
    ("gpt", (1, 2, 4), {**I4, **mb(4), **SG, **STAT}),
    ("gpt", (2, 2, 2), {**I2, **mb(2, 2), **SEL, **STAT}),
    ("llama", (2, 4, 1), {**ZB, **mb(4, 2), **SEL, **STAT}),
    ("llama", (2, 2, 1), {**ZV, **mb(2, 2), "parallel.stage_layers": (3, 1, 2, 2), **STAT}),
    # more phased tables: the steady forward row's message filed after the backward row's op
    # (decisions.overlap_p2p), on more meshes
    ("gpt", (1, 4, 1), {**PH, **mb(8)}),
    ("gpt", (2, 2, 2), {**PH2, **mb(2, 2), **SEL, **SG}),
    ("llama", (2, 4, 1), {**ZP, **mb(4, 2), **SEL}),
    ("gpt", (1, 2, 4), {**ZP, "parallel.virtual_stages": 2, **mb(8), **FULL, **DYN}),
    ("llama", (1, 4, 2), {**PH2, **mb(8)}),
    # a padded vocabulary (128) that 3 stages cannot share: the head stays on the last stage
    ("gpt", (1, 3, 1), {**F1, **mb(4), "parallel.stage_layers": (3, 3, 2), "model.vocab_size": 100}),
    ("llama", (2, 3, 1), {**F1, **mb(2, 2), "parallel.stage_layers": "auto",
                          "model.vocab_size": 100, **SEL}),
    # grouped-query attention (model.num_kv_heads < num_heads = 8), key/value heads over 'tensor'
    ("llama", (2, 2, 2), {**I2, **mb(2, 2), "model.num_kv_heads": 2, **SG}),
    ("llama", (1, 2, 4), {**F1, **mb(4), "model.num_kv_heads": 4, **FULL}),
    ("llama", (1, 4, 1), {**GP, **mb(4), "model.num_kv_heads": 1,
                          "parallel.stage_layers": (2, 3, 1, 2)}),
]


def _id(case):
    arch, mesh, o = case
    tags = [o.get("parallel.schedule", "1f1b")]
    if "parallel.virtual_stages" in o:
        tags.append(f"v{o['parallel.virtual_stages']}")
    tags.append(f"mb{o['train.micro_batch_size']}")
    if "model.vocab_size" in o:
        tags.append(f"V{o['model.vocab_size']}")
    if "model.num_kv_heads" in o:
        tags.append(f"kv{o['model.num_kv_heads']}")
    if "train.recompute" in o:
        tags.append(o["train.recompute"])
    if o.get("parallel.scatter_gather"):
        tags.append("sg")
    if "tuning.static_stash" in o:
        tags.append("static" if o["tuning.static_stash"] else "dyn")
    if "parallel.stage_layers" in o:
        sl = o["parallel.stage_layers"]
        tags.append("layers-" + (sl if isinstance(sl, str) else "".join(map(str, sl))))
    return f"{arch}-{'x'.join(map(str, mesh))}-{'-'.join(tags)}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_pipeline_parity(case):
    arch, mesh, overrides = case
    cfg = tiny_config(arch, mesh, **overrides)
    batch_key = tuple((k, v) for k, v in overrides.items()
                      if k in ("train.global_batch_size", "model.vocab_size",
                               "model.num_kv_heads"))
    ref = reference(arch, batch_key)
    assert_close(loss_and_grads(cfg), ref)
