"""ptdp-export: a checkpoint as a Hugging Face model directory."""
from __future__ import annotations

import argparse
import sys

from ptdp_jax.checkpoint.manager import CheckpointError
from ptdp_jax.command import command
from ptdp_jax.exits import ExitCode
from ptdp_jax.interop.export import DTYPES, export_checkpoint
from ptdp_jax.config.memory_limit import use_planned_fraction


@command("ptdp-export", starts_jax=True)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="ptdp-export",
        description="Export a ptdp_jax checkpoint as a Hugging Face model directory "
                    "(config.json + model.safetensors): GPT as GPT2LMHeadModel, "
                    "LLaMA as LlamaForCausalLM.")
    ap.add_argument("checkpoint", help="a step directory (CKPT_DIR/STEP) or a checkpoint.dir "
                                       "(its newest complete step)")
    ap.add_argument("out_dir", help="output directory (created): new, empty or an earlier "
                                    "export; never a checkpoint.dir or inside one")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an export already in OUT_DIR (refused otherwise); other "
                         "files in OUT_DIR are refused even so")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--tokenizer", help="byte, or a tokenizer.json (default: the tokenizer of "
                                        "the checkpoint's training data)")
    args = ap.parse_args(argv)
    use_planned_fraction()                  # before jax starts its backend
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, args.dtype, args.tokenizer,
                                args.overwrite)
    except CheckpointError as e:
        print(f"ptdp-export: {e}", file=sys.stderr)
        return ExitCode.CHECKPOINT
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"ptdp-export: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    print(f"wrote {out / 'config.json'}, {out / 'model.safetensors'} and {out / 'tokenizer.json'}")
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
