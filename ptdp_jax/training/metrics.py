"""Model FLOPs, parameter counts, MFU, training-time estimates, and a metrics logger.

The formulas are the paper's (Narayanan et al., SC'21, arXiv 2104.04473, section
5.1 and appendix), generalised so that the same code counts LLaMA:

Model FLOPs of one training iteration (B sequences of s tokens), counting only
matrix multiplications (a multiply-add is 2 FLOPs), per token:

* each of the l layers, forward: 2 * N_layer + 4 * s * h, where N_layer is the
  number of matmul weights of the layer and 4 * s * h the attention scores
  (Q K^T) and the attention-weighted values (A V), 2 * s * h each. The causal
  mask is not discounted, as in the paper's formula.
    GPT:    N_layer = 4h^2 (QKV, output projection) + 2hf (two MLP GEMMs)
    LLaMA:  N_layer = 4h^2 (Q, K, V, O) + 3hf (SwiGLU gate, up, down); with grouped-query
            attention K and V are h x (h * kv_heads / heads) each
* the logit layer, forward: 2 * h * V (V = model.vocab_size: the real vocabulary;
  the padding to a multiple of 128 is not counted as model FLOPs; for Table 1,
  V = 51200 is already a multiple of 128).

Backward costs twice the forward; full activation recomputation runs the layers'
forward once more (not the logit layer's). So, per token:

    no recompute:   3 * l * (2 N_layer + 4 s h) + 3 * 2 h V
    full recompute: 4 * l * (2 N_layer + 4 s h) + 3 * 2 h V

For GPT with f = 4h, N_layer = 12h^2 and these are exactly the paper's

    F  = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))      (no recomputation)
    F' = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))      (full recomputation)

(tests/test_metrics.py checks the identity with exact rational arithmetic).
With document masking (data.document_mask) the 4 s h term is scaled by the documents' share
of the causal pairs (`attention_share`, plan/documents.py), so that MFU does not count the
attention the mask removes (at 128K with short documents that would read over 100%).
MFU uses F (the usual convention: recomputation is overhead, not model FLOPs);
the paper's "achieved TFLOP/s" in Table 1 uses F' since its runs recompute.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

SECONDS_PER_DAY = 86400.0

# Dense bf16 peak FLOP/s per device (datasheets), by a substring of jax's
# device.device_kind; the first match wins, so the more specific names come first.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),        # H100 SXM
    ("H200", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
)

PEAK_ENV = "PTDP_PEAK_TFLOPS"


# ----------------------------------------------------------------------------- FLOPs and parameters

def _model_cfg(cfg):
    """Accept a Config (with .model) or a ModelConfig."""
    return getattr(cfg, "model", cfg)


def _recompute_flag(recompute) -> bool:
    if isinstance(recompute, str):
        return recompute == "full"
    return bool(recompute)


def layer_matmul_params(mcfg) -> int:
    """Matmul weights of one transformer layer (biases and norms excluded)."""
    h, f = mcfg.hidden_size, mcfg.ffn
    if mcfg.arch == "llama":              # Q and O (h x h), K and V (h x kv_heads * head_dim)
        kv = getattr(mcfg, "kv_heads", mcfg.num_heads) * (h // mcfg.num_heads)
        return 2 * h * h + 2 * h * kv + 3 * h * f
    return 4 * h * h + 2 * h * f


def transformer_flops_per_iteration(batch: int, seq_len: int, num_layers: int, hidden: int,
                                    vocab: int, layer_params: int,
                                    recompute: bool = False, attention_share=1) -> int:
    """The generic count (an exact integer for an integer share): see the module docstring."""
    layer_fwd = 2 * layer_params + attention_share * 4 * seq_len * hidden   # a token, a layer
    logit_fwd = 2 * hidden * vocab                               # per token
    passes = 4 if recompute else 3
    per_token = passes * num_layers * layer_fwd + 3 * logit_fwd
    return batch * seq_len * per_token


def paper_flops_per_iteration(batch, seq_len, num_layers, hidden, vocab,
                              recompute: bool = False):
    """The paper's closed forms for GPT (f = 4h), written as in the paper.
    Works on ints, floats or fractions.Fraction."""
    B, s, l, h, V = batch, seq_len, num_layers, hidden, vocab
    if recompute:
        return 96 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))


def model_flops_per_iteration(cfg, recompute: bool = False, attention_share: float = 1.0
                              ) -> float:
    """Model FLOPs of one training iteration of cfg (global batch B =
    train.global_batch_size sequences of model.seq_len tokens), V =
    model.vocab_size (unpadded). recompute=True (or "full") counts the extra
    forward of full activation recomputation (the paper's 96 B s l h^2 ... form).
    attention_share: document masking's share of the causal pairs (1: none).
    GPT or LLaMA; the FFN size is model.ffn."""
    m = _model_cfg(cfg)
    return float(transformer_flops_per_iteration(
        cfg.train.global_batch_size, m.seq_len, m.num_layers, m.hidden_size, m.vocab_size,
        layer_matmul_params(m), _recompute_flag(recompute), attention_share))


def paper_param_count(cfg, vocab_size: int | None = None) -> float:
    """P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) = 12 l h^2 + 13 l h + (V + s) h:
    the paper's GPT count (layers with biases and LayerNorms, token and position
    embeddings, tied head; without the final LayerNorm's 2h). V = model.vocab_size
    unless vocab_size is given (e.g. the padded vocabulary)."""
    m = _model_cfg(cfg)
    l, h, s = m.num_layers, m.hidden_size, m.seq_len
    V = m.vocab_size if vocab_size is None else vocab_size
    return float(12 * l * h * h + 13 * l * h + (V + s) * h)


# ----------------------------------------------------------------------------- hardware, MFU, time

def peak_flops_per_device(device=None) -> float | None:
    """Dense bf16 peak FLOP/s of one device, from its device_kind (a jax Device
    or a string): H100 SXM / H200 989e12, H100 PCIe 756e12, A100 312e12; None
    for CPU or unknown kinds. The environment variable PTDP_PEAK_TFLOPS (in
    TFLOP/s) overrides the table."""
    env = os.environ.get(PEAK_ENV, "").strip()
    if env:
        try:
            value = float(env)
        except ValueError:
            raise ValueError(f"{PEAK_ENV}={env!r} is not a number (TFLOP/s)") from None
        return value * 1e12 if value > 0 else None
    if device is None:
        return None
    kind = device if isinstance(device, str) else getattr(device, "device_kind", "")
    kind = str(kind)
    for name, peak in PEAK_FLOPS:
        if name.lower() in kind.lower():
            return peak
    return None


def achieved_flops_per_device(flops_per_iter: float, step_time_s: float,
                              num_devices: int) -> float | None:
    """FLOP/s achieved by each device (the paper's "TFLOP/s per GPU" x 1e12)."""
    if step_time_s is None or step_time_s <= 0 or num_devices <= 0:
        return None
    return flops_per_iter / (step_time_s * num_devices)


def mfu(flops_per_iter: float, step_time_s: float, num_devices: int,
        peak: float | None) -> float | None:
    """Model FLOPs utilisation: flops_per_iter / (step_time_s * num_devices * peak),
    a fraction (0.5 = 50%); None when the peak is unknown or the time not positive."""
    achieved = achieved_flops_per_device(flops_per_iter, step_time_s, num_devices)
    if achieved is None or not peak:
        return None
    return achieved / peak


def training_days(tokens: float, params: float, n_gpus: int, flops_per_gpu: float) -> float:
    """End-to-end training time estimate 8 T P / (n X), in days (the paper's
    section 5.1: 175B on 1024 GPUs at 140 TFLOP/s for 300B tokens ~ 34 days)."""
    return 8.0 * tokens * params / (n_gpus * flops_per_gpu) / SECONDS_PER_DAY


# ----------------------------------------------------------------------------- logger

def _scalar(value: Any):
    """A plain Python number (or the value itself if it is not a number)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    try:
        return float(value)          # numpy / jax scalars, 0-d arrays
    except (TypeError, ValueError):
        return str(value)


def check_wandb(project: str) -> None:
    """Before a run: ConfigError if run.wandb_project is set and wandb cannot be imported."""
    if not project:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        from ptdp_jax.config.load import ConfigError
        raise ConfigError(f"run.wandb_project={project!r} needs the wandb package (pip install "
                          f"wandb); leave run.wandb_project empty to log without it") from None


class _Once(logging.Filter):
    """A logging filter that lets each distinct message through once."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def _tensorboard_warns_once() -> None:
    """tensorboardX warns 'NaN or Inf found in input tensor.' for every non-finite scalar
    (each metric of each skipped step): once a process is enough."""
    log = logging.getLogger("tensorboardX.x2num")
    if not any(isinstance(f, _Once) for f in log.filters):
        log.addFilter(_Once())


def _tensorboard_installed(path) -> bool:
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        import warnings
        warnings.warn("tensorboardX is not installed: no TensorBoard events are written "
                      f"(metrics still go to {path})")
        return False
    return True


class MetricsLogger:
    """Appends one JSON line per log call to run_dir/metrics.jsonl (flushed each
    line) and writes the numeric values as TensorBoard scalars (tensorboardX) in
    run_dir, and to Weights & Biases with `wandb_project` (a W&B run whose id is the run
    id, so a resumed run goes on in it; `config` is its config). enabled=False (non-zero
    processes of a multi-host run) makes every method a no-op and creates nothing.

    Several runs may share a run_dir: the file is never truncated, and each line
    carries the run's id (``"run"``). A run resumed from a checkpoint of step k keeps
    its run id (`resume_step=k`): the lines it logged after step k before it stopped
    are dropped, since it computes those steps again, so no (run, step) appears twice.

        with MetricsLogger("runs/demo", run_id="20260101-120000-1234") as log:
            log.log(step, {"loss": 3.2, "lr": 1e-3})
    """

    def __init__(self, run_dir: "str | os.PathLike", tensorboard: bool = True,
                 enabled: bool = True, run_id: str | None = None,
                 resume_step: int | None = None, wandb_project: str = "",
                 config: Mapping[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.run_id = run_id
        self.path = self.run_dir / "metrics.jsonl"
        self._file = None
        self._writer = None
        self._wandb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            self._drop_after(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tensorboard = tensorboard and _tensorboard_installed(self.path)
        self._purge = resume_step
        if wandb_project:
            import wandb
            self._wandb = wandb.init(project=wandb_project, id=run_id, name=run_id,
                                     resume="allow", dir=str(self.run_dir),
                                     config=dict(config or {}))

    def _drop_after(self, step: int) -> None:
        """Remove this run's lines of steps > step (written after its last checkpoint)."""
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                kept.append(line)                       # not ours to judge: keep it
                continue
            if isinstance(rec, dict) and rec.get("run", self.run_id) == self.run_id \
                    and int(rec.get("step", 0)) > step:
                dropped += 1
                continue
            kept.append(line)
        if dropped:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled or self._file is None:
            return
        record = {"step": int(step)}
        if self.run_id is not None:
            record["run"] = self.run_id
        record.update({str(k): _scalar(v) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard and self._writer is None:      # at the first line: a run that
            from tensorboardX import SummaryWriter          # logs nothing leaves no events file
            _tensorboard_warns_once()
            self._writer = SummaryWriter(
                logdir=str(self.run_dir),
                **({"purge_step": self._purge + 1} if self._purge is not None else {}))
        if self._writer is not None:
            for k, v in record.items():
                if k in ("step", "run") or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                self._writer.add_scalar(k, v, int(step))
            self._writer.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k not in ("step", "run")
                             and isinstance(v, (int, float)) and not isinstance(v, bool)},
                            step=int(step))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
