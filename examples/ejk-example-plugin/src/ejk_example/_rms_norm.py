"""The fused RMSNorm kernel (XLA): one pass in float32, an analytic backward from saved statistics.

``y = x * rsqrt(mean(x**2, -1) + eps) * weight``. The forward saves the per-row ``1/rms`` so the
backward needs no second reduction over ``x**2``:

    dx = r * (g*w) - x * r**3 * mean((g*w) * x, -1)        dw = sum_rows(g * x * r)

The config only changes speed: ``block_rows`` processes the rows in blocks of that many (``0``: all
at once), which bounds the float32 temporaries of very large inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import cdiv, int_in

__all__ = ["MAX_HIDDEN", "RmsNormConfig", "backward", "capability", "config_space", "forward",
           "forward_with_residuals", "heuristic_config"]

#: The largest hidden size (last dimension) the kernel accepts: one row's float32 temporaries stay small.
MAX_HIDDEN = 1 << 16
_BLOCKS = (256, 1024, 4096)


@attrs.frozen(kw_only=True)
class RmsNormConfig:
    """Config of the fused RMSNorm: rows per block (``0``: every row in one block)."""

    block_rows: int = attrs.field(default=0, validator=int_in(0, 1 << 20))


def _rowwise(fn: Callable[..., tuple[jax.Array, ...]], block_rows: int, *rows: jax.Array) -> tuple[jax.Array, ...]:
    """``fn`` applied to ``[n, ...]`` row arrays at once, or block by block (``lax.map``), unpadded after."""
    n = rows[0].shape[0]
    if block_rows <= 0 or n <= block_rows:
        return fn(*rows)
    blocks = cdiv(n, block_rows)
    pad = blocks * block_rows - n
    padded = [jnp.pad(r, [(0, pad)] + [(0, 0)] * (r.ndim - 1)).reshape(blocks, block_rows, *r.shape[1:])
              for r in rows]
    outs = jax.lax.map(lambda xs: fn(*xs), tuple(padded))
    return tuple(o.reshape(blocks * block_rows, *o.shape[2:])[:n] for o in outs)


def _stats(x2: jax.Array, eps: float) -> jax.Array:
    """Per row ``1 / rms`` in float32, shape ``[n, 1]``."""
    x32 = x2.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + jnp.float32(eps))


def forward_with_residuals(x: jax.Array, weight: jax.Array, *, eps: float,
                           cfg: RmsNormConfig | None = None) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The forward and what the backward needs: ``(y, (x, weight, 1/rms))``."""
    cfg = cfg or RmsNormConfig()
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    w32 = weight.astype(jnp.float32)

    def block(xb: jax.Array) -> tuple[jax.Array, jax.Array]:
        inv = _stats(xb, eps)
        return (xb.astype(jnp.float32) * inv * w32).astype(x.dtype), inv

    y, inv = _rowwise(block, cfg.block_rows, x2)
    return y.reshape(x.shape), (x, weight, inv)


def forward(x: jax.Array, weight: jax.Array, *, eps: float, cfg: RmsNormConfig | None = None) -> jax.Array:
    """``rms_norm(x, weight, eps=eps)``: ``x`` ``[..., d]``, ``weight`` ``[d]``; the output has ``x``'s dtype."""
    return forward_with_residuals(x, weight, eps=eps, cfg=cfg)[0]


def backward(residuals: tuple[jax.Array, ...], g: jax.Array, *, eps: float,
             cfg: RmsNormConfig | None = None) -> tuple[jax.Array, jax.Array]:
    """Cotangents of ``x`` and ``weight`` from the saved ``1/rms`` (one cotangent per array argument)."""
    del eps
    cfg = cfg or RmsNormConfig()
    x, weight, inv = residuals
    d = x.shape[-1]
    w32 = weight.astype(jnp.float32)

    def block(xb: jax.Array, gb: jax.Array, rb: jax.Array) -> tuple[jax.Array, jax.Array]:
        x32, g32 = xb.astype(jnp.float32), gb.astype(jnp.float32)
        gw = g32 * w32
        dx = rb * gw - x32 * rb**3 * jnp.mean(gw * x32, axis=-1, keepdims=True)
        return dx, g32 * x32 * rb

    dx, dw_rows = _rowwise(block, cfg.block_rows, x.reshape(-1, d), g.reshape(-1, d), inv)
    return dx.reshape(x.shape).astype(x.dtype), jnp.sum(dw_rows, axis=0).astype(weight.dtype)


def _rows(x: Any) -> int:
    n = 1
    for dim in x.shape[:-1]:
        n *= int(dim)
    return n


def config_space(x: Any, weight: Any, **_: Any) -> list[RmsNormConfig]:
    """Autotuning candidates: all rows at once, and the block sizes smaller than the row count."""
    rows = _rows(x)
    return [RmsNormConfig()] + [RmsNormConfig(block_rows=b) for b in _BLOCKS if b < rows]


def heuristic_config(x: Any, weight: Any, **_: Any) -> RmsNormConfig:
    """Without measuring: one block up to 16 Mi elements, blocks of 4096 rows above."""
    return RmsNormConfig() if _rows(x) * int(x.shape[-1]) <= (1 << 24) else RmsNormConfig(block_rows=4096)


def capability(x: Any, weight: Any, **_: Any) -> str | None:
    """Why this kernel cannot run a call (``None``: it can): hidden sizes above :data:`MAX_HIDDEN`."""
    d = int(x.shape[-1])
    return None if d <= MAX_HIDDEN else f"hidden size {d} > {MAX_HIDDEN} is not supported"
