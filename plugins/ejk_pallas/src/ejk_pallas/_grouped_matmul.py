"""``grouped_matmul`` (mixture of experts) as Pallas kernels for NVIDIA GPUs (Triton lowering).

Rows of ``lhs`` form consecutive groups; group ``i`` is multiplied by ``rhs[i]``. A metadata
pass on the device (``_group_metadata``) turns ``group_sizes`` into a work list of (group, row
tile) items; nothing of size ``[g, m, n]`` is built.

- forward: grid ``(column tile, work item)`` (the column tiles of one row tile run together, so
  its rows are read from HBM once); each program multiplies one aligned row tile by its group's
  ``rhs`` tile (``block_k`` steps, float32 accumulation) and stores only its group's rows (a
  masked store: a tile straddling a boundary is completed by the neighbouring group's item).
  Empty groups have no item; rows past ``sum(group_sizes)`` are a pseudo-group whose items
  store zeros; programs past the list's length return at once;
- ``d lhs = d out @ rhs[group]ᵀ``: the same kernel, ``rhs`` read transposed in place;
- ``d rhs[i] = lhs_iᵀ @ d out_i``: grid ``(n tile, k tile, group)``, each program reducing over
  its group's row tiles (rows of other groups masked to zero); an empty group writes zeros.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import (
    GROUPED_MATMUL_RESIDUALS,
    cdiv,
    devices,
    fit_block,
    int_in,
    one_of,
    operand_vjp,
    power_of_two,
)
from ejk_pallas import _env, _mm
from ejk_pallas._flash_attention import pl
from ejk_pallas._flash_attention_tpu import _when
from ejk_pallas._group_metadata import offsets, work_list
from ejk_pallas._matmul import fitting

__all__ = ["GroupedMatmulConfig", "capability", "config_space", "forward", "gradients", "heuristic_config", "vjp"]

_block = power_of_two(16)
_MAX_GRID_Y = 65535  # CUDA's limit on the second grid dim (the work list)


@attrs.frozen(kw_only=True)
class GroupedMatmulConfig:
    """Tiles of the Pallas (Triton-lowered) grouped matmul; blocks clamp to the problem (>= 16).

    The forward and ``d lhs`` programs compute ``[block_m, block_n]`` tiles in ``block_k`` steps;
    the ``d rhs`` programs compute ``[block_m, block_n]`` tiles of ``d rhs[i]`` (``k`` by ``n``),
    reducing over the group's rows ``block_k`` at a time.

    Attributes:
        block_m: Rows per output tile.
        block_n: Columns per output tile.
        block_k: Contraction step.
        group_m: Unused by the grouped kernels' order (kept for the shared tile tables).
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the contraction loop.
    """

    block_m: int = attrs.field(default=128, validator=_block)
    block_n: int = attrs.field(default=128, validator=_block)
    block_k: int = attrs.field(default=64, validator=_block)
    group_m: int = attrs.field(default=1, validator=int_in(1, 64))
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=3, validator=int_in(1, 8))


def _full(x: Any) -> Any:
    """A block spec for the whole array (read with dynamic offsets inside the kernel)."""
    return pl().BlockSpec(tuple(x.shape), lambda *_: (0,) * len(x.shape))


def _params(cfg: GroupedMatmulConfig) -> Any:
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _gmm_kernel(grp_ref: Any, tile_ref: Any, off_ref: Any, cnt_ref: Any, x_ref: Any, w_ref: Any, o_ref: Any, *,
                groups: int, bm: int, bn: int, bk: int, steps: int, tb: bool, precision: Any) -> None:
    p = pl()
    j, w = p.program_id(0), p.program_id(1)

    @_when(w < cnt_ref[0])
    def _run() -> None:
        from jax.experimental.pallas import triton as plgpu

        g = grp_ref[w]
        row0 = p.multiple_of(tile_ref[w] * bm, bm)
        col0 = p.multiple_of(j * bn, bn)
        rows = row0 + jnp.arange(bm, dtype=jnp.int32)
        keep = (rows >= off_ref[g]) & (rows < off_ref[g + 1])
        gw = jnp.minimum(g, groups - 1)

        def body(i: Any, acc: Any) -> Any:
            k0 = p.multiple_of(i * bk, bk)
            x = x_ref[p.ds(row0, bm), p.ds(k0, bk)]
            if tb:
                y = w_ref[gw, p.ds(col0, bn), p.ds(k0, bk)]
                return acc + _mm.dot(x, y, (((1,), (1,)), ((), ())), precision, gpu=True)
            y = w_ref[gw, p.ds(k0, bk), p.ds(col0, bn)]
            return acc + _mm.dot(x, y, (((1,), (0,)), ((), ())), precision, gpu=True)

        out = o_ref.at[p.ds(row0, bm), p.ds(col0, bn)]
        mask = jnp.broadcast_to(keep[:, None], (bm, bn))

        # A static trip count: Triton's verifier rejected the loop whose bound depended on the group
        # (H100, jax 0.11.2); tiles past the last group (g == groups) store zeros instead.
        @_when(g < groups)
        def _product() -> None:
            acc = lax.fori_loop(0, steps, body, jnp.zeros((bm, bn), jnp.float32))
            plgpu.store(out, acc.astype(o_ref.dtype), mask=mask)

        @_when(g >= groups)
        def _zeros() -> None:
            plgpu.store(out, jnp.zeros((bm, bn), o_ref.dtype), mask=mask)


def _grouped_product(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, tb: bool, out_dtype: Any,
                     precision: Any, cfg: GroupedMatmulConfig) -> jax.Array:
    """``out[r] = x[r] @ w[group(r)]`` (``ᵀ`` with ``tb``); ``x [m, k]``, ``w [g, k, n]`` (``[g, n, k]``)."""
    m, k = x.shape
    groups = w.shape[0]
    n = w.shape[1] if tb else w.shape[2]
    if m * n == 0 or groups == 0 or k == 0:
        return jnp.zeros((m, n), out_dtype)
    dtype = _mm.common_dtype(x, w)
    bm, bn, bk = fit_block(cfg.block_m, m), fit_block(cfg.block_n, n), fit_block(cfg.block_k, k)
    mp, np_, kp = cdiv(m, bm) * bm, cdiv(n, bn) * bn, cdiv(k, bk) * bk
    x = _mm.pad_to(x.astype(dtype), (mp, kp))
    w = _mm.pad_to(w.astype(dtype), (groups, np_, kp) if tb else (groups, kp, np_))
    work = work_list(group_sizes, m, bm, zero_group=True, visit_empty=False)
    p = pl()
    out: jax.Array = p.pallas_call(
        functools.partial(_gmm_kernel, groups=groups, bm=bm, bn=bn, bk=bk, steps=kp // bk, tb=tb,
                          precision=precision),
        grid=(np_ // bn, work.group.shape[0]),  # axis 0 varies fastest: the column tiles of one row tile
        in_specs=[_full(a) for a in (*work, x, w)],
        out_specs=p.BlockSpec((mp, np_), lambda *_: (0, 0)),
        out_shape=_mm.out_struct((mp, np_), out_dtype, x),
        compiler_params=_params(cfg),
        interpret=_env.use_interpreter(),
        name="ejk_pallas_grouped_matmul",
    )(*work, x, w)
    return out[:m, :n]


def _tgmm_kernel(off_ref: Any, x_ref: Any, y_ref: Any, o_ref: Any, *, bm: int, bk: int, bn: int,
                 precision: Any) -> None:
    p = pl()
    b, a, g = p.program_id(0), p.program_id(1), p.program_id(2)
    lo, hi = off_ref[g], off_ref[g + 1]
    t0 = lo // bm
    t1 = jnp.where(hi > lo, (hi + bm - 1) // bm, t0)
    k0, n0 = p.multiple_of(a * bk, bk), p.multiple_of(b * bn, bn)

    def body(t: Any, acc: Any) -> Any:
        row0 = p.multiple_of(t * bm, bm)
        rows = row0 + jnp.arange(bm, dtype=jnp.int32)
        keep = ((rows >= lo) & (rows < hi))[:, None]
        x = jnp.where(keep, x_ref[p.ds(row0, bm), p.ds(k0, bk)], 0)
        y = jnp.where(keep, y_ref[p.ds(row0, bm), p.ds(n0, bn)], 0)
        return acc + _mm.dot(x, y, (((0,), (0,)), ((), ())), precision, gpu=True)

    acc = lax.fori_loop(t0, t1, body, jnp.zeros((bk, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _grouped_outer(x: jax.Array, dy: jax.Array, group_sizes: jax.Array, groups: int, *, out_dtype: Any,
                   precision: Any, cfg: GroupedMatmulConfig) -> jax.Array:
    """``out[i] = x_iᵀ @ dy_i`` over group ``i``'s rows: ``x [m, k]``, ``dy [m, n]``, out ``[g, k, n]``."""
    m, k = x.shape
    n = dy.shape[1]
    if groups * k * n == 0 or m == 0:
        return jnp.zeros((groups, k, n), out_dtype)
    dtype = _mm.common_dtype(x, dy)
    bk, bn, bm = fit_block(cfg.block_m, k), fit_block(cfg.block_n, n), fit_block(cfg.block_k, m)
    mp, np_, kp = cdiv(m, bm) * bm, cdiv(n, bn) * bn, cdiv(k, bk) * bk
    x = _mm.pad_to(x.astype(dtype), (mp, kp))
    dy = _mm.pad_to(dy.astype(dtype), (mp, np_))
    offs = offsets(group_sizes, m)
    p = pl()
    out: jax.Array = p.pallas_call(
        functools.partial(_tgmm_kernel, bm=bm, bk=bk, bn=bn, precision=precision),
        grid=(np_ // bn, kp // bk, groups),  # the tiles of one group run together (its rows stay in L2)
        in_specs=[_full(offs), _full(x), _full(dy)],
        out_specs=p.BlockSpec((None, bk, bn), lambda b, a, g: (g, a, b)),
        out_shape=_mm.out_struct((groups, kp, np_), out_dtype, x),
        compiler_params=_params(cfg),
        interpret=_env.use_interpreter(),
        name="ejk_pallas_grouped_matmul_drhs",
    )(offs, x, dy)
    return out[:, :k, :n]


def _resolve(cfg: GroupedMatmulConfig | None, lhs: Any, rhs: Any, group_sizes: Any) -> GroupedMatmulConfig:
    return heuristic_config(lhs, rhs, group_sizes) if cfg is None else cfg


def forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
            precision: str | tuple[str, str] = ("highest", "highest"),
            preferred_element_type: Any = None, cfg: GroupedMatmulConfig | None = None) -> jax.Array:
    """``[m, n]`` in ``preferred_element_type`` (``None``: ``lhs.dtype``): rows of group ``i`` times ``rhs[i]``,
    rows past ``sum(group_sizes)`` zero."""
    out_dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    return _grouped_product(lhs, rhs, group_sizes, tb=False, out_dtype=out_dtype, precision=precision,
                            cfg=_resolve(cfg, lhs, rhs, group_sizes))


def gradients(operands: tuple[jax.Array, ...], d_out: jax.Array, *, cfg: GroupedMatmulConfig | None = None,
              precision: str | tuple[str, str] = ("highest", "highest"),
              preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array, None]:
    """``(d lhs, d rhs, None)`` in the dtypes of ``lhs`` and ``rhs``."""
    del preferred_element_type
    lhs, rhs, group_sizes = operands
    cfg = _resolve(cfg, lhs, rhs, group_sizes)
    d_lhs = _grouped_product(d_out, rhs, group_sizes, tb=True, out_dtype=lhs.dtype, precision=precision, cfg=cfg)
    d_rhs = _grouped_outer(lhs, d_out, group_sizes, rhs.shape[0], out_dtype=rhs.dtype, precision=precision, cfg=cfg)
    return d_lhs, d_rhs, None


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, GROUPED_MATMUL_RESIDUALS)


def gate_args(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any) -> str | None:
    """The checks both grouped implementations share, before the device's: integer sizes."""
    del lhs, rhs, preferred_element_type
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        return f"group_sizes of dtype {jnp.dtype(group_sizes.dtype).name} not supported (integers only)"
    return None


def capability(lhs: Any, rhs: Any, group_sizes: Any, *, precision: Any = None,
               preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: any sizes (empty groups, rows past the sum, ``k = 0``), bfloat16 / float16 /
    float32 operands (mixed ones cast to their common type), every precision and output dtype,
    arrays below 2**30 elements. Needs an NVIDIA GPU (compute capability 8.0+), except in
    interpret mode.
    """
    del precision
    why = gate_args(lhs, rhs, group_sizes, preferred_element_type)
    if why is not None:
        return why
    m, k = (int(d) for d in lhs.shape)
    n = int(rhs.shape[2])
    if cdiv(m, 16) + int(rhs.shape[0]) + 1 > _MAX_GRID_Y:
        return f"{m} rows and {int(rhs.shape[0])} groups exceed the work list's grid limit (at most about 1M rows)"
    return _mm.gpu_gate((("lhs", lhs), ("rhs", rhs)), (("out", m * n), ("d lhs", m * k)), preferred_element_type)


# (block_m, block_n, block_k, group_m, num_warps, num_stages), preferred first for large groups.
_TILES_16 = (
    (128, 256, 64, 1, 8, 3), (128, 128, 64, 1, 8, 4), (128, 128, 64, 1, 4, 4), (64, 256, 64, 1, 4, 4),
    (64, 128, 64, 1, 4, 4), (128, 64, 64, 1, 4, 4), (64, 64, 64, 1, 4, 4), (64, 64, 32, 1, 4, 2),
)
_TILES_32 = ((128, 128, 32, 1, 8, 3), (64, 128, 32, 1, 4, 3), (128, 64, 32, 1, 4, 3), (64, 64, 32, 1, 4, 3),
             (32, 64, 32, 1, 4, 2))
_INTERPRETER = GroupedMatmulConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)


def _fitting(lhs: Any, rhs: Any) -> list[GroupedMatmulConfig]:
    itemsize = _mm.common_dtype(lhs, rhs).itemsize
    return [GroupedMatmulConfig(**attrs.asdict(c)) for c in fitting(_TILES_16, _TILES_32, itemsize)]


def config_space(lhs: Any, rhs: Any, group_sizes: Any, **_: Any) -> list[GroupedMatmulConfig]:
    """Autotuning candidates: the dtype's tile table pruned by a shared-memory estimate, the heuristic's first."""
    if _env.use_interpreter():
        return [_INTERPRETER]
    first = heuristic_config(lhs, rhs, group_sizes)
    return [first, *(c for c in _fitting(lhs, rhs) if c != first)]


def heuristic_config(lhs: Any, rhs: Any, group_sizes: Any, **_: Any) -> GroupedMatmulConfig:
    """Row tiles at most twice the average group (``m / g``, at least 64 rows: a tile straddling groups is
    computed once per group), then the first fitting entry whose tile count covers the SMs. 16x16x16 in
    interpret mode."""
    del group_sizes
    if _env.use_interpreter():
        return _INTERPRETER
    m, groups, n = int(lhs.shape[0]), max(int(rhs.shape[0]), 1), int(rhs.shape[2])
    average = max(cdiv(m, groups), 1)
    table = _fitting(lhs, rhs)
    short = [c for c in table if c.block_m <= max(64, 2 * average)] or table[-1:]

    def tiles(c: GroupedMatmulConfig) -> int:
        return groups * cdiv(average, c.block_m) * cdiv(n, c.block_n)

    return next((c for c in short if tiles(c) >= devices.sm_count()), max(short, key=tiles))
