"""Flash attention through XLA's fused cuDNN attention (``jax.nn.dot_product_attention``, cudnn).

cuDNN's fused kernel is the fastest attention JAX ships on NVIDIA GPUs, but it runs only a
subset of ejk's contract. :func:`capability` states that subset exactly (checked against
jax 0.11.2 on an H100 against what cuDNN runs, recorded in
benchmarks/results/cudnn_gate_h100.md); every call
outside it goes to the other implementations:

- dtypes: bfloat16 and float16 (not float32);
- head dims: a multiple of 8, at most 256 on Hopper and newer (128 before); jax's cuDNN call takes
  one head dim, so ``Dv != D`` (DeepSeek's 192 / 128) runs with the narrower side zero-padded to the
  wider one (zeros add nothing to the logits or the output; the output is sliced back to ``Dv``);
- causal and sliding windows only when ``Sq == Sk``: jax's causal mask is top-left aligned,
  ejk's is bottom-right aligned, and the two agree only for equal lengths; windows only
  with an effective right reach of 0 (causal, or ``(left, 0)``), as cuDNN has no right window;
- no logits soft cap;
- segment ids only with ``Sq == Sk``, no bias and a GPU of compute capability 9.0 or newer: they
  run on cuDNN's packed segments where each row's ids are runs of distinct ids equal for queries
  and keys (packed training), checked in the graph, else on ejk-xla's chunked kernel
  (:mod:`ejk_xla._cudnn_segments`); their softmax statistics (``[B * min(S, 32), Hq, S]``
  float32) at most 1 GiB;
- bias of shape ``[1 | B, 1 | Hq, Sq, Sk]`` (no broadcasting over a sequence axis);
- even ``Sq`` and ``Sk``, none empty: jax 0.11.2's cuDNN backward rejects odd lengths ("Unsupported
  sequence length Q 255, KV 255"), and the gate cannot know whether a gradient will be taken.

Within the subset no query row is fully masked on cuDNN (``Sq == Sk`` with a causal or left window
always keeps the diagonal; segment ids reach cuDNN only as runs shared by queries and keys), so
the contract's "rows that see no key are zeros" holds.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["capability", "cudnn_arguments", "cudnn_attention", "device_problem", "shape_problem"]

_DTYPES = ("bfloat16", "float16")


def device_problem() -> str | None:
    """Why this process cannot run cuDNN attention (``None`` when its first device can).

    Needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere, Hopper, Blackwell).
    """
    device = jax.devices()[0]
    if device.platform != "gpu" or "cuda" not in getattr(device.client, "platform_version", "").lower():
        return "needs an NVIDIA GPU (cuDNN)"
    capability = getattr(device, "compute_capability", None)
    if capability is None:
        return "the GPU reports no compute capability"
    if float(capability) < 8.0:
        return f"needs compute capability 8.0 or newer, this GPU has {capability}"
    return None


def _max_head_dim() -> int:
    capability = getattr(jax.devices()[0], "compute_capability", "0")
    return 256 if float(capability or 0) >= 9.0 else 128


def shape_problem(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    q_segment_ids: Any,
    kv_segment_ids: Any,
    bias: Any,
    max_head_dim: int = 256,
    **_: Any,
) -> str | None:
    """The device-independent part of :func:`capability` (testable on any machine)."""
    dtype = np.dtype(q.dtype).name
    if dtype not in _DTYPES:
        return f"{dtype} not supported (cuDNN attention takes bfloat16 or float16)"
    batch, q_len, _, head_dim = q.shape
    kv_len, v_dim = k.shape[1], v.shape[3]
    if min(batch, q_len, kv_len, q.shape[2], head_dim) == 0:
        return "empty arrays"
    for name, dim in (("head_dim", head_dim), ("v head dim", v_dim)):
        if dim % 8 or dim > max_head_dim:
            return f"{name} {dim} not supported (a multiple of 8, at most {max_head_dim})"
    if q_len % 2 or kv_len % 2:
        return f"odd length Sq={q_len} or Sk={kv_len} (cuDNN's backward needs even lengths)"
    if logits_soft_cap is not None:
        return "soft cap not supported"
    if q_segment_ids is not None:
        problem = _segments_problem(q, k, bias)
        if problem is not None:
            return problem
    if (causal or sliding_window is not None) and q_len != kv_len:
        return (f"causal or windowed attention with Sq={q_len} != Sk={kv_len} (jax's cuDNN causal mask is "
                "top-left aligned, ejk's bottom-right)")
    if sliding_window is not None and not causal and sliding_window[1] != 0:
        return f"sliding window {tuple(sliding_window)} has a right reach (cuDNN supports only (left, 0))"
    if bias is not None:
        bq, bk = bias.shape[2:]
        if (bq, bk) != (q_len, kv_len):
            return f"bias of shape {tuple(bias.shape)} broadcasts over a sequence axis (cuDNN needs [.., Sq, Sk])"
    return None


def _segments_problem(q: Any, k: Any, bias: Any) -> str | None:
    from ejk_xla import _cudnn_packed, _cudnn_segments

    if bias is not None:
        return "segment ids with a bias not supported"
    batch, seq_len, heads, _ = q.shape
    if k.shape[1] != seq_len:
        return f"segment ids with Sq={seq_len} != Sk={k.shape[1]} (cuDNN's segments are runs shared by both)"
    slots = _cudnn_segments.segment_slots(seq_len)
    stats = _cudnn_packed.stats_bytes(batch, slots, heads, seq_len)
    if stats > _MAX_STATS_BYTES:
        return (f"segment ids: cuDNN's softmax statistics ([{batch * slots}, {heads}, {seq_len}] float32, "
                f"{stats / 2**30:.1f} GiB) exceed {_MAX_STATS_BYTES / 2**30:.0f} GiB")
    return None


#: The largest softmax statistics a segment-id call lets jax allocate (``[B * M, Hq, S]`` float32).
_MAX_STATS_BYTES = 1 << 30


def capability(q: Any, k: Any, v: Any, **call: Any) -> str | None:
    """Why cuDNN attention cannot run this call here, or ``None`` when it can (see the module doc)."""
    problem = device_problem()
    if problem is None and call.get("q_segment_ids") is not None:
        from ejk_xla import _cudnn_packed

        problem = _cudnn_packed.device_problem()
    if problem is not None:
        return problem
    return shape_problem(q, k, v, max_head_dim=_max_head_dim(), **call)


def cudnn_arguments(
    *, causal: bool, softmax_scale: float, sliding_window: tuple[int, int] | None
) -> dict[str, Any]:
    """The ``jax.nn.dot_product_attention`` keyword arguments for an (already gated) call."""
    window = None
    if sliding_window is not None:
        window = (int(sliding_window[0]), 0)  # gated: causal, or a right reach of 0
    return {
        "scale": float(softmax_scale),
        "is_causal": bool(causal or sliding_window is not None),
        "local_window_size": window,
        "implementation": "cudnn",
    }


def cudnn_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    q_segment_ids: jax.Array | None,
    kv_segment_ids: jax.Array | None,
    bias: jax.Array | None,
    cfg: None = None,
) -> jax.Array:
    """Fused cuDNN attention for calls :func:`capability` accepts (arguments already normalised).

    cuDNN differentiates itself (its own fused backward); it takes no config.
    """
    del logits_soft_cap, cfg  # gated out
    v_dim = int(v.shape[3])
    if v_dim != q.shape[3]:  # one head dim for cuDNN: zeros pad the narrower side (autodiff slices them off)
        width = max(v_dim, int(q.shape[3]))
        q, k, v = (_pad_head_dim(x, width) for x in (q, k, v))
        padded = cudnn_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
                                 logits_soft_cap=None, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                 bias=bias)
        return padded[..., :v_dim]
    if q_segment_ids is not None and kv_segment_ids is not None:
        from ejk_xla import _cudnn_segments

        return _cudnn_segments.segment_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=causal,
                                                 softmax_scale=softmax_scale, sliding_window=sliding_window)
    if bias is not None:
        bias = bias.astype(q.dtype)
    kwargs = cudnn_arguments(causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window)
    out: jax.Array = jax.nn.dot_product_attention(q, k, v, bias=bias, **kwargs)
    return out.astype(jnp.dtype(q.dtype))


def _pad_head_dim(x: jax.Array, width: int) -> jax.Array:
    """``x`` ``[B, S, H, d]`` with zeros appended to its last axis up to ``width``."""
    extra = width - int(x.shape[3])
    return x if extra == 0 else jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra)))
