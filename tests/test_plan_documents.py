"""The planner's view of document masking (plan/documents.py, data/documents.py): the data's
document lengths as the layers see them, their share of the causal pairs and the packed
kernel's calls (against what parallel/packed.py runs), masked attention priced by them, and
MFU counting the attention the mask leaves."""
import jax.numpy as jnp
import numpy as np
import pytest

from ptdp_jax.config.load import load_config
from ptdp_jax.data.documents import row_documents
from ptdp_jax.parallel import context as C, packed
from ptdp_jax.plan import cost as K
from ptdp_jax.plan.documents import Documents, attention_share
from ptdp_jax.plan.hardware import gpu_kind
from ptdp_jax.training import metrics as MX
from test_documents import EOS, doc_batch

from parity import tiny_config


def _rows(seed=0, b=6, s=64, every=9):
    tokens = doc_batch(tiny_config(**{"model.seq_len": s, "train.global_batch_size": b}),
                       seed=seed, every=every)[:, :-1]
    return tokens, C.document_starts(jnp.asarray(tokens), EOS, 1)


def test_row_documents_are_the_layers_documents():
    tokens, starts = _rows()
    for row, st in zip(row_documents(tokens, EOS), np.asarray(starts)):
        assert sum(row) == tokens.shape[1]
        np.testing.assert_array_equal(np.repeat(np.cumsum((0,) + row[:-1]), row), st)


@pytest.mark.parametrize("b", [1, 3])
def test_calls_are_the_packed_kernels_loop(b):
    tokens, starts = _rows()
    docs = Documents(row_documents(tokens, EOS))
    loops = [int(packed.document_pairs(starts[i:i + b])[1]) for i in range(0, len(tokens), b)]
    assert docs.calls(b) == pytest.approx(np.mean(loops))


@pytest.mark.parametrize("c", [1, 2, 4])
def test_share_is_the_busiest_ranks_pairs_inside_documents(c):
    tokens, starts = _rows()
    s = tokens.shape[1]
    pos = np.arange(s)
    seen = (pos[None, :] - np.asarray(starts) + 1)                      # (rows, s) keys a query sees
    ranks = [np.asarray(C.positions(c, r, s // (2 * c), 2)).ravel() for r in range(c)]
    busiest = [max(seen[i][q].sum() for q in ranks) for i in range(len(tokens))]
    got = Documents(row_documents(tokens, EOS)).share(1, c)
    assert got == pytest.approx(np.mean(busiest) / (s * (s + 1) / 2 / c))


def test_calls_under_context_parallelism():
    """Each rank's two chunks: their own documents, two a call, and one call for the
    document begun before a chunk; counted over the device's tokens (a chunk's call is half)."""
    docs = Documents(((8, 8), (16,), (4, 4, 4, 4)))
    assert docs.calls(1, 1) == pytest.approx((1 + 1 + 2) / 3)
    assert docs.calls(1, 2) == pytest.approx((1.5 + 2 + 1) / 3)
    assert docs.share(1) == pytest.approx((72 / 136 + 1 + 40 / 136) / 3)
    assert docs.length() == pytest.approx((2 * 64 + 256 + 4 * 16) / 48)


def test_masked_attention_priced_by_the_documents():
    """One document a row costs causal attention plus a call's passes; short documents the
    pairs inside them plus their calls' passes; without the data's documents masked
    attention is priced as causal."""
    gpu = gpu_kind("h200")
    s = 65536
    cfg = load_config("configs/llama3-8b.yaml", {
        "model.seq_len": s, "train.micro_batch_size": 1, "data.document_mask": True,
        "parallel.data": 1, "parallel.tensor": 1})
    heads = s * (32 + 2 * 8) * 128 * 4 / gpu.memory_bound_bytes_per_s   # one pass of a call
    causal = K.attention_seconds(cfg, gpu)
    one = K.attention_seconds(cfg, gpu, Documents(((s,),)))
    short = Documents(((s // 64,) * 64,))
    many = K.attention_seconds(cfg, gpu, short)
    for i, (whole, a, b) in enumerate(zip(causal, one, many)):
        assert a == pytest.approx(whole + K.PACKED_CALL_PASSES[i] * heads, rel=0.02)
        calls = 32 * K.PACKED_CALL_PASSES[i] * heads
        assert calls < b < calls + whole / 16


def test_mfu_counts_the_attention_the_mask_leaves():
    cfg = load_config("configs/llama3-8b.yaml", {"model.seq_len": 32768,
                                                  "train.global_batch_size": 2})
    full, half, none = (MX.model_flops_per_iteration(cfg, attention_share=a)
                        for a in (1.0, 0.5, 0.0))
    assert full == MX.model_flops_per_iteration(cfg)
    assert full - half == pytest.approx(half - none) and half < full
    attention = 3 * 4 * 32768 * 4096 * 32 * 2 * 32768           # 3 passes, l, B s tokens
    assert full - none == pytest.approx(attention)
    assert attention_share(None) == 1.0
    assert attention_share(Documents(((16, 16),))) == pytest.approx(2 * 136 / (32 * 33 / 2))


def test_a_run_reads_its_documents():
    from ptdp_jax.run.resolve import planned_documents
    cfg = tiny_config("llama", (1, 1, 1), **{"data.document_mask": True})
    docs = planned_documents(cfg)
    assert docs is not None and all(sum(r) == cfg.model.seq_len for r in docs.rows)
    assert planned_documents(tiny_config("llama", (1, 1, 1))) is None


def test_a_masked_run_counts_its_documents_share():
    import jax
    from ptdp_jax.run.resolve import for_devices
    cfg = tiny_config("llama", (1, 1, 1), **{"data.document_mask": True})
    run = for_devices(cfg, (), (), jax.devices()[:1], log=lambda *a: None)
    assert 0 < run.attention_share < 1
    assert for_devices(tiny_config("llama", (1, 1, 1)), (), (), jax.devices()[:1],
                       log=lambda *a: None).attention_share == 1.0
