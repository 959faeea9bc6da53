"""Validation of a config tree: every constraint checked before anything compiles; a
violation raises ConfigError naming the key and the numbers."""
from __future__ import annotations

import os
from pathlib import Path

from ptdp_jax.config import CHOICES, Config, ConfigError
from ptdp_jax.config_tree import NCCL_MAX_CHANNELS


def validate(cfg: Config, num_devices: int | None = None) -> Config:
    """Check every constraint; raise ConfigError naming the key and numbers."""
    m, t, p = cfg.model, cfg.train, cfg.parallel

    def need(ok: bool, msg: str):
        if not ok:
            raise ConfigError(msg)

    for key, allowed in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        need(value in allowed, f"{key}={value!r} is not one of {list(allowed)}")
    for key in ("model.num_layers", "model.hidden_size", "model.num_heads", "model.vocab_size",
                "model.seq_len", "train.steps", "train.global_batch_size",
                "train.micro_batch_size", "parallel.data", "parallel.pipe", "parallel.tensor",
                "parallel.virtual_stages", "train.eval_batches", "train.max_bad_steps",
                "checkpoint.keep"):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        need(value >= 1, f"{key} must be positive, got {value}")
    for key in ("train.warmup_steps", "train.eval_every", "train.sample_tokens", "checkpoint.every",
                "train.weight_decay", "train.grad_clip", "model.dropout", "train.stop_at_step",
                "train.stop_after_minutes", "train.sample_temperature", "train.sample_top_k"):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        need(value >= 0, f"{key} must be >= 0, got {value}")
    need(t.lr > 0, f"train.lr must be positive, got {t.lr}")
    if t.decay_steps is not None:
        need(t.decay_steps >= 1, f"train.decay_steps must be positive, got {t.decay_steps}")
    if m.num_kv_heads is not None:
        need(m.arch == "llama", f"model.num_kv_heads={m.num_kv_heads}: grouped-query attention "
                                f"is for model.arch=llama (GPT has num_heads key/value heads)")
        need(m.num_kv_heads >= 1, f"model.num_kv_heads must be positive, got {m.num_kv_heads}")
        need(m.num_heads % m.num_kv_heads == 0,
             f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads="
             f"{m.num_kv_heads} (each key/value head serves a whole group of query heads)")
    need(0 <= t.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}")
    need(0 < t.decay_fraction <= 1, f"train.decay_fraction must be in (0, 1], got {t.decay_fraction}")
    need(m.dropout < 1, f"model.dropout must be < 1, got {m.dropout}")
    need(m.ffn >= 1, f"model.ffn_hidden_size must be positive, got {m.ffn}")
    need(0 < cfg.data.val_fraction < 1, f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}")
    need(not isinstance(cfg.run.compile_cache, str) or cfg.run.compile_cache.strip() != "",
         f"run.compile_cache must be auto, off or a directory, got {cfg.run.compile_cache!r}")

    d, pp, tp = p.mesh_shape
    n = d * pp * tp
    if num_devices is not None:
        need(n <= num_devices, f"mesh (data, pipe, tensor) = ({d}, {pp}, {tp}) needs {n} devices, "
                               f"only {num_devices} available (on a CPU, fake devices come from "
                               f"XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    need(m.hidden_size % m.num_heads == 0,
         f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    if m.arch == "llama":
        need(m.head_dim % 2 == 0, f"llama needs an even head dim, got "
                                  f"model.hidden_size/model.num_heads = {m.head_dim}")
    need(m.num_heads % tp == 0,
         f"model.num_heads={m.num_heads} is not divisible by parallel.tensor={tp}")
    need(m.kv_heads % tp == 0,
         f"model.num_kv_heads={m.kv_heads} is not divisible by parallel.tensor={tp} (key/value "
         f"heads are split over the tensor-parallel devices)")
    need(m.ffn % tp == 0, f"model.ffn_hidden_size={m.ffn} is not divisible by parallel.tensor={tp}")
    need(m.padded_vocab_size % tp == 0,
         f"padded vocabulary {m.padded_vocab_size} (model.vocab_size={m.vocab_size} rounded up to "
         f"a multiple of 128) is not divisible by parallel.tensor={tp}")
    need(t.scan_layers in (True, False, "auto"),
         f"train.scan_layers must be true, false or auto, got {t.scan_layers!r}")
    need(p.static_stash in (True, False, "auto"),
         f"parallel.static_stash must be true, false or auto, got {p.static_stash!r}")
    ogr = p.overlap_grad_reduce
    need(ogr is True or ogr is False or ogr == "auto",
         f"parallel.overlap_grad_reduce must be true, false or auto, got {ogr!r}")
    need(ogr is not True or (p.zero in (1, 2, 3) and pp == 1),
         f"parallel.overlap_grad_reduce=true needs parallel.zero=1, 2 or 3 without pipelining, got "
         f"parallel.zero={p.zero}, parallel.pipe={pp}: zero=0 all-reduces after the backward (its "
         f"per-layer all-reduce runs slower) and a pipeline "
         f"reduce-scatters after its last tick")
    need(ogr is not False or p.zero not in (2, 3) or pp > 1,
         f"parallel.overlap_grad_reduce=false with parallel.zero={p.zero} and parallel.pipe=1: "
         f"ZeRO-{p.zero} reduce-scatters each layer's gradient in its backward, no full-size "
         f"gradient is kept to reduce later (parallel.zero=1 reduces after the backward)")
    v = p.virtual_stages
    if p.schedule == "interleaved":
        need(v >= 2, f"parallel.schedule=interleaved needs parallel.virtual_stages >= 2, got {v}")
        need(pp >= 2, f"parallel.schedule=interleaved needs parallel.pipe >= 2 (without a "
                      f"pipeline there is nothing to interleave), got parallel.pipe={pp}")
    elif p.schedule == "zb-v":
        need(v == 2, f"parallel.schedule=zb-v places two model chunks per stage in a V: it "
                     f"needs parallel.virtual_stages=2, got {v}")
        need(pp >= 2, f"parallel.schedule=zb-v needs parallel.pipe >= 2, got parallel.pipe={pp}")
    elif p.schedule in ("1f1b-phased", "zb-phased") and v > 1:
        need(pp >= 2, f"parallel.schedule={p.schedule} with parallel.virtual_stages={v} needs "
                      f"parallel.pipe >= 2, got parallel.pipe={pp}")
    else:
        need(v == 1, f"parallel.virtual_stages={v} needs parallel.schedule=interleaved, "
                     f"1f1b-phased, zb-phased or zb-v (got {p.schedule!r})")
    sl = p.stage_layers
    if isinstance(sl, str):
        need(sl == "auto", f"parallel.stage_layers={sl!r} is neither 'auto' nor a list of "
                           f"{pp * v} layer counts")
        need(m.num_layers >= pp * v, f"parallel.stage_layers=auto needs at least one layer per "
                                     f"model chunk: model.num_layers={m.num_layers} < parallel.pipe"
                                     f" x parallel.virtual_stages = {pp} x {v} = {pp * v}")
    elif sl:
        need(len(sl) == pp * v, f"parallel.stage_layers has {len(sl)} entries {list(sl)}; it needs "
                                f"parallel.pipe x parallel.virtual_stages = {pp} x {v} = {pp * v}"
                                f" (one per model chunk, in chunk order)")
        need(all(n >= 1 for n in sl), f"parallel.stage_layers={list(sl)}: every chunk needs at "
                                      f"least one layer")
        need(sum(sl) == m.num_layers, f"parallel.stage_layers={list(sl)} sums to {sum(sl)}, not "
                                      f"model.num_layers={m.num_layers}")
    else:
        need(m.num_layers % (pp * v) == 0,
             f"model.num_layers={m.num_layers} is not divisible by parallel.pipe x "
             f"parallel.virtual_stages = {pp} x {v} = {pp * v} (or set parallel.stage_layers to "
             f"a list of {pp * v} counts, or to auto)")
    need(t.global_batch_size % (t.micro_batch_size * d) == 0,
         f"train.global_batch_size={t.global_batch_size} is not divisible by "
         f"train.micro_batch_size x parallel.data = {t.micro_batch_size} x {d} = "
         f"{t.micro_batch_size * d}")
    if p.schedule == "interleaved" or (p.schedule in ("1f1b-phased", "zb-phased") and v > 1):
        mb = cfg.num_microbatches
        need(mb % pp == 0, f"parallel.schedule={p.schedule} with parallel.virtual_stages={v} "
                           f"needs the number of microbatches (train.global_batch_size / "
                           f"(train.micro_batch_size x parallel.data) = {mb}) to be a multiple "
                           f"of parallel.pipe={pp}")
    if p.schedule == "zb-v" and v == 2 and pp >= 2:
        from ptdp_jax.pipeline.schedule import build_schedule
        try:        # the list scheduler's table, before any compile (cached for the executor)
            build_schedule("zb-v", pp, cfg.num_microbatches, 2)
        except RuntimeError as e:
            need(False, f"parallel.schedule=zb-v has no table for parallel.pipe={pp} and "
                        f"{cfg.num_microbatches} microbatches ({e}); try another number of "
                        f"microbatches or parallel.schedule=zb-h1")
    if p.scatter_gather:
        need(m.hidden_size % tp == 0, f"parallel.scatter_gather splits stage messages over "
                                      f"parallel.tensor={tp}, which must divide "
                                      f"model.hidden_size={m.hidden_size}")
    if p.sequence_parallel and tp > 1:
        need(m.seq_len % tp == 0, f"parallel.sequence_parallel splits the sequence over "
                                  f"parallel.tensor={tp}, which must divide "
                                  f"model.seq_len={m.seq_len}")
    need(t.keep_ffn_activation in (True, False, "auto"),
         f"train.keep_ffn_activation must be true, false or auto, got {t.keep_ffn_activation!r}")
    need(t.keep_ffn_activation is not True or t.recompute == "selective",
         f"train.keep_ffn_activation keeps what selective recomputation would run again: it "
         f"needs train.recompute=selective (got {t.recompute!r}; none keeps it already, full "
         f"keeps only the layer inputs)")
    need(p.nccl_channels == "auto" or (type(p.nccl_channels) is int
                                       and 0 <= p.nccl_channels <= NCCL_MAX_CHANNELS),
         f"parallel.nccl_channels must be auto or a number of channels from 0 (NCCL's own) "
         f"to {NCCL_MAX_CHANNELS}, got {p.nccl_channels!r}")
    need(p.overlap_p2p in (True, False, "auto"),
         f"parallel.overlap_p2p must be true, false or auto, got {p.overlap_p2p!r}")
    if p.overlap_p2p is True:
        need(pp > 1 and p.schedule in ("1f1b-phased", "zb-phased"),
             f"parallel.overlap_p2p overlaps the phased schedules' forward messages with their "
             f"backward rows: it needs parallel.pipe > 1 and parallel.schedule 1f1b-phased or "
             f"zb-phased (got pipe={pp}, schedule={p.schedule!r})")
    need(p.zero_ring in (True, False, "auto"),
         f"parallel.zero_ring must be true, false or auto, got {p.zero_ring!r}")
    if p.zero_ring is True:
        need(p.zero >= 1 and p.data > 1,
             f"parallel.zero_ring runs ZeRO's gathers and reduce-scatters over 'data' as rings: "
             f"it needs parallel.zero >= 1 and parallel.data > 1 (got zero={p.zero}, "
             f"data={p.data})")
        need(not (cfg.scan_layers_on and tp > 1),
             f"parallel.zero_ring with parallel.tensor > 1 needs the layers unrolled (got "
             f"train.scan_layers={t.scan_layers}, parallel.zero={p.zero}, tensor={tp}; auto "
             f"scans with zero=3: set train.scan_layers=false)")
    need(p.tp_overlap_sends in ("ring", "direct"),
         f"parallel.tp_overlap_sends must be ring or direct, got {p.tp_overlap_sends!r}")
    need(isinstance(t.fp8, bool), f"train.fp8 must be true or false, got {t.fp8!r}")
    need(not (t.fp8 and p.tp_comm_overlap is True),
         "train.fp8 with parallel.tp_comm_overlap=true: the overlap rings' blockwise GEMMs take "
         "no FP8 operands; set parallel.tp_comm_overlap=auto (off with FP8) or false")
    need(p.tp_comm_overlap in (True, False, "auto"),
         f"parallel.tp_comm_overlap must be true, false or auto, got {p.tp_comm_overlap!r}")
    if p.tp_comm_overlap is True:
        need(p.sequence_parallel and tp > 1,
             f"parallel.tp_comm_overlap decomposes sequence parallelism's collectives: it needs "
             f"parallel.sequence_parallel=true and parallel.tensor > 1 (got "
             f"sequence_parallel={p.sequence_parallel}, tensor={tp})")
        need(pp == 1,
             f"parallel.tp_comm_overlap runs without pipelining (got parallel.pipe={pp}): its "
             f"permutes would sit in the pipeline's per-stage branches, where XLA's fast "
             f"permutes (copies) give wrong results while another stage idles and NCCL's are "
             f"slower than no ring (4x H200, 2026-11-28)")
        need(not cfg.scan_layers_on,
             f"parallel.tp_comm_overlap needs the layers unrolled (got train.scan_layers="
             f"{t.scan_layers}, parallel.zero={p.zero}; auto scans with zero=3: set "
             f"train.scan_layers=false)")
    for path in cfg.data.path:
        prefix = Path(os.path.expanduser(path))
        need(prefix.with_name(prefix.name + ".bin").is_file() or prefix.is_file(),
             f"data.path {path!r}: no token file {prefix}.bin (make one with ptdp-prepare-data)")
    if cfg.data.weights:
        need(len(cfg.data.weights) == len(cfg.data.path),
             f"data.weights has {len(cfg.data.weights)} entries but data.path has "
             f"{len(cfg.data.path)}")
        need(all(w >= 0 for w in cfg.data.weights) and sum(cfg.data.weights) > 0,
             f"data.weights must be >= 0 with a positive sum, got {list(cfg.data.weights)}")
    return cfg


FP8_MIN_CAPABILITY = (8, 9)     # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later


def check_fp8_devices(cfg: Config, devices) -> None:
    """train.fp8 on the devices at hand, before compiling: a GPU without FP8 tensor cores is
    refused (ConfigError naming it); on a CPU the FP8 GEMMs are emulated (slow), with one warning."""
    if not cfg.train.fp8 or not devices:
        return
    dev = devices[0]
    if dev.platform == "gpu":
        cap = getattr(dev, "compute_capability", None)
        major, minor = (int(x) for x in str(cap).split(".")[:2]) if cap else (0, 0)
        if (major, minor) < FP8_MIN_CAPABILITY:
            raise ConfigError(
                f"train.fp8=true needs FP8 tensor cores (compute capability 8.9 or higher); "
                f"{dev.device_kind} has {major}.{minor}: set train.fp8=false")
    elif dev.platform == "cpu":
        import warnings
        warnings.warn("train.fp8=true on CPU: the FP8 GEMMs are emulated (slow); the numbers "
                      "are those of a GPU's FP8 GEMMs", stacklevel=2)
