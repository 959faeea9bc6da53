"""The config tree's types: frozen dataclasses, every default visible. What a user sets: the
model, the batch, the precision, recomputation, the layout, data, checkpoints and the run;
`tuning` holds the expert overrides of decisions.py's rules, which resolve the `auto` values.
Loading, YAML, dotted overrides and old keys are in `ptdp_jax.config.load`, which re-exports these
names; checks are in `ptdp_jax.config.validation`."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ptdp_jax.config import decisions as D
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
    rope_theta: float = 10000.0          # llama: the rotary base; frequency i of a head is
                                         # rope_theta^(-2i/head_dim)
    rope_scaling_factor: float = 1.0     # llama: LLaMA-3.1's rope scaling (Hugging Face's
                                         # rope_type llama3) for a context longer than
                                         # rope_original_seq_len: the low frequencies divided by
                                         # this, the high ones kept; 1: no scaling
    rope_low_freq_factor: float = 1.0    # rope scaling: frequencies of a wavelength (2 pi / freq)
                                         # above rope_original_seq_len / this are divided in full
    rope_high_freq_factor: float = 4.0   # rope scaling: those of a wavelength below
                                         # rope_original_seq_len / this are kept, those between
                                         # the two bounds interpolated smoothly
    rope_original_seq_len: int = 8192    # rope scaling: the context the model was pretrained at
                                         # (Hugging Face's original_max_position_embeddings)
    init_std: float = 0.02               # std of the normal initialisation (output projections:
                                         # over sqrt(2 num_layers), as Megatron's)

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
    global_batch_size: int = 16
    micro_batch_size: int = 4            # sequences a microbatch; unset with --mesh on GPUs: the
                                         # planner's (decisions.layout_source)
    lr: float = 3e-3
    lr_schedule: str = "cosine"          # after the warm-up: cosine | linear (to lr * min_lr_ratio at
                                         # decay_steps) | constant | wsd (constant, then linear down
                                         # over the last decay_fraction)
    decay_fraction: float = 0.1          # wsd: the decay's share of decay_steps (default train.steps)
    min_lr_ratio: float = 0.1            # cosine, linear and wsd decay to lr * min_lr_ratio
    warmup_steps: int = 20               # linear warm-up from 0 over this many steps, however short
                                         # the run (a 5-step run of a 2000-step warm-up: tiny lr)
    weight_decay: float = 0.1
    adam_betas: tuple[float, ...] = (0.9, 0.95)  # AdamW's (beta1, beta2)
    grad_clip: float = 1.0               # the gradients' global norm is clipped to this; 0: never
    seed: int = 0                        # the initial parameters, the data's order and dropout
    dtype: str = "auto"                  # auto (bfloat16 on GPUs, float32 on CPUs) | float32 |
                                         # bfloat16 (bf16 compute, fp32 master weights)
    fp8: bool = False                    # the transformer layers' GEMMs on FP8 operands (E4M3
                                         # forward, E5M2 gradients, per-tensor scales)
    fp8_recipe: str = "current"          # current (scales from this step's max |x|) | delayed
                                         # (from an amax history in the train state)
    fp8_amax_history: int = 4            # delayed: steps of history; a scale fits their largest
    recompute: str = "auto"              # auto (the least that fits by the memory estimate) | none |
                                         # selective | offload (selective's kept in host
                                         # memory) | full
    eval_every: int = 50                 # validation every this many steps and after the last; 0: after
                                         # the last only
    eval_batches: int = 2                # batches of train.global_batch_size a validation averages
    log_every: int = 1                   # a line of metrics.jsonl (and TensorBoard) every this many
                                         # steps, its loss the mean over them (an evaluation, a
                                         # checkpoint or the last step closes one early); with no
                                         # progress bar, the screen shows one every max(this, 10)
                                         # steps
    sample_tokens: int = 0               # at the end, print this many tokens sampled after "The "
                                         # (0: none; ptdp-generate samples a checkpoint at will)


@dataclass(frozen=True)
class ParallelConfig:
    data: int = 1
    pipe: int = 1
    tensor: int = 1
    context: int = 1                     # one sequence split over this many devices (context
                                         # parallelism; parallel/context.py): model.seq_len a
                                         # multiple of 2 x context
    schedule: str = "1f1b"               # gpipe | 1f1b | 1f1b-phased | interleaved | zb-h1 | zb-v | zb-phased
    virtual_stages: int = 1              # model chunks a stage: interleaved, 1f1b-phased (v > 1), zb-v (2)
    scatter_gather: bool = False         # pipelines with tensor > 1: stage messages split over
                                         # 'tensor' (1/t of the bytes), gathered on arrival
    sequence_parallel: bool = False      # split norms, dropout, residual stream by sequence over
                                         # 'tensor' (Megatron's --sequence-parallel); t = 1: no-op
    # Layers of each model chunk, p x v counts in chunk order (chunk c on stage c % p; zb-v: stage c
    # for c < p, 2p-1-c after), summing to num_layers; () = even; "auto" = balanced with the head.
    stage_layers: tuple[int, ...] | str = ()
    layout: str = "manual"               # manual (as written; on GPUs a config without a mesh, or
                                         # whose mesh needs more devices than there are, gets the
                                         # planner's) | auto: ptdp-plan's best layout for the devices
                                         # at hand (keys given as overrides or --mesh still win)
    zero: int = 0                        # 0: state replicated over 'data' (and 'context'); 1: optimizer
                                         # state split over them; 2: also the gradients; 3: also the
                                         # weights (FSDP)
    grad_reduce_dtype: str = "float32"   # float32 | bfloat16: the data-parallel gradient reduction

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.data, self.pipe, self.tensor)

    @property
    def mesh_dims(self) -> tuple[int, int, int, int]:
        """The device mesh's sizes, (data, pipe, context, tensor)."""
        return (self.data, self.pipe, self.context, self.tensor)

    @property
    def num_devices(self) -> int:
        return self.data * self.pipe * self.context * self.tensor


@dataclass(frozen=True)
class DataConfig:
    path: tuple[str, ...] = ()           # token-file prefixes (ptdp-prepare-data); empty: the embedded
                                         # corpus, built once in $PTDP_CACHE_DIR (~/.cache/ptdp_jax)
    weights: tuple[float, ...] = ()      # blend weights, one per path (empty: equal)
    val_fraction: float = 0.05           # the share of each dataset's windows (its last) held out
                                         # for evaluation; unused with val_path
    val_path: tuple[str, ...] = ()       # token-file prefixes of a validation set of its own,
                                         # blended evenly, evaluated instead of the val_fraction
                                         # split (the training data keeps all its windows); of
                                         # data.path's tokenizer
    document_mask: bool = False          # a token attends only to its own document's tokens (those
                                         # after the data's last end-of-document token before it),
                                         # as LLaMA 3 trained at long context


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = ""                        # empty: no checkpoints
    every: int = 0                       # 0: only at the end
    keep: int = 3                        # the newest this many checkpoints stay, older ones go
    resume: bool | str = True            # true: from the newest checkpoint in dir | false: start
                                         # fresh, refused while dir holds checkpoints | overwrite:
                                         # start fresh, the earlier run's removed at the first save
    resume_step: int | None = None       # resume from this step's checkpoint in dir, not the
                                         # newest; later ones are refused unless
                                         # checkpoint.resume=overwrite (then removed at the first
                                         # save); null: the newest
    load_weights: str = ""               # fine-tuning: a run that does not resume from dir starts
                                         # from the parameters of this ptdp_jax checkpoint (a
                                         # checkpoint.dir or a step directory) or Hugging Face model
                                         # folder, at step 0 with a fresh optimizer; empty: from
                                         # train.seed's initialisation

    @property
    def resumes(self) -> bool:
        """Whether a run resumes from dir where it holds checkpoints: resume=true, or
        resume_step with resume=overwrite (which removes the later checkpoints)."""
        return self.resume is True or (self.resume_step is not None and self.overwrites)

    @property
    def overwrites(self) -> bool:
        return self.resume == "overwrite"


@dataclass(frozen=True)
class RunConfig:
    dir: str = "runs/latest"             # metrics.jsonl, TensorBoard events (with tensorboardX), the
                                         # resolved config; a progress bar on a terminal
    compile_cache: bool | str = "auto"   # auto (true) | false (off) | DIR: compiled steps on disk
    wandb_project: str = ""              # Weights & Biases project for metrics.jsonl's metrics (needs
                                         # the wandb package; the run id is the W&B run's); empty: off


@dataclass(frozen=True)
class TuningConfig:
    """Expert settings: each overrides one rule of `ptdp_jax/config/decisions.py` (the rule and the
    measurement behind it are that function's docstring), for a machine where the rule is
    wrong. `auto` follows the rule. None of them changes what is computed, only how (the loss
    and gradients agree to rounding) or whether a run is refused."""
    attention: str = "auto"              # auto (cuDNN's flash attention on GPUs in 16-bit, XLA's
                                         # elsewhere: decisions.attention) | xla | cudnn
    static_stash: bool | str = "auto"    # pipelines: a switch branch per (op, stash slot), residuals
                                         # in place; auto: 1f1b and the phased schedules
    scan_layers: bool | str = "auto"     # p = 1: the layers in a lax.scan (shorter compile, slower
                                         # step); auto: only with parallel.zero=3
    keep_ffn_activation: bool | str = "auto"  # selective: keep the MLP activation (auto: on); false
                                         # runs it again in the backward (2 T f bytes a layer less)
    overlap_grad_reduce: bool | str = "auto"  # ZeRO without pipelining: reduce-scatters inside the
                                         # last backward; false (zero 1 only): after it
    tp_comm_overlap: bool | str = "auto"  # sequence parallelism's collectives as rings of permutes
                                         # around the GEMMs; auto: m = 1 on GPUs of one process, BF16
    skip_memory_check: bool = False      # run even where the memory estimate (or XLA's analysis)
                                         # says the step does not fit a device
    allow_cross_host_tensor: bool = False  # multi-process: let 'tensor' span hosts (warns; slow)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    tuning: TuningConfig = field(default_factory=TuningConfig)

    # The rules below are decisions.py's; these names only save the callers an import.
    @property
    def scan_layers_on(self) -> bool:
        return D.scan_layers(self)

    @property
    def tp_comm_overlap_on(self) -> bool:
        return D.tp_comm_overlap(self)

    @property
    def static_stash_on(self) -> bool:
        return D.static_stash(self)

    @property
    def stash_chunk_pools(self) -> bool:
        return D.stash_chunk_pools(self)

    @property
    def overlap_grad_reduce_on(self) -> bool:
        return D.overlap_grad_reduce(self)

    @property
    def keeps_ffn_activation(self) -> bool:
        return D.keep_ffn_activation(self)

    @property
    def remat(self) -> str:
        """The layers' policy (models/model.py REMAT_POLICIES): recompute or selective+act."""
        return D.remat(self)

    @property
    def recompute(self) -> str:
        """train.recompute resolved (auto before train() resolves it: none, decisions.recompute)."""
        return D.recompute(self.train.recompute)

    @property
    def compute_dtype(self) -> str:
        """train.dtype resolved (auto: by jax's platform, decisions.dtype)."""
        return D.dtype(self.train.dtype)

    @property
    def num_microbatches(self) -> int:
        t = self.train
        return t.global_batch_size // (t.micro_batch_size * self.parallel.data)

    @property
    def microbatch_split(self) -> str:
        """How a step splits a replica's batch, in words: '16 microbatches of 1'."""
        m = self.num_microbatches
        return f"{m} microbatch{'es' if m != 1 else ''} of {self.train.micro_batch_size}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
