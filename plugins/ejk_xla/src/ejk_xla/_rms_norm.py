"""XLA ``rms_norm``: one fusion forward, one backward, statistics in float32.

The forward pass saves the per-row ``1 / rms`` (``RMS_NORM_RESIDUALS``), so the backward pass
reads ``x``, the cotangent and ``scale`` once and never recomputes the mean square::

    x̂ = x · inv_rms,  g = dy · scale,  dx = inv_rms · (g − x̂ · mean(g · x̂)),  dscale = Σ_rows dy · x̂

With ``residual`` the forward normalises ``h = x + residual`` and returns it too (saved in
``x``'s place); the backward adds ``h``'s cotangent to ``dx``, which is also ``residual``'s gradient.

XLA fuses each pass into one kernel (a row reduction and an elementwise map), which is all a
bandwidth-bound op needs: there is nothing to tune (the config has no fields).
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import RMS_NORM_RESIDUALS, VJP, cotangent_like

__all__ = ["RmsNormConfig", "config_space", "heuristic_config", "rms_norm", "rms_norm_bwd", "rms_norm_fwd", "vjp"]


@attrs.frozen(kw_only=True)
class RmsNormConfig:
    """Config of the XLA RMSNorm: no fields (XLA fuses each pass itself)."""


Output = jax.Array | tuple[jax.Array, jax.Array]


def rms_norm_fwd(x: jax.Array, scale: jax.Array, *, residual: jax.Array | None = None, eps: float = 1e-6,
                 cfg: RmsNormConfig | None = None) -> tuple[Output, tuple[jax.Array, ...]]:
    """``(y, (x, scale, inv_rms))`` with ``inv_rms`` shaped ``x.shape[:-1]`` in float32; with ``residual``,
    ``((y, h), (h, scale, inv_rms, x[..., :0], residual[..., :0]))`` for ``h = x + residual`` (in ``x.dtype``):
    the empty slices carry the inputs' types under ``shard_map`` (which mesh axes each varies along), so
    each gradient is summed over the axes its input does not vary along."""
    del cfg
    h = x if residual is None else (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    h32 = h.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(h32), axis=-1) + eps)
    y = (h32 * inv[..., None] * scale.astype(jnp.float32)).astype(x.dtype)
    if residual is None:
        return y, (h, scale, inv)
    return (y, h), (h, scale, inv, x[..., :0], residual[..., :0])


def rms_norm(x: jax.Array, scale: jax.Array, *, residual: jax.Array | None = None, eps: float = 1e-6,
             cfg: RmsNormConfig | None = None) -> Output:
    """``x / sqrt(mean(x²) + eps) * scale`` over the last dimension, in ``x.dtype``; with ``residual``,
    ``(rms_norm(h), h)`` for ``h = x + residual``."""
    return rms_norm_fwd(x, scale, residual=residual, eps=eps, cfg=cfg)[0]


def rms_norm_bwd(residuals: tuple[jax.Array, ...], cotangent: Any, *, eps: float = 1e-6,
                 cfg: RmsNormConfig | None = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """``(dx, dscale, d residual)`` in the dtypes of ``x``, ``scale`` and ``residual`` (``None`` without one).

    ``cotangent`` is ``dy``, or ``(dy, dh)`` for a call with a residual: then ``dh`` adds to the
    normalisation's input gradient, which is both ``dx`` and ``d residual``.
    """
    del eps, cfg
    dy, dh = cotangent if isinstance(cotangent, tuple) else (cotangent, None)
    x, scale, inv, *inputs = residuals
    inv = inv[..., None]
    normed = x.astype(jnp.float32) * inv
    dy32 = dy.astype(jnp.float32)
    g = dy32 * scale.astype(jnp.float32)
    dx = inv * (g - normed * jnp.mean(g * normed, axis=-1, keepdims=True))
    if dh is not None:
        dx = dx + dh.astype(jnp.float32)
    dscale = cotangent_like(jnp.sum((dy32 * normed).reshape(-1, x.shape[-1]), axis=0).astype(scale.dtype), scale)
    if not inputs:
        return cotangent_like(dx.astype(x.dtype), x), dscale, None
    dx = dx.astype(x.dtype)
    return cotangent_like(dx, inputs[0]), dscale, cotangent_like(dx, inputs[1])


#: The custom VJP: residuals ``(x, scale, inv_rms)``, shared with every implementation of the tag.
vjp = VJP(fwd=rms_norm_fwd, bwd=rms_norm_bwd, residuals=RMS_NORM_RESIDUALS)


def config_space(x: Any, scale: Any, **_: Any) -> list[RmsNormConfig]:
    """Only ``RmsNormConfig()``."""
    del x, scale
    return [RmsNormConfig()]


def heuristic_config(x: Any, scale: Any, **_: Any) -> RmsNormConfig:
    """``RmsNormConfig()``."""
    del x, scale
    return RmsNormConfig()
