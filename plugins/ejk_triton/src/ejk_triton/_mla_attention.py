"""Latent (MLA) paged attention as a Triton kernel: decode and multi-token prediction with split-KV.

One program per (sequence, block of query heads, split of the keys); see ``_mla_kernels``. The
``Sq`` tokens and ``block_h`` heads of a sequence are the rows of its ``tl.dot``, and every step
loads ``block_kv`` latent positions once for all of them: the latent head is shared, so with all
``Hq`` heads in one block (up to 64 rows, the heuristic's choice) the cache is read exactly once,
``Σ kv_len · Dk · itemsize`` bytes, the floor for this op. The value tile is the first ``Dv``
dims of the key tile, already loaded: values cost no second read.

Split-KV: the keys of a sequence are cut into ``num_splits`` ranges of whole blocks, one program
each, so a batch of a few long contexts still fills the GPU; each split writes float32 partials
with its base-2 running max and sum, and a small JAX computation merges them (log-sum-exp weights).
The heuristic picks the fewest splits that fill the GPU's resident slots in whole waves from the
batch, the head blocks, the longest context the page table allows and the SM count.

Not differentiable (serving-time attention): registered without a VJP, like ejk-xla's.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.ops import paged_merge_splits
from ejk.plugin import cdiv as _cdiv
from ejk.plugin import int_in, one_of, power_of_two
from ejk.plugin import next_pow2 as _next_pow2
from ejk.plugin import padded_dim as _padded
from ejk_triton import _env
from ejk_triton._device import compute_capability_reason as _compute_capability_reason
from ejk_triton._device import sm_count as _sm_count
from ejk_triton._device import smem_limit as _smem_limit
from ejk_triton._launch import launch, sequential_vmap

__all__ = ["MlaAttentionConfig", "capability", "config_space", "heuristic_config", "mla_paged_attention"]

_DTYPES = ("bfloat16", "float16", "float32")
_MAX_DV = 512  # value dims (padded to a power of two); float32: 256
_MAX_DR = 128  # key dims past the values (the rotary part); float32: 64
_MAX_ROWS = 128  # query rows per program (Sq tokens x block_h heads, padded)
_TARGET_ROWS = 64  # rows a program aims for (FlashMLA's 64-head tiles)
_MAX_GRID_YZ = 65535
_MAX_SPLITS = 64
_SM_SMEM = 228 * 1024  # shared memory per SM on Hopper
_SM_REGS = 65536
_MAX_CTAS_PER_SM = 4
_MIN_STEPS_PER_SPLIT = 4  # a split gets at least this many blocks of keys
_WAVE_EFFICIENCY = 0.85  # fewest splits whose last wave is at least this full


@attrs.frozen(kw_only=True)
class MlaAttentionConfig:
    """Tiles and launch parameters of the Triton latent paged attention.

    Attributes:
        block_h: Query heads per program; with the ``Sq`` tokens they make ``Sq · block_h`` rows
            (padded to a power of two ``>= 16``, at most 128). ``block_h >= Hq`` puts every head in
            one program, which reads each page once.
        block_kv: Latent positions per loop step (any page size).
        num_splits: Programs that share one sequence's keys (split-KV), merged afterwards.
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the key loop.
    """

    block_h: int = attrs.field(default=16, validator=power_of_two(1))
    block_kv: int = attrs.field(default=64, validator=power_of_two(16))
    num_splits: int = attrs.field(default=1, validator=int_in(1, _MAX_SPLITS))
    num_warps: int = attrs.field(default=8, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=2, validator=int_in(1, 8))


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def _block_m(block_h: int, sq: int) -> int:
    return max(16, _next_pow2(block_h * sq))


def _dims(q: Any, v_head_dim: int) -> tuple[int, int, int, int]:
    """``(Dv, Dv padded, Dr, Dr padded)``, ``Dr = Dk - Dv`` the key dims past the values (padded to 16
    when there are none: the kernel then never loads them)."""
    dr = int(q.shape[3]) - v_head_dim
    return v_head_dim, _padded(v_head_dim), dr, _padded(dr)


def kernel_args(q: Any, kv_pages: Any, page_indices: Any, *, v_head_dim: int, scale: float, causal: bool,
                cfg: MlaAttentionConfig) -> dict[str, Any]:
    """The kernel's ``constexpr`` arguments for one call (abstract arrays suffice)."""
    batch, sq, hq, _ = (int(n) for n in q.shape)
    num_pages, page, _ = (int(n) for n in kv_pages.shape)
    dv, dv_pad, dr, dr_pad = _dims(q, v_head_dim)
    block_h = min(cfg.block_h, _next_pow2(hq))
    return dict(
        SCALE=scale, SQ=sq, HQ=hq, DK=dv + dr, DV=dv, DV_PAD=dv_pad, DR=dr, DR_PAD=dr_pad, NUM_PAGES=num_pages,
        PAGE=page, PAGES_PER_SEQ=int(page_indices.shape[1]), CAUSAL=causal,
        DOT_PREC="ieee" if jnp.dtype(q.dtype) == jnp.float32 else "tf32",  # 16-bit operands ignore it
        BLOCK_H=block_h, BLOCK_M=_block_m(block_h, sq), BLOCK_N=cfg.block_kv, NUM_SPLITS=cfg.num_splits,
        ROWS=batch * sq * hq,
    )


def _launch(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *, v_head_dim: int,
            scale: float, causal: bool, cfg: MlaAttentionConfig) -> jax.Array:
    batch, sq, hq, _ = q.shape
    consts = kernel_args(q, kv_pages, page_indices, v_head_dim=v_head_dim, scale=scale, causal=causal, cfg=cfg)
    splits, rows, dv = cfg.num_splits, consts["ROWS"], v_head_dim
    sds = jax.ShapeDtypeStruct
    unused = sds((1,), jnp.float32)
    if splits == 1:
        out_shapes = (sds((batch, sq, hq, dv), q.dtype), unused, unused, unused)
    else:
        out_shapes = (sds((1,), q.dtype), sds((splits, rows, dv), jnp.float32), sds((splits, rows), jnp.float32),
                      sds((splits, rows), jnp.float32))
    result = launch(
        _kernels().mla_kernel, grid=(_cdiv(hq, consts["BLOCK_H"]), batch, splits),
        inputs=(q, kv_pages, kv_lens.astype(jnp.int32), page_indices.astype(jnp.int32)), out_shapes=out_shapes,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **consts,
    )
    if splits == 1:
        return result[0]
    merged = paged_merge_splits(result[1], result[2], result[3])
    return merged.reshape(batch, sq, hq, dv).astype(q.dtype)


def _kernels() -> Any:
    _env.import_triton()
    from ejk_triton import _mla_kernels

    return _mla_kernels


def mla_paged_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *,
                        v_head_dim: int, softmax_scale: float, causal: bool,
                        cfg: MlaAttentionConfig | None = None) -> jax.Array:
    """Latent attention over a paged cache (see ``docs/KERNEL_CONTRACT.md``); arguments arrive validated.

    Args:
        q: ``[B, Sq, Hq, Dk]``.
        kv_pages: ``[P, page, Dk]``.
        kv_lens: ``[B]`` int32.
        page_indices: ``[B, pages_per_seq]`` int32.
        v_head_dim: Value dims (the first ones of each position).
        softmax_scale: Logit scale (already resolved).
        causal: Query ``i`` sees keys ``j <= kv_len - Sq + i``.
        cfg: The config; ``None`` means :func:`heuristic_config` for these shapes.

    Returns:
        ``[B, Sq, Hq, v_head_dim]`` in ``q.dtype``; rows that see no key are zeros.
    """
    batch, sq, hq, _ = q.shape
    if min(batch, sq, hq, int(page_indices.shape[1])) == 0:
        return jnp.zeros((batch, sq, hq, v_head_dim), q.dtype)
    if cfg is None:
        cfg = heuristic_config(q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim)
    run = functools.partial(_launch, v_head_dim=int(v_head_dim), scale=float(softmax_scale), causal=bool(causal),
                            cfg=cfg)
    (out,) = sequential_vmap(lambda *arrays: (run(*arrays),))(q, kv_pages, kv_lens, page_indices)
    return out


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, *, v_head_dim: int,
               **_: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: bfloat16 / float16 q and kv_pages of one dtype with up to 512 value dims and up to 128
    key dims past them (DeepSeek's 512 + 64), float32 up to 256 and 64; up to 128 query tokens per
    sequence and 65535 sequences. Needs an NVIDIA GPU (compute capability 8.0+), except in the interpreter mode
    (``EJK_TRITON_INTERPRET=1``).
    """
    del kv_lens, page_indices
    dtypes = {jnp.dtype(x.dtype).name for x in (q, kv_pages)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16, float16 and float32 only)"
    if len(dtypes) > 1:
        return f"q and kv_pages must share one dtype (got {', '.join(sorted(dtypes))})"
    f32 = "float32" in dtypes
    dv, _dv_pad, dr, _dr_pad = _dims(q, v_head_dim)
    max_dv, max_dr = (_MAX_DV // 2, _MAX_DR // 2) if f32 else (_MAX_DV, _MAX_DR)
    where = " in float32" if f32 else ""
    if dv > max_dv:
        return f"v_head_dim {dv} not supported{where} (at most {max_dv})"
    if dr > max_dr:
        return f"{dr} key dims past v_head_dim not supported{where} (at most {max_dr})"
    if int(q.shape[1]) > _MAX_ROWS:
        return f"{int(q.shape[1])} query tokens per sequence not supported (at most {_MAX_ROWS})"
    if int(q.shape[0]) > _MAX_GRID_YZ:
        return f"batch {int(q.shape[0])} exceeds the grid limit {_MAX_GRID_YZ}"
    if _env.interpret_mode():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    return _compute_capability_reason()


def smem_bytes(cfg: MlaAttentionConfig, q: Any, v_head_dim: int) -> int:
    """Shared memory estimate (bytes), as triton 3.6 allocates for sm_90 (checked on DeepSeek's dims).

    From 64 rows in 16 bits (warpgroup MMAs): ``num_stages`` buffers of latents and the query tile,
    the probabilities staying in registers. Otherwise: ``num_stages - 1`` buffers, the query tile
    and the probabilities.
    """
    itemsize = jnp.dtype(q.dtype).itemsize
    _, dv_pad, dr, dr_pad = _dims(q, v_head_dim)
    rows = _block_m(min(cfg.block_h, _next_pow2(int(q.shape[2]))), int(q.shape[1]))
    width = dv_pad + (dr_pad if dr else 0)
    if rows >= 64 and itemsize == 2:
        return int((cfg.num_stages * cfg.block_kv + rows) * width * itemsize)
    return int((max(1, cfg.num_stages - 1) * cfg.block_kv * width + rows * (width + cfg.block_kv)) * itemsize)


def _regs_per_thread(cfg: MlaAttentionConfig, q: Any, v_head_dim: int) -> int:
    """A rough register count: the float32 accumulator and logits spread over the threads, plus 64."""
    rows = _block_m(min(cfg.block_h, _next_pow2(int(q.shape[2]))), int(q.shape[1]))
    threads = cfg.num_warps * 32
    return min(255, 64 + rows * (_dims(q, v_head_dim)[1] + cfg.block_kv) // threads)


def _splits(cfg: MlaAttentionConfig, q: Any, kv_pages: Any, page_indices: Any, v_head_dim: int) -> int:
    """The fewest splits that fill the GPU's resident slots in whole waves (the last one at least 85%
    full), each split keeping at least 4 key steps of the longest context the table allows; else
    the split count with the fullest waves. Slots = SMs x programs per SM (from shared memory and
    registers, at most 4)."""
    programs = int(q.shape[0]) * _cdiv(int(q.shape[2]), min(cfg.block_h, _next_pow2(int(q.shape[2]))))
    by_smem = _SM_SMEM // max(smem_bytes(cfg, q, v_head_dim) + 1024, 1)
    by_regs = _SM_REGS // (cfg.num_warps * 32 * _regs_per_thread(cfg, q, v_head_dim))
    slots = _sm_count() * max(1, min(_MAX_CTAS_PER_SM, by_smem, by_regs))
    capacity = int(page_indices.shape[1]) * int(kv_pages.shape[1])
    most = max(1, min(_MAX_SPLITS, capacity // (_MIN_STEPS_PER_SPLIT * cfg.block_kv)))

    def fill(z: int) -> float:
        total = programs * z
        return total / (_cdiv(total, slots) * slots)

    for z in range(1, most + 1):
        if fill(z) >= _WAVE_EFFICIENCY:
            return z
    return max(range(1, most + 1), key=fill)


def _base_config(q: Any, kv_pages: Any, v_head_dim: int) -> MlaAttentionConfig:
    sq, hq = int(q.shape[1]), int(q.shape[2])
    f32 = jnp.dtype(q.dtype) == jnp.float32
    block_h = max(1, min(_next_pow2(hq), _TARGET_ROWS // _next_pow2(sq)))
    rows = _block_m(block_h, sq)
    dv_pad = _dims(q, v_head_dim)[1]
    warps = 8 if rows * dv_pad >= 64 * 256 else 4
    return MlaAttentionConfig(block_h=block_h, block_kv=32 if f32 else 64, num_warps=warps, num_stages=2)


def _fits(cfg: MlaAttentionConfig, q: Any, v_head_dim: int) -> bool:
    return smem_bytes(cfg, q, v_head_dim) <= _smem_limit()


def heuristic_config(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, *, v_head_dim: int,
                     **_: Any) -> MlaAttentionConfig:
    """All heads of a sequence in one program up to 64 rows (``Sq · block_h``), else blocks of 64 rows.

    64 positions per step (32 in float32), 2 stages (fewer positions when shared memory is short),
    8 warps from 64 rows x 256 value dims (else 4), split-KV by :func:`_splits` (DeepSeek-V3 decode,
    Hq 16 at batch 64 on an H100: 4 splits). In the interpreter mode (CPU), 16 positions per step
    and at most 2 splits keep the Python-level work small.

    Args:
        q, kv_pages, kv_lens, page_indices: The operation's arrays (anything with ``.shape`` and ``.dtype``).
        v_head_dim: Value dims.
    """
    del kv_lens
    cfg = _base_config(q, kv_pages, v_head_dim)
    if _env.interpreting_on_cpu():
        capacity = int(page_indices.shape[1]) * int(kv_pages.shape[1])
        return attrs.evolve(cfg, block_kv=16, num_splits=2 if capacity > 32 else 1)
    while not _fits(cfg, q, v_head_dim) and (cfg.block_kv > 16 or cfg.num_stages > 1):
        cfg = (attrs.evolve(cfg, block_kv=cfg.block_kv // 2) if cfg.block_kv > 16
               else attrs.evolve(cfg, num_stages=cfg.num_stages - 1))
    return attrs.evolve(cfg, num_splits=_splits(cfg, q, kv_pages, page_indices, v_head_dim))


def config_space(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, *, v_head_dim: int,
                 **_: Any) -> list[MlaAttentionConfig]:
    """Autotuning candidates around the heuristic's config, pruned by a shared-memory estimate.

    Varies positions per step (16, 32, 64), stages (1-3), warps (4, 8), heads per program (half
    and double, at most 128 rows) and split-KV (the heuristic's, halved, doubled, and 1). The
    heuristic's config comes first.

    Args: as for :func:`heuristic_config`.

    Returns:
        At most 16 distinct configs.
    """
    base = heuristic_config(q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim)
    evolve = attrs.evolve
    if _env.interpreting_on_cpu():
        return [base, evolve(base, block_kv=32, num_splits=1)]
    candidates = [base]
    for block_kv in (16, 32, 64):
        for stages in (1, 2, 3):
            candidates.append(evolve(base, block_kv=block_kv, num_stages=stages))
    candidates.append(evolve(base, num_warps=8 if base.num_warps == 4 else 4))
    sq, hq = int(q.shape[1]), int(q.shape[2])
    for block_h in (base.block_h // 2, base.block_h * 2):
        if 1 <= block_h <= _next_pow2(hq) and _block_m(block_h, sq) <= _MAX_ROWS:
            candidates.append(evolve(base, block_h=block_h))
    for splits in (1, max(1, base.num_splits // 2), min(_MAX_SPLITS, base.num_splits * 2)):
        candidates.append(evolve(base, num_splits=splits))
    fitting = [c for c in dict.fromkeys(candidates) if c is base or _fits(c, q, v_head_dim)]
    return fitting[:16]
