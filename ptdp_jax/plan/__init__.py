"""ptdp-plan: predict the step time and memory of every (d, p, t, micro batch, schedule, virtual
stages, recompute, scatter/gather) layout of a model before renting the GPUs.

    from ptdp_jax.plan import plan, choose_layout
    rows = plan(cfg, num_gpus=64, gpu="a100")          # recommended first
    choose_layout(cfg, num_devices=4, gpus_per_host=4)  # dotted overrides of the best layout

Pieces: `hardware` (GPU kinds), `cost` (per-op seconds), `play` (tick tables played with those
costs), `estimate` (one layout's step), `search` (enumerate, reject, rank); the command `ptdp-plan` is cli/plan.py.
"""
from ptdp_jax.plan.search import LAYOUT_KEYS, Candidate, choose_layout, plan

__all__ = ["LAYOUT_KEYS", "Candidate", "choose_layout", "plan"]
