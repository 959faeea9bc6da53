"""What runs: a config's `auto` values and its layout resolved for the devices at hand, before
anything compiles (train() and dry_run()). The rules are decisions.py's; this module applies
them: the precision (decisions.dtype), the layout (decisions.layout_source, the planner in
plan/search.py), then the recomputation (decisions.recompute, by the memory estimate).

    run = for_devices(cfg, explicit, command_line, jax.devices(), log=print)
    run.config, run.note      # the Config that runs; the line that says where its layout is from
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ptdp_jax.config import decisions as D
from ptdp_jax.config.load import Config, ConfigError, load_config
from ptdp_jax.config.validation import validate
from ptdp_jax.plan.documents import Documents, attention_share
from ptdp_jax.pipeline.schedule import check_table

GiB = 2 ** 30


@dataclass(frozen=True)
class Run:
    config: Config
    note: str = ""                  # the layout line printed before compiling ("" on CPU as written)
    predicted_step_s: float | None = None
    memory_gib: float | None = None
    attention_share: float = 1.0    # document masking's share of the causal pairs (the data's)


def for_devices(cfg: Config, explicit, command_line, devices, log=print,
                local_devices: int | None = None, gpu=None) -> Run:
    """cfg resolved for `devices` (jax devices, all processes') and validated. explicit: the
    dotted keys the file or the command line set (config.load_with_keys); command_line: those
    of the command line (--mesh included). The layout line goes to `log`. gpu: the planner's
    GPU kind (None: jax's first local device's, plan.hardware.detect_gpu_kind)."""
    on = devices[0].platform
    local = local_devices if local_devices is not None else len(devices)
    cfg = replace(cfg, train=replace(cfg.train, dtype=D.dtype(cfg.train.dtype, on)))
    source = D.layout_source(cfg, set(explicit), set(command_line), len(devices), on)
    docs = planned_documents(cfg)
    run = Run(cfg) if source == "written" else _planned(
        cfg, source, set(explicit), set(command_line), len(devices), local, gpu, on, docs)
    validate(run.config, len(devices))
    check_table(run.config)                  # zb-v's table exists
    run = replace(run, config=_with_recompute(run.config),
                  attention_share=attention_share(docs))
    if on == "gpu" and source == "written":
        run = _predicted(run, local, "layout as written", gpu, docs)
    if run.note:
        log(run.note)
    return run


def planned_documents(cfg):
    """With data.document_mask: the documents of the train stream's first rows, which the
    planner prices masked attention by (plan/documents.py); None without it, or where the
    data cannot be read (opening it for the run then says why)."""
    if not cfg.data.document_mask:
        return None
    from ptdp_jax.data.documents import stream_documents
    from ptdp_jax.run.feed import open_streams
    try:
        _, stream, _ = open_streams(cfg)
        return Documents(stream_documents(stream, D.document_end(cfg)))
    except (ConfigError, OSError):
        return None


def _planned(cfg, source: str, explicit: set, command_line: set, n: int, local: int,
             gpu=None, on: str = "gpu", documents=None) -> Run:
    """The planner's best layout, keeping the keys decisions.planner_fixed says. Its step time
    is predicted for GPUs of the planner's kind: on other devices (`on`, jax's platform) the
    line says so and predicts none."""
    from ptdp_jax.plan import LAYOUT_KEYS
    from ptdp_jax.plan.hardware import detect_gpu_kind, gpu_kind
    from ptdp_jax.plan.search import best_layout
    keep = D.planner_fixed(source, explicit, command_line)
    fixed = {k: _value(cfg, k) for k in LAYOUT_KEYS if k in keep and _value(cfg, k) != "auto"}
    if set(D.MESH_KEYS) <= keep:
        n = cfg.parallel.num_devices                                     # the mesh is given
    kind = detect_gpu_kind() if gpu is None else gpu_kind(gpu) if isinstance(gpu, str) else gpu
    best = best_layout(cfg, n, max(1, min(n, local)), kind, fixed=fixed, documents=documents)
    chosen = load_config(cfg, {**best.overrides(), **fixed})
    why = "the planner filled in the layout keys nothing set" if source == "fill" else \
        f"{source}: the planner's layout for {n} devices"
    if on == "gpu":
        return Run(chosen, *_line(chosen, why, best.estimate, best.memory))
    note, _, gib = _line(chosen, why, None, best.memory)
    return Run(chosen, f"{note}; planned as for {kind.name} GPUs, so no step time is "
                       f"predicted on {on}", None, gib)


def _predicted(run: Run, local: int, why: str, gpu=None, documents=None) -> Run:
    """run with the planner's prediction of its layout (GPUs of a kind it knows)."""
    from ptdp_jax.plan.estimate import estimate_step
    from ptdp_jax.plan.hardware import detect_gpu_kind, gpu_kind
    try:
        kind = detect_gpu_kind() if gpu is None else gpu_kind(gpu) if isinstance(gpu, str) else gpu
        est = estimate_step(run.config, kind, local, documents)
    except Exception:            # the line is for the user: a layout the model misses still runs
        return run
    return replace(run, **dict(zip(("note", "predicted_step_s", "memory_gib"),
                                   _line(run.config, why, est, est.memory))))


def _line(cfg, why: str, est, mem) -> tuple[str, float | None, float | None]:
    """(the layout line, predicted seconds a step, GiB a device)."""
    p, t = cfg.parallel, cfg.train
    d, pp, tp = p.mesh_shape
    v = f" v {p.virtual_stages}" if p.virtual_stages > 1 else ""
    step = est.step_time_s if est is not None else None
    gib = mem.peak / GiB if mem is not None else None
    ctx = f", context {p.context}" if p.context > 1 else ""
    return (f"{why}: mesh (data, pipe, tensor) = ({d}, {pp}, {tp}){ctx}, {p.schedule}{v}, "
            f"{cfg.microbatch_split}, zero {p.zero}, "
            f"recompute {t.recompute}, {t.dtype}"
            + (f"; predicted {step:.4f} s a step" if step is not None else "")
            + (f", {gib:.1f} GiB a device" if gib is not None else ""), step, gib)


def spelled_out(cfg: Config) -> Config:
    """cfg with the model sizes that null stands for written out (model.ffn_hidden_size, and
    LLaMA's model.num_kv_heads), as ptdp-train --print-config shows the config that runs."""
    m = cfg.model
    kv = m.kv_heads if m.arch == "llama" else m.num_kv_heads
    return replace(cfg, model=replace(m, ffn_hidden_size=m.ffn, num_kv_heads=kv))


def _with_recompute(cfg: Config) -> Config:
    """train.recompute=auto resolved by the memory estimate against a device
    (decisions.recompute)."""
    if cfg.train.recompute != "auto":
        return cfg
    from ptdp_jax.training.memory import device_memory_bytes, estimate_memory
    have = device_memory_bytes()

    def fits(r: str) -> bool:
        return estimate_memory(replace(cfg, train=replace(cfg.train, recompute=r))).peak <= have
    r = D.recompute("auto", fits if have else None)
    return replace(cfg, train=replace(cfg.train, recompute=r))


def _value(cfg, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)
