"""Building blocks shared by GPT and LLaMA: norms, attention, dropout, the
vocab-parallel cross-entropy. Shapes are in the names: x_bsh is (batch, seq, hidden).
Logical axis names only; `sh` (a Sharder) maps them to the mesh."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.config import decisions as D
from ptdp_jax.models import tp_overlap
from ptdp_jax.models.dense import WithMeta, dense  # noqa: F401  (the layers' GEMMs; re-exported)
from ptdp_jax.models.residuals import Residuals

ACT = ("act_batch", "act_seq", "embed")      # (b, s, h) residual stream, norms, dropout: split
                                             # by rows or sequence under sequence parallelism
ACT_FULL = ("batch", "seq", "embed")         # (b, s, h) input of a column-parallel GEMM: the
                                             # whole sequence (all-gathered under seq. parallelism)
HEADS = ("batch", "seq", "heads", "head_dim")  # (b, s, n, d) per-head tensors
FFN = ("batch", "seq", "mlp")                # (b, s, f) MLP hidden
FFN_ACT = "ffn_act"   # checkpoint name of the MLP activation's output (tuning.keep_ffn_activation)


class Rows(NamedTuple):
    """What the layers read per row besides their input, where document masking is on:
    the dropout keys (b,) (or None) and where each token's document begins (b, s) int32
    (Sharder.document_starts). Elsewhere the layers take the keys (or None) alone."""
    keys: Any
    starts: Any


def keys_of(rows):
    return rows.keys if isinstance(rows, Rows) else rows


def starts_of(rows):
    return rows.starts if isinstance(rows, Rows) else None


def layer_norm(x_bsh, scale_h, bias_h, eps):
    x = x_bsh.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale_h.astype(jnp.float32) + bias_h.astype(jnp.float32)).astype(x_bsh.dtype)


def rms_norm(x_bsh, scale_h, eps):
    x = x_bsh.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + eps)
    return (y * scale_h.astype(jnp.float32)).astype(x_bsh.dtype)


def attention_impl(name: str, dtype) -> str:
    """tuning.attention resolved for `dtype` on jax's default backend (decisions.attention)."""
    return D.attention(name, dtype, jax.default_backend())


def causal_attention(q_bsnd, k_bsnd, v_bsnd, impl: str, sh=None, starts_bs=None):
    """Causal self-attention through jax.nn.dot_product_attention (cuDNN on GPU).

    Heads are split over 'tensor', so attention needs no communication. Inside a
    partly manual region (pipeline or data manual, 'tensor' automatic) cuDNN's custom
    partitioner cannot run, so the attention runs per device in a nested shard_map
    that is manual over every remaining mesh axis (`Sharder.per_device`); without
    tensor parallelism that region is already fully manual, and on a (1, 1, t) mesh
    (no manual region) GSPMD partitions the call by heads itself. Exception: (d, 1, t)
    meshes inside a layer scan use XLA's attention (see below). Document masking (`starts_bs`,
    each token's document start) and context parallelism: `_blockwise_attention`."""
    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)

    if starts_bs is not None or (sh is not None and sh.context > 1):
        return _blockwise_attention(q_bsnd, k_bsnd, v_bsnd, sh, starts_bs, impl)
    if sh is None or sh.mesh is None or not sh.manual or sh.mesh.shape["tensor"] == 1:
        return attend(q_bsnd, k_bsnd, v_bsnd)
    if sh.mesh.shape["pipe"] == 1 and sh.in_layer_scan:
        # (d, 1, t) inside a layer scan (tuning.scan_layers=true, zero=3): Shardy's verifier
        # rejects the nested region (jax 0.10: the scan's stacked operands name the manual
        # 'tensor' after the free 'pipe'); XLA's attention there.
        return jax.nn.dot_product_attention(q_bsnd, k_bsnd, v_bsnd, is_causal=True,
                                            implementation="xla")
    if keeps_residuals(impl):
        return _per_device_attention(attend, q_bsnd, k_bsnd, v_bsnd, sh)
    # XLA's attention: its own residuals hold the s^2 scores
    return _per_device_again(attend, q_bsnd, k_bsnd, v_bsnd, sh)


def _per_device_again(attend, q_bsnd, k_bsnd, v_bsnd, sh):
    """attend(q, k, v) in a per-device region whose backward is a region of its own: a custom
    VJP keeps q, k, v as the only residuals and runs the attention again in the backward (XLA's
    attention, whose residuals are the s^2 scores)."""
    local_fwd = sh.per_device(attend, (HEADS,) * 3, HEADS)
    local_bwd = sh.per_device(lambda q, k, v, g: jax.vjp(attend, q, k, v)[1](g),
                              (HEADS,) * 4, (HEADS,) * 3)

    @jax.custom_vjp
    def attention(q, k, v):
        return local_fwd(q, k, v)

    attention.defvjp(lambda q, k, v: (local_fwd(q, k, v), (q, k, v)),
                     lambda res, g: local_bwd(*res, g))
    return attention(q_bsnd, k_bsnd, v_bsnd)


def _blockwise_attention(q_bsnd, k_bsnd, v_bsnd, sh, starts_bs, impl: str):
    """Attention over a sequence split over 'context' (parallel/context.py), or with document
    masking: in cuDNN's kernels where `impl` is cuDNN (with masking, its packed layout where
    the GPU has it), else parallel/flash.py's tiled kernel; per device where heads are split
    over an automatic 'tensor'."""
    from ptdp_jax.parallel import context as C, flash as F, packed
    scale = 1.0 / float(q_bsnd.shape[-1]) ** 0.5
    split = sh is not None and sh.context > 1
    cudnn = impl == "cudnn" and (starts_bs is None or packed.available())
    kernel = "cudnn" if cudnn else "tiled"

    def attend(q, k, v, *starts):
        starts = starts[0] if starts else None
        if split:
            return C.attention(q, k, v, sh.context, jax.lax.axis_index(C.AXIS), scale, starts,
                               kernel)
        if kernel == "cudnn":
            return F.document_attention(q, k, v, starts, scale)
        pos = jnp.broadcast_to(jnp.arange(q.shape[1], dtype=jnp.int32), q.shape[:2])
        return F.blockwise_attention(q, k, v, pos, scale, starts)
    rest = () if starts_bs is None else (starts_bs,)
    if (sh is None or sh.mesh is None or not sh.manual or "tensor" in sh.manual
            or sh.mesh.shape["tensor"] == 1):
        return attend(q_bsnd, k_bsnd, v_bsnd, *rest)
    # heads split over an automatic 'tensor': per device, the residuals handed to the backward
    # region (autodiff's residuals of a nested region would be split over every mesh axis,
    # 'context' before the region's manual 'tensor', which Shardy refuses)
    return _per_device_attention(attend, q_bsnd, k_bsnd, v_bsnd, sh, *rest)


def keeps_residuals(impl: str) -> bool:
    """Whether a per-device attention hands its residuals to its backward (and selective
    recomputation keeps them): cuDNN's, the output and softmax statistics, as small as one
    GEMM output; not XLA's, which hold the s^2 scores."""
    return impl == "cudnn"


def _local_shape(shape, spec, mesh) -> tuple:
    """The block of a (global over the region's axes) shape that one device holds."""
    out = list(shape)
    for i, entry in enumerate(spec):
        for a in ((entry,) if isinstance(entry, str) else entry or ()):
            out[i] //= mesh.shape[a]
    return tuple(out)


def _per_device_attention(attend, q_bsnd, k_bsnd, v_bsnd, sh, *rest):
    """attend(q, k, v, *rest) in a per-device region, differentiable: the forward region hands
    out its vjp residuals (but q, k, v, the output and `rest`, which the backward gets anyway)
    stacked on a new leading axis split over the region's axes, and the backward region takes
    them back, so the backward runs the attention's backward only, not its forward again.
    rest: integer per-row inputs laid out as q's first two dims (no gradient). Named
    "attention": selective recomputation keeps them."""
    stacked = jax.sharding.PartitionSpec(sh.rest_axes())
    rows = (jax.sharding.PartitionSpec(*sh.spec(HEADS)[:2]),) * len(rest)
    res = Residuals()

    def local_fwd(q, k, v, *r, res=res):
        o, pull = jax.vjp(lambda *qkv: attend(*qkv, *r), q, k, v)
        return o, tuple(x[None] for x in res.split(pull, (q, k, v, o) + r))

    def local_bwd(q, k, v, o, *r_kept_g):
        r, kept, g = r_kept_g[:-2], r_kept_g[-2], r_kept_g[-1]
        return res.join([x[0] for x in kept], (q, k, v, o) + tuple(r))(g)

    def block(a, spec):
        return jax.ShapeDtypeStruct(_local_shape(a.shape, spec, sh.mesh), a.dtype)
    # how many leaves leave the region: from a trace outside it (its own Residuals: the
    # pullback's structure there holds unvarying types, the region's holds varying ones)
    blocks = [block(a, sh.spec(HEADS)) for a in (q_bsnd, k_bsnd, v_bsnd)]
    blocks += [block(a, spec) for a, spec in zip(rest, rows)]
    n_kept = len(jax.eval_shape(lambda *a: local_fwd(*a, res=Residuals()), *blocks)[1])
    fwd = sh.per_device(local_fwd, (HEADS,) * 3 + rows, (HEADS, (stacked,) * n_kept))
    bwd = sh.per_device(local_bwd, (HEADS,) * 4 + rows + ((stacked,) * n_kept, HEADS),
                        (HEADS,) * 3)
    name = lambda x: checkpoint_name(x, "attention")

    @jax.custom_vjp
    def attention(q, k, v, *r):
        return fwd(q, k, v, *r)[0]

    def attention_fwd(q, k, v, *r):     # the output named too: the out-projection's
        o, kept = fwd(q, k, v, *r)        # weight gradient reads it
        o = name(o)
        return o, (q, k, v, o, r, tuple(name(x) for x in kept))

    attention.defvjp(attention_fwd,
                     lambda res, g: bwd(*res[:4], *res[4], res[5], g) + (None,) * len(rest))
    return attention(q_bsnd, k_bsnd, v_bsnd, *rest)


def gather_seq(sh, y_bsh):
    """(b, s, h) as ACT -> as ACT_FULL: under sequence parallelism an all-gather of the
    sequence; in the backward the cotangent (partial sums of the GEMMs that read y) goes
    straight to ACT, a reduce-scatter (Megatron's g). Otherwise nothing."""
    if sh is None or not sh.sequence_parallel:
        return y_bsh

    @jax.custom_vjp
    def gather(y):
        return sh.constrain(sh.constrain(y, ACT), ACT_FULL)

    gather.defvjp(lambda y: (gather(y), None), lambda _, g: (sh.constrain(g, ACT),))
    return gather(y_bsh)


def column_parallel(sh, y_bsh, gemms):
    """gemms(y) for the column-parallel GEMMs of a LayerNorm output (QKV; the first MLP
    GEMM(s)), which need the whole sequence on every tensor rank: y as ACT_FULL.

    Under sequence parallelism that is an all-gather of y (Megatron's g: a reduce-scatter
    in the backward). As in Megatron the gathered y is not kept for the backward: a
    checkpoint that saves only the GEMM outputs keeps y (1/t of the sequence) and gathers
    it again in the backward for the weight gradients. Without it ACT_FULL is y's layout."""
    if sh is None or not sh.sequence_parallel:
        return gemms(y_bsh)
    policy = jax.checkpoint_policies.save_only_these_names("dense")
    return jax.checkpoint(lambda y: gemms(gather_seq(sh, y)), policy=policy)(y_bsh)


def column_dense(sh, y_bsh, gemms, out_names):
    """[dense(spec, y, w, b) as out_names for (spec, w, b) in gemms]: the column-parallel
    GEMMs that read one norm output y (ACT): `column_parallel`'s gather, or with
    tuning.tp_comm_overlap the gather decomposed around the GEMMs (models/tp_overlap.py)."""
    if _overlap(sh):
        return tuple(sh.constrain(y, out_names)
                     for y in tp_overlap.gather_dense(sh, y_bsh, gemms, ACT))
    return column_parallel(sh, y_bsh, lambda y: tuple(
        sh.constrain(dense(spec, y, w, b, fp8=_fp8(sh), steady=_steady(sh)), out_names)
        for spec, w, b in gemms))


def row_dense(sh, z, spec, w, b=None):
    """dense(spec, z, w, b) for a row-parallel GEMM, its partial sums reduced over 'tensor'
    into ACT: an all-reduce, a reduce-scatter under sequence parallelism, or with
    tuning.tp_comm_overlap that reduce-scatter decomposed around the GEMM."""
    if _overlap(sh):
        return sh.constrain(tp_overlap.scatter_dense(sh, z, spec, w, b, ACT), ACT)
    return sh.constrain(dense(spec, z, w, b, fp8=_fp8(sh), steady=_steady(sh)), ACT)


def weight(p, name):
    """Layer params p's GEMM weight `name`, paired with its delayed-scaling rows where the
    train step put them beside it (`fp8_<name>`, training/fp8_state.py)."""
    meta = p.get(META_PREFIX + name)
    return p[name] if meta is None else WithMeta(p[name], meta)


META_PREFIX = "fp8_"     # layer params key of a GEMM weight's delayed-scaling rows


def _fp8(sh) -> bool:
    """train.fp8: the layers' GEMMs on FP8 operands (models/fp8.py)."""
    return sh is not None and sh.fp8


def _steady(sh) -> bool:
    """Delayed FP8 scaling with every history row holding an exponent (Sharder.fp8_steady)."""
    return sh is not None and sh.fp8_steady


def _overlap(sh) -> bool:
    """tuning.tp_comm_overlap, except in a layer scan (validation allows none in the train
    step; evaluation scans its layers and keeps GSPMD's collectives: the same numbers)."""
    return sh is not None and sh.tp_overlap and not sh.in_layer_scan


def dropout(x, rate: float, key_rows):
    """Dropout with one key per batch row, so masks do not depend on the layout."""
    if rate == 0.0 or key_rows is None:
        return x
    keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, x.shape[1:]))(key_rows)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def fold_rows(key_rows, salt: int):
    """The dropout keys of `key_rows` (keys, or Rows) folded with `salt`."""
    key_rows = keys_of(key_rows)
    if key_rows is None:
        return None
    return jax.vmap(lambda k: jax.random.fold_in(k, salt))(key_rows)


def rope_frequencies(cfg):
    """The rotary inverse frequencies (head_dim / 2,) of model config `cfg` in float32:
    rope_theta^(-2i/d), rescaled as LLaMA-3.1's (llama3_scaled) where rope_scaling_factor != 1."""
    d = cfg.head_dim
    freqs_d2 = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if cfg.rope_scaling_factor == 1:
        return freqs_d2
    return llama3_scaled(freqs_d2, cfg.rope_scaling_factor, cfg.rope_low_freq_factor,
                         cfg.rope_high_freq_factor, cfg.rope_original_seq_len)


def llama3_scaled(freqs_d2, factor, low, high, original):
    """transformers' _compute_llama3_parameters: a frequency of wavelength (2 pi / freq) above
    original / low divided by factor, one below original / high kept, those between smoothly
    interpolated."""
    wavelen_d2 = 2 * math.pi / freqs_d2
    scaled_d2 = jnp.where(wavelen_d2 > original / low, freqs_d2 / factor, freqs_d2)
    smooth_d2 = (original / wavelen_d2 - low) / (high - low)
    mixed_d2 = (1 - smooth_d2) * scaled_d2 / factor + smooth_d2 * scaled_d2
    medium = (wavelen_d2 >= original / high) & (wavelen_d2 <= original / low)
    return jnp.where(medium, mixed_d2, scaled_d2)


def rotary(x_bsnd, freqs_d2, offset=0, positions_bs=None):
    """Rotary position embedding (LLaMA) of inverse frequencies `freqs_d2` (d/2,)
    (rope_frequencies) in the Hugging Face convention: the first half of each head's dims is
    rotated against the second half. The sequence holds positions offset .. offset + s - 1
    (decoding with a cache: models/decode.py), or `positions_bs` (b, s) where given (a
    device's chunks under context parallelism)."""
    b, s, n, d = x_bsnd.shape
    if positions_bs is None:
        positions = (offset + jnp.arange(s)).astype(jnp.float32)
        angles_sd2 = positions[:, None] * freqs_d2[None, :]
        cos_1s11h = jnp.cos(angles_sd2)[None, :, None, None, :]
        sin_1s12h = jnp.sin(angles_sd2)[None, :, None, None, :] * jnp.array([-1.0, 1.0])[:, None]
    else:
        angles_bsd2 = positions_bs.astype(jnp.float32)[..., None] * freqs_d2
        cos_1s11h = jnp.cos(angles_bsd2)[:, :, None, None, :]
        sin_1s12h = jnp.sin(angles_bsd2)[:, :, None, None, :] * jnp.array([-1.0, 1.0])[:, None]
    # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with the halves as an axis of 2, so that
    # the transpose is a reverse of that axis, not two slices padded back together (XLA:GPU
    # fused those pads into FP8's max |dq| at a fifth of the memory bandwidth)
    x_bsn2h = x_bsnd.astype(jnp.float32).reshape(b, s, n, 2, d // 2)
    out = x_bsn2h * cos_1s11h + x_bsn2h[..., ::-1, :] * sin_1s12h
    return out.reshape(b, s, n, d).astype(x_bsnd.dtype)


def vocab_parallel_cross_entropy(logits_bsv, targets_bs, vocab_size: int, sh, ids_v=None,
                                 axis=None):
    """Sum of token losses, without gathering the vocab-sharded logits.

    Padded vocabulary entries (index >= vocab_size) are masked out of the
    softmax, so the function does not depend on the padding. The max, the sum
    of exponentials and the target logit are each reduced over the sharded
    vocab dim, which XLA turns into all-reduces of (b, s) values. With `axis` (a
    manual mesh axis) the logits are one shard of the vocabulary per device along
    it, `ids_v` the vocabulary id of each of their columns; the three reductions
    are then also taken over `axis`."""
    logits = sh.constrain(logits_bsv.astype(jnp.float32), ("batch", "seq", "vocab"))
    if ids_v is None:
        ids_v = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    else:
        ids_v = jnp.broadcast_to(ids_v, logits.shape)
    reduce = (lambda x, op: op(x, axis)) if axis else (lambda x, op: x)
    logits = jnp.where(ids_v < vocab_size, logits, jnp.finfo(jnp.float32).min)
    m_bs = reduce(jax.lax.stop_gradient(logits.max(-1)), jax.lax.pmax)
    lse_bs = jnp.log(reduce(jnp.exp(logits - m_bs[..., None]).sum(-1), jax.lax.psum)) + m_bs
    target_bs = reduce(jnp.where(ids_v == targets_bs[..., None], logits, 0.0).sum(-1),
                       jax.lax.psum)
    return (lse_bs - target_bs).sum()
