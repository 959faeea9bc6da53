"""`ptdp-train [CONFIG] [--mesh d,p,t] [key=value ...]`: a thin shell over train().

    ptdp-train configs/demo.yaml --print-config     # the config as it would run here, as YAML
    ptdp-train configs/demo.yaml --dry-run          # validate, compile, memory and FLOPs; exit

Exit codes: ptdp_jax.exits.ExitCode.
"""
from __future__ import annotations

import argparse
import sys

from ptdp_jax.command import command
from ptdp_jax.config.load import ConfigError, parse_cli_overrides, parse_mesh
from ptdp_jax.exits import ExitCode, leave_now
from ptdp_jax.config.memory_limit import use_planned_fraction
from ptdp_jax.paths import os_error_line


def version() -> str:
    """'ptdp_jax 0.1.0, jax 0.10.2 (jaxlib 0.10.2)': what --version prints."""
    import jax
    import jaxlib

    from ptdp_jax import __version__
    return f"ptdp_jax {__version__}, jax {jax.__version__} (jaxlib {jaxlib.__version__})"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="ptdp-train", description="Train a GPT or LLaMA model with PTD-P parallelism.",
        epilog="example: ptdp-train configs/demo.yaml --mesh 2,2,2 train.steps=50 "
               "parallel.schedule=1f1b parallel.virtual_stages=1")
    ap.add_argument("--version", action="version", version=version(),
                    help="print the versions of ptdp_jax and jax, and exit")
    ap.add_argument("config", nargs="?", help="YAML file of overrides (default: built-in defaults)")
    ap.add_argument("--mesh", help="data,pipe,tensor sizes, e.g. 2,2,2 (default: the config's)")
    ap.add_argument("--resume", dest="resume", action="store_true", default=None,
                    help="resume from the newest checkpoint in checkpoint.dir (the default)")
    ap.add_argument("--no-resume", dest="resume", action="store_false",
                    help="start fresh; refused if checkpoint.dir holds checkpoints (with "
                         "checkpoint.resume=overwrite they are removed at the first save)")
    ap.add_argument("--print-config", action="store_true",
                    help="print the config as it would run on the devices here (layout, "
                         "precision and recomputation resolved, the config's own rules checked; "
                         "--dry-run also checks the data, checkpoint and memory) as YAML and exit")
    ap.add_argument("--dry-run", action="store_true",
                    help="validate, build the mesh, compile the step, report memory per device "
                         "and FLOPs per step, then exit")
    ap.add_argument("--coordinator", help="host:port of process 0 (multi-process runs)")
    ap.add_argument("--num-processes", type=int, help="number of processes (multi-process runs)")
    ap.add_argument("--process-id", type=int, help="this process's index (multi-process runs)")
    ap.add_argument("--heartbeat-timeout", type=float, metavar="S",
                    help="multi-process: stop when another process is silent this long "
                         "(default 60 s, or PTDP_HEARTBEAT_TIMEOUT)")
    ap.add_argument("--init-timeout", type=int, metavar="S",
                    help="multi-process: wait this long for every process to connect "
                         "(default 300 s, or PTDP_INIT_TIMEOUT)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    args = ap.parse_intermixed_args(argv)
    # A first positional of the form key=value is an override, not a config path.
    if args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    return args


@command("ptdp-train", quiet_pipe=False, starts_jax=True)
def main(argv=None) -> int:
    args = parse_args(argv)
    use_planned_fraction()                  # before jax starts its backend
    from ptdp_jax.parallel import distributed as distributed
    from ptdp_jax.parallel.stopping import quiet_after_a_stop
    with quiet_after_a_stop():              # a second SIGTERM: still exit 0
        rc, why = _main(args)
    # Multi-process: tell the other processes and leave (a failed one at once, so they stop
    # too; a clean one in order, so that no process prints gRPC errors on the way out).
    distributed.finish(rc == 0, why, exit_code=rc)
    if rc == ExitCode.INTERRUPTED:
        leave_now(rc)
    return rc


def _fail(code: ExitCode, what: str) -> tuple[int, str]:
    print(f"ptdp-train: {what}", file=sys.stderr)
    return code, what


def _main(args) -> tuple[int, str]:
    from ptdp_jax.checkpoint.manager import CheckpointError
    from ptdp_jax.parallel.distributed import maybe_initialize
    from ptdp_jax.parallel.rendezvous import DistributedError
    from ptdp_jax.run.dry_run import dry_run
    from ptdp_jax.run.loop import TrainingStopped, resolved_config, train
    from ptdp_jax.run.phases import DeviceMemoryError
    try:
        overrides = parse_cli_overrides(args.overrides)
        if args.resume is not None:             # a dotted checkpoint.resume=... still wins
            overrides.setdefault("checkpoint.resume", args.resume)
        mesh = parse_mesh(args.mesh) if args.mesh else None
        if args.print_config:
            from ptdp_jax.config.load import to_yaml
            from ptdp_jax.run.resolve import spelled_out
            print(to_yaml(spelled_out(resolved_config(args.config, mesh, overrides))), end="")
            return ExitCode.OK, ""
        maybe_initialize(args.coordinator, args.num_processes, args.process_id,
                         heartbeat_timeout=args.heartbeat_timeout, init_timeout=args.init_timeout)
        if args.dry_run:
            dry_run(args.config, mesh_shape=mesh, overrides=overrides)
        else:
            train(args.config, mesh_shape=mesh, overrides=overrides, return_params=False)
    except ConfigError as e:
        return _fail(ExitCode.CONFIG, f"config error: {e}")
    except TrainingStopped as e:
        return _fail(ExitCode.STOPPED, f"stopped: {e}")
    except DeviceMemoryError as e:
        return _fail(ExitCode.OUT_OF_MEMORY, str(e))
    except DistributedError as e:
        return _fail(ExitCode.DISTRIBUTED_INIT, str(e))
    except CheckpointError as e:
        return _fail(ExitCode.CHECKPOINT, f"checkpoint error: {e}")
    except OSError as e:                   # a path that cannot be read or written
        if os_error_line(e) is None:
            raise
        return _fail(ExitCode.CONFIG, f"error: {os_error_line(e)}")
    except KeyboardInterrupt:
        return _fail(ExitCode.INTERRUPTED, "interrupted (a second Ctrl-C, or one before "
                                           "training started): stopped at once; a resume "
                                           "starts from the newest complete checkpoint")
    return ExitCode.OK, ""


if __name__ == "__main__":
    sys.exit(main())
