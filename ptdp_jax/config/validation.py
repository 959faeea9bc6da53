"""Validation of a config tree: every constraint checked before anything compiles; a
violation raises ConfigError naming the key and the numbers. `CHECKS` is the table: each check
looks at one topic and raises at its first violation."""
from __future__ import annotations

import os
from pathlib import Path

from ptdp_jax.config import decisions as D
from ptdp_jax.config.load import CHOICES, Config, ConfigError
from ptdp_jax.config.schema import ModelConfig
from ptdp_jax.paths import unwritable

TRISTATE = (True, False, "auto")
POSITIVE = ("model.num_layers", "model.hidden_size", "model.num_heads", "model.vocab_size",
            "model.seq_len", "train.steps", "train.global_batch_size", "train.micro_batch_size",
            "parallel.data", "parallel.pipe", "parallel.tensor", "parallel.virtual_stages",
            "train.eval_batches", "checkpoint.keep", "train.fp8_amax_history", "train.log_every")
NON_NEGATIVE = ("train.warmup_steps", "train.eval_every", "train.sample_tokens",
                "checkpoint.every", "train.weight_decay", "train.grad_clip", "model.dropout",
                "train.stop_at_step", "train.stop_after_minutes", "train.seed")


def need(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _value(cfg, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _choices(cfg, n):
    for key, allowed in CHOICES.items():
        value = _value(cfg, key)
        need(any(value is a or (type(value) is type(a) and value == a) for a in allowed),
             f"{key}={value!r} is not one of {list(allowed)}")
    for key in ("tuning.static_stash", "tuning.scan_layers", "tuning.keep_ffn_activation",
                "tuning.overlap_grad_reduce", "tuning.tp_comm_overlap"):
        value = _value(cfg, key)
        need(value in TRISTATE, f"{key} must be true, false or auto, got {value!r}")
    need(isinstance(cfg.train.fp8, bool), f"train.fp8 must be true or false, got {cfg.train.fp8!r}")


def _ranges(cfg, n):
    for key in POSITIVE:
        need(_value(cfg, key) >= 1, f"{key} must be positive, got {_value(cfg, key)}")
    for key in NON_NEGATIVE:
        need(_value(cfg, key) >= 0, f"{key} must be >= 0, got {_value(cfg, key)}")
    t, m = cfg.train, cfg.model
    need(t.lr > 0, f"train.lr must be positive, got {t.lr}")
    if t.decay_steps is not None:
        need(t.decay_steps >= 1, f"train.decay_steps must be positive, got {t.decay_steps}")
    need(0 <= t.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}")
    need(0 < t.decay_fraction <= 1, f"train.decay_fraction must be in (0, 1], got {t.decay_fraction}")
    need(len(t.adam_betas) == 2 and all(0 <= b < 1 for b in t.adam_betas),
         f"train.adam_betas must be two numbers in [0, 1) (beta1, beta2), got {list(t.adam_betas)}")
    need(m.dropout < 1, f"model.dropout must be < 1, got {m.dropout}")
    for key in ("model.rope_theta", "model.norm_eps", "model.init_std"):
        need(_value(cfg, key) > 0, f"{key} must be positive, got {_value(cfg, key)}")
    need(m.ffn >= 1, f"model.ffn_hidden_size must be positive, got {m.ffn}")
    need(0 < cfg.data.val_fraction < 1,
         f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}")
    need(not isinstance(cfg.run.compile_cache, str) or cfg.run.compile_cache.strip() != "",
         f"run.compile_cache must be auto, off or a directory, got {cfg.run.compile_cache!r}")


def _heads(cfg, n):
    m = cfg.model
    if m.num_kv_heads is not None:
        need(m.arch == "llama", f"model.num_kv_heads={m.num_kv_heads}: grouped-query attention "
                                f"is for model.arch=llama (GPT has num_heads key/value heads)")
        need(m.num_kv_heads >= 1, f"model.num_kv_heads must be positive, got {m.num_kv_heads}")
        need(m.num_heads % m.num_kv_heads == 0,
             f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads="
             f"{m.num_kv_heads} (each key/value head serves a whole group of query heads)")
    need(m.hidden_size % m.num_heads == 0,
         f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    if m.arch == "llama":
        need(m.head_dim % 2 == 0, f"llama needs an even head dim, got "
                                  f"model.hidden_size/model.num_heads = {m.head_dim}")


ROPE_SCALING = ("model.rope_scaling_factor", "model.rope_low_freq_factor",
                "model.rope_high_freq_factor", "model.rope_original_seq_len")


def _rope(cfg, n):
    """LLaMA-3.1's rope scaling: factor >= 1, high > low > 0, a positive original context;
    GPT (learned positions) keeps the keys' defaults."""
    m = cfg.model
    if m.arch != "llama":
        for key in ROPE_SCALING:
            default = getattr(ModelConfig(), key.split(".")[1])
            need(_value(cfg, key) == default,
                 f"{key}={_value(cfg, key)}: rope scaling is for model.arch=llama (GPT has "
                 f"learned positions); leave it at {default}")
        return
    need(m.rope_scaling_factor >= 1,
         f"model.rope_scaling_factor must be >= 1 (1: no scaling), got {m.rope_scaling_factor}")
    need(m.rope_low_freq_factor > 0,
         f"model.rope_low_freq_factor must be positive, got {m.rope_low_freq_factor}")
    need(m.rope_high_freq_factor > m.rope_low_freq_factor,
         f"model.rope_high_freq_factor={m.rope_high_freq_factor} must be greater than "
         f"model.rope_low_freq_factor={m.rope_low_freq_factor}")
    need(m.rope_original_seq_len >= 1,
         f"model.rope_original_seq_len must be positive, got {m.rope_original_seq_len}")


FAKE_DEVICES_AT_MOST = 64      # a CPU mesh worth trying; larger ones are for a cluster


def _devices(cfg, num_devices):
    d, pp, tp = cfg.parallel.mesh_shape
    n = cfg.parallel.num_devices
    if num_devices is None or n <= num_devices:
        return
    if n <= FAKE_DEVICES_AT_MOST:
        how = (f"on a CPU, fake devices come from XLA_FLAGS="
               f"--xla_force_host_platform_device_count={n}, set before JAX starts; on GPUs give "
               f"a mesh of at most {num_devices} devices, or none for the planner's layout")
    else:
        how = (f"a mesh for a cluster: `ptdp-plan CONFIG --gpus {n}` plans it without the "
               f"devices; to run the model here give a mesh of at most {num_devices} devices "
               f"(--mesh d,p,t) with a model that fits them")
    c = cfg.parallel.context
    mesh = (f"mesh (data, pipe, tensor) = ({d}, {pp}, {tp})" if c == 1 else
            f"mesh (data, pipe, tensor) = ({d}, {pp}, {tp}) with parallel.context={c}")
    need(False, f"{mesh} needs {n} devices, only {num_devices} available ({how})")


def _tensor_split(cfg, n):
    m, tp = cfg.model, cfg.parallel.tensor
    need(m.num_heads % tp == 0,
         f"model.num_heads={m.num_heads} is not divisible by parallel.tensor={tp}")
    need(m.kv_heads % tp == 0,
         f"model.num_kv_heads={m.kv_heads} is not divisible by parallel.tensor={tp} (key/value "
         f"heads are split over the tensor-parallel devices)")
    need(m.ffn % tp == 0, f"model.ffn_hidden_size={m.ffn} is not divisible by parallel.tensor={tp}")
    need(m.padded_vocab_size % tp == 0,
         f"padded vocabulary {m.padded_vocab_size} (model.vocab_size={m.vocab_size} rounded up to "
         f"a multiple of 128) is not divisible by parallel.tensor={tp}")
    if cfg.parallel.scatter_gather:
        need(m.hidden_size % tp == 0, f"parallel.scatter_gather splits stage messages over "
                                      f"parallel.tensor={tp}, which must divide "
                                      f"model.hidden_size={m.hidden_size}")
    if cfg.parallel.sequence_parallel and tp > 1:
        need(m.seq_len % tp == 0, f"parallel.sequence_parallel splits the sequence over "
                                  f"parallel.tensor={tp}, which must divide "
                                  f"model.seq_len={m.seq_len}")


def _grad_reduce(cfg, n):
    p, ogr = cfg.parallel, cfg.tuning.overlap_grad_reduce
    need(ogr is not True or (p.zero in (1, 2, 3) and p.pipe == 1),
         f"tuning.overlap_grad_reduce=true needs parallel.zero=1, 2 or 3 without pipelining, got "
         f"parallel.zero={p.zero}, parallel.pipe={p.pipe}: zero=0 all-reduces after the backward "
         f"(its per-layer all-reduce runs slower) and a pipeline reduce-scatters after its last "
         f"tick")
    need(ogr is not False or p.zero not in (2, 3) or p.pipe > 1,
         f"tuning.overlap_grad_reduce=false with parallel.zero={p.zero} and parallel.pipe=1: "
         f"ZeRO-{p.zero} reduce-scatters each layer's gradient in its backward, no full-size "
         f"gradient is kept to reduce later (parallel.zero=1 reduces after the backward)")


def _schedule(cfg, n):
    p = cfg.parallel
    v, pp = p.virtual_stages, p.pipe
    if p.schedule == "interleaved":
        need(v >= 2, f"parallel.schedule=interleaved needs parallel.virtual_stages >= 2, got {v}")
        need(pp >= 2, f"parallel.schedule=interleaved needs parallel.pipe >= 2 (without a "
                      f"pipeline there is nothing to interleave), got parallel.pipe={pp}")
    elif p.schedule == "zb-v":
        need(v == 2, f"parallel.schedule=zb-v places two model chunks per stage in a V: it "
                     f"needs parallel.virtual_stages=2, got {v}")
        need(pp >= 2, f"parallel.schedule=zb-v needs parallel.pipe >= 2, got parallel.pipe={pp}")
    elif p.schedule in D.PHASED and v > 1:
        need(pp >= 2, f"parallel.schedule={p.schedule} with parallel.virtual_stages={v} needs "
                      f"parallel.pipe >= 2, got parallel.pipe={pp}")
    else:
        need(v == 1, f"parallel.virtual_stages={v} needs parallel.schedule=interleaved, "
                     f"1f1b-phased, zb-phased or zb-v (got {p.schedule!r})")


def _stage_layers(cfg, n):
    m, p = cfg.model, cfg.parallel
    sl, chunks, pv = p.stage_layers, p.pipe * p.virtual_stages, f"{p.pipe} x {p.virtual_stages}"
    if isinstance(sl, str):
        need(sl == "auto", f"parallel.stage_layers={sl!r} is neither 'auto' nor a list of "
                           f"{chunks} layer counts")
        need(m.num_layers >= chunks, f"parallel.stage_layers=auto needs at least one layer per "
                                     f"model chunk: model.num_layers={m.num_layers} < parallel.pipe"
                                     f" x parallel.virtual_stages = {pv} = {chunks}")
    elif sl:
        need(len(sl) == chunks, f"parallel.stage_layers has {len(sl)} entries {list(sl)}; it "
                                f"needs parallel.pipe x parallel.virtual_stages = {pv} = {chunks}"
                                f" (one per model chunk, in chunk order)")
        need(all(k >= 1 for k in sl), f"parallel.stage_layers={list(sl)}: every chunk needs at "
                                      f"least one layer")
        need(sum(sl) == m.num_layers, f"parallel.stage_layers={list(sl)} sums to {sum(sl)}, not "
                                      f"model.num_layers={m.num_layers}")
    else:
        need(m.num_layers % chunks == 0,
             f"model.num_layers={m.num_layers} is not divisible by parallel.pipe x "
             f"parallel.virtual_stages = {pv} = {chunks} (or set parallel.stage_layers to "
             f"a list of {chunks} counts, or to auto)")


def _batch(cfg, n):
    t, p = cfg.train, cfg.parallel
    need(t.global_batch_size % (t.micro_batch_size * p.data) == 0,
         f"train.global_batch_size={t.global_batch_size} is not divisible by "
         f"train.micro_batch_size x parallel.data = {t.micro_batch_size} x {p.data} = "
         f"{t.micro_batch_size * p.data}")
    v, mb = p.virtual_stages, cfg.num_microbatches
    if p.schedule == "interleaved" or (p.schedule in D.PHASED and v > 1):
        need(mb % p.pipe == 0, f"parallel.schedule={p.schedule} with parallel.virtual_stages={v} "
                               f"needs the number of microbatches (train.global_batch_size / "
                               f"(train.micro_batch_size x parallel.data) = {mb}) to be a "
                               f"multiple of parallel.pipe={p.pipe}")


def _recompute(cfg, n):
    keep, r = cfg.tuning.keep_ffn_activation, cfg.train.recompute
    need(keep is not True or r in ("selective", "offload", "auto"),
         f"tuning.keep_ffn_activation keeps what selective recomputation would run again: it "
         f"needs train.recompute=selective or offload (got {r!r}; none keeps it already, full "
         f"keeps only the layer inputs)")


def _tp_comm_overlap(cfg, n):
    t, p, tu = cfg.train, cfg.parallel, cfg.tuning
    if tu.tp_comm_overlap is not True:
        return
    need(p.sequence_parallel and p.tensor > 1,
         f"tuning.tp_comm_overlap decomposes sequence parallelism's collectives: it needs "
         f"parallel.sequence_parallel=true and parallel.tensor > 1 (got "
         f"sequence_parallel={p.sequence_parallel}, tensor={p.tensor})")
    need(p.pipe == 1,
         f"tuning.tp_comm_overlap runs without pipelining (got parallel.pipe={p.pipe}): its "
         f"permutes would sit in the pipeline's per-stage branches, where XLA's fast "
         f"permutes (copies) give wrong results while another stage idles and NCCL's are "
         f"slower than no ring (4x H200, 2026-11-28)")
    need(not D.scan_layers(cfg),
         f"tuning.tp_comm_overlap needs the layers unrolled (got tuning.scan_layers="
         f"{tu.scan_layers}, parallel.zero={p.zero}; auto scans with zero=3: set "
         f"tuning.scan_layers=false)")


def _data(cfg, n):
    for key in ("data.path", "data.val_path"):
        for path in _value(cfg, key):
            prefix = Path(os.path.expanduser(path))
            need(prefix.with_name(prefix.name + ".bin").is_file() or prefix.is_file(),
                 f"{key} {path!r}: no token file {prefix}.bin (make one with "
                 f"ptdp-prepare-data)")
    w = cfg.data.weights
    if w:
        need(len(w) == len(cfg.data.path),
             f"data.weights has {len(w)} entries but data.path has {len(cfg.data.path)}")
        need(all(x >= 0 for x in w) and sum(w) > 0,
             f"data.weights must be >= 0 with a positive sum, got {list(w)}")


def _context(cfg, n):
    c, m = cfg.parallel.context, cfg.model
    need(c >= 1, f"parallel.context must be positive, got {c}")
    if c == 1:
        return
    need(m.seq_len % (2 * c) == 0,
         f"model.seq_len={m.seq_len} is not divisible by 2 x parallel.context = {2 * c} "
         f"(each of the {c} devices holds two of {2 * c} equal chunks of a sequence)")
    need(m.dropout == 0, f"model.dropout={m.dropout} with parallel.context={c}: dropout under "
                         f"context parallelism is not supported; set model.dropout=0")


def _resume_step(cfg, n):
    c = cfg.checkpoint
    if c.resume_step is None:
        return
    need(c.resume_step >= 0, f"checkpoint.resume_step must be >= 0, got {c.resume_step}")
    need(bool(c.dir), f"checkpoint.resume_step={c.resume_step} resumes from a checkpoint of "
                      f"checkpoint.dir, which is not set")
    need(c.resume is not False,
         f"checkpoint.resume_step={c.resume_step} resumes from that checkpoint and "
         f"checkpoint.resume=false starts fresh: drop one of them")


CHECKS = (_choices, _ranges, _context, _devices, _heads, _rope, _tensor_split, _grad_reduce,
          _schedule, _stage_layers, _batch, _recompute, _tp_comm_overlap, _data, _resume_step)


def validate(cfg: Config, num_devices: int | None = None) -> Config:
    """Every check of CHECKS, in order; ConfigError at the first violation, naming the key and
    the numbers. Returns cfg."""
    for check in CHECKS:
        check(cfg, num_devices)
    return cfg


FP8_MIN_CAPABILITY = (8, 9)     # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later


def check_devices(cfg: Config, devices) -> None:
    """What cfg asks of the devices at hand, before compiling (ConfigError naming them):
    FP8 tensor cores for train.fp8 (a CPU emulates them, with one warning), and cuDNN in
    16-bit compute for tuning.attention=cudnn."""
    if not devices:
        return
    dev = devices[0]
    if cfg.tuning.attention == "cudnn":
        need(dev.platform == "gpu",
             f"tuning.attention=cudnn needs cuDNN, on a GPU; the devices here are "
             f"{dev.platform} ({dev.device_kind}): set tuning.attention=auto")
        need(cfg.train.dtype in ("bfloat16", "float16"),
             f"tuning.attention=cudnn needs 16-bit compute (cuDNN's flash attention takes no "
             f"{cfg.train.dtype}): set train.dtype=bfloat16 or tuning.attention=auto")
    if not cfg.train.fp8:
        return
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


def check_directories(cfg: Config) -> None:
    """Before compiling: run.dir and run.compile_cache's directory (auto's too) can take
    files (ConfigError naming the key, the directory and why not)."""
    need(bool(str(cfg.run.dir).strip()), "run.dir is empty: give the folder the run's metrics, "
                                         "TensorBoard events and resolved config go to (default "
                                         "runs/latest)")
    directory = Path(os.path.expanduser(cfg.run.dir)).absolute()
    why = unwritable(directory)
    need(why is None, f"run.dir={cfg.run.dir!r}: {directory} {why}")
    _check_compile_cache(cfg.run.compile_cache)


def _check_compile_cache(value) -> None:
    """ConfigError where run.compile_cache's directory (auto: JAX's own, else
    decisions.compile_cache_dir's default) cannot take files."""
    import jax
    jax_dir = jax.config.jax_compilation_cache_dir
    path = D.compile_cache_dir(value, jax_dir)
    why = path and unwritable(Path(path))
    if not why:
        return
    if value in (True, "auto"):
        origin = "JAX_COMPILATION_CACHE_DIR" if jax_dir else "the default, under " \
            "$XDG_CACHE_HOME or ~/.cache"
        raise ConfigError(f"run.compile_cache=auto: {path} ({origin}) {why}; set "
                          f"run.compile_cache=off, or run.compile_cache=DIR a folder that can "
                          f"be written")
    raise ConfigError(f"run.compile_cache={value!r}: {path} {why}")
