"""The model's four heavy operations, on ejk's kernels or on plain JAX.

Both backends take the same arrays and the same parameters, so the same model runs on either:

- RMSNorm: ``ejk.rms_norm`` | float32 ``jnp``;
- packed causal attention: ``ejk.flash_attention_varlen`` over ``cu_seqlens`` |
  ``jax.nn.dot_product_attention`` under a ``[T, T]`` document mask;
- the experts' matmuls (MoE): ``ejk.grouped_matmul`` | ``jax.lax.ragged_dot``;
- LM head + loss: ``ejk.linear_cross_entropy`` (no ``[T, V]`` logits) | logits, then
  ``optax.softmax_cross_entropy_with_integer_labels``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax

import ejk
from ejk_llm import sharding

__all__ = ["BACKENDS", "Backend", "masked_attention"]

BackendName = Literal["ejk", "plain"]
BACKENDS: tuple[BackendName, ...] = ("ejk", "plain")


def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, sinks: jax.Array | None) -> jax.Array:
    """``jax.nn.dot_product_attention`` of ``q [B, Sq, Hq, D]`` over ``k, v [B, Sk, Hkv, D]`` under a boolean
    ``mask [B, Sq, Sk]``; ``sinks [Hq]`` become one extra key of logit ``sinks[h]`` (zero key, zero value)
    that no mask hides, which is exactly a sink's extra term in the softmax denominator."""
    mask = mask[:, None]
    bias = None
    if sinks is not None:
        b = q.shape[0]
        k = jnp.concatenate([k, jnp.zeros_like(k[:, :1])], axis=1)
        v = jnp.concatenate([v, jnp.zeros_like(v[:, :1])], axis=1)
        mask = jnp.concatenate([mask, jnp.ones((*mask.shape[:3], 1), bool)], axis=-1)
        zeros = jnp.zeros((q.shape[2], k.shape[1] - 1), jnp.float32)
        bias = jnp.concatenate([zeros, sinks.astype(jnp.float32)[:, None]], axis=-1)[None, :, None]
        bias = jnp.broadcast_to(bias, (b, q.shape[2], 1, k.shape[1])).astype(q.dtype)
    out: jax.Array = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)  # JAX picks cuDNN or XLA
    return out


def _document_mask(positions: jax.Array, window: int | None) -> jax.Array:
    """``[B, T, T]``: query i sees key j of its own document with ``j <= i`` (and ``i - j < window``)."""
    doc = jnp.cumsum(positions == 0, axis=-1)
    i = jnp.arange(positions.shape[-1])
    mask = (doc[:, :, None] == doc[:, None, :]) & (i[None, :, None] >= i[None, None, :])
    if window is not None:
        mask &= (i[:, None] - i[None, :] < window)[None]
    return mask


@dataclasses.dataclass(frozen=True)
class Backend:
    """Which library runs the heavy operations (``"ejk"`` or ``"plain"``)."""

    name: BackendName = "ejk"

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"backend {self.name!r} is unknown; choose one of {BACKENDS}")

    @property
    def is_ejk(self) -> bool:
        return self.name == "ejk"

    def rms_norm(self, x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
        """RMSNorm over the last dim; float32 statistics, output in ``x.dtype``."""
        if self.is_ejk:
            return ejk.rms_norm(x, scale.astype(x.dtype), eps=eps)
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)

    def packed_attention(self, q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                         cu_seqlens: jax.Array, window: int | None, sinks: jax.Array | None) -> jax.Array:
        """Causal attention within each packed document: ``q [B, T, Hq, D]``, ``k, v [B, T, Hkv, D]``,
        ``positions [B, T]`` (restarting at 0 per document), ``cu_seqlens [B, N+1]`` row-relative offsets."""
        extra = () if sinks is None else (sinks,)
        if not self.is_ejk:
            def local_plain(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                            *rest: jax.Array) -> jax.Array:
                return masked_attention(q, k, v, _document_mask(positions, window), rest[0] if rest else None)

            return sharding.per_batch_shard(local_plain, 4, len(extra))(q, k, v, positions, *extra)  # type: ignore[no-any-return]

        def local(q: jax.Array, k: jax.Array, v: jax.Array, cu: jax.Array, *rest: jax.Array) -> jax.Array:
            b, t = q.shape[:2]
            # One packed stream of the rows: row r's offsets shifted by r * T. Each row ends with T, so
            # the streams join without a document crossing a row.
            flat_cu = (jnp.arange(b, dtype=jnp.int32)[:, None] * t + cu).reshape(-1)
            sinks = rest[0] if rest else None
            axes = sharding.batch_axes()
            if sinks is not None and axes:
                # Under shard_map the sinks are replicated but their gradient varies by device; ejk's varlen
                # backward does not sum it over the axes (JAX: "manual axis types do not match"), so make
                # the sinks per-device values here: the cast's transpose is that sum.
                sinks = jax.lax.pcast(sinks, axes, to="varying")
            out = ejk.flash_attention_varlen(
                q.reshape(b * t, *q.shape[2:]), k.reshape(b * t, *k.shape[2:]), v.reshape(b * t, *v.shape[2:]),
                flat_cu, flat_cu, causal=True, sliding_window=None if window is None else window - 1,
                sinks=sinks)
            return out.reshape(q.shape[:3] + v.shape[3:])

        # ejk gathers the packed token axis when it is split (a sequence may cross any cut); each row of
        # our batch is whole, so run each device's rows on its own.
        return sharding.per_batch_shard(local, 4, len(extra))(q, k, v, cu_seqlens, *extra)  # type: ignore[no-any-return]

    def grouped_matmul(self, x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
        """``x [M, K]`` rows sorted by group, ``w [G, K, N]`` → ``[M, N]``."""
        if self.is_ejk:
            return ejk.grouped_matmul(x, w, group_sizes, precision=_precision(x))
        return jax.lax.ragged_dot(x, w, group_sizes, precision=_lax_precision(x))

    def loss(self, h: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
        """Mean next-token cross-entropy of ``h [T, D] @ w [D, V]`` over labels ``!= -100``."""
        if self.is_ejk:
            return ejk.linear_cross_entropy(h, w, labels, ignore_index=-100, precision=_precision(h))
        logits = jnp.einsum("td,dv->tv", h, w, precision=_lax_precision(h), preferred_element_type=jnp.float32)
        valid = labels != -100
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0))
        return jnp.sum(jnp.where(valid, per_token, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def _precision(x: jax.Array) -> str:
    return "highest" if x.dtype == jnp.float32 else "default"


def _lax_precision(x: jax.Array) -> Any:
    return jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
