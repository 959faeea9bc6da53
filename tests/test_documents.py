"""Document masking (data.document_mask): a token attends only to the tokens of its own
document (from just after the last end-of-document token before it). The blockwise attention
against plain attention with the mask written out; a token's layer outputs blind to every
earlier document; each kind of layout, context parallelism included, against one device with
the same masks (float32, parity.py's tolerance); the evaluation; the refusal of data with no
document boundary."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from parity import assert_close, loss_and_grads, tiny_config
from ptdp_jax.data.tokenizer import ByteTokenizer
from ptdp_jax.parallel import context as C, flash as F

EOS = ByteTokenizer.eos_id                   # the embedded corpus's (data.path empty)
DM = {"data.document_mask": True}


def doc_batch(cfg, seed=0, every=5):
    """Random tokens with an end-of-document token about every `every` tokens."""
    rng = np.random.default_rng(seed)
    shape = (cfg.train.global_batch_size, cfg.model.seq_len + 1)
    tokens = rng.integers(0, EOS, shape)
    tokens[rng.random(shape) < 1 / every] = EOS
    return tokens.astype(np.int32)


def _mask(starts_bs):
    s = starts_bs.shape[1]
    pos = jnp.arange(s)
    return (pos[None, :, None] >= pos[None, None, :]) & (pos[None, None, :] >= starts_bs[:, :, None])


def test_document_starts():
    tokens = jnp.array([[1, EOS, 2, 3, EOS, EOS, 4, 5], [EOS, 1, 1, 1, 1, 1, 1, EOS]])
    np.testing.assert_array_equal(C.document_starts(tokens, EOS, 1),
                                  [[0, 0, 2, 2, 2, 5, 6, 6], [0, 1, 1, 1, 1, 1, 1, 1]])


def test_blockwise_attention_with_documents_is_masked_attention(monkeypatch):
    """Against jax's attention given the mask written out; the key tiles before a query tile's
    first document are skipped, so tiles are small here."""
    monkeypatch.setattr(F, "BLOCK", 8)
    keys = jax.random.split(jax.random.key(1), 4)
    q, g = (jax.random.normal(k_, (2, 64, 4, 16)) for k_ in keys[:2])
    k, v = (jax.random.normal(k_, (2, 64, 2, 16)) for k_ in keys[2:])
    tokens = jnp.asarray(doc_batch(tiny_config(**{"model.seq_len": 64}), every=12)[:2, :-1])
    starts = C.document_starts(tokens, EOS, 1)
    pos = jnp.broadcast_to(jnp.arange(64), (2, 64))
    ours = lambda q, k, v: F.blockwise_attention(q, k, v, pos, 0.25, starts)
    plain = lambda q, k, v: jax.nn.dot_product_attention(
        q, jnp.repeat(k, 2, 2), jnp.repeat(v, 2, 2), mask=_mask(starts)[:, None], scale=0.25)
    np.testing.assert_allclose(ours(q, k, v), plain(q, k, v), atol=2e-6)
    for a, b in zip(jax.vjp(ours, q, k, v)[1](g), jax.vjp(plain, q, k, v)[1](g)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("c", [2, 4])
def test_split_rows_know_the_documents_of_earlier_chunks(c):
    """Each context rank's chunks: the starts of their tokens in the whole sequence, also where
    a document began in another rank's chunk."""
    tokens = jnp.asarray(doc_batch(tiny_config(**{"model.seq_len": 32}), every=9)[:2, :-1])
    mesh = Mesh(np.array(jax.devices()[:c]), ("context",))

    def local(t):
        rows = C.chunk_order(t, c)[jax.lax.axis_index("context")]
        return jax.lax.all_gather(C.document_starts(rows, EOS, c), "context", tiled=False)

    split = jax.shard_map(local, mesh=mesh, in_specs=P(), out_specs=P(),
                          axis_names={"context"}, check_vma=False)
    np.testing.assert_array_equal(C.natural_order(split(tokens), c),
                                  C.document_starts(tokens, EOS, 1))


@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_a_token_sees_nothing_of_earlier_documents(arch):
    """The layers' output at a later document's tokens is the same whatever the earlier
    document held; without the mask it is not."""
    from ptdp_jax.models import model as M
    from ptdp_jax.parallel.sharding import Sharder
    from ptdp_jax.training import state as S
    cfg = tiny_config(arch, **{"model.num_layers": 2})
    params = S.canonical_params(cfg, S.init_state(cfg, S.make_optimizer(cfg)[0])["params"])
    tokens = np.arange(16, dtype=np.int32)[None] % 7 + 1
    tokens[0, 6] = EOS                           # documents 0..6 and 7..15
    other = tokens.copy()
    other[0, :6] = [9, 8, 7, 6, 5, 4]

    def out(t, eos):
        x = M.embed(cfg.model, Sharder(), params["embed"], jnp.asarray(t))
        rows = M.layer_rows(Sharder(), jnp.asarray(t), None, eos)
        return np.asarray(M.run_layers(cfg.model, Sharder(), params["layers"], x, key_rows=rows))

    np.testing.assert_allclose(out(other, EOS)[0, 7:], out(tokens, EOS)[0, 7:], rtol=1e-6,
                               atol=1e-6)
    assert not np.allclose(out(other, None)[0, 7:], out(tokens, None)[0, 7:], atol=1e-3)


# (arch, (data, pipe, tensor), overrides): the paths a layer's attention is reached by
LAYOUTS = [
    ("llama", (1, 1, 1), {"parallel.context": 2}),
    ("gpt", (1, 2, 2), {"parallel.schedule": "1f1b"}),
    ("llama", (2, 1, 1), {"parallel.zero": 3}),
    ("llama", (1, 1, 2), {"parallel.context": 2, "parallel.sequence_parallel": True}),
    ("gpt", (2, 2, 1), {"parallel.context": 2, "parallel.schedule": "zb-phased"}),
]
IDS = ["c2", "p2-t2", "d2-zero3", "c2-t2-sp", "d2-p2-c2-zb-phased"]


@pytest.mark.parametrize("arch,mesh,extra", LAYOUTS, ids=IDS)
def test_document_mask_parity(arch, mesh, extra):
    one = tiny_config(arch, (1, 1, 1), **DM)
    batch = doc_batch(one)
    ref = loss_and_grads(one, batch=batch)
    assert_close(loss_and_grads(tiny_config(arch, mesh, **DM, **extra), batch=batch), ref)


def test_the_train_step_masks_documents():
    cfg = tiny_config("llama", (1, 1, 1))
    batch = doc_batch(cfg)
    masked = loss_and_grads(tiny_config("llama", (1, 1, 1), **DM), batch=batch)[0]
    assert abs(masked - loss_and_grads(cfg, batch=batch)[0]) > 1e-4


def test_the_evaluation_masks_documents_too():
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training import state as S
    from ptdp_jax.training.evaluate import make_eval_fn
    losses = {}
    for name, extra in (("plain", {}), ("one", DM), ("c4", {**DM, "parallel.context": 4})):
        cfg = tiny_config("llama", (1, 1, 1), **extra)
        params = jax.jit(lambda: S.init_state(cfg, S.make_optimizer(cfg)[0])["params"])()
        fn = jax.jit(make_eval_fn(cfg, make_mesh(cfg.parallel.mesh_dims)))
        losses[name] = float(fn(params, doc_batch(cfg)))
    np.testing.assert_allclose(losses["c4"], losses["one"], rtol=2e-6)
    assert abs(losses["one"] - losses["plain"]) > 1e-4


def test_data_of_one_document_is_refused(tmp_path):
    from ptdp_jax.config.load import ConfigError, load_config
    from ptdp_jax.data import ByteTokenizer as Tok, write_token_dataset
    from ptdp_jax.run.feed import open_streams
    write_token_dataset(["one long document " * 200], tmp_path / "one", Tok(), "byte")
    cfg = load_config(overrides={"data.path": [str(tmp_path / "one")], "model.seq_len": 64,
                                 **DM})
    with pytest.raises(ConfigError, match="data.document_mask=true, but data.path .* holds "
                                          "one document"):
        open_streams(cfg)
