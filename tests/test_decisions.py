"""One test per rule of ptdp_jax/config/decisions.py: what each decides, and that its tuning.* key (where
it has one) overrides it. Configs only: nothing is compiled here (the tests of each feature
check what the rule's choice does)."""
import io
import os

import pytest

from ptdp_jax.config import decisions as D
from ptdp_jax.config.load import load_config


def cfg(**ov):
    return load_config(overrides=ov)


def test_dtype():
    assert D.dtype("auto", "gpu") == "bfloat16" and D.dtype("auto", "cpu") == "float32"
    assert D.dtype("float32", "gpu") == "float32" and D.dtype("bfloat16", "cpu") == "bfloat16"
    assert cfg().compute_dtype == D.dtype("auto", D.platform())


def test_attention():
    import jax.numpy as jnp
    assert D.attention("auto", jnp.bfloat16, "gpu") == "cudnn"
    assert D.attention("auto", jnp.float32, "gpu") == "xla"
    assert D.attention("auto", jnp.bfloat16, "cpu") == "xla"
    assert D.attention("xla", jnp.bfloat16, "gpu") == "xla"         # tuning.attention


def test_recompute():
    assert D.recompute("auto") == "none"                              # nothing to measure
    assert D.recompute("auto", lambda r: r != "none") == "selective"
    assert D.recompute("auto", lambda r: r == "full") == "full"
    assert D.recompute("auto", lambda r: False) == "full"
    assert D.recompute("selective", lambda r: False) == "selective"   # as set
    assert cfg().recompute == "none" and cfg(**{"train.recompute": "full"}).recompute == "full"


@pytest.mark.parametrize("recompute, keep, policy", [
    ("selective", "auto", "selective+act"), ("selective", True, "selective+act"),
    ("selective", False, "selective"), ("none", "auto", "none"), ("full", "auto", "full")])
def test_keep_ffn_activation_and_remat(recompute, keep, policy):
    c = cfg(**{"train.recompute": recompute, "tuning.keep_ffn_activation": keep})
    assert D.remat(c) == c.remat == policy
    assert D.keep_ffn_activation(c) is (keep != False)     # noqa: E712


def test_scan_layers():
    z3 = {"parallel.zero": 3, "parallel.data": 2}
    assert D.scan_layers(cfg(**z3)) and not D.scan_layers(cfg())
    assert not D.scan_layers(cfg(**z3, **{"parallel.pipe": 2}))
    assert not D.scan_layers(cfg(**z3, **{"tuning.scan_layers": False}))
    assert D.scan_layers(cfg(**{"tuning.scan_layers": True}))


def test_static_stash_and_chunk_pools():
    for name, on in (("1f1b", True), ("1f1b-phased", True), ("zb-phased", True), ("gpipe", False),
                     ("interleaved", False), ("zb-h1", False), ("zb-v", False)):
        assert D.static_stash(cfg(**{"parallel.schedule": name})) is on, name
    assert D.static_stash(cfg(**{"parallel.schedule": "gpipe", "tuning.static_stash": True}))
    assert not D.static_stash(cfg(**{"tuning.static_stash": False}))
    phased2 = {"parallel.schedule": "zb-phased", "parallel.virtual_stages": 2}
    assert D.stash_chunk_pools(cfg(**phased2))
    assert not D.stash_chunk_pools(cfg(**phased2, **{"tuning.static_stash": False}))
    assert not D.stash_chunk_pools(cfg(**{"parallel.schedule": "zb-phased"}))


def test_empty_buffers_and_overlap_p2p():
    assert D.empty_buffers(cfg()) and not D.empty_buffers(cfg(**{"parallel.tensor": 2}))
    phased = {"parallel.schedule": "1f1b-phased", "parallel.pipe": 2}
    assert D.overlap_p2p(cfg(**phased))
    assert not D.overlap_p2p(cfg(**{**phased, "parallel.pipe": 1}))
    assert not D.overlap_p2p(cfg(**{**phased, "parallel.schedule": "1f1b"}))


def test_overlap_grad_reduce():
    d = {"parallel.data": 2}
    assert [D.overlap_grad_reduce(cfg(**d, **{"parallel.zero": z})) for z in range(4)] == \
        [False, True, True, True]
    assert not D.overlap_grad_reduce(cfg(**d, **{"parallel.zero": 1, "parallel.pipe": 2}))
    assert not D.overlap_grad_reduce(cfg(**d, **{"parallel.zero": 1,
                                                 "tuning.overlap_grad_reduce": False}))


def test_tp_comm_overlap():
    sp = {"parallel.sequence_parallel": True, "parallel.tensor": 4,
          "train.global_batch_size": 4, "train.micro_batch_size": 4}         # m = 1
    assert D.tp_comm_overlap(cfg(**sp))
    assert not D.tp_comm_overlap(cfg(**{**sp, "train.global_batch_size": 8}))       # m = 2
    assert not D.tp_comm_overlap(cfg(**sp, **{"train.fp8": True}))
    assert not D.tp_comm_overlap(cfg(**sp, **{"tuning.tp_comm_overlap": False}))
    forced = cfg(**{**sp, "tuning.tp_comm_overlap": True, "train.global_batch_size": 8})
    assert D.tp_comm_overlap(forced)
    assert D.tp_comm_overlap_devices(cfg(**sp), True)
    assert not D.tp_comm_overlap_devices(cfg(**sp), False)      # CPU, or across processes
    assert D.tp_comm_overlap_devices(forced, False)             # true: wherever it runs


def test_nccl_environment():
    assert D.nccl_environment(cfg(**{"parallel.tensor": 2}), "gpu", {}) == \
        {"NCCL_MIN_NCHANNELS": "64"}
    assert D.nccl_environment(cfg(), "gpu", {}) == {}
    assert D.nccl_environment(cfg(**{"parallel.tensor": 2}), "cpu", {}) == {}
    assert D.nccl_environment(cfg(**{"parallel.tensor": 2}), "gpu",
                              {"NCCL_MIN_NCHANNELS": "8"}) == {}


def test_xla_options():
    no_merge = {"xla_gpu_dot_merger_threshold_mb": 0}
    assert D.xla_options(cfg(), "cpu", False) == {}
    assert D.xla_options(cfg(), "gpu", False) == no_merge
    assert D.xla_options(cfg(**{"parallel.pipe": 2}), "gpu", False) == \
        {**no_merge, "xla_gpu_copy_insertion_use_region_analysis": True}
    assert D.xla_options(cfg(), "gpu", True)["xla_gpu_collective_permute_mode"] == \
        D.PERMUTE_PEER_MODE
    assert D.xla_options(cfg(**{"train.fp8": True}), "gpu", False)["xla_gpu_enable_triton_gemm"] \
        is False
    z2 = D.xla_options(cfg(**{"parallel.zero": 2, "parallel.data": 2}), "gpu", False)
    assert z2["xla_gpu_reduce_scatter_combine_threshold_bytes"] == D.SCATTER_COMBINE_BYTES


def test_layout_source():
    mesh, fill = set(D.MESH_KEYS), set(D.FILL_KEYS)
    c = cfg(**{"parallel.data": 4})
    assert D.layout_source(c, mesh, set(), 8, "cpu") == "written"
    assert D.layout_source(c, mesh, set(), 8, "gpu") == "written"
    assert D.layout_source(c, mesh, set(), 2, "gpu").startswith("the config's mesh")
    assert D.layout_source(c, set(), set(), 2, "gpu").startswith("the config sets no mesh")
    assert D.layout_source(c, mesh, mesh, 8, "gpu") == "fill"
    assert D.layout_source(c, mesh | fill, mesh, 8, "gpu") == "written"
    auto = cfg(**{"parallel.layout": "auto"})
    assert D.layout_source(auto, mesh, set(), 8, "cpu") == "parallel.layout=auto"
    assert D.planner_fixed("fill", mesh | {"x"}, mesh) == mesh | {"x"}
    assert D.planner_fixed("parallel.layout=auto", mesh | {"x"}, {"y"}) == {"y"}


def test_progress_bar_and_tensorboard(monkeypatch):
    monkeypatch.undo()                   # the rule itself (conftest turns the bar off in tests)
    assert not D.progress_bar(io.StringIO())

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    assert D.progress_bar(Terminal())
    try:
        import tensorboardX  # noqa: F401
        installed = True
    except ImportError:
        installed = False
    assert D.tensorboard() is installed


def test_cache_dirs():
    assert D.cache_dir({"PTDP_CACHE_DIR": "/x"}) == "/x"
    assert D.cache_dir({"XDG_CACHE_HOME": "/c"}) == os.path.join("/c", "ptdp_jax")
    assert D.compile_cache_dir("off", None) is None and D.compile_cache_dir(False, "/j") is None
    assert D.compile_cache_dir("auto", "/j") == "/j"
    assert D.compile_cache_dir(True, None, {"XDG_CACHE_HOME": "/c"}) == "/c/ptdp_jax/xla"
    assert D.compile_cache_dir("~/here", None) == os.path.expanduser("~/here")


def test_constants():
    assert D.MAX_BAD_STEPS == 5
    assert (D.SAMPLE_PROMPT, D.SAMPLE_TEMPERATURE, D.SAMPLE_TOP_K) == ("The ", 0.6, 20)


def test_every_rule_is_short_and_says_why():
    """One short function per decision, its docstring the rule and (for the measured ones) the
    measurement: a date or a device in it."""
    import inspect
    for name, fn in inspect.getmembers(D, inspect.isfunction):
        if fn.__module__ != D.__name__ or name.startswith("_"):
            continue
        lines = inspect.getsource(fn).splitlines()
        assert len(lines) <= 40, name
        assert fn.__doc__, name
