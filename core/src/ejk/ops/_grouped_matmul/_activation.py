"""``grouped_matmul``'s fused gated activation (``activation="swiglu"``): the math every implementation shares.

With an activation, ``rhs [g, k, 2n]`` holds each expert's gate and up projections side by side (gate columns
``[:n]``, up columns ``[n:]``) and the op returns ``silu(z[:, :n]) · z[:, n:]`` (``[m, n]``) for the float32
product ``z = lhs · rhs[group]``, rounded once: a mixture-of-experts layer's first matmul and its SwiGLU in one
call, never writing ``z``. Rows in no group stay zero (``silu(0) · 0``).

:func:`gated_gradients` turns the gradients of the plain product into those of the gated call: it recomputes
``z`` (in float32) with the implementation's own forward, takes the activation's cotangent, and runs the plain
gradients on it, so an implementation that fuses the forward needs no backward of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["GROUPED_MATMUL_ACTIVATIONS", "gated_cotangent", "gated_gradients", "gated_output"]

#: The gated activations ``grouped_matmul(..., activation=...)`` takes (``None``: the plain product).
GROUPED_MATMUL_ACTIVATIONS = ("swiglu",)


def _halves(z: jax.Array) -> tuple[jax.Array, jax.Array]:
    n = z.shape[-1] // 2
    return z[..., :n], z[..., n:]


def gated_output(z: jax.Array, activation: str | None) -> jax.Array:
    """The op's output from the product ``z`` (``[..., 2n]``, float32) under ``activation`` (``None``: ``z``)."""
    if activation is None:
        return z
    _check(activation)
    gate, up = _halves(z)
    return jax.nn.silu(gate) * up


def gated_cotangent(z: jax.Array, d_out: jax.Array, activation: str | None) -> jax.Array:
    """``d z`` (float32, ``z``'s shape) from the output's cotangent ``d_out`` (``[..., n]``)."""
    if activation is None:
        return d_out.astype(jnp.float32)
    _check(activation)
    gate, up = _halves(z)
    d_out = d_out.astype(jnp.float32)
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    d_gate = d_out * up * sig * (1.0 + gate * (1.0 - sig))
    return jnp.concatenate([d_gate, d_out * silu], axis=-1)


def gated_gradients(forward: Callable[..., Any], gradients: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
    """The gradients of a gated call from those of the plain product (:func:`ejk.plugin.operand_vjp`'s
    ``gradients``): ``z`` recomputed by ``forward`` (the implementation, in float32, the call's config), its
    cotangent from the output's, then ``gradients`` on that. Calls without an activation go to ``gradients``
    unchanged. The result names ``activation``, so the core passes it (see ``Extension``)."""

    @functools.wraps(gradients)
    def with_activation(operands: tuple[Any, ...], d_out: Any, *, precision: Any, preferred_element_type: Any,
                        cfg: Any = None, activation: str | None = None) -> tuple[Any, ...]:
        static = {"precision": precision, "preferred_element_type": preferred_element_type, "cfg": cfg}
        if activation is None:
            return gradients(operands, d_out, **static)
        z = forward(*operands, **{**static, "preferred_element_type": np.dtype(np.float32)})
        d_z = gated_cotangent(z, d_out, activation).astype(preferred_element_type)
        return gradients(operands, d_z, **static)

    del with_activation.__wrapped__  # its own signature (with ``activation``), not the plain gradients'
    return with_activation


def _check(activation: str) -> None:
    if activation not in GROUPED_MATMUL_ACTIVATIONS:
        raise ValueError(f"grouped_matmul: activation={activation!r} is not one of "
                         f"{(None, *GROUPED_MATMUL_ACTIVATIONS)}")
