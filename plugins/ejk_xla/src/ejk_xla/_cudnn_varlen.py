"""Packed variable-length attention through cuDNN's fused attention in its packed ("THD") mode.

The packed tokens are one batch row of ``M = max(N, 2)`` cuDNN segments (:mod:`ejk_xla._cudnn_packed`:
jax takes the packed layout only for more than one segment per row), segment ``s`` starting at
its offset with its own length. The offsets stay traced arrays: a new packing reuses the program.
cuDNN differentiates itself (its fused backward, through jax's ``custom_vjp``).

Mapping ejk's contract onto it:

- A sequence with no keys, or no queries, is no segment; rows that no segment covers (those, and
  the padding after the last offset) are zeros with zero gradients (cuDNN leaves them unwritten:
  they are zeroed after it, in the output and in the gradients).
- Causal masks and windows: cuDNN's are top-left aligned per segment, ejk's bottom-right. For a
  sequence with ``Sq_s >= Sk_s`` the two agree once the segment starts ``Sq_s - Sk_s`` rows late
  (the skipped rows see no key: zeros). A sequence with ``Sq_s < Sk_s`` cannot be expressed, and
  the offsets are only known at run time: such calls run ``lax.cond`` on the offsets
  (:func:`ejk_xla._cudnn_packed.guarded`), cuDNN when every sequence fits, else ejk-xla's chunked
  kernel (exact, much slower); the backward takes the same branch. Without a causal mask or window
  no check is needed and no ``cond`` is built.
- Windows: ``(left, 0)`` (causal or not) is cuDNN's ``sliding_window_length = left + 1``; a
  window with a right reach is refused.
- Grouped-query attention runs with k / v heads repeated to ``Hq``: jax scales the key offsets by
  the query heads' token stride (its ``_fix_seqlen_offsets``), right only when k has ``Hq`` heads.
- An odd number of packed rows gets one padding row (jax's cuDNN backward refuses odd lengths).

:func:`capability` refuses what cuDNN cannot run: no NVIDIA GPU of compute capability 9.0 or newer
(jax's packed layout needs Hopper), cuDNN older than 9.6, a jax without the packed API, float32, head dims outside
``8k <= 256``, ``Dv != D``, soft caps, sinks, no sequences, empty arrays, causal / windowed calls
with ``Tq < Tk`` (some sequence then has more keys than queries: the slow branch would run), and
calls whose softmax statistics would pass :data:`MAX_STATS_BYTES` (jax allocates
``[M, Hq, Tq]`` float32 for training).
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk_xla import _cudnn_packed, _varlen_attention
from ejk_xla._cudnn_packed import Segments

__all__ = ["MAX_STATS_BYTES", "capability", "cudnn_varlen_attention", "packed_segments", "shape_problem"]

_DTYPES = ("bfloat16", "float16")

#: The largest softmax statistics (``[M, Hq, Tq]`` float32, one ``[Hq, Tq]`` block per sequence)
#: this implementation lets jax allocate; calls with more sequences go to the other implementations.
MAX_STATS_BYTES = 1 << 30


def _even(n: int) -> int:
    return n + n % 2


def _segments(n: int) -> int:
    """cuDNN segments per row: jax uses its packed layout only for more than one."""
    return max(n, 2)


def shape_problem(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    sinks: Any,
    causal: bool,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    max_head_dim: int = 256,
    **_: Any,
) -> str | None:
    """The device-independent part of :func:`capability` (testable on any machine)."""
    dtype = np.dtype(q.dtype).name
    if dtype not in _DTYPES:
        return f"{dtype} not supported (cuDNN attention takes bfloat16 or float16)"
    tq, hq, head_dim = q.shape
    tk, v_dim = k.shape[0], v.shape[2]
    seqs = cu_seqlens_q.shape[0] - 1
    if seqs < 1:
        return "no sequences (N = 0)"
    if min(tq, tk, hq, head_dim) == 0:
        return "empty arrays"
    if head_dim != v_dim:
        return f"v head dim {v_dim} differs from q/k head dim {head_dim}"
    if head_dim % 8 or head_dim > max_head_dim:
        return f"head_dim {head_dim} not supported (a multiple of 8, at most {max_head_dim})"
    if logits_soft_cap is not None:
        return "soft cap not supported"
    if sinks is not None:
        return "sinks not supported (cuDNN has no sink logit)"
    masked = causal or sliding_window is not None
    if sliding_window is not None and not causal and sliding_window[1] != 0:
        return f"sliding window {tuple(sliding_window)} has a right reach (cuDNN supports only (left, 0))"
    if masked and tq < tk:
        return (f"causal or windowed attention with Tq={tq} < Tk={tk}: some sequence has more keys than queries, "
                "where jax's top-left cuDNN mask differs from ejk's bottom-right one")
    stats = _cudnn_packed.stats_bytes(1, _segments(seqs), hq, _even(tq))
    if stats > MAX_STATS_BYTES:
        return (f"{seqs} sequences: cuDNN's softmax statistics ([{_segments(seqs)}, {hq}, {_even(tq)}] float32, "
                f"{stats / 2**30:.1f} GiB) exceed {MAX_STATS_BYTES / 2**30:.0f} GiB")
    return None


def capability(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, **call: Any) -> str | None:
    """Why packed cuDNN attention cannot run this call here, or ``None`` when it can (see the module doc)."""
    problem = _cudnn_packed.device_problem()  # compute capability 9.0 or newer: head dims up to 256
    if problem is not None:
        return problem
    return shape_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, **call)


def packed_segments(cu_seqlens_q: jax.Array, cu_seqlens_k: jax.Array, *, masked: bool) -> tuple[Segments, jax.Array]:
    """cuDNN's segments for ejk's offsets, and whether cuDNN computes the call exactly.

    Returns:
        ``((q_seqlen, kv_seqlen, q_offsets, kv_offsets), fits)``: int32 ``[1, M]``, ``[1, M]``,
        ``[1, M + 1]``, ``[1, M + 1]`` (``M = max(N, 2)``) in the layout of jax's packed cuDNN
        attention (one row of segment lengths and starts, ``-1`` for no segment); and a bool
        scalar, true unless ``masked`` (causal or a window) and some sequence with queries and
        keys has fewer queries than keys. Sequences without queries or without keys are no
        segment; with ``masked``, a sequence with ``Sq_s > Sk_s`` starts ``Sq_s - Sk_s`` rows
        late (its first rows see no key, as in ejk's bottom-right alignment).
    """
    cu_q, cu_k = cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32)
    lens_q, lens_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    active = (lens_q > 0) & (lens_k > 0)
    if masked:
        skip = jnp.maximum(lens_q - lens_k, 0)
        fits = jnp.all(~active | (lens_q >= lens_k))
    else:
        skip = jnp.zeros_like(lens_q)
        fits = jnp.asarray(True)
    none = jnp.int32(-1)
    seqs = lens_q.shape[0]
    extra = _segments(seqs) - seqs

    def row(x: jax.Array, tail: int) -> jax.Array:
        return jnp.concatenate([jnp.where(active, x, none), jnp.full((extra + tail,), -1, jnp.int32)])[None]

    segments = (row(lens_q - skip, 0), row(lens_k, 0), row(cu_q[:-1] + skip, 1), row(cu_k[:-1], 1))
    return segments, fits


@attrs.frozen
class _Plan:
    """A call's static arguments (a :class:`ejk_xla._cudnn_packed.Plan`); its fallback is ejk-xla's
    chunked varlen kernel on the prepared ``[1, T, Hq, D]`` arrays, ``aux = (cu_q, cu_k)``."""

    scale: float
    masked: bool
    window_length: int | None  # cuDNN's sliding_window_length (left + 1), None without a window
    causal: bool
    sliding_window: tuple[int, int] | None
    q_tokens: int
    k_tokens: int

    def fallback(self, q: jax.Array, k: jax.Array, v: jax.Array, aux: Any) -> jax.Array:
        cu_q, cu_k = aux
        out = _varlen_attention.flash_attention_varlen(
            q[0, :self.q_tokens], k[0, :self.k_tokens], v[0, :self.k_tokens], cu_q, cu_k, sinks=None,
            causal=self.causal, softmax_scale=self.scale, sliding_window=self.sliding_window, logits_soft_cap=None,
            max_seqlen_q=None, max_seqlen_k=None, precision="default")
        return jnp.pad(out, [(0, q.shape[1] - self.q_tokens), (0, 0), (0, 0)])[None]


def prepare(x: jax.Array, rows: int, heads: int) -> jax.Array:
    """``[T, H, D]`` → ``[1, rows, heads, D]``: zero rows appended, heads repeated for GQA."""
    if x.shape[1] != heads:
        x = jnp.repeat(x, heads // x.shape[1], axis=1)
    if rows != x.shape[0]:
        x = jnp.pad(x, [(0, rows - x.shape[0]), (0, 0), (0, 0)])
    return x[None]


def cudnn_varlen_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    sinks: jax.Array | None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    precision: str,
    cfg: None = None,
) -> jax.Array:
    """Packed varlen attention on cuDNN for calls :func:`capability` accepts (arguments normalised,
    see KERNEL_CONTRACT.md). It takes no config; ``max_seqlen_*`` and ``precision`` (always
    ``"default"`` for bfloat16 / float16) are unused.

    Returns:
        ``[Tq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    del sinks, logits_soft_cap, max_seqlen_q, max_seqlen_k, precision, cfg  # gated or unused
    tq, hq, _ = q.shape
    tk = k.shape[0]
    masked = causal or sliding_window is not None
    window_length = None
    if sliding_window is not None and sliding_window[0] < tk - 1:  # a wider window hides nothing
        window_length = int(sliding_window[0]) + 1
    window = None if sliding_window is None else (int(sliding_window[0]), int(sliding_window[1]))
    plan = _Plan(scale=float(softmax_scale), masked=masked, window_length=window_length, causal=causal,
                 sliding_window=window, q_tokens=tq, k_tokens=tk)
    segments, fits = packed_segments(cu_seqlens_q, cu_seqlens_k, masked=masked)
    q4 = prepare(q, _even(tq), hq)
    k4, v4 = prepare(k, _even(tk), hq), prepare(v, _even(tk), hq)
    out = _cudnn_packed.guarded(plan, q4, k4, v4, (cu_seqlens_q, cu_seqlens_k), segments, fits if masked else None)
    return out[0, :tq].astype(q.dtype)
