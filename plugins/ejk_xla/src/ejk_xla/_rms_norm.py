"""XLA ``rms_norm``: one fusion forward, one backward, statistics in float32.

The forward pass saves the per-row ``1 / rms`` (``RMS_NORM_RESIDUALS``), so the backward pass
reads ``x``, the cotangent and ``scale`` once and never recomputes the mean square::

    x̂ = x · inv_rms,  g = dy · scale,  dx = inv_rms · (g − x̂ · mean(g · x̂)),  dscale = Σ_rows dy · x̂

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


def rms_norm_fwd(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6,
                 cfg: RmsNormConfig | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    """``(y, (x, scale, inv_rms))`` with ``inv_rms`` shaped ``x.shape[:-1]`` in float32."""
    del cfg
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1) + eps)
    y = (x32 * inv[..., None] * scale.astype(jnp.float32)).astype(x.dtype)
    return y, (x, scale, inv)


def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6, cfg: RmsNormConfig | None = None) -> jax.Array:
    """``x / sqrt(mean(x²) + eps) * scale`` over the last dimension, in ``x.dtype``."""
    return rms_norm_fwd(x, scale, eps=eps, cfg=cfg)[0]


def rms_norm_bwd(residuals: tuple[jax.Array, jax.Array, jax.Array], dy: jax.Array, *, eps: float = 1e-6,
                 cfg: RmsNormConfig | None = None) -> tuple[jax.Array, jax.Array]:
    """``(dx, dscale)`` in the dtypes of ``x`` and ``scale``."""
    del eps, cfg
    x, scale, inv = residuals
    inv = inv[..., None]
    normed = x.astype(jnp.float32) * inv
    dy32 = dy.astype(jnp.float32)
    g = dy32 * scale.astype(jnp.float32)
    dx = inv * (g - normed * jnp.mean(g * normed, axis=-1, keepdims=True))
    dscale = jnp.sum((dy32 * normed).reshape(-1, x.shape[-1]), axis=0)
    return cotangent_like(dx.astype(x.dtype), x), cotangent_like(dscale.astype(scale.dtype), scale)


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
