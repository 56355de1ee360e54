"""``flash_attention`` as a FlashAttention-3-style CuTe DSL kernel for Hopper (the core derives
``flash_attention_lse`` from its residuals).

The forward runs the CuTe kernel of :mod:`ejk_cute.kernels.attention` through CUTLASS's JAX bridge
(``cutlass.jax.cutlass_call``); it saves the residuals of every ejk flash attention
(:data:`RESIDUALS`: the inputs, the output and the base-2 log-sum-exp ``[B, Hq, Sq]`` float32,
``+inf`` for rows that see no key), so any installed implementation that declares the same tag
(ejk-triton's ``triton/gpu:flash``, ejk-pallas's GPU kernel) can run the backward. There is no
CuTe backward yet: it is registered forward-only (``ejk.VJP`` without ``bwd``), so the core runs
the first such implementation (in the registry's order) that can run the call, and its gate refuses calls for
which none can (saying what to install: :data:`PAIRING_FIX`).

This module imports neither ``cutlass`` nor a GPU toolkit at import time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.custom_batching
import jax.numpy as jnp

from ejk.config.validators import int_in, one_of
from ejk.ops import FLASH_RESIDUALS, without_residuals
from ejk.tiling import cdiv, persistent_ctas
from ejk_cute import _compile, _device, _status

#: The residual format of :func:`forward_with_residuals` (the same as ejk-triton's and ejk-pallas's).
RESIDUALS = FLASH_RESIDUALS
#: What to install when no backward pairs with a call (ends the core's error and gate reason).
PAIRING_FIX = ("Install ejk-triton (pip install ejk-triton triton jax-triton) or ejk-pallas, or differentiate "
               "through another platform (platform='triton' / 'xla').")
#: Implementation name: ``cute/gpu:fa3``.
NAME = "fa3"
#: Tie-break inside the FAST tier where no ranking pack covers the device: after ejk-pallas's Mosaic
#: GPU kernel, before ejk-triton's.
PRIORITY = 8

HEAD_DIMS = (64, 128)
BLOCK_Q = 128
#: Shared memory one block may opt into on sm_90 (H100 / H200), bytes.
SMEM_LIMIT = _device.HOPPER_SMEM_BYTES
_DTYPES = ("bfloat16", "float16")
_MAX_GRID_YZ = 65535
_LOG2E = math.log2(math.e)

__all__ = [
    "PAIRING_FIX",
    "RESIDUALS",
    "FlashAttentionConfig",
    "capability",
    "config_space",
    "forward",
    "forward_with_residuals",
    "heuristic_config",
    "pack_of",
    "register_flash_attention",
]


def _block_kv(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value % 16 or not 16 <= value <= 256:
        raise ValueError(f"{attribute.name} must be a multiple of 16 in [16, 256] (a wgmma N and TMA box), "
                         f"got {value!r}")


@attrs.frozen(kw_only=True)
class FlashAttentionConfig:
    """Tiles of the CuTe FlashAttention-3 forward.

    Attributes:
        block_q: Query rows per CTA (two consumer warpgroups of 64 rows each): 128.
        block_kv: Keys per pipeline stage (a multiple of 16, at most 256).
        stages: Depth of the K and V TMA pipelines (2 to 4; shared memory permitting).
        pingpong: Alternate the two consumer warpgroups' GEMM issues with named barriers, so one's
            softmax overlaps the other's GEMMs (FlashAttention-3's warpgroup ping-pong).
        persistent: One CTA per SM walks the work items (query tile, head, batch) in a snake
            (``ejk.tiling.persistent_ctas``): the K / V pipelines run on across items and the next
            item's Q lands in a second stage while this one runs. Costs a second Q tile of shared memory.
    """

    block_q: int = attrs.field(default=BLOCK_Q, validator=one_of(BLOCK_Q))
    block_kv: int = attrs.field(default=128, validator=_block_kv)
    stages: int = attrs.field(default=2, validator=int_in(2, 4))
    pingpong: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    persistent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


def smem_bytes(cfg: FlashAttentionConfig, head_dim: int, itemsize: int = 2) -> int:
    """Shared memory of one CTA: the barriers (padded to the tiles' 1 KiB alignment), the Q tile (two
    when persistent) and ``stages`` K and V tiles (each a multiple of 1 KiB)."""
    q_stages = 2 if cfg.persistent else 1
    barriers = 8 * (2 * q_stages + 4 * cfg.stages)
    tiles = (q_stages * cfg.block_q * head_dim + 2 * cfg.stages * cfg.block_kv * head_dim) * itemsize
    return -(-barriers // 1024) * 1024 + tiles


# (block_kv, stages) per head dim, the heuristic's choice first. Every one compiles for sm_90a
# without register spills (ptxas 13.0, soft cap + window + causal, the heaviest variant); 144-key
# tiles get warpgroup fences injected by ptxas (C7519), so they come last. FlashAttention-3's wider
# key tiles (176 at D = 128, 192 at D = 64) spill in this kernel and are left out
# (benchmarks/results/cute_attention_h100.md). Shared memory prunes the rest.
_CANDIDATES: dict[int, tuple[tuple[int, int, bool], ...]] = {
    64: ((128, 3, True), (128, 2, True), (128, 3, False), (128, 2, False), (128, 4, False), (64, 4, False),
         (144, 3, False)),
    128: ((128, 2, True), (128, 2, False), (128, 3, False), (64, 4, False), (64, 3, True), (144, 2, False)),
}


def _head_dim(q: Any) -> int:
    return int(q.shape[3])


def config_space(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> list[FlashAttentionConfig]:
    """Autotuning candidates for ``q``'s head dim whose tiles fit the shared memory, the heuristic's first.

    Args:
        q: ``[B, Sq, Hq, D]`` (anything with ``.shape`` and ``.dtype``).
        k: ``[B, Sk, Hkv, D]``.
        v: ``[B, Sk, Hkv, D]``.
        *_: The op's further arrays (segment ids, bias), unused.
        **__: The op's static arguments, unused.

    Returns:
        The candidates (empty for a head dim the kernel was not built for).
    """
    del k, v
    d = _head_dim(q)
    itemsize = jnp.dtype(q.dtype).itemsize
    configs = [FlashAttentionConfig(block_kv=bn, stages=s, persistent=p) for bn, s, p in _CANDIDATES.get(d, ())]
    return [c for c in configs if smem_bytes(c, d, itemsize) <= _device.smem_capacity()]


def heuristic_config(q: Any, k: Any, v: Any, *rest: Any, **static: Any) -> FlashAttentionConfig:
    """128 query rows x 128 keys on the persistent grid; 2 K/V stages at D = 128 (3 would leave no shared
    memory for the second Q stage), 3 at D = 64. The persistent grid measured faster than one CTA per tile
    (``benchmarks/results/kernel_defaults_h100.md``)."""
    space = config_space(q, k, v, *rest, **static)
    return space[0] if space else FlashAttentionConfig()


# ----------------------------------------------------------------------------------------------
# Capability gate
# ----------------------------------------------------------------------------------------------


def capability(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    bias: Any = None,
) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Runs: bfloat16 or float16 q, k, v, head dim 64 or 128 (the same for v), any
    lengths, GQA / MQA, causal, sliding windows, soft cap, on compute capability 9.0+ with
    nvidia-cutlass-dsl installed. Refused (other implementations take them): float32, other head
    dims, segment ids, a bias, more than 65535 heads or batch rows (grid). TMA needs 16-byte
    strides: every accepted shape has them (a row of q, k, v or out is ``D · 2`` = 128 or 256 bytes),
    so no length is refused for alignment. The same gate serves ``ejk.flash_attention_lse``.

    The registered gate also refuses calls no installed backward pairs with (this forward has no
    backward of its own; the core wraps this gate, see ``ejk.VJP``), so gradients through
    ``platform="auto"`` come from an implementation that has one.
    """
    del causal, softmax_scale, sliding_window, logits_soft_cap  # every mask and scale runs
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    if not dtypes <= set(_DTYPES):
        return f"{', '.join(sorted(dtypes - set(_DTYPES)))} not supported (bfloat16 and float16 only)"
    if len(dtypes) > 1:
        return f"q, k, v must share one dtype (got {', '.join(sorted(dtypes))})"
    d, dv = _head_dim(q), int(v.shape[3])
    if d not in HEAD_DIMS or dv != d:
        built = " and ".join(map(str, HEAD_DIMS))
        return f"head dims q/k {d}, v {dv} not supported (the kernel is built for {built}, the same for q, k and v)"
    if q_segment_ids is not None or kv_segment_ids is not None:
        return "segment ids not supported"
    if bias is not None:
        return "bias not supported"
    if int(q.shape[2]) > _MAX_GRID_YZ or int(q.shape[0]) > _MAX_GRID_YZ:
        return f"q heads {int(q.shape[2])} / batch {int(q.shape[0])} exceed the grid limit {_MAX_GRID_YZ}"
    return _status.runtime_reason()


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _kernel(head_dim: int, block_kv: int, stages: int, pingpong: bool, group: int, scale: float,
            cap: float | None, causal: bool, window: tuple[int, int] | None, ctas: int, pack: int,
            sinks: bool = False) -> Any:
    """One kernel object per static variant (the same object keeps cutlass_call's compile cache warm)."""
    from ejk_cute.kernels.attention import FlashForwardSm90

    return FlashForwardSm90(head_dim=head_dim, block_kv=block_kv, stages=stages, group=group,
                            scale_log2=(scale if cap is None else cap) * _LOG2E,
                            cap_scale=None if cap is None else scale / cap, causal=causal, window=window,
                            pingpong=pingpong, ctas=ctas, pack=pack, sinks=sinks)


def pack_of(q_heads: int, kv_heads: int) -> int:
    """Query heads the kernel packs into the rows of one tile: the GQA group when it divides a
    consumer warpgroup's 64 rows (2, 4, 8, …), else 1 (each tile holds one query head)."""
    group = q_heads // max(kv_heads, 1)
    return group if group > 1 and (BLOCK_Q // 2) % group == 0 else 1


def _tile_blocks(q_len: int, kv_len: int, block_kv: int, causal: bool, window: tuple[int, int] | None,
                 pack: int = 1) -> list[int]:
    """Key blocks each query tile (of ``pack`` heads' rows) loads, in the kernel's item order
    (last-first under a right bound); the host-side twin of ``FlashForwardSm90._block_range``."""
    right_bound = causal or window is not None
    right = 0 if window is None else window[1]
    offset = kv_len - q_len
    rows = q_len * pack
    n_m = cdiv(rows, BLOCK_Q)
    blocks = []
    for index in range(n_m):
        first_row = (n_m - 1 - index if right_bound else index) * BLOCK_Q
        first, last = first_row // pack, (min(first_row + BLOCK_Q, rows) - 1) // pack  # positions
        hi = min(kv_len, last + offset + right + 1) if right_bound else kv_len
        lo = 0 if window is None else max(0, first + offset - window[0])
        blocks.append(cdiv(hi, block_kv) - lo // block_kv if hi > lo else 0)
    return blocks


def _grid_ctas(cfg: FlashAttentionConfig, batch: int, q_len: int, q_heads: int, kv_len: int, causal: bool,
               window: tuple[int, int] | None, pack: int = 1) -> int:
    """The persistent grid's CTA count (0: one CTA per work item)."""
    if not cfg.persistent:
        return 0
    costs = [n + 1 for n in _tile_blocks(q_len, kv_len, cfg.block_kv, causal, window, pack)]  # + Q and epilogue
    return persistent_ctas(_device.sm_count(), len(costs) * (q_heads // pack) * batch, costs)


def _launch(cfg: FlashAttentionConfig, static: dict[str, Any], q: jax.Array, k: jax.Array,
            v: jax.Array, sinks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One ``cutlass_call``: ``(out [B, Sq, Hq, D], lse2 [B, Hq, Sq] float32)``; ``sinks`` ``[B, Hq]``
    float32 (read by the kernel when ``static["sinks"]``)."""
    _compile.import_cutlass()
    from cutlass.jax import TensorSpec

    batch, q_len, q_heads, d = (int(n) for n in q.shape)
    kv_heads = int(k.shape[2])
    window = static["sliding_window"]
    window = None if window is None else (int(window[0]), int(window[1]))
    causal = bool(static["causal"])
    pack = pack_of(q_heads, kv_heads)
    kernel = _kernel(d, cfg.block_kv, cfg.stages, cfg.pingpong, q_heads // kv_heads,
                     float(static["softmax_scale"]), static["logits_soft_cap"], causal, window,
                     _grid_ctas(cfg, batch, q_len, q_heads, int(k.shape[1]), causal, window, pack), pack,
                     bool(static.get("sinks", False)))
    kv_modes = TensorSpec(mode=(1, 3, 2, 0))  # [B, S, H, D] -> (S, D, H, B)
    v_modes = TensorSpec(mode=(3, 1, 2, 0))  # v -> (D, S, H, B): N-major B operand
    lse_shape: tuple[int, ...]
    if pack == 1:
        qo_modes, lse_modes, lse_shape = kv_modes, TensorSpec(mode=(2, 1, 0)), (batch, q_heads, q_len)
    else:  # q / out [B, S, Hkv, pack, D] -> (pack, S, D, Hkv, B); lse [B, Hkv, pack, S] -> (pack, S, Hkv, B)
        q = q.reshape(batch, q_len, kv_heads, pack, d)
        qo_modes, lse_modes, lse_shape = (TensorSpec(mode=(3, 1, 4, 2, 0)), TensorSpec(mode=(2, 3, 1, 0)),
                                          (batch, kv_heads, pack, q_len))
    call = _compile.cutlass_call(
        kernel,
        outputs=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(lse_shape, jnp.float32)),
        input_spec=(qo_modes, kv_modes, v_modes, TensorSpec(mode=(1, 0))),  # sinks [B, Hq] -> (Hq, B)
        output_spec=(qo_modes, lse_modes),
    )
    out, lse = call(q, k, v, sinks)
    return out.reshape(batch, q_len, q_heads, d), lse.reshape(batch, q_heads, q_len)


def _fold_vmap(fn: Callable[..., tuple[jax.Array, jax.Array]]) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """``fn(q, k, v)`` with a vmap rule that folds the mapped axis into the batch (one launch).

    ``cutlass_call`` has no batching rule; unmapped operands are broadcast along the mapped axis.
    """
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def rule(axis_size: int, in_batched: Any, *args: jax.Array) -> tuple[tuple[jax.Array, ...], tuple[bool, ...]]:
        full = [x if mapped else jnp.broadcast_to(x, (axis_size, *x.shape))
                for x, mapped in zip(args, in_batched, strict=True)]
        batch = full[0].shape[1]
        outs = wrapped(*(x.reshape(axis_size * batch, *x.shape[2:]) for x in full))
        return tuple(o.reshape(axis_size, batch, *o.shape[1:]) for o in outs), (True, True)

    return wrapped


def _static(causal: bool, softmax_scale: float | None, sliding_window: tuple[int, int] | None,
            logits_soft_cap: float | None) -> dict[str, Any]:
    return dict(causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
                logits_soft_cap=logits_soft_cap)


def _refuse_unsupported(q_segment_ids: Any, kv_segment_ids: Any, bias: Any) -> None:
    if q_segment_ids is not None or kv_segment_ids is not None or bias is not None:
        raise ValueError("cute/gpu:fa3 takes no segment ids or bias (its capability gate refuses them); "
                         "use platform='auto' or another implementation")


def forward_with_residuals(
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
    sinks: jax.Array | None = None,
    cfg: FlashAttentionConfig | None = None,
) -> tuple[jax.Array, tuple[Any, ...]]:
    """The output and the residuals any backward of :data:`RESIDUALS` consumes.

    Arguments are those of ``ejk.flash_attention`` after the op layer's normalisation. ``sinks``
    ``[Hq]`` join each row's denominator in the kernel's epilogue.

    Returns:
        ``(out, residuals)``: ``out`` ``[B, Sq, Hq, D]`` in ``q.dtype``; ``residuals`` =
        ``(q, k, v, None, None, None, out, lse)`` with ``lse`` the base-2 log-sum-exp
        ``[B, Hq, Sq]`` float32 (``+inf`` for rows that see no key), the sinks appended when given
        (the lse then includes them).
    """
    _refuse_unsupported(q_segment_ids, kv_segment_ids, bias)
    batch, q_len, q_heads, _ = q.shape
    if min(batch, q_len, q_heads, k.shape[1]) == 0:  # nothing to launch: every row sees no key
        out = jnp.zeros(q.shape[:3] + v.shape[3:], q.dtype)
        lse = jnp.full((batch, q_heads, q_len), jnp.inf, jnp.float32)
    else:
        cfg = heuristic_config(q, k, v) if cfg is None else cfg
        static = _static(causal, softmax_scale, sliding_window, logits_soft_cap)
        static["sinks"] = sinks is not None  # the kernel adds them in its epilogue
        rows = jnp.zeros((batch, q_heads), jnp.float32) if sinks is None else jnp.broadcast_to(
            sinks.astype(jnp.float32), (batch, q_heads))
        out, lse = _fold_vmap(functools.partial(_launch, cfg, static))(q, k, v, rows)
    return out, (q, k, v, None, None, None, out, lse, *(() if sinks is None else (sinks,)))


forward = without_residuals(forward_with_residuals)


# ----------------------------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------------------------


def register_flash_attention(register: Callable[..., Callable[[Any], Any]]) -> None:
    """Register ``cute/gpu:fa3`` for ``flash_attention`` (from ``ejk_register_kernels``); its residuals
    hold the lse, so it provides ``flash_attention_lse`` too (the core derives it).

    Forward-only: the VJP names no ``bwd``, so the core runs another implementation's backward of
    the same residuals and refuses (in the registered gate) calls for which none pairs.
    """
    import ejk

    common = dict(priority=PRIORITY, name=NAME, cfg_type=FlashAttentionConfig, config_space=config_space,
                  heuristic=heuristic_config, capability=capability)
    register("flash_attention", ejk.Platform.CUTE, ejk.Backend.GPU, **common,
             vjp=ejk.VJP(fwd=forward_with_residuals, residuals=RESIDUALS, fix=PAIRING_FIX))(forward)
