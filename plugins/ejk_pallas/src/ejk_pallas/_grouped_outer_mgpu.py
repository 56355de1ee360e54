"""``d rhs`` of ``grouped_matmul`` for Hopper (Pallas's Mosaic GPU backend): ``out[g] = x_gᵀ · dy_g`` per group.

The kernel of :mod:`ejk_pallas._matmul_mgpu` (persistent, warp-specialised: a memory warpgroup feeding a TMA
ring, two compute warpgroups with warpgroup MMA, chunked TMA-store epilogue) with the contraction running over
each group's rows. A work item is one ``[128, block_n]`` tile of one group's ``[k, n]`` gradient; items are
ordered group by group (a group's rows of ``x`` and ``dy`` stay in L2 while its tiles run) and, inside a group,
in a banded snake. An item's contraction steps are 64 rows each from the group's first row rounded down to a
multiple of 8 (TMA's swizzled tiling); the step count is read at run time (a dynamic pipeline grid), so a group
costs ``cdiv(rows, 64)`` steps whatever its size, and an empty group only stores its zero tile.

Rows of a step outside the group (the head rounded down, the tail past the group's end) belong to other groups
or to no group: on those (at most two) steps they are zeroed in both operands' shared-memory slices, so that not
even an inf or a NaN of theirs reaches the group's sums. Each compute warpgroup zeroes half of each slice; the
two meet on a barrier before either multiplies. ``x``'s slice ``[64 rows, 128]`` is read transposed in place by
the MMA. With ``EJK_PALLAS_INTERPRET=1`` on a CPU the same kernel runs in Pallas's Mosaic GPU interpret mode (there
``x`` is transposed by a copy: its MMA takes no transposed operand).
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import cdiv, devices
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as _fa
from ejk_pallas import _matmul_mgpu as _mm
from ejk_pallas._group_metadata import offsets
from ejk_pallas._mm import pad_to

__all__ = ["grouped_outer", "heuristic", "smem_bytes"]

#: Rows of ``k`` per output tile; rows of the contraction (the group's rows) per step.
_BLOCK_K_OUT = 128
_STEP = _mm._BLOCK_K
_INTERPRET_CTAS = 2


@attrs.frozen(kw_only=True)
class _Static:
    """What the kernel body needs that is known when tracing."""

    block_n: int
    split: str
    stages: int
    band: int
    groups: int
    k_tiles: int
    n_tiles: int
    view_rows: int  # static length of an item's row views (from its first row; only `steps` slices are read)
    transposed_x: bool  # x arrives as [k, m] (interpret mode) instead of [m, k]
    out_dtype: Any

    @property
    def warpgroup_tile(self) -> tuple[int, int]:
        return (_BLOCK_K_OUT // 2, self.block_n) if self.split == "m" else (_BLOCK_K_OUT, self.block_n // 2)


def _zero_outside(ref: Any, axis: int, keep_lo: Any, keep_hi: Any, interpret: bool) -> None:
    """Zero the entries of the shared-memory ``ref`` whose index along ``axis`` is outside ``[keep_lo, keep_hi)``,
    then fence, so the next MMA reads the zeros."""
    _, plgpu = _fa._mods()
    value = ref[...]
    index = lax.broadcasted_iota(jnp.int32, value.shape, axis)
    if not interpret:
        index = plgpu.layout_cast(index, plgpu.Layout.WGMMA)
    keep = (index >= keep_lo) & (index < keep_hi)
    ref[...] = jnp.where(keep, value, jnp.zeros_like(value))
    plgpu.commit_smem()


def _kernel(start_ref: Any, stop_ref: Any, x_gmem: Any, y_gmem: Any, out_gmem: Any, *, st: _Static) -> None:
    pl, plgpu = _fa._mods()
    interpret = _env.use_interpreter()
    wm, wn = st.warpgroup_tile
    bk, bn, step = _BLOCK_K_OUT, st.block_n, _STEP
    transforms = _mm._transforms(x_gmem.dtype, step * jnp.dtype(x_gmem.dtype).itemsize)
    # A step's slice of x: [64 rows, 128 of k] ([128 of k, 64 rows] when transposed by a copy); of dy: [64, bn].
    x_spec = plgpu.BlockSpec((bk, step) if st.transposed_x else (step, bk),
                             (lambda s: (0, s)) if st.transposed_x else (lambda s: (s, 0)),
                             transforms=transforms, memory_space=plgpu.SMEM)
    y_spec = plgpu.BlockSpec((step, bn), lambda s: (s, 0), transforms=transforms, memory_space=plgpu.SMEM)

    def pipeline(steps: Any, body: Any, context: Any) -> Any:
        return plgpu.emit_pipeline_warp_specialized(
            body, grid=(steps,), memory_registers=_mm._MEMORY_REGISTERS, in_specs=[x_spec, y_spec], wg_axis="wg",
            num_compute_wgs=2, max_concurrent_steps=st.stages, compute_context=context)

    def scope(allocations: Any, out_smem: Any, meet: Any) -> None:
        wg = lax.axis_index("wg")
        per_group = st.k_tiles * st.n_tiles
        wg_k = pl.ds(wg * wm, wm) if st.split == "m" else slice(None)
        wg_n = pl.ds(wg * wn, wn) if st.split == "n" else slice(None)

        @plgpu.nd_loop((st.groups * per_group,), collective_axes="cluster_grid")  # type: ignore[untyped-decorator]
        def _item(info: Any) -> None:
            (lin,) = info.index
            g = lax.div(lin, per_group)
            ki, ni = _mm.snake(lax.rem(lin, per_group), st.k_tiles, st.n_tiles, st.band)
            lo, hi = start_ref[g], stop_ref[g]
            row0 = lax.div(lo, 8) * 8  # TMA's swizzled tiling: rows of 8
            steps = jnp.where(hi > lo, lax.div(hi - row0 + step - 1, step), 0)
            dst = out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)].at[wg_k, wg_n]

            def mma(idx: Any, x_smem: Any, y_smem: Any, acc_ref: Any) -> Any:
                base = row0 + idx[0] * step
                keep_lo, keep_hi = lo - base, hi - base

                @pl.when((keep_lo > 0) | (keep_hi < step))  # type: ignore[untyped-decorator]
                def _edge() -> None:
                    # Rows of other groups (or past the sum) are zeroed in both operands, so that no value of
                    # theirs, not even an inf or a NaN, reaches this group: each warpgroup zeroes half of each
                    # slice, then both meet before either multiplies.
                    half_k = pl.ds(wg * (bk // 2), bk // 2)
                    _zero_outside(x_smem.at[half_k] if st.transposed_x else x_smem.at[:, half_k],
                                  1 if st.transposed_x else 0, keep_lo, keep_hi, interpret)
                    if bn >= 128:
                        _zero_outside(y_smem.at[:, pl.ds(wg * (bn // 2), bn // 2)], 0, keep_lo, keep_hi, interpret)
                    else:
                        pl.when(wg == 0)(lambda: _zero_outside(y_smem, 0, keep_lo, keep_hi, interpret))
                    plgpu.barrier_arrive(meet)
                    plgpu.barrier_wait(meet)

                x_half = x_smem.at[wg_k] if st.transposed_x else x_smem.at[:, wg_k]
                plgpu.wgmma(acc_ref, x_half if st.transposed_x else x_half.transpose((1, 0)), y_smem.at[:, wg_n])
                plgpu.wgmma_wait(0)
                return acc_ref

            def context(run_pipeline: Any) -> None:
                def with_acc(acc_ref: Any) -> None:
                    run_pipeline(acc_ref)
                    _mm.store_tile(acc_ref[...].astype(st.out_dtype), out_smem.at[wg], dst)

                pl.run_scoped(with_acc, plgpu.ACC((wm, wn), jnp.float32))

            @pl.when(steps > 0)  # type: ignore[untyped-decorator]
            def _multiply() -> None:
                # Static-length views from the group's first row: the pipeline reads only its `steps` slices.
                rows = pl.ds(row0, st.view_rows)
                xs = x_gmem.at[pl.ds(ki * bk, bk), rows] if st.transposed_x else x_gmem.at[rows, pl.ds(ki * bk, bk)]
                pipeline(steps, mma, context)(xs, y_gmem.at[rows, pl.ds(ni * bn, bn)], allocations=allocations)

            @pl.when((steps == 0) & (wg < 2))  # type: ignore[untyped-decorator]
            def _empty() -> None:  # an empty group's gradient is zero
                _mm.store_tile(jnp.zeros((wm, wn), st.out_dtype), out_smem.at[wg], dst)

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    x0 = x_gmem.at[:bk, :step] if st.transposed_x else x_gmem.at[:step, :bk]
    allocations = pipeline(st.stages, _mm._ignore, _mm._ignore).get_allocations(x0, y_gmem.at[:step, :bn])
    pl.run_scoped(scope, allocations, _mm.epilogue_smem(st.out_dtype), plgpu.Barrier(num_arrivals=2),
                  collective_axes="wg")


def smem_bytes(block_n: int, stages: int, itemsize: int, out_itemsize: int) -> int:
    """Shared memory (bytes): the TMA ring of ``x`` and ``dy`` slices and two epilogue chunk slots per compute
    warpgroup."""
    return stages * _STEP * (_BLOCK_K_OUT + block_n) * itemsize + 2 * 2 * _mm._EPI[0] * _mm._EPI[1] * out_itemsize


def heuristic(x: Any, out_dtype: Any) -> dict[str, Any]:
    """``grouped_outer``'s tiles: ``[128, 256]`` split by rows of ``k``, the contraction's tiles walked down
    each column of tiles first (``band=1``), the deepest ring (at most 4 slots) that fits; in interpret mode
    64 columns and 2 slots (fewer simulated steps). Measured on the H100 against the alternatives:
    ``benchmarks/results/grouped_matmul_moe_h100.md``."""
    if _env.use_interpreter():
        return {"block_n": 64, "split": "m", "stages": 2, "band": 1}
    itemsize, out_itemsize = jnp.dtype(x.dtype).itemsize, jnp.dtype(out_dtype).itemsize
    stages = max(s for s in range(2, 5) if s == 2 or smem_bytes(256, s, itemsize, out_itemsize) <= _mm._SMEM_BUDGET)
    return {"block_n": 256, "split": "m", "stages": stages, "band": 1}


def grouped_outer(x: jax.Array, dy: jax.Array, group_sizes: jax.Array, groups: int, *, out_dtype: Any,
                  block_n: int | None = None, split: str = "m", stages: int = 4, band: int = 1) -> jax.Array:
    """``out[i] = x_iᵀ · dy_i`` over group ``i``'s rows: ``x [m, k]``, ``dy [m, n]`` (16-bit, one dtype), out
    ``[groups, k, n]`` in ``out_dtype`` (float32 sums); rows past ``sum(group_sizes)`` count in no group.
    ``block_n=None`` takes every tile setting from :func:`heuristic`."""
    _, plgpu = _fa._mods()
    if block_n is None:
        return grouped_outer(x, dy, group_sizes, groups, out_dtype=out_dtype, **heuristic(x, out_dtype))
    m, k = x.shape
    n = dy.shape[1]
    if groups * k * n == 0 or m == 0:
        return jnp.zeros((groups, k, n), out_dtype)
    interpret = _env.use_interpreter()
    # TMA's swizzled tiling: rows of 8, columns of 64, every box inside the array.
    mp = view_rows = max(cdiv(m, 8) * 8, _STEP)
    kp, np_ = max(cdiv(k, 64) * 64, _BLOCK_K_OUT), max(cdiv(n, 64) * 64, block_n)
    if interpret:  # its views and copies must stay inside the array: whole tiles, and views from any row
        view_rows = cdiv(m, _STEP) * _STEP + _STEP
        mp, kp, np_ = 2 * view_rows, cdiv(k, _BLOCK_K_OUT) * _BLOCK_K_OUT, cdiv(n, block_n) * block_n
    xp = pad_to(x, (mp, kp))
    if interpret:  # the interpreter's MMA takes no transposed operand
        xp = xp.T
    yp = pad_to(dy.astype(x.dtype), (mp, np_))
    offs = offsets(group_sizes, m)
    st = _Static(block_n=block_n, split=split, stages=stages, band=band, groups=groups,
                 k_tiles=cdiv(kp, _BLOCK_K_OUT), n_tiles=cdiv(np_, block_n), view_rows=view_rows,
                 transposed_x=interpret,
                 out_dtype=jnp.dtype(out_dtype))
    ctas = min(groups * st.k_tiles * st.n_tiles, _INTERPRET_CTAS if interpret else devices.sm_count())
    kwargs: dict[str, Any] = {"interpret": _fa.interpret_params()} if interpret else {}
    out: jax.Array = plgpu.kernel(
        functools.partial(_kernel, st=st),
        out_type=jax.ShapeDtypeStruct((groups, cdiv(kp, _BLOCK_K_OUT) * _BLOCK_K_OUT, np_), out_dtype),
        grid=(ctas,),
        grid_names=("cluster_grid",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        **kwargs,
    )(offs[:-2], offs[1:-1], xp, yp)
    return out[:, :k, :n]
