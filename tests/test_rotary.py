"""Rotary position embedding (models/layers.rotary): the Hugging Face convention (each head's
first half rotated against its second), and a backward of the same form as the forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprs import equations
from ptdp_jax.config.schema import ModelConfig
from ptdp_jax.models.layers import rope_frequencies, rotary

FREQS = rope_frequencies(ModelConfig(arch="llama", hidden_size=24, num_heads=3,  # head dim 8
                                     rope_theta=500.0))


def halves(x_bsnd, theta, offset=0):
    """The convention as Hugging Face writes it: x cos + rotate_half(x) sin."""
    d = x_bsnd.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = (offset + np.arange(x_bsnd.shape[1]))[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[None, :, None, :]
    x = np.asarray(x_bsnd, np.float64)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("offset", [0, 7])
def test_rotary_is_the_hugging_face_rotation(offset):
    x = jax.random.normal(jax.random.key(0), (2, 16, 3, 8), jnp.float32)
    np.testing.assert_allclose(rotary(x, FREQS, offset), halves(x, 500.0, offset),
                               rtol=1e-5, atol=1e-5)


def test_rotary_backward_is_the_inverse_rotation():
    """A rotation's transpose is its inverse: the gradient of <g, rotary(x)> rotates g back."""
    x = jax.random.normal(jax.random.key(0), (2, 16, 3, 8), jnp.float32)
    g = jax.random.normal(jax.random.key(1), x.shape, jnp.float32)
    _, vjp = jax.vjp(lambda a: rotary(a, FREQS), x)
    (dx,) = vjp(g)
    np.testing.assert_allclose(rotary(dx, FREQS), g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.sum(dx * x), jnp.sum(g * rotary(x, FREQS)), rtol=1e-5)


def test_rotary_backward_has_no_padded_halves():
    """The transpose reverses an axis of 2 instead of padding two halves back together:
    XLA:GPU fused those pads into FP8's max |dq| at a fifth of the memory bandwidth."""
    x = jnp.zeros((2, 16, 3, 8), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda a, g: jax.vjp(lambda b: rotary(b, FREQS), a)[1](g))(x, x)
    names = {e.primitive.name for e, _ in equations(jaxpr.jaxpr)}
    assert not names & {"pad", "concatenate"}, names
