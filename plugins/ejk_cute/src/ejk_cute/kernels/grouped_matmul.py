"""The Hopper grouped GEMM in the CuTe DSL: ``c[rows of group g] = a[rows of group g] @ b[:, :, g]ᵀ``.

Imports CUTLASS at import time (``ejk_cute._grouped_matmul`` imports it when it first traces a
call); no ``from __future__ import annotations``: the DSL reads the annotations as types.

Logical operands (``cutlass.jax.TensorSpec.mode`` views of the JAX buffers, no copies): ``a`` is
``(M, K, 1)`` (the rows of all groups, consecutive), ``b`` is ``(N, K, G)`` (one matrix per group,
K- or N-major: the backward's transposed ``rhs`` is the other majorness of the same buffer), ``c``
is ``(M, N, 1)``. Two int32 vectors of ``G + 2`` entries describe the groups, computed on the
device before the launch:

- ``rows``: group ``g`` owns rows ``[rows[g], rows[g + 1])``; the entry ``G`` is the tail
  ``[rows[G], M)`` of rows in no group (``rows[G + 1] = M``);
- ``items``: group ``g``'s work items are ``[items[g], items[g + 1])``: its cluster row tiles
  times the column tiles; the tail has items too (they write zeros), an empty group none.

The structure is :class:`~ejk_cute.kernels.matmul.WgmmaGemm`'s (its layouts, shared memory,
cluster ring and mainloop are reused): a persistent grid of clusters walks the work list
``z, z + clusters, ...``; warp 0 loads ``a``'s rows (TMA at the group's row offset: rows past the
group's end belong to the next group and are multiplied but never stored; rows past ``M`` are
zero-filled) and ``b[g]``'s columns (multicast to the CTAs of a 2x1 cluster, which take
consecutive row tiles of one group) into the ring; the consumer warpgroups run wgmma, then
store the tile through shared memory with 16-byte vector stores masked to the group's rows and
the output's columns (a TMA store could not stop at a group boundary). Tail items skip the
mainloop and store zeros.
"""

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline

from ejk_cute.kernels.matmul import CONSUMER_REGS, EPI_BARRIER, EPI_STAGES, PRODUCER_REGS, WARPGROUP, WgmmaGemm

__all__ = ["GroupedGemm", "GroupedOuterGemm", "launch", "launch_outer"]


class GroupedGemm(WgmmaGemm):
    """Compile-time plan of one grouped kernel: tile, cluster rows (1 or 2), stages, cluster budget."""

    def __init__(self, tile_m: int, tile_n: int, cluster_m: int, stages: int, max_clusters: int) -> None:
        super().__init__(tile_m, tile_n, cluster_m, 1, stages, 1, max_clusters)

    # ------------------------------------------------------------------------------------------
    # Host side
    # ------------------------------------------------------------------------------------------

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, rows: cute.Tensor, items: cute.Tensor, c: cute.Tensor,
                 stream: cuda.CUstream) -> None:
        self._plan_layouts(a, b, c)
        tile_m, tile_n, tile_k = self.tile
        tma_a, g_a = self._tma_load(a, self.a_smem, (tile_m, tile_k), self.mcast_a)
        tma_b, g_b = self._tma_load(b, self.b_smem, (tile_n, tile_k), self.mcast_b)

        # At most this many items: every group adds at most one partial cluster row tile.
        band = tile_m * self.cluster[0]
        cols = (cute.size(c, mode=[1]) + tile_n - 1) // tile_n
        bound = ((cute.size(c, mode=[0]) + band - 1) // band + cute.size(b, mode=[2]) + 1) * cols
        grid = (*self.cluster, cutlass.min(bound, self.max_clusters))

        self.shared = self._shared_struct()
        self.kernel(tma_a, g_a, tma_b, g_b, c, rows, items, self.mma, self.a_smem, self.b_smem, self.c_smem).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster, 1), min_blocks_per_mp=1, stream=stream)

    # ------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, g_a: cute.Tensor, tma_b: cute.CopyAtom, g_b: cute.Tensor,
               c: cute.Tensor, rows: cute.Tensor, items: cute.Tensor, mma: cute.TiledMma,
               a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout) -> None:
        _, tile_n, tile_k = self.tile
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warpgroup = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        storage = memory.SmemAllocator().allocate(self.shared)
        coord, mask_a, mask_b, ring = self._cluster_ring(storage, a_smem, b_smem)
        s_a = storage.sa.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        s_b = storage.sb.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        s_c = storage.sc.get_tensor(c_smem.outer, swizzle=c_smem.inner)

        # b's tiles (tile_n, tile_k, n, k, g), this CTA's share of each multicast slice.
        t_b = cute.local_tile(g_b, (tile_n, tile_k), (None, None, None))
        tb_s, tb_g = cute.nvgpu.cpasync.tma_partition(
            tma_b, coord[0], cute.make_layout(self.cluster[0]), cute.group_modes(s_b, 0, 2),
            cute.group_modes(t_b, 0, 2))
        k_tiles = cute.size(t_b, mode=[3])
        groups = cute.size(t_b, mode=[4])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)
        _, _, first = cute.arch.block_idx()
        _, _, stride = cute.arch.grid_dim()
        total = items[groups + 1]

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                g = cutlass.Int32(0)
                w = first
                while w < total:
                    g, row0, _end, col = self._item(w, g, rows, items)
                    if g < groups:  # the tail's items load nothing
                        ta_s, src_a = self._a_rows(tma_a, g_a, s_a, row0)
                        src_b = tb_g[(None, col, None, g)]
                        for k in range(k_tiles):
                            ring.producer_acquire(state)
                            full = ring.producer_get_barrier(state)
                            cute.copy(tma_a, src_a[(None, k)], ta_s[(None, state.index)], tma_bar_ptr=full,
                                      mcast_mask=mask_a)
                            cute.copy(tma_b, src_b[(None, k)], tb_s[(None, state.index)], tma_bar_ptr=full,
                                      mcast_mask=mask_b)
                            ring.producer_commit(state)
                            state.advance()
                    w += stride
                ring.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self._consume_items(tidx - WARPGROUP, warpgroup - 1, ring, mma, s_a, s_b, s_c, c, rows, items,
                                k_tiles, groups, first, stride, total)

    @cute.jit
    def _item(self, w: cutlass.Int32, g: cutlass.Int32, rows: cute.Tensor,
              items: cute.Tensor) -> tuple[Any, Any, Any, Any]:
        """Work item ``w``: its group (searched onward from ``g``: a CTA's items only go forward), the
        first row of this CTA's tile, the group's end row, and the column tile.

        A group's items run down its cluster row tiles, then across the column tiles (consecutive
        CTAs share ``b[g]``'s column slab); the CTAs of a cluster take consecutive row tiles.
        """
        while items[g + 1] <= w:
            g += 1
        start = rows[g]
        end = rows[g + 1]
        band = self.tile[0] * self.cluster[0]
        row_tiles = (end - start + band - 1) // band
        local = w - items[g]
        col = local // row_tiles
        x, _, _ = cute.arch.block_idx()
        row0 = start + ((local - col * row_tiles) * self.cluster[0] + x) * self.tile[0]
        return g, row0, end, col

    def _a_rows(self, tma_a: cute.CopyAtom, g_a: cute.Tensor, s_a: cute.Tensor, row0: cutlass.Int32) -> tuple[Any, Any]:
        """The TMA partition of ``a``'s rows ``[row0, row0 + tile_m)``: (ring slots, K-slices)."""
        tile_m, _, tile_k = self.tile
        tile = cute.local_tile(cute.domain_offset((row0, 0, 0), g_a), (tile_m, tile_k), (0, None, 0))
        return cute.nvgpu.cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(s_a, 0, 2), cute.group_modes(tile, 0, 2))

    def _store_copy(self, threads: int) -> Any:
        """Shared -> global copy of one ``epi_tile`` subtile by the consumers: 16-byte vectors, rows in turn."""
        vector = 128 // self.c_dtype.width
        across = self.epi_tile[1] // vector
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_dtype, num_bits_per_copy=128)
        return cute.make_tiled_copy_tv(atom, cute.make_layout((threads // across, across), stride=(across, 1)),
                                       cute.make_layout((1, vector)))

    @cute.jit
    def _consume_items(self, tid: cutlass.Int32, consumer: cutlass.Int32, ring: pipeline.PipelineTmaAsync,
                       mma: cute.TiledMma, s_a: cute.Tensor, s_b: cute.Tensor, s_c: cute.Tensor, c: cute.Tensor,
                       rows: cute.Tensor, items: cute.Tensor, k_tiles: cutlass.Int32, groups: cutlass.Int32,
                       first: cutlass.Int32, stride: cutlass.Int32, total: cutlass.Int32) -> None:
        """The consumer warpgroups: wgmma over the ring (zeros for the tail), then the masked epilogue."""
        tile_m, tile_n, _ = self.tile
        threads = self.consumers * WARPGROUP
        thr_mma = mma.get_slice(consumer * WARPGROUP)
        frag_a = mma.make_fragment_A(thr_mma.partition_A(s_a))
        frag_b = mma.make_fragment_B(thr_mma.partition_B(s_b))
        tile_coords = cute.make_identity_tensor((tile_m, tile_n))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(tile_coords).shape, cutlass.Float32)

        r2s, r2s_dst, r2s_acc, chunk, chunk_out = self._epilogue_fragments(tid, mma, acc, s_c)
        chunk_size = cute.size(chunk)
        epi_sync = pipeline.NamedBarrier(barrier_id=EPI_BARRIER, num_threads=threads)
        s2g = self._store_copy(threads)
        thr_s2g = s2g.get_slice(tid)
        s2g_src = thr_s2g.partition_S(s_c)
        vectors = cute.make_rmem_tensor_like(s2g_src[(None, None, None, 0)])
        sub_coords = cute.zipped_divide(tile_coords, self.epi_tile)
        subtiles = cute.size(sub_coords, mode=[1])
        grid_shape = sub_coords.shape[1]
        order = cute.make_layout(grid_shape, stride=(grid_shape[1], 1))
        out2 = c[(None, None, 0)]
        width = cute.size(c, mode=[1])

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        written = cutlass.Int32(0)
        g = cutlass.Int32(0)
        w = first
        while w < total:
            g, row0, end, col = self._item(w, g, rows, items)
            if g < groups:
                read, release = self._mainloop(ring, mma, acc, frag_a, frag_b, read, release, k_tiles)
            else:
                acc.fill(0.0)

            # Subtiles in the accumulators' order (see WgmmaGemm._consume): registers -> shared
            # (stmatrix), then 16-byte vectors shared -> global where the row is the group's and
            # the column the output's. One barrier per subtile: with two buffers, a buffer is
            # rewritten only after every thread has passed the next subtile's barrier, i.e. has
            # read it.
            tile_out = cute.local_tile(cute.domain_offset((row0, 0), out2), (tile_m, tile_n), (0, col))
            limit = (end - row0, width - col * tile_n)
            for e in cutlass.range_constexpr(subtiles):
                for v in cutlass.range_constexpr(chunk_size):
                    chunk[v] = r2s_acc[e * chunk_size + v]
                chunk_out.store(chunk.load().to(self.c_dtype))
                buf = (written + e) % EPI_STAGES
                cute.copy(r2s, chunk_out, r2s_dst[(None, None, None, buf)])
                epi_sync.arrive_and_wait()
                where = order.get_hier_coord(e)
                dst = thr_s2g.partition_D(cute.local_tile(tile_out, self.epi_tile, where))
                coords = thr_s2g.partition_D(cute.local_tile(tile_coords, self.epi_tile, where))
                cute.copy(s2g, s2g_src[(None, None, None, buf)], vectors)
                for i in cutlass.range_constexpr(cute.size(vectors, mode=[1])):
                    for j in cutlass.range_constexpr(cute.size(vectors, mode=[2])):
                        if cute.elem_less(coords[(0, i, j)], limit):
                            cute.copy(s2g, vectors[(None, i, j)], dst[(None, i, j)])
            written += subtiles
            w += stride


class GroupedOuterGemm(WgmmaGemm):
    """``c[:, :, g] = a[:, rows[g]:rows[g + 1]] @ b[:, rows[g]:rows[g + 1]]ᵀ``: products reduced over ragged ranges.

    The ``d rhs`` of the grouped product: ``a`` is ``lhsᵀ`` ``(K, M, 1)`` and ``b`` is ``d outᵀ``
    ``(N, M, 1)`` (both M-major views of the row-major buffers), ``c`` is ``d rhs`` ``(K, N, G)``,
    ``rows`` ``[G + 1]`` the group boundaries. The dense kernel's walk over ``(m, n, g)`` output
    tiles (``G`` as its batch), with each group's reduction starting at its first row: the
    slices load by TMA from that row on, and the rows of the last slice past the group's end
    (the next group's, loaded all the same) are zeroed in ``a``'s shared-memory slot before the
    MMAs read it. An empty group's tiles are zeros. The output tiles never straddle a group, so
    they are stored by TMA as in the dense kernel.
    """

    def __init__(self, tile_m: int, tile_n: int, cluster_m: int, stages: int, max_clusters: int) -> None:
        super().__init__(tile_m, tile_n, cluster_m, 1, stages, 8, max_clusters)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, rows: cute.Tensor, c: cute.Tensor,
                 stream: cuda.CUstream) -> None:
        self._plan_layouts(a, b, c)
        tile_m, tile_n, tile_k = self.tile
        tma_a, g_a = self._tma_load(a, self.a_smem, (tile_m, tile_k), self.mcast_a)
        tma_b, g_b = self._tma_load(b, self.b_smem, (tile_n, tile_k), self.mcast_b)
        tma_c, g_c = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(self.c_smem, (None, None, 0)),
            self.epi_tile)
        cluster_rows = (cute.size(c, mode=[0]) + tile_m * self.cluster[0] - 1) // (tile_m * self.cluster[0])
        cluster_cols = (cute.size(c, mode=[1]) + tile_n - 1) // tile_n
        work = cluster_rows * cluster_cols * cute.size(c, mode=[2])
        grid = (*self.cluster, cutlass.min(work, self.max_clusters))
        self.shared = self._shared_struct()
        self.kernel(tma_a, g_a, tma_b, g_b, tma_c, g_c, rows, self.mma, self.a_smem, self.b_smem, self.c_smem,
                    cluster_rows, cluster_cols, work).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster, 1), min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, g_a: cute.Tensor, tma_b: cute.CopyAtom, g_b: cute.Tensor,
               tma_c: cute.CopyAtom, g_c: cute.Tensor, rows: cute.Tensor, mma: cute.TiledMma,
               a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout,
               cluster_rows: cutlass.Int32, cluster_cols: cutlass.Int32, work: cutlass.Int32) -> None:
        tile_m, tile_n, tile_k = self.tile
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warpgroup = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_c)

        storage = memory.SmemAllocator().allocate(self.shared)
        coord, mask_a, mask_b, ring = self._cluster_ring(storage, a_smem, b_smem)
        s_a = storage.sa.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        s_b = storage.sb.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        s_c = storage.sc.get_tensor(c_smem.outer, swizzle=c_smem.inner)
        t_c = cute.local_tile(g_c, (tile_m, tile_n), (None, None, None))

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)
        _, _, first = cute.arch.block_idx()
        _, _, stride = cute.arch.grid_dim()

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                w = first
                while w < work:
                    m, n, g = self._tile(w, cluster_rows, cluster_cols)
                    start = rows[g]
                    k_tiles = (rows[g + 1] - start + tile_k - 1) // tile_k
                    ta_s, src_a = self._slices(tma_a, g_a, s_a, start, m, tile_m, coord[1], self.cluster[1])
                    tb_s, src_b = self._slices(tma_b, g_b, s_b, start, n, tile_n, coord[0], self.cluster[0])
                    for k in range(k_tiles):
                        ring.producer_acquire(state)
                        full = ring.producer_get_barrier(state)
                        cute.copy(tma_a, src_a[(None, k)], ta_s[(None, state.index)], tma_bar_ptr=full,
                                  mcast_mask=mask_a)
                        cute.copy(tma_b, src_b[(None, k)], tb_s[(None, state.index)], tma_bar_ptr=full,
                                  mcast_mask=mask_b)
                        ring.producer_commit(state)
                        state.advance()
                    w += stride
                ring.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self._consume_groups(tidx - WARPGROUP, warpgroup - 1, warp, ring, mma, s_a, s_b, s_c, t_c, rows, tma_c,
                                 cluster_rows, cluster_cols, first, stride, work)

    def _slices(self, tma: cute.CopyAtom, g_x: cute.Tensor, s_x: cute.Tensor, start: cutlass.Int32,
                index: cutlass.Int32, tile: int, cta: Any, ctas: int) -> tuple[Any, Any]:
        """TMA partition of operand tile ``index``'s K-slices from reduction row ``start`` on: (ring slots, slices)."""
        tiles = cute.local_tile(cute.domain_offset((0, start, 0), g_x), (tile, self.tile[2]), (index, None, 0))
        return cute.nvgpu.cpasync.tma_partition(
            tma, cta, cute.make_layout(ctas), cute.group_modes(s_x, 0, 2), cute.group_modes(tiles, 0, 2))

    @cute.jit
    def _consume_groups(self, tid: cutlass.Int32, consumer: cutlass.Int32, warp: cutlass.Int32,
                        ring: pipeline.PipelineTmaAsync, mma: cute.TiledMma, s_a: cute.Tensor, s_b: cute.Tensor,
                        s_c: cute.Tensor, t_c: cute.Tensor, rows: cute.Tensor, tma_c: cute.CopyAtom,
                        cluster_rows: cutlass.Int32, cluster_cols: cutlass.Int32, first: cutlass.Int32,
                        stride: cutlass.Int32, work: cutlass.Int32) -> None:
        """The consumer warpgroups: wgmma over each group's slices (its last one masked), then the TMA epilogue."""
        tile_k = self.tile[2]
        threads = self.consumers * WARPGROUP
        thr_mma = mma.get_slice(consumer * WARPGROUP)
        frag_a = mma.make_fragment_A(thr_mma.partition_A(s_a))
        frag_b = mma.make_fragment_B(thr_mma.partition_B(s_b))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(t_c).shape[:3], cutlass.Float32)
        r2s, r2s_dst, r2s_acc, chunk, chunk_out = self._epilogue_fragments(tid, mma, acc, s_c)
        epi_sync = pipeline.NamedBarrier(barrier_id=EPI_BARRIER, num_threads=threads)
        stores = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads))

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        written = cutlass.Int32(0)
        w = first
        while w < work:
            m, n, g = self._tile(w, cluster_rows, cluster_cols)
            size = rows[g + 1] - rows[g]
            k_tiles = (size + tile_k - 1) // tile_k
            valid = size - (k_tiles - 1) * tile_k
            read, release = self._mainloop(ring, mma, acc, frag_a, frag_b, read, release, k_tiles,
                                           ragged=(s_a, consumer, valid))
            written = self._store_tile(t_c[(None, None, m, n, g)], tma_c, s_c, r2s, r2s_dst, r2s_acc, chunk,
                                       chunk_out, epi_sync, stores, warp, written)
            w += stride
        stores.producer_tail()


@cute.jit
def launch(stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, rows: cute.Tensor, items: cute.Tensor,
           c: cute.Tensor, *, tile_m: cutlass.Constexpr, tile_n: cutlass.Constexpr, cluster_m: cutlass.Constexpr,
           stages: cutlass.Constexpr, max_clusters: cutlass.Constexpr) -> None:
    """``cutlass_call``'s entry: the grouped product with the given compile-time plan."""
    GroupedGemm(tile_m, tile_n, cluster_m, stages, max_clusters)(a, b, rows, items, c, stream)


@cute.jit
def launch_outer(stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, rows: cute.Tensor, c: cute.Tensor, *,
                 tile_m: cutlass.Constexpr, tile_n: cutlass.Constexpr, cluster_m: cutlass.Constexpr,
                 stages: cutlass.Constexpr, max_clusters: cutlass.Constexpr) -> None:
    """``cutlass_call``'s entry for :class:`GroupedOuterGemm` (``d rhs``)."""
    GroupedOuterGemm(tile_m, tile_n, cluster_m, stages, max_clusters)(a, b, rows, c, stream)
