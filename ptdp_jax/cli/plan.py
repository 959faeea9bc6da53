"""`ptdp-plan CONFIG --gpus N [--gpus-per-host 8] [--batch B] [--gpu a100|h100|h200]
[--tokens T] [--json] [--top K] [key=value ...]`: every layout of the model on N GPUs with its
memory per device, bubble, predicted step time, TFLOP/s per GPU and days for T tokens; the
recommended layout first, the rejected ones with the reason.

Overrides are ptdp-train's dotted config keys (a model without a config file can be planned:
`ptdp-plan --gpus 64 model.num_layers=32 model.hidden_size=20480 model.num_heads=128 ...`); a
layout key among them (parallel.tensor=8, train.recompute=full, ...) pins that dimension of
the search. `hw.<field>=value` overrides the GPU kind (`ptdp_jax/plan/hardware.py`), e.g.
`hw.ib_bytes_per_s=2.5e10`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ptdp_jax.command import command
from ptdp_jax.config.load import ConfigError, load_config, parse_cli_overrides
from ptdp_jax.exits import ExitCode
from ptdp_jax.training.memory import GiB
from ptdp_jax.models.model import num_params
from ptdp_jax.training.metrics import paper_param_count
from ptdp_jax.plan.hardware import GPU_KINDS, gpu_kind, with_overrides
from ptdp_jax.plan.search import DEFAULT_TOKENS, LAYOUT_KEYS, Candidate, plan, rejected_summary
from ptdp_jax.run.resolve import planned_documents


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="ptdp-plan", description="Predict the best (data, pipe, tensor, micro batch, "
        "schedule, recompute) layout of a model on N GPUs before renting them.",
        epilog="example: ptdp-plan configs/gpt-145.6b.yaml --gpus 1536 --gpu a100 --top 10")
    ap.add_argument("config", nargs="?", help="YAML file (default: the built-in defaults)")
    ap.add_argument("--gpus", type=int, required=True, help="number of GPUs N")
    ap.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per host (default 8)")
    ap.add_argument("--batch", type=int, help="global batch in sequences (default: the config's)")
    ap.add_argument("--gpu", default="h100", help=f"GPU kind: {', '.join(sorted(GPU_KINDS))} "
                                                  "(default h100)")
    ap.add_argument("--tokens", type=float, default=DEFAULT_TOKENS,
                    help="training tokens for the days column (default 300e9)")
    ap.add_argument("--json", action="store_true", help="print every layout as a JSON list")
    ap.add_argument("--top", type=int, default=12, help="valid layouts in the table (default 12)")
    ap.add_argument("overrides", nargs="*", metavar="key=value",
                    help="dotted config overrides; hw.<field>=value for the GPU kind")
    args = ap.parse_intermixed_args(argv)
    if args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    return args


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _params(n) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _recompute(c: Candidate) -> str:
    """selective+mlp: selective that runs the MLP activation again (keeping it does not fit)."""
    dropped = c.recompute == "selective" and c.keep_ffn_activation is False
    return c.recompute + ("+mlp" if dropped else "")


def format_table(rows: list[Candidate], top: int) -> str:
    """Markdown: the `top` best valid layouts, then the best of each kind of rejection."""
    head = ("| # | d | p | c | t | micro | m | schedule | recompute | s/g | sp | zero | params/GPU "
            "| GiB/GPU (w+g+opt+act) | bubble | step s | TFLOP/s/GPU | days | note |")
    lines = [head, "|" + "---|" * 19]

    def line(i, c: Candidate, note=""):
        j = c.to_json()
        sched = c.schedule + (f" v{c.virtual_stages}" if c.virtual_stages > 1 else "")
        parts = (f"{_fmt(j['weights_gib'], '.1f')}+{_fmt(j['grads_gib'], '.1f')}+"
                 f"{_fmt(j['optimizer_gib'], '.1f')}+{_fmt(j['activations_gib'], '.1f')}")
        mem = "-" if j["memory_per_device_gib"] is None else \
            f"{j['memory_per_device_gib']:.1f} ({parts})"
        return (f"| {i} | {c.data} | {c.pipe} | {c.context} | {c.tensor} | {c.micro_batch_size} | "
                f"{c.num_microbatches} | {sched} | {_recompute(c)} | "
                f"{'yes' if c.scatter_gather else 'no'} | "
                f"{'yes' if c.sequence_parallel else 'no'} | {c.zero} | "
                f"{_params(j['params_per_device'])} | "
                f"{mem} | {_fmt(j['bubble'], '.3f')} | "
                f"{_fmt(j['step_time_s'], '.4f')} | {_fmt(j['tflops_per_gpu'], '.1f')} | "
                f"{_fmt(j['days'], '.1f')} | {note or c.reason} |")

    valid = [c for c in rows if c.ok]
    for i, c in enumerate(valid[:top], 1):
        lines.append(line(i, c, "recommended" if i == 1 else ""))
    seen = set()
    for c in rows:
        kind = c.reason.split(":")[0]
        if c.reason and kind not in seen:
            seen.add(kind)
            lines.append(line("x", c))
    return "\n".join(lines)


@command("ptdp-plan")
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.top < 1:
            raise ConfigError(f"--top must be a positive number of layouts to show, got "
                              f"{args.top}")
        items = parse_cli_overrides(args.overrides)
        hw = {k[3:]: v for k, v in items.items() if k.startswith("hw.")}
        overrides = {k: v for k, v in items.items() if not k.startswith("hw.")}
        if args.batch is not None:
            overrides["train.global_batch_size"] = args.batch
        cfg = load_config(args.config, overrides)
        hw = {**planned_fraction(), **hw}
        try:
            kind = with_overrides(gpu_kind(args.gpu), hw)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        fixed = {k: getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1])
                 for k in LAYOUT_KEYS if k in overrides}     # (auto values are searched)
        rows = plan(cfg, args.gpus, kind, args.gpus_per_host, tokens=args.tokens, fixed=fixed,
                    documents=planned_documents(cfg))
    except ConfigError as e:
        print(f"ptdp-plan: config error: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    if args.json:
        print(json.dumps([c.to_json() for c in rows], indent=1))
        return _no_layout(args, cfg, rows)
    m = cfg.model
    print(f"{m.arch.upper()} l={m.num_layers} h={m.hidden_size} heads={m.num_heads} "
          f"s={m.seq_len} V={m.vocab_size}: {_parameters(m)}; "
          f"global batch {cfg.train.global_batch_size}; {args.gpus} x "
          f"{kind.name} ({kind.memory_bytes / GiB:.1f} GiB, limit "
          f"{kind.usable_memory_fraction:.0%}), "
          f"{args.gpus_per_host} per host; "
          f"days for {args.tokens:.3g} tokens")
    print(f"GPU kind: {kind.source}")
    print()
    print(format_table(rows, args.top))
    print(f"\n{sum(c.ok for c in rows)} valid layouts of {len(rows)}; "
          f"rejected: {_rejected(rows) or 'none'}")
    return _no_layout(args, cfg, rows)


def _parameters(m) -> str:
    """The model's parameter count (its tensors, the padded vocabulary's rows included); for
    GPT also the paper's formula (which the paper's model names use) where it shows otherwise."""
    real, paper = _params(num_params(m)), _params(paper_param_count(m))
    formula = f" ({paper} by the paper's formula)" if m.arch == "gpt" and paper != real else ""
    return f"{real} parameters{formula}"


def planned_fraction(environ=os.environ) -> dict:
    """hw.usable_memory_fraction as the user's XLA_PYTHON_CLIENT_MEM_FRACTION gives it (the
    limit ptdp-train would run under), {} where it is unset (the kind's, the commands' own)."""
    from ptdp_jax.config.memory_limit import VARIABLE
    value = environ.get(VARIABLE)
    try:
        return {"usable_memory_fraction": float(value)} if value else {}
    except ValueError:
        return {}


def _rejected(rows: list[Candidate]) -> str:
    """The rejected rows counted by reason, e.g. "not divisible 13"."""
    return ", ".join(f"{k} {n}" for k, n in rejected_summary(rows).items())


def _no_layout(args, cfg, rows: list[Candidate]) -> int:
    """ExitCode.CONFIG with one line on stderr where no layout is valid (the input asks for
    the impossible: a user error, not a bug); ExitCode.OK otherwise."""
    if not rows or rows[0].ok:
        return ExitCode.OK
    batch = f"--batch {args.batch}" if args.batch is not None else \
        f"train.global_batch_size={cfg.train.global_batch_size}"
    print(f"ptdp-plan: config error: no valid layout for --gpus {args.gpus} and {batch}: "
          f"all {len(rows)} rejected ({_rejected(rows)}), e.g. {rows[0].reason} "
          "(see the rejected rows)", file=sys.stderr)
    return ExitCode.CONFIG


if __name__ == "__main__":
    sys.exit(main())
