"""ptdp-eval: the validation loss and perplexity of a checkpoint."""
from __future__ import annotations

import argparse
import sys

from ptdp_jax.command import command
from ptdp_jax.run.evaluate import EVAL_KEYS, evaluate_checkpoint


@command("ptdp-eval", starts_jax=True)
def main(argv=None) -> int:
    from ptdp_jax.config.memory_limit import use_planned_fraction
    use_planned_fraction()                  # before jax starts its backend
    from ptdp_jax.checkpoint.manager import CheckpointError
    from ptdp_jax.config.load import ConfigError, parse_cli_overrides
    from ptdp_jax.exits import ExitCode, leave_now

    ap = argparse.ArgumentParser(
        prog="ptdp-eval",
        description="Validation loss and perplexity of a checkpoint (forward only, no dropout) "
                    "on its validation split, or on other data (data.path=...).",
        epilog="example: ptdp-eval ckpt/ --mesh 1,2,2 train.eval_batches=8")
    ap.add_argument("checkpoint", help="a step directory (CKPT_DIR/STEP) or a checkpoint.dir "
                                       "(its newest complete step)")
    ap.add_argument("--mesh", help="data,pipe,tensor sizes (default 1,1,1)")
    ap.add_argument("overrides", nargs="*", metavar="key=value",
                    help=f"{', '.join(EVAL_KEYS)} (model.* come from the checkpoint; "
                         "any other key is refused)")
    args = ap.parse_intermixed_args(argv)
    try:
        out = evaluate_checkpoint(args.checkpoint, mesh=args.mesh,
                                  overrides=parse_cli_overrides(args.overrides))
    except ConfigError as e:
        print(f"ptdp-eval: config error: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    except CheckpointError as e:
        print(f"ptdp-eval: checkpoint error: {e}", file=sys.stderr)
        return ExitCode.CHECKPOINT
    except KeyboardInterrupt:
        leave_now(ExitCode.INTERRUPTED, "ptdp-eval: interrupted")
    if out["layout"]:
        print(f"ptdp-eval: evaluating with {out['layout']}", file=sys.stderr)
    print(f"step {out['step']}: val loss {out['loss']:.4f}, perplexity {out['perplexity']:.2f} "
          f"({out['batches']} batches of {out['batch_size']} x {out['seq_len']} tokens)")
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
