"""ptdp-import-hf: a Hugging Face GPT-2 or LLaMA directory as a checkpoint."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ptdp_jax.command import command
from ptdp_jax.config.load import ConfigError, parse_cli_overrides
from ptdp_jax.exits import ExitCode
from ptdp_jax.interop.hf_import import (_shown, check_destination, config_path, hf_tokenizer,
                                        import_config, import_hf, write_checkpoint,
                                        write_config)


@command("ptdp-import-hf", starts_jax=True)
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="ptdp-import-hf",
        description="Turn a Hugging Face GPT-2 or LLaMA directory into a ptdp_jax checkpoint "
                    "at step 0 and CHECKPOINT_DIR.yaml (train from it with ptdp-train "
                    "CHECKPOINT_DIR.yaml).")
    ap.add_argument("hf_dir", help="directory with config.json and *.safetensors")
    ap.add_argument("checkpoint_dir", help="a new or empty checkpoint.dir")
    ap.add_argument("overrides", nargs="*", metavar="key=value",
                    help="model.dropout, model.init_std, a shorter "
                         "model.seq_len (anything else is refused)")
    args = ap.parse_args(argv)
    from ptdp_jax.config.memory_limit import use_planned_fraction
    use_planned_fraction()                  # before jax starts its backend
    yaml_path = config_path(args.checkpoint_dir)
    try:
        check_destination(args.checkpoint_dir)
        overrides = parse_cli_overrides(args.overrides)
        model, params = import_hf(args.hf_dir)
        cfg, params = import_config(model, overrides, params)
        step_dir = write_checkpoint(cfg, params, args.checkpoint_dir,
                                    hf_tokenizer(args.hf_dir, cfg.model.vocab_size))
    except (ValueError, ConfigError) as e:
        print(f"ptdp-import-hf: {e}", file=sys.stderr)
        return ExitCode.CONFIG
    write_config(model, overrides, args.checkpoint_dir, args.hf_dir)
    tok = Path(args.hf_dir) / "tokenizer.json"
    prepare = f" --tokenizer {args.hf_dir}" if tok.is_file() else ""
    print(f"wrote {step_dir} and {yaml_path} (the model.* settings and checkpoint.dir); "
          f"continue training from it with\n  ptdp-train {_shown(yaml_path)}\nadding "
          f"data.path=PREFIX (a token file of this vocabulary: ptdp-prepare-data FILES --out "
          f"PREFIX{prepare}), --mesh d,p,t and train.* settings as needed")
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
