"""Checkpoints: saving and restoring the train state with orbax (manager), the on-disk format,
its metadata and checks (format), reading older versions (upgrade). May import training/ and
below."""

from ptdp_jax.checkpoint.manager import *  # noqa: F401,F403  (the public checkpoint API)
