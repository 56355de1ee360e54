"""jax's cuDNN attention in its packed mode, and a ``cond`` between it and an exact fallback.

``jax.nn.dot_product_attention`` takes no segment offsets, so :func:`packed_attention` calls the
function behind it, ``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention``, with
``q_offsets`` / ``kv_offsets``: each batch row holds up to ``M`` segments (``[B, M]`` lengths,
``[B, M + 1]`` starts, ``-1`` for no segment; jax drops those entries and takes the packed layout
only for ``M > 1``). The segments stay traced arrays: a new packing reuses the program. Within a
segment cuDNN's causal mask and window are top-left aligned. cuDNN leaves the rows that no
segment covers unwritten (whatever the buffer held, NaN included: seen on an H100, jax 0.11.2), so
:func:`_cudnn` zeroes them in the output and in dq, dk and dv.

Some calls are exact on cuDNN only for some runtime values (the segments must express the
call's mask). :func:`guarded` runs ``lax.cond`` on a traced predicate, cuDNN or the caller's
exact fallback, forward and backward alike, under a ``custom_vjp`` whose residuals keep only what
cuDNN's backward needs besides q, k, v and the output: nothing passes through the ``cond`` twice.
Every cuDNN call sits in a ``jax.custom_batching.sequential_vmap``: under ``jax.vmap`` it runs once
per batch element (jax's own batching rule of its cuDNN call folds the vmapped axis into ``B`` and
reshapes the segment arrays as if they were one length per row, which they are not).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax import custom_batching, lax

from ejk_xla import _cudnn_attention

__all__ = ["MIN_CUDNN", "Plan", "Segments", "api_problem", "covered_rows", "device_problem", "guarded",
           "packed_attention", "stats_bytes"]

#: ``(q_seqlen [B, M], kv_seqlen [B, M], q_offsets [B, M + 1], kv_offsets [B, M + 1])``, int32.
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


#: The oldest cuDNN with the packed layout (jax's own tests of it skip before 9.6.0).
MIN_CUDNN = 90600


def device_problem() -> str | None:
    """Why this process cannot run packed cuDNN attention: an NVIDIA GPU of compute capability 9.0 or
    newer (jax refuses the packed layout before Hopper), cuDNN 9.6 or newer and a jax that has it."""
    problem = _cudnn_attention.device_problem()
    if problem is not None:
        return problem
    capability = float(getattr(jax.devices()[0], "compute_capability", 0) or 0)
    if capability < 9.0:
        return f"cuDNN's packed layout needs compute capability 9.0 or newer (Hopper), this GPU has {capability}"
    problem = api_problem()
    if problem is not None:
        return problem
    from jax._src.cudnn import fused_attention_stablehlo as fused

    try:
        version = int(fused.check_cudnn_version())
    except RuntimeError as exc:
        return f"cuDNN not found ({exc})"
    if version < MIN_CUDNN:
        return f"cuDNN's packed layout needs cuDNN 9.6 or newer, this process has {version}"
    return None


def stats_bytes(batch: int, segments: int, heads: int, q_len: int) -> int:
    """Bytes of the softmax statistics jax allocates for a differentiated packed call: ``[B * M, Hq, Sq]``
    float32, one ``[Hq, Sq]`` block per segment slot."""
    return batch * segments * heads * q_len * 4


def packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: Segments, *, scale: float, masked: bool,
                     window_length: int | None) -> jax.Array:
    """jax's packed cuDNN attention on ``[B, T, H, D]`` arrays (``k`` / ``v`` with ``q``'s head count: jax
    scales the key offsets by the query heads' token stride). ``masked``: top-left causal per segment;
    ``window_length``: cuDNN's ``sliding_window_length`` (a row sees its ``window_length`` last keys)."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    q_seqlen, kv_seqlen, q_offsets, kv_offsets = segments
    mask = fused.MaskType.PADDING_CAUSAL if masked else fused.MaskType.PADDING
    out: jax.Array = fused.dot_product_attention(
        q, k, v, bias=None, mask=None, q_seqlen=q_seqlen, kv_seqlen=kv_seqlen, q_offsets=q_offsets,
        kv_offsets=kv_offsets, scale=scale, mask_type=mask, sliding_window_length=window_length, qkv_layout="BTNH")
    return out


class Plan(Protocol):
    """The static half of a :func:`guarded` call (hashable): cuDNN's arguments and the exact fallback."""

    @property
    def scale(self) -> float:
        """The softmax scale."""
        ...

    @property
    def masked(self) -> bool:
        """Top-left causal masks per segment (causal or a window)."""
        ...

    @property
    def window_length(self) -> int | None:
        """cuDNN's ``sliding_window_length``, or ``None``."""
        ...

    def fallback(self, q: jax.Array, k: jax.Array, v: jax.Array, aux: Any) -> jax.Array:
        """The call on the same (prepared) arrays, exactly, for predicates that cuDNN cannot serve."""
        ...


def covered_rows(offsets: jax.Array, lengths: jax.Array, size: int) -> jax.Array:
    """``[B, size]`` bool: the tokens inside some segment (``offsets [B, M + 1]``, ``lengths [B, M]``, ``-1``
    for no segment)."""
    starts = offsets[:, :-1]
    used = (lengths > 0) & (starts >= 0)
    rows = jnp.arange(starts.shape[0])[:, None]
    edges = jnp.zeros((starts.shape[0], size + 1), jnp.int32)
    edges = edges.at[rows, jnp.where(used, starts, size)].add(1, mode="drop")
    edges = edges.at[rows, jnp.where(used, jnp.minimum(starts + lengths, size), size)].add(-1, mode="drop")
    return jnp.cumsum(edges[:, :size], axis=1) > 0


def _inside(segments: Segments, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``[B, Tq]`` and ``[B, Tk]`` bool: the query rows and keys inside some segment."""
    q_seqlen, kv_seqlen, q_offsets, kv_offsets = segments
    return covered_rows(q_offsets, q_seqlen, q.shape[1]), covered_rows(kv_offsets, kv_seqlen, k.shape[1])


def _zero_outside(x: jax.Array, inside: jax.Array) -> jax.Array:
    """``x [B, T, H, D]`` with the rows outside ``inside [B, T]`` zero (cuDNN leaves them unwritten)."""
    return jnp.where(inside[:, :, None, None], x, jnp.zeros((), x.dtype))


def _cudnn(plan: Plan, q: jax.Array, k: jax.Array, v: jax.Array, segments: Segments) -> jax.Array:
    """cuDNN's packed attention as it comes: the rows outside every segment unwritten."""
    return _packed_attention(q, k, v, segments, scale=plan.scale, masked=plan.masked,
                             window_length=plan.window_length)


#: The packed attention call: jax's cuDNN function (tests substitute an emulation to run on a CPU).
_packed_attention: Callable[..., jax.Array] = packed_attention


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


def _inference(plan: Plan) -> Callable[..., jax.Array]:
    """cuDNN's forward alone, ``(q, k, v, segments) -> out``; batched (``jax.vmap``) as a loop over the batch:
    jax's own batching rule of its cuDNN call would misread ``[B, M]`` segment arrays."""
    def forward(q: jax.Array, k: jax.Array, v: jax.Array, segments: Segments) -> jax.Array:
        return _zero_outside(_cudnn(plan, q, k, v, segments), _inside(segments, q, k)[0])

    batched: Callable[..., jax.Array] = custom_batching.sequential_vmap(forward)
    return batched


def _training_forward(plan: Plan, layout: dict[str, Any]) -> Callable[..., tuple[jax.Array, tuple[jax.Array, ...]]]:
    """``(q, k, v, segments) -> (out, kept)``: cuDNN's forward (rows outside every segment zeroed) and the
    residuals of its backward other than q, k, v and out (``layout`` receives the pullback's structure and
    where each residual comes from). The backward gets the zeroed output in place of cuDNN's own: it reads
    only the rows inside the segments."""

    def forward(q: jax.Array, k: jax.Array, v: jax.Array,
                segments: Segments) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        out, pullback = jax.vjp(lambda a, b, c: _cudnn(plan, a, b, c, segments), q, k, v)
        leaves, tree = jax.tree.flatten(pullback)
        known = (q, k, v, out)
        slots = tuple(next((i for i, x in enumerate(known) if leaf is x), None) for leaf in leaves)
        layout.update(tree=tree, slots=slots)
        kept = tuple(leaf for leaf, slot in zip(leaves, slots, strict=True) if slot is None)
        return _zero_outside(out, _inside(segments, q, k)[0]), kept

    batched: Callable[..., tuple[jax.Array, tuple[jax.Array, ...]]] = custom_batching.sequential_vmap(forward)
    return batched


def _training_backward(tree: Any, slots: tuple[int | None, ...]) -> Callable[..., tuple[jax.Array, ...]]:
    """``(d_out, q, k, v, out, kept, segments) -> (dq, dk, dv)``: cuDNN's backward from
    :func:`_training_forward`'s residuals, the rows outside every segment zeroed."""

    def backward(d_out: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array,
                 kept: tuple[jax.Array, ...], segments: Segments) -> tuple[jax.Array, ...]:
        known, rest = (q, k, v, out), iter(kept)
        leaves = [next(rest) if slot is None else known[slot] for slot in slots]
        q_inside, kv_inside = _inside(segments, q, k)
        dq, dk, dv = jax.tree.unflatten(tree, leaves)(_zero_outside(d_out, q_inside))
        return _zero_outside(dq, q_inside), _zero_outside(dk, kv_inside), _zero_outside(dv, kv_inside)

    batched: Callable[..., tuple[jax.Array, ...]] = custom_batching.sequential_vmap(backward)
    return batched


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def guarded(plan: Plan, q: jax.Array, k: jax.Array, v: jax.Array, aux: Any, segments: Segments,
            fits: jax.Array | None) -> jax.Array:
    """cuDNN's packed attention where ``fits`` (a traced bool scalar; ``None``: always), else
    ``plan.fallback(q, k, v, aux)``; differentiable in q, k, v (cuDNN's own backward, or the fallback's)."""
    infer = _inference(plan)
    if fits is None:
        return infer(q, k, v, segments)
    out: jax.Array = lax.cond(fits, infer, lambda q, k, v, _: plan.fallback(q, k, v, aux), q, k, v, segments)
    return out


def _guarded_fwd(plan: Plan, q: jax.Array, k: jax.Array, v: jax.Array, aux: Any, segments: Segments,
                 fits: jax.Array | None) -> tuple[jax.Array, tuple[Any, ...]]:
    layout: dict[str, Any] = {}
    forward = _training_forward(plan, layout)
    kept_shapes = jax.eval_shape(forward, q, k, v, segments)[1]

    def slow(q: jax.Array, k: jax.Array, v: jax.Array, _: Segments) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        return plan.fallback(q, k, v, aux), tuple(jnp.zeros(s.shape, s.dtype) for s in kept_shapes)

    if fits is None:
        out, kept = forward(q, k, v, segments)
    else:
        out, kept = lax.cond(fits, forward, slow, q, k, v, segments)
    return out, (q, k, v, aux, fits, out, segments, _Saved(tuple(kept), layout["tree"], layout["slots"]))


def _guarded_bwd(plan: Plan, residuals: tuple[Any, ...], d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, aux, fits, out, segments, saved = residuals
    backward = _training_backward(saved.tree, saved.slots)

    def slow(d_out: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array,
             kept: tuple[jax.Array, ...], segments: Segments) -> tuple[jax.Array, ...]:
        del out, kept, segments
        _, pullback = jax.vjp(lambda a, b, c: plan.fallback(a, b, c, aux), q, k, v)
        return tuple(pullback(d_out))

    if fits is None:
        dq, dk, dv = backward(d_out, q, k, v, out, saved.kept, segments)
    else:
        dq, dk, dv = lax.cond(fits, backward, slow, d_out, q, k, v, out, saved.kept, segments)
    return dq, dk, dv, None, None, None


guarded.defvjp(_guarded_fwd, _guarded_bwd)
