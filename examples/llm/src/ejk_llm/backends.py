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
from collections.abc import Callable
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
    out: jax.Array = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)  # JAX's default: XLA
    return out


def _varying(sinks: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``sinks`` as a per-device value inside ``shard_map``. Replicated sinks get a gradient that varies by
    device; ejk's attention backwards do not sum it over the axes (JAX: "manual axis types do not match"),
    so the example casts them: the cast's transpose is that sum."""
    return jax.lax.pcast(sinks, axes, to="varying") if axes else sinks


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

    def packed_attention(self, q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array,
                         cu_seqlens: jax.Array, window: int | None, sinks: jax.Array | None) -> jax.Array:
        """Causal attention within each packed document: ``q [B, T, Hq, D]``, ``k, v [B, T, Hkv, D]``,
        ``segments [B, T]`` (each token's document in its row), ``cu_seqlens [B, N+1]`` row-relative offsets.

        Each device attends for its own rows (``jax.shard_map``); with a ``seq`` mesh axis, each row's
        tokens are split too and the keys travel around a ring (``ejk.ring_attention``; plain JAX gathers them).
        """
        extra = () if sinks is None else (sinks,)
        seq = sharding.seq_axis()
        varying = (*sharding.batch_axes(), *((seq,) if seq else ()))
        left = None if window is None else window - 1

        def local_plain(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, *rest: jax.Array) -> jax.Array:
            t = q.shape[1]
            q_index = jnp.arange(t)
            kv_segments = segments
            if seq:  # every key of the row, and this block's place in it
                k, v, kv_segments = (jax.lax.all_gather(x, seq, axis=1, tiled=True) for x in (k, v, segments))
                q_index = q_index + jax.lax.axis_index(seq) * t
            kv_index = jnp.arange(k.shape[1])
            mask = (segments[:, :, None] == kv_segments[:, None, :]) & (q_index[:, None] >= kv_index[None, :])[None]
            if window is not None:
                mask &= (q_index[:, None] - kv_index[None, :] < window)[None]
            return masked_attention(q, k, v, mask, rest[0] if rest else None)

        def local_ring(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, *rest: jax.Array) -> jax.Array:
            return ejk.ring_attention(q, k, v, axis_name=seq, causal=True, sliding_window=left,
                                      q_segment_ids=segments, kv_segment_ids=segments,
                                      sinks=_varying(rest[0], varying) if rest else None)

        def local_varlen(q: jax.Array, k: jax.Array, v: jax.Array, cu: jax.Array, *rest: jax.Array) -> jax.Array:
            b, t = q.shape[:2]
            # One packed stream of the rows: row r's offsets shifted by r * T. Each row ends with T, so
            # the streams join without a document crossing a row.
            flat_cu = (jnp.arange(b, dtype=jnp.int32)[:, None] * t + cu).reshape(-1)
            out = ejk.flash_attention_varlen(
                q.reshape(b * t, *q.shape[2:]), k.reshape(b * t, *k.shape[2:]), v.reshape(b * t, *v.shape[2:]),
                flat_cu, flat_cu, causal=True, sliding_window=left,
                sinks=_varying(rest[0], varying) if rest else None)
            return out.reshape(q.shape[:3] + v.shape[3:])

        fn: Callable[..., jax.Array]
        if not self.is_ejk:
            fn, kinds, ids = local_plain, "tttt", segments
        elif seq:
            fn, kinds, ids = local_ring, "tttt", segments
        else:
            # ejk's own sharding of the varlen op would gather the packed token axis (a sequence may cross
            # any cut); each row of our batch is whole, so each device runs its rows on its own.
            fn, kinds, ids = local_varlen, "tttb", cu_seqlens
        return sharding.per_device(fn, kinds + "r" * len(extra))(q, k, v, ids, *extra)  # type: ignore[no-any-return]

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
