"""The config tree's types: frozen dataclasses, every default visible, and the values they
resolve (`auto` keys). Loading, YAML and dotted overrides are in `ptdp_jax.config`, which
re-exports these names; checks are in `ptdp_jax.validation`."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A bad configuration value; the message names the key and the numbers."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "gpt"                    # gpt | llama
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int | None = None      # llama: key/value heads (grouped-query attention); None: num_heads
    ffn_hidden_size: int | None = None   # None: 4h for gpt, 2/3*4h rounded up to 256 for llama
    vocab_size: int = 257                # the byte tokenizer's (256 + eos); unset: data.path's
    seq_len: int = 128
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02
    attention: str = "auto"              # auto (cudnn on GPU, xla elsewhere) | xla | cudnn

    @property
    def ffn(self) -> int:
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.arch == "llama":
            return 256 * math.ceil(int(2 * 4 * self.hidden_size / 3) / 256)
        return 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        """Key/value heads: num_kv_heads, or num_heads (no grouped-query attention)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary padded to a multiple of 128 (Megatron); layout independent
        so parameters are the same whatever the tensor-parallel size."""
        return 128 * math.ceil(self.vocab_size / 128)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200                     # the run ends after this many steps (of the whole run)
    decay_steps: int | None = None       # the lr reaches lr * min_lr_ratio at this step (warm-up
                                         # included), constant after; None: train.steps
    stop_at_step: int = 0                # stop early (checkpoint, exit 0) at this step; 0: never
    stop_after_minutes: float = 0.0      # stop (checkpoint, exit 0) after this long; 0: never
    skip_memory_check: bool = False      # do not refuse a run the memory estimate says cannot fit
    global_batch_size: int = 16
    micro_batch_size: int = 4
    lr: float = 3e-3
    lr_schedule: str = "cosine"          # after the warm-up: cosine | linear (to lr * min_lr_ratio at
                                         # decay_steps) | constant | wsd (constant, then linear down
                                         # over the last decay_fraction)
    decay_fraction: float = 0.1          # wsd: the decay's share of decay_steps (default train.steps)
    min_lr_ratio: float = 0.1            # cosine, linear and wsd decay to lr * min_lr_ratio
    warmup_steps: int = 20               # linear warm-up from 0 over this many steps, however short
                                         # the run (a 5-step run of a 2000-step warm-up: tiny lr)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    dtype: str = "float32"               # float32 | bfloat16 (bf16 compute, fp32 master weights)
    fp8: bool = False                    # the transformer layers' GEMMs on FP8 operands (E4M3
                                         # forward, E5M2 gradients, per-tensor current scaling)
    recompute: str = "none"              # none | selective | full
    keep_ffn_activation: bool | str = "auto"  # selective (auto: on): keep the MLP activation,
                                         # not run again in the backward (2 T f bytes a layer)
    scan_layers: bool | str = "auto"     # p = 1: scan over layers (faster compile, slower step);
                                         # auto: only with parallel.zero=3 (Config.scan_layers_on)
    eval_every: int = 50                 # 0: never
    eval_batches: int = 2
    log_every: int = 1
    max_bad_steps: int = 5               # consecutive non-finite steps before the run stops
    dispatch_ahead: bool = True          # dispatch step n + 1 before reading step n's metrics,
                                         # so host work overlaps the devices'; false: wait each step
    sample_tokens: int = 0               # length of the sample printed at the end (0: none)
    sample_prompt: str = "The "
    sample_temperature: float = 0.0      # 0: greedy
    sample_top_k: int = 0                # sample among the k likeliest tokens (0: all)

    @property
    def keeps_ffn_activation(self) -> bool:
        """keep_ffn_activation resolved (true or auto): selective keeps the activation."""
        return self.keep_ffn_activation in (True, "auto")

    @property
    def remat(self) -> str:
        """The layers' policy (models/model.py REMAT_POLICIES): recompute or selective+act."""
        keep = self.recompute == "selective" and self.keeps_ffn_activation
        return "selective+act" if keep else self.recompute


NCCL_CHANNELS_TENSOR = 64         # parallel.nccl_channels=auto with tensor > 1 (its collectives run
                                  # exposed: 1.3B (1,1,4) -3.7%, 7.5B -1.0% on 4x H200, 2026-11-27)
NCCL_MAX_CHANNELS = 64            # NCCL's MAXCHANNELS (2.28)
STATIC_STASH_AUTO = ("1f1b", "1f1b-phased", "zb-phased")    # parallel.static_stash=auto: on for these


@dataclass(frozen=True)
class ParallelConfig:
    data: int = 1
    pipe: int = 1
    tensor: int = 1
    schedule: str = "1f1b"               # gpipe | 1f1b | 1f1b-phased | interleaved | zb-h1 | zb-v | zb-phased
    virtual_stages: int = 1              # model chunks a stage: interleaved, 1f1b-phased (v > 1), zb-v (2)
    scatter_gather: bool = False
    sequence_parallel: bool = False      # split norms, dropout, residual stream by sequence over
                                         # 'tensor' (Megatron's --sequence-parallel); t = 1: no-op
    tp_comm_overlap: bool | str = "auto"  # with sequence_parallel: its collectives as rings of permutes
                                         # around the GEMMs; auto: on at m = 1 on GPUs of one process
    tp_overlap_sends: str = "direct"     # the ring's blocks: direct (each sent to every rank at once)
                                         # | ring (t - 1 hops); the same program at t = 2
    # Layers of each model chunk, p x v counts in chunk order (chunk c on stage c % p; zb-v: stage c
    # for c < p, 2p-1-c after), summing to num_layers; () = even; "auto" = balanced with the head.
    stage_layers: tuple[int, ...] | str = ()
    allow_cross_host_tensor: bool = False  # multi-process: let 'tensor' span hosts (warns; slow)
    layout: str = "manual"               # manual | auto: ptdp-plan's best layout for the devices
                                         # at hand (keys given as overrides or --mesh still win)
    zero: int = 0                        # 0: state replicated over 'data'; 1: optimizer state split
                                         # over 'data'; 2: also the gradients; 3: also the weights (FSDP)
    zero_ring: bool | str = False        # zero >= 1: ZeRO's gathers and reduce-scatters (>= 1 MiB) as rings
                                         # of permutes on the copy engines; auto: data groups in one process
    grad_reduce_dtype: str = "float32"   # float32 | bfloat16: the data-parallel gradient reduction
    overlap_grad_reduce: bool | str = "auto"  # ZeRO's reduce-scatters layer by layer in the last
                                         # backward (true) or after it (false); auto: overlap_grad_reduce_on
    static_stash: bool | str = "auto"    # pipelines: a switch branch per (op, stash slot), residuals
                                         # in place, no per-tick copies; auto: static_stash_on
    empty_buffers: bool = True           # pipelines, 'tensor' 1: stash and message buffers
                                         # uninitialised (no zero fill and copy a step)
    overlap_p2p: bool | str = "auto"     # phased: a forward row's permute under the backward row's
                                         # op; auto: on for 1f1b-phased and zb-phased with pipe > 1
    nccl_channels: int | str = "auto"    # NCCL_MIN_NCHANNELS on GPU unless set; auto: 64 with
                                         # tensor > 1, NCCL's own otherwise; 0: NCCL's own

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.data, self.pipe, self.tensor)

    @property
    def overlap_grad_reduce_on(self) -> bool:
        """overlap_grad_reduce resolved. Only ZeRO without pipelining reduces inside the
        backward: zero=2 and 3 always (a layer's full gradient never outlives it), zero=1
        unless false; zero=0 and pipelines reduce after the backward (zero=0's all-reduce per
        layer ran slower)."""
        if self.zero == 0 or self.pipe > 1:
            return False
        return self.zero in (2, 3) or self.overlap_grad_reduce in (True, "auto")

    @property
    def overlap_p2p_on(self) -> bool:
        """overlap_p2p resolved: true, or auto where the schedule is a phased one."""
        phased = self.pipe > 1 and self.schedule in ("1f1b-phased", "zb-phased")
        return self.overlap_p2p is True or (self.overlap_p2p == "auto" and phased)

    @property
    def nccl_channels_value(self) -> int:
        """nccl_channels resolved: 0 leaves NCCL's own choice."""
        if self.nccl_channels == "auto":
            return NCCL_CHANNELS_TENSOR if self.tensor > 1 else 0
        return int(self.nccl_channels)

    @property
    def static_stash_on(self) -> bool:
        """static_stash resolved. auto: on where the branches stay few (1f1b and the phased
        tables); off for gpipe (branches grow with m), interleaved and zb-v (branches x v x
        slots: 2-3x the compile time) and zb-h1."""
        if self.static_stash == "auto":
            return self.schedule in STATIC_STASH_AUTO
        return bool(self.static_stash)

    @property
    def stash_chunk_pools(self) -> bool:
        """The stash slots in a pool per local chunk (Schedule.chunk_pools): with the static
        stash at v > 1, where one shared pool would give a branch per (op, chunk, slot)."""
        return self.static_stash_on and self.virtual_stages > 1


@dataclass(frozen=True)
class DataConfig:
    path: tuple[str, ...] = ()           # token-file prefixes (ptdp-prepare-data); empty: embedded corpus
    weights: tuple[float, ...] = ()      # blend weights, one per path (empty: equal)
    cache_dir: str = "~/.cache/ptdp_jax"
    val_fraction: float = 0.05


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = ""                        # empty: no checkpoints
    every: int = 0                       # 0: only at the end
    keep: int = 3
    resume: bool = True
    overwrite: bool = False              # resume=false: remove an earlier run's checkpoints in dir


@dataclass(frozen=True)
class RunConfig:
    dir: str = "runs/latest"             # metrics.jsonl and TensorBoard events
    progress: bool = True
    tensorboard: bool = True
    compile_cache: bool | str = "auto"   # auto (true) | false (off) | DIR: compiled steps on disk
    wandb_project: str = ""              # Weights & Biases project for metrics.jsonl's metrics (needs
                                         # the wandb package; the run id is the W&B run's); empty: off


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def scan_layers_on(self) -> bool:
        """train.scan_layers resolved. auto: a scan for zero=3 without pipelining (one layer's
        weights gathered at a time, bounded by the scan, not by XLA's scheduler), the layers
        unrolled otherwise (faster: no stacked residual copies).
        false with zero=3: the layers unrolled, each gathering its own weights."""
        if self.train.scan_layers == "auto":
            return self.parallel.zero == 3 and self.parallel.pipe == 1
        return bool(self.train.scan_layers)

    @property
    def tp_comm_overlap_on(self) -> bool:
        """parallel.tp_comm_overlap resolved from the config alone (the devices are
        sharding.tp_overlap_on's part). auto: sequence parallelism over tensor > 1 without
        pipelining, the layers unrolled, one microbatch a step (where it runs faster)."""
        p = self.parallel
        if p.tp_comm_overlap == "auto" and self.train.fp8:
            return False                 # the rings' blockwise GEMMs take no FP8 operands
        if p.tp_comm_overlap != "auto":
            return bool(p.tp_comm_overlap)
        return (p.sequence_parallel and p.tensor > 1 and p.pipe == 1 and not self.scan_layers_on
                and self.num_microbatches == 1)

    @property
    def num_microbatches(self) -> int:
        t = self.train
        return t.global_batch_size // (t.micro_batch_size * self.parallel.data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
