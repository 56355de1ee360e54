"""``matmul`` and ``grouped_matmul`` as Mosaic TPU kernels — **untested on TPU hardware**.

Checked on the CPU in the TPU interpret mode (``interpret=pltpu.InterpretParams()``) only.

- matmul: grid ``(batch, row tile, column tile, k step)``, the k axis ``arbitrary`` with a float32
  accumulator in VMEM; transposed operands are read in place (``dot_general`` dimension
  numbers), so the backward (``_matmul_shapes``) reuses the kernel.
- grouped_matmul (the megablox design, written here from its description): the work list of
  ``_group_metadata`` (group, aligned row tile) is scalar-prefetched (``PrefetchScalarGridSpec``)
  and drives the index maps. Forward / ``d lhs``: grid ``(column tile, work item, k step)``;
  consecutive items on one row tile revisit its output block in VMEM, each keeping only its
  group's rows (the first visit starts from zeros; rows past the sum are a pseudo-group of
  zeros; items past the count repeat the last, so no copy is issued). ``d rhs``: grid
  ``(k tile, n tile, work item)`` with one visit per empty group (it writes zeros) and the
  items of a group accumulating ``lhs_iᵀ @ d out_i`` in VMEM.

Blocks: rows a multiple of 8 (16 for 16-bit operands), columns and k a multiple of 128; operands
are zero-padded to whole blocks.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import GROUPED_MATMUL_RESIDUALS, MATMUL_RESIDUALS, cdiv, multiple_of, operand_vjp
from ejk_pallas import _env, _mm
from ejk_pallas._flash_attention_tpu import _pl, _pltpu, _when
from ejk_pallas._group_metadata import work_list
from ejk_pallas._grouped_matmul import gate_args
from ejk_pallas._matmul_shapes import matmul_backward, matmul_forward, shapes

__all__ = [
    "TpuMatmulConfig",
    "grouped_capability",
    "grouped_config_space",
    "grouped_forward",
    "grouped_gradients",
    "grouped_vjp",
    "heuristic_config",
    "matmul_capability",
    "matmul_config_space",
    "matmul_forward_",
    "matmul_gradients",
    "matmul_vjp",
]


@attrs.frozen(kw_only=True)
class TpuMatmulConfig:
    """Blocks of the Mosaic TPU matmul and grouped matmul (clamped to the padded problem).

    Attributes:
        block_m: Rows per block (a multiple of 8; 16-bit operands use a multiple of 16).
        block_n: Columns per block (a multiple of 128).
        block_k: Contraction step (a multiple of 128).
    """

    block_m: int = attrs.field(default=256, validator=multiple_of(8))
    block_n: int = attrs.field(default=256, validator=multiple_of(128))
    block_k: int = attrs.field(default=512, validator=multiple_of(128))


def _round(n: int, step: int) -> int:
    return max(step, cdiv(n, step) * step)


def _blocks(cfg: TpuMatmulConfig, m: int, n: int, k: int, itemsize: int) -> tuple[int, int, int]:
    sub = 16 if itemsize == 2 else 8
    return (min(_round(cfg.block_m, sub), _round(m, sub)), min(cfg.block_n, _round(n, 128)),
            min(cfg.block_k, _round(k, 128)))


def _dims(ta: bool, tb: bool) -> tuple[Any, Any]:
    return (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))


def _params(*semantics: str) -> Any:
    return _pltpu().CompilerParams(dimension_semantics=semantics)


def _interpret() -> Any:
    return _pltpu().InterpretParams() if _env.use_interpreter() else False


# ----------------------------------------------------------------------------------------------
# matmul
# ----------------------------------------------------------------------------------------------


def _mm_kernel(a_ref: Any, b_ref: Any, o_ref: Any, acc: Any, *, ta: bool, tb: bool, steps: int,
               precision: Any) -> None:
    kk = _pl().program_id(3)

    @_when(kk == 0)
    def _init() -> None:
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    acc[...] += _mm.dot(a_ref[...], b_ref[...], _dims(ta, tb), precision, gpu=False)

    @_when(kk == steps - 1)
    def _done() -> None:
        o_ref[...] = acc[...].astype(o_ref.dtype)


def _product(x: jax.Array, y: jax.Array, *, ta: bool = False, tb: bool = False, out_dtype: Any, precision: Any,
             cfg: TpuMatmulConfig) -> jax.Array:
    z = x.shape[0]
    m, k = (x.shape[2], x.shape[1]) if ta else x.shape[1:]
    n = y.shape[1] if tb else y.shape[2]
    if z * m * n == 0 or k == 0:
        return jnp.zeros((z, m, n), out_dtype)
    dtype = _mm.common_dtype(x, y)
    bm, bn, bk = _blocks(cfg, m, n, k, dtype.itemsize)
    mp, np_, kp = cdiv(m, bm) * bm, cdiv(n, bn) * bn, cdiv(k, bk) * bk
    x = _mm.pad_to(x.astype(dtype), (z, kp, mp) if ta else (z, mp, kp))
    y = _mm.pad_to(y.astype(dtype), (z, np_, kp) if tb else (z, kp, np_))
    p = _pl()
    a_spec = (p.BlockSpec((None, bk, bm), lambda b, i, j, kk: (b, kk, i)) if ta
              else p.BlockSpec((None, bm, bk), lambda b, i, j, kk: (b, i, kk)))
    b_spec = (p.BlockSpec((None, bn, bk), lambda b, i, j, kk: (b, j, kk)) if tb
              else p.BlockSpec((None, bk, bn), lambda b, i, j, kk: (b, kk, j)))
    out: jax.Array = p.pallas_call(
        functools.partial(_mm_kernel, ta=ta, tb=tb, steps=kp // bk, precision=precision),
        grid=(z, mp // bm, np_ // bn, kp // bk),
        in_specs=[a_spec, b_spec],
        out_specs=p.BlockSpec((None, bm, bn), lambda b, i, j, kk: (b, i, j)),
        out_shape=_mm.out_struct((z, mp, np_), out_dtype, x),
        scratch_shapes=[_pltpu().VMEM((bm, bn), jnp.float32)],
        compiler_params=_params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=_interpret(),
        name="ejk_pallas_matmul_tpu",
    )(x, y)
    return out[:, :m, :n]


def matmul_forward_(a: jax.Array, b: jax.Array, *, precision: str | tuple[str, str] = ("highest", "highest"),
                    preferred_element_type: Any = None, cfg: TpuMatmulConfig | None = None) -> jax.Array:
    """``jnp.matmul(a, b)`` in ``preferred_element_type`` (``None``: ``result_type(a, b)``), float32 accumulation."""
    out_dtype = jnp.result_type(a, b) if preferred_element_type is None else preferred_element_type
    product = functools.partial(_product, precision=precision, cfg=cfg or heuristic_config(a, b))
    return matmul_forward(product, a, b, out_dtype)


def matmul_gradients(operands: tuple[jax.Array, jax.Array], d_out: jax.Array, *, cfg: TpuMatmulConfig | None = None,
                     precision: str | tuple[str, str] = ("highest", "highest"),
                     preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)`` through the forward's kernel."""
    del preferred_element_type
    a, b = operands
    product = functools.partial(_product, precision=precision, cfg=cfg or heuristic_config(a, b))
    return matmul_backward(product, a, b, d_out)


#: The custom VJP: the operands are the residuals, :func:`matmul_gradients` the backward.
matmul_vjp = operand_vjp(matmul_forward_, matmul_gradients, MATMUL_RESIDUALS)


def matmul_capability(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> str | None:
    """Every ``jnp.matmul`` shape, bfloat16 / float16 / float32, every precision; needs a TPU (untested on
    hardware) or interpret mode."""
    del precision
    s = shapes(a, b)
    return _mm.tpu_gate((("a", a), ("b", b)), (("out", s.z * s.rows * s.n),), preferred_element_type)


# ----------------------------------------------------------------------------------------------
# grouped_matmul
# ----------------------------------------------------------------------------------------------


def _gmm_kernel(grp_ref: Any, tile_ref: Any, off_ref: Any, cnt_ref: Any, x_ref: Any, w_ref: Any, o_ref: Any,
                acc: Any, *, groups: int, bm: int, tb: bool, steps: int, precision: Any) -> None:
    p = _pl()
    w, kk = p.program_id(1), p.program_id(2)
    g = grp_ref[w]
    valid = w < cnt_ref[0]

    @_when(kk == 0)
    def _init() -> None:
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    @_when(jnp.logical_and(valid, g < groups))
    def _step() -> None:
        acc[...] += _mm.dot(x_ref[...], w_ref[...], _dims(False, tb), precision, gpu=False)

    @_when(jnp.logical_and(valid, kk == steps - 1))
    def _store() -> None:
        rows = tile_ref[w] * bm + jax.lax.broadcasted_iota(jnp.int32, acc.shape, 0)
        keep = (rows >= off_ref[g]) & (rows < off_ref[g + 1])
        first = jnp.logical_or(w == 0, tile_ref[jnp.maximum(w - 1, 0)] != tile_ref[w])
        before = jnp.where(first, jnp.zeros(acc.shape, o_ref.dtype), o_ref[...])
        o_ref[...] = jnp.where(keep, acc[...].astype(o_ref.dtype), before)


def _grouped_product(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, tb: bool, out_dtype: Any,
                     precision: Any, cfg: TpuMatmulConfig) -> jax.Array:
    m, k = x.shape
    groups = w.shape[0]
    n = w.shape[1] if tb else w.shape[2]
    if m * n == 0 or groups == 0 or k == 0:
        return jnp.zeros((m, n), out_dtype)
    dtype = _mm.common_dtype(x, w)
    bm, bn, bk = _blocks(cfg, m, n, k, dtype.itemsize)
    mp, np_, kp = cdiv(m, bm) * bm, cdiv(n, bn) * bn, cdiv(k, bk) * bk
    x = _mm.pad_to(x.astype(dtype), (mp, kp))
    w = _mm.pad_to(w.astype(dtype), (groups, np_, kp) if tb else (groups, kp, np_))
    work = work_list(group_sizes, m, bm, zero_group=True, visit_empty=False)
    p = _pl()

    def gw(g: Any) -> Any:
        return jnp.minimum(g, groups - 1)

    w_spec = (p.BlockSpec((None, bn, bk), lambda j, i, kk, grp, tile, off, cnt: (gw(grp[i]), j, kk)) if tb
              else p.BlockSpec((None, bk, bn), lambda j, i, kk, grp, tile, off, cnt: (gw(grp[i]), kk, j)))
    spec = _pltpu().PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(np_ // bn, work.group.shape[0], kp // bk),
        in_specs=[p.BlockSpec((bm, bk), lambda j, i, kk, grp, tile, off, cnt: (tile[i], kk)), w_spec],
        out_specs=p.BlockSpec((bm, bn), lambda j, i, kk, grp, tile, off, cnt: (tile[i], j)),
        scratch_shapes=[_pltpu().VMEM((bm, bn), jnp.float32)],
    )
    out: jax.Array = p.pallas_call(
        functools.partial(_gmm_kernel, groups=groups, bm=bm, tb=tb, steps=kp // bk, precision=precision),
        grid_spec=spec,
        out_shape=_mm.out_struct((mp, np_), out_dtype, x),
        compiler_params=_params("parallel", "arbitrary", "arbitrary"),
        interpret=_interpret(),
        name="ejk_pallas_grouped_matmul_tpu",
    )(*work, x, w)
    return out[:m, :n]


def _tgmm_kernel(grp_ref: Any, tile_ref: Any, off_ref: Any, cnt_ref: Any, x_ref: Any, y_ref: Any, o_ref: Any,
                 acc: Any, *, bm: int, items: int, precision: Any) -> None:
    p = _pl()
    w = p.program_id(2)
    g = grp_ref[w]
    valid = w < cnt_ref[0]
    first = jnp.logical_or(w == 0, grp_ref[jnp.maximum(w - 1, 0)] != g)
    last = jnp.logical_or(w == cnt_ref[0] - 1, grp_ref[jnp.minimum(w + 1, items - 1)] != g)

    @_when(jnp.logical_and(valid, first))
    def _init() -> None:
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    @_when(valid)
    def _step() -> None:
        rows = tile_ref[w] * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
        keep = (rows >= off_ref[g]) & (rows < off_ref[g + 1])
        x = jnp.where(keep, x_ref[...], jnp.zeros_like(x_ref[...]))
        y = jnp.where(keep, y_ref[...], jnp.zeros_like(y_ref[...]))
        acc[...] += _mm.dot(x, y, (((0,), (0,)), ((), ())), precision, gpu=False)

    @_when(jnp.logical_and(valid, last))
    def _store() -> None:
        o_ref[...] = acc[...].astype(o_ref.dtype)


def _grouped_outer(x: jax.Array, dy: jax.Array, group_sizes: jax.Array, groups: int, *, out_dtype: Any,
                   precision: Any, cfg: TpuMatmulConfig) -> jax.Array:
    m, k = x.shape
    n = dy.shape[1]
    if groups * k * n == 0 or m == 0:
        return jnp.zeros((groups, k, n), out_dtype)
    dtype = _mm.common_dtype(x, dy)
    bm, bn, bk = _blocks(cfg, m, n, k, dtype.itemsize)
    mp, np_, kp = cdiv(m, bm) * bm, cdiv(n, bn) * bn, cdiv(k, bk) * bk
    x = _mm.pad_to(x.astype(dtype), (mp, kp))
    dy = _mm.pad_to(dy.astype(dtype), (mp, np_))
    work = work_list(group_sizes, m, bm, zero_group=False, visit_empty=True)
    items = work.group.shape[0]
    p = _pl()
    spec = _pltpu().PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(kp // bk, np_ // bn, items),
        in_specs=[p.BlockSpec((bm, bk), lambda a, j, i, grp, tile, off, cnt: (tile[i], a)),
                  p.BlockSpec((bm, bn), lambda a, j, i, grp, tile, off, cnt: (tile[i], j))],
        out_specs=p.BlockSpec((None, bk, bn), lambda a, j, i, grp, tile, off, cnt: (grp[i], a, j)),
        scratch_shapes=[_pltpu().VMEM((bk, bn), jnp.float32)],
    )
    out: jax.Array = p.pallas_call(
        functools.partial(_tgmm_kernel, bm=bm, items=items, precision=precision),
        grid_spec=spec,
        out_shape=_mm.out_struct((groups, kp, np_), out_dtype, x),
        compiler_params=_params("parallel", "parallel", "arbitrary"),
        interpret=_interpret(),
        name="ejk_pallas_grouped_matmul_drhs_tpu",
    )(*work, x, dy)
    return out[:, :k, :n]


def grouped_forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                    precision: str | tuple[str, str] = ("highest", "highest"), preferred_element_type: Any = None,
                    cfg: TpuMatmulConfig | None = None) -> jax.Array:
    """``[m, n]``: rows of group ``i`` times ``rhs[i]``, rows past ``sum(group_sizes)`` zero."""
    out_dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    return _grouped_product(lhs, rhs, group_sizes, tb=False, out_dtype=out_dtype, precision=precision,
                            cfg=cfg or heuristic_config(lhs, rhs))


def grouped_gradients(operands: tuple[jax.Array, ...], d_out: jax.Array, *, cfg: TpuMatmulConfig | None = None,
                      precision: str | tuple[str, str] = ("highest", "highest"),
                      preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array, None]:
    """``(d lhs, d rhs, None)``: the forward kernel with ``rhs`` transposed, and the per-group reduction kernel."""
    del preferred_element_type
    lhs, rhs, group_sizes = operands
    cfg = cfg or heuristic_config(lhs, rhs)
    d_lhs = _grouped_product(d_out, rhs, group_sizes, tb=True, out_dtype=lhs.dtype, precision=precision, cfg=cfg)
    d_rhs = _grouped_outer(lhs, d_out, group_sizes, rhs.shape[0], out_dtype=rhs.dtype, precision=precision, cfg=cfg)
    return d_lhs, d_rhs, None


#: The custom VJP: the operands are the residuals, :func:`grouped_gradients` the backward.
grouped_vjp = operand_vjp(grouped_forward, grouped_gradients, GROUPED_MATMUL_RESIDUALS)


def grouped_capability(lhs: Any, rhs: Any, group_sizes: Any, *, precision: Any = None,
                       preferred_element_type: Any = None) -> str | None:
    """Any sizes and groups, bfloat16 / float16 / float32, every precision; needs a TPU (untested on
    hardware) or interpret mode."""
    del precision
    why = gate_args(lhs, rhs, group_sizes, preferred_element_type)
    if why is not None:
        return why
    m, n = int(lhs.shape[0]), int(rhs.shape[2])
    return _mm.tpu_gate((("lhs", lhs), ("rhs", rhs)), (("out", m * n),), preferred_element_type)


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------

#: Scoped VMEM a kernel may use by default (bytes): 16 MiB on v4 / v5e, 32 MiB on v5p / v6e.
_VMEM = 16 * 1024 * 1024
_TILES = ((256, 256, 512), (512, 256, 512), (256, 512, 512), (128, 256, 512), (512, 512, 512), (128, 128, 256),
          (1024, 512, 1024))


def vmem_bytes(cfg: TpuMatmulConfig, itemsize: int, out_itemsize: int = 4) -> int:
    """Double-buffered input and output blocks plus the float32 accumulator."""
    return (2 * (cfg.block_m + cfg.block_n) * cfg.block_k * itemsize
            + 2 * cfg.block_m * cfg.block_n * out_itemsize + 4 * cfg.block_m * cfg.block_n)


def heuristic_config(*arrays: Any, **options: Any) -> TpuMatmulConfig:
    """256 x 256 blocks, k steps of 512 (MXU-sized tiles; untimed on hardware); 16 x 128 x 128 in interpret
    mode. The same for ``matmul`` (``a``, ``b``) and ``grouped_matmul`` (``lhs``, ``rhs``, ``group_sizes``)."""
    del arrays, options
    if _env.use_interpreter():
        return TpuMatmulConfig(block_m=16, block_n=128, block_k=128)
    return TpuMatmulConfig()


def matmul_config_space(a: Any, b: Any, *rest: Any, **_: Any) -> list[TpuMatmulConfig]:
    """The heuristic's config first, then the tile table pruned by a VMEM estimate (untimed on hardware)."""
    first = heuristic_config(a, b)
    if _env.use_interpreter():
        return [first]
    itemsize = _mm.common_dtype(a, b).itemsize
    table = [TpuMatmulConfig(block_m=m, block_n=n, block_k=k) for m, n, k in _TILES]
    return [first, *(c for c in table if c != first and vmem_bytes(c, itemsize) <= _VMEM)]


def grouped_config_space(lhs: Any, rhs: Any, group_sizes: Any, **_: Any) -> list[TpuMatmulConfig]:
    """As :func:`matmul_config_space`, the row blocks at most 512 (a block straddling groups is computed per group)."""
    return [c for c in matmul_config_space(lhs, rhs) if c.block_m <= 512]
