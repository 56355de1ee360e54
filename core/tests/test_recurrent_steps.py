"""``ejk.gla_step`` and ``ejk.ssd_step``: one decode token of ``gla`` / ``ssd``, state in and out. Chained
over a sequence they give the step-by-step references' outputs and final states; they differentiate; bad
arguments are named."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, reference_gla, reference_ssd


def _normal(key: int, shape: tuple[int, ...], dtype: Any = jnp.float32, scale: float = 1.0) -> jax.Array:
    return (scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)).astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_gla_steps_replay_the_reference(dtype: Any) -> None:
    b, t, h, dk, dv = 2, 5, 3, 8, 4
    q, k, v = _normal(0, (b, t, h, dk), dtype), _normal(1, (b, t, h, dk), dtype, 0.3), _normal(2, (b, t, h, dv), dtype)
    g = jax.nn.log_sigmoid(_normal(3, (b, t, h, dk)) + 2.0)
    state = _normal(4, (b, h, dk, dv))
    want_o, want_state = reference_gla(q, k, v, g, state, scale=0.5)
    outs = []
    for i in range(t):
        o, state = ejk.gla_step(q[:, i], k[:, i], v[:, i], g[:, i], state, scale=0.5)
        outs.append(o)
    assert (o.dtype, state.dtype, state.shape) == (dtype, jnp.float32, (b, h, dk, dv))
    assert_close(jnp.stack(outs, 1), want_o, dtype, what="o")
    assert_close(state, want_state, jnp.float32, what="final state")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_ssd_steps_replay_the_reference(dtype: Any) -> None:
    b, t, h, p, groups, n = 2, 5, 4, 6, 2, 3
    x = _normal(0, (b, t, h, p), dtype)
    dt, a = _normal(1, (b, t, h)) - 1.0, -jnp.exp(_normal(2, (h,)))
    bm, cm = _normal(3, (b, t, groups, n), dtype), _normal(4, (b, t, groups, n), dtype)
    d, bias = _normal(5, (h,)), _normal(6, (h,), scale=0.5)
    state = _normal(7, (b, h, p, n))
    want_y, want_state = reference_ssd(x, dt, a, bm, cm, d, bias, state, dt_softplus=True)
    outs = []
    for i in range(t):
        y, state = ejk.ssd_step(x[:, i], dt[:, i], a, bm[:, i], cm[:, i], state, D=d, dt_bias=bias, dt_softplus=True)
        outs.append(y)
    assert (y.dtype, state.dtype, state.shape) == (dtype, jnp.float32, (b, h, p, n))
    assert_close(jnp.stack(outs, 1), want_y, dtype, what="y")
    assert_close(state, want_state, jnp.float32, what="final state")


def test_the_steps_differentiate_like_the_references() -> None:
    b, h, dk, dv = 2, 2, 4, 3
    q, k, v = _normal(0, (b, h, dk)), _normal(1, (b, h, dk)), _normal(2, (b, h, dv))
    g, state = -jnp.abs(_normal(3, (b, h, dk))), _normal(4, (b, h, dk, dv))

    def ours(*xs: jax.Array) -> jax.Array:
        o, new = ejk.gla_step(*xs)
        return jnp.sum(o * 1.5) + jnp.sum(new)

    def reference(*xs: jax.Array) -> jax.Array:
        o, new = reference_gla(*(x[:, None] for x in xs[:4]), xs[4])
        return jnp.sum(o * 1.5) + jnp.sum(new)

    got, want = jax.grad(ours, argnums=range(5))(q, k, v, g, state), jax.grad(reference, argnums=range(5))(
        q, k, v, g, state)
    for a, w in zip(got, want, strict=True):
        assert_close(a, w, jnp.float32)
    x, dt, a_, bm = _normal(5, (b, 4, 3)), _normal(6, (b, 4)), -jnp.ones((4,)), _normal(7, (b, 1, 2))
    grads = jax.grad(lambda *xs: jnp.sum(ejk.ssd_step(*xs, dt_softplus=True)[0]), argnums=range(6))(
        x, dt, a_, bm, bm, jnp.zeros((b, 4, 3, 2)))
    assert all(np.isfinite(np.asarray(gr)).all() for gr in grads)


def test_the_steps_run_inside_jit() -> None:
    q = jnp.ones((1, 2, 4))
    o, state = jax.jit(ejk.gla_step)(q, q, jnp.ones((1, 2, 3)), -jnp.ones((1, 2, 4)), jnp.zeros((1, 2, 4, 3)))
    assert o.shape == (1, 2, 3) and state.shape == (1, 2, 4, 3)


def test_the_steps_name_bad_arguments() -> None:
    q = jnp.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"gla_step: state has shape \(2, 3, 4, 4\) but needs \[B, H, K, V\]"):
        ejk.gla_step(q, q, jnp.zeros((2, 3, 5)), q, jnp.zeros((2, 3, 4, 4)))
    with pytest.raises(ValueError, match=r"gla_step: g has shape \(2, 3\) but needs"):
        ejk.gla_step(q, q, q, jnp.zeros((2, 3)), jnp.zeros((2, 3, 4, 4)))
    x, dt, a = jnp.zeros((2, 4, 6)), jnp.zeros((2, 4)), jnp.zeros((4,))
    bm = jnp.zeros((2, 3, 5))
    with pytest.raises(ValueError, match=r"ssd_step: B has 3 groups but needs a number of groups G that divides"):
        ejk.ssd_step(x, dt, a, bm, bm, jnp.zeros((2, 4, 6, 5)))
    bm = jnp.zeros((2, 2, 5))
    with pytest.raises(ValueError, match=r"ssd_step: state has shape \(2, 4, 6, 4\) but needs \[b, H, P, N\]"):
        ejk.ssd_step(x, dt, a, bm, bm, jnp.zeros((2, 4, 6, 4)))
    with pytest.raises(ValueError, match=r"ssd_step: D has shape \(3,\) but needs \[H\] = \[4\]"):
        ejk.ssd_step(x, dt, a, bm, bm, jnp.zeros((2, 4, 6, 5)), D=jnp.zeros((3,)))
