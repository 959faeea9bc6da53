"""One process of a multi-process test run (tests/test_multihost.py):

    python tests/multihost_worker.py OUT_DIR [ptdp-train arguments ...]

Runs `ptdp_jax.cli.train.main` with the arguments, recording every sample (row) this
process reads from the dataset, and once training returns writes
OUT_DIR/proc<i>.json (process index and count, losses, rows read, seconds) and
OUT_DIR/proc<i>.npz (the final canonical parameters as train(return_params=True)
returns them: on process 0 only). Written then because a multi-process `main` ends
the process itself. XLA_FLAGS (the fake CPU device count) comes from the environment.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T0 = time.monotonic()


def main() -> int:
    out_dir, argv = Path(sys.argv[1]), sys.argv[2:]
    import numpy as np

    import importlib

    from ptdp_jax.cli import train as cli
    T = importlib.import_module("ptdp_jax.run.loop")     # the module (ptdp_jax.run.loop is also a function)

    from ptdp_jax.data.dataset import BlendedStream

    reads: list[list] = []                         # [split, [global sample index, ...]] per read
    orig_get, orig_train = BlendedStream.get, T.train

    def counting_get(self, idx):
        reads.append([self.split, [int(i) for i in np.asarray(idx).ravel()]])
        return orig_get(self, idx)

    def recording_train(*a, **k):
        k["return_params"] = True                  # the CLI does not ask for them
        r = orig_train(*a, **k)
        record(out_dir, r, reads)
        return r

    BlendedStream.get, T.train = counting_get, recording_train
    return cli.main(argv)


def record(out_dir: Path, r, reads) -> None:
    import jax
    import numpy as np
    me = jax.process_index()
    info = {"process_index": me, "process_count": jax.process_count(),
            "local_devices": jax.local_device_count(), "devices": jax.device_count(),
            "losses": r.losses, "val_losses": r.val_losses, "start_step": r.start_step,
            "reads": reads, "seconds": time.monotonic() - T0}
    if r.params is not None:                       # process 0 only
        flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
                for path, v in jax.tree_util.tree_flatten_with_path(r.params)[0]}
        np.savez(out_dir / f"proc{me}.npz", **flat)
    (out_dir / f"proc{me}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    sys.exit(main())
