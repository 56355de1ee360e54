"""``matmul`` for Hopper, written with Pallas's Mosaic GPU backend (``plgpu``), forward and backward.

A persistent, warp-specialised kernel. The grid holds as many CTAs (or CTA pairs, with a cluster) as the
GPU has SMs; each walks the output tiles ``[block_m, block_n]`` of every batch in a banded snake order
(:func:`snake`: ``band`` tiles wide, so neighbouring tiles share rows of ``a`` and columns of
``b`` in L2). A CTA runs three warpgroups, built by ``plgpu.emit_pipeline_warp_specialized``:

* a memory warpgroup that streams the tile's ``[block_m, 64]`` slice of ``a`` and ``[64, block_n]`` slice
  of ``b`` for each contraction step into a ring of ``stages`` shared-memory slots by TMA; with a cluster
  of two CTAs along M (``cluster="m"``) the pair shares ``b``'s slice, loaded once and multicast to both
  (``"n"``: ``a``'s slice), so each CTA reads half of it from L2;
* two compute warpgroups that split the tile along M or N (``split``) and accumulate their half with
  warpgroup MMA (float32 registers), then store it through shared memory by TMA in 64x64 chunks (two slots
  each, so converting one chunk overlaps the store of the last) while the memory warpgroup already loads
  the next tile's slices.

Operands may be read transposed in place (``a`` as ``[k, m]``, ``b`` as ``[n, k]``: the MMA takes either
majorness from shared memory), so the backward's ``d a = d c · bᵀ`` and ``d b = aᵀ · d c`` run through the
same kernel (``_matmul_shapes`` maps ``jnp.matmul`` shapes). TMA zero-fills loads past the array and clips
stores, so ragged edges need no masks; its 128-byte swizzle needs ``k`` and ``n`` to be multiples of 64 and
``m`` of 8, and the arrays at least one block each: other sizes are zero-padded (a copy).

With ``EJK_PALLAS_INTERPRET=1`` on a CPU the kernel runs in Pallas's Mosaic GPU interpret mode, which has no
clusters (there only ``cluster="none"`` configs run) and whose MMA takes no transposed operand (there the
backward transposes a copy of the operand first).
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import MATMUL_RESIDUALS, cdiv, devices, int_in, one_of, one_of_str, operand_vjp
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as _fa
from ejk_pallas._matmul_shapes import matmul_backward, matmul_forward, shapes
from ejk_pallas._mm import pad_to

__all__ = [
    "MosaicMatmulConfig",
    "capability",
    "config_space",
    "forward",
    "gradients",
    "heuristic_config",
    "smem_bytes",
    "vjp",
]

#: The contraction step: one 128-byte swizzle row of 16-bit elements.
_BLOCK_K = 64
#: Epilogue chunks (rows, columns), two slots per compute warpgroup.
_EPI = (64, 64)
#: Registers per thread of the memory warpgroup (the compute ones share the rest).
_MEMORY_REGISTERS = 40
#: Hopper's opt-in shared memory per block (227 KiB), less the barriers and the buffers' 1 KiB alignment.
_SMEM_BUDGET = 227 * 1024 - 3 * 1024
_DTYPES = ("bfloat16", "float16")
_OUT_DTYPES = ("bfloat16", "float16", "float32")
#: CTAs in interpret mode: two, so the persistent loop's stride is exercised.
_INTERPRET_CTAS = 2
#: The ``plgpu`` names the matmul kernels use beyond the common ones (their gates check this jax has them).
PLGPU_API = ("wgmma_wait", "emit_pipeline_warp_specialized", "nd_loop", "find_swizzle")
#: Largest float32 accumulator of one compute warpgroup (elements): 128 registers a thread.
_MAX_ACC = 128 * 128


@attrs.frozen(kw_only=True)
class MosaicMatmulConfig:
    """Tiles and schedule of the Mosaic GPU matmul (the contraction step is 64).

    Attributes:
        block_m: Rows of a CTA's output tile.
        block_n: Columns of a CTA's output tile.
        split: How the two compute warpgroups share the tile: ``"m"`` (each takes half the rows) or
            ``"n"`` (half the columns). A half is 64 or 128 rows by 64 to 256 columns, at most 128x128.
        cluster: ``"m"``: CTA pairs along M share ``b``'s slices (TMA multicast); ``"n"``: pairs along N
            share ``a``'s; ``"none"``: no cluster.
        stages: Shared-memory slots of the TMA ring.
        order: The tile walk's fast dimension (``"n"``: along a row of tiles first).
        band: Width of the snake's bands, in tiles (or tile pairs).
    """

    block_m: int = attrs.field(default=128, validator=one_of(64, 128, 256))
    block_n: int = attrs.field(default=256, validator=one_of(64, 128, 256))
    split: str = attrs.field(default="n", validator=one_of_str("m", "n"))
    cluster: str = attrs.field(default="m", validator=one_of_str("none", "m", "n"))
    stages: int = attrs.field(default=4, validator=int_in(2, 8))
    order: str = attrs.field(default="n", validator=one_of_str("m", "n"))
    band: int = attrs.field(default=16, validator=one_of(1, 2, 4, 8, 16, 32))

    def __attrs_post_init__(self) -> None:
        wm, wn = self.warpgroup_tile
        if wm not in (64, 128) or wn < 64 or wm * wn > _MAX_ACC:
            raise ValueError(
                f"block {self.block_m}x{self.block_n} split along {self.split} gives each compute warpgroup "
                f"{wm}x{wn}: it needs 64 or 128 rows, at least 64 columns and at most 128x128 (accumulator "
                "registers); split the other way or change the block")

    @property
    def warpgroup_tile(self) -> tuple[int, int]:
        """``(rows, columns)`` of one compute warpgroup's share of the tile."""
        if self.split == "m":
            return self.block_m // 2, self.block_n
        return self.block_m, self.block_n // 2


@attrs.frozen(kw_only=True)
class _Static:
    """What the kernel body needs that is known when tracing."""

    cfg: MosaicMatmulConfig
    z: int
    m_iters: int  # tile (pairs) along M and N
    n_iters: int
    k_steps: int
    ta: bool
    tb: bool
    out_dtype: Any


def _transforms(dtype: Any, row_bytes: int) -> tuple[Any, ...]:
    _, plgpu = _fa._mods()
    swizzle = plgpu.find_swizzle(row_bytes * 8)
    return plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(swizzle)


def _ignore(*_: Any, **__: Any) -> None:
    return None


def warp_specialized(a_spec: Any, b_spec: Any, k_steps: int, stages: int) -> Any:
    """``(mma_body, compute_context, state=None) -> pipeline``: the contraction's TMA ring over ``k_steps`` steps,
    fed by a memory warpgroup to two compute warpgroups (``plgpu.emit_pipeline_warp_specialized``; ``state``:
    its ``pipeline_state``, to chain the pipelines of consecutive tiles)."""
    _, plgpu = _fa._mods()

    def pipeline(body: Any, context: Any, state: Any = None) -> Any:
        return plgpu.emit_pipeline_warp_specialized(
            body, grid=(k_steps,), memory_registers=_MEMORY_REGISTERS, in_specs=[a_spec, b_spec], wg_axis="wg",
            num_compute_wgs=2, max_concurrent_steps=stages, compute_context=context, pipeline_state=state)

    return pipeline


def snake(lin: Any, rows: Any, cols: int, band: int) -> tuple[Any, Any]:
    """``(row, column)`` of the ``lin``-th tile of a ``[rows, cols]`` grid walked in bands of ``band`` columns, down
    one band and up the next (``plgpu.planar_snake`` along columns, whose last, narrower band may not be empty:
    jax's version divides by that band's width, which traps on a CPU when ``band`` divides ``cols``)."""
    band_size = band * rows
    first = lax.div(lin, band_size) * band
    width = jnp.minimum(band, cols - first)
    within = lin - first * rows
    down = lax.div(within, width)
    row = jnp.where(lax.rem(lax.div(first, band), 2) == 0, down, rows - 1 - down)
    return row, first + lax.rem(within, width)


def chunks(rows: int, cols: int) -> list[tuple[slice, slice]]:
    """The epilogue's ``_EPI`` chunks of a ``[rows, cols]`` tile, row by row."""
    er, ec = _EPI
    return [(slice(r, r + er), slice(c, c + ec)) for r in range(0, rows, er) for c in range(0, cols, ec)]


def epilogue_smem(out_dtype: Any, slots: int = 2) -> Any:
    """``slots`` swizzled ``_EPI`` chunk slots per compute warpgroup, ``[2, slots, 64, 64]``."""
    _, plgpu = _fa._mods()
    row_bytes = _EPI[1] * jnp.dtype(out_dtype).itemsize
    return plgpu.SMEM((2, slots, *_EPI), out_dtype, transforms=_transforms(out_dtype, row_bytes))


def store_tile(acc: Any, slots: Any, dst: Any) -> None:
    """Store a compute warpgroup's ``acc`` (its output dtype) to the gmem view ``dst`` by TMA, chunk by chunk
    through its ``slots`` taken in turn (with two, a chunk's conversion overlaps the store of the one before)."""
    _, plgpu = _fa._mods()
    count = slots.shape[0]
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last tile's chunks have left
    for i, (er, ec) in enumerate(chunks(*acc.shape)):
        slot = slots.at[i % count]
        plgpu.wait_smem_to_gmem(count - 1, wait_read_only=True)  # the slot's last chunk has left it
        slot[...] = acc[er, ec]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(slot, dst.at[er, ec])


def _kernel(a_gmem: Any, b_gmem: Any, out_gmem: Any, *, st: _Static) -> None:
    pl, plgpu = _fa._mods()
    cfg = st.cfg
    wm, wn = cfg.warpgroup_tile
    bm, bn, bk = cfg.block_m, cfg.block_n, _BLOCK_K
    itemsize = jnp.dtype(a_gmem.dtype).itemsize
    in_transforms = _transforms(a_gmem.dtype, bk * itemsize)
    # A slice of `a` is [bm, bk] ([bk, bm] read transposed); of `b` [bk, bn] ([bn, bk]).
    a_spec = plgpu.BlockSpec((bk, bm) if st.ta else (bm, bk), (lambda k: (k, 0)) if st.ta else (lambda k: (0, k)),
                             transforms=in_transforms, memory_space=plgpu.SMEM,
                             collective_axes=("cluster",) if cfg.cluster == "n" else ())
    b_spec = plgpu.BlockSpec((bn, bk) if st.tb else (bk, bn), (lambda k: (0, k)) if st.tb else (lambda k: (k, 0)),
                             transforms=in_transforms, memory_space=plgpu.SMEM,
                             collective_axes=("cluster",) if cfg.cluster == "m" else ())

    pipeline = warp_specialized(a_spec, b_spec, st.k_steps, cfg.stages)
    a0 = a_gmem.at[0, :bk, :bm] if st.ta else a_gmem.at[0, :bm, :bk]
    b0 = b_gmem.at[0, :bn, :bk] if st.tb else b_gmem.at[0, :bk, :bn]

    def scope(allocations: Any, out_smem: Any) -> None:
        wg = lax.axis_index("wg")
        in_pair = lax.axis_index("cluster")
        per_batch = st.m_iters * st.n_iters

        @plgpu.nd_loop((st.z * per_batch,), collective_axes="cluster_grid")  # type: ignore[untyped-decorator]
        def _tile(info: Any) -> None:
            (lin,) = info.index
            z = lax.div(lin, per_batch)
            if cfg.order == "n":
                mi, ni = snake(lax.rem(lin, per_batch), st.m_iters, st.n_iters, cfg.band)
            else:
                ni, mi = snake(lax.rem(lin, per_batch), st.n_iters, st.m_iters, cfg.band)
            if cfg.cluster == "m":
                mi = mi * 2 + in_pair
            elif cfg.cluster == "n":
                ni = ni * 2 + in_pair
            rows, cols = pl.ds(mi * bm, bm), pl.ds(ni * bn, bn)
            # This warpgroup's share of the tile, in the tile's own coordinates.
            wg_rows = pl.ds(wg * wm, wm) if cfg.split == "m" else slice(None)
            wg_cols = pl.ds(wg * wn, wn) if cfg.split == "n" else slice(None)

            def mma(_: Any, a_smem: Any, b_smem: Any, acc_ref: Any) -> Any:
                a_op = a_smem.at[:, wg_rows].transpose((1, 0)) if st.ta else a_smem.at[wg_rows]
                b_op = b_smem.at[wg_cols].transpose((1, 0)) if st.tb else b_smem.at[:, wg_cols]
                plgpu.wgmma(acc_ref, a_op, b_op)
                plgpu.wgmma_wait(0)
                return acc_ref

            def context(run_pipeline: Any) -> None:
                def with_acc(acc_ref: Any) -> None:
                    run_pipeline(acc_ref)
                    store_tile(acc_ref[...].astype(st.out_dtype), out_smem.at[wg],
                               out_gmem.at[z, rows, cols].at[wg_rows, wg_cols])

                pl.run_scoped(with_acc, plgpu.ACC((wm, wn), jnp.float32))

            a_src = a_gmem.at[z, :, rows] if st.ta else a_gmem.at[z, rows, :]
            b_src = b_gmem.at[z, cols, :] if st.tb else b_gmem.at[z, :, cols]
            pipeline(mma, context)(a_src, b_src, allocations=allocations)

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(scope, pipeline(_ignore, _ignore).get_allocations(a0, b0), epilogue_smem(st.out_dtype),
                  collective_axes="wg")


def product(x: jax.Array, y: jax.Array, *, ta: bool = False, tb: bool = False, out_dtype: Any,
            cfg: MosaicMatmulConfig) -> jax.Array:
    """``[Z, m, n]``: ``x [Z, m, k]`` (``[Z, k, m]``: ``ta``) times ``y [Z, k, n]`` (``[Z, n, k]``: ``tb``)."""
    _, plgpu = _fa._mods()
    z = x.shape[0]
    m, k = (x.shape[2], x.shape[1]) if ta else x.shape[1:]
    n = y.shape[1] if tb else y.shape[2]
    if z * m * n == 0 or k == 0:
        return jnp.zeros((z, m, n), out_dtype)
    interpret = _env.use_interpreter()
    if interpret and cfg.cluster != "none":
        raise ValueError(f"{cfg} runs in clusters, which Pallas's Mosaic GPU interpret mode lacks; use cluster='none'")
    if interpret and (ta or tb):  # the interpreter's MMA takes no transposed operand: transpose a copy
        x, y = (jnp.swapaxes(x, 1, 2) if ta else x), (jnp.swapaxes(y, 1, 2) if tb else y)
        ta = tb = False
    pair_m = 2 if cfg.cluster == "m" else 1
    pair_n = 2 if cfg.cluster == "n" else 1
    bm, bn = cfg.block_m, cfg.block_n
    if interpret:  # its copies raise past the array: whole tiles (and tile pairs)
        mp, np_ = cdiv(m, bm * pair_m) * bm * pair_m, cdiv(n, bn * pair_n) * bn * pair_n
    else:  # the swizzled tiling wants rows of 8 and columns of 64 (m is a column of a transposed `a`), and
        # every TMA box inside the array
        mp, np_ = max(cdiv(m, 64 if ta else 8) * (64 if ta else 8), bm), max(cdiv(n, 64) * 64, bn)
    kp = cdiv(k, _BLOCK_K) * _BLOCK_K
    x = pad_to(x, (z, kp, mp) if ta else (z, mp, kp))
    y = pad_to(y, (z, np_, kp) if tb else (z, kp, np_))
    st = _Static(cfg=cfg, z=z, m_iters=cdiv(cdiv(mp, bm), pair_m), n_iters=cdiv(cdiv(np_, bn), pair_n),
                 k_steps=kp // _BLOCK_K, ta=ta, tb=tb, out_dtype=jnp.dtype(out_dtype))
    pairs = z * st.m_iters * st.n_iters
    clusters = min(pairs, _INTERPRET_CTAS if interpret else devices.sm_count() // (pair_m * pair_n))
    kwargs: dict[str, Any] = {"interpret": _fa.interpret_params()} if interpret else {}
    out: jax.Array = plgpu.kernel(
        functools.partial(_kernel, st=st),
        out_type=jax.ShapeDtypeStruct((z, mp, np_), out_dtype),
        grid=(clusters,),
        grid_names=("cluster_grid",),
        cluster=(pair_m * pair_n,),
        cluster_names=("cluster",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        **kwargs,
    )(x, y)
    return out if (mp, np_) == (m, n) else out[:, :m, :n]


# ----------------------------------------------------------------------------------------------
# The registered functions
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: MosaicMatmulConfig | None, a: Any, b: Any, out_dtype: Any) -> MosaicMatmulConfig:
    return heuristic_config(a, b, preferred_element_type=out_dtype) if cfg is None else cfg


def forward(a: jax.Array, b: jax.Array, *, precision: str | tuple[str, str] = ("highest", "highest"),
            preferred_element_type: Any = None, cfg: MosaicMatmulConfig | None = None) -> jax.Array:
    """``jnp.matmul(a, b)`` (broadcast batches, 1-D operands) with float32 accumulation, in
    ``preferred_element_type`` (``None``: the operands' dtype). ``precision`` changes nothing: 16-bit
    products are exact in float32."""
    del precision
    out_dtype = jnp.result_type(a, b) if preferred_element_type is None else preferred_element_type
    run = functools.partial(product, cfg=_resolve(cfg, a, b, out_dtype))
    return matmul_forward(run, a, b, out_dtype)


def gradients(operands: tuple[jax.Array, jax.Array], d_out: jax.Array, *, cfg: MosaicMatmulConfig | None = None,
              precision: str | tuple[str, str] = ("highest", "highest"),
              preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)`` in the dtypes of ``a`` and ``b`` through the forward's kernel (transposes read in place;
    the cotangent in the operands' dtype, as ``a @ b``'s own gradient takes it)."""
    del precision, preferred_element_type
    a, b = operands
    run = functools.partial(product, cfg=_resolve(cfg, a, b, a.dtype))
    return matmul_backward(run, a, b, d_out.astype(a.dtype))


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, MATMUL_RESIDUALS)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: every ``jnp.matmul`` shape with bfloat16 or float16 operands of one dtype, outputs in
    bfloat16, float16 or float32, every precision (16-bit products are exact in float32); ``k`` or ``n``
    not a multiple of 64 costs a padded copy of the operands. Needs a Hopper GPU (compute capability 9.0),
    except in interpret mode.
    """
    del precision
    why = dtype_reason(("a", "b"), a, b, preferred_element_type)
    if why is not None:
        return why
    s = shapes(a, b)
    for name, size in (("out", s.z * s.rows * s.n), ("a broadcast", s.z * s.rows * s.k),
                       ("b broadcast", s.z * s.k * s.n)):
        if size >= 2 ** 31:
            return f"{name} has {size} elements; TMA coordinates are int32 (fewer than 2**31 elements)"
    return _fa.hopper_reason(*PLGPU_API)


def dtype_reason(names: tuple[str, str], x: Any, y: Any, preferred_element_type: Any) -> str | None:
    """Why the Mosaic GPU matmul kernels cannot take operands ``x``, ``y`` (called ``names``) and the output
    dtype, or ``None``: bfloat16 or float16 operands of one dtype, a bfloat16, float16 or float32 output."""
    dtypes = {jnp.dtype(x.dtype).name, jnp.dtype(y.dtype).name}
    if not dtypes <= set(_DTYPES) or len(dtypes) > 1:
        return (f"{' and '.join(names)} of dtypes {', '.join(sorted(dtypes))} not supported "
                "(both bfloat16 or both float16)")
    out = jnp.dtype(x.dtype if preferred_element_type is None else preferred_element_type).name
    if out not in _OUT_DTYPES:
        return f"preferred_element_type {out} not supported (bfloat16, float16 or float32)"
    return None


def smem_bytes(cfg: MosaicMatmulConfig, itemsize: int, out_itemsize: int) -> int:
    """Shared memory (bytes) of a config: the TMA ring and the epilogue's chunk slots."""
    return cfg.stages * (cfg.block_m + cfg.block_n) * _BLOCK_K * itemsize + 2 * 2 * _EPI[0] * _EPI[1] * out_itemsize


#: (block_m, block_n, split, cluster), the preferred first; each with the deepest ring (<= 6) that fits.
_TILES = (
    (128, 256, "n", "m"), (256, 128, "m", "n"), (128, 256, "n", "none"), (128, 256, "n", "n"),
    (256, 128, "m", "none"), (128, 128, "m", "m"), (128, 128, "n", "none"), (64, 256, "n", "none"),
)


def _fitting(itemsize: int, out_itemsize: int, clusters: bool) -> list[MosaicMatmulConfig]:
    found = []
    for bm, bn, split, cluster in _TILES:
        if cluster != "none" and not clusters:
            continue
        stages = max((s for s in range(2, 7) if smem_bytes(MosaicMatmulConfig(
            block_m=bm, block_n=bn, split=split, cluster=cluster, stages=s), itemsize, out_itemsize) <= _SMEM_BUDGET),
            default=None)
        if stages is not None:
            found.append(MosaicMatmulConfig(block_m=bm, block_n=bn, split=split, cluster=cluster, stages=stages))
    return found


def _space(a: Any, b: Any, preferred_element_type: Any) -> list[MosaicMatmulConfig]:
    out = jnp.dtype(a.dtype if preferred_element_type is None else preferred_element_type)
    return _fitting(jnp.dtype(a.dtype).itemsize, out.itemsize, clusters=not _env.use_interpreter())


def config_space(a: Any, b: Any, *, preferred_element_type: Any = None, **_: Any) -> list[MosaicMatmulConfig]:
    """Autotuning candidates (tiles and clusters, the snake along N and along M), the heuristic's first;
    in interpret mode the unclustered ones."""
    first = heuristic_config(a, b, preferred_element_type=preferred_element_type)
    space = _space(a, b, preferred_element_type)
    space += [attrs.evolve(c, order="m") for c in space]
    return [first, *(c for c in space if c != first)]


def heuristic_config(a: Any, b: Any, *, preferred_element_type: Any = None, **_: Any) -> MosaicMatmulConfig:
    """The first fitting tile (128x256 in CTA pairs along M, four stages for 16-bit outputs) whose tile
    count covers the SMs, skipping tiles taller than twice the rows; else the one with the most tiles."""
    s = shapes(a, b)
    table = _space(a, b, preferred_element_type)
    short = [c for c in table if c.block_m <= max(64, 2 * s.rows)] or table[-1:]

    def tiles(c: MosaicMatmulConfig) -> int:
        return s.z * cdiv(s.rows, c.block_m) * cdiv(s.n, c.block_n)

    sms = _INTERPRET_CTAS if _env.use_interpreter() else devices.sm_count()
    return next((c for c in short if tiles(c) >= sms), max(short, key=tiles))
