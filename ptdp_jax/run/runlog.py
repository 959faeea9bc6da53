"""What a run tells its user: the progress bar on a terminal (otherwise a line every 10 steps:
decisions.progress_bar), metrics.jsonl and TensorBoard, the resolved config in run.dir (a file
for each start: config_file), and messages that go through the bar's own write so that they
never run into it.

    runlog = RunLog(cfg, log, start_step, run_id)
    runlog.message("...")                             # above the bar
    runlog.step(step, out, seconds, val_loss=None)    # after each step (1-based)
    runlog.close()

With run.wandb_project the lines of metrics.jsonl go to Weights & Biases too.
One loss everywhere: each line of metrics.jsonl holds the mean over the steps since the
previous line (train.log_every steps; an evaluation, a checkpoint or the last step closes a
line early),
steps whose update was skipped (non-finite) left out; the screen shows the latest line's, and
the closing `done:` line the first line's and the last's. A step's time is that step's: the
time of an evaluation or a checkpoint after it is logged beside it (eval_s, checkpoint_s),
never in it. The validation loss stays on the bar until the next evaluation and is logged as
its own line without a bar. Each line of metrics.jsonl carries the run id (see MetricsLogger).
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import jax
import numpy as np

from ptdp_jax.config import decisions as D
from ptdp_jax.training import metrics as MX
from ptdp_jax.config.load import Config, to_yaml, with_absolute_paths


def new_run_id() -> str:
    """'YYYYmmdd-HHMMSS-xxxxxx': process 0's clock and 24 random bits (the same on every
    process)."""
    ids = np.array([int(time.time()), int.from_bytes(os.urandom(3), "big")], np.int64)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        ids = np.asarray(multihost_utils.broadcast_one_to_all(ids))
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(int(ids[0]))) + f"-{int(ids[1]):06x}"


def config_file(run_dir: Path, run_id: str, start: int) -> Path:
    """Where a run keeps its resolved config in run.dir: config-<run id>.yaml from step 0,
    config-<run id>-<start step>.yaml for each resume (-2, -3, ... after it where one resumed
    from that step before): a resume never overwrites an earlier config."""
    stem = f"config-{run_id}" + (f"-{start}" if start else "")
    path, n = run_dir / f"{stem}.yaml", 2
    while path.exists():
        path, n = run_dir / f"{stem}-{n}.yaml", n + 1
    return path


def peak_memory_gib(devices=None) -> float | None:
    """The largest peak of device memory in use over this process's devices (GiB), from
    memory_stats(); None where the devices do not report it (CPU)."""
    peaks = []
    for d in devices if devices is not None else jax.local_devices():
        try:
            stats = d.memory_stats()
        except Exception:
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
    return max(peaks) / 2**30 if peaks else None


class _Mean:
    """Mean of the finite values since the last take()."""

    def __init__(self):
        self.values: list[float] = []

    def add(self, x: float, finite: bool = True):
        if finite and math.isfinite(x):
            self.values.append(x)

    def take(self) -> float:
        out = sum(self.values) / len(self.values) if self.values else float("nan")
        self.values = []
        return out


class RunLog:
    def __init__(self, cfg: Config, log, start: int, run_id: str, enabled: bool = True,
                 attention_share: float = 1.0):
        """attention_share: document masking's share of the causal pairs, for MFU
        (metrics.model_flops_per_iteration)."""
        self.cfg, self.log, self.start, self.run_id, self.enabled = cfg, log, start, run_id, enabled
        t = cfg.train
        self.total = t.steps
        self.metrics = MX.MetricsLogger(cfg.run.dir, tensorboard=D.tensorboard(),
                                        enabled=enabled, run_id=run_id,
                                        resume_step=start if start > 0 else None,
                                        wandb_project=cfg.run.wandb_project,
                                        config=with_absolute_paths(cfg).to_dict())
        if enabled:
            where = f"resumed at step {start}" if start else "from step 0"
            config_file(Path(cfg.run.dir), run_id, start).write_text(
                f"# ptdp_jax run {run_id}, {where}: the resolved config\n"
                + to_yaml(with_absolute_paths(cfg)))
        self.n_dev = cfg.parallel.num_devices
        self.flops = MX.model_flops_per_iteration(cfg, False, attention_share)
        self.peak = MX.peak_flops_per_device(jax.devices()[0])
        self.tokens_per_step = t.global_batch_size * cfg.model.seq_len
        self._log_mean = _Mean()
        self.last_val: tuple[int, float] | None = None
        self.windows: list[tuple[int, float]] = []     # (step, mean loss) of each line
        self.bar = None
        if D.progress_bar() and enabled:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=t.steps, initial=start, unit="step", dynamic_ncols=True)

    # -- text
    def message(self, text: str) -> None:
        """A line for the user, above the progress bar if there is one."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            self.log(text)

    def header(self) -> None:
        cfg = self.cfg
        d, p, t = cfg.parallel.mesh_shape
        v = cfg.parallel.virtual_stages
        self.message(
            f"ptdp_jax: {cfg.model.arch} {cfg.model.num_layers}x{cfg.model.hidden_size}, "
            f"mesh (data, pipe, tensor) = ({d}, {p}, {t})"
            f"{', context %d' % cfg.parallel.context if cfg.parallel.context > 1 else ''}, "
            f"schedule {cfg.parallel.schedule}"
            f"{' v=%d' % v if v > 1 else ''}, {cfg.microbatch_split}, {cfg.train.dtype}"
            f"{' with FP8 GEMMs (' + cfg.train.fp8_recipe + ')' if cfg.train.fp8 else ''}, "
            f"recompute {cfg.train.recompute}"
            f"{', zero %d' % cfg.parallel.zero if cfg.parallel.zero and d > 1 else ''}"
            f"{', attention within documents' if cfg.data.document_mask else ''}; "
            f"run {self.run_id}, metrics in {Path(cfg.run.dir) / 'metrics.jsonl'}")

    # -- per step
    def step(self, step: int, out, seconds: float, lr: float, val_loss: float | None = None,
             took: dict | None = None):
        """Record step `step` (1-based): its outputs ('loss', 'grad_norm', 'finite'), its time,
        learning rate, the validation loss if it was evaluated, and `took`: seconds of what ran
        after it ('eval_s', 'checkpoint_s')."""
        if not self.enabled:
            return
        loss, finite = float(out["loss"]), bool(out["finite"])
        self._log_mean.add(loss, finite)
        if val_loss is not None:
            self.last_val = (step, val_loss)
        record = {"loss": loss, "lr": lr, "grad_norm": float(out["grad_norm"]),
                  "step_time_s": seconds, "tokens_per_s": self.tokens_per_step / seconds,
                  "tflops_per_device": self.flops / seconds / self.n_dev / 1e12, **(took or {})}
        if self.peak:
            record["mfu"] = self.flops / seconds / self.n_dev / self.peak
        mem = peak_memory_gib()
        if mem is not None:
            record["peak_mem_gib"] = mem
        if not finite:
            record["skipped_nonfinite"] = 1.0
        if val_loss is not None:
            record["val_loss"] = val_loss
        if step % self.cfg.train.log_every == 0 or val_loss is not None or took \
                or step == self.total:
            record["loss"] = self._log_mean.take()
            self.windows.append((step, record["loss"]))
            self.metrics.log(step, record)
        shown = self.windows[-1][1] if self.windows else loss
        speed = (f"{record['mfu']:.1%} MFU" if "mfu" in record
                 else f"{record['tokens_per_s']:.0f} tok/s")
        if self.bar is not None:
            self.bar.update(1)
            post = {"loss": f"{shown:.4f}", "speed": speed}
            if self.last_val is not None:
                post["val"] = f"{self.last_val[1]:.4f}@{self.last_val[0]}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.refresh()
        else:
            if step % max(self.cfg.train.log_every, 10) == 0 or step == self.start + 1:
                self.log(f"step {step}/{self.total} loss {shown:.4f} {speed}")
            if val_loss is not None:
                self.log(f"step {step}/{self.total} val loss {val_loss:.4f} "
                         f"(perplexity {math.exp(min(val_loss, 700.0)):.2f})")

    def done(self, losses: list[float], stopped: str | None = None) -> None:
        """The closing line: steps, the loss of the first and the last line of metrics.jsonl,
        the latest validation loss and the step it was measured at."""
        if not losses:
            return
        end = self.start + len(losses)
        val = ""
        if self.last_val is not None:
            s, v = self.last_val
            val = f", val {v:.4f}" + ("" if s == end else f" (at step {s})")
        how = f"stopped at step {end} ({stopped})" if stopped else f"done at step {end}"
        first, last = (self.windows[0], self.windows[-1]) if self.windows else \
            ((self.start + 1, losses[0]), (end, losses[-1]))
        every = self.cfg.train.log_every
        window = "single steps" if every == 1 else f"means of train.log_every={every} steps"
        self.message(f"done: {len(losses)} steps, loss {first[1]:.4f} at step {first[0]} -> "
                     f"{last[1]:.4f} at step {last[0]} ({window}){val}; {how}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.metrics.close()
