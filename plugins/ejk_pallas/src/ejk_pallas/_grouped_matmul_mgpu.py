"""``grouped_matmul`` (mixture of experts) for Hopper, written with Pallas's Mosaic GPU backend (``plgpu``).

A persistent kernel: one CTA per SM walks the output tiles ``[128 rows, block_n columns]`` in row-major
order (the column tiles of one row tile next to each other, so the rows are read from HBM once and the
group's ``rhs`` columns stay in L2 while its row tiles pass). Each CTA runs three warpgroups:

* a producer that streams, for every (tile, group, k step), the tile's 128 rows of ``lhs`` (two 64-row
  TMA copies) and the group's ``[block_k, block_n]`` slice of ``rhs`` into a ring of
  ``max_concurrent_steps`` shared-memory slots; it runs on into the next tile while the consumers store
  the last one, so the pipeline never drains between tiles;
* two consumers, 64 rows each, that accumulate ``lhs·rhs[g]`` with warpgroup MMA (float32 registers)
  and store their rows with TMA.

A tile that straddles a group boundary is multiplied once per group it meets, into one accumulator: a
consumer with only some of its 64 rows in the group zeroes the others in its own half of the ``lhs``
slot in shared memory before its MMA; one with none of them only keeps the barriers in step. Every
output tile is therefore stored once, whole, by one CTA. Empty groups cost nothing; rows past
``sum(group_sizes)`` belong to no group and get zeros. TMA fills out-of-bounds loads with zeros and clips
stores, so ragged sizes need no masking; its swizzled tiling needs ``k`` and ``n`` to be multiples of 64
and ``m`` of 8 (at least one tile each): other sizes are padded (a copy of the operand).

``transpose_rhs`` multiplies by ``rhs[g]ᵀ`` (``rhs`` read as ``[g, n, k]`` tiles and transposed in
shared memory): the backward's ``d lhs = d out · rhs[g]ᵀ``. ``d rhs`` comes from the Triton-lowered
kernel of :mod:`ejk_pallas._grouped_matmul` (same residuals).

With ``EJK_PALLAS_INTERPRET=1`` on a CPU the same kernel runs in Pallas's Mosaic GPU interpret mode (its
MMAs as plain dots: the interpreter has no warpgroup MMA).
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.config.validators import int_in, one_of
from ejk.parallel import cotangent_like
from ejk.tiling import cdiv
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as _fa
from ejk_pallas import _grouped_matmul as _tl
from ejk_pallas._group_metadata import offsets
from ejk_pallas._matmul import _sm_count

__all__ = ["MosaicGroupedMatmulConfig", "backward", "capability", "config_space", "forward",
           "forward_with_residuals", "heuristic_config", "smem_bytes"]

#: Rows per consumer warpgroup (one 64-row WGMMA tile) and consumers per CTA: 128-row output tiles.
_ROWS = 64
_CONSUMERS = 2
_BLOCK_M = _ROWS * _CONSUMERS
#: The contraction step: one 128-byte swizzle row of 16-bit elements.
_BLOCK_K = 64
#: Output columns per epilogue chunk (two chunk slots per consumer in shared memory).
_EPI_N = 64
_REGS = (232, 40)  # consumer / producer registers per thread (2 x 232 + 40 = 512 x 128 threads = 64K)
_DTYPES = ("bfloat16", "float16")
_OUT_DTYPES = ("bfloat16", "float16", "float32")
#: Hopper's opt-in shared memory per block (227 KiB, what the Mosaic GPU lowering allows), less 2 KiB for
#: the barriers and the 1 KiB alignment of each of the three buffers.
_SMEM_BUDGET = 227 * 1024 - 2 * 1024
#: CTAs in interpret mode: two, so the persistent loop's stride is exercised.
_INTERPRET_CTAS = 2


@attrs.frozen(kw_only=True)
class MosaicGroupedMatmulConfig:
    """Tiles of the Mosaic GPU grouped matmul (128 rows a tile, 64 a contraction step).

    Attributes:
        block_n: Output columns per tile (the MMA's N; 256 at most).
        max_concurrent_steps: Shared-memory slots of the TMA ring (how far the producer runs ahead).
    """

    block_n: int = attrs.field(default=256, validator=one_of(64, 128, 192, 256))
    max_concurrent_steps: int = attrs.field(default=3, validator=int_in(2, 8))


@attrs.frozen(kw_only=True)
class _Static:
    """What the kernel body needs that is known when tracing."""

    bn: int
    steps: int
    k_steps: int
    m_tiles: int
    n_tiles: int
    ctas: int
    transpose_rhs: bool
    out_dtype: Any
    interpret: bool

    @property
    def units(self) -> int:
        return self.m_tiles * self.n_tiles


def _transforms(dtype: Any) -> tuple[Any, ...]:
    _, plgpu = _fa._mods()
    return (plgpu.TilingTransform((8, 128 // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(128))


def _wgmma(x: Any, st: _Static) -> Any:
    """``x`` in the WGMMA register layout (the interpreter has no layouts: ``x`` itself)."""
    if st.interpret:
        return x
    _, plgpu = _fa._mods()
    return plgpu.layout_cast(x, plgpu.Layout.WGMMA)


def _kernel(first_ref: Any, count_ref: Any, offs_ref: Any, x_ref: Any, w_ref: Any, out_ref: Any, scoped: Any, *,
            st: _Static) -> None:
    pl, plgpu = _fa._mods()
    (a_ring, b_ring, o_smem), ready, free = scoped
    wg = lax.axis_index("wg")
    cta = lax.axis_index("sm")
    my_units = lax.div(st.units - 1 - cta, st.ctas) + 1  # units cta, cta + ctas, ... (cta < units)
    bn, bk = st.bn, _BLOCK_K

    def unit_at(i: Any) -> tuple[Any, Any]:
        u = cta + i * st.ctas
        return lax.div(u, st.n_tiles), lax.rem(u, st.n_tiles)  # (row tile, column tile)

    def slot(it: Any) -> Any:
        return lax.rem(it, st.steps)

    def groups_of(t: Any) -> tuple[Any, Any]:
        return first_ref[t], count_ref[t]

    def group_rows(g: Any) -> tuple[Any, Any]:
        return offs_ref[g], offs_ref[g + 1]

    def producer() -> None:
        plgpu.set_max_registers(_REGS[1], action="decrease")

        def unit(i: Any, it: Any) -> Any:
            t, j = unit_at(i)
            first, count = groups_of(t)

            def group(gi: Any, it: Any) -> Any:
                g = first + gi
                lo, hi = group_rows(g)

                def k_step(kk: Any, it: Any) -> Any:
                    s = slot(it)
                    _fa._when(it >= st.steps, lambda: plgpu.barrier_wait(free.at[s]))
                    k0 = kk * bk
                    for h in range(_CONSUMERS):
                        rows = pl.ds(t * _BLOCK_M + h * _ROWS, _ROWS)
                        plgpu.copy_gmem_to_smem(x_ref.at[rows, pl.ds(k0, bk)], a_ring.at[s * _CONSUMERS + h],
                                                ready.at[s])
                    cols = pl.ds(j * bn, bn)
                    src = w_ref.at[g, cols, pl.ds(k0, bk)] if st.transpose_rhs else w_ref.at[g, pl.ds(k0, bk), cols]
                    plgpu.copy_gmem_to_smem(src, b_ring.at[s], ready.at[s])
                    return it + 1

                return lax.cond(hi > lo, lambda it: lax.fori_loop(0, st.k_steps, k_step, it), lambda it: it, it)

            return lax.fori_loop(0, count, group, it)

        issued = lax.fori_loop(0, my_units, unit, jnp.int32(0))

        def drain(q: Any, carry: Any) -> Any:  # observe the last slots' releases (every phase awaited)
            plgpu.barrier_wait(free.at[slot(q)])
            return carry

        lax.fori_loop(jnp.maximum(issued - st.steps, 0), issued, drain, 0)

    def consumer() -> None:
        plgpu.set_max_registers(_REGS[0], action="increase")

        def a_tile(s: Any) -> Any:
            return a_ring.at[s * _CONSUMERS + wg]

        def b_operand(s: Any) -> Any:
            return b_ring.at[s].transpose((1, 0)) if st.transpose_rhs else b_ring.at[s]

        def b_value(s: Any) -> Any:
            return b_ring[s].T if st.transpose_rhs else b_ring[s]

        def mask_rows(s: Any, keep: Any) -> None:
            """Zero the rows of this consumer's ``lhs`` tile in slot ``s`` that are not the group's, in place
            (the tile is this consumer's alone; the MMA reads it through the async proxy, hence the fence)."""
            tile = a_tile(s)
            a = tile[...]
            tile[...] = jnp.where(keep, a, jnp.zeros_like(a))
            plgpu.commit_smem()

        def k_loop(acc: Any, it: Any, keep: Any) -> Any:
            """``acc + (lhs rows where keep)·rhs[g]`` over every k step (``keep`` ``None``: all rows)."""
            if st.interpret:
                def step(kk: Any, acc: Any) -> Any:
                    s = slot(it + kk)
                    plgpu.barrier_wait(ready.at[s])
                    if keep is not None:
                        mask_rows(s, keep)
                    acc = acc + jnp.dot(a_ring[s * _CONSUMERS + wg], b_value(s), preferred_element_type=jnp.float32)
                    plgpu.barrier_arrive(free.at[s])
                    return acc

                return lax.fori_loop(0, st.k_steps, step, acc)

            def run(acc_ref: Any) -> None:
                def step(kk: Any, carry: Any) -> Any:
                    s = slot(it + kk)
                    plgpu.barrier_wait(ready.at[s])
                    if keep is not None:
                        mask_rows(s, keep)
                    plgpu.wgmma(acc_ref, a_tile(s), b_operand(s))
                    plgpu.wgmma_wait(1)  # the previous step's MMA is done: release its slot
                    _fa._when(kk > 0, lambda: plgpu.barrier_arrive(free.at[slot(it + kk - 1)]))
                    return carry

                lax.fori_loop(0, st.k_steps, step, 0)
                plgpu.wgmma_wait(0)
                plgpu.barrier_arrive(free.at[slot(it + st.k_steps - 1)])

            return pl.run_state(run)(plgpu.ACC.init(acc))

        def skip_loop(acc: Any, it: Any) -> Any:
            """This consumer has no row of the group: keep the ring's barriers in step."""
            def step(kk: Any, carry: Any) -> Any:
                s = slot(it + kk)
                plgpu.barrier_wait(ready.at[s])
                plgpu.barrier_arrive(free.at[s])
                return carry

            lax.fori_loop(0, st.k_steps, step, 0)
            return acc

        def unit(i: Any, it: Any) -> Any:
            t, j = unit_at(i)
            first, count = groups_of(t)
            r0 = t * _BLOCK_M + wg * _ROWS

            def group(gi: Any, carry: Any) -> Any:
                acc, it = carry
                lo, hi = group_rows(first + gi)
                nonempty = hi > lo
                whole = (lo <= r0) & (hi >= r0 + _ROWS)
                none = (hi <= r0) | (lo >= r0 + _ROWS)

                def partial(acc: Any) -> Any:
                    rows = _wgmma(lax.broadcasted_iota(jnp.int32, (_ROWS, bk), 0), st) + r0
                    return k_loop(acc, it, (rows >= lo) & (rows < hi))

                branch = jnp.where(whole, 0, jnp.where(none, 1, 2)).astype(jnp.int32)
                acc = lax.cond(nonempty, lambda acc: lax.switch(branch, [
                    lambda acc: k_loop(acc, it, None), lambda acc: skip_loop(acc, it), partial], acc),
                    lambda acc: acc, acc)
                return acc, it + jnp.where(nonempty, st.k_steps, 0)

            acc = _wgmma(jnp.zeros((_ROWS, bn), jnp.float32), st)
            acc, it = lax.fori_loop(0, count, group, (acc, it))
            # The epilogue in 64-column chunks through two smem slots taken in turn across tiles too (a
            # chunk's store overlaps the next chunk's conversion); a slot is rewritten once its store two
            # chunks back has read it.
            chunks = bn // _EPI_N
            for c in range(chunks):
                out = o_smem.at[wg * 2 + lax.rem(i * chunks + c, 2)]
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                chunk = acc if bn == _EPI_N else acc[:, c * _EPI_N:(c + 1) * _EPI_N]
                out[...] = chunk.astype(st.out_dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out, out_ref.at[pl.ds(r0, _ROWS), pl.ds(j * bn + c * _EPI_N, _EPI_N)])
            return it

        lax.fori_loop(0, my_units, unit, jnp.int32(0))
        plgpu.wait_smem_to_gmem(0)

    _fa._when(wg < _CONSUMERS, consumer)
    _fa._when(wg == _CONSUMERS, producer)


def _entry(first_ref: Any, count_ref: Any, offs_ref: Any, x_ref: Any, w_ref: Any, out_ref: Any, *,
           st: _Static) -> None:
    pl, plgpu = _fa._mods()
    dtype = x_ref.dtype
    b_shape = (st.bn, _BLOCK_K) if st.transpose_rhs else (_BLOCK_K, st.bn)
    smem = (
        plgpu.SMEM((st.steps * _CONSUMERS, _ROWS, _BLOCK_K), dtype, transforms=_transforms(dtype)),
        plgpu.SMEM((st.steps, *b_shape), dtype, transforms=_transforms(dtype)),
        plgpu.SMEM((_CONSUMERS * 2, _ROWS, _EPI_N), st.out_dtype, transforms=_transforms(st.out_dtype)),
    )
    ready = plgpu.Barrier(num_arrivals=_CONSUMERS + 1, num_barriers=st.steps)  # two lhs halves and rhs
    free = plgpu.Barrier(num_arrivals=_CONSUMERS, num_barriers=st.steps)
    pl.run_scoped(
        lambda *scoped: _kernel(first_ref, count_ref, offs_ref, x_ref, w_ref, out_ref, scoped, st=st),
        smem, ready, free, collective_axes="wg",
    )


def _tile_groups(group_sizes: jax.Array, m: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(first, count, offsets)``: row tile ``t`` meets groups ``first[t] .. first[t] + count[t] - 1``
    (empty ones among them included; the kernel skips those), ``offsets`` as :func:`offsets` gives them."""
    groups = group_sizes.shape[0]
    offs = offsets(group_sizes, m)
    ends = offs[1:groups + 1]
    r0 = jnp.arange(cdiv(m, _BLOCK_M), dtype=jnp.int32) * _BLOCK_M
    r1 = jnp.minimum(r0 + _BLOCK_M, m) - 1
    first = jnp.searchsorted(ends, r0, side="right").astype(jnp.int32)  # the group holding row r0
    last = jnp.minimum(jnp.searchsorted(ends, r1, side="right"), groups - 1).astype(jnp.int32)
    return jnp.minimum(first, groups - 1), jnp.maximum(last - first + 1, 0).astype(jnp.int32), offs


def _at_least(x: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
    """``x`` zero-padded at the end of each axis to at least ``sizes`` (TMA boxes must fit the array)."""
    pads = [(0, max(s - d, 0)) for d, s in zip(x.shape, sizes, strict=True)]
    return jnp.pad(x, pads) if any(p for _, p in pads) else x


def grouped_product(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool, out_dtype: Any,
                    cfg: MosaicGroupedMatmulConfig) -> jax.Array:
    """``out[r] = x[r] @ w[group(r)]`` (``w[group(r)]ᵀ`` with ``transpose_rhs``): ``x [m, k]``, ``w [g, k, n]``
    (``[g, n, k]``); rows past ``sum(group_sizes)`` zero."""
    _, plgpu = _fa._mods()
    m, k = x.shape
    groups = w.shape[0]
    n = w.shape[1] if transpose_rhs else w.shape[2]
    if m * n == 0 or groups == 0 or k == 0:
        return jnp.zeros((m, n), out_dtype)
    interpret = _env.use_interpreter()
    bn = min(cfg.block_n, 64 * cdiv(n, 64))
    # Hardware TMA clips ragged tiles, but its swizzled (8, 64) tiling needs array dims that are multiples
    # of the tiling (rows of 8, columns of 64) and boxes that fit the array; the interpreter's copies clamp
    # their starts, so it gets whole tiles.
    if interpret:
        mp, kp, np_ = cdiv(m, _BLOCK_M) * _BLOCK_M, cdiv(k, _BLOCK_K) * _BLOCK_K, cdiv(n, bn) * bn
    else:
        mp, kp, np_ = max(cdiv(m, 8) * 8, _BLOCK_M), cdiv(k, _BLOCK_K) * _BLOCK_K, max(cdiv(n, 64) * 64, bn)
    xp = _at_least(x, (mp, kp))
    wp = _at_least(w, (groups, np_, kp) if transpose_rhs else (groups, kp, np_))
    first, count, offs = _tile_groups(group_sizes, m)
    m_tiles, n_tiles = cdiv(mp, _BLOCK_M), cdiv(np_, bn)
    units = m_tiles * n_tiles
    ctas = min(units, _INTERPRET_CTAS if interpret else _sm_count())
    st = _Static(bn=bn, steps=cfg.max_concurrent_steps, k_steps=cdiv(kp, _BLOCK_K), m_tiles=m_tiles,
                 n_tiles=n_tiles, ctas=ctas, transpose_rhs=transpose_rhs, out_dtype=jnp.dtype(out_dtype),
                 interpret=interpret)
    if m_tiles > first.shape[0]:  # the padded rows of a short lhs meet no group
        extra = m_tiles - first.shape[0]
        first = jnp.concatenate([first, jnp.zeros((extra,), jnp.int32)])
        count = jnp.concatenate([count, jnp.zeros((extra,), jnp.int32)])
    kwargs: dict[str, Any] = {}
    if interpret:
        params = _fa.interpret_params()
        if params is None:
            raise RuntimeError("this jax has no Mosaic GPU interpret mode; run on a Hopper GPU")
        kwargs["interpret"] = params
    out: jax.Array = plgpu.kernel(
        functools.partial(_entry, st=st),
        out_type=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(ctas,),
        grid_names=("sm",),
        num_threads=_CONSUMERS + 1,
        thread_name="wg",
        **kwargs,
    )(first, count, offs, xp, wp)
    return out if (mp, np_) == (m, n) else out[:m, :n]


# ----------------------------------------------------------------------------------------------
# The registered functions
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: MosaicGroupedMatmulConfig | None, lhs: Any, rhs: Any, group_sizes: Any,
             out_dtype: Any) -> MosaicGroupedMatmulConfig:
    return heuristic_config(lhs, rhs, group_sizes, preferred_element_type=out_dtype) if cfg is None else cfg


def forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
            precision: str | tuple[str, str] = ("highest", "highest"),
            preferred_element_type: Any = None, cfg: MosaicGroupedMatmulConfig | None = None) -> jax.Array:
    """``[m, n]`` in ``preferred_element_type`` (``None``: ``lhs.dtype``): rows of group ``i`` times ``rhs[i]``,
    rows past ``sum(group_sizes)`` zero. ``precision`` changes nothing (16-bit products, float32 sums)."""
    del precision
    out_dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    return grouped_product(lhs, rhs, group_sizes, transpose_rhs=False, out_dtype=out_dtype,
                           cfg=_resolve(cfg, lhs, rhs, group_sizes, out_dtype))


def forward_with_residuals(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                           precision: str | tuple[str, str] = ("highest", "highest"),
                           preferred_element_type: Any = None,
                           cfg: MosaicGroupedMatmulConfig | None = None) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The output of :func:`forward` and the residuals ``(lhs, rhs, group_sizes)``."""
    out = forward(lhs, rhs, group_sizes, precision=precision, preferred_element_type=preferred_element_type, cfg=cfg)
    return out, (lhs, rhs, group_sizes)


def backward(residuals: tuple[jax.Array, ...], d_out: jax.Array, *, cfg: MosaicGroupedMatmulConfig | None = None,
             precision: str | tuple[str, str] = ("highest", "highest"),
             preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array, None]:
    """``(d lhs, d rhs, None)``: ``d lhs`` by this kernel (``rhs`` transposed in shared memory), ``d rhs`` by the
    Triton-lowered kernel's ``lhsᵀ · d out`` per group (its heuristic tiles)."""
    del preferred_element_type
    lhs, rhs, group_sizes = residuals
    d_out = d_out.astype(lhs.dtype)
    d_lhs = grouped_product(d_out, rhs, group_sizes, transpose_rhs=True, out_dtype=lhs.dtype,
                            cfg=_resolve(cfg, d_out, jnp.swapaxes(rhs, 1, 2), group_sizes, lhs.dtype))
    tl_cfg = _tl.heuristic_config(lhs, rhs, group_sizes)
    d_rhs = _tl._grouped_outer(lhs, d_out, group_sizes, rhs.shape[0], out_dtype=rhs.dtype, precision=precision,
                               cfg=tl_cfg)
    return cotangent_like(d_lhs, lhs), cotangent_like(d_rhs, rhs), None


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(lhs: Any, rhs: Any, group_sizes: Any, *, precision: Any = None,
               preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: bfloat16 / float16 ``lhs`` and ``rhs`` of one dtype, outputs in that dtype or float32,
    any sizes and group sizes (empty groups, rows past the sum; ``k`` or ``n`` not a multiple of 64 costs
    a padded copy of the operands). Needs a Hopper GPU (compute capability 9.0), except in interpret mode.
    """
    del precision
    why = _tl.gate_args(lhs, rhs, group_sizes, preferred_element_type)
    if why is not None:
        return why
    names = {jnp.dtype(lhs.dtype).name, jnp.dtype(rhs.dtype).name}
    if not names <= set(_DTYPES) or len(names) > 1:
        return f"lhs and rhs of dtypes {', '.join(sorted(names))} not supported (one of bfloat16, float16)"
    out = jnp.dtype(lhs.dtype if preferred_element_type is None else preferred_element_type).name
    if out not in _OUT_DTYPES:
        return f"preferred_element_type {out} not supported (bfloat16, float16 or float32)"
    k, n = int(lhs.shape[1]), int(rhs.shape[2])
    if int(lhs.shape[0]) * max(k, n) >= 2 ** 31:
        return "arrays of 2**31 elements or more not supported"
    return _fa.hopper_reason("wgmma_wait")


def smem_bytes(cfg: MosaicGroupedMatmulConfig, itemsize: int, out_itemsize: int) -> int:
    """Shared memory (bytes) of a config: the ring of ``lhs`` and ``rhs`` tiles and the epilogue's chunk slots."""
    ring = cfg.max_concurrent_steps * (_BLOCK_M + cfg.block_n) * _BLOCK_K * itemsize
    return ring + _CONSUMERS * 2 * _ROWS * _EPI_N * out_itemsize


#: (block_n, max_concurrent_steps), the heuristic's first; pruned by :func:`smem_bytes`.
_CANDIDATES = ((256, 4), (256, 3), (128, 6), (128, 5), (192, 4), (128, 4), (64, 8))


def _fitting(lhs: Any, out_dtype: Any) -> list[MosaicGroupedMatmulConfig]:
    itemsize, out_size = jnp.dtype(lhs.dtype).itemsize, jnp.dtype(out_dtype).itemsize
    configs = [MosaicGroupedMatmulConfig(block_n=n, max_concurrent_steps=s) for n, s in _CANDIDATES]
    return [c for c in configs if smem_bytes(c, itemsize, out_size) <= _SMEM_BUDGET]


def _out_dtype(lhs: Any, preferred_element_type: Any) -> Any:
    return lhs.dtype if preferred_element_type is None else preferred_element_type


def config_space(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                 **_: Any) -> list[MosaicGroupedMatmulConfig]:
    """Autotuning candidates pruned by :func:`smem_bytes`, the heuristic's first (one in interpret mode)."""
    if _env.use_interpreter():
        return [heuristic_config(lhs, rhs, group_sizes)]
    first = heuristic_config(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type)
    return [first, *(c for c in _fitting(lhs, _out_dtype(lhs, preferred_element_type)) if c != first)]


def heuristic_config(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                     **_: Any) -> MosaicGroupedMatmulConfig:
    """256 columns and a 4-slot ring (3 slots for float32 outputs, whose epilogue chunks take more shared
    memory); in interpret mode 64 columns and 2 slots (fewer simulated steps)."""
    del rhs, group_sizes
    if _env.use_interpreter():
        return MosaicGroupedMatmulConfig(block_n=64, max_concurrent_steps=2)
    return _fitting(lhs, _out_dtype(lhs, preferred_element_type))[0]
