"""Checkpoints: exact resume, resharding across layouts, the on-disk format, and the
clear errors for foreign, corrupt and mismatched checkpoint directories."""
import json
import pickle
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers_ckpt as H
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.training.state import canonical_params, make_optimizer
from ptdp_jax.training.step import compile_all
from ptdp_jax.run.loop import resolve_config, train

# A restore that fails inside tensorstore leaves orbax callbacks aimed at its closed
# asyncio loop; Python reports them later as unraisable. They are harmless.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")




def test_resume_is_bit_identical(tmp_path, data_cache):
    """20 steps in one go == 11 steps, SIGINT (while step 11 runs), then a new train() call
    resuming for 9 (same mesh, dropout on): losses and parameters exactly equal."""
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 20, "model.dropout": 0.1,
                                         "checkpoint.every": 4, "checkpoint.keep": 2})
    mesh = (2, 1, 2)
    base = train(mesh_shape=mesh, overrides={**ov, "checkpoint.dir": ""}, log=H.Log())

    log = H.Log(at=11, sig=signal.SIGINT)
    first = train(mesh_shape=mesh, overrides=ov, log=log)
    assert first.stopped_by_signal and len(first.losses) == 11
    assert "received SIGINT at step 11" in log.text
    ckpt = tmp_path / "ckpt"
    assert CK.CheckpointManager.from_config(resolve_config(None, mesh, ov),
                                            _shardings(ov, mesh)).steps() == [8, 11]

    second = train(mesh_shape=mesh, overrides=ov, log=H.Log())
    assert second.start_step == 11 and len(second.losses) == 9
    assert first.losses + second.losses == base.losses          # bit-identical
    assert H.trees_equal(second.params, base.params)
    assert sorted(int(p.name) for p in ckpt.iterdir()) == [16, 20]   # keep=2


def _shardings(ov, mesh):
    cfg = resolve_config(None, mesh, ov)
    return compile_all(cfg, make_mesh(mesh), make_optimizer(cfg)[0]).shardings


RESHARD_CHAIN = [
    ((8, 1, 1), {}),
    ((1, 1, 1), {}),
    ((2, 1, 4), {}),
    ((4, 1, 2), {}),
    ((2, 2, 2), {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
    ((1, 2, 4), {"parallel.schedule": "zb-v", "parallel.virtual_stages": 2}),
    ((1, 4, 2), {"parallel.schedule": "1f1b"}),
    ((1, 1, 1), {}),
]


def test_reshard_across_layouts(tmp_path, data_cache):
    """One step on each layout, each resuming from the checkpoint the previous one
    wrote: (8,1,1) -> (1,1,1) -> (2,1,4) -> (4,1,2) -> (2,2,2) interleaved v=2 ->
    (1,2,4) zb-v (the V placement) -> (1,4,2) 1F1B -> (1,1,1); the losses follow an
    uninterrupted run within float rounding."""
    steps = len(RESHARD_CHAIN)
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": steps})
    base = train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.dir": ""}, log=H.Log())
    losses = []
    for i, (mesh, extra) in enumerate(RESHARD_CHAIN):
        last = i == steps - 1
        res = train(mesh_shape=mesh, overrides={**ov, **extra},
                    log=H.Log(at=None if last else i + 1))
        assert res.start_step == i and len(res.losses) == 1, (mesh, extra)
        losses += res.losses
        step_dir = tmp_path / "ckpt" / str(i + 1)
        meta = CK.read_meta(step_dir)
        assert meta["layout"]["mesh"] == list(mesh)
        if mesh[1] > 1:
            # A pipelined run still writes the canonical layout: layers (L, ...) for the
            # parameters and both AdamW moments, no per-stage pieces.
            shapes = CK.stored_shapes(step_dir)
            L = ov["model.num_layers"]
            for name in ("params/layers/q_w", "opt/1/0/mu/layers/q_w",
                         "opt/1/0/nu/layers/q_w"):
                assert shapes[name] == (L, 32, 4, 8), (name, shapes[name])
            assert all(v[0] == L for k, v in shapes.items() if "/layers/" in k)
    np.testing.assert_allclose(losses, base.losses, rtol=2e-5, atol=0)
    for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(base.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- format and errors

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A config, its compiled pieces on (1,1,1), and a state with step 2."""
    d = tmp_path_factory.mktemp("small")
    ov = H.tiny(d, d / "data", **{"model.num_layers": 2})
    cfg = resolve_config(None, (1, 1, 1), ov)
    compiled = compile_all(cfg, make_mesh((1, 1, 1)), make_optimizer(cfg)[0])
    state = compiled.init()
    state = dict(state, step=jnp.int32(2),
                 opt=jax.tree.map(lambda x: x + 0.5 if x.ndim else x + 3, state["opt"]))
    return cfg, compiled, state


def _write(cfg, compiled, state, directory, steps=(2,)):
    from dataclasses import replace
    cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, dir=str(directory)))
    with CK.CheckpointManager.from_config(cfg, compiled.shardings) as m:
        for s in steps:
            m.save(s, dict(state, step=jnp.int32(s)))
    return cfg


def test_format_on_disk(tmp_path, small):
    cfg, compiled, state = small
    cfg = _write(cfg, compiled, state, tmp_path, steps=(2,))
    step_dir = tmp_path / "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2"]
    meta = json.loads((step_dir / "meta" / "ptdp_meta.json").read_text())
    assert meta["format"] == CK.FORMAT and meta["step"] == 2
    assert meta["data"]["consumed_samples"] == 2 * cfg.train.global_batch_size
    assert meta["rng"]["seed"] == cfg.train.seed
    assert CK.config_from_dict(meta["config"]) == cfg
    assert CK.checkpoint_config(step_dir) == cfg
    shapes = CK.stored_shapes(step_dir)
    assert shapes["params/layers/fc1_w"] == (2, 32, 128)
    assert shapes["opt/1/0/nu/layers/fc1_w"] == (2, 32, 128)
    assert shapes["params/embed/wte"] == (384, 32)
    files = [p.name for p in step_dir.rglob("*")]
    assert not any(n.endswith((".pkl", ".pickle", ".npy")) for n in files)


def test_load_never_unpickles(tmp_path, small, monkeypatch):
    cfg, compiled, state = small
    _write(cfg, compiled, state, tmp_path)

    def boom(*a, **k):
        raise AssertionError("pickle used while loading a checkpoint")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    m = CK.CheckpointManager(cfg, compiled.shardings, tmp_path)
    restored, step = m.restore_latest()
    m.close()
    assert step == 2
    assert H.trees_equal(jax.device_get(restored["opt"]), jax.device_get(state["opt"]))
    _, params = CK.load_params(tmp_path)
    assert H.trees_equal(params, jax.device_get(canonical_params(cfg, state["params"])))


def test_incomplete_checkpoint_is_ignored(tmp_path, small):
    """An orbax temporary directory (a save cut short) is never taken for complete."""
    cfg, compiled, state = small
    _write(cfg, compiled, state, tmp_path, steps=(2,))
    shutil.copytree(tmp_path / "2", tmp_path / "4.orbax-checkpoint-tmp")
    m = CK.CheckpointManager(cfg, compiled.shardings, tmp_path)
    assert m.steps() == [2]
    _, step = m.restore_latest()
    m.close()
    assert step == 2


def test_foreign_directory(tmp_path, small):
    cfg, compiled, state = small
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    before = H.snapshot(tmp_path)
    with pytest.raises(CK.CheckpointError, match="not ptdp_jax checkpoints.*notes.txt"):
        CK.CheckpointManager(cfg, compiled.shardings, tmp_path)
    assert H.snapshot(tmp_path) == before
    # a file where the directory should be
    with pytest.raises(CK.CheckpointError, match="not a directory"):
        CK.CheckpointManager(cfg, compiled.shardings, tmp_path / "notes.txt")
    # a step directory that is someone else's
    other = tmp_path / "other"
    (other / "7" / "data").mkdir(parents=True)
    m = CK.CheckpointManager(cfg, compiled.shardings, other)
    with pytest.raises(CK.CheckpointError, match="7 is not a ptdp_jax checkpoint"):
        m.restore_latest()
    m.close()


@pytest.mark.parametrize("damage", ["meta_garbled", "meta_foreign", "arrays_missing",
                                    "arrays_truncated"])
def test_corrupt_checkpoint(tmp_path, small, damage):
    cfg, compiled, state = small
    _write(cfg, compiled, state, tmp_path, steps=(2,))
    step_dir = tmp_path / "2"
    meta = step_dir / "meta" / "ptdp_meta.json"
    if damage == "meta_garbled":
        meta.write_text(meta.read_text()[:50])
        pattern = "corrupt: cannot read ptdp_meta.json"
    elif damage == "meta_foreign":
        meta.write_text(json.dumps({"format": "something-else"}))
        pattern = "is not a ptdp_jax checkpoint"
    elif damage == "arrays_missing":
        for f in (step_dir / "state").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.unlink()
        pattern = "corrupt or incomplete"
    else:
        for f in (step_dir / "state").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
        pattern = "corrupt or incomplete"
    before = H.snapshot(tmp_path)
    m = CK.CheckpointManager(cfg, compiled.shardings, tmp_path)
    with pytest.raises(CK.CheckpointError, match=pattern):
        m.restore_latest()
    m.close()
    assert H.snapshot(tmp_path) == before


def test_different_model_is_one_clear_error(tmp_path, data_cache):
    """train() against a checkpoint of another model: CheckpointError naming the
    settings, raised before anything is written."""
    ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2})
    cfg = resolve_config(None, (1, 1, 1), ov)
    compiled = compile_all(cfg, make_mesh((1, 1, 1)), make_optimizer(cfg)[0])
    _write(cfg, compiled, dict(compiled.init(), step=jnp.int32(2)), tmp_path / "ckpt")
    before = H.snapshot(tmp_path / "ckpt")
    with pytest.raises(CK.CheckpointError) as e:
        train(mesh_shape=(2, 1, 1), overrides={**ov, "model.hidden_size": 64,
                                               "model.num_layers": 4}, log=H.Log())
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert "model.hidden_size: checkpoint 32, config 64" in msg
    assert "model.num_layers: checkpoint 2, config 4" in msg
    assert "model.vocab_size" not in msg
    assert H.snapshot(tmp_path / "ckpt") == before


def test_resume_as_another_model_is_refused(tmp_path, small, data_cache):
    """Resuming with another model.norm_eps (same shapes, another model): refused before
    anything runs, naming the key and the way to change it on purpose."""
    cfg, compiled, state = small
    _write(cfg, compiled, state, tmp_path / "ckpt")
    ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2, "model.norm_eps": 1e-6,
                                         "train.steps": 4})
    with pytest.raises(CK.CheckpointError, match=r"model.norm_eps: checkpoint 1e-05, config "
                       r"1e-06\. .* checkpoint.load_weights="):
        train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())


def test_fresh_run_keeps_old_checkpoints_unless_told(tmp_path, small, data_cache):
    """checkpoint.resume=false (--no-resume) over a directory with checkpoints: refused
    before anything runs, the old checkpoints untouched; with
    checkpoint.resume=overwrite the new run's first save replaces them (so 'newest' is
    always this run's), and the run says so."""
    from dataclasses import replace
    cfg, compiled, state = small
    _write(cfg, compiled, state, tmp_path / "ckpt", steps=(8, 10))
    before = H.snapshot(tmp_path / "ckpt")
    ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2, "checkpoint.resume": False,
                                         "train.steps": 2})
    with pytest.raises(CK.CheckpointError, match=r"holds checkpoints of an earlier run \(steps "
                                                 r"8, 10\).*they are kept.*checkpoint.resume=overwrite"):
        train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    assert H.snapshot(tmp_path / "ckpt") == before
    fresh = replace(cfg, checkpoint=replace(cfg.checkpoint, dir=str(tmp_path / "ckpt"),
                                            resume=False))
    m = CK.CheckpointManager.from_config(fresh, compiled.shardings)
    with pytest.raises(CK.CheckpointError, match="they are kept"):      # the manager too
        m.save(2, dict(state, step=jnp.int32(2)))
    m.close()
    assert H.snapshot(tmp_path / "ckpt") == before
    log = H.Log()
    res = train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.resume": "overwrite"}, log=log)
    assert res.start_step == 0 and len(res.losses) == 2
    assert "(steps 8, 10) are removed at this run's first save" in log.text
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["2"]


def _fused_qkv(tree):
    """A version-2 train state (host arrays) in version 1's layout: GPT's q, k, v weights and
    biases stacked into qkv_w (L, h, 3, n, d) and qkv_b (L, 3, n, d)."""
    def fuse(g):
        if not (isinstance(g, dict) and "q_w" in g):
            return g
        out = {k: v for k, v in g.items() if k[0] not in "qkv" or k[1:] not in ("_w", "_b")}
        for s in ("_w", "_b"):
            parts = [g[c + s] for c in "qkv"]
            out["qkv" + s] = np.stack(parts, axis=parts[0].ndim - 2)
        return out
    return jax.tree.map(fuse, tree, is_leaf=lambda g: isinstance(g, dict) and "q_w" in g)


def _as_version_1(step_dir):
    """Rewrite a step directory as format version 1 wrote it (fused QKV, version 1 meta)."""
    import orbax.checkpoint as ocp
    _, v2_state, _ = CK.load_checkpoint(step_dir)
    shutil.rmtree(step_dir / "state")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(step_dir / "state", _fused_qkv(v2_state))
    meta_file = step_dir / "meta" / "ptdp_meta.json"
    meta = json.loads(meta_file.read_text())
    meta["version"] = 1
    layers = meta["param_shapes"]["layers"]
    for s in ("_w", "_b"):
        dims = [layers.pop(c + s) for c in "qkv"][0]
        layers["qkv" + s] = dims[:-2] + [3] + dims[-2:]
    meta_file.write_text(json.dumps(meta))


def test_run_resumes_from_a_version_1_checkpoint(tmp_path, data_cache):
    """A run stopped before GPT's q, k, v were split resumes after the change: it says so,
    and its losses are those of an uninterrupted run, bit for bit."""
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 4, "checkpoint.every": 2})
    mesh = (1, 1, 1)
    base = train(mesh_shape=mesh, overrides={**ov, "checkpoint.dir": ""}, log=H.Log())
    first = train(mesh_shape=mesh, overrides=ov, log=H.Log(at=1))     # SIGTERM after step 1
    assert first.stopped_by_signal and len(first.losses) == 1
    _as_version_1(tmp_path / "ckpt" / "1")
    log = H.Log()
    second = train(mesh_shape=mesh, overrides=ov, log=log)
    assert "at step 1 (format version 1: GPT's fused QKV weight split" in log.text
    assert second.start_step == 1 and first.losses + second.losses == base.losses
    assert CK.read_meta(tmp_path / "ckpt" / "4")["version"] == CK.VERSION


def test_version_1_checkpoint_with_fused_qkv_is_restored(tmp_path, small):
    """A checkpoint written before GPT's q, k, v weights were split (format version 1, a fused
    (h, 3, n, d) weight) restores into the split layout, parameters and AdamW moments, on the
    writing mesh and on a ZeRO-sharded (2,1,2) one; load_params reads it too."""
    cfg, compiled, state = small
    _write(cfg, compiled, state, tmp_path)
    _as_version_1(tmp_path / "2")
    assert CK.stored_shapes(tmp_path / "2")["params/layers/qkv_w"] == (2, 32, 3, 4, 8)

    m = CK.CheckpointManager(cfg, compiled.shardings, tmp_path)
    restored, step = m.restore_latest()
    m.close()
    assert step == 2 and H.trees_equal(jax.device_get(restored), jax.device_get(state))
    _, params = CK.load_params(tmp_path)
    assert H.trees_equal(params, jax.device_get(canonical_params(cfg, state["params"])))

    ov = H.tiny(tmp_path, tmp_path / "data", **{"model.num_layers": 2, "parallel.zero": 1,
                                                "checkpoint.dir": str(tmp_path)})
    zcfg = resolve_config(None, (2, 1, 2), ov)
    m = CK.CheckpointManager(zcfg, _shardings(ov, (2, 1, 2)), tmp_path)
    restored, _ = m.restore_latest()
    m.close()
    assert H.trees_equal(jax.device_get(restored["params"]), jax.device_get(state["params"]))
