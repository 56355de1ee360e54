"""``grouped_matmul`` (mixture of experts) for Hopper, written with Pallas's Mosaic GPU backend (``plgpu``).

The kernel of :mod:`ejk_pallas._matmul_mgpu` (persistent, warp-specialised: a memory warpgroup feeding a TMA
ring, two compute warpgroups with warpgroup MMA, chunked TMA-store epilogue) walked over a *work list* instead
of a dense tile grid. Each group's rows are cut into 128-row tiles from the group's own first row (rounded
down to a multiple of 8, which TMA's swizzled tiling needs), so a group's tiles are whole but its last and
sometimes a few rows of its first (about ``sum(cdiv(size, 128))`` tiles in all, against up to twice as many
partial ones for tiles aligned to multiples of 128); a partial tile still multiplies 128 rows (TMA reads
whatever is there) and stores only its group's. The persistent CTAs walk (item, column tile) pairs in a
banded snake order. Empty groups have no item (they cost nothing); rows past ``sum(group_sizes)`` form a last
pseudo-group whose items store zeros without any MMA; list entries past the real item count are skipped.

Stores: a compute warpgroup whose rows all belong to the item's group stores its share chunk by chunk through
its swizzled chunk slot (one, not the dense kernel's two: the shared memory goes to a fourth ring slot, which
pays more while ``rhs`` streams from HBM). One whose rows pass the group's end stores its 64x64 chunks one by
one: a chunk wholly in the group through the swizzled slot, one partly in it through an unswizzled slot in a ladder
of TMA stores of 32, 16, ..., 1 rows (TMA boxes are static; any row count is a sum of powers of two), so no
visit writes another group's rows. With the tile split by rows (``split="m"``), a warpgroup whose 64 rows miss
the group skips its MMAs.

``transpose_rhs`` multiplies by ``rhs[g]ᵀ`` (``rhs`` read as ``[g, n, k]`` tiles, the MMA taking them
transposed from shared memory): the backward's ``d lhs = d out · rhs[g]ᵀ``. ``d rhs = lhs_gᵀ · d out_g`` comes
from :mod:`ejk_pallas._grouped_outer_mgpu` (the same kernel contracting over each group's rows).

When the contraction's step count is a multiple of the ring's slots, each CTA chains the pipelines of its
visits (``pipeline_state``): the memory warpgroup loads the next visit's first slices while the compute
warpgroups still store the last one, instead of the ring draining at every visit.

TMA fills out-of-bounds loads with zeros and clips stores, so ragged sizes need no masking; the swizzled
tiling needs ``k`` and ``n`` to be multiples of 64 and ``m`` of 8 (at least one tile each): other sizes are
padded (a copy of the operand). With ``EJK_PALLAS_INTERPRET=1`` on a CPU the same kernel runs in Pallas's
Mosaic GPU interpret mode (whole tiles; ``rhs`` transposed by a copy there, whose MMA takes no transposed
operand).
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import GROUPED_MATMUL_RESIDUALS, cdiv, devices, int_in, one_of, one_of_str, operand_vjp
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as _fa
from ejk_pallas import _grouped_matmul as _tl
from ejk_pallas import _matmul_mgpu as _mm
from ejk_pallas._group_metadata import offsets
from ejk_pallas._grouped_outer_mgpu import grouped_outer
from ejk_pallas._mm import pad_to

__all__ = [
    "MosaicGroupedMatmulConfig",
    "capability",
    "config_space",
    "forward",
    "gradients",
    "grouped_product",
    "heuristic_config",
    "smem_bytes",
    "vjp",
]

#: Rows of a tile (the work list's row tiles).
_BLOCK_M = 128
_BLOCK_K = _mm._BLOCK_K
_EPI = _mm._EPI
#: Hopper's opt-in shared memory per block, less the barriers and the buffers' alignment.
_SMEM_BUDGET = _mm._SMEM_BUDGET
#: CTAs in interpret mode: two, so the persistent loop's stride is exercised.
_INTERPRET_CTAS = 2


@attrs.frozen(kw_only=True)
class MosaicGroupedMatmulConfig:
    """Tiles and schedule of the Mosaic GPU grouped matmul (128 rows a tile, 64 a contraction step).

    Attributes:
        block_n: Output columns per tile.
        split: How the two compute warpgroups share a tile: ``"m"`` (64 rows each) or ``"n"`` (half the
            columns each, at least 64); a half holds at most 128x128 float32 accumulators.
        stages: Shared-memory slots of the TMA ring.
        cluster: ``"m"``: CTA pairs take two row tiles of one group at one column tile and share its ``rhs``
            slices (TMA multicast: each CTA reads half of them from L2; a group with an odd tile count pairs its
            last tile with an empty one); ``"n"``: CTA pairs take neighbouring column tiles of one item and share
            its ``lhs`` slices; ``"none"``: no cluster.
        band: Width of the snake's bands, in column tiles (or tile pairs).
    """

    block_n: int = attrs.field(default=256, validator=one_of(64, 128, 192, 256))
    split: str = attrs.field(default="n", validator=one_of_str("m", "n"))
    cluster: str = attrs.field(default="none", validator=one_of_str("none", "m", "n"))
    stages: int = attrs.field(default=3, validator=int_in(2, 8))
    band: int = attrs.field(default=8, validator=one_of(1, 2, 4, 8, 16, 32))

    def __attrs_post_init__(self) -> None:
        wm, wn = self.warpgroup_tile
        if wn < 64 or wm * wn > _mm._MAX_ACC:
            raise ValueError(
                f"block_n {self.block_n} split along {self.split} gives each compute warpgroup {wm}x{wn}: it needs "
                "at least 64 columns and at most 128x128 (accumulator registers); split the other way")

    @property
    def warpgroup_tile(self) -> tuple[int, int]:
        """``(rows, columns)`` of one compute warpgroup's share of a tile."""
        return (_BLOCK_M // 2, self.block_n) if self.split == "m" else (_BLOCK_M, self.block_n // 2)


@attrs.frozen(kw_only=True)
class _Static:
    """What the kernel body needs that is known when tracing."""

    cfg: MosaicGroupedMatmulConfig
    groups: int
    items: int  # the work list's static length (item pairs with cluster "m")
    n_tiles: int  # column tiles (tile pairs with a cluster)
    k_steps: int
    chained: bool  # one chained pipeline per CTA (needs k_steps a multiple of the ring's slots)
    transpose_rhs: bool
    out_dtype: Any


def _ladder_store(slot: Any, dst: Any, start: Any, count: Any) -> None:
    """Store rows ``[start, start + count)`` of the unswizzled 64-row ``slot`` to the same rows of ``dst``, as TMA
    stores of 64, 32, ..., 1 rows (one per set bit of ``count``)."""
    pl, plgpu = _fa._mods()
    size = _EPI[0]
    while size >= 1:
        def store(size: int = size, start: Any = start) -> None:
            plgpu.copy_smem_to_gmem(slot.at[pl.ds(start, size)], dst.at[pl.ds(start, size)])

        pl.when((count & size) != 0)(store)
        start = start + (count & size)
        size //= 2


def _store_rows(acc: Any, slots: Any, part: Any, dst: Any, first: Any, lo: Any, hi: Any) -> None:
    """Store the rows ``[lo, hi)`` (absolute) of a compute warpgroup's ``acc``, whose row 0 is row ``first``, to
    ``dst`` (the gmem view of its share): whole through ``slots`` when every row is in range; else chunk by chunk,
    a chunk wholly in range through a swizzled slot, one partly in range through the unswizzled slot ``part``
    in a ladder."""
    pl, plgpu = _fa._mods()
    rows = acc.shape[0]
    whole = (lo <= first) & (hi >= first + rows)
    pl.when(whole)(lambda: _mm.store_tile(acc, slots, dst))

    @pl.when(jnp.logical_not(whole))  # type: ignore[untyped-decorator]
    def _by_chunk() -> None:
        for er, ec in _mm.chunks(*acc.shape):
            top = first + er.start
            start = jnp.clip(lo - top, 0, _EPI[0])
            stop = jnp.clip(hi - top, 0, _EPI[0])
            full = (start == 0) & (stop == _EPI[0])

            @pl.when(full)  # type: ignore[untyped-decorator]
            def _full(er: slice = er, ec: slice = ec) -> None:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the slot's earlier stores have left it
                slots.at[0][...] = acc[er, ec]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(slots.at[0], dst.at[er, ec])

            @pl.when((stop > start) & jnp.logical_not(full))  # type: ignore[untyped-decorator]
            def _rows(er: slice = er, ec: slice = ec, start: Any = start, stop: Any = stop) -> None:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                part[...] = acc[er, ec]
                plgpu.commit_smem()
                _ladder_store(part, dst.at[er, ec], start, stop - start)


def _kernel(group_ref: Any, start_ref: Any, stop_ref: Any, count_ref: Any, x_gmem: Any, w_gmem: Any, out_gmem: Any,
            *, st: _Static) -> None:
    pl, plgpu = _fa._mods()
    cfg = st.cfg
    wm, wn = cfg.warpgroup_tile
    bm, bn, bk = _BLOCK_M, cfg.block_n, _BLOCK_K
    in_transforms = _mm._transforms(x_gmem.dtype, bk * jnp.dtype(x_gmem.dtype).itemsize)
    a_spec = plgpu.BlockSpec((bm, bk), lambda k: (0, k), transforms=in_transforms, memory_space=plgpu.SMEM,
                             collective_axes=("cluster",) if cfg.cluster == "n" else ())
    b_spec = plgpu.BlockSpec((bn, bk) if st.transpose_rhs else (bk, bn),
                             (lambda k: (0, k)) if st.transpose_rhs else (lambda k: (k, 0)),
                             transforms=in_transforms, memory_space=plgpu.SMEM,
                             collective_axes=("cluster",) if cfg.cluster == "m" else ())
    pipeline = _mm.warp_specialized(a_spec, b_spec, st.k_steps, cfg.stages)
    b0 = w_gmem.at[0, :bn, :bk] if st.transpose_rhs else w_gmem.at[0, :bk, :bn]
    part_smem = plgpu.SMEM((2, *_EPI), st.out_dtype)  # unswizzled: sliced at any row

    def scope(allocations: Any, out_smem: Any, part_smem: Any) -> None:
        wg = lax.axis_index("wg")
        pair_items = 2 if cfg.cluster == "m" else 1
        multiplied, total = count_ref[0] // pair_items, count_ref[1] // pair_items  # real groups' items; all
        wg_rows = pl.ds(wg * wm, wm) if cfg.split == "m" else slice(None)
        wg_cols = pl.ds(wg * wn, wn) if cfg.split == "n" else slice(None)

        def visit(item: Any, j: Any) -> tuple[Any, ...]:
            """``(group, lo, hi, row0, column tile, first row, store)`` of this CTA's share of a visit (an item or
            item pair at a column tile or tile pair)."""
            if cfg.cluster == "n":  # both CTAs of a pair visit the same items (the multicast needs both)
                j = j * 2 + lax.axis_index("cluster")
            elif cfg.cluster == "m":  # both CTAs of a pair visit the same column tile of one group's two items
                item = item * 2 + lax.axis_index("cluster")
            g, lo, hi = group_ref[item], start_ref[item], stop_ref[item]
            row0 = lax.div(lo, 8) * 8  # the tile's first row (TMA's swizzled tiling: rows of 8)
            first = row0 + wg * wm if cfg.split == "m" else row0
            dst = out_gmem.at[pl.ds(row0, bm), pl.ds(j * bn, bn)].at[wg_rows, wg_cols]

            def store(acc: Any) -> None:
                _store_rows(acc, out_smem.at[wg], part_smem.at[wg], dst, first, lo, hi)

            return g, lo, hi, row0, j, first, store

        @plgpu.nd_loop((multiplied * st.n_tiles,), collective_axes="cluster_grid")  # type: ignore[untyped-decorator]
        def _multiply(info: Any) -> None:
            (lin,) = info.index
            g, lo, hi, row0, j, first, store = visit(*_mm.snake(lin, multiplied, st.n_tiles, cfg.band))

            def mma(_: Any, a_smem: Any, b_smem: Any, acc_ref: Any) -> Any:
                b_op = b_smem.at[wg_cols].transpose((1, 0)) if st.transpose_rhs else b_smem.at[:, wg_cols]

                def multiply() -> None:
                    plgpu.wgmma(acc_ref, a_smem.at[wg_rows], b_op)
                    plgpu.wgmma_wait(0)

                # A warpgroup whose rows miss the group (an empty item: all of them) has nothing to multiply.
                pl.when((hi > jnp.maximum(lo, first)) & (lo < first + wm))(multiply)
                return acc_ref

            def context(run_pipeline: Any) -> None:
                def with_acc(acc_ref: Any) -> None:
                    run_pipeline(acc_ref)
                    store(acc_ref[...].astype(st.out_dtype))

                pl.run_scoped(with_acc, plgpu.ACC((wm, wn), jnp.float32))

            cols = pl.ds(j * bn, bn)
            b_src = w_gmem.at[g, cols, :] if st.transpose_rhs else w_gmem.at[g, :, cols]

            def run(state: Any) -> None:
                pipeline(mma, context, state)(x_gmem.at[pl.ds(row0, bm), :], b_src, allocations=allocations)

            if not st.chained:
                run(None)
                return
            # One chained pipeline per CTA: the memory warpgroup loads the next visit's first slices while the
            # compute warpgroups finish this one (a lone visit runs unchained).
            start, stop = info.local_index == 0, info.local_index == info.num_local_steps - 1
            pl.when(start & stop)(lambda: run(None))
            chain = plgpu.PipelinePipeline
            state = jnp.where(start, int(chain.START), jnp.where(stop, int(chain.STOP), int(chain.STEADY)))
            pl.when(jnp.logical_not(start & stop))(lambda: run(state))

        @plgpu.nd_loop(((total - multiplied) * st.n_tiles,), collective_axes="cluster_grid")  # type: ignore[untyped-decorator]
        def _zeros(info: Any) -> None:  # rows past the sum: no MMA
            (lin,) = info.index
            *_, store = visit(multiplied + lax.div(lin, st.n_tiles), lax.rem(lin, st.n_tiles))
            pl.when(wg < 2)(lambda: store(jnp.zeros((wm, wn), st.out_dtype)))

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(scope, pipeline(_mm._ignore, _mm._ignore).get_allocations(x_gmem.at[:bm, :bk], b0),
                  _mm.epilogue_smem(st.out_dtype, slots=1), part_smem,
                  collective_axes="wg")


def _tiles(group_sizes: jax.Array, m: int, pair: int = 1) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The work list: ``(group, start, stop, count)``. Item ``i`` covers rows ``start[i]:stop[i]`` of group
    ``group[i]``, inside the 128-row tile starting at ``start[i] // 8 * 8``: each group's rows are cut into tiles
    from its first row rounded down to a multiple of 8, and the rows past ``sum(group_sizes)`` form a last
    pseudo-group ``g`` (zeros), listed last. With ``pair = 2`` (CTA pairs sharing ``rhs``) each group's item
    count is rounded up to even with an empty item (``start == stop``, both at the group's end), so the two
    items of a pair always share a group. ``count`` (``[2]``): the real groups' items, then all real items; the
    static length bounds them (each group adds at most two tiles, its rounded-down head and its tail, and
    ``pair - 1`` empty items)."""
    groups = group_sizes.shape[0]
    offs = offsets(group_sizes, m)  # [g + 2]: the pseudo-group's rows end at m
    sizes = offs[1:] - offs[:-1]
    first_row = offs[:-1] // 8 * 8  # tiles start on rows of 8 (TMA's swizzled tiling)
    per_group = jnp.where(sizes > 0, (offs[1:] - first_row + _BLOCK_M - 1) // _BLOCK_M, 0)
    slots = (per_group + pair - 1) // pair * pair
    ends = jnp.cumsum(slots).astype(jnp.int32)  # [g + 1]
    bound = cdiv(cdiv(m, _BLOCK_M) + (1 + pair) * (groups + 1), pair) * pair
    i = jnp.arange(bound, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(ends, i, side="right"), groups).astype(jnp.int32)
    tile_row = first_row[group] + (i - (ends[group] - slots[group])) * _BLOCK_M
    end = offs[group + 1]
    start = jnp.minimum(jnp.maximum(tile_row, offs[group]), end)
    stop = jnp.minimum(tile_row + _BLOCK_M, end)
    return group, start.astype(jnp.int32), stop.astype(jnp.int32), ends[-2:]


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
    if interpret and cfg.cluster != "none":
        raise ValueError(f"{cfg} runs in clusters, which Pallas's Mosaic GPU interpret mode lacks; use cluster='none'")
    if interpret and transpose_rhs:  # the interpreter's MMA takes no transposed operand: transpose a copy
        w, transpose_rhs = jnp.swapaxes(w, 1, 2), False
    bn = cfg.block_n
    kp = cdiv(k, _BLOCK_K) * _BLOCK_K
    if interpret:  # its copies raise past the array: a whole tile past every row (tiles start at any row)
        mp, np_ = cdiv(m, _BLOCK_M) * _BLOCK_M + _BLOCK_M, cdiv(n, bn) * bn
    else:  # the swizzled tiling wants rows of 8 and columns of 64, and every TMA box inside the array
        mp, np_ = max(cdiv(m, 8) * 8, _BLOCK_M), max(cdiv(n, 64) * 64, bn)
    xp = pad_to(x, (mp, kp))
    wp = pad_to(w, (groups, np_, kp) if transpose_rhs else (groups, kp, np_))
    pair_m, pair_n = (2 if cfg.cluster == "m" else 1), (2 if cfg.cluster == "n" else 1)
    pair = pair_m * pair_n
    group, start, stop, count = _tiles(group_sizes, m, pair_m)
    st = _Static(cfg=cfg, groups=groups, items=int(group.shape[0]) // pair_m,
                 n_tiles=cdiv(cdiv(np_, bn), pair_n), k_steps=kp // _BLOCK_K,
                 chained=(kp // _BLOCK_K) % cfg.stages == 0,
                 transpose_rhs=transpose_rhs, out_dtype=jnp.dtype(out_dtype))
    clusters = min(st.items * st.n_tiles, _INTERPRET_CTAS if interpret else devices.sm_count() // pair)
    kwargs: dict[str, Any] = {"interpret": _fa.interpret_params()} if interpret else {}
    out: jax.Array = plgpu.kernel(
        functools.partial(_kernel, st=st),
        out_type=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(clusters,),
        grid_names=("cluster_grid",),
        cluster=(pair,),
        cluster_names=("cluster",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        **kwargs,
    )(group, start, stop, count, xp, wp)
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


def gradients(operands: tuple[jax.Array, ...], d_out: jax.Array, *, cfg: MosaicGroupedMatmulConfig | None = None,
              precision: str | tuple[str, str] = ("highest", "highest"),
              preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array, None]:
    """``(d lhs, d rhs, None)``: ``d lhs`` by this kernel (``rhs`` transposed in shared memory), ``d rhs`` by
    :func:`ejk_pallas._grouped_outer_mgpu.grouped_outer` (its heuristic tiles)."""
    del preferred_element_type, precision
    lhs, rhs, group_sizes = operands
    d_out = d_out.astype(lhs.dtype)
    d_lhs = grouped_product(d_out, rhs, group_sizes, transpose_rhs=True, out_dtype=lhs.dtype,
                            cfg=_resolve(cfg, d_out, jnp.swapaxes(rhs, 1, 2), group_sizes, lhs.dtype))
    d_rhs = grouped_outer(lhs, d_out, group_sizes, rhs.shape[0], out_dtype=rhs.dtype)
    return d_lhs, d_rhs, None


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, GROUPED_MATMUL_RESIDUALS)


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
    why = _mm.dtype_reason(("lhs", "rhs"), lhs, rhs, preferred_element_type)
    if why is not None:
        return why
    k, n = int(lhs.shape[1]), int(rhs.shape[2])
    if int(lhs.shape[0]) * max(k, n) >= 2 ** 31:
        return "arrays of 2**31 elements or more not supported"
    return _fa.hopper_reason(*_mm.PLGPU_API)


def smem_bytes(cfg: MosaicGroupedMatmulConfig, itemsize: int, out_itemsize: int) -> int:
    """Shared memory (bytes) of a config: the TMA ring, one swizzled chunk slot and one unswizzled per compute
    warpgroup."""
    ring = cfg.stages * (_BLOCK_M + cfg.block_n) * _BLOCK_K * itemsize
    return ring + 2 * 2 * _EPI[0] * _EPI[1] * out_itemsize


#: (block_n, split, cluster, band), the heuristic's first; each with the deepest ring (<= 6) that fits.
_TILES = ((256, "m", "m", 8), (256, "n", "m", 8), (256, "n", "none", 2), (256, "m", "none", 2), (256, "n", "none", 8),
          (256, "n", "m", 2), (256, "n", "n", 2), (256, "m", "n", 8), (128, "n", "none", 8), (128, "n", "n", 8),
          (192, "m", "none", 8), (64, "m", "none", 8))


def _fitting(lhs: Any, out_dtype: Any, clusters: bool = True) -> list[MosaicGroupedMatmulConfig]:
    itemsize, out_size = jnp.dtype(lhs.dtype).itemsize, jnp.dtype(out_dtype).itemsize
    found = []
    for block_n, split, cluster, band in _TILES:
        if cluster != "none" and not clusters:
            continue
        fits = [s for s in range(2, 7)
                if smem_bytes(MosaicGroupedMatmulConfig(block_n=block_n, split=split, stages=s), itemsize,
                              out_size) <= _SMEM_BUDGET]
        if fits:
            found.append(MosaicGroupedMatmulConfig(block_n=block_n, split=split, cluster=cluster, stages=max(fits),
                                                   band=band))
    return found


def _out_dtype(lhs: Any, preferred_element_type: Any) -> Any:
    return lhs.dtype if preferred_element_type is None else preferred_element_type


def config_space(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                 **_: Any) -> list[MosaicGroupedMatmulConfig]:
    """Autotuning candidates (tiles, each with the deepest ring that fits), the heuristic's first (one in
    interpret mode)."""
    first = heuristic_config(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type)
    if _env.use_interpreter():
        return [first]
    return [first, *(c for c in _fitting(lhs, _out_dtype(lhs, preferred_element_type)) if c != first)]


def heuristic_config(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                     **_: Any) -> MosaicGroupedMatmulConfig:
    """128x256 tiles split by rows between the compute warpgroups, CTA pairs sharing ``rhs`` (fastest on the
    H100 for 8 experts of 2048 rows and 256 experts of 512, forward and ``d lhs``:
    ``benchmarks/results/grouped_matmul_moe_h100.md``), the deepest ring that fits (4 slots for 16-bit
    outputs); in interpret mode (no clusters there) 64 columns, 64 rows a warpgroup and 2 slots (fewer
    simulated steps)."""
    del rhs, group_sizes
    if _env.use_interpreter():
        return MosaicGroupedMatmulConfig(block_n=64, split="m", cluster="none", stages=2)
    return _fitting(lhs, _out_dtype(lhs, preferred_element_type))[0]
