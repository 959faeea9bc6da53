"""ptdp-generate: continue a prompt from a checkpoint."""
from __future__ import annotations

import argparse
import sys

from ptdp_jax.command import command
from ptdp_jax.run.generate import generate


@command("ptdp-generate", starts_jax=True)
def main(argv=None) -> int:
    from ptdp_jax.config.memory_limit import use_planned_fraction
    use_planned_fraction()                  # before jax starts its backend
    from ptdp_jax.exits import ExitCode, leave_now
    try:
        return _generate(argv)
    except KeyboardInterrupt:
        leave_now(ExitCode.INTERRUPTED, "ptdp-generate: interrupted")


def _generate(argv) -> int:
    from ptdp_jax.checkpoint.manager import CheckpointError, checkpoint_tokenizer, load_params
    from ptdp_jax.data.sources import model_tokenizer
    from ptdp_jax.exits import ExitCode

    ap = argparse.ArgumentParser(
        prog="ptdp-generate", description="Generate text from a ptdp_jax checkpoint.",
        epilog='example: ptdp-generate ckpt/ --prompt "The " --max-new-tokens 200 '
               '--temperature 0.8 --top-k 40')
    ap.add_argument("checkpoint", help="a step directory (CKPT_DIR/STEP) or a checkpoint.dir "
                                       "(its newest complete step)")
    ap.add_argument("--prompt", required=True, help="the text to continue")
    ap.add_argument("--max-new-tokens", type=int, default=100, metavar="N")
    ap.add_argument("--temperature", type=float, default=0.0, metavar="T",
                    help="0 (the default): greedy; > 0: sample")
    ap.add_argument("--top-k", type=int, default=0, metavar="K",
                    help="sample among the K likeliest tokens (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="byte, or a tokenizer.json (default: the one of the "
                                        "checkpoint's training data; another vocabulary "
                                        "than that one is refused)")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 0 or args.temperature < 0 or args.top_k < 0:
        print("ptdp-generate: --max-new-tokens, --temperature and --top-k must be >= 0",
              file=sys.stderr)
        return ExitCode.CONFIG
    try:
        cfg, params = load_params(args.checkpoint)
        _, tok = model_tokenizer(list(cfg.data.path), cfg.model.vocab_size, args.tokenizer,
                                 checkpoint_tokenizer(args.checkpoint))
    except CheckpointError as e:
        print(f"ptdp-generate: checkpoint error: {e}", file=sys.stderr)
        return ExitCode.CHECKPOINT
    except (ValueError, FileNotFoundError) as e:
        print(f"ptdp-generate: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    out = generate(cfg.model, params, tok.encode(args.prompt), args.max_new_tokens,
                   temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(args.prompt + tok.decode(out))
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
