"""Every decision the code makes for the user, one short function each: the rule, and the
measurement behind it in a line. `auto` values of the config resolve here too (train.dtype,
train.recompute, parallel.layout, run.compile_cache, model.attention), and the `tuning.*` keys
(expert settings, docs/configuration.md) override a rule where it can be wrong on some machine.

The bottom layer: no ptdp_jax imports, so that the config tree, the models, the pipeline and
the step can all ask. Functions take the config (any object with its sections) and what they
need of the machine as arguments; `platform()` is jax's, asked only where a caller gives none.
"""
from __future__ import annotations

import os
import sys

# ----------------------------------------------------------------------------- the machine


def platform() -> str:
    """The platform of jax's first device ('gpu', 'cpu', ...)."""
    import jax
    return jax.devices()[0].platform


MEMORY_FRACTION = 0.92
ALLOCATOR_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                       "XLA_PYTHON_CLIENT_ALLOCATOR")


def memory_fraction(environ) -> float | None:
    """The share of a GPU's memory the commands let JAX's allocator take: MEMORY_FRACTION
    (0.92; JAX's own default is 0.75), the fraction ptdp-plan's GPU kinds plan with and every
    benchmark ran at (1-4 H200, 2026-11-26..29), leaving the rest to CUDA's libraries. None
    where the user set one of ALLOCATOR_VARIABLES: theirs is the limit then."""
    if any(environ.get(v) for v in ALLOCATOR_VARIABLES):
        return None
    return MEMORY_FRACTION


# ----------------------------------------------------------------------------- precision

def dtype(value: str, on: str | None = None) -> str:
    """train.dtype: auto is bfloat16 compute (float32 master weights) on GPUs, float32
    elsewhere. bf16 halves activation and message bytes and runs the GEMMs on tensor cores
    (1.3B: 0.51 s bf16 on 1x H200); CPUs have no fast bf16 GEMM."""
    if value != "auto":
        return value
    return "bfloat16" if (on or platform()) == "gpu" else "float32"


def attention(value: str, compute_dtype, on: str | None = None) -> str:
    """model.attention: auto is cuDNN's flash attention on GPUs in 16-bit compute (no s x s
    scores kept), XLA's elsewhere (cuDNN takes no float32; CPUs have no cuDNN)."""
    if value != "auto":
        return value
    import jax.numpy as jnp
    half = jnp.dtype(compute_dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if half and (on or platform()) == "gpu" else "xla"


def document_end(cfg) -> int | None:
    """data.document_mask: the token that ends a document (the data's eos_id), which the
    layers' attention does not look past; None without document masking."""
    if not cfg.data.document_mask:
        return None
    from ptdp_jax.data.sources import end_of_document
    return end_of_document(list(cfg.data.path))


# ----------------------------------------------------------------------------- recomputation

RECOMPUTE_ORDER = ("none", "selective", "full")     # fastest first


def recompute(value: str, fits=None) -> str:
    """train.recompute: auto is the least recomputation that fits, by the memory estimate
    (`fits(recompute) -> bool`; none, selective, full): none is the fastest where it fits
    (1x H100 1.3B 0.5386 s against selective's 0.5718 s, 2026-11-26). Without an estimate
    (no device asked: a config not resolved by train()) auto is none; nothing fits: full."""
    if value != "auto":
        return value
    if fits is None:
        return "none"
    return next((r for r in RECOMPUTE_ORDER if fits(r)), "full")


def keep_ffn_activation(cfg) -> bool:
    """Selective recomputation keeps the MLP activation's output (2 T f bytes a layer), not run
    again in the backward: -1.4% to -2.7% a step by layout (H100, H200, 2026-11-27).
    tuning.keep_ffn_activation=false runs it again (less memory)."""
    return cfg.tuning.keep_ffn_activation in (True, "auto")


def remat(cfg) -> str:
    """The layers' rematerialisation policy (models/model.py REMAT_POLICIES)."""
    r = recompute(cfg.train.recompute)
    return f"{r}+act" if r in ("selective", "offload") and keep_ffn_activation(cfg) else r


# ----------------------------------------------------------------------------- layers and stash

def scan_layers(cfg) -> bool:
    """Without pipelining the layers run unrolled (a scan copies every residual into stacked
    buffers: 1.3B 0.7801 s against 0.5386 s, 1x H100, 2026-11-26), except with zero=3, whose
    scan gathers one layer's weights at a time. tuning.scan_layers: true (shorter compiles) or
    false (zero=3 unrolled, each layer gathering its own weights)."""
    value = cfg.tuning.scan_layers
    if value == "auto":
        return cfg.parallel.zero == 3 and cfg.parallel.pipe == 1
    return bool(value)


STATIC_STASH_SCHEDULES = ("1f1b", "1f1b-phased", "zb-phased")


def static_stash(cfg) -> bool:
    """Pipelines keep the residual stash as a buffer per slot and a switch branch per (op, slot)
    where the branches stay few (1f1b and the phased tables): no per-tick copies (1.3B (1,2,1)
    1f1b 0.4172 s against 0.4205 s, 2x H100, 2026-11-26); gpipe (branches grow with m),
    interleaved, zb-v (2-3x the compile time) and zb-h1 index one buffer.
    tuning.static_stash overrides it."""
    value = cfg.tuning.static_stash
    if value == "auto":
        return cfg.parallel.schedule in STATIC_STASH_SCHEDULES
    return bool(value)


def stash_chunk_pools(cfg) -> bool:
    """The stash slots in a pool per local chunk with the static stash at v > 1, where one
    shared pool would give a branch per (op, chunk, slot) (Schedule.chunk_pools)."""
    return static_stash(cfg) and cfg.parallel.virtual_stages > 1


def empty_buffers(cfg) -> bool:
    """Pipelines start their stash and message buffers uninitialised (no zero fill and copy a
    step: -0.8 ms, the same bits) where 'tensor' is 1; with tensor parallelism zeros, which
    XLA's partitioner needs to keep the buffers split."""
    return cfg.parallel.tensor == 1


PHASED = ("1f1b-phased", "zb-phased")


def overlap_p2p(cfg) -> bool:
    """The phased schedules file a forward row's message after the backward row's op, so its
    permute runs under that op (the same bits; -0.2 ms); the tick tables have no rows."""
    return cfg.parallel.pipe > 1 and cfg.parallel.schedule in PHASED


# ----------------------------------------------------------------------------- communication

def overlap_grad_reduce(cfg) -> bool:
    """ZeRO without pipelining reduce-scatters layer by layer inside the last backward: zero 2
    and 3 always (no full-size gradient outlives a layer), zero 1 unless
    tuning.overlap_grad_reduce=false (after the backward, as Megatron); zero 0 all-reduces after
    the backward (its per-layer all-reduce ran slower), and so does a pipeline after its ticks."""
    p = cfg.parallel
    if p.zero == 0 or p.pipe > 1:
        return False
    return p.zero in (2, 3) or cfg.tuning.overlap_grad_reduce in (True, "auto")


def tp_comm_overlap(cfg) -> bool:
    """Sequence parallelism's collectives as rings of permutes around the GEMMs (models/
    tp_overlap.py), by the config: on for tensor > 1 without pipelining, unrolled layers and one
    microbatch a step (1.3B (1,1,4) micro 16 -4.3%, 4x H100, 2026-11-28), for BF16 steps: its
    gain is measured there (tuning.tp_comm_overlap=true runs it with FP8 operands too). The
    key overrides it; the devices' part is tp_comm_overlap_devices."""
    value, p = cfg.tuning.tp_comm_overlap, cfg.parallel
    if value != "auto":
        return bool(value)
    if cfg.train.fp8:
        return False
    m = cfg.train.global_batch_size // (cfg.train.micro_batch_size * p.data)
    return (p.sequence_parallel and p.tensor > 1 and p.pipe == 1 and not scan_layers(cfg)
            and m == 1)


def tp_comm_overlap_devices(cfg, groups_in_one_process_gpu: bool) -> bool:
    """The ring on the devices at hand: auto only on GPUs whose tensor groups each live in one
    process, where XLA's peer mode runs the permutes as copy-engine copies beside the GEMMs;
    across processes NCCL's permutes wait for the GEMMs' SMs (+22%), on CPU the ring only
    slows the step. tuning.tp_comm_overlap=true runs it anyway."""
    if not tp_comm_overlap(cfg):
        return False
    return cfg.tuning.tp_comm_overlap is True or groups_in_one_process_gpu


NCCL_CHANNELS_TENSOR = 64         # NCCL's MAXCHANNELS (2.28)


def nccl_environment(cfg, on: str, environ) -> dict[str, str]:
    """With tensor > 1 on GPUs NCCL gets NCCL_MIN_NCHANNELS=64: tensor parallelism's
    collectives run exposed, so their bandwidth is the step's (1.3B (1,1,4) SP 0.2065 ->
    0.1989 s, 7.5B -1.0%, 4x H200, 2026-11-27); data parallelism's run beside the compute and
    keep NCCL's choice. The override is the variable itself: one already set wins."""
    if on != "gpu" or cfg.parallel.tensor == 1 or "NCCL_MIN_NCHANNELS" in environ:
        return {}
    return {"NCCL_MIN_NCHANNELS": str(NCCL_CHANNELS_TENSOR)}


GATHER_COMBINE_BYTES = 512 * 2 ** 20    # XLA's all-gather combiner under zero 1 and 2
SCATTER_COMBINE_BYTES = 128 * 2 ** 20   # and its reduce-scatter combiner
PERMUTE_PEER_MODE = "COLLECTIVES_PEER_MEMORY"   # XLA's collective-permute as copy-engine copies


def xla_options(cfg, on: str, tp_ring: bool) -> dict:
    """XLA options of the train step, on GPU:
    - no dot merger: it fuses the separate q, k, v GEMMs back into one with slices around it
      (1.3B (1,2,1) 0.370 -> 0.354 s without, 2x H100, 2026-11-26);
    - with the static stash, region-based copy insertion: without it the 1f1b switch copies
      every stash buffer through every branch each tick;
    - with zero 1 or 2 (tensor 1), gathers combined up to 512 MB and reduce-scatters up to
      128 MB ((4,1,1) zero 2: 0.1504 s at XLA's default, 0.1454 s, 4x H200, 2026-11-27);
    - with the tensor ring (tp_ring), peer mode for permutes: copy-engine copies in a process;
    - with train.fp8, no Triton GEMMs: cuBLASLt's FP8 GEMMs only come from XLA's GEMM rewriter
      (LLaMA-7B shape, 8 layers: 0.3318 s with Triton GEMMs, 0.2292 s without, 1x H200)."""
    if on != "gpu":
        return {}
    options = {"xla_gpu_dot_merger_threshold_mb": 0}
    if cfg.parallel.pipe > 1 and static_stash(cfg):
        options["xla_gpu_copy_insertion_use_region_analysis"] = True
    if cfg.parallel.zero in (1, 2) and cfg.parallel.tensor == 1:
        options["xla_gpu_all_gather_combine_threshold_bytes"] = GATHER_COMBINE_BYTES
        options["xla_gpu_reduce_scatter_combine_threshold_bytes"] = SCATTER_COMBINE_BYTES
    if tp_ring:
        options["xla_gpu_collective_permute_mode"] = PERMUTE_PEER_MODE
    if cfg.train.fp8:
        options["xla_gpu_enable_triton_gemm"] = False
    return options


# ----------------------------------------------------------------------------- the layout

MESH_KEYS = ("parallel.data", "parallel.pipe", "parallel.tensor")
FILL_KEYS = ("parallel.schedule", "parallel.virtual_stages", "parallel.zero",
             "train.micro_batch_size", "train.recompute")


def layout_source(cfg, explicit: set, command_line: set, num_devices: int, on: str) -> str:
    """Where the run's layout comes from: 'written' (the config as it is) or why the planner
    (plan/search.py) picks it. parallel.layout=auto asks for it anywhere. On GPUs (the
    planner's cost model is of GPUs; its pick of the 1.3B on 2x H200, 0.2629 s, against the
    best hand-set 0.2594 s): a config that sets no mesh, or one whose mesh needs more devices
    than there are, gets the planner's best layout for the devices at hand; a mesh given on
    the command line gets the layout keys that nothing set (FILL_KEYS) filled in. A mesh set in
    the config that fits runs as written; so does anything on CPUs."""
    p = cfg.parallel
    if p.layout == "auto":
        return "parallel.layout=auto"
    if on != "gpu":
        return "written"
    if not explicit & set(MESH_KEYS):
        return "the config sets no mesh (parallel.data, pipe, tensor)"
    need = p.data * p.pipe * p.tensor
    if command_line & set(MESH_KEYS):
        return "fill" if set(FILL_KEYS) - explicit else "written"
    if need > num_devices:
        return (f"the config's mesh (data, pipe, tensor) = {p.mesh_shape} needs {need} "
                f"devices, {num_devices} here")
    return "written"


def planner_fixed(source: str, explicit: set, command_line: set) -> set:
    """The layout keys the planner keeps as they are: for a mesh given on the command line or a
    config without one, every key set anywhere; otherwise (layout=auto, a mesh that does not
    fit: the config was written for other devices) only those of the command line."""
    if source == "fill" or source.startswith("the config sets no mesh"):
        return set(explicit)
    return set(command_line)


# ----------------------------------------------------------------------------- the run

def progress_bar(stream=None) -> bool:
    """A progress bar where the output is a terminal, a line every 10 steps otherwise (a bar
    redrawn into a log file is noise)."""
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


def tensorboard() -> bool:
    """TensorBoard events in run.dir where tensorboardX is installed (metrics.jsonl always)."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return False
    return True


MAX_BAD_STEPS = 5      # a run stops after this many non-finite steps in a row (each skipped)

SAMPLE_PROMPT = "The "          # the end-of-run sample (train.sample_tokens): this prompt, at
SAMPLE_TEMPERATURE = 0.6        # this temperature among the
SAMPLE_TOP_K = 20               # likeliest tokens: greedy, a small byte-level model loops;
                                # ptdp-generate samples a checkpoint with any settings


def cache_dir(environ=None) -> str:
    """Where the embedded corpus's token file is built once: $PTDP_CACHE_DIR, else
    $XDG_CACHE_HOME/ptdp_jax (~/.cache/ptdp_jax), beside the compilation cache."""
    environ = os.environ if environ is None else environ
    if environ.get("PTDP_CACHE_DIR"):
        return os.path.expanduser(environ["PTDP_CACHE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ptdp_jax")


def compile_cache_dir(value, jax_dir: str | None, environ=None) -> str | None:
    """run.compile_cache: auto (true) keeps compiled steps on disk (a 7.5B zb-phased v 3 step
    compiles ~4 min), in JAX's own directory where one is set, else $XDG_CACHE_HOME/ptdp_jax/xla;
    off (false): none; a directory: that one."""
    if value is False or value == "off":
        return None
    if value is True or value == "auto":
        if jax_dir:
            return jax_dir
        environ = os.environ if environ is None else environ
        base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "ptdp_jax", "xla")
    return os.path.abspath(os.path.expanduser(value))
