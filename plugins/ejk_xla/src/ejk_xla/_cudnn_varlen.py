"""Packed variable-length attention through cuDNN's fused attention in its packed ("THD") mode.

``jax.nn.dot_product_attention`` takes no sequence offsets, so this calls the function behind it,
``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention``, with ``q_offsets`` /
``kv_offsets``: the packed tokens are one batch row of ``M = max(N, 2)`` segments (jax switches
to the packed layout only for more than one segment per row), segment ``s`` starting at its
offset with its own length. The offsets stay traced arrays: a new packing reuses the program.
cuDNN differentiates itself (its fused backward, through jax's ``custom_vjp``).

Mapping ejk's contract onto it:

- A sequence with no keys, or no queries, is left out of cuDNN's segments (``-1`` entries, which
  jax drops); rows that no segment covers (those, and the padding after the last offset) are
  zeros with zero gradients because XLA zero-fills every output of its cuDNN attention calls
  (dq, dk, dv included) and cuDNN skips rows outside the segments.
- Causal masks and windows: cuDNN's are top-left aligned per segment, ejk's bottom-right. For a
  sequence with ``Sq_s >= Sk_s`` the two agree once the segment starts ``Sq_s - Sk_s`` rows late
  (the skipped rows see no key: zeros). A sequence with ``Sq_s < Sk_s`` cannot be expressed, and
  the offsets are only known at run time: such calls run ``lax.cond`` on the offsets, cuDNN when
  every sequence fits, else ejk-xla's chunked kernel (correct, much slower). The backward takes
  the same branch. Without a causal mask or window no check is needed and no ``cond`` is built.
- Windows: ``(left, 0)`` (causal or not) is cuDNN's ``sliding_window_length = left + 1``; a
  window with a right reach is refused.
- Grouped-query attention runs with k / v heads repeated to ``Hq``: jax scales the key offsets by
  the query heads' token stride (``_fix_seqlen_offsets``), right only when k has ``Hq`` heads.
- An odd number of packed rows gets one padding row (jax's cuDNN backward refuses odd lengths).

:func:`capability` refuses what cuDNN cannot run: no NVIDIA GPU of compute capability 9.0 or newer
(jax's packed layout needs Hopper), a jax without the packed API, float32, head dims outside
``8k <= 256``, ``Dv != D``, soft caps, sinks, no sequences, empty arrays, causal / windowed calls
with ``Tq < Tk`` (some sequence then has more keys than queries: the slow branch would run), and
calls whose softmax statistics would pass :data:`MAX_STATS_BYTES` (jax allocates
``[M, Hq, Tq]`` float32 for training).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejk_xla import _cudnn_attention, _varlen_attention

__all__ = [
    "MAX_STATS_BYTES",
    "api_problem",
    "capability",
    "cudnn_varlen_attention",
    "packed_segments",
    "shape_problem",
    "stats_bytes",
]

_DTYPES = ("bfloat16", "float16")

#: The largest softmax statistics (``[M, Hq, Tq]`` float32, one ``[Hq, Tq]`` block per sequence)
#: this implementation lets jax allocate; calls with more sequences go to the other implementations.
MAX_STATS_BYTES = 1 << 30

Segments = tuple[jax.Array, jax.Array, jax.Array, jax.Array]


def api_problem() -> str | None:
    """Why this jax has no packed cuDNN attention (``None`` when it has)."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused
    except ImportError as exc:  # pragma: no cover - depends on the jax build
        return f"jax's cuDNN attention module cannot be imported ({exc})"
    params = inspect.signature(fused.dot_product_attention).parameters
    missing = [name for name in ("q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "mask_type",
                                 "sliding_window_length", "qkv_layout") if name not in params]
    if missing or not hasattr(fused.MaskType, "PADDING_CAUSAL"):
        what = ", ".join(missing) or "MaskType.PADDING_CAUSAL"
        return f"jax {jax.__version__}'s cuDNN attention has no packed mode (missing {what})"
    return None


def _device_problem() -> str | None:
    problem = _cudnn_attention.device_problem()
    if problem is not None:
        return problem
    capability = float(getattr(jax.devices()[0], "compute_capability", 0) or 0)
    if capability < 9.0:
        return f"cuDNN's packed layout needs compute capability 9.0 or newer (Hopper), this GPU has {capability}"
    return None


def _even(n: int) -> int:
    return n + n % 2


def _segments(n: int) -> int:
    """cuDNN segments per row: jax uses its packed layout only for more than one."""
    return max(n, 2)


def stats_bytes(seqs: int, heads: int, q_tokens: int) -> int:
    """Bytes of the softmax statistics jax allocates for a differentiated call (see :data:`MAX_STATS_BYTES`)."""
    return _segments(seqs) * heads * _even(q_tokens) * 4


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
    stats = stats_bytes(seqs, hq, tq)
    if stats > MAX_STATS_BYTES:
        return (f"{seqs} sequences: cuDNN's softmax statistics ([{_segments(seqs)}, {hq}, {_even(tq)}] float32, "
                f"{stats / 2**30:.1f} GiB) exceed {MAX_STATS_BYTES / 2**30:.0f} GiB")
    return None


def capability(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, **call: Any) -> str | None:
    """Why packed cuDNN attention cannot run this call here, or ``None`` when it can (see the module doc)."""
    problem = _device_problem() or api_problem()
    if problem is not None:
        return problem
    max_head_dim = 256  # compute capability 9.0 or newer (checked above)
    return shape_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_head_dim=max_head_dim, **call)


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
class _Static:
    scale: float
    masked: bool
    window_length: int | None  # cuDNN's sliding_window_length (left + 1), None without a window
    causal: bool
    sliding_window: tuple[int, int] | None
    q_tokens: int
    k_tokens: int


def _cudnn_packed(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, segments: Segments) -> jax.Array:
    """jax's packed cuDNN attention on ``[1, T, H, D]`` arrays (``k`` / ``v`` with ``Hq`` heads)."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    q_seqlen, kv_seqlen, q_offsets, kv_offsets = segments
    mask = fused.MaskType.PADDING_CAUSAL if st.masked else fused.MaskType.PADDING
    out: jax.Array = fused.dot_product_attention(
        q, k, v, bias=None, mask=None, q_seqlen=q_seqlen, kv_seqlen=kv_seqlen, q_offsets=q_offsets,
        kv_offsets=kv_offsets, scale=st.scale, mask_type=mask, sliding_window_length=st.window_length,
        qkv_layout="BTNH")
    return out


#: The packed attention call: jax's cuDNN function (tests substitute an emulation to run on a CPU).
_packed_attention: Callable[[_Static, jax.Array, jax.Array, jax.Array, Segments], jax.Array] = _cudnn_packed


def _fallback(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, cu_q: jax.Array, cu_k: jax.Array) -> jax.Array:
    """ejk-xla's chunked varlen kernel on the prepared ``[1, T, Hq, D]`` arrays (the ``cond``'s slow branch)."""
    out = _varlen_attention.flash_attention_varlen(
        q[0, :st.q_tokens], k[0, :st.k_tokens], v[0, :st.k_tokens], cu_q, cu_k, sinks=None, causal=st.causal,
        softmax_scale=st.scale, sliding_window=st.sliding_window, logits_soft_cap=None, max_seqlen_q=None,
        max_seqlen_k=None, precision="default")
    return jnp.pad(out, [(0, q.shape[1] - st.q_tokens), (0, 0), (0, 0)])[None]


@jax.tree_util.register_pytree_node_class
class _Saved:
    """cuDNN's backward residuals without the arrays the backward has anyway (q, k, v, out).

    ``tree`` is the structure of ``jax.vjp``'s pullback; ``slots[i]`` says where its leaf ``i``
    comes from: an index into ``(q, k, v, out)``, or ``None`` for the next of ``kept``.
    """

    def __init__(self, kept: tuple[jax.Array, ...], tree: Any, slots: tuple[int | None, ...]) -> None:
        self.kept, self.tree, self.slots = kept, tree, slots

    def tree_flatten(self) -> tuple[tuple[jax.Array, ...], tuple[Any, tuple[int | None, ...]]]:
        return self.kept, (self.tree, self.slots)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, tuple[int | None, ...]], kept: Any) -> _Saved:
        return cls(tuple(kept), *aux)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _guarded(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, cu_q: jax.Array, cu_k: jax.Array,
             segments: Segments, fits: jax.Array) -> jax.Array:
    out: jax.Array = lax.cond(fits, lambda: _packed_attention(st, q, k, v, segments),
                              lambda: _fallback(st, q, k, v, cu_q, cu_k))
    return out


def _guarded_fwd(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, cu_q: jax.Array, cu_k: jax.Array,
                 segments: Segments, fits: jax.Array) -> tuple[jax.Array, tuple[Any, ...]]:
    layout: dict[str, Any] = {}

    def fast(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        out, pullback = jax.vjp(lambda a, b, c: _packed_attention(st, a, b, c, segments), q, k, v)
        leaves, tree = jax.tree.flatten(pullback)
        known = (q, k, v, out)
        slots = tuple(next((i for i, x in enumerate(known) if leaf is x), None) for leaf in leaves)
        layout.update(tree=tree, slots=slots)
        return out, tuple(leaf for leaf, slot in zip(leaves, slots, strict=True) if slot is None)

    kept_shapes = jax.eval_shape(fast, q, k, v)[1]

    def slow(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        return _fallback(st, q, k, v, cu_q, cu_k), tuple(jnp.zeros(s.shape, s.dtype) for s in kept_shapes)

    out, kept = lax.cond(fits, fast, slow, q, k, v)
    return out, (q, k, v, cu_q, cu_k, fits, out, _Saved(kept, layout["tree"], layout["slots"]))


def _guarded_bwd(st: _Static, residuals: tuple[Any, ...], d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, cu_q, cu_k, fits, out, saved = residuals

    def fast(d_out: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array,
             kept: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        known, rest = (q, k, v, out), iter(kept)
        leaves = [next(rest) if slot is None else known[slot] for slot in saved.slots]
        return tuple(jax.tree.unflatten(saved.tree, leaves)(d_out))

    def slow(d_out: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array,
             kept: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        del out, kept
        _, pullback = jax.vjp(lambda a, b, c: _fallback(st, a, b, c, cu_q, cu_k), q, k, v)
        return tuple(pullback(d_out))

    dq, dk, dv = lax.cond(fits, fast, slow, d_out, q, k, v, out, saved.kept)
    return dq, dk, dv, None, None, None, None


_guarded.defvjp(_guarded_fwd, _guarded_bwd)


def _prepare(x: jax.Array, rows: int, heads: int) -> jax.Array:
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
    st = _Static(scale=float(softmax_scale), masked=masked, window_length=window_length, causal=causal,
                 sliding_window=None if sliding_window is None else tuple(sliding_window),  # type: ignore[arg-type]
                 q_tokens=tq, k_tokens=tk)
    segments, fits = packed_segments(cu_seqlens_q, cu_seqlens_k, masked=masked)
    q4 = _prepare(q, _even(tq), hq)
    k4, v4 = _prepare(k, _even(tk), hq), _prepare(v, _even(tk), hq)
    if masked:
        out = _guarded(st, q4, k4, v4, cu_seqlens_q, cu_seqlens_k, segments, fits)
    else:
        out = _packed_attention(st, q4, k4, v4, segments)
    return out[0, :tq].astype(q.dtype)

